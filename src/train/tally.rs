//! What the workers add up each step: the tally (loss, probes) and the gradients, summed over
//! the communicator of the model's attention.

use super::model_attention::ModelAttention;
use crate::comm::{Communicator, Solo, Wire};
use crate::model::ops::Ops;
use crate::model::weights::Weights;
use crate::runtime::ModelDevice;
use anyhow::Result;

/// Per-step sums all workers add up: loss, probes right, probes asked.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) loss_sum: f64,
    pub(super) correct: u64,
    pub(super) probes: u64,
}

/// The communicator of `attn` as the sharded optimizer takes it (a lone worker's: `solo`).
pub(super) fn collectives<'x, D: ModelDevice, C: Communicator<D::Tensor>>(
    attn: &'x mut ModelAttention<'_, D, C>,
    solo: &'x mut Solo,
) -> &'x mut dyn Communicator<D::Tensor> {
    match attn.comm() {
        Some(comm) => comm,
        None => solo,
    }
}

/// Sums gradients and the tally over all workers, on the device the gradients live on (the tally
/// travels as a three-element f32 tensor of that device).
pub(super) fn all_reduce<O, C>(
    ops: &O,
    comm: &mut C,
    grads: &mut Weights<O::T>,
    tally: &mut Tally,
) -> Result<()>
where
    O: Ops,
    O::T: Wire,
    C: Communicator<O::T> + ?Sized,
{
    for g in grads.tensors_mut() {
        comm.all_reduce_sum(g)?;
    }
    all_reduce_tally(ops, comm, tally)
}

/// Sums the tally over all workers.
pub(super) fn all_reduce_tally<O, C>(ops: &O, comm: &mut C, tally: &mut Tally) -> Result<()>
where
    O: Ops,
    O::T: Wire,
    C: Communicator<O::T> + ?Sized,
{
    let mut t = ops.upload_state(&[
        tally.loss_sum as f32,
        tally.correct as f32,
        tally.probes as f32,
    ])?;
    comm.all_reduce_sum(&mut t)?;
    let t = ops.download(&t)?;
    *tally = Tally {
        loss_sum: t[0] as f64,
        correct: t[1] as u64,
        probes: t[2] as u64,
    };
    Ok(())
}
