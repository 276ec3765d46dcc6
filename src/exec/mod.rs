//! Runs a plan for one worker: forward and backward of distributed attention on any backend
//! over any communicator, under the plan's mask (causal, or packed documents, a window, global
//! tokens: the plan has already left out the blocks it hides, and every block computed gets
//! the mask).
//!
//! Prefetch: at the start of step t a worker sends everything it owns that others need at step
//! t + 1, then computes step t, then returns results and collects what was returned to it. The
//! inputs of step t + 1 therefore travel while step t computes; only returned partials wait for
//! the compute that makes them.

use crate::block_math::{Block, Grads, GradsMut, Partial, QuerySide, RunningState};

use crate::backend::Backend;
use crate::comm::{Communicator, Incoming, Outgoing, Posted, Tag, Wire};
use crate::plan::{Pass, Payload, Plan, Role, Task, Transfer, volume};
use crate::shape::{Dims, Span};
use anyhow::{Context as _, Result};
use std::time::{Duration, Instant};

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
    /// Post step t + 1's fetches before step t computes (prefetch). Off, a step's fetches are
    /// posted and awaited just before it computes: the paper's no-overlap ablation.
    pub overlap: bool,
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

/// A posted group, with the chunk each of its receives belongs to.
#[derive(Default)]
struct Pending {
    posted: Option<Posted>,
    chunks: Vec<usize>,
    context: String,
}

/// Values keyed by chunk index; a step touches only a few chunks, so a list beats a map.
type PerChunk<T> = Vec<(usize, T)>;

/// The value for `chunk`, which the plan guarantees is there (a fetched operand of a task, or a
/// result a task of this step produced).
fn find<T>(list: &PerChunk<T>, chunk: usize) -> &T {
    &list
        .iter()
        .find(|(c, _)| *c == chunk)
        .expect("the plan pairs every operand and result with its transfer")
        .1
}

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
    /// A worker for one call on `comm`'s endpoint, prefetch on and its compute time counted
    /// from zero: how a layer's attention and a caller's rank run the executor.
    pub fn new(backend: &'a B, comm: &'a mut C, dims: Dims, spans: &'a [Span]) -> Self {
        Worker {
            backend,
            comm,
            dims,
            spans,
            compute: Duration::ZERO,
            overlap: true,
        }
    }

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

    /// Posts this worker's side of `transfers` (all of step `step`) as one group: sends
    /// `data(transfer)` for those from it, expects the plan's tensors for those to it.
    fn exchange<'d>(
        &mut self,
        plan: &Plan,
        step: usize,
        transfers: &[Transfer],
        data: impl Fn(&Transfer) -> Vec<&'d B::Tensor>,
    ) -> Result<Pending>
    where
        B::Tensor: 'd,
    {
        let me = self.rank();
        let tag = |t: &Transfer| tag(plan.pass, step, t.chunk, t.payload);
        let sends: Vec<Outgoing<'d, B::Tensor>> = transfers
            .iter()
            .filter(|t| t.from == me)
            .map(|t| Outgoing {
                to: t.to,
                tag: tag(t),
                parts: data(t),
            })
            .collect();
        let incoming: Vec<&Transfer> = transfers.iter().filter(|t| t.to == me).collect();
        let recvs = incoming
            .iter()
            .map(|t| Incoming {
                from: t.from,
                tag: tag(t),
                parts: volume::parts(t.payload, &self.dims, self.spans[t.chunk].len),
            })
            .collect();
        let posted = self.comm.post(&sends, recvs)?;
        Ok(Pending {
            posted: Some(posted),
            chunks: incoming.iter().map(|t| t.chunk).collect(),
            context: format!("worker {me} at {:?} step {step}", plan.pass),
        })
    }

    /// Posts the fetches of `step`, if the plan has that step (every rank agrees on that).
    fn post_fetches<'d>(
        &mut self,
        plan: &Plan,
        step: usize,
        owned: impl Fn(Payload, usize) -> Vec<&'d B::Tensor>,
    ) -> Result<Pending>
    where
        B::Tensor: 'd,
    {
        match plan.steps.get(step) {
            Some(s) => self.exchange(plan, step, &s.fetches, |t| owned(t.payload, t.chunk)),
            None => Ok(Pending::default()),
        }
    }

    /// The inputs of step `t`: with overlap, those posted one step earlier (in `next`), after
    /// posting step t + 1's; without, posted and awaited now.
    fn fetches_for_step<'d>(
        &mut self,
        plan: &Plan,
        t: usize,
        next: &mut Pending,
        owned: impl Fn(Payload, usize) -> Vec<&'d B::Tensor>,
    ) -> Result<PerChunk<Vec<B::Tensor>>>
    where
        B::Tensor: 'd,
    {
        let current = if self.overlap {
            std::mem::replace(next, self.post_fetches(plan, t + 1, owned)?)
        } else {
            self.post_fetches(plan, t, owned)?
        };
        self.collect(current)
    }

    /// With overlap, step 0's fetches are posted before the loop (as every step's are one
    /// step early); without, nothing is.
    fn first_fetches<'d>(
        &mut self,
        plan: &Plan,
        owned: impl Fn(Payload, usize) -> Vec<&'d B::Tensor>,
    ) -> Result<Pending>
    where
        B::Tensor: 'd,
    {
        if self.overlap {
            self.post_fetches(plan, 0, owned)
        } else {
            Ok(Pending::default())
        }
    }

    /// Waits for a posted group's receives.
    fn collect(&mut self, pending: Pending) -> Result<PerChunk<Vec<B::Tensor>>> {
        let Some(posted) = pending.posted else {
            return Ok(Vec::new());
        };
        let got = self.comm.wait(posted).context(pending.context)?;
        Ok(pending.chunks.into_iter().zip(got).collect())
    }

    /// Forward of this worker's query chunks (`own`, in `plan.chunks_of` order): returns their
    /// final (O, LSE), in the same order.
    pub fn forward(
        &mut self,
        plan: &Plan,
        own: &[OwnChunk<B::Tensor>],
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
        let mask = &plan.mask;
        let owned = |p: Payload, c: usize| match p {
            Payload::KeyValue => vec![&own[at(c)].k, &own[at(c)].v],
            _ => vec![&own[at(c)].q],
        };
        let mut next = self.first_fetches(plan, owned)?;
        for (t, step) in plan.steps.iter().enumerate() {
            let fetched = self.fetches_for_step(plan, t, &mut next, owned)?;
            let mut helping: PerChunk<RunningState<B::Tensor>> = Vec::new();
            for task in step.tasks_of(me) {
                let block = self.block(&task);
                let (i, j) = (task.q_chunk, task.kv_chunk);
                match plan.role(&task) {
                    Role::Local => {
                        let (q, kv) = (&own[at(i)], &own[at(j)]);
                        let state = &mut states[at(i)];
                        self.timed(|b| {
                            b.forward_block(&dims, block, mask, &q.q, (&kv.k, &kv.v), state)
                        })?;
                    }
                    Role::Owner => {
                        let kv = find(&fetched, j);
                        let state = &mut states[at(i)];
                        self.timed(|b| {
                            b.forward_block(
                                &dims,
                                block,
                                mask,
                                &own[at(i)].q,
                                (&kv[0], &kv[1]),
                                state,
                            )
                        })?;
                    }
                    Role::Helper => {
                        let q = &find(&fetched, i)[0];
                        let backend = self.backend;
                        let state =
                            slot(&mut helping, i, || backend.new_state(&dims, block.q.len))?;
                        let kv = &own[at(j)];
                        self.timed(|b| {
                            b.forward_block(&dims, block, mask, q, (&kv.k, &kv.v), state)
                        })?;
                    }
                }
            }
            let mut finished: PerChunk<Partial<B::Tensor>> = Vec::new();
            for r in step.returns.iter().filter(|r| r.from == me) {
                let state = take(&mut helping, r.chunk);
                let rows = self.spans[r.chunk].len;
                finished.push((r.chunk, self.timed(|b| b.finalize(&dims, rows, state))?));
            }
            let sent = |r: &Transfer| {
                let p = find(&finished, r.chunk);
                vec![&p.out, &p.lse]
            };
            let posted = self.exchange(plan, t, &step.returns, sent)?;
            for (chunk, mut parts) in self.collect(posted)? {
                let lse = parts.pop().expect("two parts");
                let out = parts.pop().expect("two parts");
                returned[at(chunk)].push(Partial { out, lse });
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
        own: &[OwnChunk<B::Tensor>],
        saved: &[Saved<B::Tensor>],
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
        let mask = &plan.mask;
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
        let mut next = self.first_fetches(plan, owned)?;
        for (t, step) in plan.steps.iter().enumerate() {
            let fetched = self.fetches_for_step(plan, t, &mut next, owned)?;
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
                            b.backward_block(&dims, block, mask, query_side(i), (&kv.k, &kv.v), g)
                        })?;
                    }
                    Role::Owner => {
                        let kv = find(&fetched, j);
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
                            b.backward_block(&dims, block, mask, query_side(i), (&kv[0], &kv[1]), g)
                        })?;
                    }
                    Role::Helper => {
                        let inputs = find(&fetched, i);
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
                        self.timed(|b| {
                            b.backward_block(&dims, block, mask, remote, (&kv.k, &kv.v), g)
                        })?;
                    }
                }
            }
            let sent = |r: &Transfer| match r.payload {
                Payload::KvGrad => {
                    let (gk, gv) = find(&kv_grads, r.chunk);
                    vec![gk, gv]
                }
                _ => vec![find(&q_grads, r.chunk)],
            };
            let posted = self.exchange(plan, t, &step.returns, sent)?;
            let got = self.collect(posted)?;
            let to_me = step.returns.iter().filter(|r| r.to == me);
            for (r, (chunk, parts)) in to_me.zip(got) {
                let c = at(chunk);
                match r.payload {
                    Payload::KvGrad => self.timed(|b| {
                        b.add_assign(&mut dk[c], &parts[0])?;
                        b.add_assign(&mut dv[c], &parts[1])
                    })?,
                    _ => self.timed(|b| b.add_assign(&mut dq[c], &parts[0]))?,
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
