//! What a job is to the runtime: its per-worker function, how its outputs come back to the
//! reporter, how long its workers wait for each other, and a peer's failure told apart from
//! one's own (a leaf: the topologies' runners build on it).

use super::device::ModelDevice;
use crate::comm::{Communicator, PeerFailed};
use anyhow::Result;
use std::time::Duration;

/// How long workers wait: for each other at a multi-process job's rendezvous, and for a message
/// once running (never forever: a stuck peer becomes an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waits {
    pub rendezvous: Duration,
    pub message: Duration,
}

/// What the reporter gets back from the workers.
pub(super) enum Collect<R> {
    /// Every worker's output; a rank's travels to rank 0 as f32 parts ([`Gather`]).
    All {
        to_parts: fn(&R) -> Vec<Vec<f32>>,
        from_parts: fn(Vec<Vec<f32>>) -> Result<R>,
    },
    /// Worker 0's own; the other ranks only meet it at a closing barrier.
    Reporter,
}

/// An output that can travel from a rank to rank 0 over the host mesh, as f32 tensors.
pub trait Gather: Sized {
    fn to_parts(&self) -> Vec<Vec<f32>>;
    fn from_parts(parts: Vec<Vec<f32>>) -> Result<Self>;
}

/// A job's per-worker function, generic over the device it runs on and the communicator that
/// joins its workers, so that one function serves every topology.
pub trait Job: Sync {
    type Output: Send;

    /// One worker's part: `comm.rank()` of `comm.world()`.
    fn run<D: ModelDevice, C: Communicator<D::Tensor>>(
        &self,
        device: &D,
        comm: &mut C,
    ) -> Result<Self::Output>;
}

/// Whether an error is only another worker's failure reported here (its root cause is
/// elsewhere, and announcing it again would hide that).
pub(super) fn is_peer_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<PeerFailed>())
}
