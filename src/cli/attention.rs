//! `distflash attention`: distributed causal attention forward and backward on random inputs,
//! optionally masked (packed documents, a sliding window, global tokens), with timings,
//! per-worker load and traffic, an optional check against the f64 oracle under the same mask and
//! an optional safetensors dump of inputs and results.

use super::values;
use anyhow::{Result, bail};
use distflash::backend::cuda::InputDtype;
use distflash::block_math::{self, layout, oracle};
use distflash::harness::{self, AttentionRun, Strategy};
use distflash::inputs::{self, Inputs};
use distflash::plan::Schedule;
use distflash::resources;
use distflash::runtime::{Device, Runtime};
use distflash::shape::{Dims, Mask};
use distflash::tensor_file::{self, Named};
use serde::Serialize;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    place: super::args::DeviceArgs,
    /// Workers the sequence is split across [default: WORLD_SIZE under a launcher, else 4 on
    /// the CPU and 1 on CUDA].
    #[arg(long, value_parser = values::whole::<usize>)]
    workers: Option<usize>,
    /// Tokens in the sequence (need not divide by the worker count).
    #[arg(long, default_value_t = 2048, value_parser = values::whole::<usize>)]
    seq_len: usize,
    /// Query heads.
    #[arg(long, default_value_t = 8, value_parser = values::whole::<usize>)]
    heads: usize,
    /// Key/value heads (GQA when fewer than heads, MQA at 1).
    #[arg(long, default_value_t = 2, value_parser = values::whole::<usize>)]
    kv_heads: usize,
    #[arg(long, default_value_t = 64, value_parser = values::whole::<usize>)]
    head_dim: usize,
    #[arg(long, default_value_t = 1, value_parser = values::whole::<usize>)]
    batch: usize,
    /// `balanced` (DistFlashAttn), `unbalanced`, `zigzag` (a head and a tail chunk per worker) or
    /// `greedy` (blocks assigned by their real cost under the mask).
    #[arg(long, default_value = "balanced")]
    schedule: Schedule,
    /// Timed runs; times reported are their medians (on CUDA after one untimed warm-up run).
    #[arg(long, default_value_t = 1, value_parser = values::count::<u64>)]
    repeats: u64,
    /// Serialise communication with compute (each step fetches its inputs just before it
    /// computes) — the paper's ablation of prefetching.
    #[arg(long)]
    no_overlap: bool,
    /// Seed of the random inputs (and of `--docs random:N`'s lengths).
    #[arg(long, default_value_t = 0, value_parser = values::whole::<u64>)]
    seed: u64,
    #[command(flatten)]
    mask: MaskArgs,
    /// Compare with the f64 oracle (quadratic memory-free but slow: keep seq-len moderate).
    #[arg(long)]
    check: bool,
    /// Write q, k, v, dout, out, lse, dq, dk, dv to this safetensors file.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Relative error (max abs error / max abs value) above which `--check` fails. f32 CPU results
/// land orders of magnitude below 1e-4. On a GPU the oracle sees the same rounded inputs, so
/// the error is the kernels' own: probabilities rounded to 16 bits before P·V and dS·K (8
/// significant bits in bf16, 11 in fp16) with f32 accumulation.
fn check_tolerance(rt: &Runtime) -> f64 {
    match (rt.device, rt.dtype) {
        (Device::Cpu, _) => 1e-4,
        // Seen on an H200 (bench/cuda.md): at most 3.1e-3 in bf16 and 2.2e-4 in fp16.
        (Device::Cuda, InputDtype::Bf16) => 1e-2,
        (Device::Cuda, InputDtype::F16) => 1e-3,
    }
}

/// The mask flags `attention`, `plan` and `simulate` share.
#[derive(clap::Args)]
pub struct MaskArgs {
    /// Pack the sequence from documents of these lengths (they must add up to the sequence
    /// length; any lengths, one-token documents included): a token sees only its own document.
    #[arg(long, value_delimiter = ',', conflicts_with = "docs", value_parser = values::whole::<usize>)]
    doc_lens: Vec<usize>,
    /// `random:N`: N documents of random lengths (at least one token each) from the seed.
    #[arg(long)]
    docs: Option<String>,
    /// Causal sliding window: a token sees itself and the W − 1 tokens before it (in its
    /// document).
    #[arg(long, value_parser = values::whole::<usize>)]
    window: Option<usize>,
    /// Global prefix tokens: every later token sees the first G tokens, across documents and
    /// beyond the window.
    #[arg(long, default_value_t = 0, value_parser = values::whole::<usize>)]
    global: usize,
}

impl MaskArgs {
    /// True when any mask flag was given.
    pub fn given(&self) -> bool {
        !self.doc_lens.is_empty() || self.docs.is_some() || self.window.is_some() || self.global > 0
    }

    /// The mask of a `seq`-token sequence; `--docs random:N` draws its lengths from `seed`.
    pub fn mask(&self, seq: usize, seed: u64) -> Result<Mask> {
        let lens = match &self.docs {
            None => self.doc_lens.clone(),
            Some(spec) => {
                let count = spec
                    .strip_prefix("random:")
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "--docs takes random:N (N documents of random lengths), not '{spec}'"
                        )
                    })?;
                inputs::random_doc_lens(seq, count, seed)?
            }
        };
        Mask::new(seq, &lens, self.window, self.global)
    }
}

#[derive(Serialize)]
struct MaskReport {
    /// Document lengths (one entry: an unpacked sequence).
    doc_lens: Vec<usize>,
    window: Option<usize>,
    global: usize,
    /// Share of the causal (query, key) pairs the mask leaves visible.
    visible_fraction: f64,
}

impl MaskReport {
    fn new(mask: &Mask, seq: usize) -> MaskReport {
        let whole = distflash::shape::Span { start: 0, len: seq };
        let causal = (seq as f64) * (seq as f64 + 1.0) / 2.0;
        let docs = mask.doc_lens();
        MaskReport {
            doc_lens: if docs.is_empty() { vec![seq] } else { docs },
            window: mask.window(),
            global: mask.global(),
            visible_fraction: mask.visible_pairs(whole, whole) as f64 / causal,
        }
    }
}

#[derive(Serialize)]
struct Error {
    max_abs: f64,
    relative: f64,
}

#[derive(Serialize)]
struct Check {
    tolerance: f64,
    passed: bool,
    out: Error,
    lse: Error,
    dq: Error,
    dk: Error,
    dv: Error,
}

#[derive(Serialize)]
struct Report {
    device: Device,
    /// Precision of the inputs: f32 on the CPU, bf16 or fp16 on a GPU.
    precision: &'static str,
    workers: usize,
    schedule: Schedule,
    seq_len: usize,
    mask: MaskReport,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    forward_secs: f64,
    backward_secs: f64,
    forward_gflops: f64,
    backward_gflops: f64,
    per_worker: Vec<WorkerLine>,
    check: Option<Check>,
}

#[derive(Serialize)]
struct WorkerLine {
    rows: usize,
    /// Share of the pass spent in block math; measured with host clocks, so only on the CPU
    /// (on a GPU that times kernel launches, not kernels, and is left out).
    forward_busy: Option<f64>,
    backward_busy: Option<f64>,
    forward_bytes_sent: u64,
    backward_bytes_sent: u64,
    /// Share of the pass the worker's compute waited for other workers' data.
    forward_wait: f64,
    backward_wait: f64,
}

pub fn run(args: Args) -> Result<()> {
    let dims = Dims {
        batch: args.batch,
        heads: args.heads,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
    };
    dims.validate()?;
    let rt = args.place.runtime(args.workers, |device| match device {
        Device::Cpu => 4,
        Device::Cuda => 1,
    })?;
    // Threads of this process that hold their own copies: CPU workers, not GPU ones.
    let cpu_workers = match rt.device {
        Device::Cpu => rt.workers_per_device(),
        Device::Cuda => 0,
    };
    super::checks::ensure_split(args.seq_len, args.schedule, &rt)?;
    resources::ensure_attention_fits(&dims, args.seq_len, cpu_workers, args.check)?;
    // Every timed run, and the warm-up on a GPU, computes the whole causal pass.
    let passes = args.repeats as f64 + f64::from(u8::from(rt.device == Device::Cuda));
    let flops = passes
        * (block_math::causal_forward_flops(&dims, args.seq_len)
            + block_math::causal_backward_flops(&dims, args.seq_len));
    resources::ensure_duration(
        flops,
        super::checks::peak_flops(&rt),
        &format!(
            "{} runs of attention over {} tokens",
            args.repeats, args.seq_len
        ),
        "lower --repeats or --seq-len",
    )?;
    if let Some(path) = &args.save {
        super::outputs::ensure_writable(path)?;
    }
    let mask = args.mask.mask(args.seq_len, args.seed)?;
    let mut x = Inputs::random(dims, args.seq_len, args.seed).with_mask(mask)?;
    if rt.device == Device::Cuda {
        // Rounded to the GPU's precision first, so the check and the saved file describe
        // exactly what it computed.
        for t in [&mut x.q, &mut x.k, &mut x.v, &mut x.dout] {
            t.iter_mut().for_each(|v| *v = rt.dtype.round(*v));
        }
    }
    let how = Strategy {
        schedule: args.schedule,
        overlap: !args.no_overlap,
        // On a GPU the first run compiles (or loads) the kernels: keep it out of the times.
        warmup: rt.device == Device::Cuda,
        repeats: args.repeats as usize,
    };
    let Some(run) = harness::run(&x, how, &rt)? else {
        return Ok(()); // a rank other than 0: rank 0 reports for everyone
    };
    let check = args.check.then(|| check(&x, &run, check_tolerance(&rt)));
    let precision = rt.precision();
    if let Some(path) = &args.save {
        save_run(path, &x, &run, precision)?;
    }
    let host_timed = rt.device == Device::Cpu;
    let report = Report {
        device: rt.device,
        precision,
        workers: rt.workers(),
        schedule: args.schedule,
        seq_len: args.seq_len,
        mask: MaskReport::new(&x.mask, args.seq_len),
        batch: args.batch,
        heads: args.heads,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
        forward_secs: run.forward_secs,
        backward_secs: run.backward_secs,
        forward_gflops: block_math::masked_forward_flops(&dims, &x.mask, args.seq_len)
            / run.forward_secs
            / 1e9,
        backward_gflops: block_math::masked_backward_flops(&dims, &x.mask, args.seq_len)
            / run.backward_secs
            / 1e9,
        per_worker: run
            .workers
            .iter()
            .map(|w| WorkerLine {
                rows: w.rows,
                forward_busy: host_timed.then(|| w.forward_busy_secs / run.forward_secs),
                backward_busy: host_timed.then(|| w.backward_busy_secs / run.backward_secs),
                forward_bytes_sent: w.forward_bytes_sent,
                backward_bytes_sent: w.backward_bytes_sent,
                forward_wait: w.forward_wait_secs / run.forward_secs,
                backward_wait: w.backward_wait_secs / run.backward_secs,
            })
            .collect(),
        check,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    match &report.check {
        Some(c) if !c.passed => bail!(
            "check failed: an error exceeds the tolerance {}",
            c.tolerance
        ),
        _ => Ok(()),
    }
}

fn error(got: &[f32], want: &[f64]) -> Error {
    let max_abs = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| {
            if g.is_finite() {
                (g as f64 - w).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max);
    let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
    Error {
        max_abs,
        relative: max_abs / scale.max(f64::MIN_POSITIVE),
    }
}

fn check(x: &Inputs, run: &AttentionRun, tolerance: f64) -> Check {
    let fwd = oracle::forward(&x.problem());
    let bwd = oracle::backward(&x.problem());
    let errors = [
        error(&run.out, &fwd.out),
        error(&run.lse, &fwd.lse),
        error(&run.dq, &bwd.dq),
        error(&run.dk, &bwd.dk),
        error(&run.dv, &bwd.dv),
    ];
    let passed = errors.iter().all(|e| e.relative <= tolerance);
    let [out, lse, dq, dk, dv] = errors;
    Check {
        tolerance,
        passed,
        out,
        lse,
        dq,
        dk,
        dv,
    }
}

/// Saves inputs and results in the public layout: `[batch, seq, heads, head_dim]` tensors and
/// `lse` as `[batch, heads, seq]`.
fn save_run(path: &std::path::Path, x: &Inputs, run: &AttentionRun, precision: &str) -> Result<()> {
    let d = x.dims;
    let n = x.seq;
    let q_shape = vec![d.batch, n, d.heads, d.head_dim];
    let kv_shape = vec![d.batch, n, d.kv_heads, d.head_dim];
    let sm = |t: &[f32], heads| layout::to_seq_major(t, d.batch, n, heads, d.head_dim);
    let tensors = [
        ("q", &x.q, d.heads),
        ("k", &x.k, d.kv_heads),
        ("v", &x.v, d.kv_heads),
        ("dout", &x.dout, d.heads),
        ("out", &run.out, d.heads),
        ("dq", &run.dq, d.heads),
        ("dk", &run.dk, d.kv_heads),
        ("dv", &run.dv, d.kv_heads),
    ]
    .map(|(name, t, heads)| (name, sm(t, heads), heads));
    let mut named: Vec<Named<'_>> = tensors
        .iter()
        .map(|(name, data, heads)| Named {
            name,
            shape: if *heads == d.heads {
                q_shape.clone()
            } else {
                kv_shape.clone()
            },
            data,
        })
        .collect();
    named.push(Named {
        name: "lse",
        shape: vec![d.batch, d.heads, n],
        data: &run.lse,
    });
    tensor_file::write(path, &named, &[("dtype", precision)])
}

fn print_table(r: &Report) {
    let bytes = |b: u64| format!("{:.2} MB", b as f64 / 1e6);
    println!(
        "distflash attention: {} ({}), {} workers, {} schedule, seq {}, batch {}, heads {}/{} (q/kv), head dim {}",
        r.device.name(),
        r.precision,
        r.workers,
        r.schedule,
        r.seq_len,
        r.batch,
        r.heads,
        r.kv_heads,
        r.head_dim
    );
    let m = &r.mask;
    if m.doc_lens.len() > 1 || m.window.is_some() || m.global > 0 {
        let window = m.window.map_or("none".to_string(), |w| w.to_string());
        println!(
            "mask: {} documents, window {window}, {} global tokens: {:.1}% of the causal pairs visible (rates count visible pairs)",
            m.doc_lens.len(),
            m.global,
            100.0 * m.visible_fraction
        );
    }
    let rate = |gflops: f64| match gflops {
        g if g >= 1e3 => format!("{:8.1} TFLOP/s", g / 1e3),
        g => format!("{g:8.2} GFLOP/s"),
    };
    println!(
        "forward   {:9.4} s  {}",
        r.forward_secs,
        rate(r.forward_gflops)
    );
    println!(
        "backward  {:9.4} s  {}",
        r.backward_secs,
        rate(r.backward_gflops)
    );
    let share = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{:.0}%", 100.0 * x));
    println!("\nworker  rows    busy fwd  busy bwd  wait fwd  wait bwd  sent fwd     sent bwd");
    for (w, line) in r.per_worker.iter().enumerate() {
        println!(
            "{w:<7} {:<7} {:>8}  {:>8}  {:>8}  {:>8}  {:<12} {}",
            line.rows,
            share(line.forward_busy),
            share(line.backward_busy),
            share(Some(line.forward_wait)),
            share(Some(line.backward_wait)),
            bytes(line.forward_bytes_sent),
            bytes(line.backward_bytes_sent)
        );
    }
    println!(
        "(wait: the share of the pass a worker's compute waited for others' data: \
         communication left exposed, plus imbalance)"
    );
    if let Some(c) = &r.check {
        println!("\ncheck against the f64 oracle (relative = max abs error / max abs value):");
        for (name, e) in [
            ("out", &c.out),
            ("lse", &c.lse),
            ("dq", &c.dq),
            ("dk", &c.dk),
            ("dv", &c.dv),
        ] {
            println!(
                "  {name:<4} max abs {:.3e}  relative {:.3e}",
                e.max_abs, e.relative
            );
        }
        println!(
            "  {} (tolerance {:.0e})",
            if c.passed { "PASSED" } else { "FAILED" },
            c.tolerance
        );
    }
}
