//! The memory estimate of a training step, counted from the code: the step's real parts (the
//! weights, gradients and AdamW's moments as training makes them, `model::forward_backward`,
//! the update) run on a counted device (`train::memory::count::Metered`); on the counting device
//! (`train::memory::lengths`), which computes and allocates nothing, that is the estimate of the GPU
//! step, made in milliseconds for any sequence; on the CPU backend it is the CPU's own peak,
//! which the estimate must equal (tested below). Offload is counted as it runs: the stashed
//! tensors leave the device count for the host one.

use super::count::{Bytes, Counter, Kind, Metered, Part};
use super::counted::CountingDevice;
use super::lengths::{CountingAttention, Lengths, Precision};
use crate::comm::Solo;
use crate::model::attention_api::Attention;
use crate::model::config::Config;
use crate::model::cost::{RESERVE_BYTES, StepMemory};
use crate::model::instrument::InstrumentedAttention;
use crate::model::ops::{AdamStep, AdamW, Ops};
use crate::model::weights;
use crate::model::{AtHead, Chunk, Keep, Whole, forward_backward_with};
use crate::plan::Partition;
use crate::runtime::ModelDevice;
use crate::shape::Span;
use crate::train::data::Sample;
use crate::train::documents::Packing;
use crate::train::model_attention::ModelAttention;
use crate::train::moments::{Moments, fresh_state};
use crate::train::shard::{Held, Optimizer, StateFrom, Update};
use crate::train::step::{Pass, accumulate_held, reduce_step};
use crate::train::step_plan::StepPlan;
use crate::train::tally::{Tally, collectives};
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
            |k| fresh_state(ops, params[k]),
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
    // The step's tensors alive when the forward ends (the head is asked for) are the kept
    // activations: the layers' checkpoints on the device and the last layer's output.
    // Zeros and scratch (`Held::step_grads`) count alike: the gradients are added to here.
    let mut whole = Whole {
        w: &w,
        grads: &mut grads,
        fresh: false,
    };
    let mut params = AtHead {
        params: &mut whole,
        at_head: || counter.mark_kept(),
    };
    let scale = 1.0 / step.seq.max(1) as f64;
    forward_backward_with(ops, cfg, &mut params, &mut attn, chunk, step.keep, scale)?;
    if let Some(moments) = &mut moments {
        let (mut p, g) = (w.tensors_mut(), grads.tensors());
        counter.set_kind(Kind::Optimizer);
        moments.update_each(ops, |k, state| {
            ops.adamw(
                p[k],
                g[k],
                state,
                &COUNTED_ADAMW,
                AdamStep::unscaled(1),
                specs[k].decays(),
            )
        })?;
    }
    Ok(Peaks::of(counter))
}

/// The peak bytes of worker `rank` of a run of `plan` over `partition`'s workers on the device
/// `precision` models (a GPU each, or the CPU's f32): training's own rank step on the counting
/// device (`train::memory::counted`), so that a rank is counted from the code as one GPU's step is: its weights as the plan shards them,
/// AdamW's state (offloaded as the plan says), the forward and backward of its rows through
/// the executor (the communication buffers the plan's transfers receive included), the
/// gradients' reduction and, with the optimizer, the update.
pub fn rank_estimate(
    cfg: &Config,
    plan: &StepPlan,
    partition: &Partition,
    rank: usize,
    precision: Precision,
) -> Result<Peaks> {
    let lengths = Lengths::new(precision);
    let (device, mut comm) = CountingDevice::new(&lengths, rank, partition.workers());
    let (ops, counter) = (device.ops(), lengths.counter());
    counter.set_kind(Kind::Weights);
    let draw = |spans: &[Span]| weights::random_pieces(ops, cfg, 0, spans);
    let mut held = Held::drawn(cfg, plan, rank, draw)?;
    counter.set_kind(Kind::Optimizer);
    let mut opt = match plan.has_optimizer() {
        true => Some(Optimizer::made(
            ops,
            cfg,
            plan,
            rank,
            &held,
            StateFrom::Fresh,
        )?),
        false => None,
    };
    counter.set_kind(Kind::Grads);
    let mut grads = held.step_grads(ops, cfg)?;
    counter.set_kind(Kind::Step);
    let sample = Sample {
        tokens: vec![1; partition.seq() + 1],
        probe: None,
        eos: None,
    };
    let mine = partition.own_spans(rank);
    let mark_kept = || counter.mark_kept();
    let pass = Pass {
        at_head: Some(&mark_kept),
        ..Pass::of_sequence(&sample, &mine, Packing::packed(), plan.keep())
    };
    let mut attn = ModelAttention::new(&device, &mut comm, cfg.dims(), partition)?;
    let mut tally = Tally::default();
    accumulate_held(
        ops,
        cfg,
        &held,
        (&mut grads, true),
        &mut attn,
        &pass,
        &mut tally,
    )?;
    let reduced = reduce_step(ops, &mut attn, held.shard, grads, &mut tally)?;
    if let Some(opt) = &mut opt {
        counter.set_kind(Kind::Optimizer);
        let update = Update {
            adamw: COUNTED_ADAMW,
            step: 1,
            clip: 1.0,
        };
        let mut solo = Solo;
        let comm = collectives(&mut attn, &mut solo);
        let gradients = opt.gradients(ops, comm, reduced)?;
        opt.apply(ops, comm, &mut held.w, gradients, &update)?;
    }
    Ok(Peaks::of(counter))
}

/// [`rank_estimate`] of every worker of `plan` over a sequence of `seq` tokens, in rank order.
pub fn every_rank(
    cfg: &Config,
    plan: &StepPlan,
    seq: usize,
    precision: Precision,
) -> Result<Vec<Peaks>> {
    let partition = Partition::new(seq, plan.workers(), plan.schedule())?;
    (0..plan.workers())
        .map(|rank| rank_estimate(cfg, plan, &partition, rank, precision))
        .collect()
}

/// The update a counted step runs (its values change nothing counted).
const COUNTED_ADAMW: AdamW = AdamW {
    lr: 1e-4,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-8,
    weight_decay: 0.1,
};

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
    /// What `counter` held at its peak, on the device and in host memory.
    fn of(counter: &Counter) -> Peaks {
        Peaks {
            device: counter.peak(),
            host: counter.host_peak(),
            working: counter.working_at_peak(),
        }
    }

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
    use crate::plan::Schedule;
    use crate::runtime::Device;
    use crate::shape::Mask;
    use crate::train::step_plan::{Asked, Purpose, Shard, WholeLayers};
    use std::sync::Arc;

    /// The CUDA device in bf16, whose masters are the f32's low halves.
    const BF16: Precision = Precision::Cuda { master_bytes: 2 };

    /// The estimated peak GPU memory of `step` on one GPU (the CUDA backend, one worker).
    fn gpu_step_memory(step: Step<'_>) -> Result<StepMemory> {
        Ok(estimate(step, BF16)?.step_memory())
    }

    const POLICIES: [Checkpoint; 3] = [Checkpoint::None, Checkpoint::Remat, Checkpoint::Layer];

    /// AdamW's state is two f32 moments and each 16-bit weight's master as the device's format
    /// keeps it: bf16's low half (10 bytes a parameter in all), fp16's f32 copy (12).
    #[test]
    fn the_optimizer_state_counts_the_masters_format() {
        let cfg = Config::preset("tiny").unwrap();
        let params = weights::parameters(&cfg) as f64;
        for (master_bytes, per_parameter) in [(2, 10.0), (4, 12.0)] {
            let step = Step {
                cfg: &cfg,
                seq: 64,
                keep: Keep::on_device(Checkpoint::Remat),
                optimizer: true,
            };
            let m = estimate(step, Precision::Cuda { master_bytes })
                .unwrap()
                .step_memory();
            assert_eq!(m.optimizer, per_parameter * params, "{master_bytes}");
        }
    }

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
                        offload,
                        ..Keep::on_device(checkpoint)
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

    /// Peaks measured by `distflash bench train --device cuda --json` (the pool's high-water
    /// mark, `peak_memory_gib`), llama2-7b, bf16, no optimizer step, with the MLP's blocks read
    /// and written in place (`bash bench/peers/measured_peaks.sh` on an H100, whose allocator
    /// peaks as an H200's: `bench/results/step-fusions-2026-12-06`): layers, tokens, policy,
    /// offload, GiB.
    const MEASURED_GIB: [(usize, usize, Checkpoint, Offload, f64); 5] = [
        (
            32,
            16384,
            Checkpoint::Remat,
            Offload::NONE,
            47.841400384902954,
        ),
        (
            32,
            16384,
            Checkpoint::Layer,
            Offload::NONE,
            43.905853509902954,
        ),
        (
            32,
            32768,
            Checkpoint::Remat,
            Offload::NONE,
            57.154022455215454,
        ),
        (
            32,
            32768,
            Checkpoint::Layer,
            Offload::NONE,
            49.282928705215454,
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
    fn the_count_is_the_measured_peak() {
        for (layers, seq, checkpoint, offload, measured) in MEASURED_GIB {
            let cfg = Config {
                num_hidden_layers: layers,
                ..Config::preset("llama2-7b").unwrap()
            };
            let step = Step {
                cfg: &cfg,
                seq,
                keep: Keep {
                    offload,
                    ..Keep::on_device(checkpoint)
                },
                optimizer: false,
            };
            let counted = estimate(step, BF16).unwrap().device.total() as f64;
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
                offload: Offload::ALL,
                ..Keep::on_device(Checkpoint::Layer)
            },
            optimizer: true,
        };
        let free = (139.3 * (1u64 << 30) as f64) as usize;
        let long = gpu_step_memory(step).unwrap();
        let what = "llama2-7b at 524288 tokens";
        assert!(cost::check_fits(&long, free, what, cost::GPU_FIX).is_ok());
    }

    #[test]
    fn a_million_tokens_of_llama2_7b_are_counted_in_well_under_a_second() {
        let cfg = Config::preset("llama2-7b").unwrap();
        let began = std::time::Instant::now();
        let step = Step {
            cfg: &cfg,
            seq: 1 << 20,
            keep: Keep {
                offload: Offload::ALL,
                ..Keep::on_device(Checkpoint::Remat)
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
        // Both moments, f32 as the gradients are, and the bf16 weights' masters, their low
        // halves (2 bytes).
        assert_eq!(m.pinned_optimizer, 2.5 * m.grads);
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
            offload: Offload::ALL,
            ..Keep::on_device(Checkpoint::Layer)
        };
        let step = Step {
            cfg: &cfg,
            seq,
            keep,
            optimizer: true,
        };
        let peaks = estimate(step, BF16).unwrap();
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

    /// Rank `rank`'s count of a run of llama2-7b over `workers` GPUs under `asked`.
    fn rank_of(workers: usize, seq: usize, asked: Asked, optimizer: bool, rank: usize) -> Peaks {
        let cfg = Config::preset("llama2-7b").unwrap();
        let purpose = if optimizer {
            Purpose::Train
        } else {
            Purpose::Gradients
        };
        let plan = StepPlan::resolve(asked, purpose, workers, &cfg, Device::Cuda)
            .unwrap()
            .plan;
        let partition = Partition::new(seq, workers, plan.schedule()).unwrap();
        rank_estimate(&cfg, &plan, &partition, rank, BF16).unwrap()
    }

    fn asked(schedule: Schedule, offload: Offload, shard: Shard) -> Asked {
        Asked {
            schedule,
            checkpoint: Checkpoint::Remat,
            offload: offload.into(),
            shard: Some(shard),
            whole_layers: WholeLayers::Auto,
        }
    }

    /// Each rank holds what the plan's sharding gives it, counted from training's own code:
    /// 16-bit weights and f32 gradients of the part it holds (whole, or its pieces under
    /// `full`), and 10 bytes of AdamW state (two f32 moments, the bf16 master's low half) for
    /// each element of its pieces (the whole model unsharded), the shard rule's pieces summed.
    #[test]
    fn each_rank_holds_its_shard_of_the_state() {
        let cfg = Config::preset("llama2-7b").unwrap();
        let params = weights::parameters(&cfg);
        let piece = |rank: usize| -> usize {
            weights::specs(&cfg)
                .iter()
                .map(|s| crate::comm::shard_span(s.elements(), 4, rank).len)
                .sum()
        };
        for shard in [Shard::None, Shard::Optimizer, Shard::Grads, Shard::Full] {
            for rank in 0..4 {
                let a = asked(Schedule::Zigzag, Offload::NONE, shard);
                let p = rank_of(4, 65536, a, true, rank).device;
                let state = if shard.shards_optimizer() {
                    piece(rank)
                } else {
                    params
                };
                let held = if shard.gathers_weights() {
                    piece(rank)
                } else {
                    params
                };
                assert_eq!(p.optimizer, 10 * state, "{shard:?} rank {rank}");
                assert_eq!(p.weights, 2 * held, "{shard:?} rank {rank}");
                assert_eq!(p.grads, 4 * held, "{shard:?} rank {rank}");
            }
        }
    }

    /// Offloaded, a rank's AdamW state (its shard) waits in pinned host memory and its layers'
    /// checkpoints too (x, O and LSE of its rows under remat); the GPU keeps none of the state
    /// at the backward's peak.
    #[test]
    fn a_rank_offloads_its_own_state_and_checkpoints() {
        let cfg = Config::preset("llama2-7b").unwrap();
        let params = weights::parameters(&cfg);
        let rows = 65536 / 2;
        for shard in [Shard::None, Shard::Optimizer] {
            let a = asked(Schedule::Balanced, Offload::ALL, shard);
            let m = rank_of(2, 65536, a, true, 1).step_memory();
            let state = if shard.shards_optimizer() {
                params.div_ceil(2)
            } else {
                params
            };
            // Two f32 moments and a bf16 master's low half: 10 bytes an element.
            assert!(
                (m.pinned_optimizer - 10.0 * state as f64).abs() <= 10.0 * 300.0,
                "{shard:?}"
            );
            assert_eq!(m.optimizer, 0.0, "{shard:?}");
            let kept = 32.0 * rows as f64 * (2.0 * 8192.0 + 4.0 * 32.0);
            assert_eq!(m.pinned_host, kept, "{shard:?}");
        }
    }

    /// A rank that computes its queries against another chunk's keys holds that chunk's K and V
    /// as received (16-bit): under `balanced` over two GPUs, rank 1 fetches chunk 0's, rank 0
    /// fetches nothing, and their counts differ by at least those buffers. Zigzag ranks all
    /// hold other chunks' too.
    #[test]
    fn a_rank_holds_the_keys_it_receives() {
        let (seq, rows) = (65536, 32768usize);
        let a = asked(Schedule::Balanced, Offload::NONE, Shard::None);
        let total = |rank| rank_of(2, seq, a, false, rank).device.total();
        let kv = 2 * rows * 4096 * 2;
        assert!(total(1) >= total(0) + kv, "{} {} {kv}", total(1), total(0));
        let z = asked(Schedule::Zigzag, Offload::NONE, Shard::None);
        let ranks: Vec<usize> = (0..4)
            .map(|r| rank_of(4, seq, z, false, r).device.total())
            .collect();
        let spread = ranks.iter().max().unwrap() - ranks.iter().min().unwrap();
        assert!(spread < kv, "{ranks:?}");
    }
}
