//! CPU f32 forward and backward of one attention block, tiled so no score matrix larger than a
//! tile ever exists, with matrix products through `ndarray` (matrixmultiply kernels) and one
//! rayon task per (batch, head, query tile). The mask decides which key tiles a query tile
//! visits (only those any of its rows sees) and which scores inside them count; under plain
//! causal attention that is the key prefix up to each row, exactly as before masks existed.

use super::parts::{Block, GradsMut, QuerySide, RunningState};
use crate::shape::{Dims, Mask, Span, Visible};
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis, s};
use rayon::prelude::*;

/// Query rows per task: large enough for efficient matrix products, small enough that a
/// (batch, head) with a few thousand rows still splits across cores.
const Q_TILE: usize = 64;
/// Key rows per inner step; bounds the score tile at `Q_TILE × KV_TILE`.
const KV_TILE: usize = 128;
/// How far (natural log) a row's running max may grow before its accumulator is rescaled to
/// it: the GPU forward's rule at head dims 64, 192 and 256 (`LAZY_RESCALE` and `RESCALE_SLACK`
/// in kernels/forward_wgmma.cu, 8 in base 2), which skips the rescale on nearly every tile;
/// here at every head dim, so that the f64-checked CPU tests cover it. Until then the row keeps
/// its old max, with which its probabilities (below 2^8) and sum stay consistent.
const RESCALE_SLACK: f32 = 8.0 * std::f32::consts::LN_2;

/// Folds block `block` into `state` under `mask`: the online-softmax update of
/// FlashAttention, per tile.
pub fn forward_block(
    dims: &Dims,
    block: Block,
    mask: &Mask,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    state: &mut RunningState<Vec<f32>>,
) {
    let d = dims.head_dim;
    let (nq, nk) = (block.q.len, block.kv.len);
    let scale = dims.scale();
    let RunningState { m, l, acc } = state;
    acc.par_chunks_mut(nq * d)
        .zip(m.par_chunks_mut(nq))
        .zip(l.par_chunks_mut(nq))
        .enumerate()
        .for_each(|(bh, ((acc, m), l))| {
            let q = &q[bh * nq * d..(bh + 1) * nq * d];
            let kv_off = dims.kv_index(bh) * nk * d;
            let k = &k[kv_off..kv_off + nk * d];
            let v = &v[kv_off..kv_off + nk * d];
            acc.par_chunks_mut(Q_TILE * d)
                .zip(m.par_chunks_mut(Q_TILE))
                .zip(l.par_chunks_mut(Q_TILE))
                .enumerate()
                .for_each(|(t, ((acc, m), l))| {
                    let r0 = t * Q_TILE;
                    let rows = m.len();
                    let q = view(&q[r0 * d..(r0 + rows) * d], rows, d);
                    let mut acc = ArrayViewMut2::from_shape((rows, d), acc).expect("tile shape");
                    let keys = visible_columns(mask, block, r0, rows);
                    forward_tile(&keys, scale, q, (k, v), (m, l, &mut acc));
                });
        });
}

/// The key columns (local indices of `block.kv`) each of the `rows` query rows from local row
/// `r0` sees.
fn visible_columns(mask: &Mask, block: Block, r0: usize, rows: usize) -> Vec<Visible> {
    (0..rows)
        .map(|r| mask.visible(block.q.start + r0 + r).relative_to(block.kv))
        .collect()
}

/// The columns any row of a tile sees, as at most two runs in order (the global prefix, then
/// the local band), merged into one when they meet: the key tiles worth visiting. Under plain
/// causal attention one run, `[0, last row's visible keys)`.
fn column_runs(keys: &[Visible]) -> Vec<Span> {
    let global_end = keys.iter().map(|k| k.global.len).max().unwrap_or(0);
    let local = keys.iter().filter(|k| k.local.len > 0);
    let local_start = local.clone().map(|k| k.local.start).min();
    let local_end = local.map(|k| k.local.end()).max().unwrap_or(0);
    match local_start {
        None => vec![Span::between(0, global_end)],
        Some(start) if start <= global_end => vec![Span::between(0, global_end.max(local_end))],
        Some(start) => vec![
            Span::between(0, global_end),
            Span::between(start, local_end),
        ],
    }
}

/// The first columns of each run's key tiles and their widths, in order.
fn key_tiles(keys: &[Visible]) -> impl Iterator<Item = (usize, usize)> {
    column_runs(keys).into_iter().flat_map(|run| {
        (run.start..run.end())
            .step_by(KV_TILE)
            .map(move |c0| (c0, KV_TILE.min(run.end() - c0)))
    })
}

/// The columns of key tile `[c0, c0 + cols)` that a row seeing `seen` does not see, as up to
/// three runs of tile-local indices (before, between and after its visible runs); under
/// plain causal attention one run, from its last visible key to the tile's end.
fn hidden_columns(seen: &Visible, c0: usize, cols: usize) -> [Span; 3] {
    let tile = Span {
        start: c0,
        len: cols,
    };
    let mut gaps = [Span::between(cols, cols); 3];
    let mut at = 0;
    let mut k = 0;
    for run in [seen.global, seen.local] {
        let run = run.relative_to(tile);
        if run.len > 0 {
            gaps[k] = Span::between(at, run.start);
            at = run.end();
            k += 1;
        }
    }
    gaps[k] = Span::between(at, cols);
    gaps
}

/// Folds the keys and values `(k, v)` (the block's, head-dim-wide rows) that the tile's query
/// rows `q` see (`keys`, one per row) into the tile's running max, sum and output accumulator.
fn forward_tile(
    keys: &[Visible],
    scale: f32,
    q: ArrayView2<f32>,
    (k, v): (&[f32], &[f32]),
    (m, l, acc): (&mut [f32], &mut [f32], &mut ArrayViewMut2<f32>),
) {
    let (rows, d) = (keys.len(), q.ncols());
    let mut scores = Array2::<f32>::zeros((rows, KV_TILE));
    for (c0, cols) in key_tiles(keys) {
        let kt = view(&k[c0 * d..(c0 + cols) * d], cols, d);
        let vt = view(&v[c0 * d..(c0 + cols) * d], cols, d);
        let mut s = scores.slice_mut(s![.., ..cols]);
        general_mat_mul(scale, &q, &kt.t(), 0.0, &mut s);
        for (r, mut row) in s.axis_iter_mut(Axis(0)).enumerate() {
            for gap in hidden_columns(&keys[r], c0, cols) {
                row.slice_mut(s![gap.start..gap.end()])
                    .fill(f32::NEG_INFINITY);
            }
            let row_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(row_max);
            if m_new == f32::NEG_INFINITY {
                row.fill(0.0); // nothing visible yet: state stays empty, the row adds nothing
                continue;
            }
            // A first visible key always grows the max (−∞ + slack is −∞).
            let grow = m_new > m[r] + RESCALE_SLACK;
            let mut alpha = 1.0;
            if grow {
                alpha = (m[r] - m_new).exp();
                m[r] = m_new;
            }
            let m_use = m[r];
            let mut sum = 0.0;
            row.mapv_inplace(|x| {
                let p = (x - m_use).exp();
                sum += p;
                p
            });
            l[r] = l[r] * alpha + sum;
            if grow {
                acc.row_mut(r).mapv_inplace(|x| x * alpha);
            }
        }
        general_mat_mul(1.0, &s, &vt, 1.0, acc);
    }
}

/// Backward of block `block` under `mask`: accumulates dQ for the query rows and dK, dV for the
/// key rows. One task per (batch, query head) writes its own dQ rows and returns its dK, dV
/// share, which are summed per KV head afterwards (query heads of one GQA group share a KV head).
pub fn backward_block(
    dims: &Dims,
    block: Block,
    mask: &Mask,
    query: QuerySide<'_, Vec<f32>>,
    k: &[f32],
    v: &[f32],
    grads: GradsMut<'_, Vec<f32>>,
) {
    let d = dims.head_dim;
    let (nq, nk) = (block.q.len, block.kv.len);
    let scale = dims.scale();
    let shares: Vec<(Vec<f32>, Vec<f32>)> = grads
        .dq
        .par_chunks_mut(nq * d)
        .enumerate()
        .map(|(bh, dq)| {
            let kv_off = dims.kv_index(bh) * nk * d;
            let mut dk = vec![0.0; nk * d];
            let mut dv = vec![0.0; nk * d];
            let head = HeadTensors {
                q: head_rows(query.q, bh, nq * d),
                dout: head_rows(query.dout, bh, nq * d),
                lse: head_rows(query.lse, bh, nq),
                delta: head_rows(query.delta, bh, nq),
                k: &k[kv_off..kv_off + nk * d],
                v: &v[kv_off..kv_off + nk * d],
            };
            for r0 in (0..nq).step_by(Q_TILE) {
                let keys = visible_columns(mask, block, r0, Q_TILE.min(nq - r0));
                backward_tile(&keys, (r0, d), scale, &head, (dq, &mut dk, &mut dv));
            }
            (dk, dv)
        })
        .collect();
    for (bh, (dk, dv)) in shares.iter().enumerate() {
        let off = dims.kv_index(bh) * nk * d;
        add(&mut grads.dk[off..off + nk * d], dk);
        add(&mut grads.dv[off..off + nk * d], dv);
    }
}

/// One (batch, head)'s slices of the tensors a backward tile reads.
struct HeadTensors<'a> {
    q: &'a [f32],
    dout: &'a [f32],
    lse: &'a [f32],
    delta: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

/// The backward of the query tile from local row `r0` (head dim `d`), whose rows see `keys`:
/// its dQ rows written, its share of dK and dV added.
fn backward_tile(
    keys: &[Visible],
    (r0, d): (usize, usize),
    scale: f32,
    head: &HeadTensors<'_>,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let rows = keys.len();
    let q = view(&head.q[r0 * d..(r0 + rows) * d], rows, d);
    let dout = view(&head.dout[r0 * d..(r0 + rows) * d], rows, d);
    let mut dq =
        ArrayViewMut2::from_shape((rows, d), &mut dq[r0 * d..(r0 + rows) * d]).expect("tile shape");
    let mut p = Array2::<f32>::zeros((rows, KV_TILE));
    let mut dp = Array2::<f32>::zeros((rows, KV_TILE));
    for (c0, cols) in key_tiles(keys) {
        let kt = view(&head.k[c0 * d..(c0 + cols) * d], cols, d);
        let vt = view(&head.v[c0 * d..(c0 + cols) * d], cols, d);
        let mut p = p.slice_mut(s![.., ..cols]);
        let mut dp = dp.slice_mut(s![.., ..cols]);
        general_mat_mul(scale, &q, &kt.t(), 0.0, &mut p);
        general_mat_mul(1.0, &dout, &vt.t(), 0.0, &mut dp);
        for (r, seen) in keys.iter().enumerate() {
            let (lse, delta) = (head.lse[r0 + r], head.delta[r0 + r]);
            let mut p_row = p.row_mut(r);
            let mut dp_row = dp.row_mut(r);
            let tile = Span {
                start: c0,
                len: cols,
            };
            let shown = [seen.global, seen.local].map(|run| run.relative_to(tile));
            let runs = shown.iter().map(|run| (run, true));
            let gaps = hidden_columns(seen, c0, cols);
            for (run, visible) in runs.chain(gaps.iter().map(|gap| (gap, false))) {
                for c in run.start..run.end() {
                    let prob = if visible && lse > f32::NEG_INFINITY {
                        (p_row[c] - lse).exp()
                    } else {
                        0.0
                    };
                    p_row[c] = prob;
                    dp_row[c] = prob * (dp_row[c] - delta); // dS
                }
            }
        }
        let mut dk_t = ArrayViewMut2::from_shape((cols, d), &mut dk[c0 * d..(c0 + cols) * d])
            .expect("tile shape");
        let mut dv_t = ArrayViewMut2::from_shape((cols, d), &mut dv[c0 * d..(c0 + cols) * d])
            .expect("tile shape");
        general_mat_mul(1.0, &p.t(), &dout, 1.0, &mut dv_t);
        general_mat_mul(scale, &dp, &kt, 1.0, &mut dq);
        general_mat_mul(scale, &dp.t(), &q, 1.0, &mut dk_t);
    }
}

/// The `bh`-th of equal consecutive runs of `n` elements: one (batch, head)'s rows.
fn head_rows(t: &[f32], bh: usize, n: usize) -> &[f32] {
    &t[bh * n..(bh + 1) * n]
}

fn view(data: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), data).expect("tile shape")
}

fn add(dst: &mut [f32], src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_math::{merge::finalize, oracle};
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    /// The lazy rescale against the f64 oracle, on scores built to take both of its branches:
    /// every row's scores climb 3 (natural log) per key tile, less than RESCALE_SLACK (5.5), so
    /// rows keep a stale max with probabilities above 1 for a tile and rescale the next; and the
    /// keys of tile 3 jump by 100 more, which must rescale at once: against a stale max their
    /// exponentials overflow f32 (e^88.7). A row that skipped a rescale it needed, or rescaled
    /// its accumulator without its sum, is off by a factor of e^3 or more, or infinite. The
    /// bound on O: scores up to ~115 rounded in f32 (ulp 2^-23 relative, a few times over in the
    /// dot product) move each exponential by a few 1e-5 relative; 5e-6 measured.
    #[test]
    fn forward_rescales_lazily_and_stays_exact() {
        let dims = Dims {
            batch: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
        };
        let (seq, d) = (5 * KV_TILE + 17, dims.head_dim);
        let mut rng = StdRng::seed_from_u64(11);
        let mut uniform =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (mut q, mut k, v) = (
            uniform(dims.q_len(seq)),
            uniform(dims.kv_len(seq)),
            uniform(dims.kv_len(seq)),
        );
        // Column 0 of every query is 1 and column 0 of key j its climb over the softmax scale,
        // so that score (i, j) = random part + climb(j).
        q.chunks_mut(d).for_each(|row| row[0] = 1.0);
        for (j, row) in k.chunks_mut(d).enumerate() {
            let jump = if j / KV_TILE == 3 { 100.0 } else { 0.0 };
            row[0] = (3.0 * j as f32 / KV_TILE as f32 + jump) / dims.scale();
        }
        let mask = Mask::causal();
        let block = Block {
            q: Span { start: 0, len: seq },
            kv: Span { start: 0, len: seq },
        };
        let mut state = RunningState {
            m: vec![f32::NEG_INFINITY; dims.stat_len(seq)],
            l: vec![0.0; dims.stat_len(seq)],
            acc: vec![0.0; dims.q_len(seq)],
        };
        forward_block(&dims, block, &mask, &q, &k, &v, &mut state);
        let got = finalize(d, state);
        let want = oracle::forward(&oracle::Problem {
            dims,
            seq,
            mask: &mask,
            q: &q,
            k: &k,
            v: &v,
            dout: &[],
        });
        let (e_out, e_lse) = (
            oracle::rel_err(&got.out, &want.out),
            oracle::rel_err(&got.lse, &want.lse),
        );
        assert!(e_out < 5e-5 && e_lse < 1e-6, "out {e_out:e}, lse {e_lse:e}");
    }
}
