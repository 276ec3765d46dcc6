//! The memory estimate of a training step, counted from the code: the step's real parts (the
//! weights, gradients and AdamW's moments as training makes them, `model::forward_backward`,
//! the update) run on a counted device (`model::count::Metered`); on the counting device
//! (`model::lengths`), which computes and allocates nothing, that is the estimate of the GPU
//! step, made in milliseconds for any sequence; on the CPU backend it is the CPU's own peak,
//! which the estimate must equal (tested below). Offload is counted as it runs: the stashed
//! tensors leave the device count for the host one.

use super::moments::{Moments, master_of, needs_master};
use crate::model::attention_api::Attention;
use crate::model::config::Config;
use crate::model::cost::{RESERVE_BYTES, StepMemory};
use crate::model::count::{Bytes, Counter, Kind, Metered, Part};
use crate::model::instrument::InstrumentedAttention;
use crate::model::lengths::{CountingAttention, Lengths, Precision};
use crate::model::ops::{AdamState, AdamW, Ops};
use crate::model::weights::{self, LayerWeights};
use crate::model::{Chunk, Head, Keep, Params, Whole, forward_backward_with};
use crate::shape::Span;
use anyhow::Result;

/// One step on a counted device: what it makes and in what order.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    pub cfg: &'a Config,
    /// Tokens of the one sequence (batch 1).
    pub seq: usize,
    pub keep: Keep,
    /// Whether AdamW's moments exist and an update runs after the backward (on the device, or
    /// streamed from host memory under `--offload optimizer`).
    pub optimizer: bool,
}

/// What a counted step held: on the device at its peak, and in host memory at that peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peaks {
    pub device: Bytes,
    pub host: Bytes,
    /// The device's working set at its peak (`device.step`) by the op that made each part,
    /// most first ([`Counter::working_at_peak`]).
    pub working: Vec<(&'static str, Part)>,
}

/// The whole weights and gradients, with the step's tensors alive when the forward ends (the
/// head is asked for) marked as kept activations: the layers' checkpoints on the device and
/// the last layer's output.
struct MarkKept<'a, T> {
    whole: Whole<'a, T>,
    counter: &'a Counter,
}

impl<T, A> Params<T, A> for MarkKept<'_, T> {
    fn with_embed<R>(&mut self, attn: &mut A, f: impl FnOnce(&T) -> Result<R>) -> Result<R> {
        self.whole.with_embed(attn, f)
    }

    fn with_layer<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, &mut A) -> Result<R>,
    ) -> Result<R> {
        self.whole.with_layer(attn, l, f)
    }

    fn with_head<R>(
        &mut self,
        attn: &mut A,
        f: impl FnOnce(Head<'_, T>) -> Result<R>,
    ) -> Result<R> {
        self.counter.mark_kept();
        self.whole.with_head(attn, f)
    }

    fn with_layer_grads<R>(
        &mut self,
        attn: &mut A,
        l: usize,
        f: impl FnOnce(&LayerWeights<T>, &mut LayerWeights<T>, &mut A) -> Result<R>,
    ) -> Result<R> {
        self.whole.with_layer_grads(attn, l, f)
    }

    fn with_embed_grad<R>(
        &mut self,
        attn: &mut A,
        f: impl FnOnce(&mut T) -> Result<R>,
    ) -> Result<R> {
        self.whole.with_embed_grad(attn, f)
    }
}

/// The peak bytes of `step` on `ops` (counted from empty), by kind: the weights (drawn by
/// `weights::random`), their gradients, AdamW's moments (`train::moments::Moments`, offloaded
/// as `step.keep.offload` says), then `model::forward_backward` with `attn` (the device's own
/// attention, its outputs counted by `ops`), then the update.
pub fn step_peak<O: Ops, A: Attention<O::T>>(
    ops: &Metered<'_, O>,
    mut attn: A,
    step: Step<'_>,
) -> Result<Peaks> {
    let (cfg, counter) = (step.cfg, &*ops.instrument);
    counter.set_kind(Kind::Weights);
    let mut w = weights::random(ops, cfg, 0)?;
    counter.set_kind(Kind::Grads);
    let mut grads = weights::zeros(ops, cfg)?;
    counter.set_kind(Kind::Optimizer);
    let specs = weights::specs(cfg);
    let params = w.tensors();
    let mut moments = match step.optimizer {
        true => Some(Moments::made(
            ops,
            specs.len(),
            step.keep.offload.optimizer(),
            |k| {
                let (param, len) = (params[k], specs[k].elements());
                let master = needs_master(ops, param).then(|| master_of(ops, param));
                Ok(AdamState {
                    m: ops.zeros(len)?,
                    v: ops.zeros(len)?,
                    master: master.transpose()?,
                })
            },
        )?),
        false => None,
    };
    counter.set_kind(Kind::Step);
    // A token every row may hold: 1 is in every vocabulary the configs allow.
    let tokens = vec![1u32; step.seq];
    let positions = [Span {
        start: 0,
        len: step.seq,
    }];
    let chunk = Chunk {
        tokens: &tokens,
        targets: &tokens,
        positions: &positions,
        sequence: step.seq,
    };
    let mut attn = InstrumentedAttention {
        ops,
        inner: &mut attn,
    };
    let mut params = MarkKept {
        whole: Whole {
            w: &w,
            grads: &mut grads,
        },
        counter,
    };
    let scale = 1.0 / step.seq.max(1) as f64;
    forward_backward_with(ops, cfg, &mut params, &mut attn, chunk, step.keep, scale)?;
    if let Some(moments) = &mut moments {
        let hp = AdamW {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let (mut p, g) = (w.tensors_mut(), grads.tensors());
        counter.set_kind(Kind::Optimizer);
        moments.update_each(ops, |k, state| {
            ops.adamw(p[k], g[k], state, &hp, 1, specs[k].decays())
        })?;
    }
    Ok(Peaks {
        device: counter.peak(),
        host: counter.host_peak(),
        working: counter.working_at_peak(),
    })
}

/// [`step_peak`] on the counting device modelling `precision`: the memory estimate of `step`.
pub fn estimate(step: Step<'_>, precision: Precision) -> Result<Peaks> {
    let device = Lengths::new(precision);
    let attn = CountingAttention {
        device: &device,
        dims: step.cfg.dims(),
        rows: step.seq,
    };
    step_peak(&device.metered(), attn, step)
}

impl Peaks {
    /// The estimate as the start-up check and `bench train --estimate` report it: the counted
    /// peak by part, the working set with the allowance for what is not a tensor
    /// (`cost::RESERVE_BYTES`), and the host copies.
    /// All of it is at one moment, the peak: with the moments offloaded, `optimizer` is the
    /// moments the update has on the device then (none when the peak is in the backward, as it
    /// is at long sequences), and `staging` is not used.
    pub fn step_memory(&self) -> StepMemory {
        let (d, h) = (&self.device, &self.host);
        StepMemory {
            weights: d.weights as f64,
            grads: d.grads as f64,
            optimizer: d.optimizer as f64,
            kept: d.kept as f64,
            working: d.step as f64 + RESERVE_BYTES,
            staging: 0.0,
            pinned_host: (h.kept + h.step) as f64,
            pinned_optimizer: h.optimizer as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Offload;
    use crate::model::attention_api::Dense;
    use crate::model::cpu::Cpu;
    use crate::model::{Checkpoint, cost};
    use crate::shape::Mask;
    use std::sync::Arc;

    /// The estimated peak GPU memory of `step` on one GPU (the CUDA backend, one worker).
    fn gpu_step_memory(step: Step<'_>) -> Result<StepMemory> {
        Ok(estimate(step, Precision::Cuda)?.step_memory())
    }

    const POLICIES: [Checkpoint; 3] = [Checkpoint::None, Checkpoint::Remat, Checkpoint::Layer];

    /// The CPU backend's own peak of `step`: its tensors counted as it makes and drops them.
    fn cpu_peak(step: Step<'_>) -> Peaks {
        let ops = Metered {
            inner: &Cpu::<f32>::new(),
            instrument: Arc::new(Counter::default()),
        };
        let attn = Dense {
            dims: step.cfg.dims(),
            rows: step.seq,
            mask: Mask::causal(),
        };
        step_peak(&ops, attn, step).unwrap()
    }

    const OFFLOADS: [Offload; 4] = [
        Offload::NONE,
        Offload::ACTIVATIONS,
        Offload::OPTIMIZER,
        Offload::ALL,
    ];

    #[test]
    fn the_count_equals_the_cpu_backends_own_peak() {
        let cfg = Config {
            num_hidden_layers: 3,
            ..Config::preset("tiny").unwrap()
        };
        let mut peaks = Vec::new();
        for checkpoint in POLICIES {
            for offload in OFFLOADS {
                for optimizer in [false, true] {
                    let keep = Keep {
                        checkpoint,
                        offload,
                    };
                    let step = Step {
                        cfg: &cfg,
                        seq: 40,
                        keep,
                        optimizer,
                    };
                    let counted = estimate(step, Precision::Uniform(4)).unwrap();
                    let measured = cpu_peak(step);
                    assert_eq!(counted, measured, "{checkpoint}, {offload}, {optimizer}");
                    peaks.push(((checkpoint, offload, optimizer), measured));
                }
            }
        }
        let at = |c, o, opt| peaks.iter().find(|p| p.0 == (c, o, opt)).unwrap().1.clone();
        // Not a vacuous equality: policies, offload and the optimizer change the peak.
        let on_device = |c| at(c, Offload::NONE, false).device;
        let (none, remat, layer) = (
            on_device(Checkpoint::None),
            on_device(Checkpoint::Remat),
            on_device(Checkpoint::Layer),
        );
        assert!(none.kept > remat.kept && remat.kept > layer.kept);
        assert!(none.total() > remat.total() && remat.total() > layer.total());
        let off = at(Checkpoint::None, Offload::ACTIVATIONS, false);
        assert!(off.device.kept < none.kept && off.device.total() < none.total());
        assert!(off.host.total() > 0 && off.host.optimizer == 0);
        let params = weights::parameters(&cfg) * 4;
        assert_eq!(
            (none.weights, none.grads, none.optimizer),
            (params, params, 0)
        );
        let adamw = at(Checkpoint::None, Offload::NONE, true);
        assert_eq!(adamw.device.optimizer, 2 * params);
        assert_eq!(adamw.host, Bytes::default());
        // Offloaded, the moments are all in host memory and two tensors' pass through the device.
        let streamed = at(Checkpoint::None, Offload::OPTIMIZER, true);
        assert_eq!(streamed.host.optimizer, 2 * params);
        assert!(streamed.device.optimizer < params);
    }

    /// Peaks measured on an H200 by `distflash bench train --device cuda --json` (the pool's
    /// high-water mark, `peak_memory_gib`), llama2-7b, bf16, no optimizer step, with the
    /// attention reading the model's tensors in place and dO in 16 bits
    /// (`bench/results/strided-2026-12-02/call2`): layers, tokens, policy, offload, GiB.
    const MEASURED_GIB: [(usize, usize, Checkpoint, Offload, f64); 5] = [
        (
            32,
            16384,
            Checkpoint::Remat,
            Offload::NONE,
            48.073944330215454,
        ),
        (
            32,
            16384,
            Checkpoint::Layer,
            Offload::NONE,
            44.138397455215454,
        ),
        (
            32,
            32768,
            Checkpoint::Remat,
            Offload::NONE,
            57.386566400527954,
        ),
        (
            32,
            32768,
            Checkpoint::Layer,
            Offload::NONE,
            49.515472650527954,
        ),
        (
            4,
            524288,
            Checkpoint::Layer,
            Offload::ACTIVATIONS,
            66.05294060707092,
        ),
    ];

    /// The count of the code is each measured peak to the kilobyte (the figures are GiB
    /// printed to 16 digits), and the estimate stays above it, within its allowance.
    #[test]
    fn the_count_is_the_measured_h200_peak() {
        for (layers, seq, checkpoint, offload, measured) in MEASURED_GIB {
            let cfg = Config {
                num_hidden_layers: layers,
                ..Config::preset("llama2-7b").unwrap()
            };
            let step = Step {
                cfg: &cfg,
                seq,
                keep: Keep {
                    checkpoint,
                    offload,
                },
                optimizer: false,
            };
            let counted = estimate(step, Precision::Cuda).unwrap().device.total() as f64;
            let measured = measured * (1u64 << 30) as f64;
            assert!(
                (counted - measured).abs() < 1024.0,
                "{layers} layers, {seq} {checkpoint} {offload}: counted {counted} bytes, measured {measured}"
            );
            let est = gpu_step_memory(step).unwrap().total();
            assert!(
                est > measured && est < measured + RESERVE_BYTES + 1024.0,
                "{seq} {checkpoint}"
            );
        }
        // The 4-layer 512K step's peak above, counted for all 32 layers with AdamW (moments
        // and checkpoints in host memory): it fits an H200's 139.3 GiB free.
        let cfg = Config::preset("llama2-7b").unwrap();
        let step = Step {
            cfg: &cfg,
            seq: 524288,
            keep: Keep {
                checkpoint: Checkpoint::Layer,
                offload: Offload::ALL,
            },
            optimizer: true,
        };
        let free = (139.3 * (1u64 << 30) as f64) as usize;
        let long = gpu_step_memory(step).unwrap();
        assert!(cost::check_fits(&long, free, "llama2-7b at 524288 tokens").is_ok());
    }

    #[test]
    fn a_million_tokens_of_llama2_7b_are_counted_in_well_under_a_second() {
        let cfg = Config::preset("llama2-7b").unwrap();
        let began = std::time::Instant::now();
        let step = Step {
            cfg: &cfg,
            seq: 1 << 20,
            keep: Keep {
                checkpoint: Checkpoint::Remat,
                offload: Offload::ALL,
            },
            optimizer: true,
        };
        let m = gpu_step_memory(step).unwrap();
        assert!(began.elapsed().as_secs_f64() < 1.0, "{:?}", began.elapsed());
        // 32 layers' x, O (16-bit) and LSE (f32, 32 heads) in host memory.
        assert_eq!(
            m.pinned_host,
            (32usize << 20) as f64 * (2.0 * 8192.0 + 128.0)
        );
        // Both moments and the master, f32 as the gradients are.
        assert_eq!(m.pinned_optimizer, 3.0 * m.grads);
    }

    /// `model::cost::step_memory`, the hand-written mirror still under the multi-GPU rank
    /// estimate (`cost::rank_step_memory`), is the count plus the allowance, to the byte, for
    /// every policy, with and without AdamW, MHA and GQA, from one row to past an MLP block and
    /// a loss chunk: it cannot drift from the code unnoticed.
    #[test]
    fn the_hand_written_mirror_is_the_count() {
        for preset in ["llama2-7b", "llama-7b-gqa", "tiny"] {
            let cfg = Config::preset(preset).unwrap();
            for seq in [1, 100, 2097, 4096, 6096, 6097, 9000, 65536] {
                for checkpoint in POLICIES {
                    for optimizer in [false, true] {
                        let step = Step {
                            cfg: &cfg,
                            seq,
                            keep: Keep::on_device(checkpoint),
                            optimizer,
                        };
                        let counted = gpu_step_memory(step).unwrap().total();
                        let mirror = cost::step_memory(&cfg, seq, checkpoint, optimizer).total();
                        assert_eq!(counted, mirror, "{preset} {seq} {checkpoint} {optimizer}");
                    }
                }
            }
        }
    }

    /// The working set at the peak, told by what made it, adds up to the counted step bytes;
    /// at 128K on the GPU the attention backward's widest moment (dQ's rounding: its f32
    /// accumulator beside the 16-bit dQ and the kernel's own 16-bit dK, dV) is the largest
    /// part, to the byte.
    #[test]
    fn the_working_set_at_the_peak_is_told_by_what_made_it() {
        use crate::model::cuda::whole_sequence::widest_backward;
        let cfg = Config::preset("llama2-7b").unwrap();
        let seq = 131072;
        let keep = Keep {
            checkpoint: Checkpoint::Layer,
            offload: Offload::ALL,
        };
        let step = Step {
            cfg: &cfg,
            seq,
            keep,
            optimizer: true,
        };
        let peaks = estimate(step, Precision::Cuda).unwrap();
        let told: usize = peaks.working.iter().map(|(_, p)| p.bytes).sum();
        assert_eq!(told, peaks.device.step);
        let (what, largest) = peaks.working[0];
        assert_eq!(what, "attention_backward workspace");
        let dims = cfg.dims();
        let grad = 2 * seq * dims.heads * dims.head_dim; // one 16-bit gradient (MHA)
        let widest = widest_backward(&dims, seq, false);
        // f32 dQ and three 16-bit gradients: 10 bytes a query element.
        assert_eq!(widest, 5 * grad);
        assert_eq!(largest.bytes, widest);
        assert!(
            peaks
                .working
                .windows(2)
                .all(|w| w[0].1.bytes >= w[1].1.bytes)
        );
    }
}
