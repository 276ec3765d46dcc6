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
use cudarc::driver::sys::CUevent_flags;
use distflash::attn::{self, Block, Dims, Grads, GradsMut, Partial, QuerySide, Span};
use distflash::backend::Backend;
use distflash::backend::cuda::{CudaBackend, InputDtype, Tensor, Tuning};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;

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
    /// Kernel variant: warps per backward CTA (4, 8).
    #[arg(long)]
    bwd_warps: Option<usize>,
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
        || cli.bwd_warps.is_some();
    let d = Tuning::for_head_dim(128);
    let tuning = Tuning {
        fwd_warps: cli.fwd_warps.unwrap_or(d.fwd_warps),
        fwd_mtiles: cli.fwd_mtiles.unwrap_or(d.fwd_mtiles),
        fwd_q_in_registers: cli.fwd_qreg.unwrap_or(d.fwd_q_in_registers),
        bwd_warps: cli.bwd_warps.unwrap_or(d.bwd_warps),
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

/// Uniform random values in [−amp, amp), generated in parallel from a seed.
fn random(len: usize, amp: f32, seed: u64) -> Vec<f32> {
    const CHUNK: usize = 1 << 20;
    let mut v = vec![0.0f32; len];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
        c.iter_mut().for_each(|x| *x = rng.random_range(-amp..amp));
    });
    v
}

/// Q, K, V, dO as the device holds them (rounded to the input dtype, read back as f32).
struct Problem {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
}

impl Problem {
    fn new(be: &CudaBackend, dims: Dims, seq: usize, seed: u64) -> Result<Problem> {
        Ok(Problem {
            q: be.upload(&random(dims.q_len(seq), 2.0, seed))?,
            k: be.upload(&random(dims.kv_len(seq), 2.0, seed + 1))?,
            v: be.upload(&random(dims.kv_len(seq), 1.0, seed + 2))?,
            dout: be.upload(&random(dims.q_len(seq), 1.0, seed + 3))?,
        })
    }
}

/// f64 reference results, head-major.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// Plain causal attention forward and backward in f64 (full score rows, exact softmax).
fn reference(dims: &Dims, n: usize, q: &[f32], k: &[f32], v: &[f32], dout: &[f32]) -> Reference {
    let d = dims.head_dim;
    let scale = 1.0 / (d as f64).sqrt();
    let heads: Vec<_> = (0..dims.batch * dims.heads)
        .into_par_iter()
        .map(|bh| {
            let kvh = (bh / dims.heads) * dims.kv_heads + (bh % dims.heads) / dims.group();
            let row = |t: &[f32], head: usize, i: usize| -> Vec<f64> {
                t[(head * n + i) * d..(head * n + i + 1) * d]
                    .iter()
                    .map(|&x| x as f64)
                    .collect()
            };
            let qs: Vec<_> = (0..n).map(|i| row(q, bh, i)).collect();
            let ks: Vec<_> = (0..n).map(|i| row(k, kvh, i)).collect();
            let vs: Vec<_> = (0..n).map(|i| row(v, kvh, i)).collect();
            let gs: Vec<_> = (0..n).map(|i| row(dout, bh, i)).collect();
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
            let (mut out, mut lse) = (vec![0.0; n * d], vec![0.0; n]);
            let (mut dq, mut dk, mut dv) = (vec![0.0; n * d], vec![0.0; n * d], vec![0.0; n * d]);
            for i in 0..n {
                let s: Vec<f64> = (0..=i).map(|j| scale * dot(&qs[i], &ks[j])).collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l = mx + s.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
                lse[i] = l;
                let p: Vec<f64> = s.iter().map(|x| (x - l).exp()).collect();
                for (j, pj) in p.iter().enumerate() {
                    for c in 0..d {
                        out[i * d + c] += pj * vs[j][c];
                    }
                }
                let o = &out[i * d..(i + 1) * d];
                let delta = dot(o, &gs[i]);
                for (j, pj) in p.iter().enumerate() {
                    let ds = pj * (dot(&gs[i], &vs[j]) - delta);
                    for c in 0..d {
                        dv[j * d + c] += pj * gs[i][c];
                        dq[i * d + c] += scale * ds * ks[j][c];
                        dk[j * d + c] += scale * ds * qs[i][c];
                    }
                }
            }
            (kvh, out, lse, dq, dk, dv)
        })
        .collect();
    let mut r = Reference {
        out: vec![],
        lse: vec![],
        dq: vec![],
        dk: vec![0.0; dims.kv_len(n)],
        dv: vec![0.0; dims.kv_len(n)],
    };
    for (kvh, out, lse, dq, dk, dv) in heads {
        r.out.extend(out);
        r.lse.extend(lse);
        r.dq.extend(dq);
        let base = kvh * n * d;
        for (i, (a, b)) in dk.iter().zip(&dv).enumerate() {
            r.dk[base + i] += a;
            r.dv[base + i] += b;
        }
    }
    r
}

/// ‖x − ref‖ / ‖ref‖, or infinity if anything is not finite (NaN from an unwritten poisoned
/// element counts as a failure).
fn rel_err(x: &[f32], r: &[f64]) -> f64 {
    if x.len() != r.len() || x.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = x.iter().zip(r).map(|(&a, &b)| (a as f64 - b).powi(2)).sum();
    let den: f64 = r.iter().map(|b| b * b).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Rows `span` of every (batch, head) of a head-major `[bh, n, d]` tensor.
fn rows(t: &[f32], bh: usize, n: usize, d: usize, span: Span) -> Vec<f32> {
    (0..bh)
        .flat_map(|h| {
            t[(h * n + span.start) * d..(h * n + span.end()) * d]
                .iter()
                .copied()
        })
        .collect()
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
        let (q, k, v, g) = (host(&p.q)?, host(&p.k)?, host(&p.v)?, host(&p.dout)?);
        let r = reference(&dims, seq, &q, &k, &v, &g);

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
            rel_err(&host(&grads.dq)?, &r.dq),
            rel_err(&host(&grads.dk)?, &r.dk),
            rel_err(&host(&grads.dv)?, &r.dv),
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
        let up = |t: &[f32], h: usize, s: Span| be.upload(&rows(t, h, seq, head_dim, s));
        let qs: Vec<Tensor> = spans
            .iter()
            .map(|&s| up(&q, bh, s))
            .collect::<Result<_>>()?;
        let ks: Vec<Tensor> = spans
            .iter()
            .map(|&s| up(&k, bkv, s))
            .collect::<Result<_>>()?;
        let vs: Vec<Tensor> = spans
            .iter()
            .map(|&s| up(&v, bkv, s))
            .collect::<Result<_>>()?;
        let gs: Vec<Tensor> = spans
            .iter()
            .map(|&s| up(&g, bh, s))
            .collect::<Result<_>>()?;
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
            rel_err(&dq, &r.dq),
            rel_err(&dk, &r.dk),
            rel_err(&dv, &r.dv),
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

/// Median of `reps` timings (ms) of `f`, measured with CUDA events on the backend's stream.
fn time_ms(be: &CudaBackend, reps: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let mut ts = vec![];
    for _ in 0..reps {
        let err = |e| anyhow::anyhow!("CUDA event failed: {e:?}");
        let start = be
            .stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(err)?;
        f()?;
        let end = be
            .stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(err)?;
        ts.push(start.elapsed_ms(&end).map_err(err)? as f64);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
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
            let first = time_ms(be, 1, &mut run_fwd)?;
            let reps = ((1000.0 / first) as usize).clamp(3, 30);
            let f_ms = time_ms(be, reps, &mut run_fwd)?;
            let mut run_bwd =
                || be.causal_backward_into(&dims, seq, &p.q, &p.k, &p.v, &fwd, &p.dout, &mut grads);
            let b_ms = if fwd_only {
                f64::NAN
            } else {
                time_ms(be, reps, &mut run_bwd)?
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

/// Head-major `[b, h, n, d]` → `[b, n, h, d]` (the file layout of the PyTorch check).
fn seq_major(t: &[f32], batch: usize, heads: usize, n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0; t.len()];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n {
                let src = ((b * heads + h) * n + i) * d;
                let dst = ((b * n + i) * heads + h) * d;
                out[dst..dst + d].copy_from_slice(&t[src..src + d]);
            }
        }
    }
    out
}

fn dump(be: &CudaBackend, dims: Dims, seq: usize, path: &std::path::Path) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let p = Problem::new(be, dims, seq, 42)?;
    let fwd = be.causal_forward(&dims, seq, &p.q, &p.k, &p.v)?;
    let g = be.causal_backward(&dims, seq, &p.q, &p.k, &p.v, &fwd, &p.dout)?;
    be.synchronize()?;
    let (b, h, kh, d) = (dims.batch, dims.heads, dims.kv_heads, dims.head_dim);
    let qside = |t: &Tensor| -> Result<Vec<f32>> { Ok(seq_major(&be.download(t)?, b, h, seq, d)) };
    let kside = |t: &Tensor| -> Result<Vec<f32>> { Ok(seq_major(&be.download(t)?, b, kh, seq, d)) };
    let tensors: Vec<(&str, Vec<usize>, Vec<f32>)> = vec![
        ("q", vec![b, seq, h, d], qside(&p.q)?),
        ("k", vec![b, seq, kh, d], kside(&p.k)?),
        ("v", vec![b, seq, kh, d], kside(&p.v)?),
        ("dout", vec![b, seq, h, d], qside(&p.dout)?),
        ("out", vec![b, seq, h, d], qside(&fwd.out)?),
        ("lse", vec![b, h, seq], be.download(&fwd.lse)?),
        ("dq", vec![b, seq, h, d], qside(&g.dq)?),
        ("dk", vec![b, seq, kh, d], kside(&g.dk)?),
        ("dv", vec![b, seq, kh, d], kside(&g.dv)?),
    ];
    let bytes: Vec<(&str, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views = bytes
        .iter()
        .map(|(n, s, b)| Ok((n.to_string(), TensorView::new(Dtype::F32, s.clone(), b)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut info = std::collections::HashMap::new();
    info.insert("dtype".to_string(), be.dtype().name().to_string());
    safetensors::tensor::serialize_to_file(views, Some(info), path)?;
    println!("wrote {} (seq {seq}, {dims:?})", path.display());
    Ok(())
}
