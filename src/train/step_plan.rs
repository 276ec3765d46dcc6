//! The step plan: how each training step is carried out, decided once and carried whole.
//!
//! A step is shaped by five choices: how the sequence is split across the workers
//! (`--schedule`), what each layer keeps for its backward (`--checkpoint`), whether those kept
//! tensors wait in host memory (`--offload activations`), whether AdamW's moments do
//! (`--offload optimizer`), and which model state each worker keeps only its piece of
//! (`--shard`). `train`, `grads` and `bench train` ask for them with the same flags; this module
//! turns what was asked into a [`StepPlan`] in one place — the defaults, the one-worker collapse,
//! what a command without an optimizer refuses, what is valid but changes nothing — and
//! training, the memory estimate and the resource checks ask the plan questions instead of
//! matching the flags again. A new way of splitting the work (data- or tensor-parallel groups
//! beside the sequence's workers) is a new field here, not a new flag walked through every
//! command.

use crate::model::config::Config;
use crate::model::weights::parameters;
use crate::model::{Checkpoint, Keep, Offload};
use crate::plan::Schedule;
use crate::runtime::Device;
use anyhow::{Result, bail};
use serde::Serialize;
use std::fmt;

/// Parameters from which several workers shard by default: 100M, whose f32 weights, gradients
/// and AdamW moments (1.6 GB a worker) begin to matter beside a long sequence's activations.
pub const SHARD_FROM_PARAMETERS: usize = 100_000_000;

/// Which model state each worker keeps only its pieces of (`--shard`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shard {
    /// Every worker holds all of it (gradients all-reduced).
    #[default]
    None,
    /// ZeRO-1: the AdamW moments; gradients all-reduced, the updated pieces of the weights
    /// all-gathered.
    Optimizer,
    /// ZeRO-2: the moments and the f32 gradients after the backward (reduce-scattered instead of
    /// all-reduced); the updated pieces of the weights all-gathered.
    Grads,
    /// ZeRO-3: the moments, the gradients and the weights; each layer's weights all-gathered for
    /// its forward and its backward, its gradients reduce-scattered as they are produced.
    Full,
}

impl Shard {
    pub fn name(self) -> &'static str {
        match self {
            Shard::None => "none",
            Shard::Optimizer => "optimizer",
            Shard::Grads => "grads",
            Shard::Full => "full",
        }
    }

    /// Into how many pieces the AdamW moments are cut over `workers`.
    pub fn optimizer_shards(self, workers: usize) -> usize {
        match self {
            Shard::None => 1,
            Shard::Optimizer | Shard::Grads | Shard::Full => workers,
        }
    }

    /// Into how many pieces the weights and the gradients are cut over `workers` (they stay
    /// whole through the step but under `full`).
    pub fn weight_shards(self, workers: usize) -> usize {
        match self {
            Shard::Full => workers,
            Shard::None | Shard::Optimizer | Shard::Grads => 1,
        }
    }

    /// `--shard` of `train` and `grads` when not given: `full` over several workers once the
    /// model's state is what fills memory (each then holds 1/workers of the weights, gradients
    /// and moments, on the unsharded trajectory to f32 rounding), else `none`: below
    /// [`SHARD_FROM_PARAMETERS`] the state is small beside the activations and the collectives
    /// would only cost time (the `tiny` preset trains 1.4x slower sharded on 4 CPU workers, and
    /// its rounding-level drift moves when the recall task is learned).
    pub fn default_for(workers: usize, config: &Config) -> Shard {
        if workers > 1 && parameters(config) >= SHARD_FROM_PARAMETERS {
            Shard::Full
        } else {
            Shard::None
        }
    }

    /// Whether each worker holds only its pieces of the weights, gathering a layer's for its
    /// use and reduce-scattering its gradients as the backward makes them (ZeRO-3).
    pub fn gathers_weights(self) -> bool {
        self == Shard::Full
    }

    /// Whether the summed gradients end in pieces, each worker holding its own
    /// (reduce-scattered, not all-reduced).
    pub fn reduce_scatters_grads(self) -> bool {
        matches!(self, Shard::Grads | Shard::Full)
    }

    /// Whether AdamW's moments are cut across the workers.
    pub fn shards_optimizer(self) -> bool {
        self != Shard::None
    }

    /// Whether AdamW updates the weights as they are held (whole unsharded, the pieces under
    /// `full`) with nothing to gather after; under `optimizer` and `grads` each worker updates
    /// its piece of whole weights and all-gathers the pieces.
    pub(super) fn updates_in_place(self) -> bool {
        matches!(self, Shard::None | Shard::Full)
    }
}

/// How many of the model's last layers keep every activation on the device, so that their
/// backward recomputes nothing (`--whole-layers`): the memory a step leaves free, spent on speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WholeLayers {
    /// As many as one GPU's free memory holds beside the step, decided once the device is open
    /// (`train::memory::MemoryCheck::check`); none on the CPU, where a run is a reference rather
    /// than a race, and none over several workers.
    Auto,
    /// Exactly this many.
    Exactly(usize),
}

impl std::str::FromStr for WholeLayers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(WholeLayers::Auto),
            n => n.parse().map(WholeLayers::Exactly).map_err(|_| {
                format!("'{n}' is not a number of layers: use auto or a whole number such as 4")
            }),
        }
    }
}

/// What goes to host memory, as `--offload` asks it: `auto` (the default) or a set of places.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskedOffload {
    /// Each layer's checkpoint to pinned host memory where that lets more layers stay whole, or
    /// where the step fits the GPU only so; otherwise nothing. Decided once the device is open
    /// (`train::memory::MemoryCheck::check`), on one GPU with one worker; nothing on the CPU,
    /// whose activations are in host memory already, and nothing over several workers.
    Auto,
    /// Exactly this.
    Exactly(Offload),
}

impl From<Offload> for AskedOffload {
    fn from(offload: Offload) -> AskedOffload {
        AskedOffload::Exactly(offload)
    }
}

impl std::str::FromStr for AskedOffload {
    type Err = String;
    /// `auto`, `none`, `activations`, `optimizer`, a comma-separated set of the last two, or
    /// `all` for both.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(AskedOffload::Auto);
        }
        let mut out = Offload::NONE;
        for part in s.split(',').map(str::trim) {
            out = match part {
                "none" if !s.contains(',') => out,
                "activations" => out.and(Offload::ACTIVATIONS),
                "optimizer" => out.and(Offload::OPTIMIZER),
                "all" if !s.contains(',') => Offload::ALL,
                other => {
                    return Err(format!(
                        "unknown offload '{other}' in '{s}': use auto, none, activations, optimizer, activations,optimizer or all"
                    ));
                }
            }
        }
        Ok(AskedOffload::Exactly(out))
    }
}

/// How a plan's whole layers are said after its checkpoint policy: nothing for none, else
/// " (the last layer whole)" or " (the last 7 layers whole)".
pub fn whole_layers_said(n: usize) -> String {
    match n {
        0 => String::new(),
        1 => " (the last layer whole)".to_string(),
        n => format!(" (the last {n} layers whole)"),
    }
}

/// How a plan's MLP is said after its whole layers: nothing for blocks of rows, ", the MLP over
/// whole rows" where the memory check chose that ([`StepPlan::with_whole_mlp`]).
pub fn whole_mlp_said(whole: bool) -> &'static str {
    match whole {
        true => ", the MLP over whole rows",
        false => "",
    }
}

/// The step's choices as a command was given them: `shard` is `None` where it was not, and the
/// plan then takes the default of the command's [`Purpose`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    pub schedule: Schedule,
    pub checkpoint: Checkpoint,
    pub offload: AskedOffload,
    pub shard: Option<Shard>,
    pub whole_layers: WholeLayers,
}

impl Default for Asked {
    /// The flags' defaults: balanced, remat, offloaded where that helps, the purpose's sharding,
    /// as many whole layers as fit.
    fn default() -> Asked {
        Asked {
            schedule: Schedule::Balanced,
            checkpoint: Checkpoint::Remat,
            offload: AskedOffload::Auto,
            shard: None,
            whole_layers: WholeLayers::Auto,
        }
    }
}

/// What the step is run for, which decides whether AdamW is part of it and the default sharding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// `train`: forward, backward and the AdamW update.
    Train,
    /// `grads`: forward and backward of one sequence; no optimizer.
    Gradients,
    /// `bench train`: forward and backward timed, and the AdamW update with `--optimizer`.
    TimedStep { optimizer: bool },
    /// `bench train --estimate`: the memory of a step, with AdamW's state or without.
    Estimate { optimizer: bool },
}

impl Purpose {
    /// Whether AdamW's moments exist and an update follows the backward.
    fn optimizer(self) -> bool {
        match self {
            Purpose::Train => true,
            Purpose::Gradients => false,
            Purpose::TimedStep { optimizer } | Purpose::Estimate { optimizer } => optimizer,
        }
    }

    /// The sharding when none is asked for. Training and gradients shard everything over
    /// several workers once the model's state is what fills memory (`Shard::default_for`); the
    /// step benchmark shards nothing, so that its figures are the step the recorded tables and
    /// the peers' benchmarks (all unsharded) measure.
    fn default_shard(self, workers: usize, config: &Config) -> Shard {
        match self {
            Purpose::Train | Purpose::Gradients => Shard::default_for(workers, config),
            Purpose::TimedStep { .. } | Purpose::Estimate { .. } => Shard::None,
        }
    }

    /// The sentence's end that refuses an optimizer offload for a step without AdamW.
    fn without_optimizer(self) -> &'static str {
        match self {
            Purpose::Gradients => "grads never makes (it runs no optimizer): leave it out",
            _ => {
                "bench train counts only with --optimizer (without it the step is forward and backward): add it"
            }
        }
    }
}

/// How each step runs: resolved from what was asked by [`StepPlan::resolve`], the one place
/// its choices are decided, and asked questions everywhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan {
    schedule: Schedule,
    checkpoint: Checkpoint,
    /// What goes to host memory: nothing while `auto` is undecided.
    offload: Offload,
    /// Whether `--offload auto` is still for the device's memory to decide.
    decides_offload: bool,
    /// The sharding in effect: `none` for one worker, who holds every piece.
    shard: Shard,
    /// Workers the sequence is split across.
    workers: usize,
    /// Whether AdamW's moments exist and an update follows the backward.
    optimizer: bool,
    /// The last layers that keep every activation: `Auto` until the device's memory decides.
    whole_layers: WholeLayers,
    /// Whether the MLP runs over every row at once (`model::Keep::whole_mlp`): chosen with the
    /// whole layers, where the device's memory holds it.
    whole_mlp: bool,
}

/// A resolved plan, and the warnings of settings that are valid but change nothing here (for
/// the reporter to print; the run goes on).
#[derive(Clone, Debug)]
pub struct Resolved {
    pub plan: StepPlan,
    pub warnings: Vec<String>,
}

impl StepPlan {
    /// The plan for `purpose` over `workers` workers on `device`, from what was asked: the
    /// purpose's default sharding where none was asked, sharding collapsed to `none` for one
    /// worker (with a warning if it was asked for), an optimizer offload refused where no
    /// optimizer runs, a warning for offloaded activations on the CPU, whose activations are
    /// in host memory already, and `--offload auto` left to the device's memory only where it
    /// can help: one worker on a GPU that recomputes something.
    pub fn resolve(
        asked: Asked,
        purpose: Purpose,
        workers: usize,
        config: &Config,
        device: Device,
    ) -> Result<Resolved> {
        if workers == 0 {
            bail!("a step needs at least 1 worker");
        }
        let optimizer = purpose.optimizer();
        let offload = match asked.offload {
            AskedOffload::Auto => Offload::NONE,
            AskedOffload::Exactly(offload) => offload,
        };
        if offload.optimizer() && !optimizer {
            bail!(
                "--offload {} moves AdamW's moments, which {}",
                offload,
                purpose.without_optimizer()
            );
        }
        let mut warnings = Vec::new();
        if device == Device::Cpu && offload.activations() {
            warnings.push(
                "--offload activations moves checkpoints to host memory, where the CPU's already are: here it only adds copies (it saves GPU memory with --device cuda)".to_string(),
            );
        }
        let shard = match asked.shard {
            Some(shard) if workers == 1 && shard != Shard::None => {
                warnings.push(format!(
                    "--shard {} cuts the model's state across the workers, but one worker holds every piece: it changes nothing here (use --workers 2 or more to shard)",
                    shard.name()
                ));
                Shard::None
            }
            Some(shard) => shard,
            None => purpose.default_shard(workers, config),
        };
        let layers = config.num_hidden_layers;
        if let WholeLayers::Exactly(n) = asked.whole_layers {
            if n > layers {
                bail!(
                    "--whole-layers {n} is more layers than the model's {layers}: give at most {layers}, or auto"
                );
            }
            if n > 0 && asked.checkpoint == Checkpoint::None {
                warnings.push(format!(
                    "--whole-layers {n} keeps every activation of the last layers, which --checkpoint none does for all of them: it changes nothing here"
                ));
            }
        }
        let plan = StepPlan {
            schedule: asked.schedule,
            checkpoint: asked.checkpoint,
            offload,
            decides_offload: asked.offload == AskedOffload::Auto
                && device == Device::Cuda
                && workers == 1
                && asked.checkpoint != Checkpoint::None,
            shard,
            workers,
            optimizer,
            whole_layers: asked.whole_layers,
            whole_mlp: false,
        };
        Ok(Resolved { plan, warnings })
    }

    /// This plan with its last `n` layers whole: what the memory check decides for `Auto`.
    pub fn with_whole_layers(&self, n: usize) -> StepPlan {
        StepPlan {
            whole_layers: WholeLayers::Exactly(n),
            ..*self
        }
    }

    /// This plan with the MLP over whole rows: what the memory check decides, after the whole
    /// layers, where the device's memory holds it.
    pub fn with_whole_mlp(&self) -> StepPlan {
        StepPlan {
            whole_mlp: true,
            ..*self
        }
    }

    /// Whether the number of whole layers is still for the device's memory to decide: one
    /// worker recomputing something, with `Auto` asked.
    pub fn decides_whole_layers(&self) -> bool {
        self.whole_layers == WholeLayers::Auto
            && self.workers == 1
            && self.checkpoint != Checkpoint::None
    }

    /// The last layers that keep every activation (none while `Auto` is undecided).
    pub fn whole_layers(&self) -> usize {
        match self.whole_layers {
            WholeLayers::Auto => 0,
            WholeLayers::Exactly(n) => n,
        }
    }

    /// This plan keeping `checkpoint` and moving `offload` instead: what a refusal for memory
    /// proposes (`train::memory`). Moving the optimizer's state needs an optimizer; a plan
    /// without one keeps its own offload.
    pub fn with(&self, checkpoint: Checkpoint, offload: Offload) -> StepPlan {
        let offload = match self.optimizer || !offload.optimizer() {
            true => offload,
            false => self.offload,
        };
        StepPlan {
            checkpoint,
            offload,
            decides_offload: false,
            ..*self
        }
    }

    /// Whether `--offload auto` is still for the device's memory to decide: between nothing
    /// and the checkpoints (`train::memory::MemoryCheck::check`).
    pub fn decides_offload(&self) -> bool {
        self.decides_offload
    }

    /// How the sequence is split across the workers.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// What each layer keeps for its backward.
    pub fn checkpoint(&self) -> Checkpoint {
        self.checkpoint
    }

    /// What goes to host memory, as `--offload` spells it (for reports).
    pub fn offload(&self) -> Offload {
        self.offload
    }

    /// The sharding in effect (`none` for one worker).
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Workers the sequence is split across.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Whether AdamW's moments exist and an update follows the backward.
    pub fn has_optimizer(&self) -> bool {
        self.optimizer
    }

    /// Whether each layer's checkpoint waits in host memory between its forward and backward.
    pub fn offloads_activations(&self) -> bool {
        self.offload.activations()
    }

    /// Whether AdamW's moments live in host memory between updates.
    pub fn offloads_optimizer(&self) -> bool {
        self.offload.optimizer()
    }

    /// What each layer keeps, and where.
    pub fn keep(&self) -> Keep {
        Keep {
            checkpoint: self.checkpoint,
            offload: self.offload,
            whole_layers: self.whole_layers(),
            whole_mlp: self.whole_mlp,
        }
    }

    /// Whether each worker holds only its pieces of the weights, gathering a layer's for its
    /// use (ZeRO-3).
    pub fn gathers_weights(&self) -> bool {
        self.shard.gathers_weights()
    }

    /// Into how many pieces AdamW's moments are cut.
    pub fn optimizer_shards(&self) -> usize {
        self.shard.optimizer_shards(self.workers)
    }

    /// Into how many pieces the weights and their gradients are cut.
    pub fn weight_shards(&self) -> usize {
        self.shard.weight_shards(self.workers)
    }

    /// Refuses a run whose runtime has other workers than the plan was made for.
    pub fn ensure_workers(&self, workers: usize) -> Result<()> {
        if workers != self.workers {
            bail!(
                "the step plan was made for {} workers, and the run has {workers}: resolve the plan for the run's workers",
                self.workers
            );
        }
        Ok(())
    }
}

/// The plan in a sentence's words: `checkpoint remat, offload activations, AdamW with --shard
/// full` (offload, AdamW and sharding only where they are part of the step).
impl fmt::Display for StepPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}", self.checkpoint)?;
        if self.checkpoint != Checkpoint::None {
            f.write_str(&whole_layers_said(self.whole_layers()))?;
        }
        f.write_str(whole_mlp_said(self.whole_mlp))?;
        if self.offload.any() {
            write!(f, ", offload {}", self.offload)?;
        }
        match (self.optimizer, self.shard) {
            (false, _) => Ok(()),
            (true, Shard::None) => write!(f, ", AdamW"),
            (true, s) => write!(f, ", AdamW with --shard {}", s.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(asked: Asked, purpose: Purpose, workers: usize, model: &str) -> Result<Resolved> {
        let config = Config::preset(model).unwrap();
        StepPlan::resolve(asked, purpose, workers, &config, Device::Cpu)
    }

    #[test]
    fn the_default_sharding_is_the_purposes() {
        let asked = Asked::default();
        let shard = |purpose, workers, model| {
            resolve(asked, purpose, workers, model)
                .unwrap()
                .plan
                .shard()
        };
        // Training and gradients shard a large model over several workers, not a small one.
        for purpose in [Purpose::Train, Purpose::Gradients] {
            assert_eq!(shard(purpose, 4, "llama2-7b"), Shard::Full);
            assert_eq!(shard(purpose, 4, "tiny"), Shard::None);
            assert_eq!(shard(purpose, 1, "llama2-7b"), Shard::None);
        }
        // The step benchmark and the estimate shard nothing unless asked.
        let estimate = Purpose::Estimate { optimizer: true };
        for purpose in [Purpose::TimedStep { optimizer: true }, estimate] {
            assert_eq!(shard(purpose, 8, "llama2-7b"), Shard::None);
        }
        let full = Asked {
            shard: Some(Shard::Full),
            ..asked
        };
        let plan = resolve(full, estimate, 8, "llama2-7b").unwrap().plan;
        assert_eq!((plan.weight_shards(), plan.optimizer_shards()), (8, 8));
        assert!(plan.gathers_weights());
    }

    #[test]
    fn one_worker_holds_every_piece_and_is_warned_when_sharding_was_asked() {
        let asked = Asked {
            shard: Some(Shard::Grads),
            ..Asked::default()
        };
        let one = resolve(asked, Purpose::Train, 1, "tiny").unwrap();
        assert_eq!(one.plan.shard(), Shard::None);
        assert_eq!(one.plan.optimizer_shards(), 1);
        assert_eq!(one.warnings.len(), 1);
        assert!(
            one.warnings[0].starts_with("--shard grads cuts"),
            "{:?}",
            one.warnings
        );
        let two = resolve(asked, Purpose::Train, 2, "tiny").unwrap();
        assert_eq!(two.plan.shard(), Shard::Grads);
        assert_eq!(
            (two.plan.optimizer_shards(), two.plan.weight_shards()),
            (2, 1)
        );
        assert!(two.warnings.is_empty());
        // Asking for none with one worker is no warning.
        let none = Asked {
            shard: Some(Shard::None),
            ..asked
        };
        assert!(
            resolve(none, Purpose::Train, 1, "tiny")
                .unwrap()
                .warnings
                .is_empty()
        );
    }

    #[test]
    fn an_optimizer_offload_needs_an_optimizer() {
        let asked = Asked {
            offload: Offload::ALL.into(),
            ..Asked::default()
        };
        let e = resolve(asked, Purpose::Gradients, 2, "tiny")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--offload activations,optimizer moves AdamW's moments, which grads never makes (it runs no optimizer): leave it out"
        );
        let timed = Purpose::TimedStep { optimizer: false };
        let e = resolve(asked, timed, 1, "tiny").unwrap_err().to_string();
        assert!(
            e.contains("which bench train counts only with --optimizer"),
            "{e}"
        );
        let timed = Purpose::TimedStep { optimizer: true };
        assert!(
            resolve(asked, timed, 1, "tiny")
                .unwrap()
                .plan
                .offloads_optimizer()
        );
        let without = Purpose::Estimate { optimizer: false };
        assert!(resolve(asked, without, 1, "tiny").is_err());
        let with = Purpose::Estimate { optimizer: true };
        let plan = resolve(asked, with, 1, "tiny").unwrap().plan;
        assert!(plan.offloads_activations() && plan.offloads_optimizer());
        assert!(plan.has_optimizer());
        // On the CPU, offloaded activations are only copies: a warning, and the run goes on.
        let r = resolve(asked, Purpose::Train, 1, "tiny").unwrap();
        assert!(
            r.warnings[0].starts_with("--offload activations moves"),
            "{:?}",
            r.warnings
        );
        let config = Config::preset("tiny").unwrap();
        let gpu = StepPlan::resolve(asked, Purpose::Train, 1, &config, Device::Cuda).unwrap();
        assert!(gpu.warnings.is_empty());
    }

    #[test]
    fn whole_layers_are_at_most_the_models_and_change_nothing_under_none() {
        let asked = |n, checkpoint| Asked {
            whole_layers: WholeLayers::Exactly(n),
            checkpoint,
            ..Asked::default()
        };
        let tiny = Config::preset("tiny").unwrap().num_hidden_layers;
        let e = resolve(
            asked(tiny + 1, Checkpoint::Remat),
            Purpose::Train,
            1,
            "tiny",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            format!(
                "--whole-layers {} is more layers than the model's {tiny}: give at most {tiny}, or auto",
                tiny + 1
            )
        );
        let all = resolve(asked(tiny, Checkpoint::Remat), Purpose::Train, 1, "tiny").unwrap();
        assert!(all.warnings.is_empty());
        assert_eq!(all.plan.keep().whole_layers, tiny);
        assert!(!all.plan.decides_whole_layers());
        let none = resolve(asked(1, Checkpoint::None), Purpose::Train, 1, "tiny").unwrap();
        assert!(
            none.warnings[0].contains("changes nothing here"),
            "{:?}",
            none.warnings
        );
        assert_eq!(whole_layers_said(0), "");
        assert_eq!(whole_layers_said(1), " (the last layer whole)");
        assert_eq!(whole_layers_said(7), " (the last 7 layers whole)");
        assert_eq!("auto".parse(), Ok(WholeLayers::Auto));
        assert_eq!("3".parse(), Ok(WholeLayers::Exactly(3)));
        let e = "-1".parse::<WholeLayers>().unwrap_err();
        assert_eq!(
            e,
            "'-1' is not a number of layers: use auto or a whole number such as 4"
        );
    }

    #[test]
    fn offload_is_auto_or_a_set_of_places() {
        assert_eq!("auto".parse(), Ok(AskedOffload::Auto));
        assert_eq!(
            "activations, optimizer".parse(),
            Ok(AskedOffload::Exactly(Offload::ALL))
        );
        assert_eq!("none".parse(), Ok(AskedOffload::Exactly(Offload::NONE)));
        assert_eq!(
            "optimizer".parse(),
            Ok(AskedOffload::Exactly(Offload::OPTIMIZER))
        );
        assert!("all,optimizer".parse::<AskedOffload>().is_err());
    }

    #[test]
    fn the_plan_says_itself_and_its_workers() {
        let asked = Asked {
            offload: Offload::ACTIVATIONS.into(),
            shard: Some(Shard::Full),
            ..Asked::default()
        };
        let plan = resolve(asked, Purpose::Train, 4, "tiny").unwrap().plan;
        assert_eq!(
            plan.to_string(),
            "checkpoint remat, offload activations, AdamW with --shard full"
        );
        let plan = resolve(Asked::default(), Purpose::Gradients, 4, "tiny")
            .unwrap()
            .plan;
        assert_eq!(plan.to_string(), "checkpoint remat");
        assert!(plan.ensure_workers(4).is_ok());
        let e = plan.ensure_workers(2).unwrap_err().to_string();
        assert!(
            e.starts_with("the step plan was made for 4 workers, and the run has 2"),
            "{e}"
        );
        assert!(resolve(Asked::default(), Purpose::Train, 0, "tiny").is_err());
    }
}
