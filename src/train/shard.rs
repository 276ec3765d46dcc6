//! Sharded model state (ZeRO) across the same workers that hold the sequence's chunks, each
//! tensor cut by the one shard rule (`comm::shard_span`). Each worker keeps the AdamW moments
//! (`optimizer`, ZeRO-1) and also the reduced f32 gradients (`grads`, ZeRO-2) of its pieces only,
//! updates its pieces of the weights and all-gathers them, so every worker starts the next step
//! with the same whole weights. Under `full` (ZeRO-3) it keeps only its pieces of the weights too:
//! a layer's weights are all-gathered just before its forward and again before its backward,
//! freed after use, and its gradients reduce-scattered as the backward produces them
//! ([`Gathered`]); AdamW then updates the pieces in place.
//!
//! The arithmetic is the unsharded run's: the reduce-scatter sums in the all-reduce's order and
//! AdamW is elementwise, so under `optimizer` and `grads` only the global gradient norm (partial
//! sums of squares all-reduced as an f32 scalar) is rounded differently, and without clipping a
//! sharded run has the unsharded run's bits. Under `full` the gradients of a tied embedding and
//! of a batch's sequences are reduced one contribution at a time, so they round differently; a
//! step's first contribution to each piece is written over its zeros, not added to them (equal
//! values: the bits differ only where the sum is `-0`).

use super::model_attention::ModelAttention;
use super::moments::{Moments, needs_master};
use super::state::{Part, Saved};
use super::step_plan::{Shard, StepPlan};
use super::tally::{Tally, all_reduce, all_reduce_tally, collectives};
use crate::comm::{Buffer, Communicator, Shared, Solo, shard_span, shard_spans};
use crate::model::config::Config;
use crate::model::ops::{AdamState, AdamStep, AdamW, Ops};
use crate::model::weights::{LayerWeights, Weights, specs};
use crate::model::{Head, LayerGrads, Params};
use crate::runtime::ModelDevice;
use crate::shape::Span;
use anyhow::{Context, Result, bail};

/// A worker's weights as its sharding holds them: whole, or its pieces under `full` (gathered a
/// part at a time by [`Gathered`]).
pub(super) struct Held<T> {
    /// The sharding in effect (`none` for one worker).
    pub shard: Shard,
    pub w: Weights<T>,
    /// Elements of each whole tensor.
    pub lens: Weights<usize>,
    /// The part of each tensor `w` holds (`specs` order).
    spans: Vec<Span>,
}

impl<T: Buffer + Clone> Held<T> {
    /// Worker `rank`'s weights under `plan` from whole host ones (`specs` order).
    pub fn from_host<O: Ops<T = T>>(
        ops: &O,
        c: &Config,
        host: &[Vec<f32>],
        plan: &StepPlan,
        rank: usize,
    ) -> Result<Self> {
        let spans = own_spans(c, plan.weight_shards(), rank);
        let w = upload_spans(c, host, &spans, |t| ops.upload(t))?;
        Self::holding(c, plan.shard(), w, spans)
    }

    /// Worker `rank`'s weights under `plan` made on its device by `draw` from the pieces it
    /// keeps (one span per tensor, `specs` order: whole tensors unless `full`): a fresh run's
    /// start-up, which never holds the whole model on the host.
    pub fn drawn(
        c: &Config,
        plan: &StepPlan,
        rank: usize,
        draw: impl FnOnce(&[Span]) -> Result<Weights<T>>,
    ) -> Result<Self> {
        let spans = own_spans(c, plan.weight_shards(), rank);
        let w = draw(&spans)?;
        Self::holding(c, plan.shard(), w, spans)
    }

    /// Worker `rank`'s weights under `plan` from whole device ones (cut to its pieces under
    /// `full`, the whole freed).
    pub fn from_device<O: Ops<T = T>>(
        ops: &O,
        c: &Config,
        whole: Weights<T>,
        plan: &StepPlan,
        rank: usize,
    ) -> Result<Self> {
        let (shard, spans) = (plan.shard(), own_spans(c, plan.weight_shards(), rank));
        if !shard.gathers_weights() {
            return Self::holding(c, shard, whole, spans);
        }
        let mut it = whole.tensors().into_iter().zip(&spans);
        let w = Weights::build(c, |_| {
            let (t, s) = it.next().expect("a span per tensor");
            ops.rows(t, 1, s.start, s.len)
        })?;
        Self::holding(c, shard, w, spans)
    }

    fn holding(c: &Config, shard: Shard, w: Weights<T>, spans: Vec<Span>) -> Result<Self> {
        Ok(Held {
            shard,
            w,
            lens: Weights::build(c, |s| Ok(s.elements()))?,
            spans,
        })
    }

    /// The f32 gradients a step accumulates into, shaped as the weights are held: zeros, but
    /// for whole weights the layers' projections' are scratch ([`fresh_grad`]), which the
    /// step's first backward writes (`model::Whole::fresh`: its first sequence's pass must say
    /// so). Under `full` every piece is zeros: the backward's reduce-scatter writes them.
    pub fn step_grads<O: Ops<T = T>>(&self, ops: &O, c: &Config) -> Result<Weights<T>> {
        let mut spans = self.spans.iter();
        let pieces = self.shard.gathers_weights();
        Weights::build(c, |s| {
            let len = spans.next().expect("a span per tensor").len;
            fresh_grad(ops, s.is_projection() && !pieces, len)
        })
    }

    /// Whole host tensors (`specs` order) from tensors held as the weights are (the weights, or
    /// gradients from [`Held::step_grads`], or pieces of the reduce-scatter, which `full` holds
    /// alike): gathered when they are pieces (a collective every worker calls), downloaded
    /// otherwise; empty except on the reporter.
    pub fn host<O: Ops<T = T>>(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<T>,
        tensors: &[&T],
        pieces: bool,
        reporter: bool,
    ) -> Result<Vec<Vec<f32>>> {
        if pieces {
            let lens: Vec<usize> = self.lens.tensors().into_iter().copied().collect();
            let all = gather_host(ops, comm, tensors, &lens, reporter)?;
            return Ok(all.unwrap_or_default());
        }
        if !reporter {
            return Ok(Vec::new());
        }
        tensors.iter().map(|t| ops.download(t)).collect()
    }

    /// `f` of elements `span` of tensor `k` (whole-tensor positions, inside the part this
    /// worker holds): the tensor itself when this worker holds just that span, else a device
    /// copy of those elements (a sharded optimizer's piece of a whole weight).
    fn with_piece<O: Ops<T = T>, R>(
        &self,
        ops: &O,
        k: usize,
        span: Span,
        f: impl FnOnce(&T) -> Result<R>,
    ) -> Result<R> {
        let t = self.w.tensors()[k];
        let start = span.start.checked_sub(self.spans[k].start);
        let Some(start) = start.filter(|s| s + span.len <= self.spans[k].len) else {
            bail!(
                "elements {span:?} of tensor {k} lie outside this worker's {:?}",
                self.spans[k]
            );
        };
        if span == self.spans[k] {
            return f(t);
        }
        f(&ops.rows(t, 1, start, span.len)?)
    }
}

/// A step's f32 gradient of `len` elements: scratch for a projection's, which its first product
/// writes (`LinearBackward::dw_empty`), so no zeros are written and none read back (a memset and
/// a read of most of the gradients: 0.85% of a 16K step on an H100 with 16 layers,
/// `bench/results/offload-auto-2026-12-06`); zeros for the rest, which are summed into.
fn fresh_grad<O: Ops>(ops: &O, projection: bool, len: usize) -> Result<O::T> {
    match projection {
        true => ops.scratch(len),
        false => ops.zeros(len),
    }
}

/// This worker's span of each tensor (`specs` order) when a tensor is cut into `pieces`: the
/// whole tensor for one piece.
fn own_spans(c: &Config, pieces: usize, rank: usize) -> Vec<Span> {
    specs(c)
        .iter()
        .map(|s| shard_span(s.elements(), pieces, if pieces == 1 { 0 } else { rank }))
        .collect()
}

/// Host tensors (`specs` order) cut to `spans` and made device tensors by `upload`, shaped as
/// the model's weights.
fn upload_spans<T>(
    c: &Config,
    host: &[Vec<f32>],
    spans: &[Span],
    mut upload: impl FnMut(&[f32]) -> Result<T>,
) -> Result<Weights<T>> {
    Weights::build_pieces(c, spans, |k, s, span| {
        let t = host
            .get(k)
            .with_context(|| format!("no weights given for '{}'", s.name))?;
        if t.len() != s.elements() {
            bail!(
                "'{}' holds {} values, but its shape {:?} has {}",
                s.name,
                t.len(),
                s.shape,
                s.elements()
            );
        }
        upload(&t[span.start..span.end()])
    })
}

/// A tensor of `len` elements rebuilt whole from every worker's piece (`piece` this one's), each
/// piece landing in its span of the one tensor.
fn gather<T: Buffer>(comm: &mut dyn Communicator<T>, piece: &T, len: usize) -> Result<T> {
    let mut whole = piece.alloc_like(len)?;
    comm.all_gather_into(piece, &mut whole)?;
    Ok(whole)
}

/// Layer weights `w` (this worker's pieces, of `lens` elements whole) gathered whole for one use
/// that every worker makes of them: one copy for worker threads sharing memory
/// ([`Communicator::all_gather_shared`]). Give them back with [`release_layer`].
fn gather_layer<T: Buffer>(
    comm: &mut dyn Communicator<T>,
    w: &LayerWeights<T>,
    lens: &LayerWeights<usize>,
) -> Result<Shared<LayerWeights<T>, T>> {
    let whole: Vec<usize> = lens.tensors().into_iter().copied().collect();
    let shared = comm.all_gather_shared(&w.tensors(), &whole)?;
    Ok(shared.map(
        |tensors| LayerWeights::from_tensors(tensors, lens),
        LayerWeights::into_tensors,
    ))
}

/// Ends the use of [`gather_layer`]'s weights: a collective every worker calls once it has
/// queued its last use of them.
fn release_layer<T: Buffer>(
    comm: &mut dyn Communicator<T>,
    layer: Shared<LayerWeights<T>, T>,
) -> Result<()> {
    comm.release_shared(layer.map(LayerWeights::into_tensors, |v| v))
}

/// A worker's pieces of the weights and of their f32 gradients under `--shard full`, lent to the
/// model part by part ([`Params`]): each part's weights all-gathered for its use and freed when
/// it returns (a layer's into one copy that worker threads share, [`gather_layer`]), each part's gradients made whole for its backward and reduce-scattered into this
/// worker's pieces as soon as it returns. The all-gathers run over the attention's workers.
pub(super) struct Gathered<'a, O: Ops> {
    pub ops: &'a O,
    pub w: &'a Weights<O::T>,
    pub grads: &'a mut Weights<O::T>,
    /// Elements of each whole tensor.
    pub lens: &'a Weights<usize>,
    /// Whether `grads` hold [`Held::step_grads`]'s zeros (the first sequence of a step):
    /// then each part's first reduce-scatter writes its sum over them
    /// ([`Communicator::reduce_scatter_into`]) instead of summing into a temporary and adding
    /// that to zeros, which passes over the gradients twice more. The sums differ from `0 +
    /// sum` only in the sign of a zero.
    pub fresh: bool,
}

impl<O: Ops> Gathered<'_, O>
where
    O::T: Buffer,
{
    /// `acc +=` this worker's piece of every worker's `whole`, written over `acc` when it holds
    /// zeros (`first`: this pass is the step's first and nothing was reduced into `acc` yet).
    fn reduce(
        comm: &mut dyn Communicator<O::T>,
        whole: &O::T,
        acc: &mut O::T,
        first: bool,
    ) -> Result<()> {
        if first {
            comm.reduce_scatter_into(whole, acc)
        } else {
            comm.reduce_scatter_add(whole, acc)
        }
    }
}

impl<'m, D: ModelDevice, C: Communicator<D::Tensor>> Params<D::Tensor, ModelAttention<'m, D, C>>
    for Gathered<'_, D::Ops>
{
    fn with_embed<R>(
        &mut self,
        attn: &mut ModelAttention<'m, D, C>,
        f: impl FnOnce(&D::Tensor) -> Result<R>,
    ) -> Result<R> {
        let mut solo = Solo;
        let comm = collectives(attn, &mut solo);
        f(&gather(comm, &self.w.embed, self.lens.embed)?)
    }

    fn with_layer<R>(
        &mut self,
        attn: &mut ModelAttention<'m, D, C>,
        l: usize,
        f: impl FnOnce(&LayerWeights<D::Tensor>, &mut ModelAttention<'m, D, C>) -> Result<R>,
    ) -> Result<R> {
        let mut solo = Solo;
        let whole = gather_layer(
            collectives(attn, &mut solo),
            &self.w.layers[l],
            &self.lens.layers[l],
        )?;
        let out = f(whole.get(), attn)?;
        release_layer(collectives(attn, &mut solo), whole)?;
        Ok(out)
    }

    fn with_head<R>(
        &mut self,
        attn: &mut ModelAttention<'m, D, C>,
        f: impl FnOnce(Head<'_, D::Tensor>) -> Result<R>,
    ) -> Result<R> {
        let (ops, lens) = (self.ops, self.lens);
        let mut solo = Solo;
        let comm = collectives(attn, &mut solo);
        let norm = gather(comm, &self.w.norm, lens.norm)?;
        let output = gather(comm, self.w.output(), *lens.output())?;
        let mut dnorm = ops.zeros(lens.norm)?;
        let mut doutput = ops.zeros(*lens.output())?;
        let out = f(Head {
            norm: &norm,
            output: &output,
            dnorm: &mut dnorm,
            doutput: &mut doutput,
        })?;
        drop((norm, output));
        let g = &mut *self.grads;
        Self::reduce(comm, &dnorm, &mut g.norm, self.fresh)?;
        // The head comes before the embedding's backward, so a tied table's first sum is this.
        let out_grad = match &mut g.lm_head {
            Some(head) => head,
            None => &mut g.embed,
        };
        Self::reduce(comm, &doutput, out_grad, self.fresh)?;
        Ok(out)
    }

    fn with_layer_grads<R>(
        &mut self,
        attn: &mut ModelAttention<'m, D, C>,
        l: usize,
        f: impl FnOnce(
            &LayerWeights<D::Tensor>,
            LayerGrads<'_, D::Tensor>,
            &mut ModelAttention<'m, D, C>,
        ) -> Result<R>,
    ) -> Result<R> {
        let ops = self.ops;
        let lens = &self.lens.layers[l];
        let mut solo = Solo;
        let whole = gather_layer(collectives(attn, &mut solo), &self.w.layers[l], lens)?;
        let mut grads = lens.try_map(|t, &len| fresh_grad(ops, t.is_projection(), len))?;
        let lent = LayerGrads {
            grads: &mut grads,
            projections_empty: true,
        };
        let out = f(whole.get(), lent, attn)?;
        release_layer(collectives(attn, &mut solo), whole)?;
        let comm = collectives(attn, &mut solo);
        for (g, acc) in grads
            .tensors()
            .into_iter()
            .zip(self.grads.layers[l].tensors_mut())
        {
            Self::reduce(comm, g, acc, self.fresh)?;
        }
        Ok(out)
    }

    fn with_embed_grad<R>(
        &mut self,
        attn: &mut ModelAttention<'m, D, C>,
        f: impl FnOnce(&mut D::Tensor) -> Result<R>,
    ) -> Result<R> {
        let mut whole = self.ops.zeros(self.lens.embed)?;
        let out = f(&mut whole)?;
        let mut solo = Solo;
        let comm = collectives(attn, &mut solo);
        let tied = self.grads.lm_head.is_none();
        Self::reduce(comm, &whole, &mut self.grads.embed, self.fresh && !tied)?;
        Ok(out)
    }
}

/// Gradients summed over the workers: whole tensors (`none`, `optimizer`) or this worker's
/// pieces (`grads`; `full`, whose backward has summed them); the tally summed alike. Several
/// workers only (one has nothing to add).
pub(super) fn reduce_grads<O: Ops>(
    ops: &O,
    comm: &mut dyn Communicator<O::T>,
    shard: Shard,
    mut grads: Weights<O::T>,
    tally: &mut Tally,
) -> Result<Vec<O::T>>
where
    O::T: Buffer,
{
    match shard {
        Shard::None | Shard::Optimizer => {
            all_reduce(ops, comm, &mut grads, tally)?;
            Ok(grads.into_tensors())
        }
        Shard::Grads => {
            let (me, world) = (comm.rank(), comm.world());
            let pieces = grads
                .tensors()
                .into_iter()
                .map(|g| {
                    let mut piece = g.alloc_like(shard_span(ops.len(g), world, me).len)?;
                    comm.reduce_scatter_into(g, &mut piece)?;
                    Ok(piece)
                })
                .collect::<Result<Vec<_>>>()?;
            drop(grads);
            all_reduce_tally(ops, comm, tally)?;
            Ok(pieces)
        }
        // The backward has reduced each part already ([`Gathered`]).
        Shard::Full => {
            all_reduce_tally(ops, comm, tally)?;
            Ok(grads.into_tensors())
        }
    }
}

/// Host copies of whole tensors, each rebuilt from every worker's piece of it (`pieces` this
/// worker's, `lens` the whole tensors' elements): a collective every worker calls; `None` except
/// on the reporter, which alone needs them.
pub(super) fn gather_host<O: Ops>(
    ops: &O,
    comm: &mut dyn Communicator<O::T>,
    pieces: &[&O::T],
    lens: &[usize],
    reporter: bool,
) -> Result<Option<Vec<Vec<f32>>>>
where
    O::T: Buffer,
{
    let mut whole = Vec::with_capacity(pieces.len());
    for (&piece, &len) in pieces.iter().zip(lens) {
        whole.push(gather_one(ops, comm, piece, len, reporter)?);
    }
    Ok(reporter.then(|| whole.into_iter().flatten().collect()))
}

/// One tensor of `len` elements on the host, rebuilt from every worker's piece (`piece` this
/// worker's): a collective every worker calls; `None` except on the reporter.
fn gather_one<O: Ops>(
    ops: &O,
    comm: &mut dyn Communicator<O::T>,
    piece: &O::T,
    len: usize,
    reporter: bool,
) -> Result<Option<Vec<f32>>>
where
    O::T: Buffer,
{
    let all = comm.all_gather(piece.clone(), len)?;
    if !reporter {
        return Ok(None);
    }
    let mut host = Vec::with_capacity(len);
    for p in &all {
        host.extend(ops.download(p)?);
    }
    Ok(Some(host))
}

/// One step's update: AdamW's hyper-parameters at this step (its learning rate scheduled), the
/// step's number (AdamW's bias correction counts from 1), and the largest global gradient norm
/// (0: no clipping).
pub(super) struct Update {
    pub adamw: AdamW,
    pub step: u64,
    pub clip: f64,
}

/// This worker's AdamW: the moments of its pieces (whole tensors unsharded), on the device or
/// offloaded to host memory ([`Moments`]), and the update that leaves every worker with the
/// same whole weights.
pub(super) struct Optimizer<O: Ops> {
    shard: Shard,
    /// This worker's piece of each parameter tensor (`specs` order); the whole tensor under
    /// `none`.
    spans: Vec<Span>,
    /// Elements of each whole tensor.
    lens: Vec<usize>,
    decays: Vec<bool>,
    /// Whether each tensor's state holds a master (its weights are 16-bit).
    masters: Vec<bool>,
    moments: Moments<O>,
}

impl<O: Ops> Optimizer<O>
where
    O::T: Buffer,
{
    /// Worker `rank`'s AdamW state under `plan` for the weights `held`, each piece it keeps
    /// (tensor `k`'s span; whole tensors unless sharded) made on the device as `from` says,
    /// with a master for each 16-bit parameter; kept there, or in host memory when the plan
    /// offloads the optimizer.
    pub fn made(
        ops: &O,
        c: &Config,
        plan: &StepPlan,
        rank: usize,
        held: &Held<O::T>,
        from: StateFrom<'_>,
    ) -> Result<Self> {
        let shard = plan.shard();
        let spans = own_spans(c, plan.optimizer_shards(), rank);
        let params = held.w.tensors();
        let masters: Vec<bool> = params.iter().map(|p| needs_master(ops, p)).collect();
        let moments = Moments::made(ops, spans.len(), plan.offloads_optimizer(), |k| {
            let (span, rounded) = (spans[k], masters[k]);
            match from {
                StateFrom::Fresh => Ok(AdamState {
                    m: ops.zeros(span.len)?,
                    v: ops.zeros(span.len)?,
                    master: rounded
                        .then(|| held.with_piece(ops, k, span, |p| ops.master_of(p)))
                        .transpose()?,
                }),
                StateFrom::Saved(saved) => {
                    let load = |part| ops.upload_state(&saved.piece(part, k, span)?);
                    // The weights were uploaded from the same exact values by `upload_exact`.
                    let master = match rounded {
                        true => Some(ops.upload_master(&saved.piece(Part::Weights, k, span)?)?),
                        false => None,
                    };
                    Ok(AdamState {
                        m: load(Part::FirstMoment)?,
                        v: load(Part::SecondMoment)?,
                        master,
                    })
                }
            }
        })?;
        let specs = specs(c);
        Ok(Optimizer {
            shard,
            decays: specs.iter().map(|s| s.decays()).collect(),
            lens: specs.iter().map(|s| s.elements()).collect(),
            masters,
            moments,
            spans,
        })
    }

    /// The gradients this worker updates from (its pieces of the summed ones) and their global
    /// norm: the first half of a step's update, before the caller looks at the norm.
    pub fn gradients(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<O::T>,
        reduced: Vec<O::T>,
    ) -> Result<(Vec<O::T>, f64)> {
        let grads = self.own_grads(ops, reduced)?;
        let norm = self.norm(ops, comm, &grads)?;
        Ok((grads, norm))
    }

    /// The second half: AdamW on the weights `w` ([`Optimizer::update`]) from `grads` (of
    /// global norm `norm`) scaled down to `update.clip` when larger.
    pub fn apply(
        &mut self,
        ops: &O,
        comm: &mut dyn Communicator<O::T>,
        w: &mut Weights<O::T>,
        (grads, norm): (Vec<O::T>, f64),
        update: &Update,
    ) -> Result<()> {
        let at = AdamStep::clipped(update.step, update.clip, norm);
        self.update(ops, comm, w, &grads, &update.adamw, at)
    }

    /// The gradients this worker updates from: `reduce_grads`'s whole tensors cut to its pieces.
    fn own_grads(&self, ops: &O, reduced: Vec<O::T>) -> Result<Vec<O::T>> {
        // Only the moments sharded: the gradients were all-reduced whole.
        if !self.shard.shards_optimizer() || self.shard.reduce_scatters_grads() {
            return Ok(reduced);
        }
        // Each whole gradient is dropped once its piece is cut, so the update's start holds one
        // piece more than the gradients, not a second copy of half of them.
        reduced
            .into_iter()
            .zip(&self.spans)
            .map(|(g, s)| ops.rows(&g, 1, s.start, s.len))
            .collect()
    }

    /// The global gradient norm of `grads` (this worker's pieces, or whole tensors unsharded):
    /// sharded, each worker's sum of squares all-reduced as an f32 scalar.
    fn norm(&self, ops: &O, comm: &mut dyn Communicator<O::T>, grads: &[O::T]) -> Result<f64> {
        let squares = ops.sum_squares(&grads.iter().collect::<Vec<_>>())?;
        if !self.shard.shards_optimizer() {
            return Ok(squares.sqrt());
        }
        let mut t = ops.upload_state(&[squares as f32])?;
        comm.all_reduce_sum(&mut t)?;
        Ok(f64::from(ops.download(&t)?[0]).sqrt())
    }

    /// AdamW on this worker's pieces of `w` from `grads` (its pieces), then every piece
    /// all-gathered into every worker's whole `w` (under `full`, `w` holds the pieces and is
    /// updated in place).
    fn update(
        &mut self,
        ops: &O,
        comm: &mut dyn Communicator<O::T>,
        w: &mut Weights<O::T>,
        grads: &[O::T],
        hp: &AdamW,
        at: AdamStep,
    ) -> Result<()> {
        let mut tensors = w.tensors_mut();
        let (shard, spans, decays, lens) = (self.shard, &self.spans, &self.decays, &self.lens);
        self.moments.update_each(ops, |i, state| {
            let (p, span, decay, g) = (&mut *tensors[i], spans[i], decays[i], &grads[i]);
            if shard.updates_in_place() {
                return ops.adamw(p, g, state, hp, at, decay);
            }
            let mut piece = ops.rows(p, 1, span.start, span.len)?;
            ops.adamw(&mut piece, g, state, hp, at, decay)?;
            let world = comm.world();
            let all = comm.all_gather(piece, lens[i])?;
            for (s, part) in shard_spans(lens[i], world).iter().zip(&all) {
                ops.set_rows(p, 1, s.start, part)?;
            }
            Ok(())
        })
    }

    /// The whole state on the host (the weights exact, and the moments when `moments`): each
    /// 16-bit weight's master in its place, the weights without one as `held` has them (so
    /// the host holds one copy of each). A collective every worker calls when sharded; `None`
    /// except on the reporter.
    fn host_state(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<O::T>,
        held: &Held<O::T>,
        reporter: bool,
        moments: bool,
    ) -> Result<Option<GatheredState>> {
        let sharded = self.shard.shards_optimizer();
        let mut host = GatheredState::default();
        let mut masters = Vec::new();
        if sharded || reporter {
            self.moments.read_each(ops, |k, state| {
                let mut whole = |t: &O::T| match sharded {
                    true => gather_one(ops, comm, t, self.lens[k], reporter),
                    false => Ok(Some(ops.download(t)?)),
                };
                if moments {
                    host.m.extend(whole(state.m)?);
                    host.v.extend(whole(state.v)?);
                }
                // The master's exact values (where it holds only a part of them, joined with
                // this worker's piece of the weight).
                let exact = match state.master {
                    Some(master) => {
                        held.with_piece(ops, k, self.spans[k], |p| ops.exact_of(p, master))?
                    }
                    None => None,
                };
                let master = exact.as_ref().or(state.master);
                masters.push(master.map(&mut whole).transpose()?.flatten());
                Ok(())
            })?;
        }
        let params = held.w.tensors();
        let plain: Vec<&O::T> = (0..params.len())
            .filter(|&k| !self.masters[k])
            .map(|k| params[k])
            .collect();
        let pieces = held.shard.gathers_weights();
        let mut plain = held.host(ops, comm, &plain, pieces, reporter)?.into_iter();
        if !reporter {
            return Ok(None);
        }
        host.weights = (masters.into_iter())
            .map(|master| master.or_else(|| plain.next()))
            .collect::<Option<_>>()
            .context("a weight neither the optimizer nor the worker holds")?;
        Ok(Some(host))
    }

    /// The whole state on the host for a checkpoint: the exact weights and the moments
    /// ([`Optimizer::host_state`]).
    pub fn checkpoint(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<O::T>,
        held: &Held<O::T>,
        reporter: bool,
    ) -> Result<Option<GatheredState>> {
        self.host_state(ops, comm, held, reporter, true)
    }

    /// The exact whole weights on the reporter, the masters where the weights are 16-bit: what
    /// a run ends with. A collective every worker calls when sharded.
    pub fn exact_weights(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<O::T>,
        held: &Held<O::T>,
        reporter: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let host = self.host_state(ops, comm, held, reporter, false)?;
        Ok(host.map(|h| h.weights).unwrap_or_default())
    }
}

/// What an optimizer's state starts from: zero moments and masters copied from the weights
/// (a fresh run), or a checkpoint's moments and exact weights (a resumed one).
#[derive(Clone, Copy)]
pub(super) enum StateFrom<'a> {
    Fresh,
    Saved(&'a Saved),
}

/// A run's whole state on the host (`specs` order): the exact weights (masters where the
/// device's are 16-bit) and AdamW's moments.
#[derive(Default)]
pub(super) struct GatheredState {
    pub weights: Vec<Vec<f32>>,
    pub m: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}
