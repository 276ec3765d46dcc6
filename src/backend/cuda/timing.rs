//! Timing the single-GPU attention with CUDA events: warm-up, then the median of repeats, each
//! bracketed by events on the backend's stream (host clocks would time launches, not kernels).

use super::{CallStrides, CudaBackend, SequenceCall, Tensor};
use crate::backend::Backend;
use crate::block_math::{Block, GradsMut, QuerySide};
use crate::inputs::Inputs;
use crate::shape::{Dims, Mask, Span};
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
    let mut times = run_times_ms(be, repeats, f)?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Each of `repeats` runs of `f` (at least one), back to back on the backend's stream, in
/// milliseconds: an event before the first and after each, so that run i is the time between
/// events i and i + 1, with no synchronisation between runs.
pub fn run_times_ms(
    be: &CudaBackend,
    repeats: usize,
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let event = || {
        be.stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| anyhow!("could not record a CUDA event: {e:?}"))
    };
    let mut events = vec![event()?];
    for _ in 0..repeats.max(1) {
        f()?;
        events.push(event()?);
    }
    events
        .windows(2)
        .map(|pair| {
            pair[0]
                .elapsed_ms(&pair[1])
                .map(f64::from)
                .map_err(|e| anyhow!("could not read a CUDA event: {e:?}"))
        })
        .collect()
}

/// Random Q, K, V and dO of `rows` rows (`Inputs::random` of `seed`) on the device; the host
/// copies are dropped before returning (at 128K tokens they are gigabytes).
pub fn upload_random(be: &CudaBackend, dims: Dims, rows: usize, seed: u64) -> Result<[Tensor; 4]> {
    let x = Inputs::random(dims, rows, seed);
    Ok([
        be.upload(&x.q)?,
        be.upload(&x.k)?,
        be.upload(&x.v)?,
        be.upload(&x.dout)?,
    ])
}

/// Device time each measured operation runs before it is timed, in milliseconds. Under full
/// load an H200's SM clock steps down at its power limit after ~25 ms and again after that:
/// the 8K backward ran 621–627 TFLOP/s for its first 24–31 ms, then 545–596
/// (`bench/results/gqa-cta-2026-12-04`, call 5), so a median of 30 runs from a cold start read
/// 550–615 from process to process. After a second of the same work the timing reads the clock
/// a training step's sustained load runs at; `bench/peers/sdpa_bench.py` loads its peers alike.
const WARM_MS: f64 = 1000.0;

/// Times a first run of `f`, then runs it back to back for about [`WARM_MS`] of device time;
/// returns the first run's time.
fn warm_up(be: &CudaBackend, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let first = median_ms(be, 1, f)?;
    for _ in 0..(WARM_MS / first.max(1e-3)).ceil() as usize {
        f()?;
    }
    be.synchronize()?;
    Ok(first)
}

/// The median forward time and the repeats it took: as many that the measurement lasts about a
/// second (3 to 30), after a first run and [`WARM_MS`] of load.
fn time_forward(be: &CudaBackend, forward: &mut dyn FnMut() -> Result<()>) -> Result<(f64, usize)> {
    let first = warm_up(be, forward)?;
    let repeats = ((1000.0 / first.max(1e-3)) as usize).clamp(3, 30);
    Ok((median_ms(be, repeats, forward)?, repeats))
}

/// The median backward time over the forward's repeats, after [`WARM_MS`] of backward load,
/// with the forward's figure.
fn time_backward(
    be: &CudaBackend,
    forward_ms: f64,
    repeats: usize,
    backward: &mut dyn FnMut() -> Result<()>,
) -> Result<AttentionTiming> {
    warm_up(be, backward)?;
    let backward_ms = median_ms(be, repeats, backward)?;
    be.synchronize()?;
    Ok(AttentionTiming {
        forward_ms,
        backward_ms,
        repeats,
    })
}

/// The two kinds of block the distributed schedules compute on chunks of one length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// A chunk against itself: causal inside the block, half its pairs visible.
    Diagonal,
    /// A chunk against an earlier one: every pair visible.
    OffDiagonal,
}

impl BlockKind {
    pub const BOTH: [BlockKind; 2] = [BlockKind::Diagonal, BlockKind::OffDiagonal];

    /// The block's query and key rows for chunks of `chunk` rows: chunk 0 against itself, or
    /// chunk 1 against chunk 0.
    pub fn block(self, chunk: usize) -> Block {
        let first = Span {
            start: 0,
            len: chunk,
        };
        match self {
            BlockKind::Diagonal => Block {
                q: first,
                kv: first,
            },
            BlockKind::OffDiagonal => Block {
                q: Span {
                    start: chunk,
                    len: chunk,
                },
                kv: first,
            },
        }
    }

    /// The block's pairs in units of a causal sequence of its chunk: a diagonal block is one, an
    /// off-diagonal one (every pair visible) two.
    fn causal_units(self) -> f64 {
        match self {
            BlockKind::Diagonal => 1.0,
            BlockKind::OffDiagonal => 2.0,
        }
    }

    /// The forward's FLOPs over the block's visible pairs, counted as the whole sequence's are.
    pub fn forward_flops(self, dims: &Dims, chunk: usize) -> f64 {
        self.causal_units() * crate::block_math::causal_forward_flops(dims, chunk)
    }

    /// The backward's FLOPs, likewise.
    pub fn backward_flops(self, dims: &Dims, chunk: usize) -> f64 {
        self.causal_units() * crate::block_math::causal_backward_flops(dims, chunk)
    }
}

/// Times one block of chunks of `chunk` rows as the distributed executor runs it (causal): the
/// forward folding K/V into a running state (`Backend::forward_block`, the kernel of blocks
/// whose partial results merge by LSE), and the backward accumulating dQ, dK and dV
/// (`Backend::backward_block`), on random inputs.
pub fn time_block(
    be: &CudaBackend,
    dims: Dims,
    chunk: usize,
    kind: BlockKind,
) -> Result<AttentionTiming> {
    let mask = Mask::causal();
    let block = kind.block(chunk);
    let [q, k, v, dout] = upload_random(be, dims, chunk, 11)?;
    let mut state = be.new_state(&dims, chunk)?;
    let (forward_ms, repeats) = time_forward(be, &mut || {
        be.forward_block(&dims, block, &mask, &q, (&k, &v), &mut state)
    })?;
    // The timed state folded the same keys many times over; the backward reads the O and LSE
    // of one fold, as the executor's would be.
    drop(state);
    let mut once = be.new_state(&dims, chunk)?;
    be.forward_block(&dims, block, &mask, &q, (&k, &v), &mut once)?;
    let fwd = be.finalize(&dims, chunk, once)?;
    let delta = be.delta(&dims, chunk, &fwd.out, &dout)?;
    let (mut dq, mut dk, mut dv) = (
        be.zeros(dims.q_len(chunk))?,
        be.zeros(dims.kv_len(chunk))?,
        be.zeros(dims.kv_len(chunk))?,
    );
    let mut backward = || {
        let query = QuerySide {
            q: &q,
            dout: &dout,
            lse: &fwd.lse,
            delta: &delta,
        };
        let grads = GradsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        be.backward_block(&dims, block, &mask, query, (&k, &v), grads)
    };
    time_backward(be, forward_ms, repeats, &mut backward)
}

/// Times causal forward and backward of the whole sequence under `mask` (the fast path a
/// training step uses) on random inputs laid out under `strides` (dense: the model's
/// sequence-major or the kernels' head-major); repeats are chosen so each measurement takes
/// about a second. The backward's gradients are those a caller gets ([`CudaBackend::sequence_grads`]).
pub fn time_attention(
    be: &CudaBackend,
    dims: Dims,
    seq: usize,
    mask: &Mask,
    strides: &CallStrides,
) -> Result<AttentionTiming> {
    let [q, k, v, dout] = upload_random(be, dims, seq, 7)?;
    let qkv = [&q, &k, &v];
    let call = SequenceCall {
        dims: &dims,
        seq,
        mask,
        strides,
    };
    let mut fwd = be.causal_forward(&call, qkv)?;
    let mut grads = be.causal_backward(&call, qkv, fwd.as_ref(), &dout)?;
    be.synchronize()?;
    let (forward_ms, repeats) =
        time_forward(be, &mut || be.causal_forward_into(&call, qkv, &mut fwd))?;
    let fwd = fwd; // the backward reads the last forward's O and LSE
    time_backward(be, forward_ms, repeats, &mut || {
        be.causal_backward_into(&call, qkv, fwd.as_ref(), &dout, &mut grads)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_a_causal_sequence_once() {
        // P diagonal and P(P − 1)/2 off-diagonal blocks tile the causal sequence of P chunks:
        // their FLOPs add up to the whole sequence's, so block and whole rates compare.
        let dims = Dims {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
        };
        for (p, chunk) in [(2, 512), (4, 1000), (8, 3)] {
            let blocks = |kind: BlockKind, n: usize| {
                n as f64 * (kind.forward_flops(&dims, chunk) + kind.backward_flops(&dims, chunk))
            };
            let tiled =
                blocks(BlockKind::Diagonal, p) + blocks(BlockKind::OffDiagonal, p * (p - 1) / 2);
            let seq = p * chunk;
            let whole = crate::block_math::causal_forward_flops(&dims, seq)
                + crate::block_math::causal_backward_flops(&dims, seq);
            assert!(
                (tiled - whole).abs() <= 1e-12 * whole,
                "P={p}: {tiled} vs {whole}"
            );
        }
        // The blocks' rows: the diagonal on chunk 0, the off-diagonal chunk 1 against chunk 0.
        let off = BlockKind::OffDiagonal.block(100);
        assert_eq!(
            (off.q.start, off.q.len, off.kv.start, off.kv.len),
            (100, 100, 0, 100)
        );
        let diag = BlockKind::Diagonal.block(100);
        assert_eq!((diag.q.start, diag.kv.start, diag.kv.len), (0, 0, 100));
    }
}
