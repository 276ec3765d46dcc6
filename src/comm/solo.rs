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

    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }

    fn abort(&mut self, _reason: &str) {}

    fn bytes_sent(&self) -> u64 {
        0
    }
}
