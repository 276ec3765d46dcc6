//! A kernel variant named in an environment variable, for re-tuning on a GPU without a
//! rebuild: `DISTFLASH_TUNING=bwd-warps=4,fwd-wgmma=false` runs the GPU tests (correctness)
//! and `examples/gpu_timing.rs` (speed) with that variant. Keys are the fields of
//! [`Tuning`]; those not named keep their value in [`Tuning::for_head_dim`]`(128)`, and the
//! variant applies to every head dim, as the old `cuda_attn --fwd-warps …` flags did.

use anyhow::{Context, Result, bail};
use distflash::backend::cuda::Tuning;

/// The variable that names a kernel variant.
pub const VAR: &str = "DISTFLASH_TUNING";

/// The variant in [`VAR`], if it is set and not empty.
pub fn from_env() -> Result<Option<Tuning>> {
    match std::env::var(VAR) {
        Ok(spec) if !spec.trim().is_empty() => parse(&spec)
            .with_context(|| format!("{VAR}={spec}"))
            .map(Some),
        _ => Ok(None),
    }
}

/// `key=value` pairs separated by commas, e.g. `fwd-warps=4,fwd-mtiles=1,fwd-qreg=true,
/// fwd-wgmma=false,bwd-warps=4,bwd-wgmma=false,bwd-key-split=4,bwd-q-stages=1,
/// fwd-key-major=false,bwd-key-major=false,deterministic=true`; a combination the kernels were not written
/// for is refused by [`Tuning::validate`].
pub fn parse(spec: &str) -> Result<Tuning> {
    let mut t = Tuning::for_head_dim(128);
    for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("`{pair}` is not key=value (e.g. bwd-warps=4)");
        };
        let number = || -> Result<usize> {
            value
                .parse()
                .with_context(|| format!("{key} takes a number, not `{value}`"))
        };
        let flag = || -> Result<bool> {
            value
                .parse()
                .with_context(|| format!("{key} takes true or false, not `{value}`"))
        };
        match key.trim() {
            "fwd-warps" => t.fwd_warps = number()?,
            "fwd-mtiles" => t.fwd_mtiles = number()?,
            "fwd-qreg" => t.fwd_q_in_registers = flag()?,
            "fwd-wgmma" => t.fwd_wgmma = flag()?,
            "bwd-warps" => t.bwd_warps = number()?,
            "bwd-wgmma" => t.bwd_wgmma = flag()?,
            "bwd-key-split" => t.bwd_key_split = number()?,
            "bwd-q-stages" => t.bwd_q_stages = number()?,
            "fwd-key-major" => t.fwd_key_major = flag()?,
            "bwd-key-major" => t.bwd_key_major = flag()?,
            "deterministic" => t.deterministic = flag()?,
            other => bail!(
                "unknown key `{other}`: use fwd-warps, fwd-mtiles, fwd-qreg, fwd-wgmma, bwd-warps, bwd-wgmma, bwd-key-split, bwd-q-stages, fwd-key-major, bwd-key-major or deterministic"
            ),
        }
    }
    t.validate()?;
    Ok(t)
}
