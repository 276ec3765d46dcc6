//! Timings on a GPU that the `distflash` binary does not offer, for re-tuning the kernels:
//!
//!   gpu_timing attention --seqs 16384,65536 --head-dims 128   # a kernel variant's TFLOP/s
//!   gpu_timing layout --seq 16384      # the model adapter (in place, its roundings) vs the fast path
//!   gpu_timing ops                     # a few model ops at LLaMA-7B sizes, bf16 and fp16
//!   gpu_timing spread --seq 131072     # each backward's time, over fresh allocations
//!
//! `attention` is `distflash bench attention` (same JSON lines, for `distflash bench report`)
//! with the kernel variant named in `DISTFLASH_TUNING` (e.g. `bwd-warps=4,fwd-wgmma=false`,
//! see `tests/gpu_common/tuning.rs`; the GPU tests check a variant's correctness under the same
//! variable) and the variant recorded in each line. `layout` times forward+backward through
//! `model::cuda::whole_sequence::CudaAttention` against the fast path alone at LLaMA-7B's attention
//! shape, the cost a training step pays per layer, with the memory figures `bench train`
//! reports. `ops` times the largest model ops alone (4096 rows; `bench train --profile` gives
//! every op's share of a whole step, with the device waited for after each). Needs a GPU; without one it says so and exits non-zero.

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
use distflash::model::ops::{LinearBackward, LossInput, Ops, Rows};
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
    /// GEMMs, the loss and RMSNorm of `model::cuda::CudaOps` at LLaMA-7B sizes: the linear
    /// layers' three shapes forward and backward (the weight gradient in f32, as a step keeps
    /// it, added to or written, and in 16 bits, to tell its f32 output's cost from its
    /// layout's).
    Ops {
        #[arg(long, default_value_t = 4096)]
        rows: usize,
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
        Cli::Ops { rows } => {
            for dtype in [InputDtype::Bf16, InputDtype::F16] {
                ops(&CudaOps::new(open(dtype)?)?, rows)?;
            }
            Ok(())
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
fn ops(gpu: &CudaOps, rows: usize) -> Result<()> {
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
    let mut dhead = gpu.zeros(vocab * d)?;
    let time = |name: &str, flops: f64, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        f()?;
        gpu.backend().synchronize()?;
        let reps = 10;
        let start = std::time::Instant::now();
        for _ in 0..reps {
            f()?;
        }
        gpu.backend().synchronize()?;
        let s = start.elapsed().as_secs_f64() / reps as f64;
        let rate = if flops > 0.0 {
            format!("{:6.1} TFLOP/s", flops / s / 1e12)
        } else {
            String::new()
        };
        let dtype = gpu.backend().dtype().name();
        println!("{dtype} time {name:<52} {:8.3} ms {rate}", s * 1e3);
        Ok(())
    };
    // q/k/v/o, gate/up and down: x [rows, inp] times Wᵀ, W [out, inp].
    for (inp, out) in [(d, d), (d, i), (i, d)] {
        let x = half(rows * inp, -1.0, 1.0)?;
        let dy = half(rows * out, -1.0, 1.0)?;
        let w = half(out * inp, -0.02, 0.02)?;
        let gemm = 2.0 * (rows * inp * out) as f64;
        let shape = format!("{rows}x{inp} -> {out}");
        time(&format!("linear {shape}"), gemm, &mut || {
            gpu.linear(Rows::whole(&x), &w, rows, inp, out).map(drop)
        })?;
        let mut dx = gpu.zeros(rows * inp)?;
        for (dw_kind, mut dw, dw_empty) in [
            ("f32, added to", gpu.zeros(out * inp)?, false),
            ("f32, written", gpu.zeros(out * inp)?, true),
            (
                "16-bit, added to",
                gpu.upload(&vec![0.0; out * inp])?,
                false,
            ),
        ] {
            time(
                &format!("linear_backward {shape}, dW {dw_kind}"),
                2.0 * gemm,
                &mut || {
                    let operands = LinearBackward {
                        dy: Rows::whole(&dy),
                        x: Rows::whole(&x),
                        w: &w,
                        rows,
                        inp,
                        out,
                        dx_empty: false,
                        dw_empty,
                    };
                    gpu.linear_backward(operands, Rows::whole(&mut dx), &mut dw)
                },
            )?;
        }
    }
    let loss = 6.0 * (rows * d * vocab) as f64;
    time("cross_entropy 4096 rows, 4096 -> 32000", loss, &mut || {
        let input = LossInput {
            h: &x,
            w: &head,
            targets: &targets,
            dim: d,
            vocab,
            scale: 1.0 / rows as f64,
        };
        gpu.cross_entropy(input, &mut dhead).map(drop)
    })?;
    time("rmsnorm 4096x4096", 0.0, &mut || {
        gpu.rmsnorm(&x, &gain, rows, d, 1e-5).map(drop)
    })
}
