//! Distributed attention over a whole sequence: split it into chunks, run each worker's forward
//! and backward, and join the results, with workers as threads (`run_attention`) or as one rank
//! of a multi-process job (`run_attention_rank`).

use super::local::{collect_results, run_workers};
use super::{OwnChunk, Saved, Strategy, Worker, chunk_spans};
use crate::attn::Grads;
use crate::attn::{Span, layout};
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::comm::{Buffer, Communicator, LocalComm, PeerFailed, Solo, Tag, Wire};
use crate::inputs::Inputs;
use crate::plan::{self, Pass, Plan};
use anyhow::{Result, bail};
use std::time::{Duration, Instant};

/// Per-worker measurements of one run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WorkerReport {
    pub rows: usize,
    pub forward_busy_secs: f64,
    pub backward_busy_secs: f64,
    pub forward_bytes_sent: u64,
    pub backward_bytes_sent: u64,
    /// Seconds the worker's compute waited for other workers' data (see
    /// `Communicator::waited_secs`): communication left exposed, plus imbalance.
    pub forward_wait_secs: f64,
    pub backward_wait_secs: f64,
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

/// Results of one chunk: out, lse, dq, dk, dv of its rows, host f32.
type ChunkTensors = [Vec<f32>; 5];

struct WorkerResult {
    /// (chunk index, its tensors) for every chunk the worker owns.
    chunks: Vec<(usize, ChunkTensors)>,
    forward_secs: f64,
    backward_secs: f64,
    report: WorkerReport,
}

/// The schedule and chunking every rank derives identically from the arguments.
struct Setup {
    spans: Vec<Span>,
    forward: Plan,
    backward: Plan,
    overlap: bool,
    warmup: bool,
    repeats: usize,
}

impl Setup {
    fn new(problem: &Inputs, workers: usize, how: Strategy) -> Result<Setup> {
        problem.dims.validate()?;
        let schedule = how.schedule;
        Ok(Setup {
            spans: chunk_spans(&plan::chunk_sizes(problem.seq, workers, schedule)?),
            forward: Plan::new(workers, schedule, Pass::Forward)?,
            backward: Plan::new(workers, schedule, Pass::Backward)?,
            overlap: how.overlap,
            warmup: how.warmup,
            repeats: how.repeats.max(1),
        })
    }
}

/// Runs forward then backward of causal attention with `workers` CPU worker threads.
pub fn run_attention(
    problem: &Inputs,
    workers: usize,
    how: impl Into<Strategy>,
    timeout: Duration,
) -> Result<AttentionRun> {
    run_attention_on(&CpuBackend, problem, workers, how, timeout)
}

/// Runs forward then backward with `workers` worker threads sharing one `backend`: CPU workers,
/// or virtual workers on one GPU (transfers become device copies), which checks a schedule
/// exactly on the GPU kernels with fewer devices than workers.
pub fn run_attention_on<B: Backend>(
    backend: &B,
    problem: &Inputs,
    workers: usize,
    how: impl Into<Strategy>,
    timeout: Duration,
) -> Result<AttentionRun>
where
    B::Tensor: Buffer,
{
    let setup = Setup::new(problem, workers, how.into())?;
    let results = run_workers(workers, timeout, |rank, comm: &mut LocalComm<B::Tensor>| {
        run_rank(backend, problem, &setup, rank, comm)
    });
    Ok(assemble(problem, collect_results(results)?))
}

/// Runs forward then backward with one worker on `backend` (no communication): the path of a
/// single device.
pub fn run_attention_alone<B: Backend>(
    backend: &B,
    problem: &Inputs,
    how: impl Into<Strategy>,
) -> Result<AttentionRun>
where
    B::Tensor: Wire,
{
    let setup = Setup::new(problem, 1, how.into())?;
    let part = run_rank(backend, problem, &setup, 0, &mut Solo)?;
    Ok(assemble(problem, vec![part]))
}

/// One rank's share of a multi-process job: its chunks' results (on the host) and measurements.
pub struct RankResult(WorkerResult);

/// Runs this process's rank of a multi-process job (one rank per worker) on `backend` over
/// `comm`. A failure is announced to the other ranks through `comm` (or, for a device
/// communicator that cannot, by the caller's host mesh) before it is returned.
pub fn run_attention_rank<B: Backend, C: Communicator<B::Tensor>>(
    backend: &B,
    problem: &Inputs,
    how: impl Into<Strategy>,
    comm: &mut C,
) -> Result<RankResult>
where
    B::Tensor: Wire,
{
    let setup = Setup::new(problem, comm.world(), how.into())?;
    let rank = comm.rank();
    run_rank(backend, problem, &setup, rank, comm)
        .map(RankResult)
        .inspect_err(|e| {
            if !e.chain().any(|c| c.is::<PeerFailed>()) {
                comm.abort(&format!("{e:#}"));
            }
        })
}

/// Gathers every rank's results to rank 0 over a host communicator: `Some(run)` on rank 0,
/// `None` elsewhere.
pub fn gather_to_root<H: Communicator<Vec<f32>>>(
    problem: &Inputs,
    mine: RankResult,
    host: &mut H,
) -> Result<Option<AttentionRun>> {
    let mine = mine.0;
    // Tag space above the plans' (pass << 40) tags and below the collectives'.
    let gather = Tag(1 << 50);
    if host.rank() != 0 {
        let meta = pack(&mine);
        let mut parts: Vec<&Vec<f32>> = mine.chunks.iter().flat_map(|(_, t)| t.iter()).collect();
        parts.push(&meta);
        host.send(0, gather, &parts)?;
        host.barrier()?;
        return Ok(None);
    }
    let mut parts = vec![mine];
    for from in 1..host.world() {
        let mut got = host.recv(from, gather)?;
        let meta = got.pop().unwrap_or_default();
        parts.push(unpack(got, &meta).map_err(|e| e.context(format!("results of worker {from}")))?);
    }
    host.barrier()?;
    Ok(Some(assemble(problem, parts)))
}

/// A worker's timings, counters and chunk indices as f32 bit patterns (u64s split in halves),
/// so they travel exactly with the tensors.
fn pack(r: &WorkerResult) -> Vec<f32> {
    let w = &r.report;
    [
        r.forward_secs.to_bits(),
        r.backward_secs.to_bits(),
        w.forward_busy_secs.to_bits(),
        w.backward_busy_secs.to_bits(),
        w.rows as u64,
        w.forward_bytes_sent,
        w.backward_bytes_sent,
        w.forward_wait_secs.to_bits(),
        w.backward_wait_secs.to_bits(),
    ]
    .into_iter()
    .chain(r.chunks.iter().map(|(c, _)| *c as u64))
    .flat_map(|x| [f32::from_bits(x as u32), f32::from_bits((x >> 32) as u32)])
    .collect()
}

fn unpack(tensors: Vec<Vec<f32>>, meta: &[f32]) -> Result<WorkerResult> {
    let v: Vec<u64> = meta
        .chunks_exact(2)
        .map(|p| p[0].to_bits() as u64 | ((p[1].to_bits() as u64) << 32))
        .collect();
    let [
        fwd,
        bwd,
        fwd_busy,
        bwd_busy,
        rows,
        fwd_bytes,
        bwd_bytes,
        fwd_wait,
        bwd_wait,
        ref chunk_ids @ ..,
    ] = v[..]
    else {
        bail!("the report has {} fields, fewer than 9", v.len());
    };
    if tensors.len() != 5 * chunk_ids.len() {
        bail!("{} tensors for {} chunks", tensors.len(), chunk_ids.len());
    }
    let mut it = tensors.into_iter();
    let chunks = chunk_ids
        .iter()
        .map(|&c| {
            (
                c as usize,
                std::array::from_fn(|_| it.next().expect("counted")),
            )
        })
        .collect();
    Ok(WorkerResult {
        chunks,
        forward_secs: f64::from_bits(fwd),
        backward_secs: f64::from_bits(bwd),
        report: WorkerReport {
            rows: rows as usize,
            forward_busy_secs: f64::from_bits(fwd_busy),
            backward_busy_secs: f64::from_bits(bwd_busy),
            forward_bytes_sent: fwd_bytes,
            backward_bytes_sent: bwd_bytes,
            forward_wait_secs: f64::from_bits(fwd_wait),
            backward_wait_secs: f64::from_bits(bwd_wait),
        },
    })
}

/// Joins every worker's chunks, in chunk order, into whole-sequence tensors.
fn assemble(problem: &Inputs, parts: Vec<WorkerResult>) -> AttentionRun {
    let dims = problem.dims;
    let (q_rows, kv_rows) = (dims.batch * dims.heads, dims.batch * dims.kv_heads);
    let shapes = [
        (q_rows, dims.head_dim),
        (q_rows, 1),
        (q_rows, dims.head_dim),
        (kv_rows, dims.head_dim),
        (kv_rows, dims.head_dim),
    ];
    let mut chunks: Vec<&(usize, ChunkTensors)> = parts.iter().flat_map(|p| &p.chunks).collect();
    chunks.sort_by_key(|(c, _)| *c);
    let [out, lse, dq, dk, dv] = std::array::from_fn(|i| {
        let pieces: Vec<Vec<f32>> = chunks.iter().map(|(_, t)| t[i].clone()).collect();
        layout::join_rows(&pieces, shapes[i].0, shapes[i].1)
    });
    AttentionRun {
        out,
        lse,
        dq,
        dk,
        dv,
        forward_secs: parts.iter().map(|p| p.forward_secs).fold(0.0, f64::max),
        backward_secs: parts.iter().map(|p| p.backward_secs).fold(0.0, f64::max),
        workers: parts.into_iter().map(|p| p.report).collect(),
    }
}

/// One worker's forward and backward over its chunks on `backend`; results come back as host f32.
fn run_rank<B: Backend, C: Communicator<B::Tensor>>(
    backend: &B,
    problem: &Inputs,
    setup: &Setup,
    rank: usize,
    comm: &mut C,
) -> Result<WorkerResult>
where
    B::Tensor: Wire,
{
    let dims = problem.dims;
    let mine = setup.forward.chunks_of(rank);
    let (q_rows, kv_rows) = (dims.batch * dims.heads, dims.batch * dims.kv_heads);
    let d = dims.head_dim;
    let take = |t: &[f32], outer, c: usize| {
        backend.upload(&layout::take_rows(t, outer, problem.seq, d, setup.spans[c]))
    };
    let own = mine
        .iter()
        .map(|&c| {
            Ok(OwnChunk {
                q: take(&problem.q, q_rows, c)?,
                k: take(&problem.k, kv_rows, c)?,
                v: take(&problem.v, kv_rows, c)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut worker = Worker {
        backend,
        comm,
        dims,
        spans: &setup.spans,
        compute: Duration::ZERO,
        overlap: setup.overlap,
    };
    let mut times = Vec::with_capacity(setup.repeats);
    let mut last = None;
    for run in 0..usize::from(setup.warmup) + setup.repeats {
        let dout = mine
            .iter()
            .map(|&c| take(&problem.dout, q_rows, c))
            .collect::<Result<Vec<_>>>()?;
        let pass = timed_pass(&mut worker, setup, &mine, &own, dout)?;
        if run >= usize::from(setup.warmup) {
            times.push((pass.forward_secs, pass.backward_secs));
        }
        last = Some(pass);
    }
    let TimedPass {
        outs,
        saved,
        grads,
        report,
        ..
    } = last.expect("at least one run");
    let median = |pick: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<f64> = times.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let host = |t: &B::Tensor| backend.download(t);
    let chunks = mine
        .iter()
        .zip(outs.iter().zip(&saved).zip(&grads))
        .map(|(&c, ((out, s), g))| {
            Ok((
                c,
                [
                    host(out)?,
                    host(&s.lse)?,
                    host(&g.dq)?,
                    host(&g.dk)?,
                    host(&g.dv)?,
                ],
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(WorkerResult {
        chunks,
        forward_secs: median(|t| t.0),
        backward_secs: median(|t| t.1),
        report,
    })
}

/// One timed forward and backward: the device results and this pass's measurements.
struct TimedPass<T> {
    outs: Vec<T>,
    saved: Vec<Saved<T>>,
    grads: Vec<Grads<T>>,
    forward_secs: f64,
    backward_secs: f64,
    report: WorkerReport,
}

fn timed_pass<B: Backend, C: Communicator<B::Tensor>>(
    worker: &mut Worker<'_, B, C>,
    setup: &Setup,
    mine: &[usize],
    own: &[OwnChunk<B::Tensor>],
    dout: Vec<B::Tensor>,
) -> Result<TimedPass<B::Tensor>>
where
    B::Tensor: Wire,
{
    let (backend, dims) = (worker.backend, worker.dims);
    worker.comm.barrier()?;
    // The communicator may have carried earlier runs: count this pass's bytes and time only.
    let bytes_before = worker.comm.bytes_sent();
    let compute_before = worker.compute;
    let waited_before = worker.comm.waited_secs()?;
    let start = Instant::now();
    let results = worker.forward(&setup.forward, own)?;
    backend.synchronize()?;
    let forward_secs = start.elapsed().as_secs_f64();
    let forward_busy = worker.compute - compute_before;
    let forward_bytes = worker.comm.bytes_sent() - bytes_before;
    let forward_wait = worker.comm.waited_secs()? - waited_before;
    let mut outs = Vec::with_capacity(mine.len());
    let mut saved = Vec::with_capacity(mine.len());
    for ((&c, result), dout) in mine.iter().zip(results).zip(dout) {
        saved.push(Saved {
            delta: backend.delta(&dims, setup.spans[c].len, &result.out, &dout)?,
            dout,
            lse: result.lse,
        });
        outs.push(result.out);
    }
    worker.comm.barrier()?;
    let waited_mid = worker.comm.waited_secs()?; // the barrier's wait belongs to neither pass
    let start = Instant::now();
    let grads = worker.backward(&setup.backward, own, &saved)?;
    backend.synchronize()?;
    let backward_secs = start.elapsed().as_secs_f64();
    Ok(TimedPass {
        report: WorkerReport {
            rows: mine.iter().map(|&c| setup.spans[c].len).sum(),
            forward_busy_secs: forward_busy.as_secs_f64(),
            backward_busy_secs: (worker.compute - compute_before - forward_busy).as_secs_f64(),
            forward_bytes_sent: forward_bytes,
            backward_bytes_sent: worker.comm.bytes_sent() - bytes_before - forward_bytes,
            forward_wait_secs: forward_wait,
            backward_wait_secs: worker.comm.waited_secs()? - waited_mid,
        },
        outs,
        saved,
        grads,
        forward_secs,
        backward_secs,
    })
}
