//! The flags that shape a step, one group shared by `train`, `grads` and `bench train`: parsed
//! here, decided by `train::step_plan` (defaults, the one-worker collapse, what a command without
//! an optimizer refuses), so each flag means the same in every command.

use anyhow::Result;
use distflash::model::Checkpoint;
use distflash::model::config::Config;
use distflash::plan::Schedule;
use distflash::runtime::Device;
use distflash::train::step_plan::Shard;
use distflash::train::step_plan::{Asked, AskedOffload, Purpose, StepPlan, WholeLayers};

#[derive(clap::Args, Clone, Copy, Debug)]
pub struct StepArgs {
    /// How the sequence is split across the workers: `balanced` (DistFlashAttn), `unbalanced`,
    /// or `zigzag` (each worker a head and a tail chunk: balanced at any worker count, the one
    /// to use on 2 GPUs).
    #[arg(long, default_value = "balanced")]
    schedule: Schedule,
    /// What layers keep for the backward: none, layer (re-run the layer, attention included)
    /// or remat (keep the attention output: attention's forward runs once).
    #[arg(long, default_value = "remat")]
    checkpoint: Checkpoint,
    /// What waits in host memory during a step: auto (on one GPU, each layer's checkpoint where
    /// that lets more of the last layers stay whole, or where the step fits the GPU only so;
    /// otherwise, and on the CPU and over several workers, none); none; activations (each
    /// layer's checkpoint goes to pinned host memory as its forward ends and comes back one
    /// layer ahead of its backward, so the device holds two layers' instead of all); optimizer
    /// (AdamW's two f32 moments and the weights' masters live in pinned host memory and the
    /// update streams them through the device a tensor at a time; steps with AdamW only:
    /// `train`, `bench train --optimizer`); or both, activations,optimizer (or all). The same
    /// losses, gradients and weights, bit for bit.
    #[arg(long, default_value = "auto")]
    offload: AskedOffload,
    /// Model state each worker keeps only its 1/workers piece of: none, optimizer (ZeRO-1: the
    /// AdamW moments), grads (ZeRO-2: also the gradients after the backward, reduce-scattered
    /// instead of all-reduced) or full (ZeRO-3: also the weights, each layer's gathered for its
    /// use). The trajectory is the unsharded one [default: for `train` and `grads`, full with
    /// several workers on a model of 100M parameters or more, else none; for `bench train`
    /// none, the step the recorded tables and the peers' benchmarks measure].
    #[arg(long)]
    shard: Option<Shard>,
    /// How many of the model's last layers keep every activation on the GPU, so that their
    /// backward recomputes nothing: auto (as many as the GPU's free memory holds beside the
    /// step, with 2.5 GiB to spare; none on the CPU and over several workers) or a number (0:
    /// every layer as --checkpoint says). The same arithmetic, so the same losses and gradients.
    #[arg(long, default_value = "auto")]
    whole_layers: WholeLayers,
}

impl StepArgs {
    /// The plan for `purpose` over `workers` on `device`; its warnings printed on standard
    /// error when `reporter` (one line each; the run goes on).
    pub fn plan(
        &self,
        purpose: Purpose,
        workers: usize,
        config: &Config,
        device: Device,
        reporter: bool,
    ) -> Result<StepPlan> {
        let asked = Asked {
            schedule: self.schedule,
            checkpoint: self.checkpoint,
            offload: self.offload,
            shard: self.shard,
            whole_layers: self.whole_layers,
        };
        let resolved = StepPlan::resolve(asked, purpose, workers, config, device)?;
        if reporter {
            for warning in &resolved.warnings {
                eprintln!("warning: {warning}");
            }
        }
        Ok(resolved.plan)
    }

    /// The schedule asked for, needed before the plan (the sequence's split is checked first).
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }
}
