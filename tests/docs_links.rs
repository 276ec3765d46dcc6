//! The documentation's links, checked: every relative link in README.md, `docs/*.md` and
//! `bench/**/*.md` (markdown `[text](path)` and `[text](path#anchor)`, images included) must
//! name a file or folder that exists, relative to the page that holds it. Web and mail links
//! (`http:`, `https:`, `mailto:`) and links within a page (`#anchor`) are not checked, nor are
//! anchors. Links inside fenced code blocks and `inline code spans` are text, not links (an
//! indented block is read as text: list items continue with indented lines).
//!
//! And no file of the source, tests, binding or kernels cites a root design document named
//! `DESIGN` (`.md`), a file the repository does not have: the design lives in
//! docs/architecture.md.

use std::fs;
use std::path::{Path, PathBuf};

/// The relative link targets of a markdown text, without their anchors, in order.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find([')', ' ']).unwrap_or(rest.len());
            let target = &rest[..end];
            rest = &rest[end..];
            let path = target.split('#').next().unwrap_or("");
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|scheme| target.starts_with(scheme));
            if !external && !path.is_empty() {
                out.push(path.to_string());
            }
        }
    }
    out
}

/// The line with every `inline code span` removed.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// Each link of `page` that names nothing on disk, as "page: target".
fn broken_links(page: &Path) -> Vec<String> {
    let text = fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let dir = page.parent().expect("a page is in a folder");
    relative_links(&text)
        .into_iter()
        .filter(|target| !dir.join(target).exists())
        .map(|target| format!("{}: {target}", page.display()))
        .collect()
}

/// Every `.md` file under `dir`, recursively, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = files_under(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    out.sort();
    out
}

/// README.md, `docs/*.md` and `bench/**/*.md`.
fn documentation_pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    let docs = markdown_under(&root.join("docs"));
    pages.extend(
        docs.into_iter()
            .filter(|p| p.parent() == Some(&root.join("docs"))),
    );
    pages.extend(markdown_under(&root.join("bench")));
    pages
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_relative_link_in_the_documentation_resolves() {
    let pages = documentation_pages(&root());
    assert!(pages.len() > 3, "found only {pages:?}");
    let broken: Vec<String> = pages.iter().flat_map(|p| broken_links(p)).collect();
    assert!(
        broken.is_empty(),
        "links to files that do not exist:\n{}",
        broken.join("\n")
    );
}

#[test]
fn links_are_read_as_markdown_writes_them() {
    let text = "See [a](docs/a.md) and [b](b.md#part), ![img](x.svg), [web](https://x.org/y),\n\
                [mail](mailto:me@x.org), [here](#top), and `[code](nope.md)`.\n\
                ```\n[fenced](nope.md)\n```\n    [indented text](e.md)\n";
    assert_eq!(relative_links(text), ["docs/a.md", "b.md", "x.svg", "e.md"]);
}

#[test]
fn a_planted_broken_link_is_caught() {
    let dir = std::env::temp_dir().join(format!("distflash-docs-links-{}", std::process::id()));
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("sub/there.md"), "# there\n").unwrap();
    fs::write(
        dir.join("page.md"),
        "[ok](sub/there.md), [ok too](sub/there.md#there), [folder](sub/),\n\
         [broken](sub/missing.md#anchor) and [web](https://example.org/missing.md)\n",
    )
    .unwrap();
    let broken = broken_links(&dir.join("page.md"));
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(broken[0].ends_with("page.md: sub/missing.md"), "{broken:?}");
}

/// Every file under `dir` (build outputs and caches left out), recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let skipped = ["target", "__pycache__", ".venv", ".pytest_cache"];
        if skipped.iter().any(|s| name == *s) {
            continue;
        }
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn no_source_file_cites_a_design_document_the_repository_does_not_have() {
    // Spelled in two parts so that this file does not cite it.
    let needle = ["DESIGN", ".md"].concat();
    let mut citing = Vec::new();
    for dir in ["src", "tests", "python", "kernels"] {
        for file in files_under(&root().join(dir)) {
            let Ok(bytes) = fs::read(&file) else { continue };
            if String::from_utf8_lossy(&bytes).contains(&needle) {
                citing.push(file.display().to_string());
            }
        }
    }
    assert!(
        citing.is_empty(),
        "these cite {needle}; point them at the docs/ page that holds the content:\n{}",
        citing.join("\n")
    );
}
