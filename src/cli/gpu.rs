//! The GPU side of `train`, `grads` and `bench train`: opening the device, refusing a run that
//! would not fit before anything is allocated, and handing the model's CUDA ops
//! (`model::cuda::CudaOps`) and attention (`train::cuda_attention`) to the same device-generic
//! loops the CPU runs (`train::gradients_on`, `train::train_on`, `train::bench`), which the CPU
//! tests cover.

use super::Waits;
use anyhow::{Result, bail};
use distflash::backend::cuda::{CudaBackend, HEAD_DIMS, InputDtype};
use distflash::comm::nccl::{self, NcclComm};
use distflash::comm::rendezvous::{self, LaunchEnv};
use distflash::comm::{Communicator, connect_mesh};
use distflash::model::Checkpoint;
use distflash::model::config::Config;
use distflash::model::cost;
use distflash::model::cuda::CudaOps;
use distflash::plan::Schedule;
use distflash::train::bench::{GpuTiming, Runs, on_gpu, time_steps_cuda, time_steps_rank};
use distflash::train::cuda_attention::CudaAttention;
use distflash::train::{
    Gradients, Options, StepReport, Threads, gradients_on, gradients_threads_on, train_on,
    train_rank_on, train_threads_on,
};

/// What to open and check the memory for.
pub struct GpuRun<'a> {
    /// Which GPU of this machine (a launched rank's LOCAL_RANK).
    pub gpu: usize,
    pub dtype: InputDtype,
    pub config: &'a Config,
    /// Name of the model in messages (a preset, or the file it came from).
    pub model: &'a str,
    /// Tokens of the whole sequence.
    pub seq: usize,
    /// Under a launcher: the GPUs (one process each) the sequence is split across and the
    /// schedule that splits it; this GPU then holds a rank's share and the executor's buffers
    /// (`cost::rank_step_memory`). `None`: the whole sequence on this GPU.
    pub ranks: Option<(usize, Schedule)>,
    pub checkpoint: Checkpoint,
    /// Whether AdamW's state must fit too (training) or not (gradients, benchmarks).
    pub optimizer: bool,
    /// Copies of the weights, gradients and optimizer state on the GPU: virtual workers (threads
    /// sharing it) each hold their own; 1 otherwise.
    pub model_copies: usize,
    /// Start even when the estimate exceeds the free memory (`--ignore-memory-estimate`): the
    /// estimate is the step's tensors plus a 1.5 GiB allowance for cuBLAS, kernel modules and
    /// fragmentation, and a run that needs less of that allowance may still fit.
    pub ignore_estimate: bool,
}

impl GpuRun<'_> {
    /// Opens the GPU (one sentence on a machine without a driver), refuses, with the numbers, a
    /// run whose estimated peak exceeds the free memory, and says the estimate on standard error
    /// before anything is allocated. Returns the backend and the estimate.
    pub fn open(&self) -> Result<(CudaBackend, cost::StepMemory)> {
        let backend = CudaBackend::new(self.gpu, self.dtype)?;
        let head_dim = self.config.head_dim;
        if !HEAD_DIMS.contains(&head_dim) {
            bail!(
                "{} has head dim {head_dim}, but the CUDA attention kernels support {HEAD_DIMS:?}: use --device cpu",
                self.model
            );
        }
        let mut need = distflash::sim::gpu_step_memory(
            self.config,
            self.seq,
            self.ranks,
            self.checkpoint,
            self.optimizer,
        )?;
        let copies = self.model_copies.max(1) as f64;
        need.weights *= copies;
        need.grads *= copies;
        need.optimizer *= copies;
        let share = match self.ranks {
            Some((workers, schedule)) => format!(" over {workers} GPUs ({schedule}), one rank"),
            None => String::new(),
        };
        let what = format!(
            "{} ({} layers) at {} tokens{share} with checkpoint {}{}",
            self.model,
            self.config.num_hidden_layers,
            self.seq,
            self.checkpoint,
            if self.optimizer { " and AdamW" } else { "" }
        );
        let free = backend.memory()?.free;
        match cost::check_fits(&need, free, &what) {
            Ok(()) => eprintln!(
                "GPU {}: {what} needs {} of {:.1} GiB free",
                self.gpu,
                need.describe(),
                cost::gib(free as f64)
            ),
            Err(e) if self.ignore_estimate => {
                eprintln!("note: {e:#}; starting anyway (--ignore-memory-estimate)")
            }
            Err(e) => bail!(
                "{e:#} (the estimate is the step's tensors plus 1.5 GiB for cuBLAS, kernel modules and fragmentation: --ignore-memory-estimate starts anyway)"
            ),
        }
        Ok((backend, need))
    }
}

/// Times forward+backward steps on the GPU.
pub fn bench(
    backend: CudaBackend,
    cfg: &Config,
    seq: usize,
    checkpoint: Checkpoint,
    runs: Runs,
) -> Result<GpuTiming> {
    let ops = CudaOps::new(backend)?;
    time_steps_cuda(&ops, ops.backend(), cfg, seq, checkpoint, runs)
}

/// Runs `work` with `ops` and an NCCL communicator as this process's rank of a one-process-per-
/// GPU job: rank 0's NCCL id goes out through the rendezvous, a TCP mesh beside NCCL ends every
/// rank with the reason when one fails, and the ranks meet again once `work` is done.
fn as_gpu_rank<R>(
    backend: CudaBackend,
    env: &LaunchEnv,
    waits: &Waits,
    work: impl FnOnce(&CudaOps, &mut NcclComm) -> Result<R>,
) -> Result<R> {
    let joined = rendezvous::join(env, super::args_hash(), waits.rendezvous, nccl::new_id)?;
    let id = joined.payload.clone();
    let mut host = connect_mesh(joined, waits.rendezvous, waits.message)?;
    let out = CudaOps::new(backend)
        .and_then(|ops| {
            let mut comm = NcclComm::connect(ops.backend(), env.rank, env.world, &id)?;
            work(&ops, &mut comm)
        })
        .inspect_err(|e| host.abort(&format!("{e:#}")))?;
    host.barrier()?;
    Ok(out)
}

/// Times forward+backward steps as this process's rank of a one-process-per-GPU job
/// (attention over NCCL, and the gradient all-reduce).
pub fn bench_rank(
    backend: CudaBackend,
    cfg: &Config,
    (seq, checkpoint, schedule): (usize, Checkpoint, Schedule),
    runs: Runs,
    (env, waits): (&LaunchEnv, &Waits),
) -> Result<GpuTiming> {
    as_gpu_rank(backend, env, waits, |ops, comm| {
        let backend = ops.backend();
        on_gpu(backend, runs, |runs| {
            time_steps_rank(ops, backend, comm, cfg, seq, checkpoint, schedule, runs)
        })
    })
}

/// Loss and gradients of one sequence on the GPU: one worker through the whole-sequence
/// attention, or `run.workers` virtual workers sharing the GPU (distflash between them).
pub fn gradients(
    backend: CudaBackend,
    cfg: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    run: Threads,
    checkpoint: Checkpoint,
) -> Result<Gradients> {
    let ops = CudaOps::new(backend)?;
    if run.workers > 1 {
        let be = ops.backend();
        return gradients_threads_on(&ops, be, cfg, weights, tokens, run, checkpoint);
    }
    let rows = tokens.len().saturating_sub(1);
    let mut attn = CudaAttention::new(ops.backend(), cfg.dims(), rows)?;
    gradients_on(&ops, &mut attn, cfg, weights, tokens, checkpoint)
}

/// Trains as this process's rank of a one-process-per-GPU job: NCCL carries attention's
/// tensors and the gradient all-reduce.
pub fn train_rank(
    backend: CudaBackend,
    o: &Options,
    (env, waits): (&LaunchEnv, &Waits),
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>> {
    as_gpu_rank(backend, env, waits, |ops, comm| {
        train_rank_on(ops, ops.backend(), o, comm, on_step)
    })
}

/// Trains on one GPU: one worker through the whole-sequence attention, or `o.workers` virtual
/// workers (threads sharing the GPU, distflash between them: the multi-GPU algorithm checked
/// on one device, exact, not fast).
pub fn train(
    backend: CudaBackend,
    o: &Options,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>> {
    let ops = CudaOps::new(backend)?;
    if o.workers > 1 {
        return train_threads_on(&ops, ops.backend(), o, on_step);
    }
    let mut attn = CudaAttention::new(ops.backend(), o.config.dims(), o.seq_len)?;
    train_on(&ops, &mut attn, o, on_step)
}
