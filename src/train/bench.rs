//! Timing training steps without the optimizer: forward and backward of one sequence on one
//! device, the measure peers report (`distflash bench train`; `bench/peers/hf_train_bench.py`
//! measures Hugging Face the same way). Written against the model's device interface, so the
//! CPU and a GPU run the same code; only the attention and the way to wait for the device differ.

use super::attention::Distributed;
use super::attention::ModelEdge;
use super::cuda_attention::CudaAttention;
use super::data::Sample;
use crate::attn::Span;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Tensor};
use crate::comm::Solo;
use crate::comm::{Buffer, Communicator};
use crate::model::attention::Attention;
use crate::model::config::Config;
use crate::model::cpu::Cpu;
use crate::model::ops::Ops;
use crate::model::profile::{OpTime, Profile, Profiled, ProfiledAttention};
use crate::model::weights::Weights;
use crate::model::{Checkpoint, weights};
use crate::plan::Schedule;
use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::time::Instant;

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

/// How many steps to run and how to wait for the device.
pub struct StepRuns<'a> {
    pub runs: Runs,
    /// Blocks until the device has finished all queued work (host clocks time the device).
    pub sync: &'a (dyn Fn() -> Result<()> + Sync),
}

/// What a timed run measured.
#[derive(Clone, Debug, Serialize)]
pub struct StepTiming {
    /// Median seconds of one forward+backward over the timed steps.
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
    sync: &(dyn Fn() -> Result<()> + Sync),
    mut step: impl FnMut() -> Result<T>,
) -> Result<(Vec<f64>, T)> {
    if runs.repeats == 0 {
        bail!("a step benchmark needs at least 1 repeat");
    }
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

/// Times forward+backward of one random sequence of `seq` tokens with random weights on `ops`,
/// attention by `attn` (which must cover all `seq` rows). Weight gradients accumulate across
/// steps: no optimizer runs.
pub fn time_steps<O: Ops>(
    ops: &O,
    cfg: &Config,
    attn: &mut impl Attention<O::T>,
    seq: usize,
    policy: Checkpoint,
    runs: &StepRuns<'_>,
) -> Result<StepTiming> {
    let StepRuns { runs, sync } = *runs;
    let (w, tokens) = random_inputs(ops, cfg, seq)?;
    let mut grads = weights::zeros(ops, cfg)?;
    let (all_secs, out) = timed(runs, sync, || {
        super::whole_sequence(ops, cfg, &w, &mut grads, attn, &tokens, policy)
    })?;
    let profile = if runs.profile {
        Some(profile_step(
            ops, cfg, &w, &mut grads, attn, &tokens, policy, sync,
        )?)
    } else {
        None
    };
    Ok(StepTiming {
        step_secs: median(&all_secs),
        all_secs,
        loss: out.loss_sum / seq as f64,
        attention_forwards_per_layer: out.attention_forwards,
        profile,
    })
}

/// [`time_steps`] as one rank of a multi-process job: this rank's chunk of the sequence through
/// `ops`, attention distributed by `backend` over `comm` with `schedule`, then the gradient
/// all-reduce a training step needs (timed with the step: it is part of what several devices
/// cost). Every rank returns its own times; the all-reduce ends each step on all ranks alike.
#[allow(clippy::too_many_arguments)]
pub fn time_steps_rank<O, B, C>(
    ops: &O,
    backend: &B,
    comm: &mut C,
    cfg: &Config,
    seq: usize,
    policy: Checkpoint,
    schedule: Schedule,
    runs: &StepRuns<'_>,
) -> Result<StepTiming>
where
    O: Ops<T = B::Tensor>,
    B: ModelEdge,
    B::Tensor: Buffer,
    C: Communicator<B::Tensor>,
{
    let StepRuns { runs, sync } = *runs;
    if runs.profile {
        bail!("--profile times the ops of one device: run it without a launcher");
    }
    let spans = super::spans_for(seq, comm.world(), schedule)?;
    let mine = super::own_spans(&spans, comm.world(), schedule, comm.rank());
    let (w, tokens) = random_inputs(ops, cfg, seq)?;
    let sample = Sample {
        tokens,
        probe: None,
    };
    let mut attn = Distributed::new(backend, comm, cfg.dims(), spans, schedule)?;
    let (all_secs, (out, tally)) = timed(runs, sync, || {
        // Fresh gradients each step, as in training (summed ones would double every step).
        let mut grads = weights::zeros(ops, cfg)?;
        super::reduced_sequence(ops, cfg, &w, &mut grads, &mut attn, &mine, &sample, policy)
    })?;
    Ok(StepTiming {
        step_secs: median(&all_secs),
        all_secs,
        loss: tally.loss_sum / seq as f64,
        attention_forwards_per_layer: out.attention_forwards,
        profile: None,
    })
}

/// One step with every op and attention call timed; the host time between them is reported as
/// `outside ops`.
#[allow(clippy::too_many_arguments)]
fn profile_step<O: Ops>(
    ops: &O,
    cfg: &Config,
    w: &Weights<O::T>,
    grads: &mut Weights<O::T>,
    attn: &mut impl Attention<O::T>,
    tokens: &[u32],
    policy: Checkpoint,
    sync: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Vec<OpTime>> {
    let profile = Profile::new(sync);
    let timed = Profiled {
        inner: ops,
        profile: &profile,
    };
    let mut timed_attn = ProfiledAttention {
        inner: attn,
        profile: &profile,
    };
    sync()?;
    let began = Instant::now();
    super::whole_sequence(&timed, cfg, w, grads, &mut timed_attn, tokens, policy)?;
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

/// [`time_steps`] on this machine's cores: f32, distflash attention with one worker.
pub fn time_steps_cpu(
    cfg: &Config,
    seq: usize,
    policy: Checkpoint,
    runs: Runs,
) -> Result<StepTiming> {
    let spans = vec![Span { start: 0, len: seq }];
    let mut alone = Solo;
    let mut attn = Distributed::new(
        &CpuBackend,
        &mut alone,
        cfg.dims(),
        spans,
        Schedule::Balanced,
    )?;
    let runs = StepRuns {
        runs,
        sync: &|| Ok(()),
    };
    time_steps(&Cpu::<f32>::new(), cfg, &mut attn, seq, policy, &runs)
}

/// A GPU run's step times and the most memory its tensors held at once.
#[derive(Clone, Debug, Serialize)]
pub struct GpuTiming {
    #[serde(flatten)]
    pub steps: StepTiming,
    /// Peak bytes of all tensors (weights included), from the allocator's high-water mark.
    pub peak_bytes: usize,
}

/// [`time_steps`] on one GPU: the model's CUDA device interface `ops`, which runs on `backend`;
/// attention by the backend's whole-sequence fast path ([`CudaAttention`]).
pub fn time_steps_cuda<O: Ops<T = Tensor>>(
    ops: &O,
    backend: &CudaBackend,
    cfg: &Config,
    seq: usize,
    policy: Checkpoint,
    runs: Runs,
) -> Result<GpuTiming> {
    on_gpu(backend, runs, |runs| {
        let mut attn = CudaAttention::new(backend, cfg.dims(), seq)?;
        time_steps(ops, cfg, &mut attn, seq, policy, runs)
    })
}

/// Runs `bench` with the GPU's synchronisation as the clock's fence and reports the peak memory
/// its tensors reached.
pub fn on_gpu(
    backend: &CudaBackend,
    runs: Runs,
    bench: impl FnOnce(&StepRuns<'_>) -> Result<StepTiming>,
) -> Result<GpuTiming> {
    backend.reset_peak_memory()?;
    let steps = bench(&StepRuns {
        runs,
        sync: &|| backend.synchronize(),
    })?;
    Ok(GpuTiming {
        steps,
        peak_bytes: backend.peak_memory()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(warmup: usize, repeats: usize, profile: bool) -> Runs {
        Runs {
            warmup,
            repeats,
            profile,
        }
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
