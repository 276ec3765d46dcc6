//! Moving buffers between workers. `exec` speaks only this trait, so the same plan runs over
//! in-process channels (CPU workers as threads) or NCCL (one process per GPU).

mod endpoint;
mod local;
pub mod rendezvous;
mod solo;
mod tcp;

pub use endpoint::{Body, Buf, Endpoint, Envelope, Transport};
pub use local::{LocalComm, local_group};
pub use solo::Solo;
pub use tcp::{TcpComm, connect_mesh};

use anyhow::Result;
use std::fmt;

/// Identifies a message between one sender and one receiver; both sides compute it from the
/// plan, so a message can never be taken for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag(pub u64);

impl Tag {
    /// Tags at or above this value are reserved for collectives.
    const COLLECTIVE: u64 = 1 << 62;
}

/// Something that can travel: the communicator counts its bytes.
pub trait Wire: Send {
    fn wire_bytes(&self) -> usize;
}

impl Wire for Vec<f32> {
    fn wire_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }
}

/// Point-to-point messages, collectives and failure propagation among `world` ranks.
pub trait Communicator<T: Wire> {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;

    /// Sends `parts` to rank `to`; does not wait for the receiver.
    fn send(&mut self, to: usize, tag: Tag, parts: &[&T]) -> Result<()>;

    /// Waits for the message `tag` from rank `from`. Messages with the same sender and tag are
    /// received in the order they were sent. Fails with `PeerFailed` if any rank aborts
    /// meanwhile, and with a timeout error instead of waiting forever.
    fn recv(&mut self, from: usize, tag: Tag) -> Result<Vec<T>>;

    /// Elementwise sum of `buf` over all ranks, left in every rank's `buf`.
    fn all_reduce_sum(&mut self, buf: &mut T) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;

    /// Tells every other rank that this one failed, so none waits for it.
    fn abort(&mut self, reason: &str);

    /// Bytes this rank has sent point-to-point so far.
    fn bytes_sent(&self) -> u64;
}

/// The error a rank gets when another rank failed: it names the culprit.
#[derive(Debug, Clone)]
pub struct PeerFailed {
    pub rank: usize,
    pub reason: String,
}

impl fmt::Display for PeerFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {} failed: {}", self.rank, self.reason)
    }
}

impl std::error::Error for PeerFailed {}
