//! The receiving half every host communicator shares: an inbox that transports fill, a stash for
//! messages that arrive before they are asked for (so a worker may receive in any order), abort
//! messages that turn into `PeerFailed`, timeouts, and collectives built on point-to-point.

use super::{
    Buffer, Communicator, PeerFailed, Role, Shared, Src, Tag, Wire, all_gather_bytes,
    check_tensors, copy_over, gather_by_messages, gather_each, own_span, reduce_scatter_bytes,
    scatter_by_messages, shard_span, shard_spans,
};
use crate::error::Error;
use crate::shape::Span;
use anyhow::{Result, anyhow, bail};
use std::any::Any;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Host buffers: what CPU workers exchange.
pub type Buf = Vec<f32>;

/// What a message holds: tensors, a loan of a buffer to a worker of the same process (a
/// [`Buffer::Lent`], which only in-process transports carry), a rank's last word before it gives
/// up, or the transport's note that the connection to a rank ended.
pub enum Body<B> {
    Data(Vec<B>),
    Lent(Box<dyn Any + Send>),
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

    /// Whether every rank lives in this process, so that ranks can lend each other buffers
    /// ([`Body::Lent`]) instead of sending copies.
    fn shares_memory(&self) -> bool {
        false
    }
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
        if self.transport.post(to, envelope).is_err() {
            return Err(self.departed(to));
        }
        Ok(())
    }

    /// The error for a send to a peer that is gone: its own abort reason if it left one. Other
    /// messages met on the way are stashed: a collective that goes on after a failed send (to
    /// give back loans) still needs them.
    fn departed(&mut self, to: usize) -> anyhow::Error {
        while let Ok(e) = self.inbox.try_recv() {
            match e.body {
                Body::Abort(reason) => {
                    self.closed[e.from] = Some(reason.clone());
                    return PeerFailed {
                        rank: e.from,
                        reason,
                    }
                    .into();
                }
                _ => self.stash.push(e),
            }
        }
        PeerFailed {
            rank: to,
            reason: format!("it exited before worker {} could send to it", self.rank),
        }
        .into()
    }

    fn take(&mut self, from: usize, tag: Tag) -> Option<Body<B>> {
        let i = self
            .stash
            .iter()
            .position(|e| e.from == from && e.tag == tag)?;
        match self.stash.remove(i).body {
            b @ (Body::Data(_) | Body::Lent(_)) => Some(b),
            Body::Abort(_) | Body::Closed(_) => None,
        }
    }

    /// Receives `tag` from `from`, stashing other messages, until `deadline`.
    fn wait_for(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Body<B>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.inbox.recv_timeout(left) {
                Ok(Envelope {
                    from: culprit,
                    body: Body::Abort(reason),
                    ..
                }) => {
                    // A later wait on the culprit fails at once instead of timing out.
                    self.closed[culprit] = Some(reason.clone());
                    return Err(PeerFailed {
                        rank: culprit,
                        reason,
                    }
                    .into());
                }
                Ok(Envelope {
                    from: f,
                    tag: t,
                    body: body @ (Body::Data(_) | Body::Lent(_)),
                }) if f == from && t == tag => return Ok(body),
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
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Error::timeout(format!(
                        "worker {} waited {:.0} s for a message from worker {from} that never arrived (is worker {from} stuck? raise --timeout if its step is that slow)",
                        self.rank,
                        self.timeout.as_secs_f64()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("worker {}: every other worker has exited", self.rank)
                }
            }
        }
    }

    /// The next message `tag` from `from`: stashed, or waited for.
    fn receive(&mut self, from: usize, tag: Tag) -> Result<Body<B>> {
        if let Some(body) = self.take(from, tag) {
            return Ok(body);
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

    /// Lends `lent` to every other rank for one collective: to every rank still there even when
    /// one is gone (the first failure returned), so that no live peer waits for a loan.
    fn lend_to_all(&mut self, lent: &B::Lent) -> Result<()> {
        let me = self.rank;
        let mut failure = None;
        for to in (0..self.world()).filter(|&r| r != me) {
            if let Err(e) = self.post(to, Tag::LENT, Body::Lent(Box::new(lent.clone()))) {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// The next loan of rank `from`, of type `L` (one buffer's, or several's).
    fn loan<L: 'static>(&mut self, from: usize, what: &str) -> Result<L> {
        let me = self.rank;
        match self.receive(from, Tag::LENT)? {
            Body::Lent(any) => Ok(*any.downcast::<L>().map_err(|_| {
                anyhow!("{what}: worker {me} was lent a buffer of another kind by worker {from}")
            })?),
            _ => bail!("{what}: worker {me} expected a loan from worker {from} and got tensors"),
        }
    }

    /// The loans of several buffers of rank `from`, checked to hold `want` elements each.
    fn borrow_each(&mut self, from: usize, want: &[usize], what: &str) -> Result<Vec<B::Lent>> {
        let lent: Vec<B::Lent> = self.loan(from, what)?;
        let got: Vec<usize> = lent.iter().map(B::lent_elements).collect();
        if got != want {
            bail!(
                "{what}: worker {from} lent buffers of {got:?} elements where the shard rule gives {want:?}"
            );
        }
        Ok(lent)
    }

    /// The loan of rank `from` for this collective, checked to hold `want` elements.
    fn borrow(&mut self, from: usize, want: usize, what: &str) -> Result<B::Lent> {
        let lent: B::Lent = self.loan(from, what)?;
        let got = B::lent_elements(&lent);
        if got != want {
            bail!(
                "{what}: worker {from} lent a buffer of {got} elements where the shard rule gives {want}"
            );
        }
        Ok(lent)
    }

    /// Tells `to` that this rank has queued its last read of `to`'s loan (or will read none).
    fn give_back(&mut self, to: usize) -> Result<()> {
        self.post(to, Tag::RETURNED, Body::Data(Vec::new()))
    }

    /// The end of a collective in which this rank lent a buffer and read the peers' loans
    /// (`read`, giving back every loan it read, in order, up to the first failure): waits until
    /// every peer has given back this rank's loan, so the caller may free or overwrite it. On a
    /// failure it first gives back the loans it will not read, so peers waiting on it end too;
    /// a peer that has failed reads no more, and counts as having given back.
    fn settle(&mut self, read: Result<()>, given: usize) -> Result<()> {
        let me = self.rank;
        let peers: Vec<usize> = (0..self.world()).filter(|&r| r != me).collect();
        let mut failure = read.err();
        if failure.is_some() {
            // The reads go through the peers in rank order: those past `given` were not read.
            for &to in peers.iter().skip(given) {
                let _ = self.give_back(to);
            }
        }
        for &from in &peers {
            // Another peer's failure, met while waiting, does not give back `from`'s reads.
            loop {
                match self.recv(from, Tag::RETURNED) {
                    Ok(_) => break,
                    Err(e) => {
                        let other = e
                            .downcast_ref::<PeerFailed>()
                            .is_some_and(|p| p.rank != from);
                        failure.get_or_insert(e);
                        if !other {
                            break;
                        }
                    }
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Reads every peer's loan of its piece into its span of `whole` (`spans` by rank), giving
    /// each back as soon as its copy is queued: the number of loans given back.
    fn read_pieces(&mut self, whole: &mut B, spans: &[Span], given: &mut usize) -> Result<()> {
        let me = self.rank;
        for (from, s) in spans.iter().enumerate().filter(|&(r, _)| r != me) {
            let lent = self.borrow(from, s.len, "all-gather")?;
            let all = Span {
                start: 0,
                len: s.len,
            };
            whole.copy_from(s.start, Src::Lent(&lent), all)?;
            self.give_back(from)?;
            *given += 1;
        }
        Ok(())
    }

    /// This rank's piece `own` of every rank's whole tensor (its own `whole`, the peers' loans)
    /// summed in rank order into `out`, overwriting it: the first two ranks' in one pass
    /// ([`Buffer::set_sum`]), each later rank's added. Each loan is given back, in rank order,
    /// as soon as its sum is queued.
    fn sum_pieces(&mut self, whole: &B, own: Span, out: &mut B, given: &mut usize) -> Result<()> {
        let (me, world, len) = (self.rank, self.world(), whole.elements());
        let mut loans: Vec<Option<B::Lent>> = Vec::with_capacity(world);
        let mut unreturned = 0;
        for from in 0..world {
            loans.push(if from == me {
                None
            } else {
                Some(self.borrow(from, len, "reduce-scatter")?)
            });
            let src = |l| source(whole, l);
            let summed = match (from, world) {
                (0, 1) => out.copy_from(0, src(&loans[0]), own),
                // Summed with rank 1's, in one pass.
                (0, _) => continue,
                (1, _) => out.set_sum(src(&loans[0]), src(&loans[1]), own),
                _ => out.add_from(src(&loans[from]), own),
            };
            summed.map_err(|e| e.context(format!("reduce-scatter with worker {from}")))?;
            for r in (unreturned..=from).filter(|&r| r != me) {
                self.give_back(r)?;
                *given += 1;
            }
            unreturned = from + 1;
        }
        Ok(())
    }

    /// `out =` this rank's piece of the sum of every rank's `whole`, read in place from the
    /// peers' loans (threads of one process), the bytes counted as [`reduce_scatter_bytes`].
    fn scatter_in_place(&mut self, whole: &B, out: &mut B) -> Result<()> {
        let (me, world, len) = (self.rank, self.world(), whole.elements());
        let own = own_span(me, world, len, out.elements(), "reduce-scatter")?;
        let lent = whole.lend()?;
        let mut given = 0;
        let read = self
            .lend_to_all(&lent)
            .and_then(|()| self.sum_pieces(whole, own, out, &mut given));
        self.settle(read, given)?;
        self.bytes_sent += reduce_scatter_bytes(len, world, me, 1) * elem_bytes(whole) as u64;
        Ok(())
    }

    /// Rank 0's part of a shared all-gather: its pieces copied into new whole tensors, then
    /// every peer's lent pieces, then the wholes lent to every peer (to every one still there
    /// even when one is gone, the first failure returned). A peer's pieces need no giving
    /// back: it waits for the wholes, lent only once their reads are queued.
    fn gather_for_all(&mut self, pieces: &[&B], lens: &[usize]) -> Result<Shared<Vec<B>, B>> {
        let world = self.world();
        let mut whole = Vec::with_capacity(pieces.len());
        for (&piece, &len) in pieces.iter().zip(lens) {
            let mut w = piece.alloc_like(len)?;
            let own = Span {
                start: 0,
                len: piece.elements(),
            };
            w.copy_from(0, Src::Own(piece), own)?;
            whole.push(w);
        }
        for from in 1..world {
            let spans: Vec<Span> = lens.iter().map(|&n| shard_span(n, world, from)).collect();
            let want: Vec<usize> = spans.iter().map(|s| s.len).collect();
            let lent = self.borrow_each(from, &want, "all-gather")?;
            for ((w, l), s) in whole.iter_mut().zip(&lent).zip(&spans) {
                let all = Span {
                    start: 0,
                    len: s.len,
                };
                w.copy_from(s.start, Src::Lent(l), all)?;
            }
        }
        let lent = whole.iter().map(B::lend).collect::<Result<Vec<_>>>()?;
        let shared = Shared::new(whole, Role::Lender);
        let mut failure = None;
        for to in 1..world {
            let body = Body::Lent(Box::new(lent.clone()));
            if let Err(e) = self.post(to, Tag::LENT, body) {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(shared), Err)
    }

    /// A peer's part of a shared all-gather: its pieces lent to rank 0, then views of the
    /// whole tensors rank 0 lends back.
    fn gather_from_lender(&mut self, pieces: &[&B], lens: &[usize]) -> Result<Shared<Vec<B>, B>> {
        let lent = pieces
            .iter()
            .map(|p| p.lend())
            .collect::<Result<Vec<_>>>()?;
        self.post(0, Tag::LENT, Body::Lent(Box::new(lent)))?;
        let wholes = self.borrow_each(0, lens, "all-gather")?;
        B::views(&wholes, pieces[0])
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
        match self.receive(from, tag)? {
            Body::Data(parts) => Ok(parts),
            _ => bail!(
                "worker {} expected tensors from worker {from} and was lent a buffer",
                self.rank
            ),
        }
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

    /// Worker threads read the peers' pieces in place from their loans; other transports
    /// gather by messages.
    fn all_gather_into(&mut self, piece: &B, whole: &mut B) -> Result<()> {
        if !self.transport.shares_memory() {
            return gather_by_messages(self, piece, whole);
        }
        let (me, world, len) = (self.rank, self.world(), whole.elements());
        let own = own_span(me, world, len, piece.elements(), "all-gather")?;
        let spans = shard_spans(len, world);
        let all = Span {
            start: 0,
            len: own.len,
        };
        whole.copy_from(own.start, Src::Own(piece), all)?;
        let lent = piece.lend()?;
        let mut given = 0;
        let read = self
            .lend_to_all(&lent)
            .and_then(|()| self.read_pieces(whole, &spans, &mut given));
        self.settle(read, given)?;
        self.bytes_sent += all_gather_bytes(len, world, me, 1) * elem_bytes(piece) as u64;
        Ok(())
    }

    /// Worker threads sum the peers' spans of their lent whole tensors in place, into a
    /// temporary then added to `acc` (the bits of the sum added after); other transports cut
    /// and send.
    fn reduce_scatter_add(&mut self, whole: &B, acc: &mut B) -> Result<()> {
        if !self.transport.shares_memory() {
            let sum = scatter_by_messages(self, whole, acc)?;
            return acc.sum_from(&sum);
        }
        let mut sum = acc.alloc_like(acc.elements())?;
        self.scatter_in_place(whole, &mut sum)?;
        acc.sum_from(&sum)
    }

    /// Worker threads sum the peers' spans of their lent whole tensors straight into `out`;
    /// other transports cut and send.
    fn reduce_scatter_into(&mut self, whole: &B, out: &mut B) -> Result<()> {
        if !self.transport.shares_memory() {
            let sum = scatter_by_messages(self, whole, out)?;
            return copy_over(out, &sum);
        }
        self.scatter_in_place(whole, out)
    }

    /// Worker threads gather one copy for all, rank 0's, which the others read in place; other
    /// transports give each rank its own.
    fn all_gather_shared(&mut self, pieces: &[&B], lens: &[usize]) -> Result<Shared<Vec<B>, B>> {
        if !self.transport.shares_memory() {
            return gather_each(self, pieces, lens);
        }
        check_tensors(pieces, lens)?;
        let (me, world) = (self.rank, self.world());
        for (piece, &len) in pieces.iter().zip(lens) {
            own_span(me, world, len, piece.elements(), "all-gather")?;
        }
        let shared = if me == 0 {
            self.gather_for_all(pieces, lens)?
        } else {
            self.gather_from_lender(pieces, lens)?
        };
        for (piece, &len) in pieces.iter().zip(lens) {
            self.bytes_sent += all_gather_bytes(len, world, me, 1) * elem_bytes(*piece) as u64;
        }
        Ok(shared)
    }

    /// A peer lets go of its views and tells rank 0; rank 0 frees the one copy once every peer
    /// has (on a peer's failure it lets go of it unfreed: see [`Shared`]).
    fn release_shared(&mut self, shared: Shared<Vec<B>, B>) -> Result<()> {
        let (whole, role) = shared.into_parts();
        match role {
            Role::Own => drop(whole),
            Role::Views => {
                whole.into_iter().for_each(B::forget);
                self.give_back(0)?;
            }
            Role::Lender => {
                for from in 1..self.world() {
                    if let Err(e) = self.recv(from, Tag::RETURNED) {
                        whole.into_iter().for_each(B::forget);
                        return Err(e);
                    }
                }
                drop(whole);
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

/// What a reduction reads of one rank: its loan, or this rank's own `whole` where it has none.
fn source<'a, B: Buffer>(whole: &'a B, loan: &'a Option<B::Lent>) -> Src<'a, B> {
    loan.as_ref().map_or(Src::Own(whole), Src::Lent)
}

/// Bytes of one element of `b` (the unit of the byte predictions); 0 for an empty buffer, which
/// sends nothing.
fn elem_bytes<B: Wire>(b: &B) -> usize {
    b.wire_bytes().checked_div(b.elements()).unwrap_or(0)
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

    #[test]
    fn a_peer_that_never_sends_times_out_as_a_timeout() {
        use crate::comm::local_group;
        use crate::error::{ErrorKind, kind_of};
        let mut group = local_group::<Buf>(2, Duration::from_millis(50));
        let e = group[0].recv(1, Tag(1)).unwrap_err();
        assert_eq!(kind_of(&e), Some(ErrorKind::Timeout));
        assert_eq!(
            format!("{e:#}"),
            "worker 0 waited 0 s for a message from worker 1 that never arrived (is worker 1 stuck? raise --timeout if its step is that slow)"
        );
    }
}
