//! The communicator's interface: the `Communicator` trait and what it moves (`Wire`, `Buffer`,
//! tags, whole tensors shared between worker threads), and the helpers its implementations
//! share (a leaf: every transport in `comm` builds on it).
//!
//! Shared whole tensors: worker threads of one process use one copy: rank 0 gathers it for
//! all of them and lends it, the others see it through views ([`Buffer::views`]). Held in a
//! [`Shared`], which never frees memory that another rank may still read.

use crate::shape::{Part, Span};
use anyhow::{Result, bail};
use std::fmt;

/// Identifies a message between one sender and one receiver; both sides compute it from the
/// plan, so a message can never be taken for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag(pub u64);

impl Tag {
    /// Tags at or above this value are reserved for collectives.
    pub(super) const COLLECTIVE: u64 = 1 << 62;
    /// The all-gather's messages. One tag serves every call: every rank calls the collectives
    /// in the same order and messages of one sender and tag arrive in order, so the k-th
    /// message from a rank is its piece of the k-th call.
    pub(super) const ALL_GATHER: Tag = Tag(Self::COLLECTIVE - 1);
    /// The reduce-scatter's messages, one tag for every call as for [`Tag::ALL_GATHER`].
    pub(super) const REDUCE_SCATTER: Tag = Tag(Self::COLLECTIVE - 2);
    /// A worker thread's loan of a buffer to a peer for one collective ([`Buffer::lend`]), one
    /// tag for every call as for [`Tag::ALL_GATHER`].
    pub(super) const LENT: Tag = Tag(Self::COLLECTIVE - 3);
    /// A peer's word that it has queued its last read of a loan (or will read none).
    pub(super) const RETURNED: Tag = Tag(Self::COLLECTIVE - 4);
}

/// The shard rule, written once for every collective and every sharded state: a flattened
/// tensor of `len` elements is cut into `world` contiguous pieces whose sizes differ by at most
/// one element (the first `len % world` pieces one longer), and rank `rank` holds piece `rank`.
/// Contiguous pieces let each rank update its piece with the same elementwise kernels as a whole
/// tensor, and near-equal sizes balance the work and the memory.
pub fn shard_span(len: usize, world: usize, rank: usize) -> Span {
    let (base, extra) = (len / world, len % world);
    Span {
        start: rank * base + rank.min(extra),
        len: base + usize::from(rank < extra),
    }
}

/// Every rank's piece of a tensor of `len` elements, in rank order ([`shard_span`]).
pub fn shard_spans(len: usize, world: usize) -> Vec<Span> {
    (0..world).map(|r| shard_span(len, world, r)).collect()
}

/// Bytes rank `rank` sends in one [`Communicator::all_gather`] of a tensor of `len` elements of
/// `elem_bytes` each: its piece to each other rank (the prediction `bytes_sent` is checked
/// against, as `plan::volume` predicts the attention's).
pub fn all_gather_bytes(len: usize, world: usize, rank: usize, elem_bytes: usize) -> u64 {
    ((world - 1) * shard_span(len, world, rank).len * elem_bytes) as u64
}

/// Bytes rank `rank` sends in one [`Communicator::reduce_scatter_sum`] of a tensor of `len`
/// elements of `elem_bytes` each: every other rank's piece, to that rank.
pub fn reduce_scatter_bytes(len: usize, world: usize, rank: usize, elem_bytes: usize) -> u64 {
    ((len - shard_span(len, world, rank).len) * elem_bytes) as u64
}

/// The one buffer of a collective's message from `from`, checked to hold `want` elements.
pub(super) fn one_piece<T: Wire>(
    mut parts: Vec<T>,
    from: usize,
    want: usize,
    what: &str,
) -> Result<T> {
    match (parts.pop(), parts.is_empty()) {
        (Some(p), true) if p.elements() == want => Ok(p),
        (Some(p), true) => bail!(
            "{what}: worker {from} sent a piece of {} elements where the shard rule gives {want}",
            p.elements()
        ),
        _ => bail!(
            "{what}: worker {from} sent {} buffers instead of 1",
            parts.len() + 1
        ),
    }
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

/// Where a buffer operation reads: a buffer of this worker, or a peer's loan of its own.
pub enum Src<'a, B: Buffer> {
    Own(&'a B),
    Lent(&'a B::Lent),
}

/// A buffer the in-process communicator can carry: it copies what it sends (a host clone, or a
/// device-to-device copy for GPU workers sharing a device) and sums for all-reduce. Workers of
/// one process can also lend each other their buffers for the span of one collective, which
/// then reads a peer's memory in place instead of receiving copies of it
/// ([`Communicator::all_gather_into`], [`Communicator::reduce_scatter_add`]).
pub trait Buffer: Wire + Sized {
    /// A read-only view of a buffer that a peer of the same process reads during one
    /// collective: a copy of a host vector (one, however many peers read it), the address of
    /// a device tensor (no copy: the lender waits until every peer has queued its reads).
    type Lent: Clone + Send + 'static;

    fn duplicate(&self) -> Result<Self>;

    /// This buffer lent to peers of the same process.
    fn lend(&self) -> Result<Self::Lent>;

    /// Elements of a loan.
    fn lent_elements(lent: &Self::Lent) -> usize;

    /// A buffer of the same kind as this one (its precision, on its device) holding `len`
    /// elements of unspecified value: a collective overwrites every one.
    fn alloc_like(&self, len: usize) -> Result<Self>;

    /// `self[at..at + span.len] = src[span]`.
    fn copy_from(&mut self, at: usize, src: Src<'_, Self>, span: Span) -> Result<()>;

    /// `self += src[span]`, elementwise (`self` holds `span.len` elements).
    fn add_from(&mut self, src: Src<'_, Self>, span: Span) -> Result<()>;

    /// A new buffer holding `src[span]`.
    fn take_from(src: Src<'_, Self>, span: Span) -> Result<Self>;

    /// `self = a[span] + b[span]`, elementwise, each sum rounded once (`self` holds `span.len`
    /// elements): the first two ranks of an in-place reduce-scatter in one pass over memory,
    /// where a copy and then a sum would pass over `self` twice.
    fn set_sum(&mut self, a: Src<'_, Self>, b: Src<'_, Self>, span: Span) -> Result<()>;

    /// Buffers holding a lender's loans `lent`, for this rank's use of them: a device tensor
    /// reads the lender's memory in place (checked to be on the stream of `like`, a buffer of
    /// this rank); host loans are copies. Held as [`Role::Views`], so that they are let go of
    /// ([`Buffer::forget`]) and never freed as this rank's memory.
    fn views(lent: &[Self::Lent], like: &Self) -> Result<Shared<Vec<Self>, Self>>;

    /// Lets go of a buffer without freeing its memory: a view of a peer's ([`Buffer::views`]),
    /// or a lent buffer that peers may still read when a job fails (which leaks it, rather than
    /// let a queued read meet freed memory). Host buffers, whose loans are copies, just drop.
    fn forget(self);

    /// `self += other`, elementwise.
    fn sum_from(&mut self, other: &Self) -> Result<()> {
        if self.elements() != other.elements() {
            bail!(
                "sizes differ: {} and {} elements",
                self.elements(),
                other.elements()
            );
        }
        let all = Span {
            start: 0,
            len: other.elements(),
        };
        self.add_from(Src::Own(other), all)
    }
}

/// Checks that `span` lies in a source of `src_len` elements and that its `span.len` elements
/// fit in a destination of `dst_len` from `at`: what every buffer copy and sum checks before
/// it touches memory.
pub(super) fn check_span(
    what: &str,
    src_len: usize,
    span: Span,
    dst_len: usize,
    at: usize,
) -> Result<()> {
    if span.end() > src_len || at + span.len > dst_len {
        bail!(
            "{what}: elements {}..{} of a buffer of {src_len} into {at}..{} of one of {dst_len}",
            span.start,
            span.end(),
            at + span.len
        );
    }
    Ok(())
}

impl Buffer for Vec<f32> {
    /// A host vector lends a copy: safe code cannot let another thread read memory that this one
    /// may free when the collective returns, and host workers are not what this saves for.
    type Lent = std::sync::Arc<Vec<f32>>;

    fn duplicate(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn lend(&self) -> Result<Self::Lent> {
        Ok(std::sync::Arc::new(self.clone()))
    }

    fn lent_elements(lent: &Self::Lent) -> usize {
        lent.len()
    }

    fn alloc_like(&self, len: usize) -> Result<Self> {
        Ok(vec![0.0; len])
    }

    fn copy_from(&mut self, at: usize, src: Src<'_, Self>, span: Span) -> Result<()> {
        let s = host_slice(&src);
        check_span("a host copy", s.len(), span, self.len(), at)?;
        self[at..at + span.len].copy_from_slice(&s[span.start..span.end()]);
        Ok(())
    }

    fn add_from(&mut self, src: Src<'_, Self>, span: Span) -> Result<()> {
        let s = host_slice(&src);
        check_host_sum(&[s], span, self.len())?;
        self.iter_mut()
            .zip(&s[span.start..span.end()])
            .for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn take_from(src: Src<'_, Self>, span: Span) -> Result<Self> {
        let s = host_slice(&src);
        check_span("a host piece", s.len(), span, span.len, 0)?;
        Ok(s[span.start..span.end()].to_vec())
    }

    fn set_sum(&mut self, a: Src<'_, Self>, b: Src<'_, Self>, span: Span) -> Result<()> {
        let (a, b) = (host_slice(&a), host_slice(&b));
        check_host_sum(&[a, b], span, self.len())?;
        let (a, b) = (&a[span.start..span.end()], &b[span.start..span.end()]);
        for ((d, x), y) in self.iter_mut().zip(a).zip(b) {
            *d = x + y;
        }
        Ok(())
    }

    fn views(lent: &[Self::Lent], _like: &Self) -> Result<Shared<Vec<Self>, Self>> {
        let copies = lent.iter().map(|l| l.to_vec()).collect();
        Ok(Shared::new(copies, Role::Views))
    }

    fn forget(self) {}
}

/// Checks that a host sum of `srcs[span]` into a buffer of `dst_len` elements reads inside each
/// source and fills the buffer exactly.
pub(super) fn check_host_sum(srcs: &[&[f32]], span: Span, dst_len: usize) -> Result<()> {
    for src in srcs {
        check_span("a host sum", src.len(), span, dst_len, 0)?;
    }
    if dst_len != span.len {
        bail!(
            "a host sum of {} elements into a buffer of {dst_len}",
            span.len
        );
    }
    Ok(())
}

/// The host values a buffer operation reads.
pub(super) fn host_slice<'a>(src: &Src<'a, Vec<f32>>) -> &'a [f32] {
    match *src {
        Src::Own(v) => v,
        Src::Lent(l) => l,
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

    /// Every rank's piece of a tensor of `len` elements cut by [`shard_span`], in rank order,
    /// given this rank's own `piece`: what sharded state uses to rebuild a whole tensor. Host
    /// communicators send the piece to every other rank; the bytes count in `bytes_sent`
    /// ([`all_gather_bytes`]).
    fn all_gather(&mut self, piece: T, len: usize) -> Result<Vec<T>> {
        let (me, world) = (self.rank(), self.world());
        let spans = shard_spans(len, world);
        if piece.elements() != spans[me].len {
            bail!(
                "all-gather: worker {me} holds {} elements, but its piece of {len} is {}",
                piece.elements(),
                spans[me].len
            );
        }
        for to in (0..world).filter(|&r| r != me) {
            self.send(to, Tag::ALL_GATHER, &[&piece])?;
        }
        let mut own = Some(piece);
        (0..world)
            .map(|from| match own.take_if(|_| from == me) {
                Some(p) => Ok(p),
                None => one_piece(
                    self.recv(from, Tag::ALL_GATHER)?,
                    from,
                    spans[from].len,
                    "all-gather",
                ),
            })
            .collect()
    }

    /// The sum over all ranks of piece `rank` of a tensor cut by [`shard_span`], given this
    /// rank's `pieces` of it (one per rank, in rank order): a sharded gradient. The pieces are
    /// summed in rank order, as the host all-reduce sums, so the result has the same bits as
    /// that piece of an all-reduce. Host communicators send each other rank its piece; the
    /// bytes count in `bytes_sent` ([`reduce_scatter_bytes`]).
    fn reduce_scatter_sum(&mut self, pieces: Vec<T>) -> Result<T>
    where
        T: Buffer,
    {
        let (me, world) = (self.rank(), self.world());
        let lens: Vec<usize> = pieces.iter().map(Wire::elements).collect();
        let len = lens.iter().sum();
        let want: Vec<usize> = shard_spans(len, world).iter().map(|s| s.len).collect();
        if lens != want {
            bail!(
                "reduce-scatter: worker {me} cut {len} elements into pieces of {lens:?}, but the shard rule over {world} workers gives {want:?}"
            );
        }
        let mut own = None;
        for (to, piece) in pieces.into_iter().enumerate() {
            if to == me {
                own = Some(piece);
            } else {
                self.send(to, Tag::REDUCE_SCATTER, &[&piece])?;
            }
        }
        let mut sum: Option<T> = None;
        for from in 0..world {
            let piece = match own.take_if(|_| from == me) {
                Some(p) => p,
                None => one_piece(
                    self.recv(from, Tag::REDUCE_SCATTER)?,
                    from,
                    want[me],
                    "reduce-scatter",
                )?,
            };
            match &mut sum {
                None => sum = Some(piece),
                Some(s) => s
                    .sum_from(&piece)
                    .map_err(|e| e.context(format!("reduce-scatter with worker {from}")))?,
            }
        }
        sum.ok_or_else(|| anyhow::anyhow!("reduce-scatter over no workers"))
    }

    /// [`Communicator::all_gather`] into `whole` (`len` its elements, `piece` this rank's
    /// piece of it): every piece lands in its span of the caller's one tensor, with no gathered
    /// pieces to join. Worker threads read each other's pieces in place
    /// ([`Buffer::lend`]); other transports gather the pieces and copy each into place. The
    /// bytes count as [`all_gather_bytes`].
    fn all_gather_into(&mut self, piece: &T, whole: &mut T) -> Result<()>
    where
        T: Buffer,
    {
        gather_by_messages(self, piece, whole)
    }

    /// `acc +=` this rank's piece (by [`shard_span`]) of the sum over all ranks of `whole`:
    /// [`Communicator::reduce_scatter_sum`] without cutting `whole` into pieces first, and with
    /// the same bits (the ranks' pieces summed in rank order, then added to `acc`). Worker
    /// threads sum the other workers' spans of their whole tensors in place; other transports
    /// cut and send. The bytes count as [`reduce_scatter_bytes`].
    fn reduce_scatter_add(&mut self, whole: &T, acc: &mut T) -> Result<()>
    where
        T: Buffer,
    {
        let sum = scatter_by_messages(self, whole, acc)?;
        acc.sum_from(&sum)
    }

    /// `out =` this rank's piece (by [`shard_span`]) of the sum over all ranks of `whole`,
    /// overwriting what `out` held: [`Communicator::reduce_scatter_add`] into an accumulator
    /// that holds zeros, without reading the zeros or summing into a temporary first. The bits
    /// are [`Communicator::reduce_scatter_sum`]'s, which differ from `0 + sum` only where the
    /// sum is `-0` (`0 + -0` is `+0`): equal values. The bytes count as
    /// [`reduce_scatter_bytes`].
    fn reduce_scatter_into(&mut self, whole: &T, out: &mut T) -> Result<()>
    where
        T: Buffer,
    {
        let sum = scatter_by_messages(self, whole, out)?;
        copy_over(out, &sum)
    }

    /// Whole tensors of `lens` elements (each by [`shard_span`]) from every rank's pieces of
    /// them (`pieces` this rank's), for a use that every rank makes of the same values (a
    /// layer's forward), given back with [`Communicator::release_shared`]. Worker threads
    /// sharing memory make one copy for them all: rank 0 gathers it and lends it, the others
    /// read it in place ([`Buffer::views`]), so that a process writes each whole tensor once
    /// rather than once per worker. Other transports give each rank its own copy
    /// ([`Communicator::all_gather_into`]). The bytes count as [`all_gather_bytes`] of each
    /// tensor whatever the transport: the transport-independent prediction, not what a shared
    /// copy moves.
    fn all_gather_shared(&mut self, pieces: &[&T], lens: &[usize]) -> Result<Shared<Vec<T>, T>>
    where
        T: Buffer,
    {
        gather_each(self, pieces, lens)
    }

    /// Ends the use of [`Communicator::all_gather_shared`]'s tensors, a collective every rank
    /// calls once it has queued its last use of them: a rank's own copies are freed; between
    /// worker threads, the views are given back to rank 0, which waits for every rank's before
    /// it frees the one copy.
    fn release_shared(&mut self, shared: Shared<Vec<T>, T>) -> Result<()>
    where
        T: Buffer,
    {
        drop(shared);
        Ok(())
    }

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

/// The span of `len` elements this rank holds, checked against a buffer of `have` elements
/// (`what` names the collective and the buffer).
pub(super) fn own_span(
    me: usize,
    world: usize,
    len: usize,
    have: usize,
    what: &str,
) -> Result<Span> {
    let own = shard_span(len, world, me);
    if have != own.len {
        bail!(
            "{what}: worker {me} holds {have} elements, but its piece of {len} over {world} workers is {}",
            own.len
        );
    }
    Ok(own)
}

/// [`Communicator::all_gather_into`] through [`Communicator::all_gather`]: the pieces received,
/// then each copied into its span.
pub(super) fn gather_by_messages<T: Buffer, C: Communicator<T> + ?Sized>(
    comm: &mut C,
    piece: &T,
    whole: &mut T,
) -> Result<()> {
    let (me, world, len) = (comm.rank(), comm.world(), whole.elements());
    own_span(me, world, len, piece.elements(), "all-gather")?;
    let all = comm.all_gather(piece.duplicate()?, len)?;
    for (p, s) in all.iter().zip(shard_spans(len, world)) {
        let span = Span {
            start: 0,
            len: s.len,
        };
        whole.copy_from(s.start, Src::Own(p), span)?;
    }
    Ok(())
}

/// [`Communicator::all_gather_shared`] as every rank's own copies: each tensor allocated and
/// gathered into ([`Communicator::all_gather_into`]).
pub(super) fn gather_each<T: Buffer, C: Communicator<T> + ?Sized>(
    comm: &mut C,
    pieces: &[&T],
    lens: &[usize],
) -> Result<Shared<Vec<T>, T>> {
    check_tensors(pieces, lens)?;
    let mut whole = Vec::with_capacity(pieces.len());
    for (&piece, &len) in pieces.iter().zip(lens) {
        let mut w = piece.alloc_like(len)?;
        comm.all_gather_into(piece, &mut w)?;
        whole.push(w);
    }
    Ok(Shared::new(whole, Role::Own))
}

/// Checks that a gather of several tensors has a length for each piece, and some tensor.
pub(super) fn check_tensors<T>(pieces: &[&T], lens: &[usize]) -> Result<()> {
    if pieces.is_empty() || pieces.len() != lens.len() {
        bail!(
            "all-gather: {} pieces for {} tensors (one piece of each, at least one)",
            pieces.len(),
            lens.len()
        );
    }
    Ok(())
}

/// `out = sum` copied into `out`'s own memory (which keeps its allocation and stream; a sum
/// received by NCCL lives on its communication stream).
pub(super) fn copy_over<T: Buffer>(out: &mut T, sum: &T) -> Result<()> {
    let all = Span {
        start: 0,
        len: sum.elements(),
    };
    out.copy_from(0, Src::Own(sum), all)
}

/// [`Communicator::reduce_scatter_add`] and [`Communicator::reduce_scatter_into`] through
/// [`Communicator::reduce_scatter_sum`]: `whole` cut into pieces, this rank's summed piece
/// returned (checked first to fit `out`, the caller's buffer for it).
pub(super) fn scatter_by_messages<T: Buffer, C: Communicator<T> + ?Sized>(
    comm: &mut C,
    whole: &T,
    out: &T,
) -> Result<T> {
    let (me, world, len) = (comm.rank(), comm.world(), whole.elements());
    own_span(me, world, len, out.elements(), "reduce-scatter")?;
    let pieces = shard_spans(len, world)
        .into_iter()
        .map(|s| T::take_from(Src::Own(whole), s))
        .collect::<Result<Vec<_>>>()?;
    comm.reduce_scatter_sum(pieces)
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

/// Whole tensors from [`Communicator::all_gather_shared`], held in a container `C` (the
/// gathered `Vec`, or a layer's weights built from it), given back with
/// [`Communicator::release_shared`]. They are this rank's own copies; or, between
/// worker threads sharing memory, rank 0's one copy, lent to the other ranks, which hold views
/// of it. Rank 0 frees its copy only once every other rank has given its views back; dropped
/// without that (a failing job), a lent copy and the views are let go of unfreed
/// ([`Buffer::forget`]), so no rank's queued read of them meets freed memory.
pub struct Shared<C, T: Buffer> {
    whole: Option<C>,
    /// Takes `C` apart into its tensors, for release or for letting go of them.
    split: fn(C) -> Vec<T>,
    role: Role,
}

/// Whose memory a [`Shared`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// This rank's own copies: freed when done.
    Own,
    /// Rank 0's copies, lent to the other ranks: freed once they have given them back.
    Lender,
    /// Views of rank 0's copies: never freed here.
    Views,
}

impl<T: Buffer> Shared<Vec<T>, T> {
    /// Gathered tensors held as `role` says.
    pub(super) fn new(whole: Vec<T>, role: Role) -> Self {
        Shared {
            whole: Some(whole),
            split: |v| v,
            role,
        }
    }

    /// The tensors and whose memory they are, for [`Communicator::release_shared`],
    /// which must free, keep or forget them as `role` says.
    pub(super) fn into_parts(mut self) -> (Vec<T>, Role) {
        let whole = self.whole.take().expect("held until taken apart");
        (whole, self.role)
    }
}

impl<C, T: Buffer> Shared<C, T> {
    /// The tensors, for the one use they were gathered for.
    pub fn get(&self) -> &C {
        self.whole.as_ref().expect("held until taken apart")
    }

    /// The same tensors in another container: `build` makes it from `C` (it must not drop any
    /// tensor), `split` takes it apart again.
    pub fn map<D>(mut self, build: impl FnOnce(C) -> D, split: fn(D) -> Vec<T>) -> Shared<D, T> {
        let whole = self.whole.take().expect("held until taken apart");
        Shared {
            whole: Some(build(whole)),
            split,
            role: self.role,
        }
    }
}

impl<C, T: Buffer> Drop for Shared<C, T> {
    fn drop(&mut self) {
        let Some(whole) = self.whole.take() else {
            return;
        };
        let tensors = (self.split)(whole);
        if self.role == Role::Own {
            return drop(tensors);
        }
        for t in tensors {
            t.forget();
        }
    }
}
