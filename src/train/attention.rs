//! distflash as the model's attention: this worker's rows against the whole sequence so far,
//! through the executor on any backend and communicator (CPU threads or processes; GPUs over
//! NCCL, or virtual workers sharing one GPU). The model hands over sequence-major tensors; the
//! executor wants head-major ones, so they are converted at this edge, by the backend
//! ([`ModelEdge`]): on the host for the CPU, by a GPU kernel for CUDA.

use crate::attn::{Dims, Span, layout};
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Order, Tensor};
use crate::comm::{Buffer, Communicator, LocalComm, Wire};
use crate::exec::{OwnChunk, Saved, Worker};
use crate::model::attention::Attention;
use crate::plan::{Pass, Plan, Schedule};
use anyhow::{Result, bail};
use std::time::Duration;

/// A backend whose tensors the model holds too: the layout change at the model's edge,
/// `[rows, heads, d]` ↔ `[heads, rows, d]` as `to` says. To head-major the result is in the
/// precision the executor reads, to sequence-major in the one the model keeps activations in.
/// `what` names the tensor in errors.
pub trait ModelEdge: Backend {
    fn relayout(
        &self,
        t: &Self::Tensor,
        rows: usize,
        heads: usize,
        d: usize,
        to: Order,
        what: &str,
    ) -> Result<Self::Tensor>;

    /// `t` cut into consecutive parts of `lens` elements.
    fn split(&self, t: &Self::Tensor, lens: &[usize]) -> Result<Vec<Self::Tensor>>;

    /// `parts` one after another.
    fn join(&self, parts: &[Self::Tensor]) -> Result<Self::Tensor>;
}

impl ModelEdge for CpuBackend {
    fn relayout(
        &self,
        t: &Vec<f32>,
        rows: usize,
        heads: usize,
        d: usize,
        to: Order,
        _: &str,
    ) -> Result<Vec<f32>> {
        Ok(match to {
            Order::ToHeadMajor => layout::to_head_major(t, 1, rows, heads, d),
            Order::ToSeqMajor => layout::to_seq_major(t, 1, rows, heads, d),
        })
    }

    fn split(&self, t: &Vec<f32>, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
        if lens.iter().sum::<usize>() != t.len() {
            bail!(
                "cannot cut a tensor of {} elements into parts of {lens:?}",
                t.len()
            );
        }
        let mut rest = t.as_slice();
        Ok(lens
            .iter()
            .map(|&len| {
                let (part, tail) = rest.split_at(len);
                rest = tail;
                part.to_vec()
            })
            .collect())
    }

    fn join(&self, parts: &[Vec<f32>]) -> Result<Vec<f32>> {
        Ok(parts.concat())
    }
}

/// On the GPU both directions produce 16-bit tensors: the executor's inputs, and the model's
/// activations (f32 results of the block API are rounded in the same pass).
impl ModelEdge for CudaBackend {
    fn relayout(
        &self,
        t: &Tensor,
        rows: usize,
        heads: usize,
        d: usize,
        to: Order,
        what: &str,
    ) -> Result<Tensor> {
        CudaBackend::relayout(self, t, rows, heads, d, to, what)
    }

    fn split(&self, t: &Tensor, lens: &[usize]) -> Result<Vec<Tensor>> {
        CudaBackend::split(self, t, lens)
    }

    fn join(&self, parts: &[Tensor]) -> Result<Tensor> {
        CudaBackend::join(self, parts)
    }
}

/// distflash on `backend` over `comm`: `spans` are the chunks of the sequence (one per worker
/// for `balanced` and `unbalanced`, two for `zigzag`); the model's tensors hold this worker's
/// chunks one after another, in sequence order.
pub struct Distributed<'c, B = CpuBackend, C = LocalComm> {
    pub backend: &'c B,
    pub comm: &'c mut C,
    pub dims: Dims,
    pub spans: Vec<Span>,
    forward: Plan,
    backward: Plan,
}

impl<'c, B: ModelEdge, C: Communicator<B::Tensor>> Distributed<'c, B, C>
where
    B::Tensor: Wire,
{
    pub fn new(
        backend: &'c B,
        comm: &'c mut C,
        dims: Dims,
        spans: Vec<Span>,
        schedule: Schedule,
    ) -> Result<Self> {
        let world = comm.world();
        if spans.len() != schedule.chunks(world) {
            bail!(
                "{} spans given for {world} workers, but the {schedule} schedule cuts the sequence into {}",
                spans.len(),
                schedule.chunks(world)
            );
        }
        Ok(Distributed {
            backend,
            comm,
            dims,
            spans,
            forward: Plan::new(world, schedule, Pass::Forward)?,
            backward: Plan::new(world, schedule, Pass::Backward)?,
        })
    }

    /// Rows of each chunk this worker owns, in sequence order (one chunk; a zigzag worker's
    /// head and tail). The model holds them as one tensor, chunk after chunk.
    fn chunk_rows(&self) -> Vec<usize> {
        self.forward
            .chunks_of(self.comm.rank())
            .into_iter()
            .map(|c| self.spans[c].len)
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

/// The executor for one attention call on this worker's endpoint.
fn worker<'a, B: Backend, C: Communicator<B::Tensor>>(
    backend: &'a B,
    comm: &'a mut C,
    dims: Dims,
    spans: &'a [Span],
) -> Worker<'a, B, C>
where
    B::Tensor: Wire,
{
    Worker {
        backend,
        comm,
        dims,
        spans,
        compute: Duration::ZERO,
        overlap: true,
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
        let partials =
            worker(self.backend, self.comm, self.dims, &self.spans).forward(&self.forward, &own)?;
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
        let grads = worker(self.backend, self.comm, self.dims, &self.spans).backward(
            &self.backward,
            &own,
            &saved,
        )?;
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
