//! Timing the single-GPU attention with CUDA events: warm-up, then the median of repeats, each
//! bracketed by events on the backend's stream (host clocks would time launches, not kernels).

use super::CudaBackend;
use crate::backend::Backend;
use crate::inputs::Inputs;
use crate::shape::{Dims, Mask};
use anyhow::{Result, anyhow};
use cudarc::driver::sys::CUevent_flags;
use serde::Serialize;

/// Median times of one shape.
#[derive(Clone, Debug, Serialize)]
pub struct AttentionTiming {
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub repeats: usize,
}

/// Median of `repeats` event-timed runs of `f` on the backend's stream, in milliseconds.
pub fn median_ms(
    be: &CudaBackend,
    repeats: usize,
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    let event = || {
        be.stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| anyhow!("could not record a CUDA event: {e:?}"))
    };
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = event()?;
        f()?;
        let end = event()?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| anyhow!("could not read a CUDA event: {e:?}"))?;
        times.push(ms as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Times causal forward and backward of the whole sequence under `mask` (the fast path a
/// training step uses) on random inputs; repeats are chosen so each measurement takes about a
/// second.
pub fn time_attention(
    be: &CudaBackend,
    dims: Dims,
    seq: usize,
    mask: &Mask,
) -> Result<AttentionTiming> {
    let x = Inputs::random(dims, seq, 7);
    let (q, k, v, dout) = (
        be.upload(&x.q)?,
        be.upload(&x.k)?,
        be.upload(&x.v)?,
        be.upload(&x.dout)?,
    );
    drop(x);
    let mut fwd = be.causal_forward(&dims, seq, mask, &q, &k, &v)?;
    let mut grads = be.causal_backward(&dims, seq, mask, &q, &k, &v, &fwd, &dout)?;
    be.synchronize()?;
    let mut forward = || be.causal_forward_into(&dims, seq, mask, &q, &k, &v, &mut fwd);
    let first = median_ms(be, 1, &mut forward)?;
    let repeats = ((1000.0 / first.max(1e-3)) as usize).clamp(3, 30);
    let forward_ms = median_ms(be, repeats, &mut forward)?;
    let fwd = fwd; // the backward reads the last forward's O and LSE
    let mut backward =
        || be.causal_backward_into(&dims, seq, mask, &q, &k, &v, &fwd, &dout, &mut grads);
    let backward_ms = median_ms(be, repeats, &mut backward)?;
    be.synchronize()?;
    Ok(AttentionTiming {
        forward_ms,
        backward_ms,
        repeats,
    })
}
