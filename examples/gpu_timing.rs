//! Timings on a GPU that the `distflash` binary does not offer, for re-tuning the kernels:
//!
//!   gpu_timing attention --seqs 16384,65536 --head-dims 128   # a kernel variant's TFLOP/s
//!   gpu_timing layout --seq 16384      # the model adapter (in place, its roundings) vs the fast path
//!   gpu_timing ops --rows 16384        # the model's largest ops at LLaMA-7B sizes, bf16
//!   gpu_timing spread --seq 131072     # each backward's time, over fresh allocations
//!
//! `attention` is `distflash bench attention` (same JSON lines, for `distflash bench report`)
//! with the kernel variant named in `DISTFLASH_TUNING` (e.g. `bwd-warps=4,fwd-wgmma=false`,
//! see `tests/gpu_common/tuning.rs`; the GPU tests check a variant's correctness under the same
//! variable) and the variant recorded in each line. `layout` times forward+backward through
//! `model::cuda::whole_sequence::CudaAttention` against the fast path alone at LLaMA-7B's attention
//! shape, the cost a training step pays per layer, with the memory figures `bench train`
//! reports. `ops` times the largest model ops alone, in turn over rounds (`bench train --profile`
//! gives every op's share of a whole step, with the device waited for after each). Needs a GPU; without one it says so and exits non-zero.

#[path = "../tests/gpu_common/tuning.rs"]
mod tuning;

use anyhow::Result;
use clap::Parser;
use distflash::backend::Backend;
use distflash::backend::cuda::{
    CallStrides, CudaBackend, InputDtype, SequenceCall, median_ms, run_times_ms, time_attention,
    upload_random,
};
use distflash::block_math::{self, layout};
use distflash::inputs::Inputs;
use distflash::model::attention_api::Attention;
use distflash::model::cuda::CudaOps;
use distflash::model::cuda::whole_sequence::CudaAttention;
use distflash::model::ops::{LinearBackward, LossInput, NormBackward, Ops, Rows};
use distflash::shape::{Dims, Mask};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

#[derive(Parser)]
enum Cli {
    /// Causal forward and backward of the whole sequence, TFLOP/s per shape (CUDA events,
    /// median of repeats after warm-up), one JSON line per shape.
    Attention {
        #[arg(long, value_delimiter = ',', default_value = "4096,16384,65536")]
        seqs: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "128,64")]
        head_dims: Vec<usize>,
        #[arg(long, default_value_t = 32)]
        heads: usize,
        /// KV heads (GQA, MQA); default: as many as query heads.
        #[arg(long)]
        kv_heads: Option<usize>,
        #[arg(long, default_value = "bf16")]
        dtype: InputDtype,
        /// Also write the JSON lines here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Forward+backward through the model's attention adapter and through the fast path alone.
    Layout {
        #[arg(long, default_value_t = 16384)]
        seq: usize,
    },
    /// GEMMs, the loss and RMSNorm of `model::cuda::CudaOps` at LLaMA-7B sizes, bf16: the
    /// linear layers' three shapes forward and backward (the weight gradient in f32, as a step
    /// keeps it, added to or written, and in 16 bits, to tell its f32 output's cost from its
    /// layout's), the MLP's products over the rows whole and in blocks, the norm and its
    /// backward. Each case's median of 9 rounds taken in turn (CUDA events).
    Ops {
        #[arg(long, default_value_t = 4096)]
        rows: usize,
        /// The MLP's products are also timed over blocks of this many rows (a step's
        /// `model::mlp_block_rows`, LLaMA-7B's 6096) beside the rows whole.
        #[arg(long, default_value_t = 6096)]
        mlp_block: usize,
    },
    /// Each causal backward's time alone (d128, 32 heads, bf16), `reps` in a row on the same
    /// tensors, for `rounds` rounds of freshly allocated and uploaded inputs: whether a slow
    /// run is a property of the process, of the allocation or of the moment.
    Spread {
        #[arg(long, default_value_t = 131072)]
        seq: usize,
        #[arg(long, default_value_t = 4)]
        rounds: usize,
        #[arg(long, default_value_t = 4)]
        reps: usize,
        /// Run a round's reps back to back, as `attention` times them (each still timed),
        /// instead of waiting for each before the next.
        #[arg(long)]
        back_to_back: bool,
    },
}

fn open(dtype: InputDtype) -> Result<CudaBackend> {
    let be = CudaBackend::new(0, dtype)?;
    match tuning::from_env()? {
        Some(t) => be.with_tuning(t),
        None => Ok(be),
    }
}

fn main() -> Result<()> {
    match Cli::parse() {
        Cli::Attention {
            seqs,
            head_dims,
            heads,
            kv_heads,
            dtype,
            json,
        } => attention(
            &open(dtype)?,
            &seqs,
            &head_dims,
            (heads, kv_heads.unwrap_or(heads)),
            json.as_deref(),
        ),
        Cli::Layout { seq } => layout_cost(&open(InputDtype::Bf16)?, seq),
        Cli::Spread {
            seq,
            rounds,
            reps,
            back_to_back,
        } => spread(&open(InputDtype::Bf16)?, seq, rounds, reps, back_to_back),
        Cli::Ops { rows, mlp_block } => {
            ops(&CudaOps::new(open(InputDtype::Bf16)?)?, rows, mlp_block)
        }
    }
}

fn attention(
    be: &CudaBackend,
    seqs: &[usize],
    head_dims: &[usize],
    (heads, kv_heads): (usize, usize),
    json: Option<&std::path::Path>,
) -> Result<()> {
    let mut lines = vec![];
    for &head_dim in head_dims {
        for &seq in seqs {
            let dims = Dims {
                batch: 1,
                heads,
                kv_heads,
                head_dim,
            };
            dims.validate()?;
            let strides = CallStrides::head_major(&dims, seq, seq);
            let t = time_attention(be, dims, seq, &Mask::causal(), &strides)?;
            let (f, b) = (
                block_math::causal_forward_flops(&dims, seq),
                block_math::causal_backward_flops(&dims, seq),
            );
            let tflops = |flops: f64, ms: f64| flops / (ms * 1e-3) / 1e12;
            let line = json!({
                "impl": "distflash", "dtype": be.dtype().name(), "seq": seq, "heads": heads,
                "kv_heads": kv_heads,
                "head_dim": head_dim, "tuning": format!("{:?}", be.tuning(head_dim)),
                "fwd_ms": t.forward_ms, "bwd_ms": t.backward_ms,
                "fwd_tflops": tflops(f, t.forward_ms), "bwd_tflops": tflops(b, t.backward_ms),
                "fwdbwd_tflops": tflops(f + b, t.forward_ms + t.backward_ms),
                "reps": t.repeats,
            })
            .to_string();
            println!("{line}");
            lines.push(line);
        }
    }
    if let Some(path) = json {
        std::fs::write(path, lines.join("\n") + "\n")?;
    }
    Ok(())
}

fn spread(
    be: &CudaBackend,
    seq: usize,
    rounds: usize,
    reps: usize,
    back_to_back: bool,
) -> Result<()> {
    let dims = Dims {
        batch: 1,
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
    };
    let mask = Mask::causal();
    // Each round's tensors stay allocated, so the next round's lie at other addresses.
    let mut kept = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let [q, k, v, dout] = upload_random(be, dims, seq, 100 + round as u64)?;
        let strides = CallStrides::head_major(&dims, seq, seq);
        let qkv = [&q, &k, &v];
        let call = SequenceCall {
            dims: &dims,
            seq,
            mask: &mask,
            strides: &strides,
        };
        let fwd = be.causal_forward(&call, qkv)?;
        let mut grads = be.causal_backward(&call, qkv, fwd.as_ref(), &dout)?;
        let mut backward = || {
            let f = fwd.as_ref();
            be.causal_backward_into(&call, qkv, f, &dout, &mut grads)
        };
        let times = if back_to_back {
            run_times_ms(be, reps, &mut backward)?
        } else {
            (0..reps)
                .map(|_| median_ms(be, 1, &mut backward))
                .collect::<Result<Vec<_>>>()?
        };
        let forward = median_ms(be, 1, &mut || be.causal_forward(&call, qkv).map(drop))?;
        println!(
            "{}",
            json!({
                "seq": seq, "round": round, "back_to_back": back_to_back,
                "bwd_ms": times, "fwd_ms": forward,
            })
        );
        kept.push((q, k, v, dout, fwd, grads));
    }
    Ok(())
}

fn layout_cost(be: &CudaBackend, seq: usize) -> Result<()> {
    be.reset_peak_memory()?;
    let dims = Dims {
        batch: 1,
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
    };
    let x = Inputs::random(dims, seq, 1);
    let seq_major = |t: &[f32]| be.upload(&layout::to_seq_major(t, 1, seq, 32, 128));
    let (q, k, v, dout) = (
        seq_major(&x.q)?,
        seq_major(&x.k)?,
        seq_major(&x.v)?,
        seq_major(&x.dout)?,
    );
    let (qh, kh, vh, gh) = (
        be.upload(&x.q)?,
        be.upload(&x.k)?,
        be.upload(&x.v)?,
        be.upload(&x.dout)?,
    );
    let mut attn = CudaAttention::new(be, dims, seq)?;
    let mut adapter = || -> Result<()> {
        let (o, lse) = attn.forward(&q, &k, &v)?;
        attn.backward(&q, &k, &v, &o, &lse, &dout)?;
        Ok(())
    };
    adapter()?;
    let ours = median_ms(be, 10, &mut adapter)?;
    let mut fast = || -> Result<()> {
        let strides = CallStrides::head_major(&dims, seq, seq);
        let qkv = [&qh, &kh, &vh];
        let call = SequenceCall {
            dims: &dims,
            seq,
            mask: &Mask::causal(),
            strides: &strides,
        };
        let fwd = be.causal_forward(&call, qkv)?;
        be.causal_backward(&call, qkv, fwd.as_ref(), &gh)?;
        Ok(())
    };
    fast()?;
    let bare = median_ms(be, 10, &mut fast)?;
    println!(
        "{}",
        json!({
            "case": "layout", "dtype": be.dtype().name(), "seq": seq, "heads": 32, "head_dim": 128,
            "adapter_fwdbwd_ms": ours, "fast_path_fwdbwd_ms": bare,
            "layout_overhead": ours / bare - 1.0,
            "peak_pool_bytes": be.peak_memory()?, "memory": be.memory()?,
        })
    );
    Ok(())
}

/// Prints the mean time of a few ops over 10 runs after one warm-up (host clock around
/// `synchronize`), and TFLOP/s where the op's FLOPs are known.
/// A timed case of `ops`: its name, its FLOPs (0: not counted) and its work.
struct Case<'a> {
    name: String,
    flops: f64,
    run: Box<dyn FnMut() -> Result<()> + 'a>,
}

impl<'a> Case<'a> {
    fn new(name: String, flops: f64, run: impl FnMut() -> Result<()> + 'a) -> Self {
        Case {
            name,
            flops,
            run: Box::new(run),
        }
    }
}

/// Every case once to warm up, then `rounds` rounds of each in turn, each timed by CUDA events:
/// a card whose clock falls under sustained load slows every case alike instead of the last
/// ones (a case after case timing once ranked its variants by their order). Prints each case's
/// median.
fn interleaved(gpu: &CudaOps, rounds: usize, cases: &mut [Case<'_>]) -> Result<()> {
    let be = gpu.backend();
    let mut times = vec![Vec::new(); cases.len()];
    for round in 0..=rounds {
        for (case, t) in cases.iter_mut().zip(&mut times) {
            let ms = run_times_ms(be, 1, &mut case.run)?[0];
            if round > 0 {
                t.push(ms);
            }
        }
    }
    let dtype = be.dtype().name();
    for (case, mut t) in cases.iter().zip(times) {
        t.sort_by(f64::total_cmp);
        let ms = t[t.len() / 2];
        let rate = if case.flops > 0.0 {
            format!("{:6.1} TFLOP/s", case.flops / ms / 1e9)
        } else {
            String::new()
        };
        println!("{dtype} time {:<60} {ms:8.3} ms {rate}", case.name);
    }
    Ok(())
}

fn ops(gpu: &CudaOps, rows: usize, mlp_block: usize) -> Result<()> {
    let (d, i, vocab) = (4096, 11008, 32000);
    let mut rng = StdRng::seed_from_u64(7);
    let mut half = |len: usize, lo: f32, hi: f32| {
        let host: Vec<f32> = (0..len).map(|_| rng.random_range(lo..hi)).collect();
        gpu.upload(&host)
    };
    let x = half(rows * d, -1.0, 1.0)?;
    let head = half(vocab * d, -0.02, 0.02)?;
    let gain = half(d, 0.5, 1.5)?;
    let targets: Vec<u32> = (0..rows as u32).map(|r| r * 7 % vocab as u32).collect();
    let mut cases = Vec::new();
    // q/k/v/o, gate/up and down: x [rows, inp] times Wᵀ, W [out, inp].
    let mut weights = Vec::new();
    for (inp, out) in [(d, d), (d, i), (i, d)] {
        let x = half(rows * inp, -1.0, 1.0)?;
        let dy = half(rows * out, -1.0, 1.0)?;
        let w = half(out * inp, -0.02, 0.02)?;
        let gemm = 2.0 * (rows * inp * out) as f64;
        let shape = format!("{rows}x{inp} -> {out}");
        let (x, dy, w) = (
            std::rc::Rc::new(x),
            std::rc::Rc::new(dy),
            std::rc::Rc::new(w),
        );
        weights.push(w.clone());
        let forward = (x.clone(), w.clone());
        cases.push(Case::new(format!("linear {shape}"), gemm, move || {
            gpu.linear(Rows::whole(&*forward.0), &forward.1, rows, inp, out)
                .map(drop)
        }));
        for (dw_kind, mut dw, dw_empty) in [
            ("f32, added to", gpu.zeros(out * inp)?, false),
            ("f32, written", gpu.zeros(out * inp)?, true),
            (
                "16-bit, added to",
                gpu.upload(&vec![0.0; out * inp])?,
                false,
            ),
        ] {
            let (x, dy, w) = (x.clone(), dy.clone(), w.clone());
            let mut dx = gpu.zeros(rows * inp)?;
            let name = format!("linear_backward {shape}, dW {dw_kind}");
            cases.push(Case::new(name, 2.0 * gemm, move || {
                let operands = LinearBackward {
                    dy: Rows::whole(&*dy),
                    x: Rows::whole(&*x),
                    w: &w,
                    rows,
                    inp,
                    out,
                    dx_empty: false,
                    dw_empty,
                };
                gpu.linear_backward(operands, Rows::whole(&mut dx), &mut dw)
            }));
        }
    }
    // The MLP's six products forward and backward over the rows whole and in `mlp_block`s, as
    // a layer runs them (`model::mlp_block_rows`): whether the blocks cost the GEMMs rate.
    let weights = std::rc::Rc::new(weights);
    let dy = std::rc::Rc::new(half(rows * d, -1.0, 1.0)?);
    for block in [rows, mlp_block.min(rows)] {
        let (weights, dy, x) = (weights.clone(), dy.clone(), &x);
        let mut grads = [gpu.zeros(i * d)?, gpu.zeros(i * d)?, gpu.zeros(d * i)?];
        let mut dh = gpu.zeros(rows * d)?;
        let flops = 3.0 * 3.0 * 2.0 * (rows * d * i) as f64;
        let name = format!("MLP products, {rows} rows in blocks of {block}");
        cases.push(Case::new(name, flops, move || {
            // The gate and up products share one weight here: the timing is the same.
            let [_, wide, wdown] = &weights[..] else {
                unreachable!("three shapes")
            };
            for (n, start) in (0..rows).step_by(block).enumerate() {
                let len = block.min(rows - start);
                let h = Rows::window(x, start);
                let g = gpu.linear(h, wide, len, d, i)?;
                drop(gpu.linear(h, wide, len, d, i)?);
                drop(gpu.linear(Rows::whole(&g), wdown, len, i, d)?);
                let mut dm = gpu.scratch(len * i)?;
                let [dgate, dup, ddown] = &mut grads;
                let down = LinearBackward {
                    dy: Rows::window(&*dy, start),
                    x: Rows::whole(&g),
                    w: wdown,
                    rows: len,
                    inp: i,
                    out: d,
                    dx_empty: true,
                    dw_empty: n == 0,
                };
                gpu.linear_backward(down, Rows::whole(&mut dm), ddown)?;
                for (dw, dx_empty) in [(dgate, true), (dup, false)] {
                    let operands = LinearBackward {
                        dy: Rows::whole(&dm),
                        x: h,
                        w: wide,
                        rows: len,
                        inp: d,
                        out: i,
                        dx_empty,
                        dw_empty: n == 0,
                    };
                    gpu.linear_backward(operands, Rows::window(&mut dh, start), dw)?;
                }
            }
            Ok(())
        }));
    }
    let mut dhead = gpu.zeros(vocab * d)?;
    let loss = 6.0 * (rows * d * vocab) as f64;
    let (xr, targets) = (&x, &targets);
    cases.push(Case::new(
        format!("cross_entropy {rows} rows, {d} -> {vocab}"),
        loss,
        move || {
            let input = LossInput {
                h: xr,
                w: &head,
                targets,
                dim: d,
                vocab,
                scale: 1.0 / rows as f64,
            };
            gpu.cross_entropy(input, &mut dhead).map(drop)
        },
    ));
    let (_, rstd) = gpu.rmsnorm(&x, &gain, rows, d, 1e-5)?;
    let mut norm_dx = half(rows * d, -1.0, 1.0)?;
    let mut norm_dw = gpu.zeros(d)?;
    let norm_dy = half(rows * d, -1.0, 1.0)?;
    let gain = &gain;
    cases.push(Case::new(format!("rmsnorm {rows}x{d}"), 0.0, move || {
        gpu.rmsnorm(xr, gain, rows, d, 1e-5).map(drop)
    }));
    cases.push(Case::new(
        format!("rmsnorm_backward {rows}x{d}, dx and dw"),
        0.0,
        move || {
            let operands = NormBackward {
                x: xr,
                w: gain,
                rstd: &rstd,
                dy: &norm_dy,
                rows,
                dim: d,
            };
            gpu.rmsnorm_backward(operands, &mut norm_dx, &mut norm_dw)
        },
    ));
    interleaved(gpu, 9, &mut cases)
}
