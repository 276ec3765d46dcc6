//! Attention on memory and a stream that another library owns: PyTorch, through the Python
//! binding (`python/`). The whole-sequence fast path ([`CudaBackend::causal_forward_into`],
//! [`CudaBackend::causal_backward_into`]) runs on raw device addresses (a tensor's
//! `data_ptr()`) and on the caller's stream (`torch.cuda.current_stream().cuda_stream`), so
//! nothing is copied, the caller's allocator owns every input and output, and the work is
//! ordered with the caller's own kernels without any synchronisation.
//!
//! One CUDA context: [`CudaBackend::on_borrowed_stream`] opens the device's *primary* context,
//! which is the one the CUDA runtime (and so PyTorch) uses. The lent addresses become cudarc
//! slices only for the length of one call and are handed back unfreed afterwards, on every path
//! out (an error, a panic: a lent slice is never dropped, only leaked).
//!
//! Layout: any the kernels read ([`CallStrides`]: torch's own strides, so `[batch, seq, heads,
//! head_dim]` tensors and transformers' transposed views go in without a copy). Q, O, dO and
//! dQ share the query side's strides, K, V, dK and dV the key side's; LSE is `[batch, heads,
//! seq]` f32. dQ is f32; dK and dV are in the input dtype where the kernel writes them itself
//! ([`sequence_kv_grads_half`]: one query head per KV head), else f32. The one allocation of the
//! backend itself is the backward's D (one f32 per query row), from the stream-ordered pool.
//!
//! The distributed call (`dist_flash_attn`) is the exception: the executor allocates, sends,
//! receives into and frees its own tensors, so a rank's chunk is copied into backend tensors
//! ([`CudaBackend::copy_from_lent`]) and the results out to the caller's
//! ([`CudaBackend::copy_to_lent`]), device to device on the same stream.

use super::strides::CallStrides;
use super::{
    CudaBackend, HEAD_DIMS, InputDtype, SequenceCall, Tensor, launch, sequence_kv_grads_half,
};
use crate::block_math::{Grads, Partial};
use crate::error::Error;
use crate::shape::{Dims, Mask, Precision};
use anyhow::Result;
use std::mem::ManuallyDrop;

/// The alignment the kernels' vector loads and the forward's tensor maps (TMA) need.
const ALIGN: u64 = 16;

/// Device addresses of one forward call (each a tensor's `data_ptr()`).
#[derive(Clone, Copy, Debug)]
pub struct ForwardAddrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// O, written: input dtype, shaped as Q.
    pub out: u64,
    /// LSE, written: f32 `[batch, heads, seq]`, natural log.
    pub lse: u64,
}

/// Device addresses of one backward call (the gradients overwritten: [`sequence_kv_grads_half`]
/// says in which precision dK and dV are).
#[derive(Clone, Copy, Debug)]
pub struct BackwardAddrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// The forward's O (input dtype) and LSE (f32).
    pub out: u64,
    pub lse: u64,
    /// dO in the input dtype, shaped as Q.
    pub dout: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

impl From<[u64; 5]> for ForwardAddrs {
    /// The addresses in field order: q, k, v, out, lse (how the binding passes a chunk's).
    fn from([q, k, v, out, lse]: [u64; 5]) -> Self {
        ForwardAddrs { q, k, v, out, lse }
    }
}

impl From<[u64; 9]> for BackwardAddrs {
    /// The addresses in field order: q, k, v, out, lse, dout, dq, dk, dv.
    fn from([q, k, v, out, lse, dout, dq, dk, dv]: [u64; 9]) -> Self {
        BackwardAddrs {
            q,
            k,
            v,
            out,
            lse,
            dout,
            dq,
            dk,
            dv,
        }
    }
}

impl ForwardAddrs {
    /// The checks that need no GPU (the binding runs them before opening one): the shape, the
    /// strides (the kernels can read them, and write O under Q's), and every address not null
    /// and aligned.
    pub fn check(&self, dims: &Dims, seq: usize, strides: &CallStrides) -> Result<()> {
        check_lent_call(dims, seq)?;
        let (b, d) = (dims.batch, dims.head_dim);
        strides
            .q
            .check([b, dims.heads, seq, d], true, "q (and the output, dq)")?;
        strides
            .kv
            .check([b, dims.kv_heads, seq, d], false, "k and v")?;
        let (ql, kvl) = strides.extents(dims, seq, seq);
        let sl = dims.stat_len(seq);
        for (addr, len, what) in [
            (self.q, ql, "q"),
            (self.k, kvl, "k"),
            (self.v, kvl, "v"),
            (self.out, ql, "the output"),
            (self.lse, sl, "the LSE"),
        ] {
            check_addr(addr, len, what)?;
        }
        Ok(())
    }
}

impl BackwardAddrs {
    /// As [`ForwardAddrs::check`], for the backward's nine tensors (dK and dV are written
    /// under K's strides).
    pub fn check(&self, dims: &Dims, seq: usize, strides: &CallStrides) -> Result<()> {
        let forward = ForwardAddrs {
            q: self.q,
            k: self.k,
            v: self.v,
            out: self.out,
            lse: self.lse,
        };
        forward.check(dims, seq, strides)?;
        let kv_dims = [dims.batch, dims.kv_heads, seq, dims.head_dim];
        strides.kv.check(kv_dims, true, "dk and dv (and k, v)")?;
        let (ql, kvl) = strides.extents(dims, seq, seq);
        for (addr, len, what) in [
            (self.dout, ql, "the output's gradient"),
            (self.dq, ql, "dq"),
            (self.dk, kvl, "dk"),
            (self.dv, kvl, "dv"),
        ] {
            check_addr(addr, len, what)?;
        }
        Ok(())
    }
}

/// One sentence unless `addr` can hold `len` elements for the kernels: not null, and aligned.
fn check_addr(addr: u64, len: usize, what: &str) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    if addr == 0 {
        return Err(Error::invalid_input(format!(
            "{what} has a null device address; pass a tensor that holds memory on the GPU"
        )));
    }
    if !addr.is_multiple_of(ALIGN) {
        return Err(Error::invalid_input(format!(
            "{what} starts at {addr:#x}, which is not {ALIGN}-byte aligned; pass a fresh contiguous tensor (e.g. .contiguous() or .clone()) instead of a view at an offset"
        )));
    }
    Ok(())
}

/// The shape checks of a lent call, which need no GPU: dims the kernels take and a sequence of
/// at least one token.
pub fn check_lent_call(dims: &Dims, seq: usize) -> Result<()> {
    dims.validate()?;
    if !HEAD_DIMS.contains(&dims.head_dim) {
        return Err(Error::invalid_input(launch::unsupported_head_dim(
            dims.head_dim,
        )));
    }
    if seq == 0 {
        return Err(Error::invalid_input(
            "the sequence is empty; pass at least one token",
        ));
    }
    Ok(())
}

impl CudaBackend {
    /// Opens GPU `ordinal` (its primary context, shared with the CUDA runtime) with every
    /// kernel on `stream`, a `CUstream` handle owned by the caller (0: the legacy default
    /// stream). Fails with a sentence as [`CudaBackend::new`] does.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of device `ordinal`'s primary context, and stay
    /// alive as long as the backend does.
    pub unsafe fn on_borrowed_stream(
        ordinal: usize,
        dtype: InputDtype,
        stream: usize,
    ) -> Result<Self> {
        let mut backend = CudaBackend::new(ordinal, dtype)?;
        // SAFETY: the stream is the caller's, of this primary context, and outlives the
        // backend (this function's contract).
        backend.stream = unsafe { backend.ctx.wrap_borrowed_stream(stream as _) };
        // SAFETY: every slice of this backend, lent or allocated, lives on its one stream, so
        // stream order alone orders every use; no per-slice events are needed.
        unsafe { backend.ctx.disable_event_tracking() };
        Ok(backend)
    }

    /// [`Self::causal_forward_into`] on lent memory under `mask` and `strides`: writes O and LSE
    /// at `addrs`.
    ///
    /// # Safety
    /// Each address must point to device memory of this backend's context holding the tensor
    /// its field documents for `dims` and `seq` under `strides` (in the backend's dtype, LSE
    /// f32), alive and not used by other streams until the call's work on the backend's stream
    /// has finished.
    pub unsafe fn causal_forward_lent(
        &self,
        dims: &Dims,
        seq: usize,
        mask: &Mask,
        strides: &CallStrides,
        addrs: &ForwardAddrs,
    ) -> Result<()> {
        addrs.check(dims, seq, strides)?;
        let (ql, kvl) = strides.extents(dims, seq, seq);
        let sl = dims.stat_len(seq);
        // SAFETY (all five): the addresses were checked above and hold these lengths (this
        // function's contract); `give_back` returns them unfreed.
        let (q, k, v) = unsafe {
            (
                self.lend_half(addrs.q, ql),
                self.lend_half(addrs.k, kvl),
                self.lend_half(addrs.v, kvl),
            )
        };
        let mut out = ManuallyDrop::new(Partial {
            // SAFETY: as above.
            out: ManuallyDrop::into_inner(unsafe { self.lend_half(addrs.out, ql) }),
            // SAFETY: as above.
            lse: ManuallyDrop::into_inner(unsafe { self.lend_f32(addrs.lse, sl) }),
        });
        let call = SequenceCall {
            dims,
            seq,
            mask,
            strides,
        };
        let result = self.causal_forward_into(&call, [&q, &k, &v], &mut out);
        let Partial { out: o, lse } = ManuallyDrop::into_inner(out);
        for t in [q, k, v]
            .map(ManuallyDrop::into_inner)
            .into_iter()
            .chain([o, lse])
        {
            give_back(t);
        }
        result
    }

    /// [`Self::causal_backward_into`] on lent memory under `mask` (the forward's) and
    /// `strides`: overwrites dQ, dK and dV at `addrs`.
    ///
    /// # Safety
    /// As [`Self::causal_forward_lent`], for every address of `addrs` (dQ f32 under Q's
    /// strides; dK and dV under K's, in the precision [`sequence_kv_grads_half`] says).
    pub unsafe fn causal_backward_lent(
        &self,
        dims: &Dims,
        seq: usize,
        mask: &Mask,
        strides: &CallStrides,
        addrs: &BackwardAddrs,
    ) -> Result<()> {
        addrs.check(dims, seq, strides)?;
        let (ql, kvl) = strides.extents(dims, seq, seq);
        let sl = dims.stat_len(seq);
        let kv_precision = if sequence_kv_grads_half(dims, seq) {
            Precision::Input
        } else {
            Precision::F32
        };
        // SAFETY (every lend below): the addresses were checked above and hold these lengths
        // (this function's contract); `give_back` returns them unfreed.
        let (q, k, v, dout) = unsafe {
            (
                self.lend_half(addrs.q, ql),
                self.lend_half(addrs.k, kvl),
                self.lend_half(addrs.v, kvl),
                self.lend_half(addrs.dout, ql),
            )
        };
        let fwd = ManuallyDrop::new(Partial {
            // SAFETY: as above.
            out: ManuallyDrop::into_inner(unsafe { self.lend_half(addrs.out, ql) }),
            // SAFETY: as above.
            lse: ManuallyDrop::into_inner(unsafe { self.lend_f32(addrs.lse, sl) }),
        });
        let mut grads = ManuallyDrop::new(Grads {
            // SAFETY: as above.
            dq: ManuallyDrop::into_inner(unsafe { self.lend_f32(addrs.dq, ql) }),
            // SAFETY: as above.
            dk: ManuallyDrop::into_inner(unsafe { self.lend(addrs.dk, kvl, kv_precision) }),
            // SAFETY: as above.
            dv: ManuallyDrop::into_inner(unsafe { self.lend(addrs.dv, kvl, kv_precision) }),
        });
        let qkv = [&*q, &*k, &*v];
        let call = SequenceCall {
            dims,
            seq,
            mask,
            strides,
        };
        let result = self.causal_backward_into(&call, qkv, fwd.as_ref(), &dout, &mut grads);
        let Partial { out, lse } = ManuallyDrop::into_inner(fwd);
        let Grads { dq, dk, dv } = ManuallyDrop::into_inner(grads);
        let lent = [q, k, v, dout].map(ManuallyDrop::into_inner);
        for t in lent.into_iter().chain([out, lse, dq, dk, dv]) {
            give_back(t);
        }
        result
    }

    /// A tensor of this backend holding a copy of the `len` values at `addr` (the backend's
    /// 16-bit dtype for `Precision::Input`, else f32), queued on the backend's stream: how the
    /// binding's distributed call hands a caller's chunk to the executor, whose tensors it
    /// owns (and frees, sends, receives into) itself. `what` names it in errors.
    ///
    /// # Safety
    /// `addr` must hold `len` such values in this backend's context, alive and not written by
    /// other streams until the copy queued on the backend's stream has run.
    pub unsafe fn copy_from_lent(
        &self,
        addr: u64,
        len: usize,
        precision: Precision,
        what: &str,
    ) -> Result<Tensor> {
        check_addr(addr, len, what)?;
        // SAFETY: this function's contract; `give_back` returns the loan unfreed.
        let lent = ManuallyDrop::into_inner(unsafe { self.lend(addr, len, precision) });
        let copy = lent.try_clone();
        give_back(lent);
        copy.map_err(|e| anyhow::anyhow!("copying {what} on the GPU failed: {e:#}"))
    }

    /// Copies `t` (this backend's) to the caller's memory at `addr`, in `t`'s precision, on
    /// the backend's stream: the executor's results handed back to the caller.
    ///
    /// # Safety
    /// `addr` must hold room for `t.len()` values of `t`'s precision in this backend's
    /// context, alive and not used by other streams until the copy has run.
    pub unsafe fn copy_to_lent(&self, t: &Tensor, addr: u64, what: &str) -> Result<()> {
        check_addr(addr, t.len(), what)?;
        let precision = match t {
            Tensor::Half { .. } => Precision::Input,
            Tensor::F32(_) => Precision::F32,
        };
        // SAFETY: this function's contract; `give_back` returns the loan unfreed.
        let mut lent = ManuallyDrop::into_inner(unsafe { self.lend(addr, t.len(), precision) });
        let err = |e| anyhow::anyhow!("copying {what} on the GPU failed: {e:?}");
        let copied = match (&mut lent, t) {
            (Tensor::Half { data: to, .. }, Tensor::Half { data: from, .. }) => {
                self.stream.memcpy_dtod(from, to).map_err(err)
            }
            (Tensor::F32(to), Tensor::F32(from)) => self.stream.memcpy_dtod(from, to).map_err(err),
            _ => Err(anyhow::anyhow!(
                "copying {what}: the loan's precision is not the tensor's"
            )),
        };
        give_back(lent);
        copied
    }

    /// `len` values at `addr` lent as [`Self::lend_half`] (`Precision::Input`) or
    /// [`Self::lend_f32`] lend them.
    ///
    /// # Safety
    /// As [`Self::lend_half`].
    unsafe fn lend(&self, addr: u64, len: usize, precision: Precision) -> ManuallyDrop<Tensor> {
        // SAFETY: this function's contract.
        unsafe {
            match precision {
                Precision::Input => self.lend_half(addr, len),
                Precision::F32 => self.lend_f32(addr, len),
            }
        }
    }

    /// `len` 16-bit values of the backend's dtype at `addr`, as a tensor that must go back
    /// through [`give_back`] (dropping it would free the owner's memory).
    ///
    /// # Safety
    /// `addr` holds `len` such values in this backend's context, alive while the tensor is.
    unsafe fn lend_half(&self, addr: u64, len: usize) -> ManuallyDrop<Tensor> {
        // SAFETY: this function's contract; event tracking is off, so wrapping allocates nothing.
        let data = unsafe { self.stream.upgrade_device_ptr::<u16>(addr, len) };
        ManuallyDrop::new(Tensor::Half {
            dtype: self.dtype,
            data,
        })
    }

    /// `len` f32 values at `addr`, as [`Self::lend_half`] lends 16-bit ones.
    ///
    /// # Safety
    /// As [`Self::lend_half`].
    unsafe fn lend_f32(&self, addr: u64, len: usize) -> ManuallyDrop<Tensor> {
        // SAFETY: this function's contract.
        ManuallyDrop::new(Tensor::F32(unsafe {
            self.stream.upgrade_device_ptr::<f32>(addr, len)
        }))
    }
}

/// Hands a lent tensor back to its owner: releases cudarc's hold on the stream, frees nothing.
fn give_back(t: Tensor) {
    match t {
        Tensor::Half { data, .. } => {
            data.leak();
        }
        Tensor::F32(data) => {
            data.leak();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::strides::Strides;
    use super::*;

    #[test]
    fn addresses_are_checked_in_sentences() {
        assert!(check_addr(0x1000, 8, "q").is_ok());
        assert!(
            check_addr(0, 0, "q").is_ok(),
            "an empty tensor has no address"
        );
        let err = check_addr(0, 8, "q").unwrap_err().to_string();
        assert!(err.starts_with("q has a null device address"), "{err}");
        let err = check_addr(0x1002, 8, "k").unwrap_err().to_string();
        assert!(
            err.starts_with("k starts at 0x1002, which is not 16-byte aligned"),
            "{err}"
        );
    }

    #[test]
    fn shapes_are_checked_before_any_device() {
        let dims = |heads, kv_heads, head_dim| Dims {
            batch: 2,
            heads,
            kv_heads,
            head_dim,
        };
        assert!(check_lent_call(&dims(8, 2, 128), 100).is_ok());
        assert!(check_lent_call(&dims(8, 8, 64), 1).is_ok());
        let err = check_lent_call(&dims(8, 3, 128), 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be a multiple of kv-heads (3)"), "{err}");
        assert!(check_lent_call(&dims(8, 8, 96), 100).is_ok());
        let err = check_lent_call(&dims(8, 8, 72), 100)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("supports head dims 64, 80, 96, 128, 192 and 256, not 72"),
            "{err}"
        );
        let err = check_lent_call(&dims(8, 8, 64), 0).unwrap_err().to_string();
        assert_eq!(err, "the sequence is empty; pass at least one token");
    }

    #[test]
    fn every_refusal_of_a_lent_call_is_the_callers_input() {
        use crate::error::{ErrorKind, kind_of};
        let dims = Dims {
            batch: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
        };
        let strides = CallStrides::head_major(&dims, 16, 16);
        let fwd = ForwardAddrs::from([0x10000; 5]);
        let bwd = BackwardAddrs::from([0x10000; 9]);
        assert!(fwd.check(&dims, 16, &strides).is_ok());
        assert!(bwd.check(&dims, 16, &strides).is_ok());
        let unreadable = CallStrides {
            q: Strides {
                row: 65,
                ..strides.q
            },
            ..strides
        };
        let overlapping = CallStrides {
            kv: Strides {
                head: 0,
                ..strides.kv
            },
            ..strides
        };
        for refused in [
            ForwardAddrs { q: 0, ..fwd }.check(&dims, 16, &strides),
            ForwardAddrs { v: 0x10002, ..fwd }.check(&dims, 16, &strides),
            fwd.check(
                &Dims {
                    kv_heads: 3,
                    ..dims
                },
                16,
                &strides,
            ),
            fwd.check(
                &Dims {
                    head_dim: 72,
                    ..dims
                },
                16,
                &strides,
            ),
            fwd.check(&dims, 0, &strides),
            fwd.check(&dims, 16, &unreadable),
            bwd.check(&dims, 16, &overlapping),
            BackwardAddrs { dk: 0, ..bwd }.check(&dims, 16, &strides),
        ] {
            let e = refused.unwrap_err();
            assert_eq!(kind_of(&e), Some(ErrorKind::InvalidInput), "{e:#}");
        }
        let e = ForwardAddrs { q: 0, ..fwd }
            .check(&dims, 16, &strides)
            .unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "q has a null device address; pass a tensor that holds memory on the GPU"
        );
    }
}
