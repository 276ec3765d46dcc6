//! The CUDA backend: FlashAttention block kernels on one GPU.
//!
//! Kernels are the CUDA C sources in `kernels/`, compiled at run time by NVRTC for the device's
//! compute capability (see `compile`). Two families: FlashAttention-2 style kernels on per-warp
//! `mma.sync` for every GPU from compute capability 8.0, and on H100/H200 (9.0) kernels on
//! Hopper's warpgroup MMA (`wgmma`, 1.5× faster there at head dim 128), chosen by
//! [`Tuning::for_device`]. cudarc loads the driver and NVRTC dynamically, so the
//! crate builds and its tests run on machines without CUDA; [`CudaBackend::new`] checks for the
//! driver first and answers with a sentence instead of a panic.
//!
//! Precision: Q, K, V and dO live on the device in the *input dtype* (bf16 or fp16, chosen at
//! construction); the matrix products run on tensor cores with f32 accumulation. Running
//! statistics, accumulators, partial outputs of the block API and all gradients are f32, so
//! merging partials from several workers loses nothing. The whole-sequence fast path
//! ([`CudaBackend::causal_forward`]) writes O in the input dtype, as the next layer of a model
//! consumes it, and LSE in f32.
//!
//! Two ways in:
//! - the [`Backend`] block API (`forward_block` folds a block into an f32 running state in
//!   place, `backward_block` accumulates f32 gradients with atomics or TMA reductions), which
//!   `exec` drives for distributed schedules;
//! - [`CudaBackend::causal_forward`] / [`CudaBackend::causal_backward`]: a whole causal sequence
//!   (under a mask) in one forward launch (state in registers, O and LSE written once) and one
//!   backward launch (plus the D = rowsum(dO∘O) pre-pass), for single-GPU training and
//!   benchmarks.
//!
//! Shapes: head dims 64, 80, 96, 128, 192 and 256 (others are refused with a sentence; on
//! Hopper the wgmma kernels take all of them, 80 and 96 in zero-padded tiles of 128, 192 and 256
//! with 64-key tiles), bf16 or fp16, any batch, MHA/GQA/MQA, any lengths (tiles past the end are
//! zero-filled and masked).
//!
//! Masks: both ways in take a [`Mask`](crate::shape::Mask) (packed documents, a sliding window,
//! global tokens), which the kernels read as one int per position (`mask`: where each query's
//! local keys start) and the global token count. Key tiles the mask hides wholly are skipped
//! (the forward visits only the global prefix's tiles and those from its first row's start; the
//! backward only the query tiles that see its keys), partly hidden tiles are masked element by
//! element, and plain causal attention passes no array and runs as before. Kernel tile shapes
//! are a [`Tuning`], by default the fastest measured on an H200 for the head dim; numbers and
//! history in `bench/HISTORY.md`.
//!
//! Files, by what each owns: `device` (opening the GPU, its stream, allocation, launching),
//! `tensor` (input dtypes, [`Tensor`], argument checks), `compile` (NVRTC and its cache),
//! `kernels` (loading a compiled module per head dim), `launch` (launch shapes and [`Tuning`]),
//! `mask` (the mask's per-position array on the device, cached per mask),
//! `strides` (where an attention tensor's elements lie: every layout one kernel reads),
//! `tma` (the wgmma forward's tensor maps), `blocks` (the [`Backend`] block API), `sequence` (the
//! whole-sequence fast path), `external` (that path on memory and a stream another library owns:
//! the Python binding's way in), `layout` (sequence-major ↔ head-major relayouts for the
//! executor, and the gradients' rounding), `memory` (free memory and the pool's peak) and
//! `timing` (event-timed medians).
//!
//! [`Backend`]: crate::backend::Backend

mod blocks;
mod compile;
mod device;
mod external;
mod kernels;
mod launch;
mod layout;
mod mask;
mod memory;
mod sequence;
mod strides;
mod tensor;
mod timing;
mod tma;

pub use device::CudaBackend;
pub use external::{BackwardAddrs, ForwardAddrs, check_lent_call};
pub use launch::{HEAD_DIMS, Tuning};
pub use memory::DeviceMemory;
pub use sequence::{SequenceCall, sequence_kv_grads_half};
pub use strides::{CallStrides, Strides};
pub use tensor::{InputDtype, Tensor, master_join, master_split};
pub use timing::{
    AttentionTiming, BlockKind, median_ms, run_times_ms, time_attention, time_block, upload_random,
};

use kernels::Kernels;
use tensor::Kind;

// The model ops (`model::cuda`) compile their kernels through the same NVRTC cache, launch
// their elementwise and per-row kernels with the same shapes and report a refused allocation
// with the same kind (out of memory, or the device).
pub(crate) use compile::compile_cached;
pub(crate) use device::allocation_failed;
pub(crate) use launch::elementwise_config;
