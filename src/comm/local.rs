//! The in-process communicator: each worker thread owns an endpoint with an inbox channel and
//! senders to every other inbox. Messages that arrive before they are asked for wait in a stash,
//! so a worker may receive in any order.

use super::{Communicator, PeerFailed, Tag, Wire};
use anyhow::{Result, anyhow, bail};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

type Buf = Vec<f32>;

enum Body {
    Data(Vec<Buf>),
    Abort(String),
}

struct Envelope {
    from: usize,
    tag: Tag,
    body: Body,
}

/// One worker's endpoint of an in-process group, carrying host f32 buffers.
pub struct LocalComm {
    rank: usize,
    peers: Vec<Sender<Envelope>>,
    inbox: Receiver<Envelope>,
    stash: Vec<Envelope>,
    timeout: Duration,
    bytes_sent: u64,
    collective_round: u64,
}

/// Endpoints for `world` workers; a receive waits at most `timeout` for its message.
pub fn local_group(world: usize, timeout: Duration) -> Vec<LocalComm> {
    let (senders, inboxes): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
    inboxes
        .into_iter()
        .enumerate()
        .map(|(rank, inbox)| LocalComm {
            rank,
            peers: senders.clone(),
            inbox,
            stash: Vec::new(),
            timeout,
            bytes_sent: 0,
            collective_round: 0,
        })
        .collect()
}

impl LocalComm {
    fn post(&self, to: usize, tag: Tag, body: Body) -> Result<()> {
        let envelope = Envelope {
            from: self.rank,
            tag,
            body,
        };
        self.peers
            .get(to)
            .ok_or_else(|| {
                anyhow!(
                    "worker {} sent to worker {to}, which does not exist",
                    self.rank
                )
            })?
            .send(envelope)
            .map_err(|_| self.departed(to))
    }

    /// The error for a send to a peer whose inbox is gone: its own abort reason if it left one.
    fn departed(&self, to: usize) -> anyhow::Error {
        while let Ok(e) = self.inbox.try_recv() {
            if let Body::Abort(reason) = e.body {
                return PeerFailed {
                    rank: e.from,
                    reason,
                }
                .into();
            }
        }
        PeerFailed {
            rank: to,
            reason: format!("it exited before worker {} could send to it", self.rank),
        }
        .into()
    }

    fn take(&mut self, from: usize, tag: Tag) -> Option<Vec<Buf>> {
        let i = self
            .stash
            .iter()
            .position(|e| e.from == from && e.tag == tag)?;
        match self.stash.remove(i).body {
            Body::Data(parts) => Some(parts),
            Body::Abort(_) => None,
        }
    }

    fn next_collective_tag(&mut self) -> Tag {
        self.collective_round += 1;
        Tag(Tag::COLLECTIVE + self.collective_round)
    }
}

impl Communicator<Buf> for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.peers.len()
    }

    fn send(&mut self, to: usize, tag: Tag, parts: &[&Buf]) -> Result<()> {
        let owned: Vec<Buf> = parts.iter().map(|&p| p.clone()).collect();
        let bytes: usize = owned.iter().map(Wire::wire_bytes).sum();
        self.post(to, tag, Body::Data(owned))?;
        self.bytes_sent += bytes as u64;
        Ok(())
    }

    fn recv(&mut self, from: usize, tag: Tag) -> Result<Vec<Buf>> {
        if let Some(parts) = self.take(from, tag) {
            return Ok(parts);
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.inbox.recv_timeout(left) {
                Ok(Envelope {
                    from: culprit,
                    body: Body::Abort(reason),
                    ..
                }) => {
                    return Err(PeerFailed {
                        rank: culprit,
                        reason,
                    }
                    .into());
                }
                Ok(e) if e.from == from && e.tag == tag => {
                    if let Body::Data(parts) = e.body {
                        return Ok(parts);
                    }
                }
                Ok(e) => self.stash.push(e),
                Err(RecvTimeoutError::Timeout) => bail!(
                    "worker {} waited {:.0} s for a message from worker {from} that never arrived (is worker {from} stuck? raise --timeout if its step is that slow)",
                    self.rank,
                    self.timeout.as_secs_f64()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("worker {}: every other worker has exited", self.rank)
                }
            }
        }
    }

    /// Rank 0 sums the buffers in rank order (so every run gives the same bits) and sends the
    /// sum back to all.
    fn all_reduce_sum(&mut self, buf: &mut Buf) -> Result<()> {
        let tag = self.next_collective_tag();
        let world = self.peers.len();
        if self.rank == 0 {
            for from in 1..world {
                let part = self.recv(from, tag)?.pop().unwrap_or_default();
                if part.len() != buf.len() {
                    bail!(
                        "all-reduce size mismatch: worker 0 has {} elements, worker {from} {}",
                        buf.len(),
                        part.len()
                    );
                }
                buf.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
            }
            for to in 1..world {
                self.post(to, tag, Body::Data(vec![buf.clone()]))?;
            }
        } else {
            self.post(0, tag, Body::Data(vec![buf.clone()]))?;
            *buf = self.recv(0, tag)?.pop().unwrap_or_default();
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.all_reduce_sum(&mut Vec::new())
    }

    fn abort(&mut self, reason: &str) {
        for to in (0..self.peers.len()).filter(|&r| r != self.rank) {
            // A peer that has already exited needs no warning.
            let _ = self.post(to, Tag(u64::MAX), Body::Abort(reason.to_string()));
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }
}
