//! The one-way module map of docs/architecture.md, checked: every `crate::…` path in
//! `src/**/*.rs` (a `use` or a path written inline) must be one its module is allowed to name. An import against the map
//! fails here with the file, the path and the rule it breaks, so a cycle or a layer reaching
//! down past its interface cannot come back unnoticed.
//!
//! `super::` paths stay inside a module and are not checked; comments are stripped first (a
//! doc comment may name anything). The binary (`src/main.rs`, `src/cli/`) sits above every
//! module and is not checked.

use std::collections::BTreeSet;
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
    // The leaf: `Dims`, `Span`, `Part`, `Precision`, shared by everything and importing nothing.
    ("shape", Rule::Only(&[])),
    // Schedules, transfers and their volume: shapes only ("knows nothing of tensors, devices").
    ("plan", Rule::Only(&["shape"])),
    // One block's math and the f64 oracle: shapes only ("knows nothing of schedules,
    // communication"); the oracle reads its own `Problem`, not the input generator.
    ("attn", Rule::Only(&["shape"])),
    // Random inputs: shapes, and the oracle's view of them (`Inputs::problem`).
    ("inputs", Rule::Only(&["shape", "attn"])),
    // Tensor files: plain f32 arrays by name, nothing of the crate.
    ("tensor_file", Rule::Only(&[])),
    // Devices run attn's block math on attn's types; `cuda::timing` times the fast path on
    // generated inputs. No `comm` (its impls for the CUDA tensor live in `comm`) and no `plan`.
    ("backend", Rule::Only(&["shape", "attn", "inputs"])),
    // Moving buffers: the transfer's parts (`shape`), and the CUDA tensor that NCCL and the
    // virtual workers move (`comm::cuda`, `comm::nccl`).
    ("comm", Rule::Only(&["shape", "backend::cuda"])),
    // Running a plan on a backend over a communicator; the threaded driver generates inputs.
    // Nothing of the model's layers (docs/architecture.md: exec "knows nothing of model layers").
    ("exec", Rule::Below { except: &[] }),
    // One rank's call on chunks its caller holds (the Python binding's entry): the partition
    // every rank derives alike and the executor's passes over it. Nothing of devices' opening,
    // topology or the model.
    ("rank_attention", Rule::Below { except: &[] }),
    // The model's layers on a device: shapes, attn's `Partial`, and the backend whose context,
    // stream and kernel cache the GPU ops share. Nothing of plans, communication or the
    // executor (docs/architecture.md: model "knows nothing of how attention is
    // distributed").
    ("model", Rule::Only(&["shape", "attn", "backend"])),
    // Predictions before a run: the plans it replays, block sizes, and the model's memory cost
    // of a rank (its plan-derived share computed here).
    ("sim", Rule::Only(&["shape", "attn", "plan", "model"])),
    // Machine rates for reports: the CPU backend's attention forward on generated inputs.
    ("bench", Rule::Only(&["shape", "attn", "backend", "inputs"])),
    // What a run would take, against this machine: shapes, the model's parameter and
    // activation sizes, and the sequence split's rule and its plans' size (`plan`); nothing
    // of devices or topology.
    ("resources", Rule::Only(&["shape", "model", "plan"])),
    // Where a job runs, decided once: opens the devices (the CPU's and the GPU's model ops,
    // backends) and communicators below it and runs a job's per-worker function; it knows
    // nothing of what jobs compute (nothing of `train`, `attention_run`).
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
    ("attention_run", Rule::Below { except: &["train"] }),
];

/// Imports against the map that exist today and are being removed; each is reported as a
/// failure once it is gone, so the marker does not outlive it.
const KNOWN: &[(&str, &str)] = &[];

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

/// The imports against the map that are not [`KNOWN`] (file, path, why), and every (module,
/// path) against the map, known or not.
fn check(src: &Path) -> (Vec<String>, BTreeSet<(String, String)>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let (mut bad, mut against) = (Vec::new(), BTreeSet::new());
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let source = fs::read_to_string(file).expect("a source file is UTF-8");
        for path in crate_paths(&source) {
            let Some(why) = violation(&module, &path) else {
                continue;
            };
            let known = KNOWN.iter().any(|(m, p)| *m == module && under(&path, p));
            against.insert((module.clone(), path.clone()));
            if !known {
                bad.push(format!("{}: `crate::{path}`: {why}", file.display()));
            }
        }
    }
    (bad, against)
}

#[test]
fn imports_follow_the_module_map() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (bad, against) = check(&src);
    assert!(
        bad.is_empty(),
        "imports against docs/architecture.md's module map (tests/module_map.rs):\n{}",
        bad.join("\n")
    );
    for (module, path) in KNOWN {
        assert!(
            against.iter().any(|(m, p)| m == module && under(p, path)),
            "`{module}` no longer imports `{path}`: delete its row from KNOWN in tests/module_map.rs"
        );
    }
}

#[test]
fn use_trees_are_expanded_and_comments_ignored() {
    let src = "use crate::{attn::{self, Block}, backend::cpu::CpuBackend, shape};\n\
               use crate::plan::volume; // crate::exec is only mentioned\n\
               /// [`crate::model::cost`] in a doc comment\n\
               let x = crate::comm::Solo; let y = $crate::ignored; let z = mycrate::no;";
    assert_eq!(
        crate_paths(src),
        [
            "attn::self",
            "attn::Block",
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
        ("plan", "attn::Dims"),
        ("attn", "inputs::Inputs"),
        ("backend", "comm::Wire"),
        ("comm", "plan::volume"),
        ("comm", "backend::cpu"),
        ("model", "plan::Plan"),
        ("sim", "exec::chunk_spans"),
        ("exec", "model::Layer"),
        ("runtime", "train::Job"),
        ("rank_attention", "runtime::Job"),
        ("attention_run", "train::Options"),
        ("train", "backend::cuda"),
        ("nonesuch", "shape::Dims"),
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
    ] {
        assert_eq!(violation(module, path), None, "{module} -> {path}");
    }
}
