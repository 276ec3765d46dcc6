//! The f64 reference: whole-sequence attention under a mask (causal, packed documents, a sliding
//! window, global tokens: `shape::Mask`), forward and backward, written as plainly as the math
//! (every visible score of a row, exact softmax). Slow and memory-hungry by design: it is the
//! truth every fast path is compared with, not something to run at scale.

use crate::shape::{Dims, Mask};
use rayon::prelude::*;

/// One whole-sequence problem as the oracle reads it: the shape, the mask and head-major Q, K, V
/// and dO (dO only for the backward), borrowed. The oracle's own struct, so it depends on no input
/// generator: callers pass random inputs (`inputs::Inputs::problem`), a file's tensors or a
/// device's rounded copies alike.
#[derive(Clone, Copy, Debug)]
pub struct Problem<'a> {
    pub dims: Dims,
    pub seq: usize,
    pub mask: &'a Mask,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub dout: &'a [f32],
}

/// Forward result in f64: O `[b, h, seq, d]`, LSE `[b, h, seq]`.
pub struct Forward {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Gradients in f64, head-major.
pub struct Backward {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// The keys query row `i` sees, in order.
fn keys(mask: &Mask, i: usize) -> Vec<usize> {
    let v = mask.visible(i);
    (v.global.start..v.global.end())
        .chain(v.local.start..v.local.end())
        .collect()
}

/// Softmax probabilities of query row `i` over its visible `keys` for one (batch, head), and the
/// row's log-sum-exp (−∞, with no probabilities, for a row that sees nothing).
fn probabilities(
    q: &[f64],
    k: &[f64],
    d: usize,
    i: usize,
    keys: &[usize],
    scale: f64,
) -> (Vec<f64>, f64) {
    let scores: Vec<f64> = keys
        .iter()
        .map(|&j| scale * dot(&q[i * d..(i + 1) * d], &k[j * d..(j + 1) * d]))
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    let lse = max + sum.ln();
    (scores.iter().map(|s| (s - lse).exp()).collect(), lse)
}

/// One (batch, head)'s f64 copies of Q, K, V.
fn head(x: &Problem, bh: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, d) = (x.seq, x.dims.head_dim);
    let kvh = x.dims.kv_index(bh);
    let up = |t: &[f32], i: usize| {
        t[i * n * d..(i + 1) * n * d]
            .iter()
            .map(|&v| v as f64)
            .collect()
    };
    (up(x.q, bh), up(x.k, kvh), up(x.v, kvh))
}

/// Attention forward in f64 under the problem's mask.
pub fn forward(x: &Problem) -> Forward {
    let dims = &x.dims;
    let (n, d) = (x.seq, dims.head_dim);
    let scale = 1.0 / (d as f64).sqrt();
    let per_head: Vec<(Vec<f64>, Vec<f64>)> = (0..dims.batch * dims.heads)
        .into_par_iter()
        .map(|bh| {
            let (q, k, v) = head(x, bh);
            let mut out = vec![0.0; n * d];
            let mut lse = vec![0.0; n];
            for i in 0..n {
                let keys = keys(x.mask, i);
                let (p, row_lse) = probabilities(&q, &k, d, i, &keys, scale);
                lse[i] = row_lse;
                for (&j, pj) in keys.iter().zip(&p) {
                    for c in 0..d {
                        out[i * d + c] += pj * v[j * d + c];
                    }
                }
            }
            (out, lse)
        })
        .collect();
    Forward {
        out: per_head
            .iter()
            .flat_map(|(o, _)| o.iter().copied())
            .collect(),
        lse: per_head
            .iter()
            .flat_map(|(_, l)| l.iter().copied())
            .collect(),
    }
}

/// Attention backward in f64 under the problem's mask, for the output gradient `x.dout`.
pub fn backward(x: &Problem) -> Backward {
    let (dims, dout) = (&x.dims, x.dout);
    let (n, d) = (x.seq, dims.head_dim);
    let scale = 1.0 / (d as f64).sqrt();
    let per_head: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..dims.batch * dims.heads)
        .into_par_iter()
        .map(|bh| {
            let (q, k, v) = head(x, bh);
            let g: Vec<f64> = dout[bh * n * d..(bh + 1) * n * d]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let (mut dq, mut dk, mut dv) = (vec![0.0; n * d], vec![0.0; n * d], vec![0.0; n * d]);
            for i in 0..n {
                let keys = keys(x.mask, i);
                let (p, _) = probabilities(&q, &k, d, i, &keys, scale);
                let gi = &g[i * d..(i + 1) * d];
                let dp: Vec<f64> = keys
                    .iter()
                    .map(|&j| dot(gi, &v[j * d..(j + 1) * d]))
                    .collect();
                let row_delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (at, &j) in keys.iter().enumerate() {
                    let ds = p[at] * (dp[at] - row_delta);
                    for c in 0..d {
                        dv[j * d + c] += p[at] * gi[c];
                        dq[i * d + c] += scale * ds * k[j * d + c];
                        dk[j * d + c] += scale * ds * q[i * d + c];
                    }
                }
            }
            (dq, dk, dv)
        })
        .collect();
    // Query heads of one GQA group all add into their shared KV head.
    let kv_size = n * d;
    let mut dk = vec![0.0; dims.batch * dims.kv_heads * kv_size];
    let mut dv = dk.clone();
    for (bh, (_, hk, hv)) in per_head.iter().enumerate() {
        let kvh = dims.kv_index(bh);
        for (i, (a, b)) in hk.iter().zip(hv).enumerate() {
            dk[kvh * kv_size + i] += a;
            dv[kvh * kv_size + i] += b;
        }
    }
    Backward {
        dq: per_head
            .iter()
            .flat_map(|(q, _, _)| q.iter().copied())
            .collect(),
        dk,
        dv,
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// ‖x − ref‖ / ‖ref‖ of a result against this reference; infinity if anything is not finite
/// (NaN from an unwritten, poisoned element counts as a failure) or the lengths differ.
pub fn rel_err(x: &[f32], r: &[f64]) -> f64 {
    if x.len() != r.len() || x.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = x.iter().zip(r).map(|(&a, &b)| (a as f64 - b).powi(2)).sum();
    let den: f64 = r.iter().map(|b| b * b).sum();
    (num / den.max(1e-300)).sqrt()
}
