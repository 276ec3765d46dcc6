//! `distflash bench train`: the time of one training step (forward and backward of one
//! sequence, batch 1, random weights; with `--optimizer` AdamW's update too, the whole step as
//! `train` runs it), tokens/s, model FLOPs utilisation, the ideal step at the measured rates
//! beside the measured one, and peak memory, on the CPU or one GPU. `bench/peers/hf_train_bench.py` measures Hugging Face
//! transformers the same way, and `bench/peers/train_session.sh` runs both on the same shapes.

use super::values;
use anyhow::{Result, bail};
use distflash::model::config::Config;
use distflash::model::cost::{self, H200_ATTENTION_TFLOPS, H200_BF16_PEAK_TFLOPS, gib};
use distflash::model::cost::{H200_GEMM_TFLOPS, H200_HBM_TBPS};
use distflash::model::profile::OpTime;
use distflash::model::{Checkpoint, Offload};
use distflash::resources;
use distflash::runtime::Device;
use distflash::train::memory::count::Part;
use distflash::train::memory::{GpuStep, HostState, MemoryCheck, Placement, gpu_estimate};
use distflash::train::step_plan::Shard;
use distflash::train::step_plan::{Purpose, whole_layers_said, whole_mlp_said};
use distflash::train::step_timing::{Runs, time_steps};
use serde::Serialize;
use serde_json::Value;

/// How the model FLOPs are counted (see `model::cost::step_flops`).
const FLOPS_FORMULA: &str = "6*N*T + 6*L*T^2*H*d (PaLM, attention halved for the causal mask; N = matmul parameters; recomputation not counted)";

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    place: super::args::DeviceArgs,
    /// A built-in model shape: tiny, llama2-7b, llama-7b-gqa, llama-7b-33h.
    #[arg(long, default_value = "llama2-7b")]
    preset: String,
    /// Run only the first N decoder layers of the preset (when the whole model does not fit).
    #[arg(long, value_parser = values::count::<usize>)]
    layers: Option<usize>,
    #[arg(long, default_value_t = 16384, value_parser = values::whole::<usize>)]
    seq_len: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 1, value_parser = values::whole::<usize>)]
    warmup: usize,
    /// Timed steps; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = values::count::<usize>)]
    repeats: usize,
    /// Print one JSON object instead of sentences.
    #[arg(long)]
    json: bool,
    /// Only print the estimated peak GPU memory of the step (any machine; nothing runs).
    #[arg(long)]
    estimate: bool,
    /// Workers the sequence is split across (by --schedule): CPU threads, or virtual workers
    /// sharing one GPU. With --estimate: the memory of one GPU of a run over this many GPUs (one
    /// process each). A launched run takes its workers from the launcher.
    #[arg(long, default_value_t = 1, value_parser = values::whole::<usize>)]
    workers: usize,
    /// End each step with AdamW's update, as `train` runs it (its moments made, sharded and
    /// offloaded as the step's flags say); with --estimate: count AdamW's state.
    #[arg(long)]
    optimizer: bool,
    /// After the timed steps, run one more with the device waited for after every op and print
    /// where its time went (per op: calls, seconds, share). One device only.
    #[arg(long)]
    profile: bool,
    /// The step's flags, as `train` takes them (`--offload optimizer` with --optimizer only;
    /// `--shard grads` and `full` time the reduce-scatter, and without --optimizer `optimizer`
    /// times the all-reduce as `none`).
    #[command(flatten)]
    step: super::step::StepArgs,
    /// Start on the GPU even when the estimated peak exceeds the free memory (the estimate adds a
    /// 1.5 GiB allowance to the step's tensors; a run that really does not fit then fails at an
    /// allocation).
    #[arg(long)]
    ignore_memory_estimate: bool,
}

#[derive(Serialize)]
struct Report {
    #[serde(rename = "impl")]
    implementation: &'static str,
    device: Device,
    dtype: &'static str,
    preset: String,
    layers: usize,
    seq: usize,
    /// Workers the sequence is split across: devices (processes), or virtual workers on one.
    workers: usize,
    checkpoint: Checkpoint,
    /// The last layers that kept every activation (`--whole-layers`, as decided).
    whole_layers: usize,
    /// Whether the MLP ran over whole rows (the memory check's choice beside the whole layers).
    whole_mlp: bool,
    offload: Offload,
    shard: Shard,
    /// Whether each step ended with AdamW's update.
    optimizer: bool,
    warmup: usize,
    repeats: usize,
    step_secs: f64,
    /// The step at the measured H200 rates (`model::cost::ideal_step_secs`); GPU runs only.
    ideal_step_secs: Option<f64>,
    all_secs: Vec<f64>,
    tokens_per_sec: f64,
    model_tflop_per_step: f64,
    achieved_tflops: f64,
    /// Against H200 bf16 dense peak; GPU runs only.
    mfu: Option<f64>,
    flops_formula: &'static str,
    peak_memory_gib: Option<f64>,
    estimated_memory_gib: Option<f64>,
    attention_forwards_per_layer: Vec<u32>,
    loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<Vec<OpTime>>,
    command: String,
}

pub fn run(args: Args) -> Result<()> {
    let mut cfg = Config::preset(&args.preset)?;
    if let Some(n) = args.layers {
        cfg.num_hidden_layers = n;
        cfg.validate()?;
    }
    let seq = args.seq_len;
    resources::ensure_split(seq, args.workers, args.step.schedule(), false)?;
    if args.estimate {
        let placement = match args.workers {
            0 => bail!("--workers must be at least 1"),
            1 => Placement::OneGpu(1),
            n => Placement::Ranks {
                gpus: n,
                schedule: args.step.schedule(),
            },
        };
        let purpose = Purpose::Estimate {
            optimizer: args.optimizer,
        };
        let plan = args
            .step
            .plan(purpose, args.workers, &cfg, Device::Cuda, true)?;
        // The step run on the counting device (one GPU's, or the largest rank's), with what
        // its working set holds at the peak (`train::memory::gpu_estimate`).
        let estimated = gpu_estimate(GpuStep {
            cfg: &cfg,
            seq,
            plan,
            placement,
            master_bytes: args.place.gpu_dtype().master_bytes(),
        })?;
        let m = estimated.memory;
        let working = estimated.peaks.as_ref().map_or(&[][..], |p| &p.working[..]);
        let gpus = match placement {
            Placement::Ranks { gpus, schedule } => format!(" over {gpus} GPUs ({schedule})"),
            Placement::OneGpu(_) => String::new(),
        };
        if args.json {
            println!(
                "{}",
                serde_json::json!({"preset": args.preset, "layers": cfg.num_hidden_layers, "seq": seq, "workers": args.workers, "schedule": plan.schedule(), "checkpoint": plan.checkpoint(), "offload": plan.offload(), "optimizer": plan.has_optimizer(), "shard": plan.shard(), "estimated_bytes": m, "estimated_gib": gib(m.total()),
                    "working_at_peak": working.iter().map(|(what, p)| serde_json::json!({"made_by": what, "tensors": p.tensors, "bytes": p.bytes})).collect::<Vec<_>>()})
            );
        } else {
            println!(
                "{} ({} layers) at {seq} tokens{gpus}, {plan}: {} on {}",
                args.preset,
                cfg.num_hidden_layers,
                m.describe(),
                if args.workers > 1 {
                    "each GPU"
                } else {
                    "the GPU"
                }
            );
            if !working.is_empty() {
                println!(
                    "working set at the peak, by what made it: {}",
                    describe_working(working)
                );
            }
        }
        return Ok(());
    }
    let runs = Runs {
        warmup: args.warmup,
        repeats: args.repeats,
        profile: args.profile,
    };
    // One device, or virtual workers sharing it (--workers), or one process per device under a
    // launcher.
    let rt = args
        .place
        .runtime((args.workers > 1).then_some(args.workers), |_| 1)?;
    let workers = rt.workers();
    let purpose = Purpose::TimedStep {
        optimizer: args.optimizer,
    };
    let plan = args
        .step
        .plan(purpose, workers, &cfg, rt.device, rt.is_reporter())?;
    resources::ensure_duration(
        (args.warmup + args.repeats) as f64 * cost::step_flops(&cfg, seq),
        super::checks::peak_flops(&rt),
        &format!(
            "bench train's {} steps of {seq} tokens",
            args.warmup + args.repeats
        ),
        "lower --repeats, --warmup or --seq-len",
    )?;
    let memory = MemoryCheck {
        config: cfg.clone(),
        model: args.preset.clone(),
        seq,
        plan,
        host_state: HostState::None,
        ignore_estimate: args.ignore_memory_estimate,
    };
    let Some(steps) = time_steps(&cfg, seq, &plan, runs, &memory, &rt)? else {
        return Ok(()); // a rank other than 0: rank 0 reports its own times
    };
    // The plan as it ran: its whole layers decided by the device's memory.
    let plan = steps.plan;
    let peak = steps.peak_bytes.map(|b| gib(b as f64));
    let ran = MemoryCheck { plan, ..memory };
    let estimate = match rt.device {
        Device::Cuda => Some(gib(ran.gpu_estimate(&rt)?.total())),
        Device::Cpu => None,
    };
    let flops = cost::step_flops(&cfg, seq);
    let achieved = flops / steps.step_secs / 1e12;
    let report = Report {
        implementation: "distflash",
        device: rt.device,
        dtype: rt.precision(),
        preset: args.preset.clone(),
        layers: cfg.num_hidden_layers,
        seq,
        workers,
        checkpoint: plan.checkpoint(),
        whole_layers: plan.whole_layers(),
        whole_mlp: plan.keep().whole_mlp,
        offload: plan.offload(),
        shard: plan.shard(),
        optimizer: plan.has_optimizer(),
        warmup: args.warmup,
        repeats: args.repeats,
        step_secs: steps.step_secs,
        ideal_step_secs: matches!(rt.device, Device::Cuda).then(|| {
            let one = cost::ideal_step_secs(&cfg, seq, plan.keep(), plan.has_optimizer());
            one / workers as f64
        }),
        all_secs: steps.all_secs,
        tokens_per_sec: seq as f64 / steps.step_secs,
        model_tflop_per_step: flops / 1e12,
        achieved_tflops: achieved,
        mfu: matches!(rt.device, Device::Cuda)
            .then(|| achieved / (H200_BF16_PEAK_TFLOPS * workers as f64)),
        flops_formula: FLOPS_FORMULA,
        peak_memory_gib: peak,
        estimated_memory_gib: estimate,
        attention_forwards_per_layer: steps.attention_forwards_per_layer,
        loss: steps.loss,
        profile: steps.profile,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    Ok(())
}

fn print(r: &Report) {
    let device = r.device.name();
    let adamw = if r.optimizer { ", AdamW" } else { "" };
    let whole = whole_layers_said(r.whole_layers) + whole_mlp_said(r.whole_mlp);
    println!(
        "{}, {} layers, {} tokens, checkpoint {}{whole}, offload {}{adamw}, {device} {}",
        r.preset, r.layers, r.seq, r.checkpoint, r.offload, r.dtype
    );
    println!(
        "step {:.3} s (median of {} after {} warm-up): {:.0} tokens/s",
        r.step_secs, r.repeats, r.warmup, r.tokens_per_sec
    );
    if let Some(ideal) = r.ideal_step_secs {
        println!(
            "ideal step {ideal:.3} s at the measured H200 rates ({H200_GEMM_TFLOPS:.0} TFLOP/s GEMMs, {H200_ATTENTION_TFLOPS:.0} attention, {H200_HBM_TBPS} TB/s for the update): measured {:.2}x it",
            r.step_secs / ideal
        );
    }
    let mfu = r.mfu.map_or(String::new(), |m| {
        format!(
            ", MFU {:.1}% of {H200_BF16_PEAK_TFLOPS:.0} TFLOP/s (H200 bf16 dense)",
            100.0 * m
        )
    });
    println!(
        "model FLOPs {:.3e} per step (6·N·T + 6·L·T²·H·d): {:.3} TFLOP/s{mfu}",
        r.model_tflop_per_step * 1e12,
        r.achieved_tflops
    );
    if let (Some(p), Some(e)) = (r.peak_memory_gib, r.estimated_memory_gib) {
        println!("peak GPU memory {p:.1} GiB (estimated {e:.1} GiB)");
    }
    if let Some(profile) = &r.profile {
        let total: f64 = profile.iter().map(|t| t.secs).sum();
        println!("profiled step {total:.3} s (device waited for after every op):");
        for t in profile {
            println!(
                "  {:<20} {:>6} calls {:>9.4} s {:>5.1}%",
                t.op,
                t.calls,
                t.secs,
                100.0 * t.secs / total
            );
        }
    }
}

/// The Hugging Face run a distflash step is compared with: gradient checkpointing on.
const HF_BASELINE: (&str, &str) = ("hf_transformers", "hf_gradient_checkpointing");

/// Markdown table of training-step lines (`bench train --json`, `hf_train_bench.py`), one row
/// per run by layers, length and implementation; each distflash row with its speedup over the
/// Hugging Face run of the same shape with gradient checkpointing. `None` without such lines.
pub fn table(lines: &[Value]) -> Option<String> {
    let key = |l: &Value| {
        (
            l["layers"].as_u64().unwrap_or(0),
            l["seq"].as_u64().unwrap_or(0),
            l["impl"].as_str().unwrap_or("").to_string(),
            l["workers"].as_u64().unwrap_or(1),
            l["checkpoint"].as_str().unwrap_or("").to_string(),
        )
    };
    let mut runs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["step_secs"].is_number() || l["status"] == "oom")
        .collect();
    if runs.is_empty() {
        return None;
    }
    runs.sort_by_key(|l| key(l));
    let baseline = |layers: u64, seq: u64| {
        runs.iter()
            .find(|l| {
                let (ly, n, name, _, ckpt) = key(l);
                (ly, n, name.as_str(), ckpt.as_str()) == (layers, seq, HF_BASELINE.0, HF_BASELINE.1)
            })
            .and_then(|l| l["step_secs"].as_f64())
    };
    let num = |l: &Value, k: &str, f: &dyn Fn(f64) -> String| l[k].as_f64().map_or("—".into(), f);
    let mut md = String::from(
        "| tokens | layers | implementation | GPUs | checkpoint | step | tokens/s | MFU | peak memory | speedup over HF (checkpointing) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for &l in &runs {
        let (layers, seq, name, workers, ckpt) = key(l);
        let step = match l["step_secs"].as_f64() {
            Some(s) => format!("{s:.3} s"),
            None => "out of memory".into(),
        };
        let speedup = match (
            name.as_str(),
            baseline(layers, seq),
            l["step_secs"].as_f64(),
        ) {
            ("distflash", Some(hf), Some(ours)) => format!("{:.2}×", hf / ours),
            _ => "—".into(),
        };
        md += &format!(
            "| {seq} | {layers} | {name} | {workers} | {ckpt} | {step} | {} | {} | {} | {speedup} |\n",
            num(l, "tokens_per_sec", &|x| format!("{x:.0}")),
            num(l, "mfu", &|x| format!("{:.1}%", 100.0 * x)),
            num(l, "peak_memory_gib", &|x| format!("{x:.1} GiB")),
        );
    }
    Some(md)
}

/// The largest parts of the working set at the peak, e.g. "attention_backward workspace 40.0
/// GiB, linear 3 × 4.0 GiB": where a cut would pay.
fn describe_working(parts: &[(&str, Part)]) -> String {
    const SHOWN: usize = 8;
    let mut said: Vec<String> = parts
        .iter()
        .take(SHOWN)
        .map(|(what, p)| match p.tensors {
            0 | 1 => format!("{what} {:.1} GiB", gib(p.bytes as f64)),
            n => format!("{what} {n} tensors, {:.1} GiB", gib(p.bytes as f64)),
        })
        .collect();
    if parts.len() > SHOWN {
        let rest: usize = parts[SHOWN..].iter().map(|(_, p)| p.bytes).sum();
        said.push(format!("the rest {:.1} GiB", gib(rest as f64)));
    }
    said.join(", ")
}
