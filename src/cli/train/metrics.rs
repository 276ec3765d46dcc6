//! `metrics.jsonl`: the JSON line of every step, written as the run goes.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `metrics.jsonl` in the save directory: one JSON line per step, each step once. A resumed run
/// appends, first dropping the lines of the steps after its checkpoint (an interrupted run wrote
/// them, and this run takes those steps again).
pub struct Metrics {
    path: PathBuf,
    /// Opened at the first step, once the lines to keep are known.
    file: Option<std::fs::File>,
}

impl Metrics {
    /// The metrics of a run saving to `dir` (created): emptied for a fresh run, kept for a
    /// resumed one until its first step says where it resumed.
    pub fn open(dir: &Path, resume: bool) -> Result<Metrics> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the save directory {}", dir.display()))?;
        let path = dir.join("metrics.jsonl");
        // Refuse an unwritable path now, not after the first step; a fresh run starts empty.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|f| if resume { Ok(()) } else { f.set_len(0) })
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Metrics { path, file: None })
    }

    /// Writes step `step`'s `line`; metrics are a by-product, so a write that fails is dropped
    /// rather than ending the run.
    pub fn record(&mut self, step: u64, line: &str) {
        if self.file.is_none() {
            self.file = self.reopen_before(step).ok();
        }
        if let Some(f) = &mut self.file {
            let _ = writeln!(f, "{line}");
        }
    }

    /// The file holding only the lines of steps before `step`, open for appending.
    fn reopen_before(&self, step: u64) -> std::io::Result<std::fs::File> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let kept: String = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| s < step)
            })
            .flat_map(|l| [l, "\n"])
            .collect();
        std::fs::write(&self.path, kept)?;
        std::fs::OpenOptions::new().append(true).open(&self.path)
    }
}
