//! Loading the attention kernels into the device's context: one compiled module per head dim and
//! [`Masking`] (NVRTC through `compile`, with the backend's dtype and [`Tuning`]), its functions
//! looked up and their shared-memory limits raised once, then cached for every later call.

use super::launch::Masking;
use super::{CudaBackend, InputDtype, compile, launch};
use anyhow::Result;
use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
use std::sync::Arc;

/// The kernels of one (head dim, dtype, backward warps) variant, loaded into the context.
pub(super) struct Kernels {
    pub(super) fwd_final: CudaFunction,
    pub(super) fwd_state: CudaFunction,
    pub(super) bwd_block: CudaFunction,
    pub(super) fill_f32: CudaFunction,
    pub(super) add_f32: CudaFunction,
    pub(super) finalize_rows: CudaFunction,
    pub(super) merge_rows: CudaFunction,
    pub(super) delta_f32: CudaFunction,
    pub(super) delta_half: CudaFunction,
    pub(super) relayout_half: CudaFunction,
    pub(super) relayout_f32_half: CudaFunction,
}

impl CudaBackend {
    /// Compiles (or takes from the cache) and loads the kernels for `head_dim` and `masking`.
    pub(super) fn kernels(&self, head_dim: usize, masking: Masking) -> Result<Arc<Kernels>> {
        let mut map = self
            .kernels
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel cache lock poisoned"))?;
        if let Some(k) = map.get(&(head_dim, masking)) {
            return Ok(k.clone());
        }
        let tuning = self.tuning(head_dim);
        let bf16 = self.dtype == InputDtype::Bf16;
        let source = compile::kernel_source(head_dim, bf16, &tuning, masking, self.sms);
        let ptx = compile::compile_cached(&source, self.capability.0, self.capability.1)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| anyhow::anyhow!("the CUDA driver rejected the compiled kernels: {e:?}"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| anyhow::anyhow!("kernel {name} missing from the module: {e:?}"))
        };
        let kernels = Kernels {
            fwd_final: f("fwd_final")?,
            fwd_state: f("fwd_state")?,
            bwd_block: f("bwd_block")?,
            fill_f32: f("fill_f32")?,
            add_f32: f("add_f32")?,
            finalize_rows: f("finalize_rows")?,
            merge_rows: f("merge_rows")?,
            delta_f32: f("delta_f32")?,
            delta_half: f("delta_half")?,
            relayout_half: f("relayout_half")?,
            relayout_f32_half: f("relayout_f32_half")?,
        };
        let forward = launch::forward_smem(head_dim, &tuning);
        let smem = [
            (&kernels.fwd_final, forward),
            (&kernels.fwd_state, forward),
            (&kernels.bwd_block, launch::backward_smem(head_dim, &tuning)),
        ];
        for (func, bytes) in smem {
            func.set_attribute(
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| {
                anyhow::anyhow!("device refuses {bytes} bytes of shared memory per block: {e:?}")
            })?;
        }
        let kernels = Arc::new(kernels);
        map.insert((head_dim, masking), kernels.clone());
        Ok(kernels)
    }

    /// Kernels of any head dim and masking already loaded, else the causal head-dim-128
    /// variant: for the elementwise helpers, which depend on neither.
    pub(super) fn any_kernels(&self) -> Result<Arc<Kernels>> {
        let loaded = self
            .kernels
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel cache lock poisoned"))?
            .values()
            .next()
            .cloned();
        match loaded {
            Some(k) => Ok(k),
            None => self.kernels(128, Masking::Causal),
        }
    }
}
