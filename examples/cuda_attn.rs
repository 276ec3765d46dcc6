//! Device driver for the CUDA attention kernels: correctness against an f64 CPU reference,
//! timing with CUDA events, and a safetensors dump for `bench/peers/check_against_torch.py`.
//!
//!   cuda_attn check                       # fast path and block API, several shapes, vs f64
//!   cuda_attn bench --seqs 4096,16384     # TFLOP/s of forward, backward, forward+backward
//!   cuda_attn dump --out x.safetensors    # inputs and our outputs for the PyTorch comparison
//!
//! Needs a GPU; on a machine without one every command says so and exits non-zero.

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use distflash::attn::oracle::rel_err;
use distflash::attn::{self, Block, Grads, GradsMut, Partial, QuerySide, layout, oracle};
use distflash::backend::Backend;
use distflash::backend::cuda::{CudaBackend, InputDtype, Tensor, Tuning, median_ms};
use distflash::inputs::Inputs;
use distflash::shape::{Dims, Span};
use distflash::tensor_file::{self, Named};

#[derive(Parser)]
struct Cli {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Kernel variant: warps per forward CTA (4, 8, 12).
    #[arg(long)]
    fwd_warps: Option<usize>,
    /// Kernel variant: m16 row tiles per forward warp (1, 2).
    #[arg(long)]
    fwd_mtiles: Option<usize>,
    /// Kernel variant: Q fragments in registers.
    #[arg(long)]
    fwd_qreg: Option<bool>,
    /// Kernel variant: the wgmma forward (sm_90, head dims 64 and 128) or the mma.sync one.
    #[arg(long)]
    fwd_wgmma: Option<bool>,
    /// Kernel variant: warps per backward CTA (4, 8) of the mma.sync backward.
    #[arg(long)]
    bwd_warps: Option<usize>,
    /// Kernel variant: the wgmma backward (sm_90, head dims 64 and 128) or the mma.sync one.
    #[arg(long)]
    bwd_wgmma: Option<bool>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compares fast path and block API with the f64 reference on small shapes.
    Check,
    /// Times the whole-sequence fast path.
    Bench {
        #[arg(long, value_delimiter = ',', default_value = "4096,16384,65536")]
        seqs: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "128,64")]
        head_dims: Vec<usize>,
        #[arg(long, default_value_t = 32)]
        heads: usize,
        #[arg(long, default_value = "bf16")]
        dtype: InputDtype,
        /// Where to write one JSON object per measurement.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Time the forward only (when comparing forward variants).
        #[arg(long)]
        fwd_only: bool,
    },
    /// Writes q, k, v, dout and our out, lse, dq, dk, dv to a safetensors file.
    Dump {
        #[arg(long)]
        out: std::path::PathBuf,
        #[arg(long, default_value_t = 1)]
        batch: usize,
        #[arg(long, default_value_t = 1000)]
        seq: usize,
        #[arg(long, default_value_t = 8)]
        heads: usize,
        #[arg(long, default_value_t = 2)]
        kv_heads: usize,
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
        #[arg(long, default_value = "bf16")]
        dtype: InputDtype,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Any variant flag overrides the per-head-dim defaults (for all head dims run).
    let overridden = cli.fwd_warps.is_some()
        || cli.fwd_mtiles.is_some()
        || cli.fwd_qreg.is_some()
        || cli.bwd_warps.is_some()
        || cli.fwd_wgmma.is_some()
        || cli.bwd_wgmma.is_some();
    let d = Tuning::for_head_dim(128);
    let tuning = Tuning {
        fwd_warps: cli.fwd_warps.unwrap_or(d.fwd_warps),
        fwd_mtiles: cli.fwd_mtiles.unwrap_or(d.fwd_mtiles),
        fwd_q_in_registers: cli.fwd_qreg.unwrap_or(d.fwd_q_in_registers),
        fwd_wgmma: cli.fwd_wgmma.unwrap_or(d.fwd_wgmma),
        bwd_warps: cli.bwd_warps.unwrap_or(d.bwd_warps),
        bwd_wgmma: cli.bwd_wgmma.unwrap_or(d.bwd_wgmma),
    };
    let open = |dtype| {
        let be = CudaBackend::new(cli.device, dtype)?;
        if overridden {
            be.with_tuning(tuning)
        } else {
            Ok(be)
        }
    };
    match cli.cmd {
        Cmd::Check => check(&open),
        Cmd::Bench {
            seqs,
            head_dims,
            heads,
            dtype,
            json,
            fwd_only,
        } => bench(
            &open(dtype)?,
            &seqs,
            &head_dims,
            heads,
            json.as_deref(),
            fwd_only,
        ),
        Cmd::Dump {
            out,
            batch,
            seq,
            heads,
            kv_heads,
            head_dim,
            dtype,
        } => {
            let dims = Dims {
                batch,
                heads,
                kv_heads,
                head_dim,
            };
            dump(&open(dtype)?, dims, seq, &out)
        }
    }
}

/// Q, K, V, dO as the device holds them (rounded to the input dtype).
struct Problem {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
}

impl Problem {
    fn new(be: &CudaBackend, dims: Dims, seq: usize, seed: u64) -> Result<Problem> {
        let x = Inputs::random(dims, seq, seed);
        Ok(Problem {
            q: be.upload(&x.q)?,
            k: be.upload(&x.k)?,
            v: be.upload(&x.v)?,
            dout: be.upload(&x.dout)?,
        })
    }

    /// The inputs as the device sees them, for the f64 oracle.
    fn host(&self, be: &CudaBackend, dims: Dims, seq: usize) -> Result<Inputs> {
        Ok(Inputs {
            dims,
            seq,
            q: be.download(&self.q)?,
            k: be.download(&self.k)?,
            v: be.download(&self.v)?,
            dout: be.download(&self.dout)?,
        })
    }
}

fn put_rows(t: &mut [f32], part: &[f32], bh: usize, n: usize, d: usize, span: Span) {
    for h in 0..bh {
        t[(h * n + span.start) * d..(h * n + span.end()) * d]
            .copy_from_slice(&part[h * span.len * d..(h + 1) * span.len * d]);
    }
}

fn check(open: &dyn Fn(InputDtype) -> Result<CudaBackend>) -> Result<()> {
    let cases = [
        (InputDtype::Bf16, 1, 4, 4, 128, 300),
        (InputDtype::F16, 2, 8, 2, 64, 257),
        (InputDtype::Bf16, 1, 4, 1, 128, 200),
        (InputDtype::Bf16, 1, 2, 1, 64, 129),
        (InputDtype::F16, 1, 2, 2, 128, 77),
    ];
    let mut worst = 0.0f64;
    for (i, &(dtype, batch, heads, kv_heads, head_dim, seq)) in cases.iter().enumerate() {
        let be = open(dtype)?;
        let dims = Dims {
            batch,
            heads,
            kv_heads,
            head_dim,
        };
        let p = Problem::new(&be, dims, seq, 100 + i as u64)?;
        let host = |t: &Tensor| be.download(t);
        let x = p.host(&be, dims, seq)?;
        let (r, rg) = (
            oracle::forward(&x.problem()),
            oracle::backward(&x.problem()),
        );
        let (q, k, v, g) = (&x.q, &x.k, &x.v, &x.dout);

        // Fast path, outputs poisoned with NaN first so unwritten elements show.
        let mut fwd = Partial {
            out: be.upload(&vec![f32::NAN; dims.q_len(seq)])?,
            lse: be.upload_f32(&vec![f32::NAN; dims.stat_len(seq)])?,
        };
        be.causal_forward_into(&dims, seq, &p.q, &p.k, &p.v, &mut fwd)?;
        let grads = be.causal_backward(&dims, seq, &p.q, &p.k, &p.v, &fwd, &p.dout)?;
        be.synchronize()?;
        let fast = [
            rel_err(&host(&fwd.out)?, &r.out),
            rel_err(&host(&fwd.lse)?, &r.lse),
            rel_err(&host(&grads.dq)?, &rg.dq),
            rel_err(&host(&grads.dk)?, &rg.dk),
            rel_err(&host(&grads.dv)?, &rg.dv),
        ];

        // Block API over three uneven chunks; the last chunk's row result is assembled from two
        // partials merged, to exercise `merge`.
        let bh = batch * heads;
        let bkv = batch * kv_heads;
        let cuts = [0, seq / 4, seq / 4 + seq / 3 + 1, seq];
        let spans: Vec<Span> = cuts
            .windows(2)
            .map(|w| Span {
                start: w[0],
                len: w[1] - w[0],
            })
            .collect();
        let up =
            |t: &[f32], h: usize, s: Span| be.upload(&layout::take_rows(t, h, seq, head_dim, s));
        let qs: Vec<Tensor> = spans.iter().map(|&s| up(q, bh, s)).collect::<Result<_>>()?;
        let ks: Vec<Tensor> = spans
            .iter()
            .map(|&s| up(k, bkv, s))
            .collect::<Result<_>>()?;
        let vs: Vec<Tensor> = spans
            .iter()
            .map(|&s| up(v, bkv, s))
            .collect::<Result<_>>()?;
        let gs: Vec<Tensor> = spans.iter().map(|&s| up(g, bh, s)).collect::<Result<_>>()?;
        let mut out = vec![f32::NAN; dims.q_len(seq)];
        let mut lse = vec![f32::NAN; dims.stat_len(seq)];
        let mut partials = vec![];
        for (i, &qs_span) in spans.iter().enumerate() {
            let last = i + 1 == spans.len();
            let mut state = be.new_state(&dims, qs_span.len)?;
            for j in 0..=i {
                if last && j == i {
                    continue; // folded in separately below, then merged
                }
                let block = Block {
                    q: qs_span,
                    kv: spans[j],
                };
                be.forward_block(&dims, block, &qs[i], &ks[j], &vs[j], &mut state)?;
            }
            let mut part = be.finalize(&dims, qs_span.len, state)?;
            if last {
                let mut diag = be.new_state(&dims, qs_span.len)?;
                let block = Block {
                    q: qs_span,
                    kv: qs_span,
                };
                be.forward_block(&dims, block, &qs[i], &ks[i], &vs[i], &mut diag)?;
                let diag = be.finalize(&dims, qs_span.len, diag)?;
                be.merge(&dims, qs_span.len, &mut part, &diag)?;
            }
            put_rows(&mut out, &host(&part.out)?, bh, seq, head_dim, qs_span);
            put_rows(&mut lse, &host(&part.lse)?, bh, seq, 1, qs_span);
            partials.push(part);
        }
        let mut dqs: Vec<Tensor> = vec![];
        let mut dks: Vec<Tensor> = vec![];
        let mut dvs: Vec<Tensor> = vec![];
        for s in &spans {
            dqs.push(be.zeros(dims.q_len(s.len))?);
            dks.push(be.zeros(dims.kv_len(s.len))?);
            dvs.push(be.zeros(dims.kv_len(s.len))?);
        }
        for (i, &qs_span) in spans.iter().enumerate() {
            let delta = be.delta(&dims, qs_span.len, &partials[i].out, &gs[i])?;
            for j in 0..=i {
                // Each block backward gets fresh accumulators that are then added in, to
                // exercise `add_assign` as `exec` would for gradients coming back from a helper.
                let mut blk = Grads {
                    dq: be.zeros(dims.q_len(qs_span.len))?,
                    dk: be.zeros(dims.kv_len(spans[j].len))?,
                    dv: be.zeros(dims.kv_len(spans[j].len))?,
                };
                let query = QuerySide {
                    q: &qs[i],
                    dout: &gs[i],
                    lse: &partials[i].lse,
                    delta: &delta,
                };
                let block = Block {
                    q: qs_span,
                    kv: spans[j],
                };
                let g = GradsMut {
                    dq: &mut blk.dq,
                    dk: &mut blk.dk,
                    dv: &mut blk.dv,
                };
                be.backward_block(&dims, block, query, &ks[j], &vs[j], g)?;
                be.add_assign(&mut dqs[i], &blk.dq)?;
                be.add_assign(&mut dks[j], &blk.dk)?;
                be.add_assign(&mut dvs[j], &blk.dv)?;
            }
        }
        let mut dq = vec![f32::NAN; dims.q_len(seq)];
        let mut dk = vec![f32::NAN; dims.kv_len(seq)];
        let mut dv = vec![f32::NAN; dims.kv_len(seq)];
        for (i, &s) in spans.iter().enumerate() {
            put_rows(&mut dq, &host(&dqs[i])?, bh, seq, head_dim, s);
            put_rows(&mut dk, &host(&dks[i])?, bkv, seq, head_dim, s);
            put_rows(&mut dv, &host(&dvs[i])?, bkv, seq, head_dim, s);
        }
        let blocks = [
            rel_err(&out, &r.out),
            rel_err(&lse, &r.lse),
            rel_err(&dq, &rg.dq),
            rel_err(&dk, &rg.dk),
            rel_err(&dv, &rg.dv),
        ];
        println!(
            "check {} b={batch} h={heads} kvh={kv_heads} d={head_dim} seq={seq}: rel err out/lse/dq/dk/dv \
             fast {:.2e} {:.2e} {:.2e} {:.2e} {:.2e} | blocks {:.2e} {:.2e} {:.2e} {:.2e} {:.2e}",
            dtype.name(),
            fast[0],
            fast[1],
            fast[2],
            fast[3],
            fast[4],
            blocks[0],
            blocks[1],
            blocks[2],
            blocks[3],
            blocks[4]
        );
        worst = fast.iter().chain(&blocks).fold(worst, |a, &b| a.max(b));
    }
    // bf16 operands land between 1e-3 and 1e-2 (P and dS are rounded to 16 bits for the tensor
    // cores); anything above 2e-2, or not finite, is a bug.
    if worst > 2e-2 {
        bail!("worst relative error {worst:.2e} exceeds 2e-2");
    }
    println!("check passed: worst relative error {worst:.2e}");
    Ok(())
}

fn bench(
    be: &CudaBackend,
    seqs: &[usize],
    head_dims: &[usize],
    heads: usize,
    json: Option<&std::path::Path>,
    fwd_only: bool,
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
            let p = Problem::new(be, dims, seq, 7)?;
            let mut fwd = be.causal_forward(&dims, seq, &p.q, &p.k, &p.v)?;
            let mut grads = be.causal_backward(&dims, seq, &p.q, &p.k, &p.v, &fwd, &p.dout)?;
            be.synchronize()?;
            // One timed warm-up sizes the repeat count to about a second per measurement.
            let mut run_fwd = || be.causal_forward_into(&dims, seq, &p.q, &p.k, &p.v, &mut fwd);
            let first = median_ms(be, 1, &mut run_fwd)?;
            let reps = ((1000.0 / first) as usize).clamp(3, 30);
            let f_ms = median_ms(be, reps, &mut run_fwd)?;
            let mut run_bwd =
                || be.causal_backward_into(&dims, seq, &p.q, &p.k, &p.v, &fwd, &p.dout, &mut grads);
            let b_ms = if fwd_only {
                f64::NAN
            } else {
                median_ms(be, reps, &mut run_bwd)?
            };
            be.synchronize()?;
            let ff = attn::causal_forward_flops(&dims, seq);
            let bf = attn::causal_backward_flops(&dims, seq);
            // JSON has no NaN: an untimed quantity is null.
            let num = |x: f64, digits: usize| {
                if x.is_finite() {
                    format!("{x:.digits$}")
                } else {
                    "null".into()
                }
            };
            let tf = |flops: f64, ms: f64| num(flops / (ms * 1e-3) / 1e12, 1);
            let line = format!(
                "{{\"impl\":\"distflash\",\"dtype\":\"{}\",\"seq\":{seq},\"heads\":{heads},\"head_dim\":{head_dim},\
                 \"tuning\":\"{:?}\",\"fwd_ms\":{},\"bwd_ms\":{},\"fwd_tflops\":{},\"bwd_tflops\":{},\"fwdbwd_tflops\":{},\"reps\":{reps}}}",
                be.dtype().name(),
                be.tuning(head_dim),
                num(f_ms, 4),
                num(b_ms, 4),
                tf(ff, f_ms),
                tf(bf, b_ms),
                tf(ff + bf, f_ms + b_ms)
            );
            println!("{line}");
            lines.push(line);
        }
    }
    if let Some(path) = json {
        std::fs::write(path, lines.join("\n") + "\n")?;
    }
    Ok(())
}

fn dump(be: &CudaBackend, dims: Dims, seq: usize, path: &std::path::Path) -> Result<()> {
    let p = Problem::new(be, dims, seq, 42)?;
    let fwd = be.causal_forward(&dims, seq, &p.q, &p.k, &p.v)?;
    let g = be.causal_backward(&dims, seq, &p.q, &p.k, &p.v, &fwd, &p.dout)?;
    be.synchronize()?;
    let (b, h, kh, d) = (dims.batch, dims.heads, dims.kv_heads, dims.head_dim);
    let seq_major = |t: &Tensor, heads| -> Result<Vec<f32>> {
        Ok(layout::to_seq_major(&be.download(t)?, b, seq, heads, d))
    };
    let data = [
        seq_major(&p.q, h)?,
        seq_major(&p.k, kh)?,
        seq_major(&p.v, kh)?,
        seq_major(&p.dout, h)?,
        seq_major(&fwd.out, h)?,
        be.download(&fwd.lse)?,
        seq_major(&g.dq, h)?,
        seq_major(&g.dk, kh)?,
        seq_major(&g.dv, kh)?,
    ];
    let names = ["q", "k", "v", "dout", "out", "lse", "dq", "dk", "dv"];
    let tensors: Vec<Named<'_>> = names
        .iter()
        .zip(&data)
        .map(|(&name, data)| Named {
            name,
            shape: match name {
                "lse" => vec![b, h, seq],
                "k" | "v" | "dk" | "dv" => vec![b, seq, kh, d],
                _ => vec![b, seq, h, d],
            },
            data,
        })
        .collect();
    tensor_file::write(path, &tensors, &[("dtype", be.dtype().name())])?;
    println!("wrote {} (seq {seq}, {dims:?})", path.display());
    Ok(())
}
