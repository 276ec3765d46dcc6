//! The device: opening one GPU (driver present, device there, compute capability 8.0 or newer),
//! its context and the one stream every kernel runs on, host-device copies, allocation and the
//! single place kernels are launched.

use super::kernels::{KernelCache, Target};
use super::launch::Masking;
use super::mask::{MaskArgs, MaskCache};
use super::{InputDtype, Kernels, Tensor, Tuning};
use crate::block_math::Block;
use crate::error::{Error, ErrorKind};
use crate::shape::Mask;
use anyhow::Result;
use cudarc::driver::sys::{CUdevice_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, LaunchArgs, LaunchConfig};
use rayon::prelude::*;
use std::fmt;
use std::sync::Arc;

/// The error a machine without the CUDA driver gets, before cudarc could panic on it.
fn require_driver() -> Result<()> {
    // SAFETY: only probes whether the driver library can be opened; no CUDA call is made.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::device("no CUDA driver found; use --device cpu"))
    }
}

/// One GPU running attention blocks; see the module docs for precision and entry points.
pub struct CudaBackend {
    pub(super) ordinal: usize,
    pub(super) dtype: InputDtype,
    /// `None`: the per-head-dim default ([`Tuning::for_head_dim`]).
    pub(super) tuning: Option<Tuning>,
    /// The backward's sums in a fixed order ([`CudaBackend::with_deterministic`]).
    pub(super) deterministic: bool,
    pub(super) capability: (i32, i32),
    /// Its SMs: the kernels order the CTAs of short heads so that a wave of them fills these
    /// (`kernels/common.cuh`, `cta_work`).
    pub(super) sms: usize,
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    kernels: KernelCache,
    /// The last mask's `row_start` on the device (`mask`), reused while the mask stays.
    mask_rows: MaskCache,
}

impl CudaBackend {
    /// Opens GPU `ordinal` with inputs stored as `dtype`. Fails with a sentence when there is no
    /// driver, no such device, or a device older than compute capability 8.0 (the kernels use
    /// bf16 tensor cores and `cp.async`): each an [`ErrorKind::Device`] error.
    pub fn new(ordinal: usize, dtype: InputDtype) -> Result<Self> {
        require_driver()?;
        let count = CudaContext::device_count()
            .map_err(|e| Error::device(format!("could not count the CUDA devices: {e:?}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::device(format!(
                "GPU {ordinal} was asked for but this machine has {count}; start at most {count} GPU processes per node (one per GPU)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::device(format!("could not open CUDA device {ordinal}: {e:?}")))?;
        let capability = ctx
            .compute_capability()
            .map_err(|e| Error::device(format!("could not query CUDA device {ordinal}: {e:?}")))?;
        if capability.0 < 8 {
            return Err(Error::device(format!(
                "CUDA device {ordinal} has compute capability {}.{}; the attention kernels need 8.0 or newer",
                capability.0, capability.1
            )));
        }
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::device(format!("could not query CUDA device {ordinal}: {e:?}")))?;
        let stream = ctx.default_stream();
        let backend = CudaBackend {
            ordinal,
            dtype,
            tuning: None,
            deterministic: false,
            capability,
            sms: sms.max(1) as usize,
            ctx,
            stream,
            kernels: KernelCache::default(),
            mask_rows: MaskCache::default(),
        };
        backend.keep_freed_memory()?;
        Ok(backend)
    }

    /// Selects another kernel shape variant for every head dim (see [`Tuning`]); for re-tuning
    /// on other GPUs. Its `deterministic` applies too, as [`Self::with_deterministic`] would set
    /// it.
    pub fn with_tuning(mut self, tuning: Tuning) -> Result<Self> {
        tuning.validate()?;
        self.tuning = Some(tuning);
        self.deterministic = tuning.deterministic;
        self.forget_kernels()?;
        Ok(self)
    }

    /// Makes the attention backward deterministic (or not again): the same inputs give the same
    /// gradients to the bit on every run, at 0.6–0.85× the default backward's speed
    /// ([`Tuning::deterministic`]; `bench/results/determinism-2026-12-02`). Without it dQ, and
    /// dK and dV where f32 sums gather several CTAs' shares, differ in their last bits from run
    /// to run.
    pub fn with_deterministic(mut self, on: bool) -> Result<Self> {
        self.deterministic = on;
        self.forget_kernels()?;
        Ok(self)
    }

    /// Drops the compiled kernels, whose defines a new variant changes; they compile again
    /// (from the on-disk cache where it has them) at the next launch.
    fn forget_kernels(&self) -> Result<()> {
        self.kernels.clear()
    }

    /// The kernels for `head_dim` and `masking`, compiled and loaded the first time.
    pub(super) fn kernels(&self, head_dim: usize, masking: Masking) -> Result<Arc<Kernels>> {
        self.kernels.get(head_dim, masking, || Target {
            ctx: &self.ctx,
            dtype: self.dtype,
            tuning: self.tuning(head_dim),
            sms: self.sms,
            capability: self.capability,
        })
    }

    /// Kernels of any head dim and masking already loaded, else the causal head-dim-128
    /// variant: for the elementwise helpers, which depend on neither.
    pub(super) fn any_kernels(&self) -> Result<Arc<Kernels>> {
        match self.kernels.any()? {
            Some(k) => Ok(k),
            None => self.kernels(128, Masking::Causal),
        }
    }

    /// The mask arguments for a launch of `block` (`mask::MaskCache::args`).
    pub(super) fn mask_args(&self, mask: &Mask, block: Block) -> Result<MaskArgs> {
        self.mask_rows.args(&self.stream, mask, block)
    }

    /// The kernel shape variant used for `head_dim` on this device.
    pub fn tuning(&self, head_dim: usize) -> Tuning {
        let t = self
            .tuning
            .unwrap_or_else(|| Tuning::for_head_dim(head_dim))
            .for_device(head_dim, self.capability);
        Tuning {
            deterministic: self.deterministic,
            ..t
        }
    }

    /// The input dtype chosen at construction.
    pub fn dtype(&self) -> InputDtype {
        self.dtype
    }

    /// The stream every kernel of this backend runs on (for events and timing).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies host f32 data to the device as a 16-bit tensor of the bits `bits` makes of each
    /// value: [`Backend::upload`](crate::backend::Backend::upload)'s rounding to the input
    /// dtype, or another split of an f32 into 16-bit halves (`master_split`).
    pub fn upload_bits(&self, host: &[f32], bits: impl Fn(f32) -> u16 + Sync) -> Result<Tensor> {
        let bits: Vec<u16> = host.par_iter().map(|&x| bits(x)).collect();
        let data = self
            .stream
            .clone_htod(&bits)
            .map_err(|e| anyhow::anyhow!("copy to the GPU failed: {e:?}"))?;
        Ok(Tensor::Half {
            dtype: self.dtype,
            data,
        })
    }

    /// Copies host f32 data to the device as an f32 tensor (statistics, accumulators), where
    /// [`Backend::upload`](crate::backend::Backend::upload) would round to the input dtype.
    pub fn upload_f32(&self, host: &[f32]) -> Result<Tensor> {
        let data = self
            .stream
            .clone_htod(host)
            .map_err(|e| anyhow::anyhow!("copy to the GPU failed: {e:?}"))?;
        Ok(Tensor::F32(data))
    }

    /// Waits until all queued work is done; surfaces asynchronous kernel errors.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| anyhow::anyhow!("CUDA device {} failed: {e:?}", self.ordinal))
    }

    pub(super) fn launch(
        &self,
        what: &str,
        mut args: LaunchArgs<'_>,
        cfg: LaunchConfig,
    ) -> Result<()> {
        // SAFETY: every launch site pushes exactly the arguments of the kernel's C signature
        // (device pointers from `CudaSlice`s whose lengths were validated against the shapes the
        // kernel indexes, then 32-bit ints, 64-bit lengths and f32 scalars in order), and `cfg`
        // comes from `launch`, whose shared-memory sizes match the kernels' tile layouts.
        unsafe { args.launch(cfg) }
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("launching {what} failed: {e:?}"))
    }

    pub(super) fn alloc_f32(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.stream
            .alloc_zeros::<f32>(len)
            .map_err(|e| allocation_failed(e, format_args!("{len} f32")))
    }

    pub(super) fn alloc_half(&self, len: usize) -> Result<Tensor> {
        let data = self
            .stream
            .alloc_zeros::<u16>(len)
            .map_err(|e| allocation_failed(e, format_args!("{len} 16-bit values")))?;
        Ok(Tensor::Half {
            dtype: self.dtype,
            data,
        })
    }
}

/// The error of a GPU allocation of `what` that the driver refused with `e`, in one sentence:
/// out of memory when the driver says so (the caller can free memory or ask for less), else the
/// device failing.
pub(crate) fn allocation_failed(e: DriverError, what: fmt::Arguments<'_>) -> anyhow::Error {
    allocation_kind(e).error(format!("could not allocate {what} on the GPU: {e:?}"))
}

/// What a refused allocation means: [`ErrorKind::OutOfMemory`] for the driver's
/// `CUDA_ERROR_OUT_OF_MEMORY`, [`ErrorKind::Device`] for anything else.
fn allocation_kind(e: DriverError) -> ErrorKind {
    match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
        _ => ErrorKind::Device,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only meaningful where no driver is installed (CI); on a GPU machine it checks nothing.
    #[test]
    fn no_driver_is_a_sentence_not_a_panic() {
        // SAFETY: probing only.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        let err = CudaBackend::new(0, InputDtype::Bf16)
            .err()
            .unwrap()
            .to_string();
        assert_eq!(err, "no CUDA driver found; use --device cpu");
        let e = CudaBackend::new(0, InputDtype::Bf16).err().unwrap();
        assert_eq!(crate::error::kind_of(&e), Some(ErrorKind::Device));
    }

    /// The kind alone (formatting a `DriverError` asks the driver for its text, so the sentence
    /// is left to the GPU tests).
    #[test]
    fn a_refused_allocation_is_out_of_memory_only_when_the_driver_says_so() {
        assert_eq!(
            allocation_kind(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
            ErrorKind::OutOfMemory
        );
        for other in [
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        ] {
            assert_eq!(allocation_kind(DriverError(other)), ErrorKind::Device);
        }
    }
}
