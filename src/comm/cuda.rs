//! The CUDA tensor as a communicator buffer: its wire size, and the device copy and device-side
//! sum that let virtual workers sharing one GPU exchange tensors through the in-process
//! communicator. Here rather than in `backend::cuda` so that the backend knows nothing of
//! communication (DESIGN's map: `comm` sits above `backend`).

use super::{Buffer, Wire};
use crate::backend::cuda::Tensor;
use anyhow::{Result, anyhow, bail};
use cudarc::cublas::{CudaBlas, sys};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
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

/// Virtual workers on one GPU pass tensors through the in-process communicator as device copies.
impl Buffer for Tensor {
    fn duplicate(&self) -> Result<Self> {
        self.try_clone()
    }

    /// The in-process all-reduce of virtual workers' f32 gradients, on the device (cuBLAS
    /// `saxpy` on this tensor's stream, which waits for `other`'s last write): through the host
    /// it cost 20× a 7B step. GPU ranks of a real job all-reduce through NCCL.
    fn sum_from(&mut self, other: &Self) -> Result<()> {
        let (Tensor::F32(mine), Tensor::F32(theirs)) = (&mut *self, other) else {
            bail!("the in-process all-reduce sums f32 tensors (gradients), not 16-bit ones");
        };
        if mine.len() != theirs.len() {
            bail!(
                "an all-reduce of {} elements met one of {}",
                mine.len(),
                theirs.len()
            );
        }
        let stream = mine.stream().clone();
        let n = mine.len() as i64;
        BLAS.with(|cell| {
            let mut cached = cell.borrow_mut();
            let same = matches!(&*cached, Some((s, _)) if Arc::ptr_eq(s, &stream));
            if !same {
                let blas = CudaBlas::new(stream.clone())
                    .map_err(|e| anyhow!("could not create a cuBLAS handle: {e:?}"))?;
                *cached = Some((stream.clone(), blas));
            }
            let (_, blas) = cached.as_ref().expect("set above");
            let (x, _read) = theirs.device_ptr(&stream);
            let (y, _write) = mine.device_ptr_mut(&stream);
            let one = 1.0f32;
            // SAFETY: `x` and `y` are live device allocations of `n` f32 each (lengths checked
            // above), ordered on `stream` by the guards held until the call is queued; the handle
            // is bound to `stream`; `alpha` is a host scalar (the handle's default pointer mode).
            let status = unsafe {
                sys::cublasSaxpy_v2_64(
                    *blas.handle(),
                    n,
                    &one,
                    x as *const f32,
                    1,
                    y as *mut f32,
                    1,
                )
            };
            match status {
                sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
                e => Err(anyhow!("the device sum of an all-reduce failed: {e:?}")),
            }
        })
    }
}

thread_local! {
    /// Each worker thread's cuBLAS handle for [`Buffer::sum_from`], bound to the stream it last
    /// summed on: made once, not per tensor.
    static BLAS: RefCell<Option<(Arc<CudaStream>, CudaBlas)>> = const { RefCell::new(None) };
}
