//! `distflash bench`: rates measured on this machine (`cpu`), the single-GPU attention sweep
//! (`attention`), and the table that sets our results beside the peers' (`report`).

use super::values;
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use distflash::backend::cuda::{
    BlockKind, CallStrides, CudaBackend, InputDtype, time_attention, time_block,
};
use distflash::block_math;
use distflash::cpu_rates;
use distflash::resources;
use distflash::shape::Dims;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum Target {
    /// f32 GEMM rate and single-worker causal attention forward rate on all CPU cores.
    Cpu {
        #[arg(long, default_value_t = 4096, value_parser = values::count::<usize>)]
        seq_len: usize,
        #[arg(long, default_value_t = 8, value_parser = values::count::<usize>)]
        heads: usize,
        #[arg(long, default_value_t = 128, value_parser = values::count::<usize>)]
        head_dim: usize,
        /// Side of the square matrices of the GEMM measurement.
        #[arg(long, default_value_t = 1024, value_parser = values::count::<usize>)]
        matmul_size: usize,
        #[arg(long, default_value_t = 3, value_parser = values::count::<usize>)]
        repeats: usize,
        #[arg(long)]
        json: bool,
    },
    /// Causal attention forward and backward on one GPU, optionally under a mask (documents, a
    /// window, global tokens; rates then count the visible pairs): TFLOP/s per shape (CUDA
    /// events, median of repeats after warm-up), one JSON line per shape.
    Attention {
        /// Only `cuda` is timed here; the CPU rate is `bench cpu`.
        #[arg(long, default_value = "cuda")]
        device: String,
        #[arg(long, value_delimiter = ',', default_value = "4096,16384,65536", value_parser = values::count::<usize>)]
        seqs: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "128,64", value_parser = values::whole::<usize>)]
        head_dims: Vec<usize>,
        #[arg(long, default_value_t = 32, value_parser = values::count::<usize>)]
        heads: usize,
        /// Key/value heads (GQA: a divisor of --heads; default: as many as --heads).
        #[arg(long, value_parser = values::whole::<usize>)]
        kv_heads: Option<usize>,
        #[command(flatten)]
        dtype: super::args::DtypeArg,
        #[command(flatten)]
        mask: super::attention::MaskArgs,
        /// Also time the two blocks the distributed schedules compute over P workers' chunks
        /// of seq/P tokens (a chunk against itself, and against an earlier one: the kernels
        /// whose partial results merge by LSE), each rate beside the whole sequence's. Causal.
        #[arg(long, value_name = "P", value_parser = values::whole::<usize>)]
        blocks: Option<usize>,
        /// How Q, K, V, O and their gradients lie in memory: seq-major (`[seq, heads,
        /// head_dim]`: the model's activations and torch's `[b, s, h, d]`, what training and
        /// the Python binding run) or head-major (`[heads, seq, head_dim]`).
        #[arg(long, value_enum, default_value_t = Layout::SeqMajor)]
        layout: Layout,
        /// Time the deterministic backward (the same bits on every run; reported as
        /// `distflash_deterministic`).
        #[arg(long)]
        deterministic: bool,
        /// Also write the JSON lines here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// One training step without the optimizer (forward and backward of one sequence): step
    /// time, tokens/s, model FLOPs utilisation and peak memory, e.g. `bench train --device cuda
    /// --preset llama2-7b --seq-len 16384 --checkpoint remat`.
    Train(super::bench_train::Args),
    /// Markdown table of the JSON lines in a results folder (ours and the peers', measured in
    /// one device call), with each rate's ratio to the peers.
    Report {
        /// Folder of `*.jsonl` files (`bench attention --json`, `bench/peers/sdpa_bench.py`).
        #[arg(long)]
        results: PathBuf,
        /// Write the table here (e.g. bench/RESULTS.md); standard output if absent.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub fn run(target: Target) -> Result<()> {
    match target {
        Target::Cpu {
            seq_len,
            heads,
            head_dim,
            matmul_size,
            repeats,
            json,
        } => cpu(seq_len, heads, head_dim, matmul_size, repeats, json),
        Target::Attention {
            device,
            seqs,
            head_dims,
            heads,
            kv_heads,
            dtype,
            mask,
            blocks,
            layout,
            deterministic,
            json,
        } => {
            if device != "cuda" {
                bail!(
                    "bench attention times a GPU (--device cuda); for the CPU use `distflash bench cpu`"
                );
            }
            if let Some(workers) = blocks {
                check_blocks(workers, &seqs, &mask)?;
            }
            let shape = AttentionShape {
                seqs: &seqs,
                head_dims: &head_dims,
                heads,
                kv_heads: kv_heads.unwrap_or(heads),
                layout,
                deterministic,
            };
            attention(&shape, dtype.gpu(), &mask, blocks, json)
        }
        Target::Train(args) => super::bench_train::run(args),
        Target::Report { results, out } => report(&results, out),
    }
}

/// Where `bench attention`'s tensors lie (`--layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    SeqMajor,
    HeadMajor,
}

impl Layout {
    fn strides(self, dims: &Dims, seq: usize) -> CallStrides {
        match self {
            Layout::SeqMajor => CallStrides::seq_major(dims, seq),
            Layout::HeadMajor => CallStrides::head_major(dims, seq, seq),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Layout::SeqMajor => "seq-major",
            Layout::HeadMajor => "head-major",
        }
    }
}

/// The shapes `bench attention` times: every length at every head dim, in one layout.
struct AttentionShape<'a> {
    seqs: &'a [usize],
    head_dims: &'a [usize],
    heads: usize,
    kv_heads: usize,
    layout: Layout,
    deterministic: bool,
}

/// The benchmarks' shape: batch 1, `kv_heads` KV heads for `heads` query heads.
fn batch_one(heads: usize, kv_heads: usize, head_dim: usize) -> Result<Dims> {
    let dims = Dims {
        batch: 1,
        heads,
        kv_heads,
        head_dim,
    };
    dims.validate()?;
    Ok(dims)
}

fn cpu(
    seq_len: usize,
    heads: usize,
    head_dim: usize,
    matmul_size: usize,
    repeats: usize,
    json: bool,
) -> Result<()> {
    let dims = batch_one(heads, heads, head_dim)?;
    // The GEMM's three square matrices, then attention's tensors, each alive alone.
    let side = matmul_size as f64;
    let gemm_bytes = 3.0 * 4.0 * side * side;
    let attention_bytes = resources::attention_bytes(&dims, seq_len, 0, false);
    resources::ensure_fits(
        gemm_bytes.max(attention_bytes),
        &format!("bench cpu (a {matmul_size}² GEMM, attention over {seq_len} tokens)"),
        "use a smaller --matmul-size or --seq-len",
    )?;
    let flops = 2.0 * side.powi(3) + block_math::causal_forward_flops(&dims, seq_len);
    resources::ensure_duration(
        repeats as f64 * flops,
        resources::cpu_peak_flops(),
        &format!("bench cpu's {repeats} repeats"),
        "lower --repeats, --matmul-size or --seq-len",
    )?;
    let gemm = cpu_rates::cpu_matmul_gflops(matmul_size, repeats);
    let attention = cpu_rates::cpu_attention_forward_gflops(dims, seq_len, repeats);
    let threads = rayon::current_num_threads();
    if json {
        println!(
            "{}",
            json!({
                "threads": threads,
                "matmul_size": matmul_size,
                "matmul_gflops": gemm,
                "seq_len": seq_len, "heads": heads, "head_dim": head_dim,
                "attention_forward_gflops": attention,
                "attention_over_matmul": attention / gemm,
            })
        );
    } else {
        println!("threads                          {threads}");
        println!("f32 matmul {matmul_size}³               {gemm:8.1} GFLOP/s");
        println!(
            "causal attention forward         {attention:8.1} GFLOP/s  (seq {seq_len}, {heads} heads, head dim {head_dim}, 1 worker)"
        );
        println!(
            "attention / matmul               {:8.1} %",
            100.0 * attention / gemm
        );
    }
    Ok(())
}

/// Refuses, before a GPU is opened, what `--blocks P` cannot time: fewer than two workers,
/// lengths P does not divide, or a mask (the block timings are causal).
fn check_blocks(
    workers: usize,
    seqs: &[usize],
    mask_args: &super::attention::MaskArgs,
) -> Result<()> {
    if workers < 2 {
        bail!(
            "--blocks {workers}: per-block rates need at least 2 workers' chunks; use --blocks 2 or more"
        );
    }
    for &seq in seqs {
        if !seq.is_multiple_of(workers) || seq < workers {
            bail!(
                "--blocks {workers} cuts each sequence into {workers} equal chunks, and {seq} tokens do not divide by {workers}: pick --seqs that do"
            );
        }
        if !mask_args.mask(seq, 0)?.is_causal() {
            bail!(
                "--blocks times causal blocks only; drop the mask flags (--doc-lens, --docs, --window, --global) or --blocks"
            );
        }
    }
    Ok(())
}

fn attention(
    shape: &AttentionShape<'_>,
    dtype: InputDtype,
    mask_args: &super::attention::MaskArgs,
    blocks: Option<usize>,
    json: Option<PathBuf>,
) -> Result<()> {
    let mut file = json
        .as_deref()
        .map(super::outputs::create_output)
        .transpose()?;
    let be = CudaBackend::new(0, dtype)?.with_deterministic(shape.deterministic)?;
    let ours = if shape.deterministic {
        "distflash_deterministic"
    } else {
        "distflash"
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let (heads, kv_heads) = (shape.heads, shape.kv_heads);
    for &head_dim in shape.head_dims {
        for &seq in shape.seqs {
            let dims = batch_one(heads, kv_heads, head_dim)?;
            let mask = mask_args.mask(seq, 0)?;
            let strides = shape.layout.strides(&dims, seq);
            let t = time_attention(&be, dims, seq, &mask, &strides)?;
            let (f, b) = (
                block_math::masked_forward_flops(&dims, &mask, seq),
                block_math::masked_backward_flops(&dims, &mask, seq),
            );
            let tflops = |flops: f64, ms: f64| flops / (ms * 1e-3) / 1e12;
            let line = json!({
                "impl": ours, "dtype": dtype.name(), "seq": seq, "heads": heads,
                "kv_heads": kv_heads, "head_dim": head_dim, "fwd_ms": t.forward_ms, "bwd_ms": t.backward_ms,
                "fwd_tflops": tflops(f, t.forward_ms), "bwd_tflops": tflops(b, t.backward_ms),
                "fwdbwd_tflops": tflops(f + b, t.forward_ms + t.backward_ms),
                "reps": t.repeats, "command": command, "mask": mask.to_string(),
                "layout": shape.layout.name(),
                "visible_fraction": f / block_math::causal_forward_flops(&dims, seq),
            });
            let mut lines = vec![line];
            if let Some(workers) = blocks {
                let whole = tflops(f + b, t.forward_ms + t.backward_ms);
                let chunk = seq / workers;
                for kind in BlockKind::BOTH {
                    let bt = time_block(&be, dims, chunk, kind)?;
                    let (bf, bb) = (
                        kind.forward_flops(&dims, chunk),
                        kind.backward_flops(&dims, chunk),
                    );
                    let rate = tflops(bf + bb, bt.forward_ms + bt.backward_ms);
                    lines.push(json!({
                        "impl": "distflash_block", "block": kind, "workers": workers,
                        "chunk": chunk, "dtype": dtype.name(), "seq": seq, "heads": heads,
                        "head_dim": head_dim, "fwd_ms": bt.forward_ms, "bwd_ms": bt.backward_ms,
                        "fwd_tflops": tflops(bf, bt.forward_ms),
                        "bwd_tflops": tflops(bb, bt.backward_ms),
                        "fwdbwd_tflops": rate, "fwdbwd_over_whole": rate / whole,
                        "reps": bt.repeats, "command": command,
                    }));
                }
            }
            for line in lines {
                println!("{line}");
                if let Some(f) = file.as_mut() {
                    writeln!(f, "{line}")?;
                }
            }
        }
    }
    Ok(())
}

/// Every JSON line of every `*.jsonl` file in `dir`.
fn read_lines(dir: &std::path::Path) -> Result<Vec<Value>> {
    let mut lines = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the results folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        for (i, l) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: Value = serde_json::from_str(l)
                .with_context(|| format!("{}:{} is not JSON", path.display(), i + 1))?;
            lines.push(v);
        }
    }
    if lines.is_empty() {
        bail!("no JSON lines in {}/*.jsonl", dir.display());
    }
    Ok(lines)
}

fn report(dir: &std::path::Path, out: Option<PathBuf>) -> Result<()> {
    let lines = read_lines(dir)?;
    // (head_dim, seq) → impl → line
    let mut table: BTreeMap<(u64, u64), BTreeMap<String, &Value>> = BTreeMap::new();
    for l in &lines {
        let (Some(d), Some(n), Some(name)) = (
            l["head_dim"].as_u64(),
            l["seq"].as_u64(),
            l["impl"].as_str(),
        ) else {
            continue;
        };
        table.entry((d, n)).or_default().insert(name.to_string(), l);
    }
    let rate = |l: Option<&&Value>, key: &str| l.and_then(|l| l[key].as_f64());
    let cell = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{x:.0}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    };
    let mut md = format!(
        "Generated by `distflash bench report --results {}` from the JSON lines there, measured in\n\
         one device call.\n\n",
        dir.display()
    );
    if !table.is_empty() {
        md += "All rates in TFLOP/s (causal; forward 4·N²·H·d/2 FLOPs, backward 2.5× that), batch 1.\n\
               Ratios are distflash over the peer, forward+backward.\n\n\
               | head dim | seq | ours fwd | ours bwd | ours fwd+bwd | SDPA FA2 fwd+bwd | SDPA cuDNN fwd+bwd | vs FA2 | vs cuDNN |\n\
               | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    }
    for ((d, n), impls) in &table {
        let ours = impls.get("distflash");
        let fa2 = rate(impls.get("sdpa_flash2"), "fwdbwd_tflops");
        let cudnn = rate(impls.get("sdpa_cudnn"), "fwdbwd_tflops");
        let both = rate(ours, "fwdbwd_tflops");
        md += &format!(
            "| {d} | {n} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(rate(ours, "fwd_tflops")),
            cell(rate(ours, "bwd_tflops")),
            cell(both),
            cell(fa2),
            cell(cudnn),
            ratio(both, fa2),
            ratio(both, cudnn)
        );
    }
    if let Some(train) = super::bench_train::table(&lines) {
        if !table.is_empty() {
            md += "\n";
        }
        md += "Training steps (forward+backward, no optimizer step, batch 1; MFU: model FLOPs\n\
               6·N·T + 6·L·T²·H·d over 989 TFLOP/s):\n\n";
        md += &train;
    }
    let commands: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["command"].as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !commands.is_empty() {
        md += "\nCommands:\n\n";
        for c in commands {
            md += &format!("    {c}\n");
        }
    }
    match out {
        Some(path) => {
            std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?
        }
        None => print!("{md}"),
    }
    Ok(())
}
