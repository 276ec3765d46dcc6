//! The receiving half every host communicator shares: an inbox that transports fill, a stash for
//! messages that arrive before they are asked for (so a worker may receive in any order), abort
//! messages that turn into `PeerFailed`, timeouts, and collectives built on point-to-point.

use super::{Buffer, Communicator, PeerFailed, Tag, Wire};
use anyhow::{Result, bail};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Host buffers: what CPU workers exchange.
pub type Buf = Vec<f32>;

/// What a message holds: tensors, a rank's last word before it gives up, or the transport's
/// note that the connection to a rank ended.
pub enum Body<B> {
    Data(Vec<B>),
    Abort(String),
    Closed(String),
}

/// A message with its sender and tag.
pub struct Envelope<B> {
    pub from: usize,
    pub tag: Tag,
    pub body: Body<B>,
}

/// How envelopes of buffers `B` reach other ranks (channels within a process, sockets between
/// processes).
pub trait Transport<B> {
    fn world(&self) -> usize;

    /// Delivers `envelope` to rank `to`. Fails when that rank is gone.
    fn post(&mut self, to: usize, envelope: Envelope<B>) -> Result<()>;
}

/// A communicator endpoint carrying buffers `B` over transport `X`.
pub struct Endpoint<B, X> {
    rank: usize,
    transport: X,
    inbox: Receiver<Envelope<B>>,
    stash: Vec<Envelope<B>>,
    /// Why the connection to each rank ended, for ranks whose connection has ended.
    closed: Vec<Option<String>>,
    timeout: Duration,
    bytes_sent: u64,
    waited: Duration,
    collective_round: u64,
}

impl<B: Buffer, X: Transport<B>> Endpoint<B, X> {
    /// An endpoint for `rank` that sends through `transport` and reads `inbox`, which the
    /// transport (or its peers) fill; a receive waits at most `timeout`.
    pub fn new(rank: usize, transport: X, inbox: Receiver<Envelope<B>>, timeout: Duration) -> Self {
        Endpoint {
            rank,
            closed: vec![None; transport.world()],
            transport,
            inbox,
            stash: Vec::new(),
            timeout,
            bytes_sent: 0,
            waited: Duration::ZERO,
            collective_round: 0,
        }
    }

    fn post(&mut self, to: usize, tag: Tag, body: Body<B>) -> Result<()> {
        let envelope = Envelope {
            from: self.rank,
            tag,
            body,
        };
        if to >= self.transport.world() {
            bail!(
                "worker {} sent to worker {to}, which does not exist",
                self.rank
            );
        }
        self.transport
            .post(to, envelope)
            .map_err(|_| self.departed(to))
    }

    /// The error for a send to a peer that is gone: its own abort reason if it left one.
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

    fn take(&mut self, from: usize, tag: Tag) -> Option<Vec<B>> {
        let i = self
            .stash
            .iter()
            .position(|e| e.from == from && e.tag == tag)?;
        match self.stash.remove(i).body {
            Body::Data(parts) => Some(parts),
            Body::Abort(_) | Body::Closed(_) => None,
        }
    }

    /// Receives `tag` from `from`, stashing other messages, until `deadline`.
    fn wait_for(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<B>> {
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
                Ok(Envelope {
                    from: f,
                    tag: t,
                    body: Body::Data(parts),
                }) if f == from && t == tag => return Ok(parts),
                Ok(Envelope {
                    from: gone,
                    body: Body::Closed(reason),
                    ..
                }) => {
                    // A closed connection matters only to whoever still waits on that peer.
                    if gone == from {
                        return Err(PeerFailed { rank: gone, reason }.into());
                    }
                    self.closed[gone] = Some(reason);
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

    fn next_collective_tag(&mut self) -> Tag {
        self.collective_round += 1;
        Tag(Tag::COLLECTIVE + self.collective_round)
    }
}

impl<B: Buffer, X: Transport<B>> Communicator<B> for Endpoint<B, X> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.transport.world()
    }

    fn send(&mut self, to: usize, tag: Tag, parts: &[&B]) -> Result<()> {
        let owned = parts
            .iter()
            .map(|p| p.duplicate())
            .collect::<Result<Vec<B>>>()?;
        let bytes: usize = owned.iter().map(Wire::wire_bytes).sum();
        self.post(to, tag, Body::Data(owned))?;
        self.bytes_sent += bytes as u64;
        Ok(())
    }

    fn recv(&mut self, from: usize, tag: Tag) -> Result<Vec<B>> {
        if let Some(parts) = self.take(from, tag) {
            return Ok(parts);
        }
        if let Some(reason) = &self.closed[from] {
            return Err(PeerFailed {
                rank: from,
                reason: reason.clone(),
            }
            .into());
        }
        let began = Instant::now();
        let deadline = began + self.timeout;
        let result = self.wait_for(from, tag, deadline);
        self.waited += began.elapsed();
        result
    }

    /// Rank 0 sums the buffers in rank order (so every run gives the same bits) and sends the
    /// sum back to all.
    fn all_reduce_sum(&mut self, buf: &mut B) -> Result<()> {
        let tag = self.next_collective_tag();
        let world = self.world();
        if self.rank == 0 {
            for from in 1..world {
                let parts = self.recv(from, tag)?;
                let [part] = &parts[..] else {
                    bail!(
                        "all-reduce: worker {from} sent {} buffers instead of 1",
                        parts.len()
                    );
                };
                buf.sum_from(part)
                    .map_err(|e| e.context(format!("all-reduce with worker {from}")))?;
            }
            for to in 1..world {
                self.post(to, tag, Body::Data(vec![buf.duplicate()?]))?;
            }
        } else {
            self.post(0, tag, Body::Data(vec![buf.duplicate()?]))?;
            match self.recv(0, tag)?.pop() {
                Some(sum) => *buf = sum,
                None => bail!("all-reduce: worker 0 sent no result"),
            }
        }
        Ok(())
    }

    /// An all-reduce of nothing: a message with no buffers to rank 0 and back.
    fn barrier(&mut self) -> Result<()> {
        let tag = self.next_collective_tag();
        if self.rank == 0 {
            for from in 1..self.world() {
                self.recv(from, tag)?;
            }
            for to in 1..self.world() {
                self.post(to, tag, Body::Data(Vec::new()))?;
            }
        } else {
            self.post(0, tag, Body::Data(Vec::new()))?;
            self.recv(0, tag)?;
        }
        Ok(())
    }

    fn abort(&mut self, reason: &str) {
        let me = self.rank;
        for to in (0..self.world()).filter(|&r| r != me) {
            // A peer that has already exited needs no warning.
            let _ = self.post(to, Tag(u64::MAX), Body::Abort(reason.to_string()));
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn waited_secs(&mut self) -> Result<f64> {
        Ok(self.waited.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// A transport whose sends go nowhere: these tests feed the inbox by hand.
    struct Nowhere(usize);

    impl Transport<Buf> for Nowhere {
        fn world(&self) -> usize {
            self.0
        }
        fn post(&mut self, _to: usize, _envelope: Envelope<Buf>) -> Result<()> {
            Ok(())
        }
    }

    fn closed(from: usize) -> Envelope<Buf> {
        Envelope {
            from,
            tag: Tag(u64::MAX),
            body: Body::Closed("its connection closed".into()),
        }
    }

    #[test]
    fn a_closed_connection_fails_the_wait_on_that_peer_at_once() {
        let (tx, rx) = channel();
        let mut e = Endpoint::new(0, Nowhere(3), rx, Duration::from_secs(30));
        // Rank 2's connection closes while rank 0 waits on rank 1: not an error yet...
        tx.send(closed(2)).unwrap();
        tx.send(Envelope {
            from: 1,
            tag: Tag(5),
            body: Body::Data(vec![vec![1.0]]),
        })
        .unwrap();
        assert_eq!(e.recv(1, Tag(5)).unwrap(), vec![vec![1.0]]);
        // ...but the next wait on rank 2 fails immediately instead of timing out.
        let start = Instant::now();
        let err = e.recv(2, Tag(6)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        let peer = err.downcast_ref::<PeerFailed>().expect("names the peer");
        assert_eq!(peer.rank, 2);
        // And a close while waiting on that very peer ends the wait.
        tx.send(closed(1)).unwrap();
        let err = e.recv(1, Tag(7)).unwrap_err();
        assert_eq!(err.downcast_ref::<PeerFailed>().unwrap().rank, 1);
    }

    #[test]
    fn time_blocked_in_receives_is_counted() {
        let (tx, rx) = channel::<Envelope<Buf>>();
        let mut e = Endpoint::new(0, Nowhere(2), rx, Duration::from_secs(30));
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            tx.send(Envelope {
                from: 1,
                tag: Tag(1),
                body: Body::Data(vec![]),
            })
            .unwrap();
        });
        e.recv(1, Tag(1)).unwrap();
        sender.join().unwrap();
        let waited = e.waited_secs().unwrap();
        assert!((0.1..5.0).contains(&waited), "{waited}");
    }
}
