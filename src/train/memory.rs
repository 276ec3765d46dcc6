//! The memory a model job needs, checked where it runs before anything of it is allocated: on a
//! GPU the estimated peak of the step ([`gpu_estimate`]) against the opened device's free
//! memory; on the CPU the model state and activations every worker holds against this
//! machine's available memory (`resources::CpuTraining`). A run
//! that would not fit is refused with the figures and a fix, never killed halfway.

use super::estimate;
use super::step_plan::StepPlan;
use crate::error::Error;
use crate::model::config::Config;
use crate::model::cost;
use crate::model::lengths::Precision;
use crate::model::weights::parameters;
use crate::plan::{Partition, Schedule};
use crate::resources::{self, CpuTraining};
use crate::runtime::{Device, OpenedGpu, Runtime, Topology};
use anyhow::{Result, bail};

/// What a model job is about to run, for its memory estimate.
#[derive(Clone, Debug)]
pub struct MemoryCheck {
    pub config: Config,
    /// Name of the model in messages (a preset, or the file it came from).
    pub model: String,
    /// Tokens of the whole sequence.
    pub seq: usize,
    /// How the step runs: what it keeps and offloads (offloaded checkpoints leave two layers'
    /// on the GPU and need pinned host memory for all of them; offloaded moments leave two
    /// tensors' on the GPU during the update and need pinned host memory for all of this
    /// worker's), whether AdamW's state must fit too, and what the workers shard.
    pub plan: StepPlan,
    /// The f32 copies of the model's state the reporter brings to the host beside a GPU's
    /// tensors (and the pinned checkpoints): counted against this machine's memory so that a
    /// save cannot be killed for memory halfway through a run.
    pub host_state: HostState,
    /// Start even when the estimate exceeds the free GPU memory (`--ignore-memory-estimate`):
    /// the estimate is the step's tensors plus a 1.5 GiB allowance for cuBLAS, kernel modules and
    /// fragmentation, and a run that needs less of that allowance may still fit.
    pub ignore_estimate: bool,
}

/// What a job's reporter gathers on the host in f32, one copy of every parameter each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostState {
    /// Nothing (a benchmark's step, or a `train` run that saves nothing).
    None,
    /// The final weights (a run that asks for them) or the gradients (`grads`).
    Weights,
    /// The weights and AdamW's two moments, which a checkpoint holds (`train --save-dir`).
    WeightsAndMoments,
}

impl HostState {
    /// Bytes of the f32 copies for a model of `params` parameters.
    pub fn bytes(self, params: usize) -> f64 {
        let copies = match self {
            HostState::None => 0.0,
            HostState::Weights => 1.0,
            HostState::WeightsAndMoments => 3.0,
        };
        copies * 4.0 * params as f64
    }
}

/// Where the workers of a step run, which decides how its GPU memory is estimated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `n` worker threads sharing one GPU, the whole sequence among them: one is a single
    /// worker; more are virtual workers, each with its own copy of the model's state.
    OneGpu(usize),
    /// One rank of a run over `gpus` GPUs, one process (worker) each, the sequence split
    /// across them by `schedule`.
    Ranks { gpus: usize, schedule: Schedule },
}

impl Placement {
    /// Where `runtime`'s workers run: a launched job's ranks split the sequence by `schedule`.
    pub fn of(runtime: &Runtime, schedule: Schedule) -> Placement {
        match &runtime.topology {
            Topology::Ranks(env) => Placement::Ranks {
                gpus: env.world,
                schedule,
            },
            Topology::Threads(n) => Placement::OneGpu(*n),
        }
    }

    /// Workers the sequence is split across.
    pub fn workers(self) -> usize {
        match self {
            Placement::OneGpu(n) => n,
            Placement::Ranks { gpus, .. } => gpus,
        }
    }

    /// The GPUs and schedule of a launched run over more than one.
    fn ranks(self) -> Option<(usize, Schedule)> {
        match self {
            Placement::Ranks { gpus, schedule } if gpus > 1 => Some((gpus, schedule)),
            _ => None,
        }
    }
}

/// One GPU's training step, as much of it as its memory depends on.
#[derive(Clone, Copy, Debug)]
pub struct GpuStep<'a> {
    pub cfg: &'a Config,
    /// Tokens of the whole sequence.
    pub seq: usize,
    pub plan: StepPlan,
    pub placement: Placement,
}

/// The estimated peak GPU memory of a step, and, when it was counted from the code, the count
/// itself (with what its working set held at the peak).
#[derive(Clone, Debug)]
pub struct GpuEstimate {
    pub memory: cost::StepMemory,
    pub peaks: Option<estimate::Peaks>,
}

/// The estimated peak GPU memory of `step`, decided here for every caller (the start-up check,
/// `bench train --estimate`), always counted from the code on the counting device
/// (`train::estimate`). One worker on one GPU: the step itself, the device's whole-sequence
/// attention included. Several: each worker's rank step (`estimate::rank_estimate`: its share
/// of the sequence through the executor, its shard of the model's state); a run over several
/// GPUs needs what its largest rank needs, and threads sharing one GPU (virtual workers) hold
/// every worker's tensors beside each other's, with one allowance.
pub fn gpu_estimate(step: GpuStep<'_>) -> Result<GpuEstimate> {
    let (cfg, plan) = (step.cfg, step.plan);
    plan.ensure_workers(step.placement.workers())?;
    if plan.workers() == 1 {
        let peaks = estimate::estimate(
            estimate::Step {
                cfg,
                seq: step.seq,
                keep: plan.keep(),
                optimizer: plan.has_optimizer(),
            },
            Precision::Cuda,
        )?;
        return Ok(GpuEstimate {
            memory: peaks.step_memory(),
            peaks: Some(peaks),
        });
    }
    let partition = Partition::new(step.seq, plan.workers(), plan.schedule())?;
    let ranks = (0..plan.workers())
        .map(|rank| estimate::rank_estimate(cfg, &plan, &partition, rank))
        .collect::<Result<Vec<_>>>()?;
    if let Placement::OneGpu(_) = step.placement {
        let memory = ranks
            .iter()
            .map(estimate::Peaks::step_memory)
            .reduce(cost::StepMemory::beside)
            .expect("a step has at least one worker");
        return Ok(GpuEstimate {
            memory,
            peaks: None,
        });
    }
    let largest = ranks
        .into_iter()
        .max_by_key(|r| r.device.total())
        .expect("a step has at least one worker");
    Ok(GpuEstimate {
        memory: largest.step_memory(),
        peaks: Some(largest),
    })
}

impl MemoryCheck {
    /// The estimated peak GPU memory of this process on `runtime` ([`gpu_estimate`]).
    pub fn gpu_estimate(&self, runtime: &Runtime) -> Result<cost::StepMemory> {
        Ok(gpu_estimate(GpuStep {
            cfg: &self.config,
            seq: self.seq,
            plan: self.plan,
            placement: Placement::of(runtime, self.plan.schedule()),
        })?
        .memory)
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
                    policy: self.plan.checkpoint(),
                    offload: self.plan.offload(),
                    optimizer: self.plan.has_optimizer(),
                    weight_shards: self.plan.weight_shards(),
                    optimizer_shards: self.plan.optimizer_shards(),
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
        let share = match Placement::of(runtime, self.plan.schedule()).ranks() {
            Some((workers, schedule)) => format!(" over {workers} GPUs ({schedule}), one rank"),
            None => String::new(),
        };
        let what = format!(
            "{} ({} layers) at {} tokens{share}, {}",
            self.model, self.config.num_hidden_layers, self.seq, self.plan
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
            Err(e) => {
                return Err(Error::out_of_memory(format!(
                    "{e:#} (the estimate is the step's tensors plus 1.5 GiB for cuBLAS, kernel modules and fragmentation: --ignore-memory-estimate starts anyway)"
                )));
            }
        }
        let state = self.host_state.bytes(parameters(&self.config));
        if need.pinned() + state > 0.0 {
            let (holding, fix) = match (need.pinned() > 0.0, self.host_state) {
                (true, HostState::WeightsAndMoments) => (
                    "pinning what --offload moves to the host and gathering the f32 weights and moments a checkpoint saves",
                    "run without --offload, with a shorter sequence, or without --save-dir",
                ),
                (true, _) => (
                    "pinning what --offload moves to the host and bringing the f32 weights back",
                    "run without --offload, or with a shorter sequence",
                ),
                (false, HostState::WeightsAndMoments) => (
                    "gathering the f32 weights and moments a checkpoint saves",
                    "run without --save-dir, or on a machine with more memory",
                ),
                (false, _) => (
                    "bringing the f32 weights back",
                    "run on a machine with more memory",
                ),
            };
            resources::ensure_fits(need.pinned() + state, &format!("{holding} for {what}"), fix)?;
        }
        if let Topology::Threads(n @ 2..) = runtime.topology {
            eprintln!(
                "note: {n} virtual workers share GPU 0 (exact, not fast); for one process per GPU start `distflash launch --nproc-per-node {n} -- ...`"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, Keep, Offload};
    use crate::train::step_plan::Shard;
    use crate::train::step_plan::{Asked, Purpose};
    use std::time::Duration;

    /// A training step's plan over `workers` GPUs with `offload` and `shard` asked for.
    fn plan(config: &Config, offload: Offload, shard: Shard, workers: usize) -> StepPlan {
        let asked = Asked {
            offload,
            shard: Some(shard),
            ..Asked::default()
        };
        StepPlan::resolve(asked, Purpose::Train, workers, config, Device::Cuda)
            .unwrap()
            .plan
    }

    /// A GPU run whose host copies of the state cannot fit this machine's memory is refused
    /// before it starts, naming the save; without the save only the final weights count.
    #[test]
    fn the_host_copies_of_a_save_are_checked_before_the_run() {
        // About 300B parameters: 3.6 TB of f32 weights and moments, more than any machine
        // running this test has, 1.2 TB for the weights alone.
        let config = Config {
            num_hidden_layers: 400,
            ..Config::preset("llama2-7b").unwrap()
        };
        let gpu = OpenedGpu {
            ordinal: 0,
            free_bytes: usize::MAX / 4,
            head_dims: &[128],
        };
        let runtime = Runtime {
            device: Device::Cuda,
            ..Runtime::cpu_threads(1, Duration::from_secs(1))
        };
        let check = |host_state| MemoryCheck {
            config: config.clone(),
            model: "big".into(),
            seq: 1024,
            plan: plan(&config, Offload::NONE, Shard::None, 1),
            host_state,
            ignore_estimate: false,
        };
        if resources::available().is_none() {
            return; // no /proc/meminfo: nothing to check against
        }
        let e = check(HostState::WeightsAndMoments)
            .check(&runtime, Some(&gpu))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("gathering the f32 weights and moments a checkpoint saves for big"),
            "{e}"
        );
        assert!(
            e.ends_with("run without --save-dir, or on a machine with more memory"),
            "{e}"
        );
        let e = check(HostState::Weights)
            .check(&runtime, Some(&gpu))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bringing the f32 weights back for big"),
            "{e}"
        );
        assert!(check(HostState::None).check(&runtime, Some(&gpu)).is_ok());
        // Offloaded, the moments are pinned host memory, checked before the run too.
        let offloaded = |shard, workers| MemoryCheck {
            plan: plan(&config, Offload::OPTIMIZER, shard, workers),
            ..check(HostState::None)
        };
        let e = offloaded(Shard::None, 1)
            .check(&runtime, Some(&gpu))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("pinning what --offload moves to the host"),
            "{e}"
        );
        assert!(
            e.ends_with("run without --offload, or with a shorter sequence"),
            "{e}"
        );
        // Both moments and the master, f32.
        let moments = 12.0 * parameters(&config) as f64;
        let need = offloaded(Shard::None, 1).gpu_estimate(&runtime).unwrap();
        assert_eq!((need.optimizer, need.pinned_optimizer), (0.0, moments));
        // Every estimate is a counted step, whose peak (in the backward) holds none of the
        // state: its staging is part of the update's moment, counted where it happens. Two
        // virtual workers on the GPU are each counted and held beside each other: each pins
        // its own state (its shard, if sharded).
        assert_eq!(need.staging, 0.0);
        let two = Runtime {
            device: Device::Cuda,
            ..Runtime::cpu_threads(2, Duration::from_secs(1))
        };
        let whole = offloaded(Shard::None, 2).gpu_estimate(&two).unwrap();
        assert_eq!(whole.pinned_optimizer, 2.0 * moments);
        let halves = offloaded(Shard::Optimizer, 2).gpu_estimate(&two).unwrap();
        assert_eq!(halves.pinned_optimizer, moments);
        let params = parameters(&config);
        assert_eq!(
            HostState::WeightsAndMoments.bytes(params),
            12.0 * params as f64
        );
    }

    /// One worker on one GPU is the counted step, with its count, whether a thread or the one
    /// rank of a launch; several ranks are each counted (their rank step), and the largest is
    /// the estimate; virtual workers hold all their counts at once.
    #[test]
    fn every_worker_is_counted_from_the_code() {
        let cfg = Config::preset("tiny").unwrap();
        let step = |placement: Placement| GpuStep {
            cfg: &cfg,
            seq: 256,
            plan: plan(&cfg, Offload::NONE, Shard::Optimizer, placement.workers()),
            placement,
        };
        let counted = estimate::estimate(
            estimate::Step {
                cfg: &cfg,
                seq: 256,
                keep: Keep::on_device(Checkpoint::Remat),
                optimizer: true,
            },
            Precision::Cuda,
        )
        .unwrap();
        let one_rank = Placement::Ranks {
            gpus: 1,
            schedule: Schedule::Zigzag,
        };
        for placement in [Placement::OneGpu(1), one_rank] {
            let e = gpu_estimate(step(placement)).unwrap();
            assert_eq!(e.peaks.as_ref(), Some(&counted), "{placement:?}");
            assert_eq!(e.memory.total(), counted.step_memory().total());
        }
        let two_ranks = Placement::Ranks {
            gpus: 2,
            schedule: Schedule::Balanced,
        };
        // Two ranks are counted each, and the larger one is the estimate; two virtual workers
        // sharing the GPU hold both ranks' counts beside each other (no one count is theirs).
        let e = gpu_estimate(step(two_ranks)).unwrap();
        let peaks = e.peaks.expect("a rank is counted");
        assert_eq!(e.memory.total(), peaks.step_memory().total());
        assert!(
            gpu_estimate(step(Placement::OneGpu(2)))
                .unwrap()
                .peaks
                .is_none()
        );
        // Two virtual workers hold two copies of the weights; two ranks one each.
        let weights = |p| gpu_estimate(step(p)).unwrap().memory.weights;
        assert_eq!(weights(Placement::OneGpu(2)), 2.0 * weights(two_ranks));
    }
}
