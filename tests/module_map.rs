//! The one-way module map of docs/architecture.md, checked: every `crate::…` path in
//! `src/**/*.rs` (a `use` or a path written inline) must be one its module is allowed to name. An import against the map
//! fails here with the file, the path and the rule it breaks, so a cycle or a layer reaching
//! down past its interface cannot come back unnoticed.
//!
//! `super::` paths stay inside a module and are not checked; comments are stripped first (a
//! doc comment may name anything). The binary (`src/main.rs`, `src/cli/`) sits above every
//! module and is not checked against the map.
//!
//! Below the map, every file is checked too: no cycle between the files of the library
//! (`src/lib.rs`), the binary (`src/main.rs` and `src/cli/`) or the Python crate
//! (`python/src/`) at any depth, a child naming its parent `mod.rs`'s own items
//! included (the rule is written above [`module_graph`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// What a module may import.
enum Rule {
    /// Exactly these modules (a first path segment, or `module::submodule` for one part).
    Only(&'static [&'static str]),
    /// Any module listed before it in [`MAP`], except the paths named: the layers whose
    /// insides are being rewritten, checked only for what docs/architecture.md says they must
    /// not know.
    Below { except: &'static [&'static str] },
}

/// The map, bottom to top. Each allowed edge says why it exists.
const MAP: &[(&str, Rule)] = &[
    // The kinds of failure (`Error`, `ErrorKind`), which any module marks its errors with:
    // importing nothing.
    ("error", Rule::Only(&[])),
    // The leaf of the shapes: `Dims`, `Span`, `Part`, `Precision`, shared by everything; its
    // refusals (a bad mask, bad dims) are marked as the caller's input.
    ("shape", Rule::Only(&["error"])),
    // Schedules, transfers and their volume: shapes only ("knows nothing of tensors, devices").
    ("plan", Rule::Only(&["shape"])),
    // One block's math and the f64 oracle: shapes only ("knows nothing of schedules,
    // communication"); the oracle reads its own `Problem`, not the input generator.
    ("block_math", Rule::Only(&["shape"])),
    // Random inputs: shapes, and the oracle's view of them (`Inputs::problem`).
    ("inputs", Rule::Only(&["shape", "block_math"])),
    // Tensor files: plain f32 arrays by name, nothing of the crate.
    ("tensor_file", Rule::Only(&[])),
    // Devices run the block math on `block_math`'s types; `cuda::timing` times the fast path
    // on generated inputs. No `comm` (its impls for the CUDA tensor live in `comm`) and no `plan`.
    // Its refusals are marked (a lent call's checks, a refused allocation, no driver).
    (
        "backend",
        Rule::Only(&["error", "shape", "block_math", "inputs"]),
    ),
    // Moving buffers: the transfer's parts (`shape`), and the CUDA tensor that NCCL and the
    // virtual workers move (`comm::cuda`, `comm::nccl`); a wait that runs out is a timeout.
    ("comm", Rule::Only(&["error", "shape", "backend::cuda"])),
    // Running a plan on a backend over a communicator; the threaded driver generates inputs.
    // Nothing of the model's layers (docs/architecture.md: exec "knows nothing of model layers").
    ("exec", Rule::Below { except: &[] }),
    // One rank's call on chunks its caller holds (the Python binding's entry): the partition
    // every rank derives alike and the executor's passes over it. Nothing of devices' opening,
    // topology or the model.
    ("rank_call", Rule::Below { except: &[] }),
    // The model's layers on a device: shapes, `block_math`'s `Partial`, and the backend whose
    // context, stream and kernel cache the GPU ops share. Nothing of plans, communication or the
    // executor (docs/architecture.md: model "knows nothing of how attention is
    // distributed"). A step that would not fit is out of memory (`error`).
    (
        "model",
        Rule::Only(&["error", "shape", "block_math", "backend"]),
    ),
    // Predictions before a run: the plans it replays and their block sizes. (A rank's memory
    // is counted by training's own code: `train::memory::estimate`.)
    ("sim", Rule::Only(&["shape", "block_math", "plan"])),
    // Machine rates for reports: the CPU backend's attention forward on generated inputs.
    (
        "cpu_rates",
        Rule::Only(&["shape", "block_math", "backend", "inputs"]),
    ),
    // What a run would take, against this machine: shapes, the GPU's peak rate (`model::cost`),
    // and the sequence split's rule and its plans' size (`plan`); nothing of devices or
    // topology (a model step's memory is counted by `train::memory`). Memory it lacks is out
    // of memory (`error`).
    (
        "resources",
        Rule::Only(&["error", "shape", "model", "plan"]),
    ),
    // Where a job runs, decided once: opens the devices (the CPU's and the GPU's model ops,
    // backends) and communicators below it and runs a job's per-worker function; it knows
    // nothing of what jobs compute (nothing of `train`, `harness`).
    ("runtime", Rule::Below { except: &[] }),
    // The training loop: anything below it but the kernels (docs/architecture.md: train
    // "knows nothing of kernels"; the CPU backend and the `Backend` trait are fine); its jobs run on the runtime.
    (
        "train",
        Rule::Below {
            except: &["backend::cuda"],
        },
    ),
    // The harness of `distflash attention`: random inputs through the executor, as a job of the
    // runtime. Nothing of training.
    ("harness", Rule::Below { except: &["train"] }),
];

/// `crate::` paths of `source` as their first two segments ("backend::cuda", "shape::Dims"),
/// groups expanded (`use crate::{a::b, c}` gives "a::b" and "c").
fn crate_paths(source: &str) -> Vec<String> {
    let code = strip_comments(source);
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
            continue; // `$crate::`, `distflash_crate::`, `other::crate::` are not this crate
        }
        expand(&[], rest, &mut out);
    }
    out
}

/// Expands the use tree at the start of `tree` under `prefix` into `out`.
fn expand(prefix: &[&str], tree: &str, out: &mut Vec<String>) {
    let mut segments: Vec<&str> = prefix.to_vec();
    let mut rest = tree.trim_start();
    loop {
        if let Some(inner) = rest.strip_prefix('{') {
            let end = matching_brace(inner);
            for item in split_top_level(&inner[..end]) {
                expand(&segments, item, out);
            }
            return;
        }
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        segments.push(&rest[..len]);
        rest = &rest[len..];
        match rest.strip_prefix("::") {
            Some(more) => rest = more.trim_start(),
            None => break,
        }
    }
    if !segments.is_empty() {
        out.push(
            segments
                .iter()
                .take(2)
                .copied()
                .collect::<Vec<_>>()
                .join("::"),
        );
    }
}

/// Index of the `}` closing a group whose `{` was just consumed.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

/// The comma-separated items of a group, ignoring commas of nested groups.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&s[start..]);
    items.into_iter().filter(|i| !i.trim().is_empty()).collect()
}

/// `source` without its `//` comments (doc comments included).
fn strip_comments(source: &str) -> String {
    source
        .lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `path` ("backend::cuda") falls under `rule_path` ("backend" or "backend::cuda").
fn under(path: &str, rule_path: &str) -> bool {
    path == rule_path || path.starts_with(&format!("{rule_path}::"))
}

/// Why `module` may not name `path`, or `None` when the map allows it.
fn violation(module: &str, path: &str) -> Option<String> {
    let target = path.split("::").next().unwrap_or(path);
    if target == module || target == "self" || target == "super" {
        return None;
    }
    let Some(pos) = MAP.iter().position(|(m, _)| *m == module) else {
        return Some(format!(
            "module `{module}` has no row in the map: add one to MAP"
        ));
    };
    match &MAP[pos].1 {
        Rule::Only(allowed) => (!allowed.iter().any(|a| under(path, a)))
            .then(|| format!("`{module}` may import only {allowed:?}")),
        Rule::Below { except } => {
            if let Some(e) = except.iter().find(|e| under(path, e)) {
                return Some(format!("`{module}` must not import `{e}`"));
            }
            let below = MAP[..pos].iter().any(|(m, _)| *m == target);
            (!below).then(|| format!("`{module}` may import only the modules below it"))
        }
    }
}

/// The top-level module a source file belongs to; `None` for the crate roots and the binary.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main" | "cli")).then(|| name.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The imports against the map: file, path and why.
fn check(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let source = fs::read_to_string(file).expect("a source file is UTF-8");
        for path in crate_paths(&source) {
            let Some(why) = violation(&module, &path) else {
                continue;
            };
            bad.push(format!("{}: `crate::{path}`: {why}", file.display()));
        }
    }
    bad
}

#[test]
fn imports_follow_the_module_map() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = check(&src);
    assert!(
        bad.is_empty(),
        "imports against docs/architecture.md's module map (tests/module_map.rs):\n{}",
        bad.join("\n")
    );
}

#[test]
fn use_trees_are_expanded_and_comments_ignored() {
    let src = "use crate::{block_math::{self, Block}, backend::cpu::CpuBackend, shape};\n\
               use crate::plan::volume; // crate::exec is only mentioned\n\
               /// [`crate::model::cost`] in a doc comment\n\
               let x = crate::comm::Solo; let y = $crate::ignored; let z = mycrate::no;";
    assert_eq!(
        crate_paths(src),
        [
            "block_math::self",
            "block_math::Block",
            "backend::cpu",
            "shape",
            "plan::volume",
            "comm::Solo"
        ]
    );
}

#[test]
fn a_planted_import_against_the_map_is_caught() {
    // Each of these is an edge docs/architecture.md forbids; each must be reported.
    for (module, path) in [
        ("plan", "block_math::Dims"),
        ("block_math", "inputs::Inputs"),
        ("backend", "comm::Wire"),
        ("comm", "plan::volume"),
        ("comm", "backend::cpu"),
        ("model", "plan::Plan"),
        ("sim", "exec::chunk_spans"),
        ("exec", "model::Layer"),
        ("runtime", "train::Job"),
        ("rank_call", "runtime::Job"),
        ("harness", "train::Options"),
        ("train", "backend::cuda"),
        ("nonesuch", "shape::Dims"),
        ("error", "shape::Dims"),
    ] {
        assert!(
            violation(module, path).is_some(),
            "{module} -> {path} was allowed"
        );
    }
    // And the edges the map allows are not.
    for (module, path) in [
        ("plan", "shape::Span"),
        ("comm", "backend::cuda"),
        ("exec", "comm::Communicator"),
        ("train", "backend::cpu"),
        ("train", "runtime::Job"),
        ("model", "model::cost"),
        ("shape", "error::Error"),
        ("train", "error::ErrorKind"),
    ] {
        assert_eq!(violation(module, path), None, "{module} -> {path}");
    }
}

// ---- No cycle between file-modules, at any depth ----
//
// Every source file of a crate is a node (`src/model/cuda/whole_sequence.rs` is
// `model::cuda::whole_sequence`, `src/model/mod.rs` is `model`, the crate root is `crate`); a file
// declared `#[cfg(test)] mod x;` and an inline `#[cfg(test)] mod tests { … }` are not part of
// the library and not scanned (a test is its module's client). An edge A → B means A declares `mod b;` (a parent owns its child) or
// A names an item defined in B's file: a `use` or an inline path through `crate::`, `super::`,
// `self::`, a child module or a name A imported, followed through imports (`pub use` or not)
// to the file that defines the item. So a child naming an item its parent's `mod.rs` defines is
// a cycle (an arrow back up), and naming one the parent only re-exports is not.

/// A token of comment- and literal-free source: an identifier (or number), `::`, or one
/// punctuation character.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Path,
    Punct(char),
}

/// `source` with comments, strings and character literals blanked, its lines kept.
fn blank_literals(source: &str) -> String {
    let b: Vec<char> = source.chars().collect();
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let (mut out, mut i) = (String::with_capacity(source.len()), 0);
    // Blanks b[from..to] into out.
    let skip = |out: &mut String, from: usize, to: usize| {
        out.extend(b[from..to.min(b.len())].iter().map(|&c| blank(c)));
    };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = (i..b.len()).find(|&j| b[j] == '\n').unwrap_or(b.len());
            skip(&mut out, i, end);
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut j, mut depth) = (i, 0);
            while j < b.len() {
                if b[j] == '/' && b.get(j + 1) == Some(&'*') {
                    (depth, j) = (depth + 1, j + 2);
                } else if b[j] == '*' && b.get(j + 1) == Some(&'/') {
                    (depth, j) = (depth - 1, j + 2);
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            skip(&mut out, i, j);
            i = j;
        } else if c.is_alphanumeric() || c == '_' {
            let end = (i..b.len())
                .find(|&j| !(b[j].is_alphanumeric() || b[j] == '_'))
                .unwrap_or(b.len());
            let word: String = b[i..end].iter().collect();
            let hashes = (end..b.len()).take_while(|&j| b[j] == '#').count();
            if matches!(word.as_str(), "r" | "br") && b.get(end + hashes) == Some(&'"') {
                // A raw string: ends at `"` and as many `#`.
                let mut j = end + hashes + 1;
                while j < b.len()
                    && !(b[j] == '"' && (1..=hashes).all(|k| b.get(j + k) == Some(&'#')))
                {
                    j += 1;
                }
                skip(&mut out, i, j + 1 + hashes);
                i = j + 1 + hashes;
            } else if word == "b" && matches!(b.get(end), Some('"' | '\'')) {
                out.push(' ');
                i = end; // the literal itself is blanked next
            } else {
                out.push_str(&word);
                i = end;
            }
        } else if c == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            skip(&mut out, i, j + 1);
            i = j + 1;
        } else if c == '\'' && next == Some('\\') {
            let end = (i + 2..b.len()).find(|&j| b[j] == '\'').unwrap_or(b.len());
            skip(&mut out, i, end + 1);
            i = end + 1;
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            skip(&mut out, i, i + 3);
            i += 3;
        } else {
            out.push(c); // a lifetime's `'` too
            i += 1;
        }
    }
    out
}

/// The tokens of `source` with their 1-based lines.
fn tokens(source: &str) -> Vec<(Tok, usize)> {
    let code = blank_literals(source);
    let b: Vec<char> = code.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let end = (i..b.len())
                .find(|&j| !(b[j].is_alphanumeric() || b[j] == '_'))
                .unwrap_or(b.len());
            out.push((Tok::Ident(b[i..end].iter().collect()), line));
            i = end;
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// One name a module imports: `use path::name as local` (`local` is `None` for `path::*`).
#[derive(Clone, Debug)]
struct Import {
    path: Vec<String>,
    local: Option<String>,
}

/// Expands the use tree at `t[*pos..]` under `prefix` into `out`.
fn use_tree(t: &[Tok], pos: &mut usize, prefix: &[String], out: &mut Vec<Import>) {
    let mut segs = prefix.to_vec();
    loop {
        match t.get(*pos) {
            Some(Tok::Punct('{')) => {
                *pos += 1;
                loop {
                    match t.get(*pos) {
                        Some(Tok::Punct('}')) | None => {
                            *pos += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *pos += 1,
                        _ => use_tree(t, pos, &segs, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                *pos += 1;
                out.push(Import {
                    path: segs,
                    local: None,
                });
                return;
            }
            Some(Tok::Ident(s)) => {
                *pos += 1;
                if t.get(*pos) == Some(&Tok::Path) {
                    *pos += 1;
                    segs.push(s.clone());
                    continue;
                }
                let mut local = s.clone();
                if s != "self" {
                    segs.push(s.clone());
                } else if let Some(last) = segs.last() {
                    local = last.clone();
                }
                if t.get(*pos) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(alias)) = t.get(*pos + 1) {
                        local = alias.clone();
                    }
                    *pos += 2;
                }
                out.push(Import {
                    path: segs,
                    local: Some(local),
                });
                return;
            }
            _ => {
                *pos += 1; // a leading `::`: another crate
                return;
            }
        }
    }
}

/// A path one file names: its module (inline modules included), the path, its line.
struct Named {
    file: usize,
    module: Vec<String>,
    path: Vec<String>,
    line: usize,
    glob: bool,
}

/// What one file declares and names.
#[derive(Default)]
struct FileScan {
    /// `mod x;` (module, name, under `#[cfg(test)]`, line).
    children: Vec<(Vec<String>, String, bool, usize)>,
    /// Inline `mod x { … }` modules (their code is scanned only outside `#[cfg(test)]`).
    inline: Vec<Vec<String>>,
    /// `use` imports by the module they are written in.
    imports: Vec<(Vec<String>, Import, usize)>,
    /// Paths of more than one segment written inline.
    paths: Vec<(Vec<String>, Vec<String>, usize)>,
}

fn scan(source: &str, module: &[String]) -> FileScan {
    let toks = tokens(source);
    let t: Vec<Tok> = toks.iter().map(|(t, _)| t.clone()).collect();
    let ident = |i: usize| match t.get(i) {
        Some(Tok::Ident(s)) => Some(s.as_str()),
        _ => None,
    };
    let mut out = FileScan::default();
    let mut stack: Vec<(Vec<String>, usize, bool)> = vec![(module.to_vec(), usize::MAX, false)];
    let (mut depth, mut i) = (0usize, 0);
    while i < t.len() {
        let (here, _, in_test) = stack.last().expect("the file's module").clone();
        let line = toks[i].1;
        match &t[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if stack.last().is_some_and(|(_, d, _)| *d == depth) {
                    stack.pop();
                }
            }
            Tok::Ident(k) if k == "mod" && ident(i + 1).is_some() => {
                let name = ident(i + 1).expect("checked").to_string();
                // `#[cfg(test)]` before the `mod` (and its visibility)?
                let mut j = i;
                let visibility = |tok: &Tok| match tok {
                    Tok::Ident(s) => {
                        matches!(s.as_str(), "pub" | "crate" | "super" | "self" | "in")
                    }
                    other => matches!(other, Tok::Punct('(' | ')')),
                };
                while j > 0 && visibility(&t[j - 1]) {
                    j -= 1;
                }
                let test = j >= 7
                    && t[j - 7..j]
                        == [
                            Tok::Punct('#'),
                            Tok::Punct('['),
                            Tok::Ident("cfg".into()),
                            Tok::Punct('('),
                            Tok::Ident("test".into()),
                            Tok::Punct(')'),
                            Tok::Punct(']'),
                        ];
                if t.get(i + 2) == Some(&Tok::Punct('{')) {
                    let mut inner = here.clone();
                    inner.push(name);
                    out.inline.push(inner.clone());
                    stack.push((inner, depth, test || in_test));
                    i += 2; // the `{` is counted next
                    continue;
                }
                out.children.push((here, name, test || in_test, line));
                i += 2;
                continue;
            }
            Tok::Ident(k) if k == "use" => {
                let mut pos = i + 1;
                let mut imports = Vec::new();
                use_tree(&t, &mut pos, &[], &mut imports);
                if !in_test {
                    out.imports
                        .extend(imports.into_iter().map(|imp| (here.clone(), imp, line)));
                }
                i = pos;
                continue;
            }
            Tok::Ident(first)
                if t.get(i + 1) == Some(&Tok::Path)
                    && !matches!(
                        i.checked_sub(1).map(|p| &t[p]),
                        Some(Tok::Path | Tok::Punct('$'))
                    ) =>
            {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while t.get(j) == Some(&Tok::Path) {
                    match ident(j + 1) {
                        Some(s) => path.push(s.to_string()),
                        None => break,
                    }
                    j += 2;
                }
                if !in_test {
                    out.paths.push((here, path, line));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A crate's files as nodes and the edges between them.
struct Graph {
    /// Each node's module path ("crate", "model::cuda::whole_sequence") and file.
    nodes: Vec<(String, String)>,
    /// (from, to) → where the edge is written: "file:line: what".
    edges: BTreeMap<(usize, usize), Vec<String>>,
}

/// The file-module graph of the crate rooted at `root` ("lib.rs"), reading files through
/// `read` (a path relative to the crate's source folder).
fn module_graph(root: &str, read: &dyn Fn(&str) -> Option<String>) -> Graph {
    let mut nodes: Vec<(String, String)> = Vec::new();
    // Module path → node (inline modules and test files map to their file's node).
    let mut modules: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    let mut imports: BTreeMap<Vec<String>, Vec<(Import, usize)>> = BTreeMap::new();
    let mut named: Vec<Named> = Vec::new();
    let mut edges: BTreeMap<(usize, usize), Vec<String>> = BTreeMap::new();
    // (file, module, declared by (node, file:line)).
    let mut queue = vec![(root.to_string(), Vec::<String>::new(), None)];
    let mut files: Vec<String> = Vec::new();
    while let Some((file, module, declared)) = queue.pop() {
        let Some(source) = read(&file) else {
            continue;
        };
        let name = if module.is_empty() {
            "crate".to_string()
        } else {
            module.join("::")
        };
        nodes.push((name, file.clone()));
        let node = nodes.len() - 1;
        if let Some((parent, at)) = declared {
            edges.entry((parent, node)).or_default().push(at);
        }
        files.push(file.clone());
        let fi = files.len() - 1;
        modules.insert(module.clone(), node);
        let scan = scan(&source, &module);
        for inline in scan.inline {
            modules.insert(inline, node);
        }
        let dir = match file.rsplit_once('/') {
            _ if file.ends_with("mod.rs") || file == root => file
                .rsplit_once('/')
                .map_or(String::new(), |(d, _)| format!("{d}/")),
            _ => format!("{}/", file.trim_end_matches(".rs")),
        };
        for (owner, name, test, line) in scan.children {
            let mut child = owner.clone();
            child.push(name.clone());
            let path = [format!("{dir}{name}.rs"), format!("{dir}{name}/mod.rs")]
                .into_iter()
                .find(|p| read(p).is_some())
                .unwrap_or_default();
            if !test {
                let at = format!("{file}:{line}: mod {name};");
                queue.push((path, child, Some((node, at))));
            }
        }
        for (module, import, line) in scan.imports {
            named.push(Named {
                file: fi,
                module: module.clone(),
                path: import.path.clone(),
                line,
                glob: import.local.is_none(),
            });
            imports.entry(module).or_default().push((import, fi));
        }
        for (module, path, line) in scan.paths {
            named.push(Named {
                file: fi,
                module,
                path,
                line,
                glob: false,
            });
        }
    }
    let resolver = Resolver {
        modules: &modules,
        imports: &imports,
    };
    for n in &named {
        let Some(abs) = resolver.absolute(&n.module, &n.path, 0) else {
            continue;
        };
        let Some(to) = resolver.node(&abs, 0) else {
            continue;
        };
        let from = modules[&n.module];
        if from != to {
            let star = if n.glob { "::*" } else { "" };
            edges.entry((from, to)).or_default().push(format!(
                "{}:{}: {}{star}",
                files[n.file],
                n.line,
                n.path.join("::")
            ));
        }
    }
    Graph { nodes, edges }
}

struct Resolver<'a> {
    modules: &'a BTreeMap<Vec<String>, usize>,
    imports: &'a BTreeMap<Vec<String>, Vec<(Import, usize)>>,
}

impl Resolver<'_> {
    /// `path` as written in `module`, from the crate root; `None` for another crate's path or
    /// a name that is not a module or import (a type's `Self::`, `Vec::new`).
    fn absolute(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut base = module.to_vec();
        match first.as_str() {
            "crate" => return Some(rest.to_vec()),
            "self" => base.extend(rest.iter().cloned()),
            "super" => {
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
            }
            _ => {
                let mut child = module.to_vec();
                child.push(first.clone());
                if self.modules.contains_key(&child) {
                    child.extend(rest.iter().cloned());
                    return Some(child);
                }
                if depth > 8 {
                    return None;
                }
                let import = self.imports.get(module)?.iter().find(|(i, _)| {
                    i.local.as_ref() == Some(first) && i.path.first() != Some(first)
                })?;
                let mut abs = self.absolute(module, &import.0.path, depth + 1)?;
                abs.extend(rest.iter().cloned());
                return Some(abs);
            }
        }
        Some(base)
    }

    /// The node whose file defines what `abs` names, through the imports of the modules on
    /// the way; `None` for an item of another crate re-exported here.
    fn node(&self, abs: &[String], depth: usize) -> Option<usize> {
        let mut module: Vec<String> = Vec::new();
        for (k, seg) in abs.iter().enumerate() {
            module.push(seg.clone());
            if self.modules.contains_key(&module) {
                continue;
            }
            module.pop();
            let import = self
                .imports
                .get(&module)
                .and_then(|all| all.iter().find(|(i, _)| i.local.as_ref() == Some(seg)));
            if let (Some((import, _)), true) = (import, depth < 8) {
                let mut next = self.absolute(&module, &import.path, 0)?;
                next.extend(abs[k + 1..].iter().cloned());
                return self.node(&next, depth + 1);
            }
            break;
        }
        self.modules.get(&module).copied()
    }
}

/// The strongly connected components of `graph` of more than one node: each is a cycle (or
/// several).
fn components(graph: &Graph) -> Vec<Vec<usize>> {
    let n = graph.nodes.len();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in graph.edges.keys() {
        next[a].push(b);
    }
    // Tarjan's strongly connected components.
    struct State {
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        count: usize,
        sccs: Vec<Vec<usize>>,
    }
    fn visit(v: usize, next: &[Vec<usize>], s: &mut State) {
        s.index[v] = Some(s.count);
        s.low[v] = s.count;
        s.count += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in &next[v] {
            match s.index[w] {
                None => {
                    visit(w, next, s);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            s.sccs.push(scc);
        }
    }
    let mut s = State {
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        count: 0,
        sccs: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(v, &next, &mut s);
        }
    }
    let mut out: Vec<Vec<usize>> = s.sccs.into_iter().filter(|c| c.len() > 1).collect();
    for scc in &mut out {
        scc.sort();
    }
    out
}

/// Each cycle of `graph`: its files and the lines of every edge inside it.
fn cycles(graph: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for scc in components(graph) {
        let names: Vec<String> = scc
            .iter()
            .map(|&v| format!("{} ({})", graph.nodes[v].0, graph.nodes[v].1))
            .collect();
        let mut text = format!("cycle: {}", names.join(", "));
        for (&(a, b), at) in &graph.edges {
            if scc.contains(&a) && scc.contains(&b) {
                text += &format!("\n  {} -> {}:", graph.nodes[a].0, graph.nodes[b].0);
                for line in at {
                    text += &format!("\n    {line}");
                }
            }
        }
        out.push(text);
    }
    out
}

/// The file-module graph of the crate whose source folder is `dir` and root file `root`.
fn graph_on_disk(dir: &Path, root: &str) -> Graph {
    let read = |rel: &str| fs::read_to_string(dir.join(rel)).ok();
    module_graph(root, &read)
}

#[test]
fn no_cycle_between_modules_at_any_depth() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, root) in [
        ("src", "lib.rs"),
        ("src", "main.rs"),
        ("python/src", "lib.rs"),
    ] {
        let graph = graph_on_disk(&here.join(dir), root);
        let found = cycles(&graph);
        assert!(
            found.is_empty(),
            "cycles between modules of {dir}/{root} (tests/module_map.rs):\n{}",
            found.join("\n")
        );
    }
}

/// The cycles of a crate given as (file, source) pairs, its root `lib.rs`.
fn planted(files: &[(&str, &str)]) -> Vec<String> {
    let files: BTreeMap<&str, &str> = files.iter().copied().collect();
    let read = |rel: &str| files.get(rel).map(|s| s.to_string());
    cycles(&module_graph("lib.rs", &read))
}

#[test]
fn a_planted_cycle_is_caught_at_any_depth() {
    // Two siblings naming each other's items, inline and through `use`.
    let found = planted(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        (
            "a.rs",
            "pub struct Y;\npub fn f() -> crate::b::X { crate::b::X }\n",
        ),
        ("b.rs", "use crate::a::Y;\npub struct X;\n"),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a.rs:2: crate::b::X"), "{}", found[0]);
    assert!(found[0].contains("b.rs:1: crate::a::Y"), "{}", found[0]);
    // A child naming an item its parent's mod.rs defines (an arrow back up), two levels down
    // and through `super::super::`; and one through a sibling's `self::` path.
    let found = planted(&[
        ("lib.rs", "pub mod m;\n"),
        ("m/mod.rs", "pub mod c;\npub struct Meter;\n"),
        ("m/c/mod.rs", "mod d;\n"),
        (
            "m/c/d.rs",
            "// super::super::Meter in a comment is not an edge\nfn f(_: super::super::Meter) {}\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("m::c::d -> m:"), "{}", found[0]);
    assert!(
        found[0].contains("m/c/d.rs:2: super::super::Meter"),
        "{}",
        found[0]
    );
    // A sibling named through the parent's child module and an alias.
    let found = planted(&[
        ("lib.rs", "mod p;\n"),
        ("p/mod.rs", "mod x;\nmod y;\n"),
        (
            "p/x.rs",
            "use super::y as other;\npub fn g() { other::h() }\n",
        ),
        (
            "p/y.rs",
            "pub fn h() { self::k() }\nfn k() { super::x::g() }\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("p/y.rs:2: super::x::g"), "{}", found[0]);
}

#[test]
fn an_acyclic_tree_has_no_cycle() {
    // Children naming each other one way, the parent re-exporting a child's item and using
    // another's, a child naming that re-export (it resolves to its sibling, not the parent), a
    // test module naming its parent, and another crate's paths: no cycle.
    let found = planted(&[
        (
            "lib.rs",
            "pub mod m;\npub mod leaf;\n#[cfg(test)]\nmod tests;\n",
        ),
        ("leaf.rs", "pub struct Dims;\n"),
        (
            "m/mod.rs",
            "mod low;\nmod high;\npub use low::Low;\npub use crate::leaf::Dims;\npub fn run() { high::go() }\n",
        ),
        (
            "m/low.rs",
            "use crate::leaf::Dims;\npub struct Low(Dims);\n",
        ),
        (
            "m/high.rs",
            "use super::{Dims, Low};\nuse std::fmt::Debug;\npub fn go() { let _ = \"super::run\"; }\n\
             #[cfg(test)]\nmod tests {\n    use super::super::run;\n}\n",
        ),
        ("tests.rs", "use crate::m::run;\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}
