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
use anyhow::{Context, Result};
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
}

/// distflash on `backend` over `comm`: this worker owns one chunk, rows `spans[rank]` (the
/// `balanced` and `unbalanced` schedules; `train` refuses `zigzag`, whose two chunks per worker
/// are not one run of positions).
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
        let world = spans.len();
        Ok(Distributed {
            backend,
            comm,
            dims,
            spans,
            forward: Plan::new(world, schedule, Pass::Forward)?,
            backward: Plan::new(world, schedule, Pass::Backward)?,
        })
    }

    fn rows(&self) -> usize {
        self.spans[self.comm.rank()].len
    }

    fn head_major(&self, t: &B::Tensor, heads: usize, what: &str) -> Result<B::Tensor> {
        let (rows, d) = (self.rows(), self.dims.head_dim);
        ModelEdge::relayout(self.backend, t, rows, heads, d, Order::ToHeadMajor, what)
    }

    fn seq_major(&self, t: &B::Tensor, heads: usize, what: &str) -> Result<B::Tensor> {
        let (rows, d) = (self.rows(), self.dims.head_dim);
        ModelEdge::relayout(self.backend, t, rows, heads, d, Order::ToSeqMajor, what)
    }

    fn own(&self, q: &B::Tensor, k: &B::Tensor, v: &B::Tensor) -> Result<OwnChunk<B::Tensor>> {
        let (h, hk) = (self.dims.heads, self.dims.kv_heads);
        Ok(OwnChunk {
            q: self.head_major(q, h, "Q")?,
            k: self.head_major(k, hk, "K")?,
            v: self.head_major(v, hk, "V")?,
        })
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
        let p = worker(self.backend, self.comm, self.dims, &self.spans)
            .forward(&self.forward, std::slice::from_ref(&own))?
            .pop()
            .context("the executor returned no result for this worker's chunk")?;
        Ok((self.seq_major(&p.out, self.dims.heads, "O")?, p.lse))
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
        let dout = self.head_major(dout, h, "dO")?;
        let o = self.head_major(o, h, "O")?;
        let saved = Saved {
            delta: self.backend.delta(&self.dims, self.rows(), &o, &dout)?,
            dout,
            lse: lse.duplicate()?,
        };
        let g = worker(self.backend, self.comm, self.dims, &self.spans)
            .backward(
                &self.backward,
                std::slice::from_ref(&own),
                std::slice::from_ref(&saved),
            )?
            .pop()
            .context("the executor returned no gradients for this worker's chunk")?;
        let hk = self.dims.kv_heads;
        Ok((
            self.seq_major(&g.dq, h, "dQ")?,
            self.seq_major(&g.dk, hk, "dK")?,
            self.seq_major(&g.dv, hk, "dV")?,
        ))
    }
}
