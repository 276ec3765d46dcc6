//! The memory a model job needs, checked where it runs before anything of it is allocated: on a
//! GPU the estimated peak of the step (`sim::gpu_step_memory`) against the opened device's free
//! memory; on the CPU the model state and activations every worker holds against this
//! machine's available memory (`resources::CpuTraining`). A run
//! that would not fit is refused with the figures and a fix, never killed halfway.

use super::shard::Shard;
use crate::model::config::Config;
use crate::model::cost;
use crate::model::{Checkpoint, Offload};
use crate::plan::Schedule;
use crate::resources::{self, CpuTraining};
use crate::runtime::{Device, OpenedGpu, Runtime, Topology};
use crate::sim;
use anyhow::{Result, bail};

/// What a model job is about to run, for its memory estimate.
#[derive(Clone, Debug)]
pub struct MemoryCheck {
    pub config: Config,
    /// Name of the model in messages (a preset, or the file it came from).
    pub model: String,
    /// Tokens of the whole sequence.
    pub seq: usize,
    pub schedule: Schedule,
    pub checkpoint: Checkpoint,
    /// What waits in host memory: offloaded checkpoints leave two layers' on the GPU and need
    /// pinned host memory for all of them.
    pub offload: Offload,
    /// Whether AdamW's state must fit too (training) or not (gradients, benchmarks).
    pub optimizer: bool,
    /// Which state the workers shard: each holds 1/workers of the AdamW moments under
    /// `optimizer` and `grads` (the gradients are whole until the backward ends, so their peak
    /// stays).
    pub shard: Shard,
    /// Start even when the estimate exceeds the free GPU memory (`--ignore-memory-estimate`):
    /// the estimate is the step's tensors plus a 1.5 GiB allowance for cuBLAS, kernel modules and
    /// fragmentation, and a run that needs less of that allowance may still fit.
    pub ignore_estimate: bool,
}

impl MemoryCheck {
    /// Under a launcher: the GPUs (one process each) the sequence is split across and the
    /// schedule that splits it; `None`: the whole sequence on this process's device.
    fn ranks(&self, runtime: &Runtime) -> Option<(usize, Schedule)> {
        match &runtime.topology {
            Topology::Ranks(env) => Some((env.world, self.schedule)),
            Topology::Threads(_) => None,
        }
    }

    /// The estimated peak GPU memory of this process: a rank holds its share of the sequence
    /// and the executor's buffers, and its shard of the optimizer state; threads sharing one GPU
    /// (virtual workers) each hold their own copy of the model's state (their shards add up to
    /// one copy of the moments).
    pub fn gpu_estimate(&self, runtime: &Runtime) -> Result<cost::StepMemory> {
        let mut need = sim::gpu_step_memory(
            &self.config,
            self.seq,
            self.ranks(runtime),
            self.checkpoint,
            self.optimizer,
        )?
        .sharded(
            &self.config,
            self.shard.optimizer_shards(runtime.workers()),
            self.shard.weight_shards(runtime.workers()),
        )
        .offloaded(&self.config, self.offload);
        let copies = runtime.workers_per_device() as f64;
        need.weights *= copies;
        need.grads *= copies;
        need.optimizer *= copies;
        Ok(need)
    }

    /// Refuses the job on `runtime` if it would not fit; on a GPU says the estimate on standard
    /// error first.
    pub fn check(&self, runtime: &Runtime, gpu: Option<&OpenedGpu>) -> Result<()> {
        let Some(gpu) = gpu else {
            return match runtime.device {
                Device::Cpu => CpuTraining {
                    config: &self.config,
                    seq: self.seq,
                    total_workers: runtime.workers(),
                    workers_here: runtime.workers_per_device(),
                    policy: self.checkpoint,
                    offload: self.offload,
                    optimizer: self.optimizer,
                    weight_shards: self.shard.weight_shards(runtime.workers()),
                    optimizer_shards: self.shard.optimizer_shards(runtime.workers()),
                }
                .ensure_fits(),
                Device::Cuda => Ok(()),
            };
        };
        let head_dim = self.config.head_dim;
        if !gpu.head_dims.contains(&head_dim) {
            bail!(
                "{} has head dim {head_dim}, but the CUDA attention kernels support {:?}: use --device cpu",
                self.model,
                gpu.head_dims
            );
        }
        let need = self.gpu_estimate(runtime)?;
        let ranks = self.ranks(runtime);
        let share = match ranks {
            Some((workers, schedule)) => format!(" over {workers} GPUs ({schedule}), one rank"),
            None => String::new(),
        };
        let what = format!(
            "{} ({} layers) at {} tokens{share} with checkpoint {}{}{}",
            self.model,
            self.config.num_hidden_layers,
            self.seq,
            self.checkpoint,
            match self.offload {
                Offload::None => "",
                Offload::Activations => " offloaded",
            },
            match (self.optimizer, self.shard) {
                (false, _) => String::new(),
                (true, Shard::None) => " and AdamW".into(),
                (true, s) => format!(" and AdamW (--shard {})", s.name()),
            }
        );
        match cost::check_fits(&need, gpu.free_bytes, &what) {
            Ok(()) => eprintln!(
                "GPU {}: {what} needs {} of {:.1} GiB free",
                gpu.ordinal,
                need.describe(),
                cost::gib(gpu.free_bytes as f64)
            ),
            Err(e) if self.ignore_estimate => {
                eprintln!("note: {e:#}; starting anyway (--ignore-memory-estimate)")
            }
            Err(e) => bail!(
                "{e:#} (the estimate is the step's tensors plus 1.5 GiB for cuBLAS, kernel modules and fragmentation: --ignore-memory-estimate starts anyway)"
            ),
        }
        if need.pinned_host > 0.0 {
            resources::ensure_fits(
                need.pinned_host,
                &format!("pinning the offloaded checkpoints of {what}"),
                "run without --offload, or with a shorter sequence",
            )?;
        }
        if let Topology::Threads(n @ 2..) = runtime.topology {
            eprintln!(
                "note: {n} virtual workers share GPU 0 (exact, not fast); for one process per GPU start `distflash launch --nproc-per-node {n} -- ...`"
            );
        }
        Ok(())
    }
}
