//! Timing training steps without the optimizer: forward and backward of one sequence on one
//! device, the measure peers report (`distflash bench train`; `bench/peers/hf_train_bench.py`
//! measures Hugging Face the same way). Written against the model's device interface, so the
//! CPU and a GPU run the same code; only the attention and the way to wait for the device differ.

use super::attention::Distributed;
use super::cuda_attention::CudaAttention;
use crate::attn::Span;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Tensor};
use crate::comm::Solo;
use crate::model::attention::Attention;
use crate::model::config::Config;
use crate::model::cpu::Cpu;
use crate::model::ops::Ops;
use crate::model::{Checkpoint, weights};
use crate::plan::Schedule;
use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// How many steps to run and how to wait for the device.
pub struct StepRuns<'a> {
    /// Steps run first and not timed (kernel compilation, allocator warm-up).
    pub warmup: usize,
    /// Timed steps; the median is reported.
    pub repeats: usize,
    /// Blocks until the device has finished all queued work (host clocks time the device).
    pub sync: &'a dyn Fn() -> Result<()>,
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
    if seq == 0 || runs.repeats == 0 {
        bail!("a step benchmark needs at least 1 token and 1 repeat");
    }
    let w = weights::random(ops, cfg, 0)?;
    let mut grads = weights::zeros(ops, cfg)?;
    let mut rng = StdRng::seed_from_u64(1);
    let tokens: Vec<u32> = (0..=seq)
        .map(|_| rng.random_range(0..cfg.vocab_size as u32))
        .collect();
    let mut all_secs = Vec::with_capacity(runs.repeats);
    let mut last = None;
    for i in 0..runs.warmup + runs.repeats {
        (runs.sync)()?;
        let began = Instant::now();
        let out = super::whole_sequence(ops, cfg, &w, &mut grads, attn, &tokens, policy)?;
        (runs.sync)()?;
        if i >= runs.warmup {
            all_secs.push(began.elapsed().as_secs_f64());
        }
        last = Some(out);
    }
    let out = last.expect("at least one step ran");
    let mut sorted = all_secs.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(StepTiming {
        step_secs: sorted[sorted.len() / 2],
        all_secs,
        loss: out.loss_sum / seq as f64,
        attention_forwards_per_layer: out.attention_forwards,
    })
}

/// [`time_steps`] on this machine's cores: f32, distflash attention with one worker.
pub fn time_steps_cpu(
    cfg: &Config,
    seq: usize,
    policy: Checkpoint,
    warmup: usize,
    repeats: usize,
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
        warmup,
        repeats,
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
    warmup: usize,
    repeats: usize,
) -> Result<GpuTiming> {
    backend.reset_peak_memory()?;
    let mut attn = CudaAttention::new(backend, cfg.dims(), seq)?;
    let runs = StepRuns {
        warmup,
        repeats,
        sync: &|| backend.synchronize(),
    };
    let steps = time_steps(ops, cfg, &mut attn, seq, policy, &runs)?;
    Ok(GpuTiming {
        steps,
        peak_bytes: backend.peak_memory()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_the_tiny_model_and_counts_attention_forwards() {
        let cfg = Config::preset("tiny").unwrap();
        let remat = time_steps_cpu(&cfg, 64, Checkpoint::Remat, 1, 3).unwrap();
        assert_eq!(remat.all_secs.len(), 3);
        assert!(remat.step_secs > 0.0 && remat.all_secs.contains(&remat.step_secs));
        assert_eq!(remat.attention_forwards_per_layer, vec![1, 1]);
        // Random weights predict about uniformly: loss near ln(vocab).
        assert!((remat.loss - 256f64.ln()).abs() < 0.5, "{}", remat.loss);
        let layer = time_steps_cpu(&cfg, 64, Checkpoint::Layer, 0, 1).unwrap();
        assert_eq!(layer.attention_forwards_per_layer, vec![2, 2]);
        assert_eq!(layer.loss, remat.loss, "same weights and tokens");
        assert!(time_steps_cpu(&cfg, 64, Checkpoint::Remat, 0, 0).is_err());
    }
}
