//! Loading the attention kernels into the device's context: one compiled module per head dim and
//! [`Masking`] (NVRTC through `compile`, with the backend's dtype and [`Tuning`]), its functions
//! looked up and their shared-memory limits raised once, then cached for every later call
//! ([`KernelCache`], which the backend in `device` holds; this file knows nothing of it).

use super::launch::{Masking, Tuning};
use super::{InputDtype, compile, launch};
use anyhow::Result;
use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
use cudarc::driver::{CudaContext, CudaFunction};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

/// What a variant's kernels are compiled for: the device and the backend's choices.
pub(super) struct Target<'a> {
    pub ctx: &'a Arc<CudaContext>,
    pub dtype: InputDtype,
    pub tuning: Tuning,
    /// The device's SMs and compute capability.
    pub sms: usize,
    pub capability: (i32, i32),
}

/// Loaded variants by (head dim, masking).
type Loaded = HashMap<(usize, Masking), Arc<Kernels>>;

/// The loaded kernels by (head dim, masking), each variant compiled and loaded once.
#[derive(Default)]
pub(super) struct KernelCache(Mutex<Loaded>);

impl KernelCache {
    /// The kernels for `head_dim` and `masking`, compiled (or taken from the on-disk cache) and
    /// loaded for the `target` made the first time (every launch asks, so only a miss makes it).
    pub(super) fn get<'t>(
        &self,
        head_dim: usize,
        masking: Masking,
        target: impl FnOnce() -> Target<'t>,
    ) -> Result<Arc<Kernels>> {
        let mut map = self.lock()?;
        if let Some(k) = map.get(&(head_dim, masking)) {
            return Ok(k.clone());
        }
        let kernels = Arc::new(load(head_dim, masking, &target())?);
        map.insert((head_dim, masking), kernels.clone());
        Ok(kernels)
    }

    /// Any variant already loaded: for the elementwise helpers, which depend on neither head
    /// dim nor masking.
    pub(super) fn any(&self) -> Result<Option<Arc<Kernels>>> {
        Ok(self.lock()?.values().next().cloned())
    }

    /// Drops every variant (a new tuning changes their defines); they load again when asked.
    pub(super) fn clear(&self) -> Result<()> {
        self.lock()?.clear();
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Loaded>> {
        self.0
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel cache lock poisoned"))
    }
}

/// Compiles and loads the kernels of `head_dim` and `masking` for `target`, their
/// shared-memory limits raised.
fn load(head_dim: usize, masking: Masking, target: &Target<'_>) -> Result<Kernels> {
    let tuning = &target.tuning;
    let bf16 = target.dtype == InputDtype::Bf16;
    let source = compile::kernel_source(head_dim, bf16, tuning, masking, target.sms);
    let (major, minor) = target.capability;
    let ptx = compile::compile_cached(&source, major, minor)?;
    let module = target
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
    let forward = launch::forward_smem(head_dim, tuning);
    let smem = [
        (&kernels.fwd_final, forward),
        (&kernels.fwd_state, forward),
        (&kernels.bwd_block, launch::backward_smem(head_dim, tuning)),
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
    Ok(kernels)
}
