//! What one training step of a model costs, from its shape alone: the FLOPs that model FLOPs
//! utilisation (MFU) counts and the ideal step at the measured rates, and the shape of a memory
//! estimate ([`StepMemory`]: by part, with the allowance for what is not a tensor), which is
//! counted from the code (`train::memory::estimate`: one GPU's step, or one rank's), so that a run that
//! would not fit is refused with the numbers instead of dying mid-step.

use super::config::Config;
use super::{Checkpoint, Keep};
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
/// matrix product at the GEMM rate, forward and backward, plus each layer's forward again where
/// its policy under `keep` re-runs it (`layer` and `remat`: the linears; `layer`: attention's
/// forward too; never the output projection, nor the whole layers); attention's kernels at
/// their rate (the backward 2.5 times the forward's FLOPs, as FlashAttention counts them;
/// causal: half the square); and, with the optimizer, AdamW's pass over the state at HBM's
/// bandwidth (f32 gradients read; both f32 moments, the bf16 weights and their masters' low
/// halves read and written: 28 bytes a parameter). Memory-bound ops between them (norms,
/// activations, the loss) are left out: the ideal is what the step's arithmetic costs, and a
/// measured step's distance from it is what fusion and overlap can still win.
pub fn ideal_step_secs(c: &Config, seq: usize, keep: Keep, optimizer: bool) -> f64 {
    let t = seq as f64;
    let head = c.vocab_size as f64 * c.hidden_size as f64;
    let layers = matmul_params(c) - head;
    // The share of the layers whose policy (`Keep::policy`) is among `policies`.
    let n = c.num_hidden_layers;
    let share = |policies: &[Checkpoint]| {
        let of = (0..n).filter(|&l| policies.contains(&keep.policy(l, n)));
        of.count() as f64 / n.max(1) as f64
    };
    let rerun = share(&[Checkpoint::Layer, Checkpoint::Remat]);
    let gemm = 2.0 * t * (3.0 * head + (3.0 + rerun) * layers);
    let forward = 2.0 * c.num_hidden_layers as f64 * t * t * c.q_width() as f64;
    let attention_forwards = 1.0 + share(&[Checkpoint::Layer]);
    let attention = forward * (attention_forwards + 2.5);
    let update = if optimizer {
        28.0 * super::weights::parameters(c) as f64 / (H200_HBM_TBPS * 1e12)
    } else {
        0.0
    };
    gemm / (H200_GEMM_TFLOPS * 1e12) + attention / (H200_ATTENTION_TFLOPS * 1e12) + update
}

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
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StepMemory {
    /// 16-bit weights.
    pub weights: f64,
    /// f32 weight gradients.
    pub grads: f64,
    /// AdamW's state (0 without an optimizer step): its two f32 moments and the master of the
    /// 16-bit weights, which the update applies to (`model::ops::AdamState`; for bf16 the
    /// f32's low half, for fp16 an f32 copy).
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

    /// Two workers' steps on one GPU at once (virtual workers): each part of one beside the
    /// other's, the allowance for what is not a tensor once.
    pub fn beside(self, other: StepMemory) -> StepMemory {
        StepMemory {
            weights: self.weights + other.weights,
            grads: self.grads + other.grads,
            optimizer: self.optimizer + other.optimizer,
            kept: self.kept + other.kept,
            working: self.working + other.working - RESERVE_BYTES,
            staging: self.staging + other.staging,
            pinned_host: self.pinned_host + other.pinned_host,
            pinned_optimizer: self.pinned_optimizer + other.pinned_optimizer,
        }
    }

    /// All pinned host memory the step holds: offloaded checkpoints and moments.
    pub fn pinned(&self) -> f64 {
        self.pinned_host + self.pinned_optimizer
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

/// GiB of `bytes`, for messages.
pub fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// Refuses, in one sentence with the numbers, a step whose estimate exceeds `free` bytes.
/// `what` names the run ("llama2-7b, 32 layers, 16384 tokens, checkpoint remat").
pub fn check_fits(m: &StepMemory, free: usize, what: &str, fix: &str) -> Result<()> {
    if m.total() <= free as f64 {
        return Ok(());
    }
    Err(Error::out_of_memory(format!(
        "{what} would not fit on this GPU: it needs {} but {:.1} GiB is free; {fix}",
        m.describe(),
        gib(free as f64)
    )))
}

/// What a step too large for its GPU can change, where no offload or policy makes it fit.
pub const GPU_FIX: &str = "use fewer layers, a shorter sequence, a leaner checkpoint policy (layer keeps least) or more GPUs";

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
        let keep = Keep::on_device;
        let remat = ideal_step_secs(&c, t, keep(Checkpoint::Remat), false);
        assert!((remat - 5.783).abs() < 2e-3, "{remat}");
        // `none` runs the layers' linears once less; `layer` attention's forward once more.
        let linears = 2.0 * t as f64 * (matmul_params(&c) - 32000.0 * 4096.0) / 700e12;
        let none = ideal_step_secs(&c, t, keep(Checkpoint::None), false);
        assert!((remat - none - linears).abs() < 1e-9, "{none}");
        let attention_forward = 2.0 * 16.0 * (t as f64).powi(2) * 4096.0 / 600e12;
        let layer = ideal_step_secs(&c, t, keep(Checkpoint::Layer), false);
        assert!((layer - remat - attention_forward).abs() < 1e-9, "{layer}");
        // Whole layers re-run nothing: a quarter of them whole, a quarter of the re-run less.
        for (checkpoint, rerun) in [
            (Checkpoint::Remat, linears),
            (Checkpoint::Layer, linears + attention_forward),
        ] {
            let quarter = Keep {
                whole_layers: 4,
                ..keep(checkpoint)
            };
            let full = ideal_step_secs(&c, t, keep(checkpoint), false);
            let some_whole = ideal_step_secs(&c, t, quarter, false);
            assert!(
                (full - some_whole - rerun / 4.0).abs() < 1e-9,
                "{some_whole}"
            );
        }
        // The update reads and writes 28 bytes a parameter at 4.8 TB/s.
        let update = ideal_step_secs(&c, t, keep(Checkpoint::Remat), true) - remat;
        let params = super::super::weights::parameters(&c) as f64;
        assert!((update - 28.0 * params / 4.8e12).abs() < 1e-12, "{update}");
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

    /// A step whose working set is `gib` GiB, the allowance included.
    fn needing(gib: f64) -> StepMemory {
        StepMemory {
            working: gib * (1u64 << 30) as f64,
            ..StepMemory::default()
        }
    }

    #[test]
    fn refusal_is_one_sentence_with_numbers() {
        let m = needing(300.0);
        let err = check_fits(&m, 140 << 30, "llama2-7b at 1048576 tokens", GPU_FIX)
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
        assert!(check_fits(&needing(139.0), 140 << 30, "x", GPU_FIX).is_ok());
    }

    #[test]
    fn a_step_that_would_not_fit_is_out_of_memory() {
        use crate::error::{ErrorKind, kind_of};
        let what = "llama2-7b at 1048576 tokens";
        let e = check_fits(&needing(300.0), 140 << 30, what, GPU_FIX).unwrap_err();
        assert_eq!(kind_of(&e), Some(ErrorKind::OutOfMemory));
    }
}
