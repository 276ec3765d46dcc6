//! LLaMA-family models whose attention is distflash: config and presets, parameters, and the
//! explicit forward and backward of every layer under a checkpoint policy, written against the
//! `Ops` device interface (`cpu` implements it, and `cuda` on a GPU).
//!
//! One call of `forward_backward` handles this worker's chunk of one sequence: embedding, the
//! layers (attention across workers through `Attention`), final norm and the loss, then the
//! backward in reverse, accumulating weight gradients. Summing over workers and steps is the
//! caller's (`train`).

pub mod attention;
pub mod config;
pub mod cost;
pub mod cpu;
pub mod cuda;
pub mod float;
mod layer;
pub mod ops;
pub mod profile;
pub mod weights;

pub use layer::{Checkpoint, Layer, mlp_block_rows};

use crate::shape::Span;
use anyhow::{Result, bail};
use attention::Attention;
use config::Config;
use ops::Ops;
use weights::Weights;

/// Bytes of activations held for the backward: current and peak.
#[derive(Clone, Copy, Debug, Default)]
pub struct Meter {
    live: usize,
    pub peak: usize,
}

impl Meter {
    fn hold(&mut self, bytes: usize) {
        self.live += bytes;
        self.peak = self.peak.max(self.live);
    }

    fn release(&mut self, bytes: usize) {
        self.live -= bytes;
    }
}

/// This worker's rows of one sequence: input tokens, next-token targets, and where the rows
/// sit in the whole sequence (runs of positions in row order: one for a contiguous chunk, two
/// for a zigzag worker's head and tail).
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    pub tokens: &'a [u32],
    pub targets: &'a [u32],
    pub positions: &'a [Span],
}

/// What one forward-backward reports.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Σ loss over this chunk's rows (not yet averaged).
    pub loss_sum: f64,
    /// The most likely next token of each row.
    pub argmax: Vec<u32>,
    /// Attention forwards run per layer (1 under `none` and `remat`, 2 under `layer`).
    pub attention_forwards: Vec<u32>,
    /// Peak bytes of layer activations held for the backward.
    pub peak_activation_bytes: usize,
}

/// Forward and backward of this worker's chunk. Gradients of `loss_scale · Σ loss` accumulate
/// into `grads` (pass 1 / total tokens of all workers to average).
#[allow(clippy::too_many_arguments)]
pub fn forward_backward<O: Ops>(
    ops: &O,
    cfg: &Config,
    w: &Weights<O::T>,
    grads: &mut Weights<O::T>,
    attn: &mut impl Attention<O::T>,
    chunk: Chunk<'_>,
    policy: Checkpoint,
    loss_scale: f64,
) -> Result<Outcome> {
    let rows = chunk.tokens.len();
    if chunk.targets.len() != rows {
        bail!(
            "a chunk has {rows} tokens but {} targets",
            chunk.targets.len()
        );
    }
    let d = cfg.hidden_size;
    let layer = Layer {
        ops,
        cfg,
        rows,
        positions: chunk.positions,
        mlp_rows: layer::mlp_block_rows(cfg),
    };
    let mut forwards = vec![0u32; cfg.num_hidden_layers];
    let mut meter = Meter::default();

    let mut x = ops.embed(&w.embed, chunk.tokens, d)?;
    let mut kept = Vec::with_capacity(cfg.num_hidden_layers);
    for (l, lw) in w.layers.iter().enumerate() {
        let (out, k) = layer.forward(lw, x, policy, attn, &mut forwards[l], &mut meter)?;
        kept.push(k);
        x = out;
    }
    let (h, rstd) = ops.rmsnorm(&x, &w.norm, rows, d, cfg.rms_norm_eps)?;
    let out_grad = match &mut grads.lm_head {
        Some(g) => g,
        None => &mut grads.embed,
    };
    let loss = ops.cross_entropy(
        &h,
        w.output(),
        chunk.targets,
        d,
        cfg.vocab_size,
        loss_scale,
        out_grad,
    )?;

    let mut dx = ops.zeros(rows * d)?;
    ops.rmsnorm_backward(
        &x,
        &w.norm,
        &rstd,
        &loss.dh,
        rows,
        d,
        &mut dx,
        &mut grads.norm,
    )?;
    for (l, k) in kept.into_iter().enumerate().rev() {
        let (lw, lg) = (&w.layers[l], &mut grads.layers[l]);
        dx = layer.backward(lw, k, dx, attn, lg, &mut forwards[l], &mut meter)?;
    }
    ops.embed_backward(&mut grads.embed, chunk.tokens, &dx, d)?;
    Ok(Outcome {
        loss_sum: loss.loss_sum,
        argmax: loss.argmax,
        attention_forwards: forwards,
        peak_activation_bytes: meter.peak,
    })
}
