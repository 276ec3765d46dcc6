//! What every GPU test shares: the gate that runs them only where they were asked for, and the
//! backend they open. `cargo test` on a machine without a GPU must pass and say it did not run
//! them, so each is `#[ignore]`d with the way to run it (cargo lists it as ignored, with the
//! reason); asked (`DISTFLASH_GPU_TESTS=1` and `--include-ignored`) they must never pass
//! vacuously, so a missing driver or GPU fails them with the backend's sentence. Included
//! without the variable, they return at once with a printed reason.

pub mod tuning;

use anyhow::{Context, Result, bail};
use distflash::backend::cuda::{CudaBackend, InputDtype};

/// The variable that asks for the GPU tests.
pub const GATE: &str = "DISTFLASH_GPU_TESTS";

/// Proof that the GPU tests were asked for; opens backends with the kernel variant of
/// `DISTFLASH_TUNING` (see [`tuning`]) when that is set.
pub struct Gpu {
    tuning: Option<distflash::backend::cuda::Tuning>,
}

/// Whether a value of [`GATE`] asks for the GPU tests: unset, empty or `0` do not, `1` does;
/// anything else is refused rather than guessed at.
pub fn asked(value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => bail!("{GATE}={other} is not understood: set {GATE}=1 or leave it unset"),
    }
}

/// `Some` when the GPU tests were asked for (then each call to [`Gpu::open`] must find a
/// GPU); `None`, with the one-line reason on stderr, when they were not.
pub fn gpu() -> Result<Option<Gpu>> {
    let value = std::env::var(GATE).ok();
    if !asked(value.as_deref())? {
        eprintln!("skipped: set {GATE}=1 on a machine with an NVIDIA GPU");
        return Ok(None);
    }
    let tuning = tuning::from_env()?;
    if let Some(t) = tuning {
        eprintln!("kernel variant from {}: {t:?}", tuning::VAR);
    }
    Ok(Some(Gpu { tuning }))
}

impl Gpu {
    /// GPU 0 with inputs stored as `dtype`.
    pub fn open(&self, dtype: InputDtype) -> Result<CudaBackend> {
        let be = CudaBackend::new(0, dtype).with_context(|| {
            format!("{GATE}=1 asks for the GPU tests but GPU 0 cannot be opened: run them on a machine with an NVIDIA GPU, or unset {GATE}")
        })?;
        match self.tuning {
            Some(t) => be.with_tuning(t),
            None => Ok(be),
        }
    }
}
