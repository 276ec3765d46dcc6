//! Moving buffers between workers. `exec` speaks only this trait, so the same plan runs over
//! in-process channels (CPU workers as threads) or NCCL (one process per GPU).

mod cuda;
mod endpoint;
mod local;
pub mod nccl;
pub mod rendezvous;
mod solo;
mod tcp;

pub use endpoint::{Body, Buf, Endpoint, Envelope, Transport};
pub use local::{LocalComm, local_group};
pub use solo::Solo;
pub use tcp::{TcpComm, connect_mesh};

use crate::shape::Part;
use anyhow::{Result, bail};
use std::fmt;

/// Identifies a message between one sender and one receiver; both sides compute it from the
/// plan, so a message can never be taken for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag(pub u64);

impl Tag {
    /// Tags at or above this value are reserved for collectives.
    const COLLECTIVE: u64 = 1 << 62;
}

/// Something that can travel: the communicator counts its bytes and checks its length.
pub trait Wire: Send {
    fn wire_bytes(&self) -> usize;
    fn elements(&self) -> usize;
}

impl Wire for Vec<f32> {
    fn wire_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }

    fn elements(&self) -> usize {
        self.len()
    }
}

/// A buffer the in-process communicator can carry: it copies what it sends (a host clone, or a
/// device-to-device copy for GPU workers sharing a device) and sums for all-reduce.
pub trait Buffer: Wire + Sized {
    fn duplicate(&self) -> Result<Self>;

    /// `self += other`, elementwise.
    fn sum_from(&mut self, other: &Self) -> Result<()>;
}

impl Buffer for Vec<f32> {
    fn duplicate(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn sum_from(&mut self, other: &Self) -> Result<()> {
        if self.len() != other.len() {
            bail!("sizes differ: {} and {} elements", self.len(), other.len());
        }
        self.iter_mut().zip(other).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

/// A message to post: its receiver, tag and tensors.
pub struct Outgoing<'a, T> {
    pub to: usize,
    pub tag: Tag,
    pub parts: Vec<&'a T>,
}

/// A message expected: its sender, tag and the tensors it must hold.
#[derive(Clone, Debug)]
pub struct Incoming {
    pub from: usize,
    pub tag: Tag,
    pub parts: Vec<Part>,
}

/// Receives posted together, to be collected with `Communicator::wait`.
pub struct Posted {
    pub recvs: Vec<Incoming>,
    /// Which of a device communicator's groups in flight this is (0 for host communicators).
    pub ticket: u64,
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

    /// Posts `sends` and `recvs` as one group. Every rank posts its groups in the same order
    /// (they come from the same plan), which is what NCCL needs to match sends with receives;
    /// receives complete at `wait`, so compute can run in between. Host communicators send at
    /// once and receive at `wait`.
    fn post(&mut self, sends: &[Outgoing<'_, T>], recvs: Vec<Incoming>) -> Result<Posted> {
        for s in sends {
            self.send(s.to, s.tag, &s.parts)?;
        }
        Ok(Posted { recvs, ticket: 0 })
    }

    /// The tensors of a posted group's receives, in posting order, each checked against its
    /// expected shape.
    fn wait(&mut self, posted: Posted) -> Result<Vec<Vec<T>>> {
        posted
            .recvs
            .iter()
            .map(|r| {
                let got = self.recv(r.from, r.tag)?;
                let lens: Vec<usize> = got.iter().map(Wire::elements).collect();
                let want: Vec<usize> = r.parts.iter().map(|p| p.len).collect();
                if lens != want {
                    bail!(
                        "worker {} expected tensors of {want:?} elements from worker {}, got {lens:?}",
                        self.rank(),
                        r.from
                    );
                }
                Ok(got)
            })
            .collect()
    }

    /// Elementwise sum of `buf` over all ranks, left in every rank's `buf`.
    fn all_reduce_sum(&mut self, buf: &mut T) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;

    /// Tells every other rank that this one failed, so none waits for it.
    fn abort(&mut self, reason: &str);

    /// Bytes this rank has sent point-to-point so far.
    fn bytes_sent(&self) -> u64;

    /// Seconds this rank's compute has waited for data from other ranks so far: transfers not
    /// hidden behind compute, plus waiting for peers still computing what it needs. Host
    /// communicators time their blocking receives; a GPU one times the compute stream's stalls.
    /// Call after the work being measured has finished (a GPU one reads its events then).
    fn waited_secs(&mut self) -> Result<f64> {
        Ok(0.0)
    }
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
