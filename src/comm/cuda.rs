//! The CUDA tensor as a communicator buffer: its wire size, and the device copy and device-side
//! sum that let virtual workers sharing one GPU exchange tensors through the in-process
//! communicator. Here rather than in `backend::cuda` so that the backend knows nothing of
//! communication (docs/architecture.md's map: `comm` sits above `backend`).

use super::{Buffer, Role, Shared, Src, Wire, check_span};
use crate::backend::cuda::{InputDtype, Tensor};
use crate::shape::Span;
use anyhow::{Result, anyhow, bail};
use cudarc::cublas::{CudaBlas, sys};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop, result};
use std::cell::RefCell;
use std::sync::Arc;

impl Wire for Tensor {
    fn wire_bytes(&self) -> usize {
        match self {
            Tensor::Half { data, .. } => 2 * data.len(),
            Tensor::F32(data) => 4 * data.len(),
        }
    }

    fn elements(&self) -> usize {
        self.len()
    }
}

/// A device tensor lent to virtual workers sharing its GPU for one collective: its address,
/// length and precision (`None`: f32), and the stream its writes are queued on. The address
/// stays valid while the collective lasts: the lender returns (and may free or overwrite the
/// tensor) only once every borrower has queued its last read, and a borrower reads only on the
/// lender's stream, so those reads run before anything the lender queues afterwards.
#[derive(Clone)]
pub struct DeviceLoan {
    ptr: CUdeviceptr,
    len: usize,
    dtype: Option<InputDtype>,
    stream: Arc<CudaStream>,
}

/// A tensor's loan: its current address (its queued writes precede any read queued after this
/// on the same stream).
fn loan(t: &Tensor) -> DeviceLoan {
    let (ptr, dtype, stream) = match t {
        Tensor::Half { dtype, data } => (
            data.device_ptr(data.stream()).0,
            Some(*dtype),
            data.stream(),
        ),
        Tensor::F32(data) => (data.device_ptr(data.stream()).0, None, data.stream()),
    };
    DeviceLoan {
        ptr,
        len: t.len(),
        dtype,
        stream: stream.clone(),
    }
}

/// Elements and precision of what a buffer operation reads.
fn describe(src: &Src<'_, Tensor>) -> (usize, Option<InputDtype>) {
    match src {
        Src::Own(t) => match t {
            Tensor::Half { dtype, .. } => (t.len(), Some(*dtype)),
            Tensor::F32(_) => (t.len(), None),
        },
        Src::Lent(l) => (l.len, l.dtype),
    }
}

/// The device address a buffer operation on `stream` reads `src` at, with what orders the read:
/// for a tensor of this worker, cudarc's events (it may live on another stream, as NCCL's
/// received pieces do); a loan must be on `stream` itself (see [`DeviceLoan`]).
fn read_ptr<'a>(
    src: &'a Src<'a, Tensor>,
    stream: &'a Arc<CudaStream>,
) -> Result<(CUdeviceptr, Option<SyncOnDrop<'a>>)> {
    match src {
        Src::Own(Tensor::Half { data, .. }) => {
            let (ptr, read) = data.device_ptr(stream);
            Ok((ptr, Some(read)))
        }
        Src::Own(Tensor::F32(data)) => {
            let (ptr, read) = data.device_ptr(stream);
            Ok((ptr, Some(read)))
        }
        Src::Lent(l) if l.stream.cu_stream() == stream.cu_stream() => Ok((l.ptr, None)),
        Src::Lent(_) => {
            bail!("virtual workers read each other's tensors on one stream; these are on two")
        }
    }
}

/// The f32 data of `t`, checked to be what a device sum of `srcs[span]` writes: f32, of
/// `span.len` elements, from f32 sources that hold `span`.
fn sum_target<'t, const N: usize>(
    t: &'t mut Tensor,
    srcs: [&Src<'_, Tensor>; N],
    span: Span,
) -> Result<&'t mut cudarc::driver::CudaSlice<f32>> {
    for src in srcs {
        let (from_len, from_dtype) = describe(src);
        check_span("a device sum", from_len, span, t.len(), 0)?;
        if from_dtype.is_some() || t.len() != span.len {
            bail!(
                "a device sum of {} {} values into a tensor of {}",
                span.len,
                precision(from_dtype),
                t.len()
            );
        }
    }
    match t {
        Tensor::F32(mine) => Ok(mine),
        Tensor::Half { .. } => {
            bail!("the in-process reductions sum f32 tensors (gradients), not 16-bit ones")
        }
    }
}

/// The name of a loan's precision, for errors.
fn precision(dtype: Option<InputDtype>) -> &'static str {
    dtype.map_or("f32", InputDtype::name)
}

/// Virtual workers on one GPU pass tensors through the in-process communicator as device copies,
/// or lend them ([`DeviceLoan`]) so that a collective reads them in place.
impl Buffer for Tensor {
    type Lent = DeviceLoan;

    fn duplicate(&self) -> Result<Self> {
        self.try_clone()
    }

    fn lend(&self) -> Result<DeviceLoan> {
        Ok(loan(self))
    }

    fn lent_elements(lent: &DeviceLoan) -> usize {
        lent.len
    }

    fn alloc_like(&self, len: usize) -> Result<Self> {
        let err = |e| anyhow!("could not allocate {len} elements on the GPU: {e:?}");
        Ok(match self {
            Tensor::Half { dtype, data } => Tensor::Half {
                dtype: *dtype,
                // SAFETY: any bits are a valid u16, and the caller's collective overwrites
                // every element before the tensor is read.
                data: unsafe { data.stream().alloc::<u16>(len) }.map_err(err)?,
            },
            // SAFETY: as above, for f32.
            Tensor::F32(data) => {
                Tensor::F32(unsafe { data.stream().alloc::<f32>(len) }.map_err(err)?)
            }
        })
    }

    fn copy_from(&mut self, at: usize, src: Src<'_, Self>, span: Span) -> Result<()> {
        let (from_len, from_dtype) = describe(&src);
        check_span("a device copy", from_len, span, self.len(), at)?;
        let (dtype, elem, stream) = match &*self {
            Tensor::Half { dtype, data } => (Some(*dtype), 2, data.stream().clone()),
            Tensor::F32(data) => (None, 4, data.stream().clone()),
        };
        if from_dtype != dtype {
            bail!(
                "a device copy of {} values into a {} tensor",
                precision(from_dtype),
                precision(dtype)
            );
        }
        let (from, _read) = read_ptr(&src, &stream)?;
        if span.len == 0 {
            // An empty piece (a tensor smaller than the workers): nothing to copy.
            return Ok(());
        }
        let (dst, _write) = match self {
            Tensor::Half { data, .. } => data.device_ptr_mut(&stream),
            Tensor::F32(data) => data.device_ptr_mut(&stream),
        };
        // SAFETY: both ranges were checked to lie in their allocations (`check_span`), of the
        // same element size; the copy is queued on the destination's stream, ordered after the
        // source's writes (`read_ptr`), and a lent source stays allocated until it has run (see
        // `DeviceLoan`).
        unsafe {
            result::memcpy_dtod_async(
                dst + (at * elem) as u64,
                from + (span.start * elem) as u64,
                span.len * elem,
                stream.cu_stream(),
            )
        }
        .map_err(|e| anyhow!("a device copy of a collective failed: {e:?}"))
    }

    /// The in-process reductions of virtual workers' f32 gradients, on the device (cuBLAS
    /// `saxpy` on this tensor's stream): through the host they cost 20× a 7B step. GPU ranks of
    /// a real job reduce through NCCL.
    fn add_from(&mut self, src: Src<'_, Self>, span: Span) -> Result<()> {
        let mine = sum_target(self, [&src], span)?;
        let stream = mine.stream().clone();
        let (x, _read) = read_ptr(&src, &stream)?;
        if span.len == 0 {
            return Ok(());
        }
        let (y, _write) = mine.device_ptr_mut(&stream);
        saxpy(&stream, span.len, x + (span.start * 4) as u64, y)
    }

    /// By cuBLAS `sgeam` (`1·a + 1·b`, one rounding: the host's `a + b`) on this tensor's
    /// stream: one pass where a copy and a `saxpy` would write this tensor twice.
    fn set_sum(&mut self, a: Src<'_, Self>, b: Src<'_, Self>, span: Span) -> Result<()> {
        let mine = sum_target(self, [&a, &b], span)?;
        let stream = mine.stream().clone();
        let (x, _read_a) = read_ptr(&a, &stream)?;
        let (y, _read_b) = read_ptr(&b, &stream)?;
        if span.len == 0 {
            return Ok(());
        }
        let (out, _write) = mine.device_ptr_mut(&stream);
        let at = (span.start * 4) as u64;
        geam(&stream, span.len, (x + at, y + at), out)
    }

    /// Tensors over the lender's memory (cudarc slices made from its addresses), which are
    /// never freed here: [`Shared`] lets go of them by [`Buffer::forget`].
    fn views(lent: &[DeviceLoan], like: &Self) -> Result<Shared<Vec<Self>, Self>> {
        let stream = match like {
            Tensor::Half { data, .. } => data.stream(),
            Tensor::F32(data) => data.stream(),
        };
        if lent
            .iter()
            .any(|l| l.stream.cu_stream() != stream.cu_stream())
        {
            bail!("virtual workers read each other's tensors on one stream; these are on two");
        }
        let views = lent
            .iter()
            .map(|l| match l.dtype {
                // SAFETY: the loan addresses `l.len` values of this precision in a live
                // allocation of the lender, on this worker's stream; the lender frees it only
                // after this worker has given the views back (queued its last use), and the
                // views are let go of by `forget`, never freed (they are held as
                // `Role::Views` from here on).
                Some(dtype) => Tensor::Half {
                    dtype,
                    data: unsafe { l.stream.upgrade_device_ptr::<u16>(l.ptr, l.len) },
                },
                // SAFETY: as above, for f32.
                None => Tensor::F32(unsafe { l.stream.upgrade_device_ptr::<f32>(l.ptr, l.len) }),
            })
            .collect();
        Ok(Shared::new(views, Role::Views))
    }

    fn forget(self) {
        // The memory stays allocated: its owner, or the end of the process, frees it.
        match self {
            Tensor::Half { data, .. } => {
                let _ = data.leak();
            }
            Tensor::F32(data) => {
                let _ = data.leak();
            }
        }
    }

    fn take_from(src: Src<'_, Self>, span: Span) -> Result<Self> {
        let (from_len, from_dtype) = describe(&src);
        check_span("a device piece", from_len, span, span.len, 0)?;
        let stream = match &src {
            Src::Own(Tensor::Half { data, .. }) => data.stream(),
            Src::Own(Tensor::F32(data)) => data.stream(),
            Src::Lent(l) => &l.stream,
        };
        let err = |e| anyhow!("could not allocate {} elements on the GPU: {e:?}", span.len);
        let mut piece = match from_dtype {
            Some(dtype) => Tensor::Half {
                dtype,
                // SAFETY: any bits are a valid u16; the copy below overwrites every element.
                data: unsafe { stream.alloc::<u16>(span.len) }.map_err(err)?,
            },
            // SAFETY: as above, for f32.
            None => Tensor::F32(unsafe { stream.alloc::<f32>(span.len) }.map_err(err)?),
        };
        piece.copy_from(0, src, span)?;
        Ok(piece)
    }
}

/// `y += x` over `n` f32 at device addresses `x` and `y`, by cuBLAS on `stream`.
fn saxpy(stream: &Arc<CudaStream>, n: usize, x: CUdeviceptr, y: CUdeviceptr) -> Result<()> {
    with_blas(stream, |blas| {
        let one = 1.0f32;
        // SAFETY: the callers checked that `x` and `y` address `n` f32 each inside live device
        // allocations, ordered on `stream`; the handle is bound to `stream`; `alpha` is a host
        // scalar (the handle's default pointer mode).
        unsafe {
            sys::cublasSaxpy_v2_64(
                *blas.handle(),
                n as i64,
                &one,
                x as *const f32,
                1,
                y as *mut f32,
                1,
            )
        }
    })
}

/// Runs `call` with this worker thread's cuBLAS handle bound to `stream` (made once, not per
/// tensor), its status turned into an error.
fn with_blas(
    stream: &Arc<CudaStream>,
    call: impl FnOnce(&CudaBlas) -> sys::cublasStatus_t,
) -> Result<()> {
    BLAS.with(|cell| {
        let mut cached = cell.borrow_mut();
        let same = matches!(&*cached, Some((s, _)) if Arc::ptr_eq(s, stream));
        if !same {
            let blas = CudaBlas::new(stream.clone())
                .map_err(|e| anyhow!("could not create a cuBLAS handle: {e:?}"))?;
            *cached = Some((stream.clone(), blas));
        }
        let (_, blas) = cached.as_ref().expect("set above");
        match call(blas) {
            sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
            e => Err(anyhow!("the device sum of a collective failed: {e:?}")),
        }
    })
}

/// `out = x + y` over `n` f32 at device addresses `x`, `y` and `out`, by cuBLAS `sgeam` on
/// `stream`, the one cuBLAS call that writes a sum of two operands to a third. `sgeam` adds
/// matrices, so the vector goes as a column-major matrix of `n / cols` rows and `cols` columns
/// (contiguous whatever the split; `cols` the largest power of two up to 256 dividing `n`)
/// rather than as one column of 100M rows, a shape a matrix routine may not expect; which shape
/// is fastest is measured on the GPU, not known here.
fn geam(
    stream: &Arc<CudaStream>,
    n: usize,
    (x, y): (CUdeviceptr, CUdeviceptr),
    out: CUdeviceptr,
) -> Result<()> {
    let cols = 1usize << n.trailing_zeros().min(8);
    let rows = (n / cols) as i64;
    with_blas(stream, |blas| {
        let one = 1.0f32;
        let plain = sys::cublasOperation_t::CUBLAS_OP_N;
        // SAFETY: the caller checked that `x`, `y` and `out` address `n` = rows · cols f32 each
        // inside live device allocations, ordered on `stream` (the handle's); each is one
        // contiguous column-major matrix with leading dimension `rows`; `alpha` and `beta` are
        // host scalars (the handle's default pointer mode); `out` overlaps neither input.
        unsafe {
            sys::cublasSgeam_64(
                *blas.handle(),
                plain,
                plain,
                rows,
                cols as i64,
                &one,
                x as *const f32,
                rows,
                &one,
                y as *const f32,
                rows,
                out as *mut f32,
                rows,
            )
        }
    })
}

thread_local! {
    /// Each worker thread's cuBLAS handle for [`Buffer::add_from`] and [`Buffer::set_sum`],
    /// bound to the stream it last summed on: made once, not per tensor.
    static BLAS: RefCell<Option<(Arc<CudaStream>, CudaBlas)>> = const { RefCell::new(None) };
}
