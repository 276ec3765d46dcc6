//! The distributed calls behind `distflash.dist_flash_attn`: one rank's forward or backward of
//! distflash's schedule (`distflash::rank_call::RankAttention`) on torch's memory and
//! stream, over either transport:
//!
//! - a virtual group ([`virtual_pass`]): every rank a thread of this
//!   process, all sharing one GPU and torch's stream, joined by the in-process communicator
//!   (what `distflash attention --workers N` runs on one GPU). One call runs all ranks,
//!   because torch's autograd runs every CUDA backward of a device on one thread of its own:
//!   ranks as Python threads would meet in the backward one at a time, and wait for ever.
//! - an [`NcclGroup`]: this process's rank of a `torch.distributed` group, over NCCL, the id
//!   broadcast by the group (`distflash/dist.py`).
//!
//! Both run the same per-rank function ([`forward_rank`], [`backward_rank`]) with the same
//! plans; only the communicator differs. Chunks are head-major (`[batch, heads, rows,
//! head_dim]`), one per own chunk, given as their addresses in the order of [`addresses`]; each is copied into an executor tensor first and each result copied out after.

use crate::shared::{backend, dims, input_dtype, to_py_err};
use anyhow::Result;
use distflash::backend::cuda::{BackwardAddrs, CallStrides, CudaBackend, ForwardAddrs, Tensor};
use distflash::block_math::Partial;
use distflash::comm::nccl::{self, NcclComm};
use distflash::comm::{Communicator, LocalComm};
use distflash::exec::OwnChunk;
use distflash::plan::Schedule;
use distflash::rank_call::RankAttention;
use distflash::runtime::{collect_results, run_workers};
use distflash::shape::{Mask, Precision};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One rank's chunk: (batch, rows, heads, kv_heads, head_dim).
type Shape = (usize, usize, usize, usize, usize);

/// Which pass a call runs, by the name Python gives it.
#[derive(Clone, Copy)]
enum PassName {
    Forward,
    Backward,
}

impl PassName {
    fn parse(name: &str) -> PyResult<Self> {
        match name {
            "forward" => Ok(PassName::Forward),
            "backward" => Ok(PassName::Backward),
            other => Err(PyValueError::new_err(format!(
                "unknown pass '{other}': use 'forward' or 'backward'"
            ))),
        }
    }
}

/// Every rank's chunks as address structs: each chunk a list of `N` addresses in the struct's
/// field order (`ForwardAddrs`: q, k, v (input dtype), out (f32: the executor's, rounded by
/// torch), lse (f32); `BackwardAddrs`: q, k, v, out (input dtype), lse (f32), dout (input
/// dtype), dq, dk, dv (f32)).
fn addresses<const N: usize, A: From<[u64; N]>>(
    ranks: Vec<Vec<Vec<u64>>>,
) -> PyResult<Vec<Vec<A>>> {
    ranks
        .into_iter()
        .map(|chunks| {
            chunks
                .into_iter()
                .map(|c| {
                    let n = c.len();
                    <[u64; N]>::try_from(c).map(A::from).map_err(|_| {
                        PyValueError::new_err(format!(
                            "a chunk of this pass has {N} addresses, this one {n}"
                        ))
                    })
                })
                .collect()
        })
        .collect()
}

/// One rank's chunks as address structs ([`addresses`]).
fn one_rank<const N: usize, A: From<[u64; N]>>(chunks: Vec<Vec<u64>>) -> PyResult<Vec<A>> {
    Ok(addresses::<N, A>(vec![chunks])?.pop().unwrap_or_default())
}

/// A mask over the whole sequence as Python passes it: document lengths (empty: one), a
/// sliding window and global prefix tokens (`Mask::new`'s arguments).
type MaskArg = (Vec<usize>, Option<usize>, usize);

/// The call of `rank` of `world` on `chunks` chunks of `shape` under `mask`, checked (no GPU
/// touched): the schedule by name, the group, the mask, the shape for the kernels and the
/// chunk count.
fn rank_call(
    shape: Shape,
    world: usize,
    rank: usize,
    schedule: &str,
    mask: &MaskArg,
    chunks: usize,
) -> PyResult<RankAttention> {
    let (batch, rows, heads, kv_heads, head_dim) = shape;
    let schedule: Schedule = schedule.parse().map_err(PyValueError::new_err)?;
    let d = dims(batch, heads, kv_heads, head_dim);
    let (doc_lens, window, global) = mask;
    let mask = Mask::new(rows * world, doc_lens, *window, *global).map_err(to_py_err)?;
    let call = RankAttention::new(d, rows, world, rank, schedule, &mask).map_err(to_py_err)?;
    let own = call.chunk_rows().len();
    if chunks != own {
        return Err(PyValueError::new_err(format!(
            "rank {rank} owns {own} chunks under '{schedule}', but {chunks} were passed"
        )));
    }
    Ok(call)
}

/// A rank's chunk tensors are head-major (`[batch, heads, rows, head_dim]`, contiguous): the
/// executor's own layout, which they are copied into and out of.
fn head_major(call: &RankAttention, rows: usize) -> CallStrides {
    CallStrides::head_major(&call.dims, rows, rows)
}

/// A pass's chunk addresses, checked against the call's rows before any GPU is touched.
trait Chunk: Copy + Sync {
    fn check(&self, call: &RankAttention, rows: usize) -> Result<()>;
}

impl Chunk for ForwardAddrs {
    fn check(&self, call: &RankAttention, rows: usize) -> Result<()> {
        ForwardAddrs::check(self, &call.dims, rows, &head_major(call, rows))
    }
}

impl Chunk for BackwardAddrs {
    fn check(&self, call: &RankAttention, rows: usize) -> Result<()> {
        BackwardAddrs::check(self, &call.dims, rows, &head_major(call, rows))
    }
}

/// `rank_call` and every chunk's addresses checked.
fn checked_call<A: Chunk>(
    shape: Shape,
    world: usize,
    rank: usize,
    schedule: &str,
    mask: &MaskArg,
    chunks: &[A],
) -> PyResult<RankAttention> {
    let call = rank_call(shape, world, rank, schedule, mask, chunks.len())?;
    for (a, n) in chunks.iter().zip(call.chunk_rows()) {
        a.check(&call, n).map_err(to_py_err)?;
    }
    Ok(call)
}

/// A backend tensor copied from the caller's memory.
fn copied(be: &CudaBackend, addr: u64, len: usize, p: Precision, what: &str) -> Result<Tensor> {
    // SAFETY: `addr` is the `data_ptr()` of a contiguous CUDA tensor of this length and
    // precision on the backend's device (built so by `distflash/dist.py`, checked by
    // `checked_call`), alive until the autograd function returns; the copy is queued on torch's
    // current stream (the backend's), so torch reuses the memory only after it.
    unsafe { be.copy_from_lent(addr, len, p, what) }
}

/// The caller's q, k, v of each own chunk as executor tensors.
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
    chunks: &[ForwardAddrs],
) -> Result<()> {
    let own = own_chunks(be, call, chunks.iter().map(|a| [a.q, a.k, a.v]))?;
    let results = call.forward(be, comm, &own)?;
    for (p, a) in results.iter().zip(chunks) {
        hand_back(be, &p.out, a.out, "the output")?;
        hand_back(be, &p.lse, a.lse, "the LSE")?;
    }
    Ok(())
}

/// One rank's backward: dQ, dK, dV (f32) of each own chunk written to the caller's memory.
fn backward_rank<C: Communicator<Tensor>>(
    be: &CudaBackend,
    comm: &mut C,
    call: &RankAttention,
    chunks: &[BackwardAddrs],
) -> Result<()> {
    let own = own_chunks(be, call, chunks.iter().map(|a| [a.q, a.k, a.v]))?;
    let d = call.dims;
    let (mut forward, mut dout) = (Vec::new(), Vec::new());
    for (a, n) in chunks.iter().zip(call.chunk_rows()) {
        forward.push(Partial {
            out: copied(be, a.out, d.q_len(n), Precision::Input, "the output")?,
            lse: copied(be, a.lse, d.stat_len(n), Precision::F32, "the LSE")?,
        });
        dout.push(copied(
            be,
            a.dout,
            d.q_len(n),
            Precision::Input,
            "the output's gradient",
        )?);
    }
    let grads = call.backward(be, comm, &own, forward, dout)?;
    for (g, a) in grads.iter().zip(chunks) {
        hand_back(be, &g.dq, a.dq, "dq")?;
        hand_back(be, &g.dk, a.dk, "dk")?;
        hand_back(be, &g.dv, a.dv, "dv")?;
    }
    Ok(())
}

/// One rank's pass on this GPU over communicator `C`.
type RankFn<A, C> = fn(&CudaBackend, &mut C, &RankAttention, &[A]) -> Result<()>;

/// The arguments of a virtual group's call, shared by its two passes.
struct VirtualCall<'a> {
    device: usize,
    dtype: &'a str,
    stream: usize,
    world: usize,
    schedule: &'a str,
    mask: MaskArg,
    shape: Shape,
    timeout_secs: f64,
}

impl VirtualCall<'_> {
    /// Checks every rank's call and chunks (no GPU touched), then runs `rank_fn` on every rank
    /// as threads sharing the GPU over the in-process communicator.
    fn run<A: Chunk>(
        &self,
        py: Python<'_>,
        ranks: Vec<Vec<A>>,
        rank_fn: RankFn<A, LocalComm<Tensor>>,
    ) -> PyResult<()> {
        let dtype = input_dtype(self.dtype)?;
        let world = self.world;
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
        let calls = (0..world)
            .map(|r| checked_call(self.shape, world, r, self.schedule, &self.mask, &ranks[r]))
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = Duration::try_from_secs_f64(self.timeout_secs).map_err(|_| {
            PyValueError::new_err(format!(
                "timeout={} is not a duration; pass a positive number of seconds",
                self.timeout_secs
            ))
        })?;
        let be = backend(self.device, dtype, self.stream)?;
        let be = &*be;
        py.detach(|| {
            let results = run_workers(world, timeout, |rank, comm| {
                rank_fn(be, comm, &calls[rank], &ranks[rank])
            });
            collect_results(results).map(|_| ())
        })
        .map_err(to_py_err)
    }
}

/// One pass (`"forward"` or `"backward"`) of every rank of a virtual group of `world` ranks on
/// GPU `device`: `ranks[r]` lists rank r's chunks, each as its addresses ([`addresses`]).
#[pyfunction]
#[pyo3(signature = (pass, device, dtype, stream, world, schedule, shape, ranks, timeout_secs, mask=(Vec::new(), None, 0)))]
fn virtual_pass(
    py: Python<'_>,
    pass: &str,
    device: usize,
    dtype: &str,
    stream: usize,
    world: usize,
    schedule: &str,
    shape: Shape,
    ranks: Vec<Vec<Vec<u64>>>,
    timeout_secs: f64,
    mask: MaskArg,
) -> PyResult<()> {
    let call = VirtualCall {
        device,
        dtype,
        stream,
        world,
        schedule,
        mask,
        shape,
        timeout_secs,
    };
    match PassName::parse(pass)? {
        PassName::Forward => call.run(py, addresses::<5, ForwardAddrs>(ranks)?, forward_rank),
        PassName::Backward => call.run(py, addresses::<9, BackwardAddrs>(ranks)?, backward_rank),
    }
}

/// A fresh NCCL unique id (128 bytes), which rank 0 of a group broadcasts to the others.
#[pyfunction]
fn nccl_unique_id() -> PyResult<Vec<u8>> {
    nccl::new_id().map_err(to_py_err)
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
    /// Checks this rank's call and chunks, then runs `rank_fn` on the NCCL communicator.
    fn run<A: Chunk>(
        &self,
        py: Python<'_>,
        (schedule, mask): (&str, &MaskArg),
        shape: Shape,
        chunks: Vec<A>,
        rank_fn: RankFn<A, NcclComm>,
    ) -> PyResult<()> {
        let call = checked_call(shape, self.world, self.rank, schedule, mask, &chunks)?;
        let (comm, be) = (&self.comm, &*self.backend);
        py.detach(|| {
            let mut comm = comm
                .lock()
                .map_err(|_| anyhow::anyhow!("an earlier call on this NCCL group panicked"))?;
            rank_fn(be, &mut comm.0, &call, &chunks)
        })
        .map_err(to_py_err)
    }
}

#[pymethods]
impl NcclGroup {
    /// This rank's pass (`"forward"` or `"backward"`): `chunks` as one rank's of
    /// `virtual_pass`. Every rank of the group calls it together.
    #[pyo3(name = "run", signature = (pass, schedule, shape, chunks, mask=(Vec::new(), None, 0)))]
    fn run_pass(
        &self,
        py: Python<'_>,
        pass: &str,
        schedule: &str,
        shape: Shape,
        chunks: Vec<Vec<u64>>,
        mask: MaskArg,
    ) -> PyResult<()> {
        let how = (schedule, &mask);
        match PassName::parse(pass)? {
            PassName::Forward => {
                let chunks = one_rank::<5, ForwardAddrs>(chunks)?;
                self.run(py, how, shape, chunks, forward_rank)
            }
            PassName::Backward => {
                let chunks = one_rank::<9, BackwardAddrs>(chunks)?;
                self.run(py, how, shape, chunks, backward_rank)
            }
        }
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
        .map_err(to_py_err)?;
    Ok(NcclGroup {
        comm: Mutex::new(comm),
        backend: be,
        rank,
        world,
    })
}

/// Adds the distributed calls to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(virtual_pass, m)?)?;
    m.add_function(wrap_pyfunction!(nccl_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(nccl_group, m)?)?;
    m.add_class::<NcclGroup>()?;
    Ok(())
}
