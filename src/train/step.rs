//! One sequence's forward and backward on this worker's rows, and the gradients summed over
//! the workers: what training, `distflash grads` and `bench train` share.

use super::data::Sample;
use super::documents::{self, Documents, Packing, Positions};
use super::model_attention::ModelAttention;
use super::shard::{self, Held};
use super::step_plan::Shard;
use super::tally::{Tally, all_reduce};
use crate::comm::Communicator;
use crate::model::attention_api::Attention;
use crate::model::config::Config;
use crate::model::ops::Ops;
use crate::model::weights::Weights;
use crate::model::{AtHead, Chunk, Keep, Params, Whole, forward_backward_with};
use crate::plan::{Partition, Schedule};
use crate::runtime::{ModelDevice, Runtime};
use crate::shape::Span;
use anyhow::Result;

/// One forward and backward of a sequence on this worker: what every pass of training, `grads`,
/// evaluation and `bench train` is given alike.
#[derive(Clone, Copy)]
pub(super) struct Pass<'a> {
    pub sample: &'a Sample,
    /// This worker's rows of the sequence.
    pub mine: &'a [Span],
    /// Whether the sequence's documents see each other, and where their positions count from.
    pub packing: Packing,
    /// What each layer keeps for its backward, and where.
    pub keep: Keep,
    /// What the summed loss is multiplied by (one over the tokens it is the mean of).
    pub scale: f64,
    /// Called when the forward's layers are done (`model::AtHead`): a counted step marks what
    /// they keep (`estimate::rank_estimate`).
    pub at_head: Option<&'a dyn Fn()>,
}

impl<'a> Pass<'a> {
    /// The pass of one whole sequence's mean loss: `grads` and `bench train`.
    pub fn of_sequence(sample: &'a Sample, mine: &'a [Span], packing: Packing, keep: Keep) -> Self {
        Pass {
            sample,
            mine,
            packing,
            keep,
            scale: 1.0 / (sample.tokens.len() - 1) as f64,
            at_head: None,
        }
    }
}

/// Forward and backward of `pass`, this worker's rows at rotary `positions`, the weights taken
/// from and the gradients handed to `params`.
pub(super) fn accumulate<O: Ops, A: Attention<O::T>>(
    ops: &O,
    cfg: &Config,
    params: &mut impl Params<O::T, A>,
    attn: &mut A,
    pass: &Pass<'_>,
    positions: &[Span],
    tally: &mut Tally,
) -> Result<crate::model::Outcome> {
    let (mine, sample) = (pass.mine, pass.sample);
    let rows = |shift: usize| -> Vec<u32> {
        mine.iter()
            .flat_map(|s| &sample.tokens[s.start + shift..s.end() + shift])
            .copied()
            .collect()
    };
    let (tokens, targets) = (rows(0), rows(1));
    let chunk = Chunk {
        tokens: &tokens,
        targets: &targets,
        positions,
        sequence: sample.tokens.len() - 1,
    };
    let (keep, scale) = (pass.keep, pass.scale);
    let out = match pass.at_head {
        Some(at_head) => {
            let mut params = AtHead { params, at_head };
            forward_backward_with(ops, cfg, &mut params, attn, chunk, keep, scale)?
        }
        None => forward_backward_with(ops, cfg, params, attn, chunk, keep, scale)?,
    };
    tally.loss_sum += out.loss_sum;
    if let Some(p) = sample.probe
        && let Some(row) =
            crate::model::ops::row_positions(mine, tokens.len())?.position(|q| q == p)
    {
        tally.probes += 1;
        tally.correct += (out.argmax[row] == sample.tokens[p + 1]) as u64;
    }
    Ok(out)
}

/// The rotary positions of this worker's rows `mine` of `sample`, and its attention planned for
/// the sample's documents under `--documents separate` (each worker derives the same mask from
/// the same sample).
pub(super) fn plan_documents<D: ModelDevice, C: Communicator<D::Tensor>>(
    cfg: &Config,
    packing: Packing,
    attn: &mut ModelAttention<'_, D, C>,
    mine: &[Span],
    sample: &Sample,
) -> Result<Vec<Span>> {
    if packing.documents == Documents::Packed {
        return Ok(mine.to_vec());
    }
    let seq = sample.tokens.len() - 1;
    let lens = documents::doc_lens(&sample.tokens[..seq], sample.eos);
    attn.set_mask(&cfg.mask(seq, &lens)?)?;
    Ok(match packing.positions {
        Positions::Continue => mine.to_vec(),
        Positions::Restart => documents::restarted(mine, &lens),
    })
}

/// This worker's weights as `held` (whole, or its pieces under `full`, each part gathered for its
/// use) in the forward and backward of `pass` (its documents as its packing says), the gradients
/// (alike: whole, or the pieces, reduced as the backward goes) into `grads`; `fresh` when they
/// are as [`Held::step_grads`] made them (nothing accumulated into them yet this step), which
/// lets the projections' first products write theirs (`model::Whole::fresh`) and `full` write its
/// first sums over its zeros ([`shard::Gathered::fresh`]).
pub(super) fn accumulate_held<D: ModelDevice, C: Communicator<D::Tensor>>(
    ops: &D::Ops,
    cfg: &Config,
    held: &Held<D::Tensor>,
    (grads, fresh): (&mut Weights<D::Tensor>, bool),
    attn: &mut ModelAttention<'_, D, C>,
    pass: &Pass<'_>,
    tally: &mut Tally,
) -> Result<crate::model::Outcome> {
    let positions = plan_documents(cfg, pass.packing, attn, pass.mine, pass.sample)?;
    let w = &held.w;
    if held.shard.gathers_weights() {
        let lens = &held.lens;
        let mut params = shard::Gathered {
            ops,
            w,
            grads,
            lens,
            fresh,
        };
        return accumulate(ops, cfg, &mut params, attn, pass, &positions, tally);
    }
    let mut params = Whole { w, grads, fresh };
    accumulate(ops, cfg, &mut params, attn, pass, &positions, tally)
}

/// What [`reduced_sequence`] gives: the pass's outcome, the summed tally and gradients, and the
/// bytes this worker sent during the forward and backward, before the gradients were summed.
pub(super) type Reduced<T> = (crate::model::Outcome, Tally, Vec<T>, u64);

/// One sequence's forward and backward (`pass`, [`Pass::of_sequence`]: the gradients of its
/// mean loss), then the gradients (whole, or this worker's pieces under `--shard grads` and
/// `full`) and the tally summed over all workers: the step of `distflash grads` and of `bench
/// train`.
pub(super) fn reduced_sequence<D: ModelDevice, C: Communicator<D::Tensor>>(
    ops: &D::Ops,
    cfg: &Config,
    held: &Held<D::Tensor>,
    attn: &mut ModelAttention<'_, D, C>,
    pass: &Pass<'_>,
) -> Result<Reduced<D::Tensor>> {
    let mut tally = Tally::default();
    let mut grads = held.step_grads(ops, cfg)?;
    let sent = |attn: &mut ModelAttention<'_, D, C>| attn.comm().map_or(0, |c| c.bytes_sent());
    let before = sent(attn);
    let out = accumulate_held(ops, cfg, held, (&mut grads, true), attn, pass, &mut tally)?;
    let pass_bytes = sent(attn) - before;
    let reduced = reduce_step(ops, attn, held.shard, grads, &mut tally)?;
    Ok((out, tally, reduced, pass_bytes))
}

/// The gradients and the tally summed over the workers: reduce-scattered to this worker's pieces
/// under `--shard grads` (under `full` the backward has reduced them), all-reduced whole
/// otherwise (the step plan shards nothing for one worker).
pub(super) fn reduce_step<D: ModelDevice, C: Communicator<D::Tensor>>(
    ops: &D::Ops,
    attn: &mut ModelAttention<'_, D, C>,
    shard: Shard,
    mut grads: Weights<D::Tensor>,
    tally: &mut Tally,
) -> Result<Vec<D::Tensor>> {
    // A lone worker on the device's whole-sequence attention has no communicator and nothing
    // to add.
    if let Some(comm) = attn.comm() {
        if shard.reduce_scatters_grads() {
            return shard::reduce_grads(ops, comm, shard, grads, tally);
        }
        all_reduce(ops, comm, &mut grads, tally)?;
    }
    Ok(grads.into_tensors())
}

/// The chunks and plans of sequences of `seq` tokens on `runtime`'s workers, under the model's
/// attention mask (Mistral's sliding window: the executor, or the GPU's whole-sequence kernels,
/// apply it to every block; under `--documents separate` each sequence's documents replace the
/// plans, `plan_documents`).
pub(super) fn model_partition(
    cfg: &Config,
    seq: usize,
    schedule: Schedule,
    runtime: &Runtime,
) -> Result<Partition> {
    let mask = cfg.mask(seq, &[])?;
    Partition::masked(seq, runtime.workers(), schedule, &mask)
}
