//! Distributed attention over one whole problem (random inputs, `inputs::Inputs`): every
//! worker takes its chunks of the inputs, runs the forward and backward of the plan (warm-up,
//! timed repeats), and the chunks' results are joined into whole-sequence tensors on the
//! reporter. The harness of `distflash attention` and of the distributed tests, above the
//! executor; it runs on every topology the runtime offers (threads, processes, GPU ranks,
//! virtual workers) through one per-worker function.

use crate::backend::Backend;
use crate::block_math::{Grads, layout};
use crate::comm::{Communicator, Wire};
use crate::exec::{OwnChunk, Saved, Worker};
use crate::inputs::Inputs;
use crate::plan::{Partition, Pass, Schedule};
use crate::runtime::{Gather, Job, ModelDevice, Runtime};
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

/// How a plan is run: which schedule, whether communication overlaps compute, and how the
/// run is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strategy {
    pub schedule: Schedule,
    pub overlap: bool,
    /// Run forward and backward once, untimed, first (kernel compilation, allocator warm-up).
    pub warmup: bool,
    /// Timed runs; reported times are their medians, reported results the last run's.
    pub repeats: usize,
}

impl From<Schedule> for Strategy {
    /// A schedule with overlap on, run once: the normal way to run.
    fn from(schedule: Schedule) -> Self {
        Strategy {
            schedule,
            overlap: true,
            warmup: false,
            repeats: 1,
        }
    }
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

/// Runs forward then backward of attention on `problem`, under its mask, where `runtime` says. `Some` on
/// the reporter, with every worker's chunks joined; `None` on the other ranks of a launched job.
pub fn run(
    problem: &Inputs,
    how: impl Into<Strategy>,
    runtime: &Runtime,
) -> Result<Option<AttentionRun>> {
    problem.dims.validate()?;
    let job = AttentionJob {
        problem,
        how: how.into(),
    };
    let parts = runtime.open()?.run_all(&job)?;
    Ok(parts.map(|parts| assemble(problem, parts)))
}

/// [`run`] with `workers` CPU worker threads: the distributed tests' entry.
pub fn on_cpu_threads(
    problem: &Inputs,
    workers: usize,
    how: impl Into<Strategy>,
    timeout: Duration,
) -> Result<AttentionRun> {
    let run = run(problem, how, &Runtime::cpu_threads(workers, timeout))?;
    Ok(run.expect("threads report"))
}

/// One worker's part of the run.
struct AttentionJob<'a> {
    problem: &'a Inputs,
    how: Strategy,
}

impl Job for AttentionJob<'_> {
    type Output = WorkerResult;

    fn run<D: ModelDevice, C: Communicator<D::Tensor>>(
        &self,
        device: &D,
        comm: &mut C,
    ) -> Result<WorkerResult> {
        let (x, schedule) = (self.problem, self.how.schedule);
        let partition = Partition::masked(x.seq, comm.world(), schedule, &x.mask)?;
        run_rank(device.backend(), self.problem, &partition, &self.how, comm)
    }
}

impl Gather for WorkerResult {
    fn to_parts(&self) -> Vec<Vec<f32>> {
        let mut parts: Vec<Vec<f32>> = self.chunks.iter().flat_map(|(_, t)| t.clone()).collect();
        parts.push(pack(self));
        parts
    }

    fn from_parts(mut parts: Vec<Vec<f32>>) -> Result<Self> {
        let meta = parts.pop().unwrap_or_default();
        unpack(parts, &meta)
    }
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
    let mut chunks: Vec<&(usize, ChunkTensors)> = parts.iter().flat_map(|p| &p.chunks).collect();
    chunks.sort_by_key(|(c, _)| *c);
    let [out, lse, dq, dk, dv] = layout::join_results(&problem.dims, chunks.iter().map(|(_, t)| t));
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
    partition: &Partition,
    how: &Strategy,
    comm: &mut C,
) -> Result<WorkerResult>
where
    B::Tensor: Wire,
{
    let dims = problem.dims;
    let mine = partition.chunks_of(comm.rank());
    let (q_rows, kv_rows) = (dims.batch * dims.heads, dims.batch * dims.kv_heads);
    let d = dims.head_dim;
    let take = |t: &[f32], outer, c: usize| {
        backend.upload(&layout::take_rows(
            t,
            outer,
            problem.seq,
            d,
            partition.spans()[c],
        ))
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
        spans: partition.spans(),
        compute: Duration::ZERO,
        overlap: how.overlap,
    };
    let repeats = how.repeats.max(1);
    let mut times = Vec::with_capacity(repeats);
    let mut last = None;
    for run in 0..usize::from(how.warmup) + repeats {
        let dout = mine
            .iter()
            .map(|&c| take(&problem.dout, q_rows, c))
            .collect::<Result<Vec<_>>>()?;
        let pass = timed_pass(&mut worker, partition, &mine, &own, dout)?;
        if run >= usize::from(how.warmup) {
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
    partition: &Partition,
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
    let results = worker.forward(partition.plan(Pass::Forward), own)?;
    backend.synchronize()?;
    let forward_secs = start.elapsed().as_secs_f64();
    let forward_busy = worker.compute - compute_before;
    let forward_bytes = worker.comm.bytes_sent() - bytes_before;
    let forward_wait = worker.comm.waited_secs()? - waited_before;
    let mut outs = Vec::with_capacity(mine.len());
    let mut saved = Vec::with_capacity(mine.len());
    for ((&c, result), dout) in mine.iter().zip(results).zip(dout) {
        saved.push(Saved {
            delta: backend.delta(&dims, partition.spans()[c].len, &result.out, &dout)?,
            dout,
            lse: result.lse,
        });
        outs.push(result.out);
    }
    worker.comm.barrier()?;
    let waited_mid = worker.comm.waited_secs()?; // the barrier's wait belongs to neither pass
    let start = Instant::now();
    let grads = worker.backward(partition.plan(Pass::Backward), own, &saved)?;
    backend.synchronize()?;
    let backward_secs = start.elapsed().as_secs_f64();
    Ok(TimedPass {
        report: WorkerReport {
            rows: mine.iter().map(|&c| partition.spans()[c].len).sum(),
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
