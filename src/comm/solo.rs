//! The communicator of a job with one worker: nothing to send, collectives are identities.

use super::{Communicator, Tag, Wire};
use anyhow::{Result, bail};

/// World of one.
pub struct Solo;

impl<T: Wire> Communicator<T> for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn send(&mut self, to: usize, _tag: Tag, _parts: &[&T]) -> Result<()> {
        bail!("a single worker has no worker {to} to send to")
    }

    fn recv(&mut self, from: usize, _tag: Tag) -> Result<Vec<T>> {
        bail!("a single worker has no worker {from} to receive from")
    }

    fn all_reduce_sum(&mut self, _buf: &mut T) -> Result<()> {
        Ok(())
    }

    /// The whole tensor is the one piece.
    fn all_gather(&mut self, piece: T, len: usize) -> Result<Vec<T>> {
        if piece.elements() != len {
            bail!(
                "all-gather: a single worker's piece of {len} elements holds {}",
                piece.elements()
            );
        }
        Ok(vec![piece])
    }

    /// The one piece is the sum.
    fn reduce_scatter_sum(&mut self, mut pieces: Vec<T>) -> Result<T> {
        match (pieces.pop(), pieces.is_empty()) {
            (Some(piece), true) => Ok(piece),
            _ => bail!(
                "reduce-scatter: a single worker cuts a tensor into 1 piece, not {}",
                pieces.len() + 1
            ),
        }
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }

    fn abort(&mut self, _reason: &str) {}

    fn bytes_sent(&self) -> u64 {
        0
    }
}
