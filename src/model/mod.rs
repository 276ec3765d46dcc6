//! LLaMA-family models whose attention is distflash: config and presets, parameters, and the
//! explicit forward and backward of every layer under a checkpoint policy, written against the
//! `Ops` device interface (`cpu` implements it, and `cuda` on a GPU).
//!
//! One call of `forward_backward` handles this worker's chunk of one sequence: embedding, the
//! layers (attention across workers through `Attention`), final norm and the loss, then the
//! backward in reverse, accumulating weight gradients. Summing over workers and steps is the
//! caller's (`train`).

pub mod attention_api;
pub mod config;
pub mod cost;
pub mod cpu;
pub mod cuda;
pub mod family;
pub mod float;
pub mod hf_weights;
pub mod init;
pub mod instrument;
mod layer;
mod meter;
pub mod offload;
pub mod ops;
pub mod profile;
pub mod rope;
pub mod weights;

pub use layer::{Checkpoint, Kept, Layer, LayerGrads, mlp_block_rows};
pub use meter::Meter;
pub use offload::{Keep, Offload};

use crate::shape::Span;
use anyhow::{Result, bail};
use attention_api::Attention;
use config::Config;
use ops::{LossInput, NormBackward, Ops};
use weights::{LayerWeights, Weights};

/// This worker's rows of one sequence: input tokens, next-token targets, where the rows sit in
/// the whole sequence (runs of positions in row order: one for a contiguous chunk, two for a
/// zigzag worker's head and tail), and the whole sequence's length (dynamic NTK's rotary
/// frequencies depend on it).
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    pub tokens: &'a [u32],
    pub targets: &'a [u32],
    pub positions: &'a [Span],
    pub sequence: usize,
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
    /// Peak bytes of layer activations held on the device for the backward (offloaded
    /// checkpoints count while they are on the device, not while they wait in host memory).
    pub peak_activation_bytes: usize,
}

/// The model's last part as the loss needs it at once: the final norm's gain and the output
/// projection, and the accumulators of their gradients.
pub struct Head<'a, T> {
    pub norm: &'a T,
    pub output: &'a T,
    pub dnorm: &'a mut T,
    pub doutput: &'a mut T,
}

/// Where [`forward_backward_with`] takes each part of the weights from just before it uses it,
/// and where each part's gradients go as the backward finishes them: the whole weights and
/// gradients in memory ([`Whole`]), or a worker's shards, which gather a layer's weights for its
/// use, free them after, and reduce-scatter its gradients (`train::shard`, ZeRO-3). A part is
/// lent to a closure, so a store can free or reduce it when the closure returns; the attention
/// `A` is passed through, because a sharded store communicates over the attention's workers
/// between uses.
pub trait Params<T, A> {
    /// The embedding table, for the forward's lookup.
    fn with_embed<R>(&mut self, attn: &mut A, f: impl FnOnce(&T) -> Result<R>) -> Result<R>;

    /// Layer `l`'s weights, for its forward.
    fn with_layer<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, &mut A) -> Result<R>,
    ) -> Result<R>;

    /// The final norm and output projection with their gradients, for the loss and its backward.
    fn with_head<R>(&mut self, attn: &mut A, f: impl FnOnce(Head<'_, T>) -> Result<R>)
    -> Result<R>;

    /// Layer `l`'s weights and gradient accumulators, for its backward (and recompute).
    fn with_layer_grads<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, LayerGrads<'_, T>, &mut A) -> Result<R>,
    ) -> Result<R>;

    /// The embedding table's gradient accumulator, for the lookup's backward.
    fn with_embed_grad<R>(
        &mut self,
        attn: &mut A,
        f: impl FnOnce(&mut T) -> Result<R>,
    ) -> Result<R>;
}

/// Whole weights and gradients in memory: every part lent as it is.
pub struct Whole<'a, T> {
    pub w: &'a Weights<T>,
    pub grads: &'a mut Weights<T>,
    /// `grads` are as `train::shard::Held::step_grads` makes them, nothing accumulated yet: the
    /// projections' scratch, which their first products write ([`LayerGrads`]), the rest zeros.
    /// Otherwise every gradient is added to.
    pub fresh: bool,
}

impl<T, A> Params<T, A> for Whole<'_, T> {
    fn with_embed<R>(&mut self, _: &mut A, f: impl FnOnce(&T) -> Result<R>) -> Result<R> {
        f(&self.w.embed)
    }

    fn with_layer<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, &mut A) -> Result<R>,
    ) -> Result<R> {
        f(&self.w.layers[l], attn)
    }

    fn with_head<R>(&mut self, _: &mut A, f: impl FnOnce(Head<'_, T>) -> Result<R>) -> Result<R> {
        let g = &mut *self.grads;
        f(Head {
            norm: &self.w.norm,
            output: self.w.output(),
            dnorm: &mut g.norm,
            doutput: match &mut g.lm_head {
                Some(head) => head,
                None => &mut g.embed,
            },
        })
    }

    fn with_layer_grads<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, LayerGrads<'_, T>, &mut A) -> Result<R>,
    ) -> Result<R> {
        let grads = LayerGrads {
            grads: &mut self.grads.layers[l],
            projections_empty: self.fresh,
        };
        f(&self.w.layers[l], grads, attn)
    }

    fn with_embed_grad<R>(&mut self, _: &mut A, f: impl FnOnce(&mut T) -> Result<R>) -> Result<R> {
        f(&mut self.grads.embed)
    }
}

/// `params` with `at_head` called when the head is asked for, once the forward's layers are
/// done: where a counted step marks what the layers keep for the backward
/// (`train::memory::count::Counter::mark_kept`).
pub struct AtHead<'p, P, F> {
    pub params: &'p mut P,
    pub at_head: F,
}

impl<T, A, P: Params<T, A>, F: Fn()> Params<T, A> for AtHead<'_, P, F> {
    fn with_embed<R>(&mut self, attn: &mut A, f: impl FnOnce(&T) -> Result<R>) -> Result<R> {
        self.params.with_embed(attn, f)
    }

    fn with_layer<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, &mut A) -> Result<R>,
    ) -> Result<R> {
        self.params.with_layer(attn, l, f)
    }

    fn with_head<R>(
        &mut self,
        attn: &mut A,
        f: impl FnOnce(Head<'_, T>) -> Result<R>,
    ) -> Result<R> {
        (self.at_head)();
        self.params.with_head(attn, f)
    }

    fn with_layer_grads<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, LayerGrads<'_, T>, &mut A) -> Result<R>,
    ) -> Result<R> {
        self.params.with_layer_grads(attn, l, f)
    }

    fn with_embed_grad<R>(
        &mut self,
        attn: &mut A,
        f: impl FnOnce(&mut T) -> Result<R>,
    ) -> Result<R> {
        self.params.with_embed_grad(attn, f)
    }
}

/// Forward and backward of this worker's chunk. Gradients of `loss_scale · Σ loss` accumulate
/// into `grads` (pass 1 / total tokens of all workers to average).
pub fn forward_backward<O: Ops, A: Attention<O::T>>(
    ops: &O,
    cfg: &Config,
    (w, grads): (&Weights<O::T>, &mut Weights<O::T>),
    attn: &mut A,
    chunk: Chunk<'_>,
    keep: Keep,
    loss_scale: f64,
) -> Result<Outcome> {
    let mut whole = Whole {
        w,
        grads,
        fresh: false,
    };
    forward_backward_with(ops, cfg, &mut whole, attn, chunk, keep, loss_scale)
}

/// [`forward_backward`] with the weights and gradients of each part taken from and handed to
/// `params` as the pass reaches it; each layer's checkpoint kept as `keep` says
/// ([`offload::Checkpoints`]).
pub fn forward_backward_with<O: Ops, A: Attention<O::T>>(
    ops: &O,
    cfg: &Config,
    params: &mut impl Params<O::T, A>,
    attn: &mut A,
    chunk: Chunk<'_>,
    keep: Keep,
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
    let rotary = cfg.rotary(chunk.sequence);
    let layer = Layer {
        ops,
        cfg,
        rows,
        positions: chunk.positions,
        rotary: &rotary,
        mlp_rows: keep.mlp_rows(cfg, rows),
    };
    let mut forwards = vec![0u32; cfg.num_hidden_layers];
    let mut meter = Meter::default();

    let mut x = params.with_embed(attn, |table| ops.embed(table, chunk.tokens, d))?;
    let layers = cfg.num_hidden_layers;
    let mut kept = offload::Checkpoints::new(ops, keep.offload, layers);
    for (l, count) in forwards.iter_mut().enumerate() {
        let policy = keep.policy(l, layers);
        let (out, k) = params.with_layer(attn, l, |lw, attn| {
            layer.forward(lw, x, policy, attn, count, &mut meter)
        })?;
        let bytes = layer.kept_bytes(&k);
        kept.push(k, bytes, keep.whole(l, layers), &mut meter)?;
        x = out;
    }
    let (loss, dx) = params.with_head(attn, |head| {
        let (h, rstd) = ops.rmsnorm(&x, head.norm, rows, d, cfg.rms_norm_eps)?;
        let input = LossInput {
            h: &h,
            w: head.output,
            targets: chunk.targets,
            dim: d,
            vocab: cfg.vocab_size,
            scale: loss_scale,
        };
        let loss = ops.cross_entropy(input, head.doutput)?;
        let mut dx = ops.zeros(rows * d)?;
        let norm = NormBackward {
            x: &x,
            w: head.norm,
            rstd: &rstd,
            dy: &loss.dh,
            rows,
            dim: d,
        };
        ops.rmsnorm_backward(norm, &mut dx, head.dnorm)?;
        // The loss's input gradient is spent: it would otherwise live through every layer's
        // backward (an f32 of the sequence × hidden size, 8 GiB at 512K for llama2-7b).
        Ok(((loss.loss_sum, loss.argmax), dx))
    })?;
    // The last layer's output is spent too once the loss's backward has read it.
    drop(x);
    let (loss_sum, argmax) = loss;
    let mut dx = dx;
    for l in (0..cfg.num_hidden_layers).rev() {
        let k = kept.take(l, &mut meter)?;
        let count = &mut forwards[l];
        dx = params.with_layer_grads(attn, l, |lw, lg, attn| {
            layer.backward(lw, k, dx, attn, lg, (count, &mut meter))
        })?;
    }
    params.with_embed_grad(attn, |table| {
        ops.embed_backward(table, chunk.tokens, &dx, d)
    })?;
    Ok(Outcome {
        loss_sum,
        argmax,
        attention_forwards: forwards,
        peak_activation_bytes: meter.peak,
    })
}
