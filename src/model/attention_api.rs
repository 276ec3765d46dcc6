//! How a layer's attention is computed, behind one trait, so the model knows nothing of how
//! attention is distributed: `train::model_attention::Distributed` runs distflash across workers;
//! `Dense` here is a plain single-chunk attention under any mask in any precision, the reference
//! for the f64 gradient check.
//!
//! Tensors cross this interface sequence-major (`[rows, heads, head_dim]`, a linear layer's
//! output as is); LSE is opaque to the model, which only keeps it for the backward.

use super::float::Float;
use crate::shape::{Dims, Mask, Span};
use anyhow::Result;

/// Causal attention of this worker's rows over the whole sequence so far.
pub trait Attention<T> {
    /// (O, LSE) from the rotated Q, K and V of this worker's rows.
    fn forward(&mut self, q: &T, k: &T, v: &T) -> Result<(T, T)>;
    /// (dQ, dK, dV) from the saved O and LSE: no forward is re-run.
    fn backward(&mut self, q: &T, k: &T, v: &T, o: &T, lse: &T, dout: &T) -> Result<(T, T, T)>;
}

/// A device's whole-sequence attention (`runtime::Device::whole_sequence`): [`Attention`] under
/// a mask that may change between sequences (their documents under `--documents separate`).
pub trait WholeSequence<T>: Attention<T> {
    /// Attention of the next sequences under `mask`.
    fn set_mask(&mut self, mask: &Mask) -> Result<()>;
}

/// Attention of one chunk holding the whole sequence under `mask` (causal; packed documents,
/// Mistral's sliding window), written plainly in precision `F`, key by key as the mask's
/// definition says: the reference the gradient check differentiates through.
pub struct Dense {
    pub dims: Dims,
    pub rows: usize,
    pub mask: Mask,
}

impl Dense {
    /// The keys query `i` sees, in order.
    fn keys(&self, i: usize) -> impl Iterator<Item = usize> {
        let v = self.mask.visible(i);
        let run = |s: Span| s.start..s.end();
        run(v.global).chain(run(v.local))
    }

    /// Offset of row i, head h in a `[rows, heads, head_dim]` tensor.
    fn at(&self, i: usize, h: usize, heads: usize) -> usize {
        (i * heads + h) * self.dims.head_dim
    }

    /// The scaled score q_i · k_j / √d of query head h (against its KV head).
    fn score<F: Float>(&self, q: &[F], k: &[F], i: usize, j: usize, h: usize) -> F {
        let d = self.dims;
        let kh = h / d.group();
        let (qi, kj) = (self.at(i, h, d.heads), self.at(j, kh, d.kv_heads));
        let dot = (0..d.head_dim).fold(F::zero(), |a, c| a + q[qi + c] * k[kj + c]);
        dot / F::of((d.head_dim as f64).sqrt())
    }
}

impl<F: Float> Attention<Vec<F>> for Dense {
    fn forward(&mut self, q: &Vec<F>, k: &Vec<F>, v: &Vec<F>) -> Result<(Vec<F>, Vec<F>)> {
        let d = self.dims;
        let mut o = vec![F::zero(); self.rows * d.heads * d.head_dim];
        let mut lse = vec![F::zero(); d.heads * self.rows];
        for h in 0..d.heads {
            for i in 0..self.rows {
                let keys: Vec<usize> = self.keys(i).collect();
                let s: Vec<F> = keys.iter().map(|&j| self.score(q, k, i, j, h)).collect();
                let max = s.iter().copied().fold(F::neg_infinity(), F::max);
                let l = max + s.iter().fold(F::zero(), |a, &x| a + (x - max).exp()).ln();
                lse[h * self.rows + i] = l;
                let oi = self.at(i, h, d.heads);
                for (&j, &sj) in keys.iter().zip(&s) {
                    let p = (sj - l).exp();
                    let vj = self.at(j, h / d.group(), d.kv_heads);
                    for c in 0..d.head_dim {
                        o[oi + c] += p * v[vj + c];
                    }
                }
            }
        }
        Ok((o, lse))
    }

    fn backward(
        &mut self,
        q: &Vec<F>,
        k: &Vec<F>,
        v: &Vec<F>,
        o: &Vec<F>,
        lse: &Vec<F>,
        dout: &Vec<F>,
    ) -> Result<(Vec<F>, Vec<F>, Vec<F>)> {
        let d = self.dims;
        let scale = F::of(1.0 / (d.head_dim as f64).sqrt());
        let (mut dq, mut dk, mut dv) = (
            vec![F::zero(); q.len()],
            vec![F::zero(); k.len()],
            vec![F::zero(); v.len()],
        );
        for h in 0..d.heads {
            for i in 0..self.rows {
                let qi = self.at(i, h, d.heads);
                let delta = (0..d.head_dim).fold(F::zero(), |a, c| a + dout[qi + c] * o[qi + c]);
                for j in self.keys(i) {
                    let kj = self.at(j, h / d.group(), d.kv_heads);
                    let p = (self.score(q, k, i, j, h) - lse[h * self.rows + i]).exp();
                    let dp = (0..d.head_dim).fold(F::zero(), |a, c| a + dout[qi + c] * v[kj + c]);
                    let ds = p * (dp - delta) * scale;
                    for c in 0..d.head_dim {
                        dv[kj + c] += p * dout[qi + c];
                        dq[qi + c] += ds * k[kj + c];
                        dk[kj + c] += ds * q[qi + c];
                    }
                }
            }
        }
        Ok((dq, dk, dv))
    }
}
