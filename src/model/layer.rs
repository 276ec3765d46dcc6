//! One LLaMA decoder layer, forward and backward side by side, and what each checkpoint policy
//! keeps between them.
//!
//! Forward, for the rows of this worker (x `[rows, d]`):
//!   h1 = rmsnorm(x)·g1;  q, k, v = h1 Wqᵀ (+ bq), h1 Wkᵀ (+ bk), h1 Wvᵀ (+ bv)
//!   (q, k = rmsnorm(q)·gq, rmsnorm(k)·gk over each head's head_dim, where the layer has q_norm
//!   and k_norm: Qwen3);  q, k = rope(q, k)
//!   o, lse = attention(q, k, v)                       (distributed: communication)
//!   x2 = x + o Woᵀ (+ bo);  h2 = rmsnorm(x2)·g2;  g, u = h2 Wgᵀ, h2 Wuᵀ;  m = silu(g)∘u
//!   out = x2 + m Wdᵀ
//! Backward runs the same lines upwards. It reads every activation above except `out`; the
//! policy decides which it finds saved and which it recomputes (docs/architecture.md,
//! "Checkpoint policies"):
//! - `none`: all kept.
//! - `remat`: x, o and lse kept; h1, q, k, v recomputed from x, x2…m from x and o. The attention
//!   backward runs from the saved o and lse, so attention's forward runs once per step.
//! - `layer`: x kept; the whole layer, attention forward included, re-runs in the backward.
//!
//! The MLP (g, u, m and their gradients, `[rows, intermediate]` each) runs over blocks of rows
//! ([`mlp_block_rows`]), forward and backward, so at long sequences its wide tensors exist a
//! block at a time; rows are independent there, so only the weight gradients' summation order
//! changes.

use super::attention_api::Attention;
use super::config::Config;
use super::meter::Meter;
use super::ops::{LinearBackward, NormBackward, Ops, RopeCall, Rows};
use super::rope::Rotary;
use super::weights::{LayerTensor, LayerWeights};
use crate::shape::Span;
use anyhow::Result;
use std::fmt;
use std::str::FromStr;

/// Which activations a layer keeps between forward and backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpoint {
    None,
    Layer,
    Remat,
}

impl FromStr for Checkpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Checkpoint::None),
            "layer" => Ok(Checkpoint::Layer),
            "remat" => Ok(Checkpoint::Remat),
            other => Err(format!(
                "unknown checkpoint policy '{other}': use none, layer or remat"
            )),
        }
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Checkpoint::None => "none",
            Checkpoint::Layer => "layer",
            Checkpoint::Remat => "remat",
        })
    }
}

/// Every activation the layer backward reads up to the MLP's input (q and k after rotation;
/// before their per-head norms where the layer has them).
pub struct Acts<T> {
    x: T,
    h1: T,
    rstd1: T,
    q: T,
    q_pre: Option<PreNorm<T>>,
    k: T,
    k_pre: Option<PreNorm<T>>,
    v: T,
    o: T,
    lse: T,
    x2: T,
    h2: T,
    rstd2: T,
}

/// An attention input's heads before their norm (Qwen3's q_norm, k_norm), and the norm's rstd,
/// one a row and head: what the norm's backward reads.
pub struct PreNorm<T> {
    x: T,
    rstd: T,
}

impl<T> PreNorm<T> {
    fn try_map<U>(&self, f: &mut impl FnMut(&T) -> Result<U>) -> Result<PreNorm<U>> {
        Ok(PreNorm {
            x: f(&self.x)?,
            rstd: f(&self.rstd)?,
        })
    }
}

/// An attention input and, where its heads were normed, what the norm's backward reads.
type Normed<T> = (T, Option<PreNorm<T>>);

/// The MLP's `[rows, intermediate]` activations of one block of rows.
pub struct MlpActs<T> {
    g: T,
    u: T,
    m: T,
}

/// The layer's output and the MLP blocks' activations it kept.
type MlpOut<T> = (T, Vec<MlpActs<T>>);

impl<T> Acts<T> {
    fn try_map<U>(&self, f: &mut impl FnMut(&T) -> Result<U>) -> Result<Acts<U>> {
        Ok(Acts {
            x: f(&self.x)?,
            h1: f(&self.h1)?,
            rstd1: f(&self.rstd1)?,
            q: f(&self.q)?,
            q_pre: self.q_pre.as_ref().map(|p| p.try_map(f)).transpose()?,
            k: f(&self.k)?,
            k_pre: self.k_pre.as_ref().map(|p| p.try_map(f)).transpose()?,
            v: f(&self.v)?,
            o: f(&self.o)?,
            lse: f(&self.lse)?,
            x2: f(&self.x2)?,
            h2: f(&self.h2)?,
            rstd2: f(&self.rstd2)?,
        })
    }
}

impl<T> MlpActs<T> {
    fn try_map<U>(&self, f: &mut impl FnMut(&T) -> Result<U>) -> Result<MlpActs<U>> {
        Ok(MlpActs {
            g: f(&self.g)?,
            u: f(&self.u)?,
            m: f(&self.m)?,
        })
    }
}

/// What a layer keeps for its backward under each policy.
pub enum Kept<T> {
    /// Everything, the MLP's activations block by block.
    All(Acts<T>, Vec<MlpActs<T>>),
    AttentionOut {
        x: T,
        o: T,
        lse: T,
    },
    Input {
        x: T,
    },
}

impl<T> Kept<T> {
    /// The same checkpoint with every tensor's image under `f` (its copy in host memory, or
    /// back: `offload`).
    pub fn try_map<U>(&self, mut f: impl FnMut(&T) -> Result<U>) -> Result<Kept<U>> {
        Ok(match self {
            Kept::All(a, mlp) => Kept::All(
                a.try_map(&mut f)?,
                mlp.iter()
                    .map(|m| m.try_map(&mut f))
                    .collect::<Result<_>>()?,
            ),
            Kept::AttentionOut { x, o, lse } => Kept::AttentionOut {
                x: f(x)?,
                o: f(o)?,
                lse: f(lse)?,
            },
            Kept::Input { x } => Kept::Input { x: f(x)? },
        })
    }
}

/// One of attention's inputs as a projection of the normed input h1: its weight and bias (where
/// the layer has one), its heads, the gain of their norm (where the layer has one: Qwen3's q
/// and k), and whether rotary embeddings turn it (q and k, not v).
#[derive(Clone, Copy)]
struct Input {
    weight: LayerTensor,
    bias: LayerTensor,
    heads: usize,
    norm: Option<LayerTensor>,
    rotated: bool,
}

/// Elements of one of the MLP's `[rows, intermediate]` tensors that may exist at once: 64 Mi
/// (128 MiB in 16 bits). The MLP runs over blocks of rows this size, so its widest tensors and
/// their gradients stop growing with the sequence (at LLaMA-7B's 11008 that is 6096 rows).
const MLP_BLOCK_ELEMENTS: usize = 1 << 26;

/// Rows the MLP handles at once for `c` (at least one).
pub fn mlp_block_rows(c: &Config) -> usize {
    (MLP_BLOCK_ELEMENTS / c.intermediate_size.max(1)).max(1)
}

/// A layer's gradient accumulators, lent for its backward.
pub struct LayerGrads<'a, T> {
    pub grads: &'a mut LayerWeights<T>,
    /// The projections' gradients hold nothing yet (scratch: `train::shard::Held::step_grads`,
    /// a sequence's first backward in a step): the layer's first product into each writes it
    /// (`LinearBackward::dw_empty`). The norms' and biases' hold zeros or sums either way.
    pub projections_empty: bool,
}

/// A layer's setting: the device, the shape, and this worker's rows (`positions`: where they sit
/// in the sequence, for rotary embeddings, `rotary` the run's table; `mlp_rows`: the MLP's block,
/// `mlp_block_rows`).
pub struct Layer<'a, O> {
    pub ops: &'a O,
    pub cfg: &'a Config,
    pub rows: usize,
    pub positions: &'a [Span],
    pub rotary: &'a Rotary,
    pub mlp_rows: usize,
}

impl<O: Ops> Layer<'_, O> {
    fn bytes(&self, ts: &[&O::T]) -> usize {
        ts.iter().map(|t| self.ops.len(t)).sum::<usize>() * self.ops.elem_bytes()
    }

    fn acts_bytes(&self, a: &Acts<O::T>) -> usize {
        let pre = [&a.q_pre, &a.k_pre].into_iter().flatten();
        let pre: Vec<&O::T> = pre.flat_map(|p| [&p.x, &p.rstd]).collect();
        self.bytes(&[
            &a.x, &a.h1, &a.rstd1, &a.q, &a.k, &a.v, &a.o, &a.lse, &a.x2, &a.h2, &a.rstd2,
        ]) + self.bytes(&pre)
    }

    fn mlp_bytes(&self, m: &MlpActs<O::T>) -> usize {
        self.bytes(&[&m.g, &m.u, &m.m])
    }

    /// Bytes of a layer's checkpoint (for the meter).
    pub fn kept_bytes(&self, k: &Kept<O::T>) -> usize {
        match k {
            Kept::All(a, mlp) => {
                self.acts_bytes(a) + mlp.iter().map(|m| self.mlp_bytes(m)).sum::<usize>()
            }
            Kept::AttentionOut { x, o, lse } => self.bytes(&[x, o, lse]),
            Kept::Input { x } => self.bytes(&[x]),
        }
    }

    /// Every activation from x; attention runs unless its (o, lse) are given (remat).
    fn acts(
        &self,
        w: &LayerWeights<O::T>,
        x: O::T,
        saved_attention: Option<(O::T, O::T)>,
        attn: &mut impl Attention<O::T>,
        forwards: &mut u32,
    ) -> Result<Acts<O::T>> {
        let (ops, c, n) = (self.ops, self.cfg, self.rows);
        let d = c.hidden_size;
        let (h1, rstd1) = ops.rmsnorm(&x, &w[LayerTensor::AttnNorm], n, d, c.rms_norm_eps)?;
        let [query, key, value] = self.inputs();
        let (q, q_pre) = self.input(w, &h1, query)?;
        let (k, k_pre) = self.input(w, &h1, key)?;
        let (v, _) = self.input(w, &h1, value)?;
        let (o, lse) = match saved_attention {
            Some(saved) => saved,
            None => {
                *forwards += 1;
                attn.forward(&q, &k, &v)?
            }
        };
        let mut x2 = self.projection(
            &o,
            &w[LayerTensor::Wo],
            w.get(LayerTensor::Bo),
            c.q_width(),
            d,
        )?;
        ops.add_assign(&mut x2, &x)?;
        let (h2, rstd2) = ops.rmsnorm(&x2, &w[LayerTensor::MlpNorm], n, d, c.rms_norm_eps)?;
        Ok(Acts {
            x,
            h1,
            rstd1,
            q,
            q_pre,
            k,
            k_pre,
            v,
            o,
            lse,
            x2,
            h2,
            rstd2,
        })
    }

    /// Attention's three inputs, q, k and v, as projections of h1.
    fn inputs(&self) -> [Input; 3] {
        let c = self.cfg;
        let (heads, kv_heads) = (c.num_attention_heads, c.num_key_value_heads);
        [
            Input {
                weight: LayerTensor::Wq,
                bias: LayerTensor::Bq,
                heads,
                norm: Some(LayerTensor::QNorm),
                rotated: true,
            },
            Input {
                weight: LayerTensor::Wk,
                bias: LayerTensor::Bk,
                heads: kv_heads,
                norm: Some(LayerTensor::KNorm),
                rotated: true,
            },
            Input {
                weight: LayerTensor::Wv,
                bias: LayerTensor::Bv,
                heads: kv_heads,
                norm: None,
                rotated: false,
            },
        ]
    }

    /// The rotation of `input`'s heads at this chunk's positions (`inverse`: its backward).
    fn rotation(&self, input: Input, inverse: bool) -> RopeCall<'_> {
        RopeCall {
            rows: self.rows,
            heads: input.heads,
            head_dim: self.cfg.head_dim,
            positions: self.positions,
            rotary: self.rotary,
            inverse,
        }
    }

    /// One of attention's inputs from h1: its projection, each head normed where the layer has
    /// the input's norm, rotated where it is q or k; and what the norm's backward reads.
    fn input(&self, w: &LayerWeights<O::T>, h1: &O::T, input: Input) -> Result<Normed<O::T>> {
        let (c, hd) = (self.cfg, self.cfg.head_dim);
        let width = input.heads * hd;
        let mut y = self.projection(
            h1,
            &w[input.weight],
            w.get(input.bias),
            c.hidden_size,
            width,
        )?;
        let (ops, n) = (self.ops, self.rows);
        // Each head's vector is a row of head_dim: the rows of y, `heads` times as many.
        let pre = match input.norm.and_then(|t| w.get(t)) {
            Some(gain) => {
                let (normed, rstd) = ops.rmsnorm(&y, gain, n * input.heads, hd, c.rms_norm_eps)?;
                Some(PreNorm {
                    x: std::mem::replace(&mut y, normed),
                    rstd,
                })
            }
            None => None,
        };
        if input.rotated {
            ops.rope(&mut y, self.rotation(input, false))?;
        }
        Ok((y, pre))
    }

    /// [`Layer::input`] backward: from `dy`, the gradient of the input attention read, the
    /// projection's weight and bias gradients (and its norm's gain's) accumulate in `grads` and
    /// h1's in `dh1`; `pre` is what the input's norm kept, where it has one.
    fn input_backward(
        &self,
        w: &LayerWeights<O::T>,
        h1: &O::T,
        input: Input,
        mut dy: O::T,
        pre: Option<PreNorm<O::T>>,
        (grads, dh1, dh1_empty): (&mut LayerGrads<'_, O::T>, &mut O::T, bool),
    ) -> Result<()> {
        let (ops, c, n, hd) = (self.ops, self.cfg, self.rows, self.cfg.head_dim);
        let width = input.heads * hd;
        if input.rotated {
            ops.rope(&mut dy, self.rotation(input, true))?;
        }
        if let (Some(pre), Some(norm)) = (pre, input.norm) {
            // The projection's gradient in the activations' precision: the norm's backward
            // writes it whole and the projection's backward reads it next (as attention's dO).
            let mut dx = ops.activation_zeros(n * width)?;
            let rows = n * input.heads;
            let operands = NormBackward {
                x: &pre.x,
                w: &w[norm],
                rstd: &pre.rstd,
                dy: &dy,
                rows,
                dim: hd,
            };
            ops.rmsnorm_backward(operands, &mut dx, &mut grads.grads[norm])?;
            dy = dx;
        }
        self.bias_grad(&dy, width, grads.grads.get_mut(input.bias))?;
        let (d, wt) = (c.hidden_size, input.weight);
        let operands = LinearBackward {
            dy: Rows::whole(&dy),
            x: Rows::whole(h1),
            w: &w[wt],
            rows: n,
            inp: d,
            out: width,
            dx_empty: dh1_empty,
            dw_empty: grads.projections_empty,
        };
        ops.linear_backward(operands, Rows::whole(dh1), &mut grads.grads[wt])
    }

    /// y = x Wᵀ + b (the bias where the layer has one) for this worker's rows.
    fn projection(
        &self,
        x: &O::T,
        w: &O::T,
        b: Option<&O::T>,
        inp: usize,
        out: usize,
    ) -> Result<O::T> {
        let mut y = self.ops.linear(Rows::whole(x), w, self.rows, inp, out)?;
        if let Some(b) = b {
            self.ops.bias_add(&mut y, b, self.rows, out)?;
        }
        Ok(y)
    }

    /// db += Σ_rows dy where the layer has the bias (its gradient accumulator is then there).
    fn bias_grad(&self, dy: &O::T, width: usize, db: Option<&mut O::T>) -> Result<()> {
        match db {
            Some(db) => self.ops.bias_backward(dy, self.rows, width, db),
            None => Ok(()),
        }
    }

    /// The blocks of rows the MLP runs over: (first row, rows).
    fn blocks(&self) -> impl Iterator<Item = (usize, usize)> + use<'_, O> {
        let step = self.mlp_rows.max(1);
        (0..self.rows)
            .step_by(step)
            .map(move |start| (start, step.min(self.rows - start)))
    }

    /// g, u = h2 Wgᵀ, h2 Wuᵀ;  m = silu(g)∘u for `rows` rows of h2 (read in place).
    fn mlp_acts(
        &self,
        w: &LayerWeights<O::T>,
        h2: Rows<&O::T>,
        rows: usize,
    ) -> Result<MlpActs<O::T>> {
        let (ops, d, i) = (self.ops, self.cfg.hidden_size, self.cfg.intermediate_size);
        let g = ops.linear(h2, &w[LayerTensor::WGate], rows, d, i)?;
        let u = ops.linear(h2, &w[LayerTensor::WUp], rows, d, i)?;
        let m = ops.swiglu(&g, &u)?;
        Ok(MlpActs { g, u, m })
    }

    /// out = x2 + m Wdᵀ block by block, each block's product added into its rows of `x2` (which
    /// becomes the output) as the product writes them; the blocks' MLP activations when `keep`.
    fn mlp_forward(
        &self,
        w: &LayerWeights<O::T>,
        h2: &O::T,
        mut x2: O::T,
        keep: bool,
        meter: &mut Meter,
    ) -> Result<MlpOut<O::T>> {
        let (ops, d, i) = (self.ops, self.cfg.hidden_size, self.cfg.intermediate_size);
        let mut kept = Vec::new();
        for (start, len) in self.blocks() {
            let mlp = self.mlp_acts(w, Rows::window(h2, start), len)?;
            let bytes = self.mlp_bytes(&mlp);
            meter.hold(bytes);
            let down = &w[LayerTensor::WDown];
            ops.linear_add(&mlp.m, down, Rows::window(&mut x2, start), len, i, d)?;
            if keep {
                kept.push(mlp);
            } else {
                meter.release(bytes);
            }
        }
        Ok((x2, kept))
    }

    /// dh2 from dout through the MLP, block by block (activations from `kept`, else
    /// recomputed from h2); its weight gradients accumulate in `grads`.
    fn mlp_backward(
        &self,
        w: &LayerWeights<O::T>,
        a: &Acts<O::T>,
        kept: Option<&[MlpActs<O::T>]>,
        dout: &O::T,
        grads: &mut LayerGrads<'_, O::T>,
        meter: &mut Meter,
    ) -> Result<O::T> {
        let (ops, d, i) = (self.ops, self.cfg.hidden_size, self.cfg.intermediate_size);
        // Each block's gate product writes its rows of dh2 first, the up product adds to them.
        let mut dh2 = ops.scratch(self.rows * d)?;
        for (n, (start, len)) in self.blocks().enumerate() {
            let h2 = Rows::window(&a.h2, start);
            let recomputed;
            let mlp = match kept {
                Some(kept) => &kept[n],
                None => {
                    recomputed = self.mlp_acts(w, h2, len)?;
                    meter.hold(self.mlp_bytes(&recomputed));
                    &recomputed
                }
            };
            // out = x2 + m Wdᵀ;  m = silu(g)∘u;  g, u = h2 Wgᵀ, h2 Wuᵀ
            // The first block's products write empty weight gradients, the others add to them.
            let dw_empty = grads.projections_empty && n == 0;
            let mut dm = ops.scratch(len * i)?;
            let down = LinearBackward {
                dy: Rows::window(dout, start),
                x: Rows::whole(&mlp.m),
                w: &w[LayerTensor::WDown],
                rows: len,
                inp: i,
                out: d,
                dx_empty: true,
                dw_empty,
            };
            let dw = &mut grads.grads[LayerTensor::WDown];
            ops.linear_backward(down, Rows::whole(&mut dm), dw)?;
            let (dg, du) = ops.swiglu_backward(&mlp.g, &mlp.u, &dm)?;
            // The gate and up projections read the same block of h2; their gradients add into
            // its rows of dh2.
            for (dy, t, dx_empty) in [
                (&dg, LayerTensor::WGate, true),
                (&du, LayerTensor::WUp, false),
            ] {
                let operands = LinearBackward {
                    dy: Rows::whole(dy),
                    x: h2,
                    w: &w[t],
                    rows: len,
                    inp: d,
                    out: i,
                    dx_empty,
                    dw_empty,
                };
                let (dh2, dw) = (Rows::window(&mut dh2, start), &mut grads.grads[t]);
                ops.linear_backward(operands, dh2, dw)?;
            }
            if kept.is_none() {
                meter.release(self.mlp_bytes(mlp));
            }
        }
        Ok(dh2)
    }

    /// The layer's output and what `policy` keeps of its activations.
    pub fn forward(
        &self,
        w: &LayerWeights<O::T>,
        x: O::T,
        policy: Checkpoint,
        attn: &mut impl Attention<O::T>,
        forwards: &mut u32,
        meter: &mut Meter,
    ) -> Result<(O::T, Kept<O::T>)> {
        let a = self.acts(w, x, None, attn, forwards)?;
        let acts = self.acts_bytes(&a);
        meter.hold(acts);
        // The MLP adds into x2, which becomes the output: a copy of it where it is kept.
        let (out, kept, mlp_bytes) = match policy {
            Checkpoint::None => {
                let (out, mlp) = self.mlp_forward(w, &a.h2, a.x2.clone(), true, meter)?;
                let bytes = mlp.iter().map(|m| self.mlp_bytes(m)).sum::<usize>();
                (out, Kept::All(a, mlp), bytes)
            }
            Checkpoint::Remat => {
                let Acts {
                    x, o, lse, x2, h2, ..
                } = a;
                let (out, _) = self.mlp_forward(w, &h2, x2, false, meter)?;
                (out, Kept::AttentionOut { x, o, lse }, 0)
            }
            Checkpoint::Layer => {
                let Acts { x, x2, h2, .. } = a;
                let (out, _) = self.mlp_forward(w, &h2, x2, false, meter)?;
                (out, Kept::Input { x }, 0)
            }
        };
        meter.release(acts + mlp_bytes - self.kept_bytes(&kept));
        Ok((out, kept))
    }

    /// dx from dout (the gradient of the layer's output); weight gradients accumulate in `grads`
    /// (the projections' written by their first products where `grads` says they are empty).
    pub fn backward(
        &self,
        w: &LayerWeights<O::T>,
        kept: Kept<O::T>,
        dout: O::T,
        attn: &mut impl Attention<O::T>,
        mut grads: LayerGrads<'_, O::T>,
        (forwards, meter): (&mut u32, &mut Meter),
    ) -> Result<O::T> {
        let (ops, c, n) = (self.ops, self.cfg, self.rows);
        let (d, qw) = (c.hidden_size, c.q_width());
        let had = self.kept_bytes(&kept);
        let (a, mlp) = match kept {
            Kept::All(a, mlp) => (a, Some(mlp)),
            Kept::AttentionOut { x, o, lse } => {
                (self.acts(w, x, Some((o, lse)), attn, forwards)?, None)
            }
            Kept::Input { x } => (self.acts(w, x, None, attn, forwards)?, None),
        };
        let mlp_kept: usize = mlp.iter().flatten().map(|m| self.mlp_bytes(m)).sum();
        let all = self.acts_bytes(&a) + mlp_kept;
        meter.hold(all - had);

        // h2 = rmsnorm(x2)·g2, and the MLP above it. The residual's gradient dout becomes dx2
        // (moved, not copied), and what only the MLP's backward reads is dropped before the
        // attention's backward, the step's peak.
        let dh2 = self.mlp_backward(w, &a, mlp.as_deref(), &dout, &mut grads, meter)?;
        drop(mlp);
        let mut dx2 = dout;
        let mlp_norm = NormBackward {
            x: &a.x2,
            w: &w[LayerTensor::MlpNorm],
            rstd: &a.rstd2,
            dy: &dh2,
            rows: n,
            dim: d,
        };
        ops.rmsnorm_backward(mlp_norm, &mut dx2, &mut grads.grads[LayerTensor::MlpNorm])?;
        drop(dh2);
        let Acts {
            x,
            h1,
            rstd1,
            q,
            q_pre,
            k,
            k_pre,
            v,
            o,
            lse,
            x2,
            h2,
            rstd2,
        } = a;
        drop((x2, h2, rstd2));

        // x2 = x + o Woᵀ + bo;  o = attention(q, k, v), backward from the saved o and lse
        self.bias_grad(&dx2, d, grads.grads.get_mut(LayerTensor::Bo))?;
        // dO in the activations' precision: one product writes it whole and the attention's
        // 16-bit kernel reads it next.
        let mut dout_attn = ops.activation_zeros(n * qw)?;
        let wo = LinearBackward {
            dy: Rows::whole(&dx2),
            x: Rows::whole(&o),
            w: &w[LayerTensor::Wo],
            rows: n,
            inp: qw,
            out: d,
            dx_empty: true,
            dw_empty: grads.projections_empty,
        };
        let dw = &mut grads.grads[LayerTensor::Wo];
        ops.linear_backward(wo, Rows::whole(&mut dout_attn), dw)?;
        let (dq, dk, dv) = attn.backward(&q, &k, &v, &o, &lse, &dout_attn)?;
        drop((q, k, v, o, lse, dout_attn));

        // q, k = rope(h1 Wqᵀ + bq, h1 Wkᵀ + bk);  v = h1 Wvᵀ + bv;  h1 = rmsnorm(x)·g1
        // q's product writes dh1, k's and v's add to it.
        let mut dh1 = ops.scratch(n * d)?;
        let (inputs, pre) = (self.inputs(), [q_pre, k_pre, None]);
        let firsts = [true, false, false];
        for (((input, dy), pre), first) in inputs.into_iter().zip([dq, dk, dv]).zip(pre).zip(firsts)
        {
            self.input_backward(w, &h1, input, dy, pre, (&mut grads, &mut dh1, first))?;
        }
        drop(h1);
        let mut dx = dx2;
        let attn_norm = NormBackward {
            x: &x,
            w: &w[LayerTensor::AttnNorm],
            rstd: &rstd1,
            dy: &dh1,
            rows: n,
            dim: d,
        };
        ops.rmsnorm_backward(attn_norm, &mut dx, &mut grads.grads[LayerTensor::AttnNorm])?;
        meter.release(all);
        Ok(dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention_api::Dense;
    use crate::model::cpu::Cpu;
    use crate::model::weights::{self, Weights};

    /// One layer's output, input gradient and weight gradients under `policy` with the MLP run
    /// over blocks of `mlp_rows` rows.
    /// With `empty`, the projections' gradients start as scratch (NaN here) that their first
    /// products must write, as a step's first sequence leaves them (`LayerGrads`).
    fn layer_run(
        mlp_rows: usize,
        policy: Checkpoint,
        empty: bool,
    ) -> (Vec<f64>, Vec<f64>, Vec<Vec<f64>>) {
        let cfg = Config {
            intermediate_size: 24,
            ..Config::preset("tiny").unwrap()
        };
        let ops = Cpu::<f64>::new();
        let rows = 13;
        let w: Weights<Vec<f64>> = weights::random(&ops, &cfg, 5).unwrap();
        let mut grads = weights::zeros(&ops, &cfg).unwrap();
        if empty {
            for t in LayerTensor::of(&cfg).filter(|t| t.is_projection()) {
                let g = &mut grads.layers[0][t];
                *g = ops.scratch(g.len()).unwrap();
            }
        }
        let positions = [Span {
            start: 0,
            len: rows,
        }];
        let rotary = cfg.rotary(rows);
        let layer = Layer {
            ops: &ops,
            cfg: &cfg,
            rows,
            positions: &positions,
            rotary: &rotary,
            mlp_rows,
        };
        let mut attn = Dense {
            dims: cfg.dims(),
            rows,
            mask: crate::shape::Mask::causal(),
        };
        let x: Vec<f64> = (0..rows * cfg.hidden_size)
            .map(|i| ((i * 37 % 101) as f64 / 50.0) - 1.0)
            .collect();
        let dout: Vec<f64> = (0..rows * cfg.hidden_size)
            .map(|i| ((i * 53 % 97) as f64 / 48.0) - 1.0)
            .collect();
        let (mut forwards, mut meter) = (0, Meter::default());
        let (lw, gw) = (&w.layers[0], &mut grads.layers[0]);
        let (out, kept) = layer
            .forward(lw, x, policy, &mut attn, &mut forwards, &mut meter)
            .unwrap();
        let lent = LayerGrads {
            grads: &mut *gw,
            projections_empty: empty,
        };
        let dx = layer
            .backward(lw, kept, dout, &mut attn, lent, (&mut forwards, &mut meter))
            .unwrap();
        let g = [
            LayerTensor::WGate,
            LayerTensor::WUp,
            LayerTensor::WDown,
            LayerTensor::MlpNorm,
            LayerTensor::Wq,
            LayerTensor::Wo,
            LayerTensor::AttnNorm,
        ]
        .map(|t| &gw[t]);
        (out, dx, g.iter().map(|t| t.to_vec()).collect())
    }

    #[test]
    fn mlp_blocks_of_rows_change_nothing_but_rounding() {
        for policy in [Checkpoint::None, Checkpoint::Layer, Checkpoint::Remat] {
            let (out, dx, grads) = layer_run(1000, policy, false);
            // Uneven blocks (13 rows in 5, 5, 3) and single rows.
            for mlp_rows in [5, 1] {
                let (o, d, g) = layer_run(mlp_rows, policy, false);
                let close = |a: &[f64], b: &[f64]| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-12)
                };
                assert!(close(&o, &out), "{policy}, blocks of {mlp_rows}: output");
                assert!(close(&d, &dx), "{policy}, blocks of {mlp_rows}: dx");
                for (a, b) in g.iter().zip(&grads) {
                    assert!(
                        close(a, b),
                        "{policy}, blocks of {mlp_rows}: a weight gradient"
                    );
                }
            }
        }
        assert_eq!(mlp_block_rows(&Config::preset("llama2-7b").unwrap()), 6096);
    }

    /// Projections' gradients that hold nothing yet (scratch, NaN on the CPU) are written by
    /// their first products, the first MLP block's among several, and come out as sums into
    /// zeros do: the same values, whatever the blocks and the policy.
    #[test]
    fn empty_projection_gradients_are_written_by_their_first_products() {
        for policy in [Checkpoint::None, Checkpoint::Remat] {
            for mlp_rows in [1000, 5, 1] {
                let added = layer_run(mlp_rows, policy, false);
                let written = layer_run(mlp_rows, policy, true);
                assert_eq!(written, added, "{policy}, blocks of {mlp_rows}");
            }
        }
    }
}
