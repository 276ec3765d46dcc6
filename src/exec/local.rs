//! Distributed attention with CPU workers as threads of this process: split the sequence into
//! chunks, run every worker's forward and backward over an in-process communicator, and join
//! the results. A failing worker (error or panic) aborts the group, so the others return an
//! error naming it instead of waiting.

use super::{OwnChunk, Saved, Worker, chunk_spans};
use crate::attn::{Span, layout};
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::comm::{Communicator, LocalComm, PeerFailed, local_group};
use crate::inputs::Inputs;
use crate::plan::{self, Pass, Plan, Schedule};
use anyhow::{Result, anyhow};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// Runs `work(rank, endpoint)` on `world` threads. A worker that fails tells the others (through
/// `abort`), so every call returns: one result per worker, in rank order, all `Ok` or all `Err`.
pub fn run_workers<R: Send>(
    world: usize,
    timeout: Duration,
    work: impl Fn(usize, &mut LocalComm) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    let endpoints = local_group(world, timeout);
    std::thread::scope(|scope| {
        let handles: Vec<_> = endpoints
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                let work = &work;
                scope.spawn(move || {
                    // The closing barrier makes a worker that finished its own part still
                    // learn of (and report) a failure elsewhere: the group either succeeds or fails.
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        let value = work(rank, &mut comm)?;
                        comm.barrier()?;
                        Ok(value)
                    }))
                    .unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(anyhow!("panicked: {what}"))
                    });
                    if let Err(e) = &outcome
                        && e.downcast_ref::<PeerFailed>().is_none()
                    {
                        comm.abort(&format!("{e:#}"));
                    }
                    outcome
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("worker thread could not be joined")))
            })
            .collect()
    })
}

/// All workers' values, or the root cause if any failed: the first error that is not merely a
/// report of another worker's failure, named by its worker.
pub fn collect_results<R>(results: Vec<Result<R>>) -> Result<Vec<R>> {
    if results.iter().all(Result::is_ok) {
        return Ok(results
            .into_iter()
            .map(|r| r.expect("checked ok"))
            .collect());
    }
    let mut errors: Vec<(usize, anyhow::Error)> = results
        .into_iter()
        .enumerate()
        .filter_map(|(rank, r)| r.err().map(|e| (rank, e)))
        .collect();
    let root = errors
        .iter()
        .position(|(_, e)| !e.chain().any(|c| c.is::<PeerFailed>()))
        .unwrap_or(0);
    let (rank, error) = errors.swap_remove(root);
    Err(error.context(format!("worker {rank} failed")))
}

/// Per-worker measurements of one run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WorkerReport {
    pub rows: usize,
    pub forward_busy_secs: f64,
    pub backward_busy_secs: f64,
    pub forward_bytes_sent: u64,
    pub backward_bytes_sent: u64,
}

/// The joined results (head-major, whole sequence) and measurements of a distributed run.
pub struct AttentionRun {
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    /// Wall time of the forward (slowest worker), seconds.
    pub forward_secs: f64,
    pub backward_secs: f64,
    pub workers: Vec<WorkerReport>,
}

struct WorkerResult {
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    forward_secs: f64,
    backward_secs: f64,
    report: WorkerReport,
}

/// Runs forward then backward of causal attention with `workers` CPU worker threads.
pub fn run_attention(
    problem: &Inputs,
    workers: usize,
    schedule: Schedule,
    timeout: Duration,
) -> Result<AttentionRun> {
    let dims = problem.dims;
    dims.validate()?;
    let spans = chunk_spans(&plan::chunk_sizes(problem.seq, workers)?);
    let forward = Plan::new(workers, schedule, Pass::Forward)?;
    let backward = Plan::new(workers, schedule, Pass::Backward)?;
    let results = run_workers(workers, timeout, |rank, comm| {
        run_one(problem, &spans, rank, comm, &forward, &backward)
    });
    let parts = collect_results(results)?;
    let (q_rows, kv_rows) = (dims.batch * dims.heads, dims.batch * dims.kv_heads);
    let join = |pick: fn(&WorkerResult) -> &Vec<f32>, outer: usize, width: usize| {
        let chunks: Vec<Vec<f32>> = parts.iter().map(|p| pick(p).clone()).collect();
        layout::join_rows(&chunks, outer, width)
    };
    Ok(AttentionRun {
        out: join(|p| &p.out, q_rows, dims.head_dim),
        lse: join(|p| &p.lse, q_rows, 1),
        dq: join(|p| &p.dq, q_rows, dims.head_dim),
        dk: join(|p| &p.dk, kv_rows, dims.head_dim),
        dv: join(|p| &p.dv, kv_rows, dims.head_dim),
        forward_secs: parts.iter().map(|p| p.forward_secs).fold(0.0, f64::max),
        backward_secs: parts.iter().map(|p| p.backward_secs).fold(0.0, f64::max),
        workers: parts.into_iter().map(|p| p.report).collect(),
    })
}

fn run_one(
    problem: &Inputs,
    spans: &[Span],
    rank: usize,
    comm: &mut LocalComm,
    forward: &Plan,
    backward: &Plan,
) -> Result<WorkerResult> {
    let dims = problem.dims;
    let span = spans[rank];
    let (q_rows, kv_rows) = (dims.batch * dims.heads, dims.batch * dims.kv_heads);
    let d = dims.head_dim;
    let take = |t: &[f32], outer| layout::take_rows(t, outer, problem.seq, d, span);
    let own = OwnChunk {
        q: take(&problem.q, q_rows),
        k: take(&problem.k, kv_rows),
        v: take(&problem.v, kv_rows),
    };
    let dout = take(&problem.dout, q_rows);
    let backend = CpuBackend;
    let mut worker = Worker {
        backend: &backend,
        comm,
        dims,
        spans,
        compute: Duration::ZERO,
    };
    worker.comm.barrier()?;
    let start = Instant::now();
    let result = worker.forward(forward, &own)?;
    let forward_secs = start.elapsed().as_secs_f64();
    let forward_busy = worker.compute;
    let forward_bytes = worker.comm.bytes_sent();
    let saved = Saved {
        delta: backend.delta(&dims, span.len, &result.out, &dout)?,
        dout,
        lse: result.lse.clone(),
    };
    worker.comm.barrier()?;
    let start = Instant::now();
    let grads = worker.backward(backward, &own, &saved)?;
    let backward_secs = start.elapsed().as_secs_f64();
    Ok(WorkerResult {
        out: result.out,
        lse: result.lse,
        dq: grads.dq,
        dk: grads.dk,
        dv: grads.dv,
        forward_secs,
        backward_secs,
        report: WorkerReport {
            rows: span.len,
            forward_busy_secs: forward_busy.as_secs_f64(),
            backward_busy_secs: (worker.compute - forward_busy).as_secs_f64(),
            forward_bytes_sent: forward_bytes,
            backward_bytes_sent: worker.comm.bytes_sent() - forward_bytes,
        },
    })
}
