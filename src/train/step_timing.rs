//! Timing training steps: forward and backward of one sequence (the measure peers report:
//! `distflash bench train`; `bench/peers/hf_train_bench.py` measures Hugging Face the same way),
//! and with the optimizer the whole step as `train` runs it, AdamW's update included. One job on
//! every topology: one device, or each rank timing its chunk and the gradient all-reduce.

use super::data::Sample;
use super::documents::Packing;
use super::memory::MemoryCheck;
use super::model_attention::ModelAttention;
use super::shard::{Held, Optimizer, StateFrom, Update};
use super::step::Pass;
use super::step_plan::StepPlan;
use super::tally::collectives;
use crate::backend::Backend;
use crate::comm::{Communicator, Solo};
use crate::model::attention_api::Attention;
use crate::model::config::Config;
use crate::model::instrument::InstrumentedAttention;
use crate::model::ops::{AdamW, Ops};
use crate::model::profile::{OpTime, Profile, Profiled};
use crate::model::weights::Weights;
use crate::model::{Keep, Whole, weights};
use crate::plan::Partition;
use crate::runtime::{Job, ModelDevice, Runtime};
use crate::shape::Span;
use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// The update a timed step with the optimizer ends with: `train`'s betas and ε, a small rate.
/// Its values change no time.
const TIMED_ADAMW: AdamW = AdamW {
    lr: 1e-5,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-8,
    weight_decay: 0.1,
};

/// How many steps to run.
#[derive(Clone, Copy, Debug)]
pub struct Runs {
    /// Steps run first and not timed (kernel compilation, allocator warm-up).
    pub warmup: usize,
    /// Timed steps; the median is reported.
    pub repeats: usize,
    /// Whether to run one more step with every op timed (see [`crate::model::profile`]).
    pub profile: bool,
}

/// What a timed run measured.
#[derive(Clone, Debug, Serialize)]
pub struct StepTiming {
    /// The plan the steps ran (the asked one with its whole layers decided by the device's
    /// memory).
    #[serde(skip)]
    pub plan: StepPlan,
    /// Median seconds of one step (forward and backward, and the AdamW update where the plan
    /// has it) over the timed steps.
    pub step_secs: f64,
    /// Every timed step, in order.
    pub all_secs: Vec<f64>,
    /// Mean loss of the sequence (random weights: about ln(vocab)).
    pub loss: f64,
    /// Attention forwards each layer ran per step (remat and none: 1, layer: 2).
    pub attention_forwards_per_layer: Vec<u32>,
    /// With [`Runs::profile`]: one extra step's time per op, most first, and `outside ops`
    /// for the host time between them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Vec<OpTime>>,
    /// Peak bytes of all tensors (weights included) where the device counts them (a GPU's
    /// allocator high-water mark); `None` on the CPU.
    pub peak_bytes: Option<usize>,
}

/// Random weights (seed 0) and `seq + 1` random tokens (seed 1): every rank of a distributed
/// benchmark builds the same.
fn random_inputs<O: Ops>(ops: &O, cfg: &Config, seq: usize) -> Result<(Weights<O::T>, Vec<u32>)> {
    if seq == 0 {
        bail!("a step benchmark needs at least 1 token");
    }
    let w = weights::random(ops, cfg, 0)?;
    let mut rng = StdRng::seed_from_u64(1);
    let tokens = (0..=seq)
        .map(|_| rng.random_range(0..cfg.vocab_size as u32))
        .collect();
    Ok((w, tokens))
}

/// Runs `step` `runs.warmup + runs.repeats` times, timing the repeats between device syncs.
/// Returns every timed step's seconds and the last step's outcome.
fn timed<T>(
    runs: Runs,
    sync: &dyn Fn() -> Result<()>,
    mut step: impl FnMut() -> Result<T>,
) -> Result<(Vec<f64>, T)> {
    let mut all_secs = Vec::with_capacity(runs.repeats);
    let mut last = None;
    for i in 0..runs.warmup + runs.repeats {
        sync()?;
        let began = Instant::now();
        let out = step()?;
        sync()?;
        if i >= runs.warmup {
            all_secs.push(began.elapsed().as_secs_f64());
        }
        last = Some(out);
    }
    Ok((all_secs, last.expect("at least one step ran")))
}

fn median(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Times forward+backward of one random sequence of `seq` tokens with random weights as `plan`
/// says on `runtime`'s workers, each step followed by the gradient all-reduce a training step
/// needs when there are several (timed with the step: it is part of what several devices cost;
/// reduce-scattered where the plan shards the gradients); no optimizer runs. The reporter's
/// times (`None` on the other ranks of a launched job, which time their own chunks alike).
pub fn time_steps(
    cfg: &Config,
    seq: usize,
    plan: &StepPlan,
    runs: Runs,
    memory: &MemoryCheck,
    runtime: &Runtime,
) -> Result<Option<StepTiming>> {
    if runs.repeats == 0 {
        bail!("a step benchmark needs at least 1 repeat");
    }
    if runs.profile && runtime.workers() > 1 {
        bail!("--profile times the ops of one device: run it without a launcher or more workers");
    }
    plan.ensure_workers(runtime.workers())?;
    let partition = super::step::model_partition(cfg, seq, plan.schedule(), runtime)?;
    let opened = runtime.open()?;
    let plan = &memory.check(runtime, opened.gpu())?;
    let job = StepBench {
        cfg,
        partition,
        plan,
        runs,
    };
    opened.run_reporter(&job)
}

/// One worker's part of [`time_steps`].
struct StepBench<'a> {
    cfg: &'a Config,
    partition: Partition,
    plan: &'a StepPlan,
    runs: Runs,
}

impl Job for StepBench<'_> {
    type Output = StepTiming;

    fn run<D: ModelDevice, C: Communicator<D::Tensor>>(
        &self,
        device: &D,
        comm: &mut C,
    ) -> Result<StepTiming> {
        let (ops, cfg, seq) = (device.ops(), self.cfg, self.partition.seq());
        let (w, tokens) = random_inputs(ops, cfg, seq)?;
        let rank = comm.rank();
        let mut held = Held::from_device(ops, cfg, w, self.plan, rank)?;
        // A fresh run's state (zero moments, masters of the 16-bit weights), where the step
        // ends with AdamW's update.
        let mut opt = match self.plan.has_optimizer() {
            true => Some(Optimizer::made(
                ops,
                cfg,
                self.plan,
                rank,
                &held,
                StateFrom::Fresh,
            )?),
            false => None,
        };
        let sample = Sample {
            tokens,
            probe: None,
            eos: None,
        };
        let mine = self.partition.own_spans(rank);
        let (sync, keep) = (|| device.backend().synchronize(), self.plan.keep());
        device.reset_peak_memory()?;
        let mut attn = ModelAttention::new(device, comm, cfg.dims(), &self.partition)?;
        let (mut solo, mut step) = (Solo, 0);
        // Fresh gradients each step, as in training (summed ones would double every step),
        // dropped within the step: kept to the next, they would double the gradients' memory.
        // With the optimizer, the update training runs ends each step.
        let (all_secs, (out, tally)) = timed(self.runs, &sync, || {
            let pass = Pass::of_sequence(&sample, &mine, Packing::packed(), keep);
            let (out, tally, reduced, _sent) =
                super::step::reduced_sequence(ops, cfg, &held, &mut attn, &pass)?;
            if let Some(opt) = &mut opt {
                step += 1;
                let update = Update {
                    adamw: TIMED_ADAMW,
                    step,
                    clip: 1.0,
                };
                let comm = collectives(&mut attn, &mut solo);
                let grads = opt.gradients(ops, comm, reduced)?;
                opt.apply(ops, comm, &mut held.w, grads, &update)?;
            }
            Ok((out, tally))
        })?;
        let profile = if self.runs.profile {
            let mut grads = held.step_grads(ops, cfg)?;
            let step = OneStep {
                cfg,
                w: &held.w,
                sample: &sample,
                mine: &mine,
                keep,
            };
            Some(profile_step(ops, &mut grads, &mut attn, step, &sync)?)
        } else {
            None
        };
        Ok(StepTiming {
            plan: *self.plan,
            step_secs: median(&all_secs),
            all_secs,
            loss: tally.loss_sum / seq as f64,
            attention_forwards_per_layer: out.attention_forwards,
            profile,
            peak_bytes: device.peak_memory()?,
        })
    }
}

/// The step a profile times: the same as the timed ones.
struct OneStep<'a, T> {
    cfg: &'a Config,
    w: &'a Weights<T>,
    sample: &'a Sample,
    mine: &'a [Span],
    keep: Keep,
}

/// One step with every op and attention call timed; the host time between them is reported as
/// `outside ops`.
fn profile_step<O: Ops>(
    ops: &O,
    grads: &mut Weights<O::T>,
    attn: &mut impl Attention<O::T>,
    step: OneStep<'_, O::T>,
    sync: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Vec<OpTime>> {
    let profile = Profile::new(sync);
    let timed = Profiled {
        inner: ops,
        instrument: &profile,
    };
    let mut timed_attn = InstrumentedAttention {
        ops: &timed,
        inner: attn,
    };
    let pass = Pass::of_sequence(step.sample, step.mine, Packing::packed(), step.keep);
    sync()?;
    let began = Instant::now();
    super::step::accumulate(
        &timed,
        step.cfg,
        &mut Whole {
            w: step.w,
            grads,
            fresh: true,
        },
        &mut timed_attn,
        &pass,
        step.mine,
        &mut super::tally::Tally::default(),
    )?;
    sync()?;
    let total = began.elapsed().as_secs_f64();
    let mut out = profile.totals();
    let inside: f64 = out.iter().map(|t| t.secs).sum();
    out.push(OpTime {
        op: "outside ops",
        calls: 1,
        secs: (total - inside).max(0.0),
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Checkpoint;
    use crate::runtime::Device;
    use crate::train::step_plan::{Asked, Purpose};

    fn runs(warmup: usize, repeats: usize, profile: bool) -> Runs {
        Runs {
            warmup,
            repeats,
            profile,
        }
    }

    fn time_steps_cpu(
        cfg: &Config,
        seq: usize,
        policy: Checkpoint,
        runs: Runs,
    ) -> Result<StepTiming> {
        let asked = Asked {
            checkpoint: policy,
            ..Asked::default()
        };
        let timed = Purpose::TimedStep { optimizer: false };
        let plan = StepPlan::resolve(asked, timed, 1, cfg, Device::Cpu)?.plan;
        let memory = MemoryCheck {
            config: cfg.clone(),
            model: "tiny".into(),
            seq,
            plan,
            host_state: crate::train::memory::HostState::None,
            ignore_estimate: false,
        };
        let rt = Runtime::cpu_threads(1, std::time::Duration::from_secs(60));
        Ok(time_steps(cfg, seq, &plan, runs, &memory, &rt)?.expect("one worker reports"))
    }

    #[test]
    fn times_the_tiny_model_and_counts_attention_forwards() {
        let cfg = Config::preset("tiny").unwrap();
        let remat = time_steps_cpu(&cfg, 64, Checkpoint::Remat, runs(1, 3, false)).unwrap();
        assert!(remat.profile.is_none());
        assert_eq!(remat.all_secs.len(), 3);
        assert!(remat.step_secs > 0.0 && remat.all_secs.contains(&remat.step_secs));
        assert_eq!(remat.attention_forwards_per_layer, vec![1, 1]);
        // Random weights predict about uniformly: loss near ln(vocab).
        assert!((remat.loss - 256f64.ln()).abs() < 0.5, "{}", remat.loss);
        let layer = time_steps_cpu(&cfg, 64, Checkpoint::Layer, runs(0, 1, true)).unwrap();
        assert_eq!(layer.attention_forwards_per_layer, vec![2, 2]);
        let profile = layer.profile.expect("asked for");
        let calls = |op| profile.iter().find(|t| t.op == op).map(|t| t.calls);
        // Two layers, each attention forward run twice (layer re-runs it), backward once.
        assert_eq!(calls("attention_forward"), Some(4));
        assert_eq!(calls("attention_backward"), Some(2));
        assert_eq!(calls("cross_entropy"), Some(1));
        assert_eq!(calls("outside ops"), Some(1));
        assert_eq!(layer.loss, remat.loss, "same weights and tokens");
        assert!(time_steps_cpu(&cfg, 64, Checkpoint::Remat, runs(0, 0, false)).is_err());
    }
}
