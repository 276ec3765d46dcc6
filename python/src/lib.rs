//! `distflash._distflash`: the Rust side of the Python package. `forward` and `backward` take
//! what `distflash/attention.py` reads off torch tensors (device index, dtype name, the current
//! stream's handle, the shape and each tensor's `data_ptr()`) and run distflash's
//! whole-sequence CUDA attention on that memory and stream
//! (`CudaBackend::causal_forward_lent` / `causal_backward_lent`): no copy, no allocation of
//! torch's tensors, no second CUDA context.
//!
//! The distributed calls of `distflash/dist.py` run one rank's part of distflash's schedule
//! (`distflash::rank_call`) on the same stream: `virtual_forward` / `virtual_backward` run
//! every rank of a virtual group as threads of this process sharing the GPU over the
//! in-process communicator; an [`NcclGroup`] runs this process's rank over NCCL. The executor
//! owns its tensors, so each chunk is copied in and each result out (device to device).
//!
//! Errors are Python exceptions with a sentence: `ValueError` for arguments (checked before any
//! GPU is touched, so they are testable without one), and for the library's own errors the
//! exception of the kind it marked them with (`shared::to_py_err`: `ValueError`, `MemoryError`,
//! `TimeoutError`, else `RuntimeError`).

use distflash::backend::cuda::{
    BackwardAddrs, CallStrides, ForwardAddrs, Strides, sequence_kv_grads_half,
};
use distflash::shape::{Dims, Mask};

mod dist;
mod shared;
use pyo3::prelude::*;
use shared::{backend, dims, input_dtype, to_py_err};

/// The kernels' strides of a call from torch's: `q_strides` (of q, out, dout and dq) and
/// `kv_strides` (of k, v, dk and dv), each (batch, head, sequence) in elements, normalized
/// where a dimension has size one.
fn call_strides(dims: &Dims, seq: usize, q: [i64; 3], kv: [i64; 3]) -> CallStrides {
    let strides = |[batch, head, row]: [i64; 3], heads| {
        Strides { batch, head, row }.normalized(dims.batch, heads, seq, dims.head_dim)
    };
    CallStrides {
        q: strides(q, dims.heads),
        kv: strides(kv, dims.kv_heads),
    }
}

/// Causal attention forward on torch's memory under the mask of `doc_lens` (packed documents;
/// empty: one), a sliding `window` and `global` prefix tokens: O and LSE written at `out` and
/// `lse`.
/// q and out `[batch, heads, seq, head_dim]` under `q_strides`, k and v `[batch, kv_heads,
/// seq, head_dim]` under `kv_strides` (each (batch, head, sequence) in elements: torch's, in
/// that order, so torch's `[b, s, h, d]` and `[b, h, s, d]` views go in without a copy), in
/// `dtype`; lse `[batch, heads, seq]` float32, contiguous.
#[pyfunction]
#[pyo3(signature = (device, dtype, stream, batch, seq, heads, kv_heads, head_dim, q, k, v, out, lse, q_strides, kv_strides, doc_lens=Vec::new(), window=None, global=0))]
fn forward(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    stream: usize,
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    lse: u64,
    q_strides: [i64; 3],
    kv_strides: [i64; 3],
    doc_lens: Vec<usize>,
    window: Option<usize>,
    global: usize,
) -> PyResult<()> {
    let dtype = input_dtype(dtype)?;
    let dims = dims(batch, heads, kv_heads, head_dim);
    let mask = Mask::new(seq, &doc_lens, window, global).map_err(to_py_err)?;
    let addrs = ForwardAddrs { q, k, v, out, lse };
    let strides = call_strides(&dims, seq, q_strides, kv_strides);
    addrs.check(&dims, seq, &strides).map_err(to_py_err)?;
    let be = backend(device, dtype, stream)?;
    py.detach(|| {
        // SAFETY: the addresses are `data_ptr()`s of CUDA tensors on `device` of these shapes,
        // strides and dtypes (checked by `distflash/_checks.py`, which built them), kept alive
        // by the autograd function's frame until it returns; the work is queued on torch's
        // current stream, so torch's caching allocator reuses their memory only after it.
        unsafe { be.causal_forward_lent(&dims, seq, &mask, &strides, &addrs) }
    })
    .map_err(to_py_err)
}

/// Causal attention backward on torch's memory under the forward's mask: dQ (float32, under
/// `q_strides` as q, out and dout), dK and dV (under `kv_strides` as k and v; in `dtype` where
/// `kv_grads_in_input_dtype` says so, else float32) overwritten from the forward's O and LSE
/// and the output's gradient dO.
#[pyfunction]
#[pyo3(signature = (device, dtype, stream, batch, seq, heads, kv_heads, head_dim, q, k, v, out, lse, dout, dq, dk, dv, q_strides, kv_strides, doc_lens=Vec::new(), window=None, global=0))]
fn backward(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    stream: usize,
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    lse: u64,
    dout: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    q_strides: [i64; 3],
    kv_strides: [i64; 3],
    doc_lens: Vec<usize>,
    window: Option<usize>,
    global: usize,
) -> PyResult<()> {
    let dtype = input_dtype(dtype)?;
    let dims = dims(batch, heads, kv_heads, head_dim);
    let mask = Mask::new(seq, &doc_lens, window, global).map_err(to_py_err)?;
    let addrs = BackwardAddrs::from([q, k, v, out, lse, dout, dq, dk, dv]);
    let strides = call_strides(&dims, seq, q_strides, kv_strides);
    addrs.check(&dims, seq, &strides).map_err(to_py_err)?;
    let be = backend(device, dtype, stream)?;
    py.detach(|| {
        // SAFETY: as in `forward`, for the nine tensors the autograd function's backward built
        // or saved.
        unsafe { be.causal_backward_lent(&dims, seq, &mask, &strides, &addrs) }
    })
    .map_err(to_py_err)
}

/// Whether `backward` takes dK and dV in the input dtype (the kernel writes them itself: one
/// query head per KV head) rather than float32: what the autograd function allocates.
#[pyfunction]
fn kv_grads_in_input_dtype(
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> bool {
    sequence_kv_grads_half(&dims(batch, heads, kv_heads, head_dim), seq)
}

/// The module: `forward`, `backward`, the distributed calls and the head dims the kernels take.
#[pymodule]
fn _distflash(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(kv_grads_in_input_dtype, m)?)?;
    dist::register(m)?;
    m.add("HEAD_DIMS", distflash::backend::cuda::HEAD_DIMS.to_vec())?;
    Ok(())
}
