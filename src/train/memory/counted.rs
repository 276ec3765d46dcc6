//! The counting device (`train::memory::lengths`) as a job's device, so that one rank of a run over
//! several GPUs is counted as one GPU's step is: by running training's own rank step on it
//! (`estimate::rank_estimate`): its sharding of the weights and the optimizer's state, the
//! executor's attention with its communication buffers, the gradients' reduction and the
//! update. Three parts make the counting device a job's device:
//!
//! - its tensors travel ([`Wire`], [`Buffer`]) with nothing in them;
//! - [`CountingBackend`], the block API the executor runs, makes what the CUDA backend's makes
//!   (`backend::cuda::blocks`, `layout`): 16-bit head-major inputs, f32 running state, f32
//!   partial outputs and LSE, f32 D and gradient accumulators (modelling the CPU: f32 all);
//! - [`CountingComm`] completes every transfer at once and makes on this rank's counter what
//!   NCCL makes there (`comm::nccl`): each posted receive's buffers, and a gather's or a
//!   reduce-scatter's padded buffers beside its pieces. Nothing is computed and no rank waits
//!   for another, so the ranks are counted one at a time, each alone.

use super::count::{Metered, Tracked, check_len};
use super::lengths::{Lengths, Shape};
use crate::backend::{Backend, ModelEdge, Order};
use crate::block_math::{Block, GradsMut, Partial, QuerySide, RunningState};
use crate::comm::{
    Buffer, Communicator, Incoming, Outgoing, Posted, Shared, Src, Tag, Wire, shard_spans,
};
use crate::runtime::{ModelDevice, NoFastPath};
use crate::shape::{Dims, Mask, Precision, Span};
use anyhow::{Result, bail};

/// A tensor of the counting device, counted.
pub type Counted = Tracked<Shape>;

/// A new counted tensor of `len` elements as `lengths` makes it (f32 when `wide`).
fn counted(lengths: &Lengths, len: usize, wide: bool, what: &'static str) -> Counted {
    let shape = lengths.shape_of(len, wide);
    Tracked::made(shape, len * shape.elem, what, lengths.counter())
}

/// A new counted tensor of `len` elements of `t`'s precision, on `t`'s counter.
fn like(t: &Counted, len: usize, what: &'static str) -> Counted {
    let elem = t.inner.elem;
    Tracked::made(Shape { len, elem }, len * elem, what, t.counter())
}

/// Elements of `src`, one of this device's tensors or a loan of one.
fn src_len(src: &Src<'_, Counted>) -> usize {
    match src {
        Src::Own(t) => t.inner.len,
        Src::Lent(s) => s.len,
    }
}

/// One sentence unless `span` lies in a source of `src` elements and fits `dst` from `at`.
fn check_span(src: usize, span: Span, dst: usize, at: usize) -> Result<()> {
    if span.end() > src || at + span.len > dst {
        bail!(
            "elements {}..{} of a tensor of {src} do not fit at {at} in one of {dst}",
            span.start,
            span.end()
        );
    }
    Ok(())
}

impl Wire for Counted {
    fn wire_bytes(&self) -> usize {
        self.inner.len * self.inner.elem
    }

    fn elements(&self) -> usize {
        self.inner.len
    }
}

/// A counted tensor as the communicators carry it: each copy is a new tensor on the counter of
/// the tensor it is made from or like; sums and copies only check their lengths.
impl Buffer for Counted {
    type Lent = Shape;

    fn duplicate(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn lend(&self) -> Result<Shape> {
        Ok(self.inner)
    }

    fn lent_elements(lent: &Shape) -> usize {
        lent.len
    }

    fn alloc_like(&self, len: usize) -> Result<Self> {
        Ok(like(self, len, "a buffer like another"))
    }

    fn copy_from(&mut self, at: usize, src: Src<'_, Self>, span: Span) -> Result<()> {
        check_span(src_len(&src), span, self.inner.len, at)
    }

    fn add_from(&mut self, src: Src<'_, Self>, span: Span) -> Result<()> {
        check_span(src_len(&src), span, self.inner.len, 0)
    }

    fn take_from(src: Src<'_, Self>, span: Span) -> Result<Self> {
        let Src::Own(t) = src else {
            bail!("the counting device's workers lend each other nothing");
        };
        check_span(t.inner.len, span, span.len, 0)?;
        Ok(like(t, span.len, "a piece"))
    }

    fn set_sum(&mut self, a: Src<'_, Self>, b: Src<'_, Self>, span: Span) -> Result<()> {
        check_span(src_len(&a), span, self.inner.len, 0)?;
        check_span(src_len(&b), span, self.inner.len, 0)
    }

    fn views(_: &[Shape], _: &Self) -> Result<Shared<Vec<Self>, Self>> {
        bail!("the counting device's workers lend each other nothing")
    }

    fn forget(self) {}
}

/// The executor's block API on the counting device: what the modelled backend allocates,
/// counted (the CUDA backend's precisions, or the CPU's f32 throughout).
pub struct CountingBackend<'d> {
    lengths: &'d Lengths,
}

impl CountingBackend<'_> {
    fn make(&self, len: usize, wide: bool, what: &'static str) -> Counted {
        counted(self.lengths, len, wide, what)
    }
}

impl Backend for CountingBackend<'_> {
    type Tensor = Counted;

    fn name(&self) -> String {
        "counting".into()
    }

    fn upload(&self, host: &[f32]) -> Result<Counted> {
        Ok(self.make(host.len(), false, "upload"))
    }

    fn download(&self, t: &Counted) -> Result<Vec<f32>> {
        Ok(vec![0.0; t.inner.len])
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn zeros(&self, len: usize) -> Result<Counted> {
        Ok(self.make(len, true, "zeros"))
    }

    fn add_assign(&self, dst: &mut Counted, src: &Counted) -> Result<()> {
        check_len("the added tensor", src.inner.len, dst.inner.len)
    }

    fn new_state(&self, dims: &Dims, rows: usize) -> Result<RunningState<Counted>> {
        let stat = dims.stat_len(rows);
        Ok(RunningState {
            m: self.make(stat, true, "new_state"),
            l: self.make(stat, true, "new_state"),
            acc: self.make(dims.q_len(rows), true, "new_state"),
        })
    }

    fn forward_block(
        &self,
        _: &Dims,
        _: Block,
        _: &Mask,
        _: &Counted,
        _: (&Counted, &Counted),
        _: &mut RunningState<Counted>,
    ) -> Result<()> {
        Ok(())
    }

    fn finalize(
        &self,
        dims: &Dims,
        rows: usize,
        _: RunningState<Counted>,
    ) -> Result<Partial<Counted>> {
        Ok(Partial {
            out: self.make(dims.q_len(rows), true, "finalize"),
            lse: self.make(dims.stat_len(rows), true, "finalize"),
        })
    }

    fn merge(
        &self,
        _: &Dims,
        _: usize,
        _: &mut Partial<Counted>,
        _: &Partial<Counted>,
    ) -> Result<()> {
        Ok(())
    }

    fn delta(&self, dims: &Dims, rows: usize, _: &Counted, _: &Counted) -> Result<Counted> {
        Ok(self.make(dims.stat_len(rows), true, "delta"))
    }

    fn backward_block(
        &self,
        _: &Dims,
        _: Block,
        _: &Mask,
        _: QuerySide<'_, Counted>,
        _: (&Counted, &Counted),
        _: GradsMut<'_, Counted>,
    ) -> Result<()> {
        Ok(())
    }
}

/// Both directions make activations' precision (16-bit on a GPU), as the relayouts do.
impl ModelEdge for CountingBackend<'_> {
    fn relayout(
        &self,
        t: &Counted,
        rows: usize,
        heads: usize,
        d: usize,
        _: Order,
        what: &str,
    ) -> Result<Counted> {
        check_len(what, t.inner.len, rows * heads * d)?;
        Ok(self.make(t.inner.len, false, "relayout"))
    }

    fn split(&self, t: &Counted, lens: &[usize]) -> Result<Vec<Counted>> {
        check_len("a split tensor", t.inner.len, lens.iter().sum())?;
        Ok(lens.iter().map(|&n| like(t, n, "split")).collect())
    }

    fn join(&self, parts: &[Counted]) -> Result<Counted> {
        let len = parts.iter().map(|p| p.inner.len).sum();
        match parts.first() {
            Some(first) => Ok(like(first, len, "join")),
            None => Ok(self.make(0, false, "join")),
        }
    }
}

/// Rank `rank` of `world` on the counting device: every transfer completes at once, making
/// what NCCL makes on this rank (`comm::nccl::NcclComm`); for the CPU's workers, whose
/// collectives copy pieces without padding, that errs on the side of more.
pub struct CountingComm<'d> {
    rank: usize,
    world: usize,
    lengths: &'d Lengths,
}

impl Communicator<Counted> for CountingComm<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    /// Sent in place, as NCCL sends.
    fn send(&mut self, _: usize, _: Tag, _: &[&Counted]) -> Result<()> {
        Ok(())
    }

    fn recv(&mut self, from: usize, _: Tag) -> Result<Vec<Counted>> {
        bail!("the counting communicator receives only posted groups, not one from worker {from}")
    }

    fn post(&mut self, _: &[Outgoing<'_, Counted>], recvs: Vec<Incoming>) -> Result<Posted> {
        Ok(Posted { recvs, ticket: 0 })
    }

    /// Each receive's buffers, of the precision its parts name (inputs 16-bit).
    fn wait(&mut self, posted: Posted) -> Result<Vec<Vec<Counted>>> {
        let recv = |r: &Incoming| {
            let part = |p: &crate::shape::Part| {
                counted(self.lengths, p.len, p.precision == Precision::F32, "recv")
            };
            r.parts.iter().map(part).collect()
        };
        Ok(posted.recvs.iter().map(recv).collect())
    }

    /// In place, as NCCL's.
    fn all_reduce_sum(&mut self, _: &mut Counted) -> Result<()> {
        Ok(())
    }

    /// NCCL's: the piece copied into a padded slot, every rank's slot gathered into one
    /// buffer, each piece cut out of it as a tensor of its own; the piece and both buffers
    /// are alive when the last piece is cut.
    fn all_gather(&mut self, piece: Counted, len: usize) -> Result<Vec<Counted>> {
        let spans = shard_spans(len, self.world);
        check_len(
            "an all-gather's piece",
            piece.inner.len,
            spans[self.rank].len,
        )?;
        let (elem, slot) = (piece.inner.elem, spans[0].len);
        let pieces = spans
            .iter()
            .map(|s| like(&piece, s.len, "all_gather"))
            .collect();
        self.lengths
            .counter()
            .spike((1 + self.world) * slot * elem, "all_gather");
        Ok(pieces)
    }

    /// NCCL's: the pieces copied into one buffer of padded slots, reduced into a slot of this
    /// rank's, its piece cut out of that; the pieces and both buffers alive then.
    fn reduce_scatter_sum(&mut self, pieces: Vec<Counted>) -> Result<Counted> {
        let len = pieces.iter().map(|p| p.inner.len).sum();
        let spans = shard_spans(len, self.world);
        let lens: Vec<usize> = pieces.iter().map(|p| p.inner.len).collect();
        if lens != spans.iter().map(|s| s.len).collect::<Vec<_>>() {
            bail!("reduce-scatter: pieces of {lens:?} are not the shard rule's of {len} elements");
        }
        let slot = spans[0].len;
        let mine = counted(self.lengths, spans[self.rank].len, true, "reduce_scatter");
        let elem = mine.inner.elem;
        self.lengths
            .counter()
            .spike((1 + self.world) * slot * elem, "reduce_scatter");
        Ok(mine)
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }

    fn abort(&mut self, _: &str) {}

    fn bytes_sent(&self) -> u64 {
        0
    }
}

/// The counting device as a job's device: its ops (the model's primitives) and its block API
/// counted in one counter, modelling the device `Lengths` models.
pub struct CountingDevice<'d> {
    ops: Metered<'d, Lengths>,
    backend: CountingBackend<'d>,
}

impl<'d> CountingDevice<'d> {
    /// `lengths` as a device, and rank `rank` of `world`'s communicator counting on it.
    pub fn new(lengths: &'d Lengths, rank: usize, world: usize) -> (Self, CountingComm<'d>) {
        let comm = CountingComm {
            rank,
            world,
            lengths,
        };
        let device = CountingDevice {
            ops: lengths.metered(),
            backend: CountingBackend { lengths },
        };
        (device, comm)
    }
}

impl<'d> ModelDevice for CountingDevice<'d> {
    type Tensor = Counted;
    type Ops = Metered<'d, Lengths>;
    type Backend = CountingBackend<'d>;
    type Whole<'a>
        = NoFastPath
    where
        Self: 'a;

    fn ops(&self) -> &Metered<'d, Lengths> {
        &self.ops
    }

    fn backend(&self) -> &CountingBackend<'d> {
        &self.backend
    }

    /// A rank runs the executor, as every rank of a run over several GPUs does.
    fn whole_sequence(&self, _: Dims, _: usize) -> Result<Option<NoFastPath>> {
        Ok(None)
    }
}
