//! The distributed calls behind `distflash.dist_flash_attn`: one rank's forward or backward of
//! distflash's schedule (`distflash::rank_attention::RankAttention`) on torch's memory and
//! stream, over either transport:
//!
//! - a virtual group ([`virtual_forward`], [`virtual_backward`]): every rank a thread of this
//!   process, all sharing one GPU and torch's stream, joined by the in-process communicator
//!   (what `distflash attention --workers N` runs on one GPU). One call runs all ranks,
//!   because torch's autograd runs every CUDA backward of a device on one thread of its own:
//!   ranks as Python threads would meet in the backward one at a time, and wait for ever.
//! - an [`NcclGroup`]: this process's rank of a `torch.distributed` group, over NCCL, the id
//!   broadcast by the group (`distflash/dist.py`).
//!
//! Both run the same per-rank function ([`forward_rank`], [`backward_rank`]) with the same
//! plans; only the communicator differs. Chunks are head-major (`[batch, heads, rows,
//! head_dim]`), one per own chunk, given as their addresses in the order of the field lists
//! below; each is copied into an executor tensor first and each result copied out after.

use super::{backend, dims, input_dtype, runtime_error, value_error};
use anyhow::Result;
use distflash::attn::Partial;
use distflash::backend::cuda::{BackwardAddrs, CudaBackend, ForwardAddrs, Tensor};
use distflash::comm::nccl::{self, NcclComm};
use distflash::comm::{Communicator, LocalComm};
use distflash::exec::OwnChunk;
use distflash::plan::Schedule;
use distflash::rank_attention::RankAttention;
use distflash::runtime::{collect_results, run_workers};
use distflash::shape::Precision;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One rank's chunk: (batch, rows, heads, kv_heads, head_dim).
type Shape = (usize, usize, usize, usize, usize);

/// A forward chunk's addresses: q, k, v (input dtype), out (f32), lse (f32).
type ForwardChunk = [u64; 5];

/// A backward chunk's addresses: q, k, v, out, dout (input dtype), lse, dq, dk, dv (f32).
type BackwardChunk = [u64; 9];

/// The call of `rank` of `world` on chunks of `shape`, checked (no GPU touched): the schedule
/// by name, the group, the shape for the kernels, and every address of every chunk.
fn rank_call(
    shape: Shape,
    world: usize,
    rank: usize,
    schedule: &str,
    forward: &[ForwardChunk],
    backward: &[BackwardChunk],
) -> PyResult<RankAttention> {
    let (batch, rows, heads, kv_heads, head_dim) = shape;
    let schedule: Schedule = schedule.parse().map_err(PyValueError::new_err)?;
    let d = dims(batch, heads, kv_heads, head_dim);
    let call = RankAttention::new(d, rows, world, rank, schedule).map_err(value_error)?;
    let chunk_rows = call.chunk_rows();
    let given = forward.len().max(backward.len());
    if given != chunk_rows.len() {
        return Err(PyValueError::new_err(format!(
            "rank {rank} owns {} chunks under '{schedule}', but {given} were passed",
            chunk_rows.len()
        )));
    }
    for (&[q, k, v, out, lse], &n) in forward.iter().zip(&chunk_rows) {
        ForwardAddrs { q, k, v, out, lse }
            .check(&d, n)
            .map_err(value_error)?;
    }
    for (&[q, k, v, out, dout, lse, dq, dk, dv], &n) in backward.iter().zip(&chunk_rows) {
        let addrs = BackwardAddrs {
            q,
            k,
            v,
            out,
            lse,
            dout,
            dq,
            dk,
            dv,
        };
        addrs.check(&d, n).map_err(value_error)?;
    }
    Ok(call)
}

/// A backend tensor copied from the caller's memory.
fn copied(be: &CudaBackend, addr: u64, len: usize, p: Precision, what: &str) -> Result<Tensor> {
    // SAFETY: `addr` is the `data_ptr()` of a contiguous CUDA tensor of this length and
    // precision on the backend's device (built so by `distflash/dist.py`, checked by
    // `rank_call`), alive until the autograd function returns; the copy is queued on torch's
    // current stream (the backend's), so torch reuses the memory only after it.
    unsafe { be.copy_from_lent(addr, len, p, what) }
}

/// The caller's q, k, v of each own chunk (`q k v` = fields 0, 1, 2) as executor tensors.
fn own_chunks(
    be: &CudaBackend,
    call: &RankAttention,
    qkv: impl Iterator<Item = [u64; 3]>,
) -> Result<Vec<OwnChunk<Tensor>>> {
    let d = call.dims;
    qkv.zip(call.chunk_rows())
        .map(|([q, k, v], n)| {
            Ok(OwnChunk {
                q: copied(be, q, d.q_len(n), Precision::Input, "q")?,
                k: copied(be, k, d.kv_len(n), Precision::Input, "k")?,
                v: copied(be, v, d.kv_len(n), Precision::Input, "v")?,
            })
        })
        .collect()
}

/// `t` copied to the caller's memory at `addr`.
fn hand_back(be: &CudaBackend, t: &Tensor, addr: u64, what: &str) -> Result<()> {
    // SAFETY: as in `copied`: a tensor torch allocated for this result (f32, this length).
    unsafe { be.copy_to_lent(t, addr, what) }
}

/// One rank's forward: O (f32) and LSE of each own chunk written to the caller's memory.
fn forward_rank<C: Communicator<Tensor>>(
    be: &CudaBackend,
    comm: &mut C,
    call: &RankAttention,
    chunks: &[ForwardChunk],
) -> Result<()> {
    let own = own_chunks(be, call, chunks.iter().map(|a| [a[0], a[1], a[2]]))?;
    let results = call.forward(be, comm, &own)?;
    for (p, a) in results.iter().zip(chunks) {
        hand_back(be, &p.out, a[3], "the output")?;
        hand_back(be, &p.lse, a[4], "the LSE")?;
    }
    Ok(())
}

/// One rank's backward: dQ, dK, dV (f32) of each own chunk written to the caller's memory.
fn backward_rank<C: Communicator<Tensor>>(
    be: &CudaBackend,
    comm: &mut C,
    call: &RankAttention,
    chunks: &[BackwardChunk],
) -> Result<()> {
    let own = own_chunks(be, call, chunks.iter().map(|a| [a[0], a[1], a[2]]))?;
    let d = call.dims;
    let (mut forward, mut dout) = (Vec::new(), Vec::new());
    for (a, n) in chunks.iter().zip(call.chunk_rows()) {
        forward.push(Partial {
            out: copied(be, a[3], d.q_len(n), Precision::Input, "the output")?,
            lse: copied(be, a[5], d.stat_len(n), Precision::F32, "the LSE")?,
        });
        dout.push(copied(
            be,
            a[4],
            d.q_len(n),
            Precision::Input,
            "the output's gradient",
        )?);
    }
    let grads = call.backward(be, comm, &own, forward, dout)?;
    for (g, a) in grads.iter().zip(chunks) {
        hand_back(be, &g.dq, a[6], "dq")?;
        hand_back(be, &g.dk, a[7], "dk")?;
        hand_back(be, &g.dv, a[8], "dv")?;
    }
    Ok(())
}

/// Every rank's call of a virtual group, checked: one list of chunks per rank.
fn virtual_calls<A>(
    world: usize,
    shape: Shape,
    schedule: &str,
    ranks: &[Vec<A>],
    check: impl Fn(Shape, usize, usize, &str, &[A]) -> PyResult<RankAttention>,
) -> PyResult<Vec<RankAttention>> {
    if world == 0 {
        return Err(PyValueError::new_err(
            "the world size is 0; a group needs at least one rank",
        ));
    }
    if ranks.len() != world {
        return Err(PyValueError::new_err(format!(
            "a virtual group of {world} ranks got the chunks of {} ranks; pass one per rank",
            ranks.len()
        )));
    }
    (0..world)
        .map(|r| check(shape, world, r, schedule, &ranks[r]))
        .collect()
}

/// Runs `rank_fn` on every rank of a virtual group of `world` threads sharing the GPU.
fn run_virtual<A: Sync>(
    py: Python<'_>,
    be: &CudaBackend,
    calls: &[RankAttention],
    ranks: &[Vec<A>],
    timeout_secs: f64,
    rank_fn: fn(&CudaBackend, &mut LocalComm<Tensor>, &RankAttention, &[A]) -> Result<()>,
) -> PyResult<()> {
    let timeout = Duration::try_from_secs_f64(timeout_secs).map_err(|_| {
        PyValueError::new_err(format!(
            "timeout={timeout_secs} is not a duration; pass a positive number of seconds"
        ))
    })?;
    py.detach(|| {
        let results = run_workers(calls.len(), timeout, |rank, comm| {
            rank_fn(be, comm, &calls[rank], &ranks[rank])
        });
        collect_results(results).map(|_| ())
    })
    .map_err(runtime_error)
}

/// The forward of every rank of a virtual group of `world` ranks on GPU `device`: `ranks[r]`
/// lists rank r's chunks as (q, k, v, out, lse) addresses.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (device, dtype, stream, world, schedule, shape, ranks, timeout_secs))]
fn virtual_forward(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    stream: usize,
    world: usize,
    schedule: &str,
    shape: Shape,
    ranks: Vec<Vec<ForwardChunk>>,
    timeout_secs: f64,
) -> PyResult<()> {
    let dtype = input_dtype(dtype)?;
    let calls = virtual_calls(world, shape, schedule, &ranks, |s, w, r, name, c| {
        rank_call(s, w, r, name, c, &[])
    })?;
    let be = backend(device, dtype, stream)?;
    run_virtual(py, &be, &calls, &ranks, timeout_secs, forward_rank)
}

/// The backward of every rank of a virtual group: `ranks[r]` lists rank r's chunks as (q, k,
/// v, out, dout, lse, dq, dk, dv) addresses.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (device, dtype, stream, world, schedule, shape, ranks, timeout_secs))]
fn virtual_backward(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    stream: usize,
    world: usize,
    schedule: &str,
    shape: Shape,
    ranks: Vec<Vec<BackwardChunk>>,
    timeout_secs: f64,
) -> PyResult<()> {
    let dtype = input_dtype(dtype)?;
    let calls = virtual_calls(world, shape, schedule, &ranks, |s, w, r, name, c| {
        rank_call(s, w, r, name, &[], c)
    })?;
    let be = backend(device, dtype, stream)?;
    run_virtual(py, &be, &calls, &ranks, timeout_secs, backward_rank)
}

/// A fresh NCCL unique id (128 bytes), which rank 0 of a group broadcasts to the others.
#[pyfunction]
fn nccl_unique_id() -> PyResult<Vec<u8>> {
    nccl::new_id().map_err(runtime_error)
}

/// The NCCL communicator, movable between threads.
struct SendComm(NcclComm);

// SAFETY: an NCCL communicator may be used from any thread, one thread at a time (NCCL's
// thread-safety rule); the only access is through `NcclGroup`'s mutex, which gives exactly that.
unsafe impl Send for SendComm {}

/// This process's rank of a `torch.distributed` group, joined by distflash's own NCCL
/// communicator on torch's stream (the compute stream it orders its transfers against).
#[pyclass]
struct NcclGroup {
    comm: Mutex<SendComm>,
    backend: Arc<CudaBackend>,
    rank: usize,
    world: usize,
}

impl NcclGroup {
    fn run<A>(
        &self,
        py: Python<'_>,
        call: RankAttention,
        chunks: &[A],
        rank_fn: fn(&CudaBackend, &mut NcclComm, &RankAttention, &[A]) -> Result<()>,
    ) -> PyResult<()>
    where
        A: Sync,
    {
        let comm = &self.comm;
        let be = &*self.backend;
        py.detach(|| {
            let mut comm = comm
                .lock()
                .map_err(|_| anyhow::anyhow!("an earlier call on this NCCL group panicked"))?;
            rank_fn(be, &mut comm.0, &call, chunks)
        })
        .map_err(runtime_error)
    }
}

#[pymethods]
impl NcclGroup {
    /// This rank's forward: `chunks` as for `virtual_forward`'s ranks.
    fn forward(
        &self,
        py: Python<'_>,
        schedule: &str,
        shape: Shape,
        chunks: Vec<ForwardChunk>,
    ) -> PyResult<()> {
        let call = rank_call(shape, self.world, self.rank, schedule, &chunks, &[])?;
        self.run(py, call, &chunks, forward_rank)
    }

    /// This rank's backward: `chunks` as for `virtual_backward`'s ranks.
    fn backward(
        &self,
        py: Python<'_>,
        schedule: &str,
        shape: Shape,
        chunks: Vec<BackwardChunk>,
    ) -> PyResult<()> {
        let call = rank_call(shape, self.world, self.rank, schedule, &[], &chunks)?;
        self.run(py, call, &chunks, backward_rank)
    }
}

/// Joins the NCCL communicator of `world` ranks named by `id` (rank 0's `nccl_unique_id`) as
/// `rank`, on GPU `device` and torch's `stream`; every rank must call it together.
#[pyfunction]
#[pyo3(signature = (device, dtype, stream, rank, world, id))]
fn nccl_group(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    stream: usize,
    rank: usize,
    world: usize,
    id: Vec<u8>,
) -> PyResult<NcclGroup> {
    let dtype = input_dtype(dtype)?;
    if world == 0 || rank >= world {
        return Err(PyValueError::new_err(format!(
            "rank {rank} of a world of {world}: a group needs at least one rank, and ranks 0..world"
        )));
    }
    if id.len() != 128 {
        return Err(PyValueError::new_err(format!(
            "an NCCL id has 128 bytes, this one {}; pass rank 0's nccl_unique_id()",
            id.len()
        )));
    }
    let be = backend(device, dtype, stream)?;
    let comm = py
        .detach(|| NcclComm::connect(&be, rank, world, &id).map(SendComm))
        .map_err(runtime_error)?;
    Ok(NcclGroup {
        comm: Mutex::new(comm),
        backend: be,
        rank,
        world,
    })
}

/// Adds the distributed calls to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(virtual_forward, m)?)?;
    m.add_function(wrap_pyfunction!(virtual_backward, m)?)?;
    m.add_function(wrap_pyfunction!(nccl_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(nccl_group, m)?)?;
    m.add_class::<NcclGroup>()?;
    Ok(())
}
