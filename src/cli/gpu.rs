//! The GPU side of `train`, `grads` and `bench train`: opening the device, refusing a run that
//! would not fit before anything is allocated, and the place where the model's CUDA device
//! interface plugs in.
//!
//! INTEGRATION POINT (branch `gpu-ops`, `model::cuda::CudaOps`): `bench`, `gradients` and `train`
//! below end in `not_built_yet()`; each doc comment gives the lines that replace that call. The
//! library functions they call (`train::bench::time_steps_cuda`, `train::gradients_on`,
//! `train::train_on`) exist and are tested on the CPU (`train_on` follows the threaded loop's
//! trajectory bit for bit).

use anyhow::{Result, bail};
use distflash::backend::cuda::{CudaBackend, HEAD_DIMS, InputDtype};
use distflash::model::Checkpoint;
use distflash::model::config::Config;
use distflash::model::cost;
use distflash::train::{Options, StepReport};

/// What to open and check the memory for.
pub struct GpuRun<'a> {
    pub dtype: InputDtype,
    pub config: &'a Config,
    /// Name of the model in messages (a preset, or the file it came from).
    pub model: &'a str,
    pub seq: usize,
    pub checkpoint: Checkpoint,
    /// Whether AdamW's state must fit too (training) or not (gradients, benchmarks).
    pub optimizer: bool,
}

impl GpuRun<'_> {
    /// Opens GPU 0 (one sentence on a machine without a driver) and refuses, with the numbers,
    /// a run whose estimated peak exceeds the free memory. Returns the backend and the estimate.
    pub fn open(&self) -> Result<(CudaBackend, cost::StepMemory)> {
        let backend = CudaBackend::new(0, self.dtype)?;
        let head_dim = self.config.head_dim;
        if !HEAD_DIMS.contains(&head_dim) {
            bail!(
                "{} has head dim {head_dim}, but the CUDA attention kernels support {HEAD_DIMS:?}: use --device cpu",
                self.model
            );
        }
        let need = cost::step_memory(self.config, self.seq, self.checkpoint, self.optimizer);
        let what = format!(
            "{} ({} layers) at {} tokens with checkpoint {}{}",
            self.model,
            self.config.num_hidden_layers,
            self.seq,
            self.checkpoint,
            if self.optimizer { " and AdamW" } else { "" }
        );
        cost::check_fits(&need, backend.memory()?.free, &what)?;
        Ok((backend, need))
    }
}

/// The one answer while the model's CUDA device interface is missing.
fn not_built_yet() -> Result<std::convert::Infallible> {
    bail!("--device cuda for training needs model::cuda (not built yet)")
}

/// Times forward+backward steps on the GPU.
///
/// Integration: replace `not_built_yet()` by
/// ```text
/// let ops = distflash::model::cuda::CudaOps::new(backend)?;
/// distflash::train::bench::time_steps_cuda(&ops, ops.backend(), cfg, seq, checkpoint, warmup, repeats)
/// ```
pub fn bench(
    backend: CudaBackend,
    cfg: &Config,
    seq: usize,
    checkpoint: Checkpoint,
    warmup: usize,
    repeats: usize,
) -> Result<distflash::train::bench::GpuTiming> {
    let _ = (backend, cfg, seq, checkpoint, warmup, repeats);
    match not_built_yet()? {}
}

/// Loss and gradients of one sequence on the GPU.
///
/// Integration: replace `not_built_yet()` by
/// ```text
/// let ops = distflash::model::cuda::CudaOps::new(backend)?;
/// let seq = tokens.len().saturating_sub(1);
/// let mut attn = distflash::train::cuda_attention::CudaAttention::new(ops.backend(), cfg.dims(), seq)?;
/// distflash::train::gradients_on(&ops, &mut attn, cfg, weights, tokens, checkpoint)
/// ```
pub fn gradients(
    backend: CudaBackend,
    cfg: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    checkpoint: Checkpoint,
) -> Result<distflash::train::Gradients> {
    let _ = (backend, cfg, weights, tokens, checkpoint);
    match not_built_yet()? {}
}

/// Trains on one GPU.
///
/// Integration: replace `not_built_yet()` by
/// ```text
/// let ops = distflash::model::cuda::CudaOps::new(backend)?;
/// let mut attn = distflash::train::cuda_attention::CudaAttention::new(ops.backend(), o.config.dims(), o.seq_len)?;
/// distflash::train::train_on(&ops, &mut attn, o, on_step)
/// ```
/// (`train_on` uploads weights and AdamW moments with `Ops::upload` and keeps gradients from
/// `Ops::zeros`; check that the moments come out in the precision `CudaOps::adamw` wants.)
pub fn train(
    backend: CudaBackend,
    o: &Options,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>> {
    let _ = (backend, o, on_step);
    match not_built_yet()? {}
}
