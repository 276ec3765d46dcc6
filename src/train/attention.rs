//! distflash as the model's attention: this worker's rows against the whole sequence so far,
//! through the executor and any host communicator (threads or processes). The model hands over sequence-major
//! tensors; the executor wants head-major ones, so they are converted at this edge.

use crate::attn::{Dims, Span, layout};
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::comm::{Communicator, LocalComm};
use crate::exec::{OwnChunk, Saved, Worker};
use crate::model::attention::Attention;
use crate::plan::{Pass, Plan, Schedule};
use anyhow::{Context, Result};
use std::time::Duration;

/// distflash over a host communicator: this worker owns one chunk, rows `spans[rank]`
/// (the `balanced` and `unbalanced` schedules; `train` refuses `zigzag`, whose two chunks per
/// worker are not one run of positions).
pub struct Distributed<'c, C = LocalComm> {
    pub comm: &'c mut C,
    pub dims: Dims,
    pub spans: Vec<Span>,
    forward: Plan,
    backward: Plan,
}

impl<'c, C: Communicator<Vec<f32>>> Distributed<'c, C> {
    pub fn new(comm: &'c mut C, dims: Dims, spans: Vec<Span>, schedule: Schedule) -> Result<Self> {
        let world = spans.len();
        Ok(Distributed {
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

    fn head_major(&self, t: &[f32], heads: usize) -> Vec<f32> {
        layout::to_head_major(t, 1, self.rows(), heads, self.dims.head_dim)
    }

    fn seq_major(&self, t: &[f32], heads: usize) -> Vec<f32> {
        layout::to_seq_major(t, 1, self.rows(), heads, self.dims.head_dim)
    }

    fn own(&self, q: &[f32], k: &[f32], v: &[f32]) -> OwnChunk<Vec<f32>> {
        let (h, hk) = (self.dims.heads, self.dims.kv_heads);
        OwnChunk {
            q: self.head_major(q, h),
            k: self.head_major(k, hk),
            v: self.head_major(v, hk),
        }
    }
}

/// The executor for one attention call on this worker's endpoint.
fn worker<'a, C: Communicator<Vec<f32>>>(
    comm: &'a mut C,
    dims: Dims,
    spans: &'a [Span],
) -> Worker<'a, CpuBackend, C> {
    Worker {
        backend: &CpuBackend,
        comm,
        dims,
        spans,
        compute: Duration::ZERO,
        overlap: true,
    }
}

impl<C: Communicator<Vec<f32>>> Attention<Vec<f32>> for Distributed<'_, C> {
    fn forward(
        &mut self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let own = self.own(q, k, v);
        let mut parts = worker(self.comm, self.dims, &self.spans)
            .forward(&self.forward, std::slice::from_ref(&own))?;
        let p = parts
            .pop()
            .context("the executor returned no result for this worker's chunk")?;
        Ok((self.seq_major(&p.out, self.dims.heads), p.lse))
    }

    fn backward(
        &mut self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        o: &Vec<f32>,
        lse: &Vec<f32>,
        dout: &Vec<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let own = self.own(q, k, v);
        let h = self.dims.heads;
        let dout = self.head_major(dout, h);
        let saved = Saved {
            delta: CpuBackend.delta(&self.dims, self.rows(), &self.head_major(o, h), &dout)?,
            dout,
            lse: lse.clone(),
        };
        let g = worker(self.comm, self.dims, &self.spans)
            .backward(
                &self.backward,
                std::slice::from_ref(&own),
                std::slice::from_ref(&saved),
            )?
            .pop()
            .context("the executor returned no gradients for this worker's chunk")?;
        let hk = self.dims.kv_heads;
        Ok((
            self.seq_major(&g.dq, h),
            self.seq_major(&g.dk, hk),
            self.seq_major(&g.dv, hk),
        ))
    }
}
