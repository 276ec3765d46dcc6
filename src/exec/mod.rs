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

use crate::attn::{Block, Dims, Grads, GradsMut, Partial, QuerySide, RunningState, Span};
use crate::backend::Backend;
use crate::comm::{Communicator, Tag, Wire};
use crate::plan::{Pass, Payload, Plan, Role, Task, Transfer};
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
/// spans of every chunk, and the time it has spent computing.
pub struct Worker<'a, B, C> {
    pub backend: &'a B,
    pub comm: &'a mut C,
    pub dims: Dims,
    /// Rows of each chunk of the plan, by chunk index.
    pub spans: &'a [Span],
    /// Time spent in block math (forward or backward), for busy fractions.
    pub compute: Duration,
}

/// One chunk a worker owns: Q (`[b, h, n, d]`), K and V (`[b, hkv, n, d]`), head-major.
pub struct OwnChunk<T> {
    pub q: T,
    pub k: T,
    pub v: T,
}

/// What the forward leaves for the backward of one chunk's query rows: dO from the layer above,
/// and LSE and D = rowsum(dO ∘ O) (O itself is not needed once D is known).
pub struct Saved<T> {
    pub dout: T,
    pub lse: T,
    pub delta: T,
}

/// The tag of a message: pass, step, chunk and payload identify it uniquely between two workers.
fn tag(pass: Pass, step: usize, chunk: usize, payload: Payload) -> Tag {
    let pass = match pass {
        Pass::Forward => 0,
        Pass::Backward => 1,
    };
    Tag((pass << 40) | ((step as u64) << 20) | ((chunk as u64) << 4) | payload.index())
}

/// Tensors received this step, by the chunk they belong to.
struct Received<T>(PerChunk<Vec<T>>);

impl<T> Received<T> {
    fn get(&self, chunk: usize) -> &[T] {
        let (_, parts) = self
            .0
            .iter()
            .find(|(c, _)| *c == chunk)
            .expect("the plan fetches every remote operand of a task in the same step");
        parts
    }
}

/// Values keyed by chunk index; a step touches only a few chunks, so a list beats a map.
type PerChunk<T> = Vec<(usize, T)>;

/// Per-chunk scratch created on first use within a step (a helper's running state, an owner's
/// dK/dV for fetched K/V).
fn slot<T>(
    list: &mut PerChunk<T>,
    chunk: usize,
    make: impl FnOnce() -> Result<T>,
) -> Result<&mut T> {
    let i = match list.iter().position(|(c, _)| *c == chunk) {
        Some(i) => i,
        None => {
            list.push((chunk, make()?));
            list.len() - 1
        }
    };
    Ok(&mut list[i].1)
}

fn take<T>(list: &mut PerChunk<T>, chunk: usize) -> T {
    let i = list
        .iter()
        .position(|(c, _)| *c == chunk)
        .expect("the plan returns only results a task of this step produced");
    list.swap_remove(i).1
}

impl<'a, B: Backend, C: Communicator<B::Tensor>> Worker<'a, B, C>
where
    B::Tensor: Wire,
{
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn block(&self, task: &Task) -> Block {
        Block {
            q: self.spans[task.q_chunk],
            kv: self.spans[task.kv_chunk],
        }
    }

    fn timed<R>(&mut self, f: impl FnOnce(&B) -> Result<R>) -> Result<R> {
        let start = Instant::now();
        let r = f(self.backend);
        self.compute += start.elapsed();
        r
    }

    /// Sends this worker's tensors for the fetches of `step` (if the plan has that step);
    /// `owned(payload, chunk)` lists them.
    fn send_fetches(
        &mut self,
        plan: &Plan,
        step: usize,
        owned: impl Fn(Payload, usize) -> Vec<&'a B::Tensor>,
    ) -> Result<()>
    where
        B::Tensor: 'a,
    {
        let Some(s) = plan.steps.get(step) else {
            return Ok(());
        };
        let me = self.rank();
        for t in s.fetches.iter().filter(|t| t.from == me) {
            let parts = owned(t.payload, t.chunk);
            self.comm
                .send(t.to, tag(plan.pass, step, t.chunk, t.payload), &parts)?;
        }
        Ok(())
    }

    fn recv(
        &mut self,
        plan: &Plan,
        step: usize,
        t: &Transfer,
        expect: usize,
    ) -> Result<Vec<B::Tensor>> {
        let parts = self
            .comm
            .recv(t.from, tag(plan.pass, step, t.chunk, t.payload))
            .with_context(|| format!("worker {} at {:?} step {step}", self.rank(), plan.pass))?;
        if parts.len() != expect {
            bail!(
                "worker {} expected {expect} tensors of {:?} from worker {} at step {step}, got {}",
                self.rank(),
                t.payload,
                t.from,
                parts.len()
            );
        }
        Ok(parts)
    }

    /// Receives the inputs fetched for this step's tasks.
    fn recv_fetches(&mut self, plan: &Plan, step: usize) -> Result<Received<B::Tensor>> {
        let me = self.rank();
        let mut got = Vec::new();
        for t in plan.steps[step].fetches.iter().filter(|t| t.to == me) {
            let expect = match t.payload {
                Payload::KeyValue => 2,
                Payload::QueryGradInputs => 4,
                _ => 1,
            };
            got.push((t.chunk, self.recv(plan, step, t, expect)?));
        }
        Ok(Received(got))
    }

    /// Forward of this worker's query chunks (`own`, in `plan.chunks_of` order): returns their
    /// final (O, LSE), in the same order.
    pub fn forward(
        &mut self,
        plan: &Plan,
        own: &'a [OwnChunk<B::Tensor>],
    ) -> Result<Vec<Partial<B::Tensor>>> {
        let me = self.rank();
        let dims = self.dims;
        let mine = plan.chunks_of(me);
        let at = |c: usize| mine.iter().position(|&m| m == c).expect("own chunk");
        let mut states = mine
            .iter()
            .map(|&c| self.backend.new_state(&dims, self.spans[c].len))
            .collect::<Result<Vec<_>>>()?;
        let mut returned: Vec<Vec<Partial<B::Tensor>>> = mine.iter().map(|_| Vec::new()).collect();
        let owned = |p: Payload, c: usize| match p {
            Payload::KeyValue => vec![&own[at(c)].k, &own[at(c)].v],
            _ => vec![&own[at(c)].q],
        };
        self.send_fetches(plan, 0, owned)?;
        for (t, step) in plan.steps.iter().enumerate() {
            self.send_fetches(plan, t + 1, owned)?;
            let fetched = self.recv_fetches(plan, t)?;
            let mut helping: PerChunk<RunningState<B::Tensor>> = Vec::new();
            for task in step.tasks_of(me) {
                let block = self.block(&task);
                let (i, j) = (task.q_chunk, task.kv_chunk);
                match plan.role(&task) {
                    Role::Local => {
                        let (q, kv) = (&own[at(i)], &own[at(j)]);
                        let state = &mut states[at(i)];
                        self.timed(|b| b.forward_block(&dims, block, &q.q, &kv.k, &kv.v, state))?;
                    }
                    Role::Owner => {
                        let kv = fetched.get(j);
                        let state = &mut states[at(i)];
                        self.timed(|b| {
                            b.forward_block(&dims, block, &own[at(i)].q, &kv[0], &kv[1], state)
                        })?;
                    }
                    Role::Helper => {
                        let q = &fetched.get(i)[0];
                        let backend = self.backend;
                        let state =
                            slot(&mut helping, i, || backend.new_state(&dims, block.q.len))?;
                        let kv = &own[at(j)];
                        self.timed(|b| b.forward_block(&dims, block, q, &kv.k, &kv.v, state))?;
                    }
                }
            }
            for r in step.returns.iter().filter(|r| r.from == me) {
                let state = take(&mut helping, r.chunk);
                let rows = self.spans[r.chunk].len;
                let partial = self.timed(|b| b.finalize(&dims, rows, state))?;
                let tag = tag(plan.pass, t, r.chunk, r.payload);
                self.comm.send(r.to, tag, &[&partial.out, &partial.lse])?;
            }
            for r in step.returns.iter().filter(|r| r.to == me) {
                let mut parts = self.recv(plan, t, r, 2)?;
                let lse = parts.pop().expect("two parts");
                let out = parts.pop().expect("two parts");
                returned[at(r.chunk)].push(Partial { out, lse });
            }
        }
        let mut results = Vec::with_capacity(mine.len());
        for ((&c, state), partials) in mine.iter().zip(states).zip(&returned) {
            let rows = self.spans[c].len;
            let mut result = self.timed(|b| b.finalize(&dims, rows, state))?;
            for p in partials {
                self.timed(|b| b.merge(&dims, rows, &mut result, p))?;
            }
            results.push(result);
        }
        Ok(results)
    }

    /// Backward of this worker's chunks from their final LSE, D and dO (`saved`, in
    /// `plan.chunks_of` order): returns dQ for its query rows and dK, dV for its key/value rows,
    /// summed over every block that used them, in the same order.
    pub fn backward(
        &mut self,
        plan: &Plan,
        own: &'a [OwnChunk<B::Tensor>],
        saved: &'a [Saved<B::Tensor>],
    ) -> Result<Vec<Grads<B::Tensor>>> {
        let me = self.rank();
        let dims = self.dims;
        let mine = plan.chunks_of(me);
        let at = |c: usize| mine.iter().position(|&m| m == c).expect("own chunk");
        let owned = |p: Payload, c: usize| match p {
            Payload::KeyValue => vec![&own[at(c)].k, &own[at(c)].v],
            _ => {
                let s = &saved[at(c)];
                vec![&own[at(c)].q, &s.dout, &s.lse, &s.delta]
            }
        };
        let zeros = |len: usize| self.backend.zeros(len);
        let rows = |c: usize| self.spans[c].len;
        let mut dq = mine
            .iter()
            .map(|&c| zeros(dims.q_len(rows(c))))
            .collect::<Result<Vec<_>>>()?;
        let mut dk = mine
            .iter()
            .map(|&c| zeros(dims.kv_len(rows(c))))
            .collect::<Result<Vec<_>>>()?;
        let mut dv = mine
            .iter()
            .map(|&c| zeros(dims.kv_len(rows(c))))
            .collect::<Result<Vec<_>>>()?;
        let query_side = |c: usize| QuerySide {
            q: &own[at(c)].q,
            dout: &saved[at(c)].dout,
            lse: &saved[at(c)].lse,
            delta: &saved[at(c)].delta,
        };
        self.send_fetches(plan, 0, owned)?;
        for (t, step) in plan.steps.iter().enumerate() {
            self.send_fetches(plan, t + 1, owned)?;
            let fetched = self.recv_fetches(plan, t)?;
            let mut kv_grads: PerChunk<(B::Tensor, B::Tensor)> = Vec::new();
            let mut q_grads: PerChunk<B::Tensor> = Vec::new();
            for task in step.tasks_of(me) {
                let block = self.block(&task);
                let (i, j) = (task.q_chunk, task.kv_chunk);
                let backend = self.backend;
                match plan.role(&task) {
                    Role::Local => {
                        let kv = &own[at(j)];
                        let g = GradsMut {
                            dq: &mut dq[at(i)],
                            dk: &mut dk[at(j)],
                            dv: &mut dv[at(j)],
                        };
                        self.timed(|b| {
                            b.backward_block(&dims, block, query_side(i), &kv.k, &kv.v, g)
                        })?;
                    }
                    Role::Owner => {
                        let kv = fetched.get(j);
                        let len = dims.kv_len(block.kv.len);
                        let (tk, tv) = slot(&mut kv_grads, j, || {
                            Ok((backend.zeros(len)?, backend.zeros(len)?))
                        })?;
                        let g = GradsMut {
                            dq: &mut dq[at(i)],
                            dk: tk,
                            dv: tv,
                        };
                        self.timed(|b| {
                            b.backward_block(&dims, block, query_side(i), &kv[0], &kv[1], g)
                        })?;
                    }
                    Role::Helper => {
                        let inputs = fetched.get(i);
                        let remote = QuerySide {
                            q: &inputs[0],
                            dout: &inputs[1],
                            lse: &inputs[2],
                            delta: &inputs[3],
                        };
                        let len = dims.q_len(block.q.len);
                        let tq = slot(&mut q_grads, i, || backend.zeros(len))?;
                        let kv = &own[at(j)];
                        let g = GradsMut {
                            dq: tq,
                            dk: &mut dk[at(j)],
                            dv: &mut dv[at(j)],
                        };
                        self.timed(|b| b.backward_block(&dims, block, remote, &kv.k, &kv.v, g))?;
                    }
                }
            }
            for r in step.returns.iter().filter(|r| r.from == me) {
                let tag = tag(plan.pass, t, r.chunk, r.payload);
                match r.payload {
                    Payload::KvGrad => {
                        let (gk, gv) = take(&mut kv_grads, r.chunk);
                        self.comm.send(r.to, tag, &[&gk, &gv])?;
                    }
                    _ => {
                        let gq = take(&mut q_grads, r.chunk);
                        self.comm.send(r.to, tag, &[&gq])?;
                    }
                }
            }
            for r in step.returns.iter().filter(|r| r.to == me) {
                let c = at(r.chunk);
                match r.payload {
                    Payload::KvGrad => {
                        let parts = self.recv(plan, t, r, 2)?;
                        self.timed(|b| {
                            b.add_assign(&mut dk[c], &parts[0])?;
                            b.add_assign(&mut dv[c], &parts[1])
                        })?;
                    }
                    _ => {
                        let parts = self.recv(plan, t, r, 1)?;
                        self.timed(|b| b.add_assign(&mut dq[c], &parts[0]))?;
                    }
                }
            }
        }
        Ok(dq
            .into_iter()
            .zip(dk)
            .zip(dv)
            .map(|((dq, dk), dv)| Grads { dq, dk, dv })
            .collect())
    }
}
