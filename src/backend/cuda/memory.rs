//! GPU memory as a training run needs to see it: what is free before starting (to refuse a run
//! that would not fit) and the most the tensors took at once (to report).
//!
//! Every tensor of the backend comes from the stream-ordered allocator (`cuMemAllocAsync` on the
//! device's current memory pool, which cudarc uses wherever the device supports it), so the
//! pool's high-water mark is the peak of all tensors alive at once. It leaves out the CUDA
//! context and libraries' own workspaces (cuBLAS), which `used` (total − free) includes.

use super::CudaBackend;
use anyhow::{Result, anyhow, bail};
use cudarc::driver::result::{device, mem_pool};
use cudarc::driver::sys::CUmemPool_attribute::{
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_MEMPOOL_ATTR_USED_MEM_HIGH,
};

/// The device's memory in bytes, as the driver reports it.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DeviceMemory {
    pub free: usize,
    pub total: usize,
}

impl CudaBackend {
    /// Free and total memory of this backend's GPU.
    pub fn memory(&self) -> Result<DeviceMemory> {
        let (free, total) = self.ctx.mem_get_info().map_err(|e| {
            anyhow!(
                "could not read the memory of CUDA device {}: {e:?}",
                self.ordinal
            )
        })?;
        Ok(DeviceMemory { free, total })
    }

    /// The most bytes this process's tensors on this GPU held at once since the last
    /// [`Self::reset_peak_memory`].
    pub fn peak_memory(&self) -> Result<usize> {
        let mut high: u64 = 0;
        let pool = self.pool()?;
        // SAFETY: the pool comes from the driver for this context's device; the attribute is a
        // cuuint64_t, which `high` is.
        unsafe {
            mem_pool::get_attribute(
                pool,
                CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut high as *mut u64).cast(),
            )
        }
        .map_err(|e| anyhow!("could not read the GPU memory pool's peak: {e:?}"))?;
        Ok(high as usize)
    }

    /// Starts a new peak: the high-water mark drops to what is in use now.
    pub fn reset_peak_memory(&self) -> Result<()> {
        let mut zero: u64 = 0;
        let pool = self.pool()?;
        // SAFETY: as in `peak_memory`; the driver accepts only zero for this attribute, and
        // reads a cuuint64_t.
        unsafe {
            mem_pool::set_attribute(
                pool,
                CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        }
        .map_err(|e| anyhow!("could not reset the GPU memory pool's peak: {e:?}"))
    }

    /// Makes the pool keep freed memory instead of handing it back to the driver at every
    /// synchronisation (its default threshold is 0). A training step frees and re-allocates
    /// gigabytes of activations; without this each re-allocation after a sync maps fresh pages,
    /// which made a 128 MiB norm output cost milliseconds. The pool's peak is unchanged: what it
    /// keeps is reused, never held twice. Devices without the stream-ordered allocator have
    /// nothing to set.
    pub(super) fn keep_freed_memory(&self) -> Result<()> {
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        let mut keep_all: u64 = u64::MAX;
        let pool = self.pool()?;
        // SAFETY: as in `peak_memory`; the attribute is a cuuint64_t, which `keep_all` is.
        unsafe {
            mem_pool::set_attribute(
                pool,
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep_all as *mut u64).cast(),
            )
        }
        .map_err(|e| anyhow!("could not configure the GPU memory pool: {e:?}"))
    }

    /// The memory pool the stream-ordered allocations of this device come from.
    fn pool(&self) -> Result<cudarc::driver::sys::CUmemoryPool> {
        if !self.ctx.has_async_alloc() {
            bail!(
                "CUDA device {} has no stream-ordered allocator, so its peak memory is not tracked",
                self.ordinal
            );
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| anyhow!("could not use CUDA device {}: {e:?}", self.ordinal))?;
        // SAFETY: the device handle is this live context's own.
        unsafe { device::get_mem_pool(self.ctx.cu_device()) }
            .map_err(|e| anyhow!("could not find the GPU memory pool: {e:?}"))
    }
}
