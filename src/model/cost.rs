//! What one training step of a model costs, from its shape alone: the FLOPs that model FLOPs
//! utilisation (MFU) counts, and the GPU memory a step holds at its peak, made before anything
//! is allocated, so a run that would not fit is refused with the numbers instead of dying
//! mid-step. One GPU's estimate is counted from the code (`train::estimate`); the hand count
//! here ([`step_memory`], tested to equal that count) remains the base of a multi-GPU rank's
//! ([`rank_step_memory`]), whose executor buffers the counting device does not run.

use super::config::Config;
use super::{Checkpoint, Offload};
use crate::error::Error;
use anyhow::Result;
use serde::Serialize;
use std::ops::Range;

/// Dense bf16 (and fp16) tensor-core peak of one H200 (SXM), TFLOP/s, by NVIDIA's datasheet:
/// the denominator of MFU on that card.
pub const H200_BF16_PEAK_TFLOPS: f64 = 989.0;

/// Bytes a GPU step needs beside its tensors, which the estimate adds to them: cuBLAS's handle
/// and workspace, the kernel modules (NVRTC's and the libraries', loaded lazily) and what the
/// memory pool maps but no tensor uses (fragmentation). All of it is taken after `free` is read
/// (`cli::gpu::GpuRun::open`; the CUDA context exists before, so `free` already excludes it), and
/// none of it is a tensor, so the measured peak (the pool's high-water mark of tensors,
/// `CudaBackend::peak_memory`) leaves it out: a run's estimate is its measured peak plus exactly
/// this. Its size is an allowance, not a measurement.
pub(crate) const RESERVE_BYTES: f64 = 1.5 * (1u64 << 30) as f64;

/// Parameters that take part in matrix products: every linear layer and the output projection
/// (not the input embedding, a lookup, nor the norm gains).
pub fn matmul_params(c: &Config) -> f64 {
    let (d, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let per_layer = d * c.q_width() as f64 * 2.0 + d * c.kv_width() as f64 * 2.0 + 3.0 * d * i;
    c.num_hidden_layers as f64 * per_layer + c.vocab_size as f64 * d
}

/// Model FLOPs of one forward and backward over a sequence of `seq` tokens (batch 1), the PaLM
/// formula (Chowdhery et al. 2022, appendix B) with its attention term halved for the causal
/// mask:
///
///   6 · N · T  +  6 · L · T² · H · d
///
/// N = [`matmul_params`], T = `seq`, L layers, H query heads of dim d. Recomputation
/// (checkpointing) is not counted: this is the work the model needs, so MFU compares runs of
/// different policies and implementations on equal terms.
pub fn step_flops(c: &Config, seq: usize) -> f64 {
    let t = seq as f64;
    let attention = 6.0 * c.num_hidden_layers as f64 * t * t * c.q_width() as f64;
    6.0 * matmul_params(c) * t + attention
}

/// The bf16 rates a step's parts reach on an H200, measured (`bench/RESULTS.md`): cuBLAS's
/// GEMMs of the step's linear shapes, and distflash's attention forward and backward under
/// sustained load; HBM's bandwidth for the update. The ideal step is counted at them.
pub const H200_GEMM_TFLOPS: f64 = 700.0;
pub const H200_ATTENTION_TFLOPS: f64 = 600.0;
pub const H200_HBM_TBPS: f64 = 4.8;

/// The step a GPU could take at the measured rates ([`H200_GEMM_TFLOPS`] and the rest): every
/// matrix product at the GEMM rate, forward and backward, plus the layers' forward again where
/// the checkpoint re-runs it (`layer` and `remat`: the linears; `layer`: attention's forward
/// too; the output projection is never re-run); attention's kernels at their rate (the
/// backward 2.5 times the forward's FLOPs, as FlashAttention counts them; causal: half the
/// square); and, with the optimizer, AdamW's pass over the state at HBM's bandwidth (f32
/// gradients read, both f32 moments and the f32 master read and written, 16-bit weights
/// written: 30 bytes a parameter). Memory-bound ops between them (norms, activations, the loss) are left out: the
/// ideal is what the step's arithmetic costs, and a measured step's distance from it is what
/// fusion and overlap can still win.
pub fn ideal_step_secs(c: &Config, seq: usize, checkpoint: Checkpoint, optimizer: bool) -> f64 {
    let t = seq as f64;
    let head = c.vocab_size as f64 * c.hidden_size as f64;
    let layers = matmul_params(c) - head;
    let rerun = match checkpoint {
        Checkpoint::None => 0.0,
        Checkpoint::Layer | Checkpoint::Remat => 1.0,
    };
    let gemm = 2.0 * t * (3.0 * head + (3.0 + rerun) * layers);
    let forward = 2.0 * c.num_hidden_layers as f64 * t * t * c.q_width() as f64;
    let attention_forwards = if checkpoint == Checkpoint::Layer {
        2.0
    } else {
        1.0
    };
    let attention = forward * (attention_forwards + 2.5);
    let update = if optimizer {
        30.0 * super::weights::parameters(c) as f64 / (H200_HBM_TBPS * 1e12)
    } else {
        0.0
    };
    gemm / (H200_GEMM_TFLOPS * 1e12) + attention / (H200_ATTENTION_TFLOPS * 1e12) + update
}

/// Bytes of one element: 16-bit weights and activations (and the attention inputs a GPU rank
/// sends), f32 statistics and gradients.
pub use super::float::HALF_BYTES;
const HALF: f64 = HALF_BYTES as f64;
const F32: f64 = 4.0;

/// Logits (f32) that may exist at once in the loss: 64 Mi elements, 256 MiB (plus half that for
/// their 16-bit gradient), so a vocabulary of 32000 is processed 2097 rows at a time. A memory
/// budget, so it lives with the estimate that counts it; the CUDA loss obeys it.
const LOSS_LOGITS: usize = 1 << 26;

/// Rows per loss chunk for `vocab` logits per row (at least one).
pub(crate) fn loss_chunk_rows(vocab: usize) -> usize {
    (LOSS_LOGITS / vocab.max(1)).max(1)
}

/// The row ranges the loss processes one after another.
pub(crate) fn loss_chunks(rows: usize, vocab: usize) -> impl Iterator<Item = Range<usize>> {
    let step = loss_chunk_rows(vocab);
    (0..rows)
        .step_by(step)
        .map(move |r| r..(r + step).min(rows))
}

/// Estimated GPU bytes of a single-GPU step, by what holds them.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct StepMemory {
    /// 16-bit weights.
    pub weights: f64,
    /// f32 weight gradients.
    pub grads: f64,
    /// AdamW's state (0 without an optimizer step): its two f32 moments and the f32 master
    /// copy of the 16-bit weights, which the update applies to (`model::ops::AdamState`).
    pub optimizer: f64,
    /// What the checkpoint policy keeps of every layer between forward and backward.
    pub kept: f64,
    /// Everything else alive at the peak: the last layer's activations its backward recomputes,
    /// its f32 gradient accumulators, the attention backward's buffers (or the MLP's, or the
    /// loss's, whichever phase holds most), the loss's tensors that outlive it, and the reserve.
    pub working: f64,
    /// Under `--offload optimizer`, the state of the tensors being updated, streamed through
    /// the device ([`StepMemory::offloaded`]). They exist only during the update, after the
    /// backward has freed the kept activations and the working set, so the peak holds the
    /// larger of the two phases.
    pub staging: f64,
    /// Pinned host memory, not the GPU's: the offloaded checkpoints ([`StepMemory::offloaded`]).
    pub pinned_host: f64,
    /// Pinned host memory, not the GPU's: AdamW's state under `--offload optimizer`.
    pub pinned_optimizer: f64,
}

impl StepMemory {
    /// The peak: the state, and the larger of the backward's tensors and the update's staging
    /// (each phase with the reserve, which the working set holds).
    pub fn total(&self) -> f64 {
        let phase = (self.kept + self.working).max(self.staging + RESERVE_BYTES);
        self.weights + self.grads + self.optimizer + phase
    }

    /// All pinned host memory the step holds: offloaded checkpoints and moments.
    pub fn pinned(&self) -> f64 {
        self.pinned_host + self.pinned_optimizer
    }

    /// The same step of a worker holding 1/`optimizer_shards` of AdamW's moments (ZeRO-1 and 2:
    /// ZeRO-2's gradients are whole until the backward ends, so their peak stays) and
    /// 1/`weight_shards` of the weights and their gradients (ZeRO-3). A ZeRO-3 worker also holds,
    /// for a while, one part of the model whole: a layer's (or the final norm's and output
    /// projection's) 16-bit weights, gathered, and that part's f32 gradients; and, while one of
    /// its tensors is gathered or reduce-scattered, two f32-sized copies of it (the pieces and
    /// NCCL's padded buffer). The larger part is counted beside the step's peak.
    pub fn sharded(mut self, c: &Config, optimizer_shards: usize, weight_shards: usize) -> Self {
        self.optimizer /= optimizer_shards.max(1) as f64;
        if weight_shards > 1 {
            let specs = super::weights::specs(c);
            let sizes: Vec<f64> = specs.iter().map(|s| s.elements() as f64).collect();
            // `specs` order: the embedding, each layer's tensors (9, or more with biases), the
            // final norm, the output projection (absent when tied to the embedding, which then
            // is it).
            let per_layer = (sizes.len() - 2 - usize::from(!c.tie_word_embeddings))
                / c.num_hidden_layers.max(1);
            let (layer, n) = (&sizes[1..1 + per_layer], sizes.len());
            let head = match c.tie_word_embeddings {
                true => [sizes[n - 1], sizes[0]],
                false => [sizes[n - 2], sizes[n - 1]],
            };
            let whole = |part: &[f64]| {
                let largest = part.iter().copied().fold(0.0, f64::max);
                (HALF + F32) * part.iter().sum::<f64>() + 2.0 * F32 * largest
            };
            let shards = weight_shards as f64;
            self.weights /= shards;
            self.grads /= shards;
            self.working += whole(layer).max(whole(&head));
        }
        self
    }

    /// The same step with each layer's checkpoint offloaded (`--offload activations`,
    /// `model::offload`): every layer's in pinned host memory, and on the GPU at most two
    /// layers' at once (in the backward, the layer computing and the one being fetched for the
    /// next; in the forward, the one being stashed and the one being made).
    ///
    /// With the moments offloaded (`--offload optimizer`, `train::moments`), all of them (this
    /// worker's shard, of `optimizer_shards`) wait in pinned host memory, and the update streams
    /// them through the device a tensor at a time: tensor i's moments are updated while tensor
    /// i + 1's are fetched, so the device holds two consecutive tensors' (both f32 moments of
    /// each, and their masters) at once ([`moment_staging_elements`]).
    pub fn offloaded(mut self, c: &Config, offload: Offload, optimizer_shards: usize) -> Self {
        if offload.activations() && c.num_hidden_layers > 0 {
            let layers = c.num_hidden_layers as f64;
            self.pinned_host = self.kept;
            self.kept *= layers.min(2.0) / layers;
        }
        if offload.optimizer() && self.optimizer > 0.0 {
            self.pinned_optimizer = self.optimizer;
            self.optimizer = 0.0;
            self.staging = STATE_TENSORS * F32 * moment_staging_elements(c, optimizer_shards);
        }
        self
    }

    /// "about 51.2 GiB (weights 12.6, gradients 25.1, ...)": the total and its parts, for
    /// messages; offloaded, the pinned host memory beside it.
    pub fn describe(&self) -> String {
        let staging = if self.staging > 0.0 {
            format!(", optimizer staging {:.1}", gib(self.staging))
        } else {
            String::new()
        };
        let host = if self.pinned() > 0.0 {
            format!("; plus {:.1} GiB of pinned host memory", gib(self.pinned()))
        } else {
            String::new()
        };
        format!(
            "about {:.1} GiB (weights {:.1}, gradients {:.1}, optimizer {:.1}, kept activations {:.1}, working set {:.1}{staging}{host})",
            gib(self.total()),
            gib(self.weights),
            gib(self.grads),
            gib(self.optimizer),
            gib(self.kept),
            gib(self.working)
        )
    }
}

/// The f32 tensors of AdamW's state a GPU keeps for each parameter tensor: the two moments and
/// the master of the 16-bit weights.
const STATE_TENSORS: f64 = 3.0;

/// Elements of the state an offloaded update holds on the device at once: the most of two
/// consecutive tensors' pieces (`specs` order, the order the update streams them), each piece a
/// tensor's share over `optimizer_shards` workers (rounded up: the shard rule's largest).
/// One tensor's worth; the state has [`STATE_TENSORS`].
pub fn moment_staging_elements(c: &Config, optimizer_shards: usize) -> f64 {
    let pieces: Vec<f64> = super::weights::specs(c)
        .iter()
        .map(|s| s.elements().div_ceil(optimizer_shards.max(1)) as f64)
        .collect();
    let pairs = pieces.windows(2).map(|w| w[0] + w[1]);
    pairs.fold(pieces.first().copied().unwrap_or(0.0), f64::max)
}

/// The peak GPU memory of one step over `seq` tokens under `policy`, with the optimizer's state
/// when `optimizer` (training) and without it (gradients, benchmarks).
///
/// Every term is a set of tensors the CUDA model (`model::cuda::CudaOps`, attention by
/// `train::cuda_attention::CudaAttention`) allocates, at its real element size: `linear`,
/// `rmsnorm`, `swiglu(_backward)`, `embed` and the attention's relayouts make 16-bit tensors;
/// `zeros` (the accumulators), rmsnorm's rstd, LSE and the attention backward's dQ, dK, dV are
/// f32. Buffers are freed when dropped (stream-ordered), so a tensor lives until the end of the
/// Rust scope that owns it.
///
/// The peak is in the backward of the last layer, the first to run backward: every other layer
/// still holds what it kept, and this one holds its kept tensors again as part of its full set
/// of activations. The forward holds less (no gradients in flight), as do later layers' backwards
/// (one layer fewer kept). Inside that backward the widest moment is the end of the attention
/// backward (at long sequences) or an MLP block's backward (short ones); the loss, before it, is
/// counted too. This sum is the counted step's (`train::estimate`'s tests pin it to the byte),
/// and adds only [`RESERVE_BYTES`].
pub fn step_memory(c: &Config, seq: usize, policy: Checkpoint, optimizer: bool) -> StepMemory {
    step_memory_with(c, seq, policy, optimizer, AttentionPath::WholeSequence)
}

/// Which attention a step's backward runs, for its widest moment.
#[derive(Clone, Copy, Debug, PartialEq)]
enum AttentionPath {
    /// One GPU's whole sequence (`model::cuda::whole_sequence::CudaAttention`), read in place.
    WholeSequence,
    /// A rank's executor (`train::model_attention::Distributed`), on head-major copies, with this
    /// many bytes more (D, the communication buffers).
    Distributed(f64),
}

/// What one rank of a sequence-parallel run holds besides a single-GPU step over its rows, as
/// plain figures its caller derives from the partition (`sim::gpu_step_memory`): the cost model
/// knows the model's tensors, not how attention is distributed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankShare {
    /// Rows the rank owns.
    pub rows: usize,
    /// Chunks those rows come in (two under zigzag: a head and a tail).
    pub chunks: usize,
    /// The most bytes of the executor's communication buffers the rank holds at once in the
    /// backward (`plan::volume::backward_buffers`, inputs at [`HALF_BYTES`]).
    pub buffer_bytes: usize,
}

/// The peak GPU memory of one rank of a multi-GPU run: the single-GPU step over the rank's rows
/// ([`step_memory`]), whose attention backward, run by the executor
/// (`train::model_attention::Distributed`), also holds
///
/// - D for its rows (f32, one a row and head: `exec::Saved::delta`), alive to the end;
/// - while the executor runs, its communication buffers (`share.buffer_bytes`: fetched inputs,
///   in-flight fetches, returned and returning gradients), beside the kernels' moment that is
///   the single-GPU count's widest;
/// - with two chunks (zigzag), the joined copy of one of the 16-bit relayouts of dQ, dK and dV
///   that come after the buffers are gone (the larger of the two counts).
pub fn rank_step_memory(
    c: &Config,
    share: &RankShare,
    policy: Checkpoint,
    optimizer: bool,
) -> StepMemory {
    let (qw, h) = (c.q_width() as f64, c.num_attention_heads as f64);
    let t = share.rows as f64;
    let join = if share.chunks > 1 { t * HALF * qw } else { 0.0 };
    let extra = t * F32 * h + (share.buffer_bytes as f64).max(join);
    step_memory_with(
        c,
        share.rows,
        policy,
        optimizer,
        AttentionPath::Distributed(extra),
    )
}

/// [`step_memory`] with the attention backward's widest moment of `path`.
fn step_memory_with(
    c: &Config,
    seq: usize,
    policy: Checkpoint,
    optimizer: bool,
    path: AttentionPath,
) -> StepMemory {
    let t = seq as f64;
    let params = super::weights::parameters(c) as f64;
    let (d, i, v) = (
        c.hidden_size as f64,
        c.intermediate_size as f64,
        c.vocab_size as f64,
    );
    let (qw, kw, h) = (
        c.q_width() as f64,
        c.kv_width() as f64,
        c.num_attention_heads as f64,
    );
    // Every activation of one layer up to the MLP (`Layer::acts`): x, h1, x2, h2 (16-bit,
    // d wide), q and o (16-bit, q_width), k and v (16-bit, kv_width), rstd1 and rstd2 (f32, one a
    // row) and LSE (f32, one a row and head, `causal_forward`); where each head's q and k are
    // normed (Qwen3), q and k before their norms (16-bit) and the norms' rstd (f32, one a row
    // and head). The MLP's g, u, m (16-bit) exist one block of rows at a time
    // (`mlp_block_rows`) unless the policy keeps them all.
    let kvh = c.num_key_value_heads as f64;
    let normed_heads = match c.family().qk_norm {
        true => HALF * (qw + kw) + F32 * (h + kvh),
        false => 0.0,
    };
    let acts = t * (HALF * (4.0 * d + 2.0 * qw + 2.0 * kw) + F32 * (2.0 + h) + normed_heads);
    let mlp_all = t * HALF * 3.0 * i;
    let kept_per_layer = match policy {
        Checkpoint::None => acts + mlp_all,
        Checkpoint::Remat => t * (HALF * (d + qw) + F32 * h),
        Checkpoint::Layer => t * HALF * d,
    };
    // What the last layer's backward holds of its activations beyond what it kept: `acts`
    // recomputes all of them from x (and, under remat, the saved o and LSE).
    let recomputed = match policy {
        Checkpoint::None => 0.0,
        _ => acts - kept_per_layer,
    };
    // `forward_backward`'s own tensors in the loss's part: the last layer's output x (16-bit)
    // and the loss's dh (f32, `cross_entropy`), both freed once the loss's backward has read
    // them; the final norm's h (16-bit) and rstd (f32) live only in that part too.
    let after_loss = t * (HALF * d + F32 * d);
    // `Layer::backward`'s f32 d-wide gradients: dout (the `zeros` of `forward_backward` for the
    // last layer), which becomes dx2, and the MLP's dh2 (`zeros` in `mlp_backward`), freed
    // before the attention's backward; so two in the MLP's part and one in the attention's.
    let mlp_grads = t * F32 * 2.0 * d;
    let attention_grads = t * F32 * d;
    // Freed before the attention's backward: what only the MLP's part reads, x2 and h2 (16-bit)
    // and rstd2 (f32), and under `none` the MLP activations the layer kept.
    let mlp_only = t * (HALF * 2.0 * d + F32)
        + if policy == Checkpoint::None {
            mlp_all
        } else {
            0.0
        };
    // The attention backward at its widest, as the kernel runs: dO in sequence order
    // (`activation_zeros`, 16-bit, filled by Wo's `linear_backward`), and then
    // - on one GPU (`CudaAttention::backward`, tensors read in place): the widest of its
    //   moments (`model::cuda::whole_sequence::moments`: as the kernel runs, then the roundings of
    //   the f32 gradients), its returned 16-bit gradients included;
    // - on a rank (the executor): head-major 16-bit Q, K, V, O and dO, a copy of LSE (f32), D
    //   and head-major f32 dQ, dK, dV, and the rank's extra; their 16-bit relayouts come after
    //   the inputs are freed, and that moment is narrower.
    let attention = match path {
        AttentionPath::WholeSequence => {
            t * HALF * qw
                + super::cuda::whole_sequence::widest_backward(&c.dims(), seq, false) as f64
        }
        AttentionPath::Distributed(extra) => {
            t * (HALF * qw + HALF * (3.0 * qw + 2.0 * kw) + 2.0 * F32 * h + F32 * (qw + 2.0 * kw))
                + extra
        }
    };
    // One MLP block's backward (`mlp_backward`) at its widest, once `swiglu_backward` has run:
    // g, u, m recomputed (16-bit) unless kept, dm (`zeros`, f32), dg and du (16-bit); and, when
    // the rows take several blocks, the block's rows of h2 (16-bit) and of dout (f32) and its
    // part of dh2 (`zeros`, f32). One block is the whole of h2, dout and dh2: no copies.
    let block = t.min(super::layer::mlp_block_rows(c) as f64);
    let recomputed_mlp = match policy {
        Checkpoint::None => 0.0,
        _ => block * HALF * 3.0 * i,
    };
    let block_rows = if t > block {
        block * d * (HALF + 2.0 * F32)
    } else {
        0.0
    };
    let mlp = recomputed_mlp + block * i * (F32 + 2.0 * HALF) + block_rows;
    // The loss (`cross_entropy`) while every layer still holds what it kept: the final norm's
    // h (16-bit) and rstd (f32), the target ids, per-row loss and argmax (4 bytes each a row)
    // and one chunk's f32 logits and 16-bit dlogits, beside `after_loss`.
    let chunk = t.min(loss_chunk_rows(c.vocab_size) as f64);
    let loss = t * (HALF * d + F32) + t * 3.0 * 4.0 + chunk * v * (F32 + HALF);
    // After the loss, as its backward starts: h and rstd still held, and the head's dx (f32,
    // `zeros`) beside dh.
    let loss_grad = t * (HALF * d + F32 + F32 * d);
    let backward = recomputed + (mlp_grads + mlp).max(attention_grads + attention - mlp_only);
    // The rotary table (`CudaOps::rope_table`: head_dim / 2 f32), kept for the run.
    let rope = F32 * (c.head_dim / 2) as f64;
    StepMemory {
        weights: HALF * params,
        grads: F32 * params,
        optimizer: if optimizer {
            STATE_TENSORS * F32 * params
        } else {
            0.0
        },
        kept: c.num_hidden_layers as f64 * kept_per_layer,
        working: (after_loss + loss.max(loss_grad)).max(backward) + rope + RESERVE_BYTES,
        staging: 0.0,
        pinned_host: 0.0,
        pinned_optimizer: 0.0,
    }
}

pub fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// Refuses, in one sentence with the numbers, a step whose estimate exceeds `free` bytes.
/// `what` names the run ("llama2-7b, 32 layers, 16384 tokens, checkpoint remat").
pub fn check_fits(m: &StepMemory, free: usize, what: &str) -> Result<()> {
    if m.total() <= free as f64 {
        return Ok(());
    }
    Err(Error::out_of_memory(format!(
        "{what} would not fit on this GPU: it needs {} but {:.1} GiB is free; use fewer layers, a shorter sequence, a leaner checkpoint policy (layer keeps least) or more GPUs",
        m.describe(),
        gib(free as f64)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama7b(layers: usize) -> Config {
        Config {
            num_hidden_layers: layers,
            ..Config::preset("llama2-7b").unwrap()
        }
    }

    /// The ideal step of llama2-7b's first 16 layers at 64K tokens under remat, by hand: each
    /// layer's 202,375,168 matmul parameters run forward, backward (twice the forward) and
    /// forward again, the output projection's 131,072,000 three times: 2·T·(3·131.1M + 4·3.238G)
    /// = 1.749 PFLOP at 700 TFLOP/s, 2.499 s; attention's forward 2·16·T²·4096 = 0.563 PFLOP and
    /// its backward 2.5 times that, 1.970 PFLOP at 600 TFLOP/s, 3.284 s.
    #[test]
    fn the_ideal_step_counts_each_part_at_its_rate() {
        let c = llama7b(16);
        let t = 65536;
        let remat = ideal_step_secs(&c, t, Checkpoint::Remat, false);
        assert!((remat - 5.783).abs() < 2e-3, "{remat}");
        // `none` runs the layers' linears once less; `layer` attention's forward once more.
        let linears = 2.0 * t as f64 * (matmul_params(&c) - 32000.0 * 4096.0) / 700e12;
        let none = ideal_step_secs(&c, t, Checkpoint::None, false);
        assert!((remat - none - linears).abs() < 1e-9, "{none}");
        let attention_forward = 2.0 * 16.0 * (t as f64).powi(2) * 4096.0 / 600e12;
        let layer = ideal_step_secs(&c, t, Checkpoint::Layer, false);
        assert!((layer - remat - attention_forward).abs() < 1e-9, "{layer}");
        // The update reads and writes 30 bytes a parameter at 4.8 TB/s.
        let update = ideal_step_secs(&c, t, Checkpoint::Remat, true) - remat;
        let params = super::super::weights::parameters(&c) as f64;
        assert!((update - 30.0 * params / 4.8e12).abs() < 1e-12, "{update}");
    }

    #[test]
    fn flops_follow_the_palm_formula() {
        let c = llama7b(32);
        // 32 · (4·4096² + 3·4096·11008) + 32000·4096 matmul parameters.
        assert_eq!(matmul_params(&c), 6_607_077_376.0);
        let t = 16384.0;
        let want = 6.0 * 6_607_077_376.0 * t + 6.0 * 32.0 * t * t * 4096.0;
        assert_eq!(step_flops(&c, 16384), want);
        // The attention term is a fifth of the work at 16K and grows with the square.
        let share = |n: usize| 1.0 - 6.0 * matmul_params(&c) * n as f64 / step_flops(&c, n);
        assert!((0.2..0.3).contains(&share(16384)), "{}", share(16384));
        assert!(share(131072) > 0.65);
        // GQA shrinks K and V projections only.
        let gqa = Config::preset("llama-7b-gqa").unwrap();
        assert!(matmul_params(&gqa) < matmul_params(&c));
        assert_eq!(
            step_flops(&gqa, 1) - 6.0 * matmul_params(&gqa),
            6.0 * 32.0 * 4096.0
        );
    }

    #[test]
    fn memory_orders_policies_and_counts_the_optimizer() {
        let c = llama7b(32);
        let m = |p| step_memory(&c, 16384, p, false);
        let (none, remat, layer) = (
            m(Checkpoint::None),
            m(Checkpoint::Remat),
            m(Checkpoint::Layer),
        );
        assert!(none.kept > remat.kept && remat.kept > layer.kept);
        // The last layer's backward recomputes what remat kept of it and layer did not (o and
        // LSE): the working sets differ by exactly that, the totals by that for the other 31.
        let o_and_lse = 16384.0 * (2.0 * 4096.0 + 4.0 * 32.0);
        assert_eq!(layer.working - remat.working, o_and_lse);
        assert_eq!(remat.total() - layer.total(), 31.0 * o_and_lse);
        // 6.74B parameters: 12.6 GiB of bf16 weights, twice that of f32 gradients.
        assert!(
            (gib(remat.weights) - 12.55).abs() < 0.05,
            "{}",
            gib(remat.weights)
        );
        assert_eq!(remat.grads, 2.0 * remat.weights);
        let train = step_memory(&c, 16384, Checkpoint::Remat, true);
        // Two f32 moments and the f32 master: six times the 16-bit weights.
        assert_eq!(train.optimizer, 6.0 * remat.weights);
        // Remat keeps x and O (16-bit) and LSE per layer: 32 · 16384 · (2·8192 + 4·32) bytes.
        assert_eq!(remat.kept, 32.0 * 16384.0 * (2.0 * 8192.0 + 128.0));
        // HF with checkpointing fits 128K tokens of the whole 7B in 103 GiB; we needed 102.7
        // (measured), since the layer's backward frees what it has read early 91.2 with the
        // reserve, and since attention reads the model's tensors in place (no head-major
        // copies, 16-bit dO, dK and dV) 84.2.
        let long = step_memory(&c, 131072, Checkpoint::Layer, false);
        let est = gib(long.total());
        assert!((84.0..84.5).contains(&est), "{est}");
    }

    #[test]
    fn offload_keeps_two_layers_checkpoints_on_the_gpu_and_pins_all() {
        let c = llama7b(32);
        for policy in [Checkpoint::None, Checkpoint::Remat, Checkpoint::Layer] {
            let kept = step_memory(&c, 131072, policy, true);
            assert_eq!(kept.offloaded(&c, Offload::NONE, 1).total(), kept.total());
            let off = kept.offloaded(&c, Offload::ACTIVATIONS, 1);
            assert_eq!(off.pinned_host, kept.kept);
            assert_eq!(off.kept * 16.0, kept.kept, "{policy}: 2 of 32 layers");
            let others = kept.weights + kept.grads + kept.optimizer + kept.working;
            assert_eq!(
                off.weights + off.grads + off.optimizer + off.working,
                others
            );
            assert!(off.describe().ends_with(" GiB of pinned host memory)"));
            assert!(!kept.describe().contains("pinned"));
        }
        // llama2-7b at 128K under remat: 64.5 GiB of checkpoints become 4.0 on the GPU.
        let off = step_memory(&c, 131072, Checkpoint::Remat, false).offloaded(
            &c,
            Offload::ACTIVATIONS,
            1,
        );
        assert!((gib(off.kept) - 4.03).abs() < 0.01, "{}", gib(off.kept));
        assert!(
            (gib(off.pinned_host) - 64.5).abs() < 0.1,
            "{}",
            gib(off.pinned_host)
        );
        // One layer keeps its one checkpoint: nothing to gain, nothing counted twice.
        let one = llama7b(1);
        let m = step_memory(&one, 4096, Checkpoint::Remat, false);
        assert_eq!(m.offloaded(&one, Offload::ACTIVATIONS, 1).kept, m.kept);
    }

    /// `--offload optimizer`: the state leaves the GPU for pinned host memory, and the update
    /// stages two consecutive tensors' (both moments and the master, f32) on it; that phase comes after the
    /// backward has freed its tensors, so only the larger of the two counts.
    #[test]
    fn offloaded_moments_are_pinned_and_two_tensors_staged() {
        let c = llama7b(32);
        let params = super::super::weights::parameters(&c) as f64;
        let plain = step_memory(&c, 262144, Checkpoint::Remat, true);
        for offload in [Offload::OPTIMIZER, Offload::ALL] {
            let off = plain.offloaded(&c, offload, 1);
            assert_eq!(off.optimizer, 0.0, "{offload}");
            assert_eq!(off.pinned_optimizer, 3.0 * F32 * params, "{offload}");
            assert_eq!(off.pinned_optimizer, plain.optimizer, "{offload}");
            // The largest neighbours: the embedding (32000 x 4096) and layer 0's input norm.
            let staged = 3.0 * F32 * (32000.0 * 4096.0 + 4096.0);
            assert_eq!(off.staging, staged, "{offload}");
            assert!(off.staging < off.kept + off.working);
            let activations = match offload.activations() {
                true => Offload::ACTIVATIONS,
                false => Offload::NONE,
            };
            let kept = plain.offloaded(&c, activations, 1);
            assert_eq!(off.total(), kept.total() - plain.optimizer);
            assert!(
                off.describe().contains("optimizer staging 1.5"),
                "{}",
                off.describe()
            );
            assert!(off.describe().contains("pinned host memory"));
        }
        // llama2-7b at 256K with both offloaded: the 75.3 GiB of state and the 128.9 GiB of
        // checkpoints leave the GPU; about 62 GiB stays.
        let both = plain.offloaded(&c, Offload::ALL, 1);
        assert!((gib(both.pinned_optimizer) - 75.3).abs() < 0.1);
        assert!((gib(both.pinned()) - gib(both.pinned_host) - 75.3).abs() < 0.1);
        // Sharded over 4 workers, each stages a quarter of each tensor (rounded up).
        let four = step_memory(&c, 262144, Checkpoint::Remat, true)
            .sharded(&c, 4, 1)
            .offloaded(&c, Offload::OPTIMIZER, 4);
        assert_eq!(four.pinned_optimizer * 4.0, plain.optimizer);
        assert_eq!(four.staging, 3.0 * F32 * (32000.0 * 1024.0 + 1024.0));
        // Without an optimizer step there is nothing to move.
        let grads = step_memory(&c, 4096, Checkpoint::Remat, false);
        let moved = grads.offloaded(&c, Offload::OPTIMIZER, 1);
        assert_eq!((moved.staging, moved.pinned_optimizer), (0.0, 0.0));
        // At a short sequence the staging can outgrow the backward's tensors: the larger counts.
        let short = step_memory(&llama7b(1), 16, Checkpoint::Remat, true).offloaded(
            &llama7b(1),
            Offload::OPTIMIZER,
            1,
        );
        assert!(short.staging > short.kept + short.working - RESERVE_BYTES);
        assert_eq!(
            short.total(),
            short.weights + short.grads + short.staging + RESERVE_BYTES
        );
    }

    #[test]
    fn short_sequences_peak_in_the_mlp_and_the_estimate_grows_with_them() {
        let c = llama7b(32);
        // Below one MLP block (6096 rows) an MLP block's backward is wider than the attention's:
        // 14 · 11008 bytes a row (g, u, m, dg, du 16-bit; dm f32) against 16 · 4096 · 2 + 4 · 32.
        let (d, i) = (4096.0, 11008.0);
        assert!(14.0 * i > 32.0 * d + 128.0);
        let at = |seq: usize| step_memory(&c, seq, Checkpoint::Remat, false);
        // A row more adds: h1, q, k, v, x2, h2 (16-bit), rstd1, rstd2 (f32) recomputed; dout
        // and dh2 (f32); and the MLP's row (the loss's x and dh are freed before the layers'
        // backwards).
        let row = (12.0 * d + 8.0) + 8.0 * d + 14.0 * i;
        assert_eq!(at(4097).working - at(4096).working, row);
        let mut last = 0.0;
        for seq in [1, 100, 2097, 4096, 6096, 6097, 9000, 16384, 1 << 20] {
            for policy in [Checkpoint::None, Checkpoint::Remat, Checkpoint::Layer] {
                let m = step_memory(&c, seq, policy, false);
                assert!(m.working > RESERVE_BYTES, "{seq} {policy}");
            }
            let total = at(seq).total();
            assert!(total > last, "{seq}");
            last = total;
        }
    }

    #[test]
    fn loss_chunks_cover_every_row_once_within_the_budget() {
        assert_eq!(loss_chunk_rows(32000), 2097);
        for (rows, vocab) in [
            (0, 32000),
            (1, 32000),
            (5000, 32000),
            (4194, 32000),
            (300, 256),
        ] {
            let chunks: Vec<_> = loss_chunks(rows, vocab).collect();
            let mut next = 0;
            for c in &chunks {
                assert_eq!(c.start, next);
                assert!(!c.is_empty() && c.len() * vocab <= LOSS_LOGITS);
                next = c.end;
            }
            assert_eq!(next, rows);
        }
        assert_eq!(loss_chunks(5000, 32000).count(), 3);
        assert_eq!(loss_chunks(4194, 32000).count(), 2);
        // A vocabulary larger than the budget still makes progress, a row at a time.
        assert_eq!(loss_chunk_rows(LOSS_LOGITS * 2), 1);
    }

    #[test]
    fn refusal_is_one_sentence_with_numbers() {
        let c = llama7b(32);
        let m = step_memory(&c, 1 << 20, Checkpoint::Remat, false);
        let err = check_fits(&m, 140 << 30, "llama2-7b at 1048576 tokens")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "llama2-7b at 1048576 tokens would not fit on this GPU: it needs about"
            ),
            "{err}"
        );
        assert!(err.contains("but 140.0 GiB is free"), "{err}");
        assert!(!err.contains('\n'));
        let small = step_memory(&llama7b(2), 4096, Checkpoint::Remat, false);
        assert!(check_fits(&small, 140 << 30, "x").is_ok());
    }

    #[test]
    fn a_step_that_would_not_fit_is_out_of_memory() {
        use crate::error::{ErrorKind, kind_of};
        let m = step_memory(&llama7b(32), 1 << 20, Checkpoint::Remat, false);
        let e = check_fits(&m, 140 << 30, "llama2-7b at 1048576 tokens").unwrap_err();
        assert_eq!(kind_of(&e), Some(ErrorKind::OutOfMemory));
    }
}
