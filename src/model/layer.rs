//! One LLaMA decoder layer, forward and backward side by side, and what each checkpoint policy
//! keeps between them.
//!
//! Forward, for the rows of this worker (x `[rows, d]`):
//!   h1 = rmsnorm(x)·g1;  q, k, v = h1 Wqᵀ, h1 Wkᵀ, h1 Wvᵀ;  q, k = rope(q, k)
//!   o, lse = attention(q, k, v)                       (distributed: communication)
//!   x2 = x + o Woᵀ;  h2 = rmsnorm(x2)·g2;  g, u = h2 Wgᵀ, h2 Wuᵀ;  m = silu(g)∘u
//!   out = x2 + m Wdᵀ
//! Backward runs the same lines upwards. It reads every activation above except `out`; the
//! policy decides which it finds saved and which it recomputes (DESIGN.md, "Checkpointing"):
//! - `none`: all kept.
//! - `remat`: x, o and lse kept; h1, q, k, v recomputed from x, x2…m from x and o. The attention
//!   backward runs from the saved o and lse, so attention's forward runs once per step.
//! - `layer`: x kept; the whole layer, attention forward included, re-runs in the backward.

use super::Meter;
use super::attention::Attention;
use super::config::Config;
use super::ops::Ops;
use super::weights::LayerWeights;
use crate::attn::Span;
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

/// Every activation the layer backward reads (q and k after rotation).
pub struct Acts<T> {
    x: T,
    h1: T,
    rstd1: T,
    q: T,
    k: T,
    v: T,
    o: T,
    lse: T,
    x2: T,
    h2: T,
    rstd2: T,
    g: T,
    u: T,
    m: T,
}

/// What a layer keeps for its backward under each policy.
pub enum Kept<T> {
    All(Acts<T>),
    AttentionOut { x: T, o: T, lse: T },
    Input { x: T },
}

/// A layer's setting: the device, the shape, and this worker's rows (`positions`: where they sit
/// in the sequence, for rotary embeddings).
pub struct Layer<'a, O> {
    pub ops: &'a O,
    pub cfg: &'a Config,
    pub rows: usize,
    pub positions: &'a [Span],
}

impl<O: Ops> Layer<'_, O> {
    fn bytes(&self, ts: &[&O::T]) -> usize {
        ts.iter().map(|t| self.ops.len(t)).sum::<usize>() * self.ops.elem_bytes()
    }

    fn acts_bytes(&self, a: &Acts<O::T>) -> usize {
        self.bytes(&[
            &a.x, &a.h1, &a.rstd1, &a.q, &a.k, &a.v, &a.o, &a.lse, &a.x2, &a.h2, &a.rstd2, &a.g,
            &a.u, &a.m,
        ])
    }

    fn kept_bytes(&self, k: &Kept<O::T>) -> usize {
        match k {
            Kept::All(a) => self.acts_bytes(a),
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
        let (d, hd) = (c.hidden_size, c.head_dim);
        let (h1, rstd1) = ops.rmsnorm(&x, &w.attn_norm, n, d, c.rms_norm_eps)?;
        let mut q = ops.linear(&h1, &w.wq, n, d, c.q_width())?;
        let mut k = ops.linear(&h1, &w.wk, n, d, c.kv_width())?;
        let v = ops.linear(&h1, &w.wv, n, d, c.kv_width())?;
        let (heads, kv_heads) = (c.num_attention_heads, c.num_key_value_heads);
        ops.rope(&mut q, n, heads, hd, self.positions, c.rope_theta, false)?;
        ops.rope(&mut k, n, kv_heads, hd, self.positions, c.rope_theta, false)?;
        let (o, lse) = match saved_attention {
            Some(saved) => saved,
            None => {
                *forwards += 1;
                attn.forward(&q, &k, &v)?
            }
        };
        let mut x2 = ops.linear(&o, &w.wo, n, c.q_width(), d)?;
        ops.add_assign(&mut x2, &x)?;
        let (h2, rstd2) = ops.rmsnorm(&x2, &w.mlp_norm, n, d, c.rms_norm_eps)?;
        let g = ops.linear(&h2, &w.w_gate, n, d, c.intermediate_size)?;
        let u = ops.linear(&h2, &w.w_up, n, d, c.intermediate_size)?;
        let m = ops.swiglu(&g, &u)?;
        Ok(Acts {
            x,
            h1,
            rstd1,
            q,
            k,
            v,
            o,
            lse,
            x2,
            h2,
            rstd2,
            g,
            u,
            m,
        })
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
        let c = self.cfg;
        let a = self.acts(w, x, None, attn, forwards)?;
        let all = self.acts_bytes(&a);
        meter.hold(all);
        let mut out = self.ops.linear(
            &a.m,
            &w.w_down,
            self.rows,
            c.intermediate_size,
            c.hidden_size,
        )?;
        self.ops.add_assign(&mut out, &a.x2)?;
        let kept = match policy {
            Checkpoint::None => Kept::All(a),
            Checkpoint::Remat => Kept::AttentionOut {
                x: a.x,
                o: a.o,
                lse: a.lse,
            },
            Checkpoint::Layer => Kept::Input { x: a.x },
        };
        meter.release(all - self.kept_bytes(&kept));
        Ok((out, kept))
    }

    /// dx from dout (the gradient of the layer's output); weight gradients accumulate in `grads`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        w: &LayerWeights<O::T>,
        kept: Kept<O::T>,
        dout: O::T,
        attn: &mut impl Attention<O::T>,
        grads: &mut LayerWeights<O::T>,
        forwards: &mut u32,
        meter: &mut Meter,
    ) -> Result<O::T> {
        let (ops, c, n) = (self.ops, self.cfg, self.rows);
        let (d, i, qw, kw) = (
            c.hidden_size,
            c.intermediate_size,
            c.q_width(),
            c.kv_width(),
        );
        let had = self.kept_bytes(&kept);
        let a = match kept {
            Kept::All(a) => a,
            Kept::AttentionOut { x, o, lse } => self.acts(w, x, Some((o, lse)), attn, forwards)?,
            Kept::Input { x } => self.acts(w, x, None, attn, forwards)?,
        };
        let all = self.acts_bytes(&a);
        meter.hold(all - had);

        // out = x2 + m Wdᵀ;  m = silu(g)∘u;  g, u = h2 Wgᵀ, h2 Wuᵀ;  h2 = rmsnorm(x2)·g2
        let mut dx2 = dout.clone();
        let mut dm = ops.zeros(n * i)?;
        ops.linear_backward(&dout, &a.m, &w.w_down, n, i, d, &mut dm, &mut grads.w_down)?;
        let (dg, du) = ops.swiglu_backward(&a.g, &a.u, &dm)?;
        let mut dh2 = ops.zeros(n * d)?;
        ops.linear_backward(&dg, &a.h2, &w.w_gate, n, d, i, &mut dh2, &mut grads.w_gate)?;
        ops.linear_backward(&du, &a.h2, &w.w_up, n, d, i, &mut dh2, &mut grads.w_up)?;
        ops.rmsnorm_backward(
            &a.x2,
            &w.mlp_norm,
            &a.rstd2,
            &dh2,
            n,
            d,
            &mut dx2,
            &mut grads.mlp_norm,
        )?;

        // x2 = x + o Woᵀ;  o = attention(q, k, v), backward from the saved o and lse
        let mut dout_attn = ops.zeros(n * qw)?;
        ops.linear_backward(&dx2, &a.o, &w.wo, n, qw, d, &mut dout_attn, &mut grads.wo)?;
        let (mut dq, mut dk, dv) = attn.backward(&a.q, &a.k, &a.v, &a.o, &a.lse, &dout_attn)?;

        // q, k = rope(h1 Wqᵀ, h1 Wkᵀ);  v = h1 Wvᵀ;  h1 = rmsnorm(x)·g1
        let hd = c.head_dim;
        ops.rope(
            &mut dq,
            n,
            c.num_attention_heads,
            hd,
            self.positions,
            c.rope_theta,
            true,
        )?;
        ops.rope(
            &mut dk,
            n,
            c.num_key_value_heads,
            hd,
            self.positions,
            c.rope_theta,
            true,
        )?;
        let mut dh1 = ops.zeros(n * d)?;
        ops.linear_backward(&dq, &a.h1, &w.wq, n, d, qw, &mut dh1, &mut grads.wq)?;
        ops.linear_backward(&dk, &a.h1, &w.wk, n, d, kw, &mut dh1, &mut grads.wk)?;
        ops.linear_backward(&dv, &a.h1, &w.wv, n, d, kw, &mut dh1, &mut grads.wv)?;
        let mut dx = dx2;
        ops.rmsnorm_backward(
            &a.x,
            &w.attn_norm,
            &a.rstd1,
            &dh1,
            n,
            d,
            &mut dx,
            &mut grads.attn_norm,
        )?;
        meter.release(all);
        Ok(dx)
    }
}
