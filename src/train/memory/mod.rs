//! The memory a model job needs, checked where it runs before anything of it is allocated, and
//! always counted from the code (`estimate`: the step run on a counting device): on a GPU the
//! step's peak ([`gpu_estimate`]) against the opened device's free memory; on the CPU every
//! worker's step of this process ([`CpuStep`]) against this machine's available memory. A run
//! that would not fit is refused with the figures and a fix, never killed halfway.

pub mod count;
mod counted;
pub mod estimate;
pub mod lengths;

use crate::error::Error;
use crate::model::config::Config;
use crate::model::cost;
use crate::model::weights::parameters;
use crate::model::{Checkpoint, Offload};
use crate::plan::Schedule;
use crate::resources;
use crate::runtime::{Device, OpenedGpu, Runtime, Topology};
use crate::train::step_plan::StepPlan;
use anyhow::{Result, bail};
use lengths::Precision;

/// Memory beyond the estimate that whole layers chosen for a step (`--whole-layers auto`) leave
/// free: memory the run did not ask to use, so a step that fits without them must not fail
/// with them. The estimate's own allowance (1.5 GiB) is inside it; this is on top.
pub const WHOLE_LAYERS_MARGIN: f64 = 2.5 * (1u64 << 30) as f64;

/// Whether a step needing `need` leaves [`WHOLE_LAYERS_MARGIN`] of `free` bytes: the test every
/// use of spare memory on speed (whole layers, the MLP's whole rows) must pass.
fn spares_margin(need: &cost::StepMemory, free: usize) -> bool {
    need.total() + WHOLE_LAYERS_MARGIN <= free as f64
}

/// The most of this machine's available memory `--offload auto` pins for checkpoints (beside
/// the host copies of the state a run brings back): what it was not asked to take, so it leaves
/// a quarter to the data, the tokenizer and whatever else the machine runs.
pub const AUTO_PIN_SHARE: f64 = 0.75;

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
    /// Bytes an element of AdamW's master of a 16-bit weight: its format's
    /// (`InputDtype::master_bytes`).
    pub master_bytes: usize,
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
/// (`train::memory::estimate`). One worker on one GPU: the step itself, the device's whole-sequence
/// attention included. Several: each worker's rank step (`estimate::rank_estimate`: its share
/// of the sequence through the executor, its shard of the model's state); a run over several
/// GPUs needs what its largest rank needs, and threads sharing one GPU (virtual workers) hold
/// every worker's tensors beside each other's, with one allowance.
pub fn gpu_estimate(step: GpuStep<'_>) -> Result<GpuEstimate> {
    let (cfg, plan) = (step.cfg, step.plan);
    let precision = Precision::Cuda {
        master_bytes: step.master_bytes,
    };
    plan.ensure_workers(step.placement.workers())?;
    if plan.workers() == 1 {
        let peaks = estimate::estimate(
            estimate::Step {
                cfg,
                seq: step.seq,
                keep: plan.keep(),
                optimizer: plan.has_optimizer(),
            },
            precision,
        )?;
        return Ok(GpuEstimate {
            memory: peaks.step_memory(),
            peaks: Some(peaks),
        });
    }
    let ranks = estimate::every_rank(cfg, &plan, step.seq, precision)?;
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
            master_bytes: runtime.dtype.master_bytes(),
        })?
        .memory)
    }

    /// What a step too large for `free` bytes of its GPU should change, on a machine of `host`
    /// bytes available: the plan that fits ([`MemoryCheck::fitting_plan`]) with its estimate,
    /// or what else there is to change.
    fn fix_for(&self, runtime: &Runtime, free: usize, host: f64) -> Result<String> {
        Ok(match self.fitting_plan(runtime, free, host)? {
            Some((plan, m)) => format!("it would fit as {} ({})", plan_flags(&plan), m.describe()),
            None => cost::GPU_FIX.to_string(),
        })
    }

    /// The first plan like this one that fits `free` bytes of the GPU and `host` bytes of this
    /// machine's memory, changing least: the optimizer's state offloaded, then the
    /// checkpoints, then both, then `--checkpoint layer` with each of those; with its
    /// estimate. What a refusal proposes.
    fn fitting_plan(
        &self,
        runtime: &Runtime,
        free: usize,
        host: f64,
    ) -> Result<Option<(StepPlan, cost::StepMemory)>> {
        let plan = &self.plan;
        let state = self.host_state.bytes(parameters(&self.config));
        let offloads = [Offload::OPTIMIZER, Offload::ACTIVATIONS, Offload::ALL];
        for checkpoint in [plan.checkpoint(), Checkpoint::Layer] {
            let moved = offloads.iter().map(|&o| o.and(plan.offload()));
            for offload in std::iter::once(plan.offload()).chain(moved) {
                let other = plan.with(checkpoint, offload);
                if other == *plan {
                    continue;
                }
                let check = MemoryCheck {
                    plan: other,
                    ..self.clone()
                };
                let m = check.gpu_estimate(runtime)?;
                if m.total() <= free as f64 && m.pinned() + state <= host {
                    return Ok(Some((other, m)));
                }
            }
        }
        Ok(None)
    }

    /// The plan that spends what `free` bytes of the GPU leave beside the step (`need`, its
    /// estimate as planned), less [`WHOLE_LAYERS_MARGIN`], on speed, with that plan's estimate:
    /// first the most whole layers that fit ([`MemoryCheck::most_whole_layers`]), then the MLP
    /// over whole rows ([`StepPlan::with_whole_mlp`]) where what is left still holds it. The
    /// layers first, so that the rows never cost one: a whole layer measured about 0.8% of the
    /// 16K step on an H100 (16 layers, `bench/results/low-half-master-2026-12-06`), the rows
    /// 0.7% there and 1.3% on an H200 (32 layers, `bench/results/h200-step-2026-12-06`), each
    /// beside the same whole layers. Whether a layer should give way to the rows is not settled:
    /// at 32K on the H100, 4 whole layers with them beat 5 without by 0.4%.
    fn spend_spare_memory(
        &self,
        runtime: &Runtime,
        free: usize,
        need: cost::StepMemory,
    ) -> Result<(StepPlan, cost::StepMemory)> {
        let (plan, need) = self.most_whole_layers(runtime, free, need)?;
        let whole_mlp = plan.with_whole_mlp();
        let with_mlp = MemoryCheck {
            plan: whole_mlp,
            ..self.clone()
        }
        .gpu_estimate(runtime)?;
        Ok(match spares_margin(&with_mlp, free) {
            true => (whole_mlp, with_mlp),
            false => (plan, need),
        })
    }

    /// The most whole layers ([`StepPlan::with_whole_layers`]) whose step still fits `free`
    /// bytes of the GPU with [`WHOLE_LAYERS_MARGIN`] to spare, with that step's estimate; none
    /// (and `need`, the estimate without them) when even one does not.
    fn most_whole_layers(
        &self,
        runtime: &Runtime,
        free: usize,
        need: cost::StepMemory,
    ) -> Result<(StepPlan, cost::StepMemory)> {
        let with = |n| -> Result<(StepPlan, cost::StepMemory)> {
            let plan = self.plan.with_whole_layers(n);
            let check = MemoryCheck {
                plan,
                ..self.clone()
            };
            Ok((plan, check.gpu_estimate(runtime)?))
        };
        // Each whole layer holds more than the one before it, so the estimate grows with n:
        // bisect for the last n that fits (`best`) below the first that does not (`over`).
        let mut best = (self.plan.with_whole_layers(0), need);
        let mut over = self.config.num_hidden_layers + 1;
        if !spares_margin(&need, free) {
            return Ok(best);
        }
        let mut low = 0;
        while over - low > 1 {
            let mid = (low + over) / 2;
            let (plan, m) = with(mid)?;
            if spares_margin(&m, free) {
                (low, best) = (mid, (plan, m));
            } else {
                over = mid;
            }
        }
        Ok(best)
    }

    /// Where `--offload auto` puts the layers' checkpoints on a GPU with `free` bytes, and why
    /// when it moves them: to pinned host memory where the step fits only so, or where that
    /// leaves room for more whole layers ([`MemoryCheck::most_whole_layers`]; the copies run
    /// beside the layers' compute, so each whole layer gained is recomputation saved: 0.8–1.5%
    /// of the step at 16K–64K on an H100, `bench/results/low-half-master-2026-12-06`); else
    /// nothing. Never where the pinned checkpoints and the host copies of the state would take
    /// more than `host` bytes ([`AUTO_PIN_SHARE`] of this machine's available memory, none where
    /// that cannot be read).
    fn decide_offload(
        &self,
        runtime: &Runtime,
        free: usize,
        host: f64,
    ) -> Result<(StepPlan, Option<String>)> {
        let plan = &self.plan;
        let kept = plan.with(plan.checkpoint(), Offload::NONE);
        let moved = plan.with(plan.checkpoint(), Offload::ACTIVATIONS);
        let check = |plan| MemoryCheck {
            plan,
            ..self.clone()
        };
        let (need_kept, need_moved) = (
            check(kept).gpu_estimate(runtime)?,
            check(moved).gpu_estimate(runtime)?,
        );
        let state = self.host_state.bytes(parameters(&self.config));
        if need_moved.total() > free as f64 || need_moved.pinned() + state > host {
            return Ok((kept, None));
        }
        let pinned = cost::gib(need_moved.pinned());
        if need_kept.total() > free as f64 {
            let why = format!(
                "the step fits the GPU only with its checkpoints in host memory ({pinned:.1} GiB pinned)"
            );
            return Ok((moved, Some(why)));
        }
        if !kept.decides_whole_layers() {
            return Ok((kept, None));
        }
        let whole = |plan, need| -> Result<usize> {
            Ok(check(plan)
                .most_whole_layers(runtime, free, need)?
                .0
                .whole_layers())
        };
        let (stay, more) = (whole(kept, need_kept)?, whole(moved, need_moved)?);
        Ok(match more > stay {
            true => {
                let why = format!(
                    "with the checkpoints in host memory ({pinned:.1} GiB pinned) {more} layers stay whole instead of {stay}"
                );
                (moved, Some(why))
            }
            false => (kept, None),
        })
    }

    /// Refuses the job on `runtime` if it would not fit; on a GPU says the estimate on standard
    /// error first. Returns the plan to run: this one, with the number of whole layers decided
    /// where it was left to the device's memory (one GPU: as many as fit).
    pub fn check(&self, runtime: &Runtime, gpu: Option<&OpenedGpu>) -> Result<StepPlan> {
        let Some(gpu) = gpu else {
            match runtime.device {
                Device::Cpu => CpuStep {
                    config: &self.config,
                    seq: self.seq,
                    plan: &self.plan,
                    workers_here: runtime.workers_per_device(),
                }
                .ensure_fits()?,
                Device::Cuda => {}
            };
            return Ok(self.plan);
        };
        let head_dim = self.config.head_dim;
        if !gpu.head_dims.contains(&head_dim) {
            bail!(
                "{} has head dim {head_dim}, but the CUDA attention kernels support {:?}: use --device cpu",
                self.model,
                gpu.head_dims
            );
        }
        if self.plan.decides_offload() {
            let host = resources::available().unwrap_or(0.0) * AUTO_PIN_SHARE;
            let (plan, why) = self.decide_offload(runtime, gpu.free_bytes, host)?;
            if let Some(why) = why {
                eprintln!(
                    "note: --offload auto moves each layer's checkpoint to host memory: {why}"
                );
            }
            let decided = MemoryCheck {
                plan,
                ..self.clone()
            };
            return decided.check(runtime, Some(gpu));
        }
        let need = self.gpu_estimate(runtime)?;
        let share = match Placement::of(runtime, self.plan.schedule()).ranks() {
            Some((workers, schedule)) => format!(" over {workers} GPUs ({schedule}), one rank"),
            None => String::new(),
        };
        let what = |plan: &StepPlan| {
            format!(
                "{} ({} layers) at {} tokens{share}, {plan}",
                self.model, self.config.num_hidden_layers, self.seq
            )
        };
        let fix = match need.total() > gpu.free_bytes as f64 {
            true => {
                let host = resources::available().unwrap_or(f64::INFINITY);
                self.fix_for(runtime, gpu.free_bytes, host)?
            }
            false => String::new(),
        };
        let (plan, need) = match cost::check_fits(&need, gpu.free_bytes, &what(&self.plan), &fix) {
            Ok(()) => {
                let (plan, need) = match self.plan.decides_whole_layers() {
                    true => self.spend_spare_memory(runtime, gpu.free_bytes, need)?,
                    false => (self.plan, need),
                };
                eprintln!(
                    "GPU {}: {} needs {} of {:.1} GiB free",
                    gpu.ordinal,
                    what(&plan),
                    need.describe(),
                    cost::gib(gpu.free_bytes as f64)
                );
                (plan, need)
            }
            Err(e) if self.ignore_estimate => {
                eprintln!("note: {e:#}; starting anyway (--ignore-memory-estimate)");
                (self.plan, need)
            }
            Err(e) => {
                return Err(Error::out_of_memory(format!(
                    "{e:#} (the estimate is the step's tensors plus 1.5 GiB for cuBLAS, kernel modules and fragmentation: --ignore-memory-estimate starts anyway)"
                )));
            }
        };
        let what = what(&plan);
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
        Ok(plan)
    }
}

/// A CPU step of `plan` over `seq` tokens with `workers_here` of its workers in this process
/// (all of them as threads, or one rank of a launch).
#[derive(Clone, Copy, Debug)]
pub struct CpuStep<'a> {
    pub config: &'a Config,
    pub seq: usize,
    pub plan: &'a StepPlan,
    pub workers_here: usize,
}

/// A CPU step's host bytes, counted: the model's state and the step's tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuBytes {
    /// The workers' weights, gradients and AdamW state (each its shard), the run's own host
    /// copies (the weights it starts from and returns, and the moments a save gathers) and the
    /// process's allowance: what does not grow with the sequence.
    pub state: f64,
    /// The workers' activations and their gradients at the peak, the offloaded checkpoints'
    /// host copies included (the same memory on the CPU).
    pub step: f64,
}

/// The flags that ask for `plan`'s checkpoint policy and offload.
fn plan_flags(plan: &StepPlan) -> String {
    let offload = match plan.offload().any() {
        true => format!(" --offload {}", plan.offload()),
        false => String::new(),
    };
    format!("--checkpoint {}{offload}", plan.checkpoint())
}

impl CpuBytes {
    pub fn total(&self) -> f64 {
        self.state + self.step
    }
}

impl CpuStep<'_> {
    /// The bytes, counted from the code: each worker's rank step on the counting device
    /// modelling the CPU backend (every tensor f32, `estimate::rank_estimate`), this process's
    /// workers beside each other (a launched rank takes the largest rank's count), plus the
    /// run's host copies and the process's allowance.
    pub fn bytes(&self) -> Result<CpuBytes> {
        let (plan, workers) = (self.plan, self.plan.workers());
        let ranks = estimate::every_rank(self.config, plan, self.seq, Precision::Uniform(4))?;
        let split = |p: &estimate::Peaks| {
            let (d, h) = (&p.device, &p.host);
            let state = d.weights + d.grads + d.optimizer + h.weights + h.grads + h.optimizer;
            (state as f64, (d.kept + d.step + h.kept + h.step) as f64)
        };
        let (mut state, mut step) = match self.workers_here >= workers {
            true => ranks
                .iter()
                .map(split)
                .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1)),
            false => {
                let largest = ranks.iter().map(split).fold((0.0, 0.0), |a, b| {
                    if a.0 + a.1 >= b.0 + b.1 { a } else { b }
                });
                let here = self.workers_here as f64;
                (largest.0 * here, largest.1 * here)
            }
        };
        let copies = if plan.has_optimizer() { 3.0 } else { 2.0 };
        state += resources::PROCESS_BYTES + copies * 4.0 * parameters(self.config) as f64;
        // Every worker draws the whole sequence's tokens, targets and positions.
        step += self.workers_here as f64 * 12.0 * (self.seq as f64 + 1.0);
        Ok(CpuBytes { state, step })
    }

    /// Refuses the run, with the figure and a fix, when it does not fit in this machine's
    /// available memory.
    pub fn ensure_fits(&self) -> Result<()> {
        let Some(have) = resources::available() else {
            return Ok(());
        };
        self.fits_in(have)
    }

    /// [`CpuStep::ensure_fits`] against `have` bytes, so the sentence is testable anywhere.
    fn fits_in(&self, have: f64) -> Result<()> {
        let params = parameters(self.config) as f64;
        let size = match params >= 1e9 {
            true => format!("{:.2}B", params / 1e9),
            false => format!("{:.2}M", params / 1e6),
        };
        let here = self.workers_here;
        let what = format!(
            "{} a model of {size} parameters on the CPU over {} tokens with {here} worker{} here",
            match self.plan.has_optimizer() {
                true => "training",
                false => "a gradient step of",
            },
            self.seq,
            if here == 1 { "" } else { "s" }
        );
        let need = self.bytes()?;
        let fix = if need.state > have / 2.0 {
            "use a smaller model (such as --preset tiny) or fewer --workers".to_string()
        } else {
            // The step's tensors grow about linearly with the sequence.
            let per_token = need.step / self.seq.max(1) as f64;
            let longest = ((have - need.state) / per_token).floor();
            let policy = match self.plan.checkpoint() {
                crate::model::Checkpoint::Layer => "",
                _ => ", or --checkpoint layer (it keeps the least)",
            };
            format!("use --seq-len {longest:.0} or less{policy}")
        };
        resources::refuse_above(need.total(), have, &what, &fix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, Keep, Offload};
    use crate::resources;
    use crate::train::step_plan::Shard;
    use crate::train::step_plan::{Asked, Purpose, WholeLayers};
    use std::time::Duration;

    /// `workers` threads sharing one GPU (the runtime a memory check sees; nothing is opened).
    fn gpu_threads(workers: usize) -> Runtime {
        Runtime {
            device: Device::Cuda,
            ..Runtime::cpu_threads(workers, Duration::from_secs(1))
        }
    }

    /// GPU 0 opened with `free_bytes` free, its kernels taking head dim 128.
    fn gpu(free_bytes: usize) -> OpenedGpu {
        OpenedGpu {
            ordinal: 0,
            free_bytes,
            head_dims: &[128],
        }
    }

    /// llama2-7b's check at `seq` tokens under `plan`, nothing brought to the host.
    fn llama7b_check(config: &Config, seq: usize, plan: StepPlan) -> MemoryCheck {
        MemoryCheck {
            config: config.clone(),
            model: "llama2-7b".into(),
            seq,
            plan,
            host_state: HostState::None,
            ignore_estimate: false,
        }
    }

    /// A training step's plan over `workers` GPUs with `offload` and `shard` asked for.
    fn plan(config: &Config, offload: Offload, shard: Shard, workers: usize) -> StepPlan {
        let asked = Asked {
            offload: offload.into(),
            shard: Some(shard),
            ..Asked::default()
        };
        StepPlan::resolve(asked, Purpose::Train, workers, config, Device::Cuda)
            .unwrap()
            .plan
    }

    /// With `--whole-layers auto` one GPU keeps as many of the last layers whole as its free
    /// memory holds beside the step with the margin to spare, then runs the MLP over whole rows
    /// where what is left holds that too, and says so; a number asked is kept, and several
    /// workers, the CPU and `--checkpoint none` decide neither.
    #[test]
    fn whole_layers_fill_the_free_memory_less_the_margin() {
        let config = Config::preset("llama2-7b").unwrap();
        let runtime = gpu_threads(1);
        let check = |plan| llama7b_check(&config, 16384, plan);
        let auto = plan(&config, Offload::NONE, Shard::None, 1);
        assert!(auto.decides_whole_layers());
        let need = |n: usize, mlp: bool| {
            let plan = auto.with_whole_layers(n);
            let plan = if mlp { plan.with_whole_mlp() } else { plan };
            check(plan).gpu_estimate(&runtime).unwrap().total()
        };
        // Room for exactly 5 whole layers and the margin (a byte short of a sixth, or of the
        // MLP's whole rows beside the five, which cost less than a sixth layer here).
        let free = |n: usize, mlp| (need(n, mlp) + WHOLE_LAYERS_MARGIN) as usize;
        assert!(need(6, false) > need(5, true) && need(5, true) > need(5, false));
        assert!(need(5, false) > need(1, false));
        for (room, whole, mlp) in [
            (free(5, false), 5, false),
            (free(5, true) - 1, 5, false),
            (free(5, true), 5, true),
            (free(6, false) - 1, 5, true),
            (free(0, false) - 1, 0, false),
            (free(32, true), 32, true),
            (free(32, true) - 1, 32, false),
        ] {
            let chosen = check(auto).check(&runtime, Some(&gpu(room))).unwrap();
            let what = format!("{room} bytes free");
            assert_eq!(chosen.whole_layers(), whole, "{what}");
            assert_eq!(chosen.keep().whole_mlp, mlp, "{what}");
            assert!(!chosen.decides_whole_layers());
            let said = chosen.to_string();
            let says = crate::train::step_plan::whole_layers_said(whole)
                + crate::train::step_plan::whole_mlp_said(mlp);
            assert!(said.contains(&says), "{what}: {said}");
        }
        // Asked for a number, or not one GPU's single worker, or nothing to recompute: kept.
        let asked = StepPlan::resolve(
            Asked {
                whole_layers: WholeLayers::Exactly(2),
                offload: Offload::NONE.into(),
                ..Asked::default()
            },
            Purpose::Train,
            1,
            &config,
            Device::Cuda,
        )
        .unwrap()
        .plan;
        let none =
            plan(&config, Offload::NONE, Shard::None, 1).with(Checkpoint::None, Offload::NONE);
        for kept in [asked, none] {
            let chosen = check(kept)
                .check(&runtime, Some(&gpu(free(32, true))))
                .unwrap();
            assert_eq!(chosen, kept);
        }
        assert!(!plan(&config, Offload::NONE, Shard::None, 2).decides_whole_layers());
    }

    /// `--offload auto` on one GPU moves the checkpoints to host memory where the step fits only
    /// so, or where that keeps more layers whole, and says why; nothing where neither, where the
    /// host cannot pin them, or where it is not for the device to decide (asked for, the CPU,
    /// several workers, `--checkpoint none`).
    #[test]
    fn offload_auto_moves_the_checkpoints_only_where_that_helps() {
        let config = Config::preset("llama2-7b").unwrap();
        let runtime = gpu_threads(1);
        let resolve = |asked: Asked, workers, device| {
            StepPlan::resolve(asked, Purpose::Train, workers, &config, device)
                .unwrap()
                .plan
        };
        let auto = resolve(Asked::default(), 1, Device::Cuda);
        assert!(auto.decides_offload() && auto.decides_whole_layers());
        assert_eq!(auto.offload(), Offload::NONE);
        let check = |plan| llama7b_check(&config, 16384, plan);
        let need = |offload, whole: usize| {
            let plan = auto
                .with(Checkpoint::Remat, offload)
                .with_whole_layers(whole);
            check(plan).gpu_estimate(&runtime).unwrap()
        };
        let (kept, moved) = (need(Offload::NONE, 0), need(Offload::ACTIVATIONS, 0));
        assert!(moved.total() < kept.total() && moved.pinned() > 0.0);
        let host = 2.0 * moved.pinned();
        let decide = |free: f64, host| check(auto).decide_offload(&runtime, free as usize, host);
        // Fits only moved: moved, and said so.
        let (plan, why) = decide(kept.total() - 1.0, host).unwrap();
        assert_eq!(plan.offload(), Offload::ACTIVATIONS);
        assert!(!plan.decides_offload());
        let why = why.unwrap();
        assert!(
            why.starts_with("the step fits the GPU only with its checkpoints"),
            "{why}"
        );
        // ... but not where the host cannot pin them: kept, for the refusal to say.
        let (plan, why) = decide(kept.total() - 1.0, moved.pinned() - 1.0).unwrap();
        assert_eq!((plan.offload(), why), (Offload::NONE, None));
        // Room for 5 whole layers kept: moved holds more of them.
        let five = need(Offload::NONE, 5).total() + WHOLE_LAYERS_MARGIN;
        let (plan, why) = decide(five, host).unwrap();
        assert_eq!(plan.offload(), Offload::ACTIVATIONS);
        let why = why.unwrap();
        assert!(why.ends_with("layers stay whole instead of 5"), "{why}");
        let chosen = check(auto)
            .check(&runtime, Some(&gpu(five as usize)))
            .unwrap();
        assert!(chosen.whole_layers() > 5 && !chosen.decides_whole_layers());
        // Room for every layer whole either way: nothing to gain, nothing moved.
        let all = need(Offload::NONE, 32).total() + WHOLE_LAYERS_MARGIN;
        let (plan, why) = decide(all, host).unwrap();
        assert_eq!((plan.offload(), why), (Offload::NONE, None));
        // Not the device's to decide.
        let none = Asked {
            checkpoint: Checkpoint::None,
            ..Asked::default()
        };
        let asked = Asked {
            offload: Offload::NONE.into(),
            ..Asked::default()
        };
        assert!(!resolve(Asked::default(), 1, Device::Cpu).decides_offload());
        assert!(!resolve(Asked::default(), 2, Device::Cuda).decides_offload());
        assert!(!resolve(none, 1, Device::Cuda).decides_offload());
        assert!(!resolve(asked, 1, Device::Cuda).decides_offload());
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
        let runtime = gpu_threads(1);
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
        // Both moments, f32, and the bf16 weights' masters, their low halves.
        let moments = 10.0 * parameters(&config) as f64;
        let need = offloaded(Shard::None, 1).gpu_estimate(&runtime).unwrap();
        assert_eq!((need.optimizer, need.pinned_optimizer), (0.0, moments));
        // Every estimate is a counted step, whose peak (in the backward) holds none of the
        // state: its staging is part of the update's moment, counted where it happens. Two
        // virtual workers on the GPU are each counted and held beside each other: each pins
        // its own state (its shard, if sharded).
        assert_eq!(need.staging, 0.0);
        let two = gpu_threads(2);
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
            master_bytes: 2,
        };
        let counted = estimate::estimate(
            estimate::Step {
                cfg: &cfg,
                seq: 256,
                keep: Keep::on_device(Checkpoint::Remat),
                optimizer: true,
            },
            Precision::Cuda { master_bytes: 2 },
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

    /// `tiny`'s CPU step over `seq` tokens with `workers` threads under `asked`, counted.
    fn cpu(seq: usize, workers: usize, asked: Asked, purpose: Purpose) -> CpuBytes {
        let c = Config::preset("tiny").unwrap();
        let plan = StepPlan::resolve(asked, purpose, workers, &c, Device::Cpu)
            .unwrap()
            .plan;
        let step = CpuStep {
            config: &c,
            seq,
            plan: &plan,
            workers_here: workers,
        };
        step.bytes().unwrap()
    }

    /// A CPU step counts every worker's state and activations, from the code: f32 weights,
    /// gradients and two moments each (no master: the CPU's weights are f32) beside the run's
    /// three host copies; each layer's kept tensors for the worker's rows; more for a longer
    /// sequence, more keeping everything than keeping x alone; gradients alone hold no moments.
    #[test]
    fn a_cpu_step_counts_every_workers_state_and_activations() {
        let c = Config::preset("tiny").unwrap();
        let params = parameters(&c) as f64;
        let train = Purpose::Train;
        let remat = Asked::default();
        let one = cpu(1024, 1, remat, train);
        let four = cpu(1024, 4, remat, train);
        let process = resources::PROCESS_BYTES;
        assert_eq!(one.state, process + 16.0 * params + 12.0 * params);
        assert_eq!(four.state, process + 4.0 * 16.0 * params + 12.0 * params);
        assert!(four.total() > one.total());
        // Each worker keeps x and O (f32) and LSE of its 256 rows in each layer, at least.
        let rows = 1024 / 4;
        let per_layer = (rows * 4 * (c.hidden_size + c.q_width() + c.num_attention_heads)) as f64;
        assert!(four.step >= 4.0 * c.num_hidden_layers as f64 * per_layer);
        assert!(cpu(4096, 4, remat, train).total() > four.total());
        let policy = |checkpoint| Asked {
            checkpoint,
            ..remat
        };
        let none = cpu(4096, 4, policy(Checkpoint::None), train).step;
        assert!(none > cpu(4096, 4, policy(Checkpoint::Layer), train).step);
        // Offloaded, each layer's checkpoint has a host copy beside the ones fetched back.
        let offloaded = Asked {
            offload: Offload::ACTIVATIONS.into(),
            ..remat
        };
        assert!(cpu(1024, 4, offloaded, train).step > four.step);
        // Gradients alone hold no moments, and the run returns two copies, not three.
        let grads = cpu(1024, 4, remat, Purpose::Gradients);
        assert_eq!(grads.state, process + 4.0 * 8.0 * params + 8.0 * params);
    }

    /// Too long a sequence is refused with both figures and the longest that fits.
    #[test]
    fn a_cpu_step_too_long_is_refused_with_the_longest_that_fits() {
        let c = Config::preset("tiny").unwrap();
        let plan = StepPlan::resolve(Asked::default(), Purpose::Train, 2, &c, Device::Cpu)
            .unwrap()
            .plan;
        let step = CpuStep {
            config: &c,
            seq: 1 << 16,
            plan: &plan,
            workers_here: 2,
        };
        let need = step.bytes().unwrap();
        let e = step.fits_in(need.total() / 2.0).unwrap_err().to_string();
        assert!(
            e.starts_with("training a model of 0.13M parameters on the CPU over 65536 tokens with 2 workers here needs"),
            "{e}"
        );
        assert!(e.contains("use --seq-len "), "{e}");
        assert!(step.fits_in(need.total()).is_ok());
    }

    /// A step too large for its GPU is refused with the plan that fits, changing least: for
    /// llama2-7b with AdamW on an H200 (139 GiB free), 64K tokens under remat needs the
    /// optimizer's state offloaded; at 192K that is not enough, and the checkpoints go to host
    /// memory instead (the state on the GPU). With nothing that fits, the refusal says what
    /// else to change.
    #[test]
    fn a_refusal_proposes_the_plan_that_fits() {
        let config = Config::preset("llama2-7b").unwrap();
        let runtime = gpu_threads(1);
        let at = |seq| llama7b_check(&config, seq, plan(&config, Offload::NONE, Shard::None, 1));
        let (free, host) = (139usize << 30, 128.0 * (1u64 << 30) as f64);
        let fix = at(65536).fix_for(&runtime, free, host).unwrap();
        assert!(
            fix.starts_with(
                "it would fit as --checkpoint remat --offload optimizer (about 77.4 GiB"
            ),
            "{fix}"
        );
        let fix = at(196608).fix_for(&runtime, free, host).unwrap();
        assert!(
            fix.starts_with(
                "it would fit as --checkpoint remat --offload activations (about 126.0"
            ),
            "{fix}"
        );
        // Too little host memory to pin anything: only the policy can change.
        let fix = at(65536).fix_for(&runtime, free, 0.0).unwrap();
        assert!(
            fix.starts_with("it would fit as --checkpoint layer (about 124.4"),
            "{fix}"
        );
        let fix = at(65536).fix_for(&runtime, 1 << 30, host).unwrap();
        assert_eq!(fix, cost::GPU_FIX);
    }
}
