//! Output paths, checked before any work starts, so an unwritable path costs nothing.

use anyhow::Result;
use std::fs::File;
use std::path::Path;

/// Opens `path` for writing before any work starts, so an unwritable path costs nothing.
pub fn create_output(path: &Path) -> Result<File> {
    File::create(path).map_err(|e| cannot_write(path, e))
}

/// Refuses, before any work starts, an output file the command could not write at its end;
/// what `path` holds now is left as it is until then.
pub fn ensure_writable(path: &Path) -> Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| cannot_write(path, e))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Creates the output directory `dir` and proves a file can be written in it, before any work
/// starts.
pub fn ensure_writable_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| cannot_write(dir, e))?;
    ensure_writable(&dir.join(format!(".distflash-probe-{}", std::process::id())))
}

/// The one sentence for an output that cannot be written: the path, the system's reason, the fix.
pub fn cannot_write(path: &Path, e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot write {}: {e}; choose a writable path",
        path.display()
    )
}
