//! CPU f32 forward and backward of one attention block, tiled so no score matrix larger than a
//! tile ever exists, with matrix products through `ndarray` (matrixmultiply kernels) and one
//! rayon task per (batch, head, query tile).

use super::{Block, GradsMut, QuerySide, RunningState};
use crate::shape::Dims;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis, s};
use rayon::prelude::*;

/// Query rows per task: large enough for efficient matrix products, small enough that a
/// (batch, head) with a few thousand rows still splits across cores.
const Q_TILE: usize = 64;
/// Key rows per inner step; bounds the score tile at `Q_TILE × KV_TILE`.
const KV_TILE: usize = 128;

/// Folds block `block` into `state`: the online-softmax update of FlashAttention, per tile.
pub fn forward_block(
    dims: &Dims,
    block: Block,
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
                    let tile = Block {
                        q: super::Span {
                            start: block.q.start + r0,
                            len: rows,
                        },
                        kv: block.kv,
                    };
                    forward_tile(tile, scale, q, k, v, d, m, l, &mut acc);
                });
        });
}

#[allow(clippy::too_many_arguments)]
fn forward_tile(
    tile: Block,
    scale: f32,
    q: ArrayView2<f32>,
    k: &[f32],
    v: &[f32],
    d: usize,
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut ArrayViewMut2<f32>,
) {
    let rows = tile.q.len;
    let visible = tile.visible_keys(rows - 1);
    let mut scores = Array2::<f32>::zeros((rows, KV_TILE));
    for c0 in (0..visible).step_by(KV_TILE) {
        let cols = KV_TILE.min(visible - c0);
        let kt = view(&k[c0 * d..(c0 + cols) * d], cols, d);
        let vt = view(&v[c0 * d..(c0 + cols) * d], cols, d);
        let mut s = scores.slice_mut(s![.., ..cols]);
        general_mat_mul(scale, &q, &kt.t(), 0.0, &mut s);
        for (r, mut row) in s.axis_iter_mut(Axis(0)).enumerate() {
            let seen = tile.visible_keys(r).saturating_sub(c0).min(cols);
            row.slice_mut(s![seen..]).fill(f32::NEG_INFINITY);
            let row_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(row_max);
            if m_new == f32::NEG_INFINITY {
                continue; // nothing visible yet: state stays empty
            }
            let alpha = (m[r] - m_new).exp();
            let mut sum = 0.0;
            row.mapv_inplace(|x| {
                let p = (x - m_new).exp();
                sum += p;
                p
            });
            l[r] = l[r] * alpha + sum;
            m[r] = m_new;
            acc.row_mut(r).mapv_inplace(|x| x * alpha);
        }
        general_mat_mul(1.0, &s, &vt, 1.0, acc);
    }
}

/// Backward of block `block`: accumulates dQ for the query rows and dK, dV for the key rows.
/// One task per (batch, query head) writes its own dQ rows and returns its dK, dV share, which
/// are summed per KV head afterwards (query heads of one GQA group share a KV head).
pub fn backward_block(
    dims: &Dims,
    block: Block,
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
                let rows = Q_TILE.min(nq - r0);
                let tile = Block {
                    q: super::Span {
                        start: block.q.start + r0,
                        len: rows,
                    },
                    kv: block.kv,
                };
                backward_tile(tile, r0, scale, d, &head, dq, &mut dk, &mut dv);
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

#[allow(clippy::too_many_arguments)]
fn backward_tile(
    tile: Block,
    r0: usize,
    scale: f32,
    d: usize,
    head: &HeadTensors<'_>,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let rows = tile.q.len;
    let visible = tile.visible_keys(rows - 1);
    let q = view(&head.q[r0 * d..(r0 + rows) * d], rows, d);
    let dout = view(&head.dout[r0 * d..(r0 + rows) * d], rows, d);
    let mut dq =
        ArrayViewMut2::from_shape((rows, d), &mut dq[r0 * d..(r0 + rows) * d]).expect("tile shape");
    let mut p = Array2::<f32>::zeros((rows, KV_TILE));
    let mut dp = Array2::<f32>::zeros((rows, KV_TILE));
    for c0 in (0..visible).step_by(KV_TILE) {
        let cols = KV_TILE.min(visible - c0);
        let kt = view(&head.k[c0 * d..(c0 + cols) * d], cols, d);
        let vt = view(&head.v[c0 * d..(c0 + cols) * d], cols, d);
        let mut p = p.slice_mut(s![.., ..cols]);
        let mut dp = dp.slice_mut(s![.., ..cols]);
        general_mat_mul(scale, &q, &kt.t(), 0.0, &mut p);
        general_mat_mul(1.0, &dout, &vt.t(), 0.0, &mut dp);
        for r in 0..rows {
            let seen = tile.visible_keys(r).saturating_sub(c0).min(cols);
            let (lse, delta) = (head.lse[r0 + r], head.delta[r0 + r]);
            let mut p_row = p.row_mut(r);
            let mut dp_row = dp.row_mut(r);
            for c in 0..cols {
                let prob = if c < seen && lse > f32::NEG_INFINITY {
                    (p_row[c] - lse).exp()
                } else {
                    0.0
                };
                p_row[c] = prob;
                dp_row[c] = prob * (dp_row[c] - delta); // dS
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
