//! Runs a plan for one worker: forward and backward of distributed causal attention on any
//! backend over any communicator.
//!
//! Prefetch: at the start of step t a worker sends everything it owns that others need at step
//! t + 1, then computes step t, then returns results and collects what was returned to it. The
//! inputs of step t + 1 therefore travel while step t computes; only returned partials wait for
//! the compute that makes them.

mod driver;
mod local;

pub use driver::{
    AttentionRun, WorkerReport, run_attention, run_attention_alone, run_attention_rank,
};
pub use local::{collect_results, run_workers};

use crate::attn::{Block, Dims, Grads, Partial, QuerySide, Span};
use crate::backend::Backend;
use crate::comm::{Communicator, Tag, Wire};
use crate::plan::{Pass, Payload, Plan, Role, Transfer};
use anyhow::{Context as _, Result, bail};
use std::time::{Duration, Instant};

/// Rows of each chunk in the sequence, from the chunk sizes.
pub fn chunk_spans(sizes: &[usize]) -> Vec<Span> {
    sizes
        .iter()
        .scan(0, |start, &len| {
            let span = Span { start: *start, len };
            *start += len;
            Some(span)
        })
        .collect()
}

/// What one worker needs to run a plan: the device, its endpoint, the problem's shape, the row
/// spans of every chunk, and its rank.
pub struct Worker<'a, B, C> {
    pub backend: &'a B,
    pub comm: &'a mut C,
    pub dims: Dims,
    pub spans: &'a [Span],
    /// Time spent in block math (forward or backward), for busy fractions.
    pub compute: Duration,
}

/// A worker's own chunk: Q (`[b, h, n, d]`), K and V (`[b, hkv, n, d]`), head-major.
pub struct OwnChunk<T> {
    pub q: T,
    pub k: T,
    pub v: T,
}

/// The tag of a message: pass, step and payload identify it uniquely between two workers.
fn tag(pass: Pass, step: usize, payload: Payload) -> Tag {
    let pass = match pass {
        Pass::Forward => 0,
        Pass::Backward => 1,
    };
    Tag((pass << 40) | ((step as u64) << 8) | payload.index())
}

impl<'a, B: Backend, C: Communicator<B::Tensor>> Worker<'a, B, C>
where
    B::Tensor: Wire,
{
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn block(&self, q_chunk: usize, kv_chunk: usize) -> Block {
        Block {
            q: self.spans[q_chunk],
            kv: self.spans[kv_chunk],
        }
    }

    fn timed<R>(&mut self, f: impl FnOnce(&B) -> Result<R>) -> Result<R> {
        let start = Instant::now();
        let r = f(self.backend);
        self.compute += start.elapsed();
        r
    }

    /// Sends this worker's tensors for the fetches of `step` (if the plan has that step).
    fn send_fetches(
        &mut self,
        plan: &Plan,
        step: usize,
        owned: impl Fn(Payload) -> Vec<&'a B::Tensor>,
    ) -> Result<()>
    where
        B::Tensor: 'a,
    {
        let Some(s) = plan.steps.get(step) else {
            return Ok(());
        };
        let mine: Vec<Transfer> = s
            .fetches
            .iter()
            .copied()
            .filter(|t| t.from == self.rank())
            .collect();
        for t in mine {
            self.comm
                .send(t.to, tag(plan.pass, step, t.payload), &owned(t.payload))?;
        }
        Ok(())
    }

    fn recv(
        &mut self,
        plan: &Plan,
        step: usize,
        from: usize,
        payload: Payload,
        expect: usize,
    ) -> Result<Vec<B::Tensor>> {
        let parts = self
            .comm
            .recv(from, tag(plan.pass, step, payload))
            .with_context(|| format!("worker {} at {:?} step {step}", self.rank(), plan.pass))?;
        if parts.len() != expect {
            bail!(
                "worker {} expected {expect} tensors of {payload:?} from worker {from} at step {step}, got {}",
                self.rank(),
                parts.len()
            );
        }
        Ok(parts)
    }

    /// Forward of this worker's query chunk: returns its final (O, LSE).
    pub fn forward(
        &mut self,
        plan: &Plan,
        own: &'a OwnChunk<B::Tensor>,
    ) -> Result<Partial<B::Tensor>> {
        let me = self.rank();
        let dims = self.dims;
        let rows = self.spans[me].len;
        let mut state = self.backend.new_state(&dims, rows)?;
        let mut partials = Vec::new();
        let owned = |p: Payload| match p {
            Payload::KeyValue => vec![&own.k, &own.v],
            _ => vec![&own.q],
        };
        self.send_fetches(plan, 0, owned)?;
        for (t, step) in plan.steps.iter().enumerate() {
            self.send_fetches(plan, t + 1, owned)?;
            if let Some(task) = step.task_of(me) {
                let block = self.block(task.q_chunk, task.kv_chunk);
                match task.role() {
                    Role::Diagonal => self.timed(|b| {
                        b.forward_block(&dims, block, &own.q, &own.k, &own.v, &mut state)
                    })?,
                    Role::Owner => {
                        let kv = self.recv(plan, t, task.kv_chunk, Payload::KeyValue, 2)?;
                        self.timed(|b| {
                            b.forward_block(&dims, block, &own.q, &kv[0], &kv[1], &mut state)
                        })?;
                    }
                    Role::Helper => {
                        let q = self.recv(plan, t, task.q_chunk, Payload::Query, 1)?;
                        let n = block.q.len;
                        let partial = self.timed(|b| {
                            let mut s = b.new_state(&dims, n)?;
                            b.forward_block(&dims, block, &q[0], &own.k, &own.v, &mut s)?;
                            b.finalize(&dims, n, s)
                        })?;
                        self.comm.send(
                            task.q_chunk,
                            tag(plan.pass, t, Payload::PartialOut),
                            &[&partial.out, &partial.lse],
                        )?;
                    }
                }
            }
            for ret in step.returns.iter().filter(|r| r.to == me) {
                let mut parts = self.recv(plan, t, ret.from, Payload::PartialOut, 2)?;
                let lse = parts.pop().expect("two parts");
                let out = parts.pop().expect("two parts");
                partials.push(Partial { out, lse });
            }
        }
        let mut result = self.timed(|b| b.finalize(&dims, rows, state))?;
        for p in &partials {
            self.timed(|b| b.merge(&dims, rows, &mut result, p))?;
        }
        Ok(result)
    }

    /// Backward of this worker's chunks from its final O, LSE and dO: returns dQ for its query
    /// rows and dK, dV for its key/value rows, summed over every block that used them.
    pub fn backward(
        &mut self,
        plan: &Plan,
        own: &'a OwnChunk<B::Tensor>,
        saved: &'a Saved<B::Tensor>,
    ) -> Result<Grads<B::Tensor>> {
        let me = self.rank();
        let dims = self.dims;
        let rows = self.spans[me].len;
        let owned = |p: Payload| match p {
            Payload::KeyValue => vec![&own.k, &own.v],
            _ => vec![&own.q, &saved.dout, &saved.lse, &saved.delta],
        };
        let mut dq = self.backend.zeros(dims.q_len(rows))?;
        let mut dk = self.backend.zeros(dims.kv_len(rows))?;
        let mut dv = self.backend.zeros(dims.kv_len(rows))?;
        let query = QuerySide {
            q: &own.q,
            dout: &saved.dout,
            lse: &saved.lse,
            delta: &saved.delta,
        };
        self.send_fetches(plan, 0, owned)?;
        for (t, step) in plan.steps.iter().enumerate() {
            self.send_fetches(plan, t + 1, owned)?;
            if let Some(task) = step.task_of(me) {
                let block = self.block(task.q_chunk, task.kv_chunk);
                match task.role() {
                    Role::Diagonal => {
                        let mut g = Grads { dq, dk, dv };
                        self.timed(|b| {
                            b.backward_block(&dims, block, query, &own.k, &own.v, &mut g)
                        })?;
                        Grads { dq, dk, dv } = g;
                    }
                    Role::Owner => {
                        let kv = self.recv(plan, t, task.kv_chunk, Payload::KeyValue, 2)?;
                        let n = block.kv.len;
                        let mut g = Grads {
                            dq,
                            dk: self.backend.zeros(dims.kv_len(n))?,
                            dv: self.backend.zeros(dims.kv_len(n))?,
                        };
                        self.timed(|b| {
                            b.backward_block(&dims, block, query, &kv[0], &kv[1], &mut g)
                        })?;
                        dq = g.dq;
                        self.comm.send(
                            task.kv_chunk,
                            tag(plan.pass, t, Payload::KvGrad),
                            &[&g.dk, &g.dv],
                        )?;
                    }
                    Role::Helper => {
                        let inputs =
                            self.recv(plan, t, task.q_chunk, Payload::QueryGradInputs, 4)?;
                        let remote = QuerySide {
                            q: &inputs[0],
                            dout: &inputs[1],
                            lse: &inputs[2],
                            delta: &inputs[3],
                        };
                        let mut g = Grads {
                            dq: self.backend.zeros(dims.q_len(block.q.len))?,
                            dk,
                            dv,
                        };
                        self.timed(|b| {
                            b.backward_block(&dims, block, remote, &own.k, &own.v, &mut g)
                        })?;
                        (dk, dv) = (g.dk, g.dv);
                        self.comm.send(
                            task.q_chunk,
                            tag(plan.pass, t, Payload::QueryGrad),
                            &[&g.dq],
                        )?;
                    }
                }
            }
            for ret in step.returns.iter().filter(|r| r.to == me) {
                match ret.payload {
                    Payload::KvGrad => {
                        let parts = self.recv(plan, t, ret.from, Payload::KvGrad, 2)?;
                        self.timed(|b| {
                            b.add_assign(&mut dk, &parts[0])?;
                            b.add_assign(&mut dv, &parts[1])
                        })?;
                    }
                    _ => {
                        let parts = self.recv(plan, t, ret.from, Payload::QueryGrad, 1)?;
                        self.timed(|b| b.add_assign(&mut dq, &parts[0]))?;
                    }
                }
            }
        }
        Ok(Grads { dq, dk, dv })
    }
}

/// What the forward leaves for the backward of one worker's query rows: dO from the layer above,
/// and LSE and D = rowsum(dO ∘ O) (O itself is not needed once D is known).
pub struct Saved<T> {
    pub dout: T,
    pub lse: T,
    pub delta: T,
}
