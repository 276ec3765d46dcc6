//! Timings on a GPU that the `distflash` binary does not offer, for re-tuning the kernels:
//!
//!   gpu_timing attention --seqs 16384,65536 --head-dims 128   # a kernel variant's TFLOP/s
//!   gpu_timing layout --seq 16384      # the model adapter's layout changes vs the fast path
//!
//! `attention` is `distflash bench attention` (same JSON lines, for `distflash bench report`)
//! with the kernel variant named in `DISTFLASH_TUNING` (e.g. `bwd-warps=4,fwd-wgmma=false`,
//! see `tests/gpu_common/tuning.rs`; the GPU tests check a variant's correctness under the same
//! variable) and the variant recorded in each line. `layout` times forward+backward through
//! `train::cuda_attention::CudaAttention` against the fast path alone at LLaMA-7B's attention
//! shape, the cost a training step pays per layer, with the memory figures `bench train`
//! reports. Needs a GPU; without one it says so and exits non-zero.

#[path = "../tests/gpu_common/tuning.rs"]
mod tuning;

use anyhow::Result;
use clap::Parser;
use distflash::attn::{self, layout};
use distflash::backend::Backend;
use distflash::backend::cuda::{CudaBackend, InputDtype, median_ms, time_attention};
use distflash::inputs::Inputs;
use distflash::model::attention::Attention;
use distflash::shape::Dims;
use distflash::train::cuda_attention::CudaAttention;
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
            dtype,
            json,
        } => attention(&open(dtype)?, &seqs, &head_dims, heads, json.as_deref()),
        Cli::Layout { seq } => layout_cost(&open(InputDtype::Bf16)?, seq),
    }
}

fn attention(
    be: &CudaBackend,
    seqs: &[usize],
    head_dims: &[usize],
    heads: usize,
    json: Option<&std::path::Path>,
) -> Result<()> {
    let mut lines = vec![];
    for &head_dim in head_dims {
        for &seq in seqs {
            let dims = Dims {
                batch: 1,
                heads,
                kv_heads: heads,
                head_dim,
            };
            dims.validate()?;
            let t = time_attention(be, dims, seq)?;
            let (f, b) = (
                attn::causal_forward_flops(&dims, seq),
                attn::causal_backward_flops(&dims, seq),
            );
            let tflops = |flops: f64, ms: f64| flops / (ms * 1e-3) / 1e12;
            let line = json!({
                "impl": "distflash", "dtype": be.dtype().name(), "seq": seq, "heads": heads,
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
        let fwd = be.causal_forward(&dims, seq, &qh, &kh, &vh)?;
        be.causal_backward(&dims, seq, &qh, &kh, &vh, &fwd, &gh)?;
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
