//! The model's single-GPU attention (`model::cuda::whole_sequence::CudaAttention`) on a GPU:
//! sequence-major 16-bit tensors in and out, against
//! - the head-major fast path (the same kernels on transposed data, which the adapter reads in
//!   place under sequence-major strides: O and LSE must match bit for bit; dQ, dK, dV must equal
//!   the fast path's gradients rounded to the input dtype to within one rounding, the
//!   backward's f32 atomics summing in a varying order),
//! - itself with dO given in f32 instead of 16-bit (the same gradients to within one rounding),
//! - the f64 oracle (its error may exceed the fast path's by one rounding of the output),
//!   causal and under masks (documents, a window, global tokens),
//! - distflash over several virtual workers sharing the GPU (`train::model_attention::Distributed` on
//!   the CUDA backend, the path of a rank of a multi-GPU job): each worker's rows, joined, must
//!   be within one rounding of the fast path's error against the oracle too,
//!
//! and that wrong dtypes and lengths are refused with a sentence. Runs with
//! `DISTFLASH_GPU_TESTS=1` on a GPU machine (`bench/peers/gpu_tests.sh`); elsewhere each test
//! prints why it is skipped. What the adapter adds to the fast path (its roundings) is
//! `examples/gpu_timing.rs layout`.

mod gpu_common;

use anyhow::{Result, ensure};
use distflash::backend::Backend;
use distflash::backend::cuda::{CallStrides, CudaBackend, InputDtype, SequenceCall, Tensor};
use distflash::block_math::layout;
use distflash::block_math::oracle::{self, rel_err};
use distflash::comm::LocalComm;
use distflash::inputs::Inputs;
use distflash::model::attention_api::{Attention, WholeSequence};
use distflash::model::cuda::whole_sequence::CudaAttention;
use distflash::plan::Partition;
use distflash::plan::Schedule;
use distflash::runtime::{collect_results, run_workers};
use distflash::shape::{Dims, Mask};
use distflash::train::model_attention::Distributed;
use std::time::Duration;

/// dtype, heads, kv heads, head dim, rows, virtual workers; the mask's document lengths (empty:
/// one document), window and global tokens.
type Spec = (
    InputDtype,
    usize,
    usize,
    usize,
    usize,
    usize,
    &'static [usize],
    Option<usize>,
    usize,
);

/// MHA, GQA and MQA; lengths off the tile sizes and uneven chunks; causal, then under masks
/// (documents across chunks with one-token ones; a window with global tokens).
const CASES: [Spec; 7] = [
    (InputDtype::Bf16, 8, 2, 128, 777, 3, &[], None, 0),
    (InputDtype::F16, 4, 4, 64, 300, 2, &[], None, 0),
    (InputDtype::Bf16, 4, 1, 64, 129, 4, &[], None, 0),
    (InputDtype::F16, 8, 2, 128, 1000, 5, &[], None, 0),
    (InputDtype::Bf16, 32, 8, 128, 1024, 8, &[], None, 0),
    (
        InputDtype::Bf16,
        8,
        2,
        128,
        777,
        3,
        &[300, 1, 1, 130, 200, 145],
        None,
        0,
    ),
    (InputDtype::F16, 4, 4, 64, 1000, 4, &[], Some(200), 4),
];

/// One case's inputs: head-major on the host (rounded to the dtype, as the device holds them)
/// and sequence-major on the device, with the adapter's forward and backward of them.
struct Case<'a> {
    be: &'a CudaBackend,
    workers: usize,
    x: Inputs,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    attn: CudaAttention<'a>,
    /// The adapter's O and LSE.
    o: Tensor,
    lse: Tensor,
    /// The adapter's dQ, dK, dV, head-major on the host.
    grads: [Vec<f32>; 3],
}

impl<'a> Case<'a> {
    fn new(be: &'a CudaBackend, spec: Spec, seed: u64) -> Result<Case<'a>> {
        let (dtype, heads, kv_heads, head_dim, seq, workers, docs, window, global) = spec;
        let dims = Dims {
            batch: 1,
            heads,
            kv_heads,
            head_dim,
        };
        let mask = Mask::new(seq, docs, window, global)?;
        let mut x = Inputs::random(dims, seq, seed).with_mask(mask)?;
        for t in [&mut x.q, &mut x.k, &mut x.v, &mut x.dout] {
            t.iter_mut().for_each(|v| *v = dtype.round(*v));
        }
        let up = |t: &[f32], heads| be.upload(&layout::to_seq_major(t, 1, seq, heads, head_dim));
        let (q, k, v, dout) = (
            up(&x.q, heads)?,
            up(&x.k, kv_heads)?,
            up(&x.v, kv_heads)?,
            up(&x.dout, heads)?,
        );
        let mut attn = CudaAttention::new(be, dims, seq)?;
        attn.set_mask(&x.mask)?;
        let (o, lse) = attn.forward(&q, &k, &v)?;
        let (dq, dk, dv) = attn.backward(&q, &k, &v, &o, &lse, &dout)?;
        let mut case = Case {
            be,
            workers,
            x,
            q,
            k,
            v,
            dout,
            attn,
            o,
            lse,
            grads: Default::default(),
        };
        case.grads = [
            case.head_major(&dq, heads)?,
            case.head_major(&dk, kv_heads)?,
            case.head_major(&dv, kv_heads)?,
        ];
        Ok(case)
    }

    fn head_major(&self, t: &Tensor, heads: usize) -> Result<Vec<f32>> {
        let (seq, d) = (self.x.seq, self.x.dims.head_dim);
        Ok(layout::to_head_major(
            &self.be.download(t)?,
            1,
            seq,
            heads,
            d,
        ))
    }

    /// The adapter's O (head-major), then its dQ, dK, dV.
    fn ours(&self) -> Result<[Vec<f32>; 4]> {
        let [dq, dk, dv] = self.grads.clone();
        Ok([self.head_major(&self.o, self.x.dims.heads)?, dq, dk, dv])
    }

    /// The fast path on head-major copies of the same values: O, dQ, dK, dV and LSE.
    fn fast_path(&self) -> Result<[Vec<f32>; 5]> {
        let (be, x) = (&self.be, &self.x);
        let (q, k, v, g) = (
            be.upload(&x.q)?,
            be.upload(&x.k)?,
            be.upload(&x.v)?,
            be.upload(&x.dout)?,
        );
        let strides = CallStrides::head_major(&x.dims, x.seq, x.seq);
        let qkv = [&q, &k, &v];
        let call = SequenceCall {
            dims: &x.dims,
            seq: x.seq,
            mask: &x.mask,
            strides: &strides,
        };
        let fwd = be.causal_forward(&call, qkv)?;
        let grads = be.causal_backward(&call, qkv, fwd.as_ref(), &g)?;
        be.synchronize()?;
        Ok([
            be.download(&fwd.out)?,
            be.download(&grads.dq)?,
            be.download(&grads.dk)?,
            be.download(&grads.dv)?,
            be.download(&fwd.lse)?,
        ])
    }

    /// One rounding of a 16-bit value, relative.
    fn unit(&self) -> f64 {
        match self.be.dtype() {
            InputDtype::Bf16 => 2f64.powi(-8),
            InputDtype::F16 => 2f64.powi(-11),
        }
    }

    fn name(&self) -> String {
        let d = self.x.dims;
        format!(
            "{} heads {}/{} d {} rows {} {}",
            self.be.dtype().name(),
            d.heads,
            d.kv_heads,
            d.head_dim,
            self.x.seq,
            self.x.mask
        )
    }
}

/// Runs `check` on every case, then fails naming every case that failed.
fn each_case(check: impl Fn(&mut Case) -> Result<bool>) -> Result<()> {
    let Some(gpu) = gpu_common::gpu()? else {
        return Ok(());
    };
    let mut failed = vec![];
    for (i, &spec) in CASES.iter().enumerate() {
        let be = gpu.open(spec.0)?;
        let mut case = Case::new(&be, spec, 40 + i as u64)?;
        if !check(&mut case)? {
            failed.push(case.name());
        }
    }
    ensure!(failed.is_empty(), "failed for {}", failed.join("; "));
    Ok(())
}

fn wide(t: &[f32]) -> Vec<f64> {
    t.iter().map(|&v| f64::from(v)).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: set DISTFLASH_GPU_TESTS=1 and pass --include-ignored"]
fn adapter_forward_is_the_fast_paths_and_its_gradients_within_one_rounding() -> Result<()> {
    each_case(|c| {
        let dt = c.be.dtype();
        let fast = c.fast_path()?;
        let ours = c.ours()?;
        // The forward has no atomics: the same inputs give the same bits. The backward
        // accumulates dQ, dK, dV with f32 atomics in an order that varies from run to run, so
        // two backwards of the same inputs agree to within a rounding of the 16-bit result,
        // not bit for bit (on the H200, bit equality failed in the three cases of head dim 128).
        let forward_same = ours[0] == fast[0] && c.be.download(&c.lse)? == fast[4];
        let rounded =
            |t: &[f32]| -> Vec<f64> { t.iter().map(|&v| f64::from(dt.round(v))).collect() };
        let grads_diff = (1..4)
            .map(|i| rel_err(&ours[i], &rounded(&fast[i])))
            .fold(0.0, f64::max);

        // dO in f32 instead of 16-bit: the same gradients to within one rounding.
        let dout32 = c.be.upload_f32(&c.be.download(&c.dout)?)?;
        let (dq, dk, dv) = c.attn.backward(&c.q, &c.k, &c.v, &c.o, &c.lse, &dout32)?;
        let (h, kv) = (c.x.dims.heads, c.x.dims.kv_heads);
        let with_f32 = [
            c.head_major(&dq, h)?,
            c.head_major(&dk, kv)?,
            c.head_major(&dv, kv)?,
        ];
        let f32_dout_diff = (0..3)
            .map(|i| rel_err(&with_f32[i], &wide(&c.grads[i])))
            .fold(0.0, f64::max);
        let ok = forward_same && grads_diff <= c.unit() && f32_dout_diff <= c.unit();
        println!(
            "{}: forward same bits as the fast path {forward_same}, gradients vs the fast path's \
             rounded {grads_diff:.2e}, with f32 dO {f32_dout_diff:.2e} (one rounding {:.2e}){}",
            c.name(),
            c.unit(),
            if ok { "" } else { "  FAIL" }
        );
        Ok(ok)
    })
}

#[test]
#[ignore = "needs an NVIDIA GPU: set DISTFLASH_GPU_TESTS=1 and pass --include-ignored"]
fn adapter_and_virtual_workers_are_within_one_rounding_of_the_fast_path_against_f64() -> Result<()>
{
    each_case(|c| {
        let (r, rg) = (
            oracle::forward(&c.x.problem()),
            oracle::backward(&c.x.problem()),
        );
        let refs = [&r.out, &rg.dq, &rg.dk, &rg.dv];
        let fast = c.fast_path()?;
        let ours = c.ours()?;
        let dist = distributed(c)?;
        let (h, kv, d, seq) = (
            c.x.dims.heads,
            c.x.dims.kv_heads,
            c.x.dims.head_dim,
            c.x.seq,
        );
        let mut ok = true;
        let (mut ours_errs, mut fast_errs, mut dist_errs) = (vec![], vec![], vec![]);
        // One more rounding to the input dtype than the fast path's f32 gradients; the block
        // API keeps O and the gradients in f32 up to the model's layout: one rounding too.
        for (i, heads) in [h, h, kv, kv].into_iter().enumerate() {
            let ef = rel_err(&fast[i], refs[i]);
            let e = rel_err(&ours[i], refs[i]);
            let ed = rel_err(&layout::to_head_major(&dist[i], 1, seq, heads, d), refs[i]);
            ok &= e <= ef + c.unit() && ed <= ef + c.unit();
            ours_errs.push(format!("{e:.2e}"));
            fast_errs.push(format!("{ef:.2e}"));
            dist_errs.push(format!("{ed:.2e}"));
        }
        let lse_err = rel_err(&c.be.download(&c.lse)?, &r.lse);
        let dist_lse_err = rel_err(&dist[4], &r.lse);
        ok &= lse_err < 1e-3 && dist_lse_err < 1e-3;
        println!(
            "{}: rel err vs f64 o/dq/dk/dv ours {} | fast path {} | distflash ({} workers) {}; \
             lse {lse_err:.2e}, distflash {dist_lse_err:.2e}{}",
            c.name(),
            ours_errs.join(" "),
            fast_errs.join(" "),
            c.workers,
            dist_errs.join(" "),
            if ok { "" } else { "  FAIL" }
        );
        Ok(ok)
    })
}

#[test]
#[ignore = "needs an NVIDIA GPU: set DISTFLASH_GPU_TESTS=1 and pass --include-ignored"]
fn adapter_refuses_a_tensor_of_the_other_dtype_or_a_wrong_length() -> Result<()> {
    each_case(|c| {
        let other = match c.be.dtype() {
            InputDtype::Bf16 => InputDtype::F16,
            InputDtype::F16 => InputDtype::Bf16,
        };
        let wrong_dtype = CudaBackend::new(0, other)?.upload(&c.be.download(&c.q)?)?;
        let e1 = c.attn.forward(&wrong_dtype, &c.k, &c.v).err();
        let short = c.be.upload(&vec![0.0; c.x.dims.kv_len(c.x.seq) - 1])?;
        let e2 = c.attn.forward(&c.q, &short, &c.v).err();
        println!("{}: refused {e1:?} and {e2:?}", c.name());
        // The sentence names the tensor and what it should have been.
        let says = |e: &Option<anyhow::Error>, what: &str| {
            e.as_ref().is_some_and(|e| e.to_string().contains(what))
        };
        Ok(says(&e1, "Q must be") && says(&e2, "K must be"))
    })
}

/// O, dQ, dK, dV (sequence-major, whole sequence) and LSE (head-major) from the case's virtual
/// workers running distflash on the GPU, each on its own rows, joined on the host.
fn distributed(c: &Case) -> Result<[Vec<f32>; 5]> {
    let (be, dims, seq, d) = (c.be, c.x.dims, c.x.seq, c.x.dims.head_dim);
    let schedule = Schedule::Balanced;
    let partition = Partition::masked(seq, c.workers, schedule, &c.x.mask)?;
    let spans = partition.spans();
    let seq_major = |t: &[f32], heads| layout::to_seq_major(t, 1, seq, heads, d);
    let (h, kv) = (dims.heads, dims.kv_heads);
    let host = [
        seq_major(&c.x.q, h),
        seq_major(&c.x.k, kv),
        seq_major(&c.x.v, kv),
        seq_major(&c.x.dout, h),
    ];
    let results = run_workers(
        c.workers,
        Duration::from_secs(120),
        |rank, comm: &mut LocalComm<Tensor>| {
            // Balanced: worker `rank` owns chunk `rank`.
            let s = spans[rank];
            let rows =
                |t: &[f32], heads: usize| be.upload(&t[s.start * heads * d..s.end() * heads * d]);
            let (q, k, v, g) = (
                rows(&host[0], h)?,
                rows(&host[1], kv)?,
                rows(&host[2], kv)?,
                rows(&host[3], h)?,
            );
            let mut attn = Distributed::new(be, comm, dims, &partition)?;
            let (o, lse) = attn.forward(&q, &k, &v)?;
            let (dq, dk, dv) = attn.backward(&q, &k, &v, &o, &lse, &g)?;
            [o, dq, dk, dv, lse]
                .map(|t| be.download(&t))
                .into_iter()
                .collect::<Result<Vec<_>>>()
        },
    );
    let parts = collect_results(results)?;
    let mut joined: [Vec<f32>; 5] = Default::default();
    for (i, t) in joined.iter_mut().enumerate().take(4) {
        *t = parts.iter().flat_map(|p| p[i].iter().copied()).collect();
    }
    let lse: Vec<Vec<f32>> = parts.iter().map(|p| p[4].clone()).collect();
    joined[4] = layout::join_rows(&lse, h, 1);
    Ok(joined)
}
