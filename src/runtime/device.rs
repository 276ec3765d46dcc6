//! One device as a job drives it: the model's primitives (`model::ops::Ops`) and the attention
//! executor's block API (`backend::ModelEdge`) on the same tensors, plus the device's own
//! attention over a whole sequence where it has one faster than the block API. Jobs are
//! generic over this one trait and a communicator, so their bounds say no more than that.

use crate::backend::ModelEdge;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Tensor};
use crate::comm::Buffer;
use crate::model::attention_api::{Attention, WholeSequence};
use crate::model::cpu::Cpu;
use crate::model::cuda::CudaOps;
use crate::model::cuda::whole_sequence::CudaAttention;
use crate::model::ops::Ops;
use crate::shape::{Dims, Mask};
use anyhow::Result;

/// A device: this machine's cores (f32) or one GPU.
pub trait ModelDevice: Sync {
    type Tensor: Buffer + Clone + Send + Sync;
    type Ops: Ops<T = Self::Tensor>;
    type Backend: ModelEdge<Tensor = Self::Tensor>;
    /// The whole-sequence attention of [`ModelDevice::whole_sequence`].
    type Whole<'a>: WholeSequence<Self::Tensor>
    where
        Self: 'a;

    fn ops(&self) -> &Self::Ops;
    fn backend(&self) -> &Self::Backend;

    /// Causal attention over a whole sequence of `rows` tokens held by one worker, where the
    /// device has a path faster than the block API (a GPU's fused kernels); `None`: use the
    /// block API through the executor, as several workers do.
    fn whole_sequence(&self, dims: Dims, rows: usize) -> Result<Option<Self::Whole<'_>>>;

    /// Restarts the device's peak-memory count.
    fn reset_peak_memory(&self) -> Result<()> {
        Ok(())
    }

    /// The most bytes its tensors held at once since the last reset, where the device counts
    /// them (a GPU's allocator); `None` on the CPU.
    fn peak_memory(&self) -> Result<Option<usize>> {
        Ok(None)
    }
}

/// The attention of a device without a whole-sequence fast path: no value exists.
pub enum NoFastPath {}

impl<T> WholeSequence<T> for NoFastPath {
    fn set_mask(&mut self, _: &Mask) -> Result<()> {
        match *self {}
    }
}

impl<T> Attention<T> for NoFastPath {
    fn forward(&mut self, _: &T, _: &T, _: &T) -> Result<(T, T)> {
        match *self {}
    }

    fn backward(&mut self, _: &T, _: &T, _: &T, _: &T, _: &T, _: &T) -> Result<(T, T, T)> {
        match *self {}
    }
}

impl ModelDevice for Cpu<f32> {
    type Tensor = Vec<f32>;
    type Ops = Cpu<f32>;
    type Backend = CpuBackend;
    type Whole<'a> = NoFastPath;

    fn ops(&self) -> &Cpu<f32> {
        self
    }

    fn backend(&self) -> &CpuBackend {
        &CpuBackend
    }

    fn whole_sequence(&self, _: Dims, _: usize) -> Result<Option<NoFastPath>> {
        Ok(None)
    }
}

impl ModelDevice for CudaOps {
    type Tensor = Tensor;
    type Ops = CudaOps;
    type Backend = CudaBackend;
    type Whole<'a> = CudaAttention<'a>;

    fn ops(&self) -> &CudaOps {
        self
    }

    fn backend(&self) -> &CudaBackend {
        CudaOps::backend(self)
    }

    fn whole_sequence(&self, dims: Dims, rows: usize) -> Result<Option<CudaAttention<'_>>> {
        CudaAttention::new(self.backend(), dims, rows).map(Some)
    }

    fn reset_peak_memory(&self) -> Result<()> {
        CudaOps::backend(self).reset_peak_memory()
    }

    fn peak_memory(&self) -> Result<Option<usize>> {
        CudaOps::backend(self).peak_memory().map(Some)
    }
}
