//! Sharded model state (ZeRO) across the same workers that hold the sequence's chunks: each
//! worker keeps the AdamW moments (`optimizer`, ZeRO-1) and also the reduced f32 gradients
//! (`grads`, ZeRO-2) of its pieces only, cut by the one shard rule (`comm::shard_span`), updates
//! its pieces of the weights and all-gathers them, so every worker starts the next step with the
//! same whole weights. The moments are the largest part of the state (two f32 copies of every
//! parameter), and they shrink by the number of workers.
//!
//! The arithmetic is the unsharded run's: the reduce-scatter sums in the all-reduce's order and
//! AdamW is elementwise, so only the global gradient norm (partial sums of squares all-reduced
//! as an f32 scalar) is rounded differently; without clipping a sharded run has the unsharded
//! run's bits.

use super::{Tally, all_reduce, all_reduce_tally};
use crate::comm::{Buffer, Communicator, shard_span, shard_spans};
use crate::model::config::Config;
use crate::model::ops::{AdamW, Ops};
use crate::model::weights::{Weights, specs};
use crate::shape::Span;
use anyhow::{Result, bail};
use serde::Serialize;

/// Which model state each worker keeps only its pieces of (`--shard`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shard {
    /// Every worker holds all of it (gradients all-reduced).
    #[default]
    None,
    /// ZeRO-1: the AdamW moments; gradients all-reduced, the updated pieces of the weights
    /// all-gathered.
    Optimizer,
    /// ZeRO-2: the moments and the f32 gradients after the backward (reduce-scattered instead of
    /// all-reduced); the updated pieces of the weights all-gathered.
    Grads,
}

impl Shard {
    pub fn name(self) -> &'static str {
        match self {
            Shard::None => "none",
            Shard::Optimizer => "optimizer",
            Shard::Grads => "grads",
        }
    }

    /// Into how many pieces the AdamW moments are cut over `workers`.
    pub fn optimizer_shards(self, workers: usize) -> usize {
        match self {
            Shard::None => 1,
            Shard::Optimizer | Shard::Grads => workers,
        }
    }
}

/// Gradients summed over the workers: whole tensors (`none`, `optimizer`) or this worker's
/// pieces (`grads`); the tally summed alike. Several workers only (one has nothing to add).
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
            let world = comm.world();
            let pieces = grads
                .tensors()
                .into_iter()
                .map(|g| {
                    let cut = shard_spans(ops.len(g), world)
                        .iter()
                        .map(|s| ops.rows(g, 1, s.start, s.len))
                        .collect::<Result<Vec<_>>>()?;
                    comm.reduce_scatter_sum(cut)
                })
                .collect::<Result<Vec<_>>>()?;
            drop(grads);
            all_reduce_tally(ops, comm, tally)?;
            Ok(pieces)
        }
    }
}

/// Host copies of whole tensors, each rebuilt from every worker's piece of it (`pieces` this
/// worker's, `lens` the whole tensors' elements): a collective every worker calls; `None` except
/// on the reporter, which alone needs them.
pub(super) fn gather_host<O: Ops>(
    ops: &O,
    comm: &mut dyn Communicator<O::T>,
    pieces: &[O::T],
    lens: &[usize],
    reporter: bool,
) -> Result<Option<Vec<Vec<f32>>>>
where
    O::T: Buffer,
{
    let mut whole = Vec::with_capacity(pieces.len());
    for (piece, &len) in pieces.iter().zip(lens) {
        let all = comm.all_gather(piece.clone(), len)?;
        if reporter {
            let mut host = Vec::with_capacity(len);
            for p in &all {
                host.extend(ops.download(p)?);
            }
            whole.push(host);
        }
    }
    Ok(reporter.then_some(whole))
}

/// AdamW's whole moments `(m, v)` on the host, `specs` order.
type HostMoments = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// This worker's AdamW: the moments of its pieces (whole tensors unsharded) and the update that
/// leaves every worker with the same whole weights.
pub(super) struct Optimizer<T> {
    shard: Shard,
    /// This worker's piece of each parameter tensor (`specs` order); the whole tensor under
    /// `none`.
    spans: Vec<Span>,
    /// Elements of each whole tensor.
    lens: Vec<usize>,
    decays: Vec<bool>,
    m: Vec<T>,
    v: Vec<T>,
}

impl<T: Buffer + Clone> Optimizer<T> {
    /// Worker `rank` of `world`'s pieces of the whole host moments `m` and `v` (`specs` order) on
    /// the device: a run resumed with another worker count re-shards them here. One worker
    /// holds everything whatever `shard` says.
    pub fn new<O: Ops<T = T>>(
        ops: &O,
        c: &Config,
        shard: Shard,
        (rank, world): (usize, usize),
        m: &[Vec<f32>],
        v: &[Vec<f32>],
    ) -> Result<Self> {
        let shard = if world == 1 { Shard::None } else { shard };
        let specs = specs(c);
        if m.len() != specs.len() || v.len() != specs.len() {
            bail!(
                "the optimizer state holds {} and {} moments for a model of {} tensors",
                m.len(),
                v.len(),
                specs.len()
            );
        }
        let lens: Vec<usize> = specs.iter().map(|s| s.elements()).collect();
        let spans: Vec<Span> = lens
            .iter()
            .map(|&len| match shard {
                Shard::None => Span { start: 0, len },
                Shard::Optimizer | Shard::Grads => shard_span(len, world, rank),
            })
            .collect();
        let upload = |host: &[Vec<f32>]| {
            host.iter()
                .zip(&spans)
                .map(|(t, s)| ops.upload_state(&t[s.start..s.end()]))
                .collect::<Result<Vec<_>>>()
        };
        Ok(Optimizer {
            shard,
            decays: specs.iter().map(|s| s.decays()).collect(),
            m: upload(m)?,
            v: upload(v)?,
            spans,
            lens,
        })
    }

    /// The sharding in effect (`none` for one worker).
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The gradients this worker updates from: `reduce_grads`'s whole tensors cut to its pieces.
    pub fn own_grads<O: Ops<T = T>>(&self, ops: &O, reduced: Vec<T>) -> Result<Vec<T>> {
        match self.shard {
            Shard::None | Shard::Grads => Ok(reduced),
            Shard::Optimizer => reduced
                .iter()
                .zip(&self.spans)
                .map(|(g, s)| ops.rows(g, 1, s.start, s.len))
                .collect(),
        }
    }

    /// The global gradient norm of `grads` (this worker's pieces, or whole tensors unsharded):
    /// sharded, each worker's sum of squares all-reduced as an f32 scalar.
    pub fn norm<O: Ops<T = T>>(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<T>,
        grads: &[T],
    ) -> Result<f64> {
        let squares = grads
            .iter()
            .map(|g| ops.sum_squares(g))
            .sum::<Result<f64>>()?;
        if self.shard == Shard::None {
            return Ok(squares.sqrt());
        }
        let mut t = ops.upload_state(&[squares as f32])?;
        comm.all_reduce_sum(&mut t)?;
        Ok(f64::from(ops.download(&t)?[0]).sqrt())
    }

    /// AdamW on this worker's pieces of `w` from `grads` (its pieces), then every piece
    /// all-gathered into every worker's whole `w`.
    pub fn update<O: Ops<T = T>>(
        &mut self,
        ops: &O,
        comm: &mut dyn Communicator<T>,
        w: &mut Weights<T>,
        grads: &[T],
        hp: &AdamW,
        step: u64,
    ) -> Result<()> {
        let tensors = w.tensors_mut();
        let state = self.m.iter_mut().zip(self.v.iter_mut());
        for (i, (p, (m, v))) in tensors.into_iter().zip(state).enumerate() {
            let (span, decay, g) = (self.spans[i], self.decays[i], &grads[i]);
            if self.shard == Shard::None {
                ops.adamw(p, g, m, v, hp, step, decay)?;
                continue;
            }
            let mut piece = ops.rows(p, 1, span.start, span.len)?;
            ops.adamw(&mut piece, g, m, v, hp, step, decay)?;
            let world = comm.world();
            let all = comm.all_gather(piece, self.lens[i])?;
            for (s, part) in shard_spans(self.lens[i], world).iter().zip(&all) {
                ops.set_rows(p, 1, s.start, part)?;
            }
        }
        Ok(())
    }

    /// The whole moments `(m, v)` on the host for a checkpoint: a collective every worker calls
    /// when sharded; `None` except on the reporter.
    pub fn moments<O: Ops<T = T>>(
        &self,
        ops: &O,
        comm: &mut dyn Communicator<T>,
        reporter: bool,
    ) -> Result<Option<HostMoments>> {
        if self.shard == Shard::None {
            if !reporter {
                return Ok(None);
            }
            let host = |ts: &[T]| ts.iter().map(|t| ops.download(t)).collect::<Result<_>>();
            return Ok(Some((host(&self.m)?, host(&self.v)?)));
        }
        let m = gather_host(ops, comm, &self.m, &self.lens, reporter)?;
        let v = gather_host(ops, comm, &self.v, &self.lens, reporter)?;
        Ok(m.zip(v))
    }
}
