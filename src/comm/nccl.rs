//! NCCL between GPU ranks, one process per GPU. NCCL pairs sends with receives by the order in
//! which ranks post them, not by tag, and needs receive buffers up front: `exec` posts each
//! step's transfers as one group on every rank in the same order, and describes every receive
//! (`plan::volume::parts`), which is exactly what this communicator needs.
//!
//! Streams: transfers run on a communication stream of their own. A posted group first waits
//! for the compute stream's work so far (the data it sends), and `wait` makes the compute
//! stream wait for the group, so the next step's fetches travel while the current step
//! computes. 16-bit tensors travel as bytes.

use super::{
    Communicator, Incoming, Outgoing, Posted, Tag, Wire, all_gather_bytes, reduce_scatter_bytes,
    shard_spans,
};
use crate::backend::cuda::{CudaBackend, InputDtype, Tensor};
use crate::shape::Precision;
use crate::shape::Span;
use anyhow::{Result, anyhow, bail};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::{Comm, Id, ReduceOp, result as nccl};
use std::sync::Arc;

/// A posted group: its receive buffers and the event that marks its end on the comm stream.
struct InFlight {
    ticket: u64,
    buffers: Vec<Vec<Tensor>>,
    done: CudaEvent,
}

/// One GPU rank's NCCL endpoint.
pub struct NcclComm {
    comm: Comm,
    compute: Arc<CudaStream>,
    dtype: InputDtype,
    bytes_sent: u64,
    in_flight: Vec<InFlight>,
    next_ticket: u64,
    /// Events on the compute stream just before and after each wait for a group: the time
    /// between them is how long compute stalled on communication.
    stalls: Vec<(CudaEvent, CudaEvent)>,
    waited: f64,
}

fn nccl_err(what: &str) -> impl Fn(nccl::NcclError) -> anyhow::Error + '_ {
    move |e| anyhow!("NCCL {what} failed: {:?}", e.0)
}

fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> anyhow::Error + '_ {
    move |e| anyhow!("CUDA {what} failed: {e:?}")
}

/// A fresh NCCL unique id (on rank 0), as the bytes the rendezvous hands to every rank.
pub fn new_id() -> Result<Vec<u8>> {
    let id = Id::new().map_err(nccl_err("unique id creation"))?;
    Ok(id.internal().iter().map(|&c| c as u8).collect())
}

impl NcclComm {
    /// Joins the NCCL communicator of `world` ranks named by `id` (from `new_id` on rank 0),
    /// for the GPU of `backend`.
    pub fn connect(backend: &CudaBackend, rank: usize, world: usize, id: &[u8]) -> Result<Self> {
        let bytes: [u8; 128] = id.try_into().map_err(|_| {
            anyhow!(
                "the NCCL id from rank 0 has {} bytes instead of 128",
                id.len()
            )
        })?;
        let id = Id::uninit(bytes.map(|b| b as std::ffi::c_char));
        let compute = backend.stream().clone();
        let stream = compute
            .context()
            .new_stream()
            .map_err(cuda_err("stream creation"))?;
        let comm = Comm::from_rank(stream, rank, world, id).map_err(nccl_err("initialisation"))?;
        Ok(NcclComm {
            comm,
            compute,
            dtype: backend.dtype(),
            bytes_sent: 0,
            in_flight: Vec::new(),
            next_ticket: 1,
            stalls: Vec::new(),
            waited: 0.0,
        })
    }

    /// The communication stream, made to wait for everything the compute stream has queued so
    /// far (the data about to be sent or reduced).
    fn after_compute(&self) -> Result<Arc<CudaStream>> {
        let stream = self.comm.stream();
        let ready = self
            .compute
            .record_event(None)
            .map_err(cuda_err("event record"))?;
        stream.wait(&ready).map_err(cuda_err("stream wait"))?;
        Ok(stream)
    }

    /// A receive buffer, allocated (stream-ordered) on the compute stream, which reads it and,
    /// when it is dropped, frees it: the comm stream writes it only after waiting for the
    /// compute stream's work so far ([`Self::after_compute`]), so the order holds even where
    /// cudarc tracks no events (a backend on a borrowed stream, the Python binding's).
    fn alloc(&self, len: usize, precision: Precision) -> Result<Tensor> {
        let stream = &self.compute;
        let err = cuda_err("allocation of a receive buffer");
        Ok(match precision {
            Precision::Input => Tensor::Half {
                dtype: self.dtype,
                // SAFETY: NCCL overwrites every element before anyone reads the buffer.
                data: unsafe { stream.alloc::<u16>(len) }.map_err(err)?,
            },
            // SAFETY: as above.
            Precision::F32 => Tensor::F32(unsafe { stream.alloc::<f32>(len) }.map_err(err)?),
        })
    }

    /// Makes the compute stream wait for what the communication stream has queued so far.
    fn before_compute(&self, stream: &CudaStream) -> Result<()> {
        let done = stream
            .record_event(None)
            .map_err(cuda_err("event record"))?;
        self.compute.wait(&done).map_err(cuda_err("stream wait"))
    }

    /// Enqueues the sends and receives of one group between group start and end.
    fn enqueue(
        &self,
        sends: &[Outgoing<'_, Tensor>],
        recvs: &[Incoming],
        buffers: &mut [Vec<Tensor>],
    ) -> Result<()> {
        for s in sends {
            for part in &s.parts {
                send(&self.comm, part, s.to)?;
            }
        }
        for (r, bufs) in recvs.iter().zip(buffers.iter_mut()) {
            for buf in bufs.iter_mut() {
                recv(&self.comm, buf, r.from)?;
            }
        }
        Ok(())
    }
}

fn peer(rank: usize) -> Result<i32> {
    i32::try_from(rank).map_err(|_| anyhow!("rank {rank} does not fit NCCL's 32-bit ranks"))
}

/// NCCL's all-gather and reduce-scatter move equal pieces: the shard rule's pieces (which
/// differ by at most one element) travel padded to the longest, `spans[0].len`.
fn padded_len(spans: &[Span]) -> Result<usize> {
    match spans.iter().find(|s| s.len == 0) {
        Some(_) => bail!(
            "a tensor of {} elements cannot be sharded over {} GPUs: every piece needs at least one element",
            spans.iter().map(|s| s.len).sum::<usize>(),
            spans.len()
        ),
        None => Ok(spans[0].len),
    }
}

/// `src` written at element `at` of `dst`, on `stream`.
fn copy_into<E: DeviceRepr>(
    stream: &Arc<CudaStream>,
    src: &CudaSlice<E>,
    dst: &mut CudaSlice<E>,
    at: usize,
) -> Result<()> {
    stream
        .memcpy_dtod(src, &mut dst.slice_mut(at..at + src.len()))
        .map_err(cuda_err("device copy"))
}

/// The pieces `spans` of padded rank slots (slot j at `j * stride`) as tensors of their own.
fn unpad<E: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    all: &CudaSlice<E>,
    spans: &[Span],
    stride: usize,
) -> Result<Vec<CudaSlice<E>>> {
    spans
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let mut out = stream
                .alloc_zeros::<E>(s.len)
                .map_err(cuda_err("allocation of a gathered piece"))?;
            stream
                .memcpy_dtod(&all.slice(j * stride..j * stride + s.len), &mut out)
                .map_err(cuda_err("device copy"))?;
            Ok(out)
        })
        .collect()
}

/// Sends a tensor's bytes to `to`.
fn send(comm: &Comm, t: &Tensor, to: usize) -> Result<()> {
    let err = nccl_err("send");
    let bytes = t.wire_bytes();
    match t {
        Tensor::F32(data) => comm.send(data, peer(to)?).map_err(err),
        Tensor::Half { data, .. } => {
            // SAFETY: a u16 slice viewed as its bytes: same allocation, twice the count, u8 has
            // no invalid bit patterns, and NCCL only reads it.
            let view = unsafe { data.transmute::<u8>(bytes) }
                .ok_or_else(|| anyhow!("a tensor of {bytes} bytes could not be viewed as bytes"))?;
            comm.send(&view, peer(to)?).map_err(err)
        }
    }
}

/// Receives into a tensor's bytes from `from`.
fn recv(comm: &Comm, t: &mut Tensor, from: usize) -> Result<()> {
    let err = nccl_err("receive");
    let bytes = t.wire_bytes();
    match t {
        Tensor::F32(data) => comm.recv(data, peer(from)?).map(|_| ()).map_err(err),
        Tensor::Half { data, .. } => {
            // SAFETY: as in `send`; any bytes NCCL writes are valid u16 values.
            let mut view = unsafe { data.transmute_mut::<u8>(bytes) }
                .ok_or_else(|| anyhow!("a tensor of {bytes} bytes could not be viewed as bytes"))?;
            comm.recv(&mut view, peer(from)?).map(|_| ()).map_err(err)
        }
    }
}

impl Communicator<Tensor> for NcclComm {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world(&self) -> usize {
        self.comm.world_size()
    }

    fn send(&mut self, to: usize, tag: Tag, parts: &[&Tensor]) -> Result<()> {
        let posted = self.post(
            &[Outgoing {
                to,
                tag,
                parts: parts.to_vec(),
            }],
            Vec::new(),
        )?;
        self.wait(posted).map(|_| ())
    }

    fn recv(&mut self, from: usize, _tag: Tag) -> Result<Vec<Tensor>> {
        bail!(
            "an NCCL receive from worker {from} needs its tensor sizes: post it with its parts and wait"
        )
    }

    fn post(&mut self, sends: &[Outgoing<'_, Tensor>], recvs: Vec<Incoming>) -> Result<Posted> {
        let mut buffers = recvs
            .iter()
            .map(|r| {
                r.parts
                    .iter()
                    .map(|p| self.alloc(p.len, p.precision))
                    .collect()
            })
            .collect::<Result<Vec<Vec<Tensor>>>>()?;
        // After the allocations: the comm stream may write the buffers only once they exist.
        let stream = self.after_compute()?;
        nccl::group_start().map_err(nccl_err("group start"))?;
        let enqueued = self.enqueue(sends, &recvs, &mut buffers);
        let ended = nccl::group_end().map_err(nccl_err("group end"));
        enqueued?;
        ended?;
        self.bytes_sent += sends
            .iter()
            .flat_map(|s| &s.parts)
            .map(|p| p.wire_bytes() as u64)
            .sum::<u64>();
        let done = stream
            .record_event(None)
            .map_err(cuda_err("event record"))?;
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.in_flight.push(InFlight {
            ticket,
            buffers,
            done,
        });
        Ok(Posted { recvs, ticket })
    }

    fn wait(&mut self, posted: Posted) -> Result<Vec<Vec<Tensor>>> {
        let i = self
            .in_flight
            .iter()
            .position(|f| f.ticket == posted.ticket)
            .ok_or_else(|| anyhow!("no NCCL group {} is in flight", posted.ticket))?;
        let flight = self.in_flight.swap_remove(i);
        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let before = self
            .compute
            .record_event(timed)
            .map_err(cuda_err("event record"))?;
        self.compute
            .wait(&flight.done)
            .map_err(cuda_err("stream wait"))?;
        let after = self
            .compute
            .record_event(timed)
            .map_err(cuda_err("event record"))?;
        self.stalls.push((before, after));
        Ok(flight.buffers)
    }

    fn all_reduce_sum(&mut self, buf: &mut Tensor) -> Result<()> {
        let Tensor::F32(data) = buf else {
            bail!("NCCL all-reduce sums f32 tensors, not 16-bit inputs");
        };
        let stream = self.after_compute()?;
        self.comm
            .all_reduce_in_place(data, &ReduceOp::Sum)
            .map_err(nccl_err("all-reduce"))?;
        self.before_compute(&stream)
    }

    /// `ncclAllGather` of the pieces padded to equal length, then each piece cut out of the
    /// gathered slots. 16-bit pieces travel as bytes.
    fn all_gather(&mut self, piece: Tensor, len: usize) -> Result<Vec<Tensor>> {
        let (me, world) = (self.rank(), self.world());
        let spans = shard_spans(len, world);
        if piece.len() != spans[me].len {
            bail!(
                "all-gather: GPU rank {me} holds {} elements, but its piece of {len} is {}",
                piece.len(),
                spans[me].len
            );
        }
        let slot = padded_len(&spans)?;
        let stream = self.after_compute()?;
        let err = nccl_err("all-gather");
        let alloc = cuda_err("allocation of an all-gather buffer");
        let pieces = match &piece {
            Tensor::F32(p) => {
                let mut send = stream.alloc_zeros::<f32>(slot).map_err(&alloc)?;
                copy_into(&stream, p, &mut send, 0)?;
                let mut all = stream.alloc_zeros::<f32>(world * slot).map_err(&alloc)?;
                self.comm.all_gather(&send, &mut all).map_err(err)?;
                let parts = unpad(&stream, &all, &spans, slot)?;
                parts.into_iter().map(Tensor::F32).collect()
            }
            Tensor::Half { dtype, data } => {
                let mut send = stream.alloc_zeros::<u16>(slot).map_err(&alloc)?;
                copy_into(&stream, data, &mut send, 0)?;
                let mut all = stream.alloc_zeros::<u16>(world * slot).map_err(&alloc)?;
                {
                    let bytes =
                        |n: usize| anyhow!("{n} 16-bit values could not be viewed as bytes");
                    // SAFETY: u16 buffers viewed as their bytes: same allocations, twice the
                    // counts, u8 has no invalid bit patterns; NCCL reads the one and writes the
                    // other, and any bytes it writes are valid u16 values.
                    let send_view =
                        unsafe { send.transmute::<u8>(2 * slot) }.ok_or_else(|| bytes(slot))?;
                    // SAFETY: as above.
                    let mut all_view = unsafe { all.transmute_mut::<u8>(2 * world * slot) }
                        .ok_or_else(|| bytes(world * slot))?;
                    self.comm
                        .all_gather(&send_view, &mut all_view)
                        .map_err(err)?;
                }
                let parts = unpad(&stream, &all, &spans, slot)?;
                parts
                    .into_iter()
                    .map(|data| Tensor::Half {
                        dtype: *dtype,
                        data,
                    })
                    .collect()
            }
        };
        self.bytes_sent += all_gather_bytes(len, world, me, piece.wire_bytes() / piece.len());
        self.before_compute(&stream)?;
        Ok(pieces)
    }

    /// The pieces copied into equal padded slots, `ncclReduceScatter` (sum), and this rank's
    /// piece cut out of its slot. Gradients are f32.
    fn reduce_scatter_sum(&mut self, pieces: Vec<Tensor>) -> Result<Tensor> {
        let (me, world) = (self.rank(), self.world());
        let parts = pieces
            .iter()
            .map(|p| match p {
                Tensor::F32(data) => Ok(data),
                Tensor::Half { .. } => {
                    bail!("NCCL reduce-scatter sums f32 tensors (gradients), not 16-bit ones")
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let len = lens.iter().sum();
        let spans = shard_spans(len, world);
        if lens != spans.iter().map(|s| s.len).collect::<Vec<_>>() {
            bail!(
                "reduce-scatter: GPU rank {me} cut {len} elements into pieces of {lens:?}, which is not the shard rule over {world} ranks"
            );
        }
        let slot = padded_len(&spans)?;
        let stream = self.after_compute()?;
        let alloc = cuda_err("allocation of a reduce-scatter buffer");
        let mut send = stream.alloc_zeros::<f32>(world * slot).map_err(&alloc)?;
        for (j, p) in parts.iter().enumerate() {
            copy_into(&stream, p, &mut send, j * slot)?;
        }
        let mut mine = stream.alloc_zeros::<f32>(slot).map_err(&alloc)?;
        self.comm
            .reduce_scatter(&send, &mut mine, &ReduceOp::Sum)
            .map_err(nccl_err("reduce-scatter"))?;
        let piece = unpad(&stream, &mine, &spans[me..=me], 0)?
            .pop()
            .expect("one span, one piece");
        self.bytes_sent += reduce_scatter_bytes(len, world, me, 4);
        self.before_compute(&stream)?;
        Ok(Tensor::F32(piece))
    }

    fn barrier(&mut self) -> Result<()> {
        let stream = self.comm.stream();
        let mut one = stream
            .alloc_zeros::<f32>(1)
            .map_err(cuda_err("allocation"))?;
        self.comm
            .all_reduce_in_place(&mut one, &ReduceOp::Sum)
            .map_err(nccl_err("barrier"))?;
        stream.synchronize().map_err(cuda_err("barrier"))
    }

    /// NCCL cannot tell the other ranks; the host mesh beside it (or the launcher) does.
    fn abort(&mut self, _reason: &str) {}

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn waited_secs(&mut self) -> Result<f64> {
        for (before, after) in self.stalls.drain(..) {
            let ms = before
                .elapsed_ms(&after)
                .map_err(cuda_err("event timing"))?;
            self.waited += f64::from(ms) / 1e3;
        }
        Ok(self.waited)
    }
}
