//! distflash as the model's attention: this worker's rows against the whole sequence so far,
//! through the executor on any backend and communicator (CPU threads or processes; GPUs over
//! NCCL, or virtual workers sharing one GPU). The model hands over sequence-major tensors; the
//! executor wants head-major ones, so they are converted at this edge, by the backend
//! (`backend::ModelEdge`): on the host for the CPU, by a GPU kernel for CUDA.

use crate::backend::cpu::CpuBackend;
use crate::backend::{ModelEdge, Order};
use crate::comm::{Buffer, Communicator, LocalComm, Wire};
use crate::exec::{OwnChunk, Saved, Worker};
use crate::model::attention_api::{Attention, WholeSequence};
use crate::plan::{Partition, Pass};
use crate::runtime::ModelDevice;
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};

/// distflash on `backend` over `comm`: `partition` cuts the sequence into chunks (one per
/// worker for `balanced` and `unbalanced`, two for `zigzag`); the model's tensors hold this
/// worker's chunks one after another, in sequence order. Its plans (the mask's) may change
/// between sequences ([`Distributed::set_partition`]); its chunks may not.
pub struct Distributed<'c, B = CpuBackend, C = LocalComm> {
    pub backend: &'c B,
    pub comm: &'c mut C,
    pub dims: Dims,
    /// Boxed: a plan is large beside the whole-sequence path (`ModelAttention`'s other arm).
    partition: Box<Partition>,
}

impl<'c, B: ModelEdge, C: Communicator<B::Tensor>> Distributed<'c, B, C>
where
    B::Tensor: Wire,
{
    pub fn new(
        backend: &'c B,
        comm: &'c mut C,
        dims: Dims,
        partition: &'c Partition,
    ) -> Result<Self> {
        let world = comm.world();
        if partition.workers() != world {
            bail!(
                "the sequence is partitioned for {} workers, but this job has {world}",
                partition.workers()
            );
        }
        Ok(Distributed {
            backend,
            comm,
            dims,
            partition: Box::new(partition.clone()),
        })
    }

    /// Plans the next sequences' attention under `mask` (their documents, the model's window),
    /// on the same communicator and over the same chunks, so the model's rows stay this
    /// worker's. Sequences of one mask share their plans: an unchanged mask plans nothing.
    pub fn set_mask(&mut self, mask: &Mask) -> Result<()> {
        let p = &self.partition;
        if p.mask() != mask {
            *self.partition = Partition::masked(p.seq(), p.workers(), p.schedule(), mask)?;
        }
        Ok(())
    }

    /// Rows of each chunk this worker owns, in sequence order (one chunk; a zigzag worker's
    /// head and tail). The model holds them as one tensor, chunk after chunk.
    fn chunk_rows(&self) -> Vec<usize> {
        self.partition
            .own_spans(self.comm.rank())
            .iter()
            .map(|s| s.len)
            .collect()
    }

    /// Element counts of the own chunks in a tensor of `per_row` elements a row.
    fn chunk_lens(&self, per_row: usize) -> Vec<usize> {
        self.chunk_rows().iter().map(|r| r * per_row).collect()
    }

    /// The model's sequence-major `t` as one head-major tensor per own chunk.
    fn head_major(&self, t: &B::Tensor, heads: usize, what: &str) -> Result<Vec<B::Tensor>> {
        let (d, rows) = (self.dims.head_dim, self.chunk_rows());
        let relayout = |part: &B::Tensor, rows: usize| {
            ModelEdge::relayout(self.backend, part, rows, heads, d, Order::ToHeadMajor, what)
        };
        if let [rows] = rows[..] {
            return Ok(vec![relayout(t, rows)?]);
        }
        self.backend
            .split(t, &self.chunk_lens(heads * d))?
            .iter()
            .zip(rows)
            .map(|(part, rows)| relayout(part, rows))
            .collect()
    }

    /// Head-major tensors of the own chunks as the model's one sequence-major tensor.
    fn seq_major(&self, parts: &[B::Tensor], heads: usize, what: &str) -> Result<B::Tensor> {
        let d = self.dims.head_dim;
        let mut seq = parts
            .iter()
            .zip(self.chunk_rows())
            .map(|(part, rows)| {
                ModelEdge::relayout(self.backend, part, rows, heads, d, Order::ToSeqMajor, what)
            })
            .collect::<Result<Vec<_>>>()?;
        match seq.len() {
            1 => Ok(seq.pop().expect("one part")),
            _ => self.backend.join(&seq),
        }
    }

    fn own(&self, q: &B::Tensor, k: &B::Tensor, v: &B::Tensor) -> Result<Vec<OwnChunk<B::Tensor>>> {
        let (h, hk) = (self.dims.heads, self.dims.kv_heads);
        let (q, k, v) = (
            self.head_major(q, h, "Q")?,
            self.head_major(k, hk, "K")?,
            self.head_major(v, hk, "V")?,
        );
        Ok(q.into_iter()
            .zip(k)
            .zip(v)
            .map(|((q, k), v)| OwnChunk { q, k, v })
            .collect())
    }
}

impl<B: ModelEdge, C: Communicator<B::Tensor>> Attention<B::Tensor> for Distributed<'_, B, C>
where
    B::Tensor: Buffer,
{
    fn forward(
        &mut self,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor)> {
        let own = self.own(q, k, v)?;
        let partials = Worker::new(self.backend, self.comm, self.dims, self.partition.spans())
            .forward(self.partition.plan(Pass::Forward), &own)?;
        if partials.len() != own.len() {
            bail!(
                "the executor returned {} results for this worker's {} chunks",
                partials.len(),
                own.len()
            );
        }
        let (outs, lses): (Vec<_>, Vec<_>) = partials.into_iter().map(|p| (p.out, p.lse)).unzip();
        let lse = match lses.len() {
            1 => lses.into_iter().next().expect("one chunk"),
            _ => self.backend.join(&lses)?,
        };
        Ok((self.seq_major(&outs, self.dims.heads, "O")?, lse))
    }

    fn backward(
        &mut self,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        o: &B::Tensor,
        lse: &B::Tensor,
        dout: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let own = self.own(q, k, v)?;
        let h = self.dims.heads;
        let douts = self.head_major(dout, h, "dO")?;
        let os = self.head_major(o, h, "O")?;
        // LSE is head-major per chunk, `heads` values a row, the chunks one after another.
        let lses = match os.len() {
            1 => vec![lse.duplicate()?],
            _ => self.backend.split(lse, &self.chunk_lens(h))?,
        };
        let saved = douts
            .into_iter()
            .zip(&os)
            .zip(lses)
            .zip(self.chunk_rows())
            .map(|(((dout, o), lse), rows)| {
                Ok(Saved {
                    delta: self.backend.delta(&self.dims, rows, o, &dout)?,
                    dout,
                    lse,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let grads = Worker::new(self.backend, self.comm, self.dims, self.partition.spans())
            .backward(self.partition.plan(Pass::Backward), &own, &saved)?;
        if grads.len() != own.len() {
            bail!(
                "the executor returned gradients for {} chunks, not this worker's {}",
                grads.len(),
                own.len()
            );
        }
        let hk = self.dims.kv_heads;
        let (mut dq, mut dk, mut dv) = (Vec::new(), Vec::new(), Vec::new());
        for g in grads {
            dq.push(g.dq);
            dk.push(g.dk);
            dv.push(g.dv);
        }
        Ok((
            self.seq_major(&dq, h, "dQ")?,
            self.seq_major(&dk, hk, "dK")?,
            self.seq_major(&dv, hk, "dV")?,
        ))
    }
}

/// The attention a model job runs on one worker: the device's whole-sequence path when this
/// worker holds the whole sequence and the device has one (one GPU: its fused kernels), distflash
/// through the executor otherwise (several workers, or the CPU's block math).
pub enum ModelAttention<'a, D: ModelDevice + 'a, C> {
    Whole(D::Whole<'a>),
    Distributed(Distributed<'a, D::Backend, C>),
}

impl<'a, D: ModelDevice, C: Communicator<D::Tensor>> ModelAttention<'a, D, C> {
    pub fn new(
        device: &'a D,
        comm: &'a mut C,
        dims: Dims,
        partition: &'a Partition,
    ) -> Result<Self> {
        if comm.world() == 1
            && let Some(mut whole) = device.whole_sequence(dims, partition.seq())?
        {
            whole.set_mask(partition.mask())?;
            return Ok(ModelAttention::Whole(whole));
        }
        let distributed = Distributed::new(device.backend(), comm, dims, partition)?;
        Ok(ModelAttention::Distributed(distributed))
    }

    /// Attention of the next sequences under `mask` (`Distributed::set_mask`), without
    /// re-creating the communicator.
    pub fn set_mask(&mut self, mask: &Mask) -> Result<()> {
        match self {
            ModelAttention::Distributed(d) => d.set_mask(mask),
            ModelAttention::Whole(w) => w.set_mask(mask),
        }
    }

    /// The communicator joining the workers (`None` for the whole sequence on one worker).
    pub(super) fn comm(&mut self) -> Option<&mut C> {
        match self {
            ModelAttention::Whole(_) => None,
            ModelAttention::Distributed(d) => Some(&mut *d.comm),
        }
    }
}

impl<D: ModelDevice, C: Communicator<D::Tensor>> Attention<D::Tensor> for ModelAttention<'_, D, C> {
    fn forward(
        &mut self,
        q: &D::Tensor,
        k: &D::Tensor,
        v: &D::Tensor,
    ) -> Result<(D::Tensor, D::Tensor)> {
        match self {
            ModelAttention::Whole(a) => a.forward(q, k, v),
            ModelAttention::Distributed(a) => a.forward(q, k, v),
        }
    }

    fn backward(
        &mut self,
        q: &D::Tensor,
        k: &D::Tensor,
        v: &D::Tensor,
        o: &D::Tensor,
        lse: &D::Tensor,
        dout: &D::Tensor,
    ) -> Result<(D::Tensor, D::Tensor, D::Tensor)> {
        match self {
            ModelAttention::Whole(a) => a.backward(q, k, v, o, lse, dout),
            ModelAttention::Distributed(a) => a.backward(q, k, v, o, lse, dout),
        }
    }
}
