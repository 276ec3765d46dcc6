//! What one training step of a model costs, from its shape alone: the FLOPs that model FLOPs
//! utilisation (MFU) counts, and the GPU memory a single-GPU step holds at its peak. The memory
//! figure is an estimate made before anything is allocated, so a run that would not fit is
//! refused with the numbers instead of dying mid-step.

use super::Checkpoint;
use super::config::Config;
use anyhow::{Result, bail};
use serde::Serialize;

/// Dense bf16 (and fp16) tensor-core peak of one H200 (SXM), TFLOP/s, by NVIDIA's datasheet:
/// the denominator of MFU on that card.
pub const H200_BF16_PEAK_TFLOPS: f64 = 989.0;

/// Bytes the CUDA context, cuBLAS workspaces and allocator slack take beside the tensors.
const RESERVE_BYTES: f64 = 1.5 * (1u64 << 30) as f64;

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

/// Bytes of one element: 16-bit weights and activations, f32 statistics and gradients.
const HALF: f64 = 2.0;
const F32: f64 = 4.0;

/// Estimated GPU bytes of a single-GPU step, by what holds them.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct StepMemory {
    /// 16-bit weights.
    pub weights: f64,
    /// f32 weight gradients.
    pub grads: f64,
    /// AdamW's two f32 moments (0 without an optimizer step). The CUDA model updates its 16-bit
    /// weights in place: no f32 master copy.
    pub optimizer: f64,
    /// What the checkpoint policy keeps of every layer between forward and backward.
    pub kept: f64,
    /// One layer's recomputed activations, the gradients in flight in its backward, the
    /// attention's head-major copies, the residual stream, and the context's reserve.
    pub working: f64,
}

impl StepMemory {
    pub fn total(&self) -> f64 {
        self.weights + self.grads + self.optimizer + self.kept + self.working
    }

    /// "about 53.6 GiB (weights 12.6, gradients 25.1, ...)": the total and its parts, for
    /// messages.
    pub fn describe(&self) -> String {
        format!(
            "about {:.1} GiB (weights {:.1}, gradients {:.1}, optimizer {:.1}, kept activations {:.1}, working set {:.1})",
            gib(self.total()),
            gib(self.weights),
            gib(self.grads),
            gib(self.optimizer),
            gib(self.kept),
            gib(self.working)
        )
    }
}

/// The peak GPU memory of one step over `seq` tokens under `policy`, with the optimizer's state
/// when `optimizer` (training) and without it (gradients, benchmarks).
///
/// Element sizes follow the CUDA model's storage: weights and activations 16-bit, norm and
/// softmax statistics and all gradients f32 (the upper bound: activation gradients may be 16-bit).
pub fn step_memory(c: &Config, seq: usize, policy: Checkpoint, optimizer: bool) -> StepMemory {
    let t = seq as f64;
    let params: f64 = super::weights::specs(c)
        .iter()
        .map(|s| s.elements() as f64)
        .sum();
    let (d, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let (qw, kw, h) = (
        c.q_width() as f64,
        c.kv_width() as f64,
        c.num_attention_heads as f64,
    );
    // Every activation of one layer up to the MLP (layer.rs `Acts`): x, h1, q, k, v, o, x2, h2
    // in 16-bit; rstd1, rstd2 and LSE in f32. The MLP's g, u, m (16-bit) exist one block of
    // rows at a time (layer.rs `mlp_block_rows`) unless the policy keeps them all.
    let acts = t * (HALF * (4.0 * d + 2.0 * qw + 2.0 * kw) + F32 * (2.0 + h));
    let mlp_all = t * HALF * 3.0 * i;
    let block = t.min(super::layer::mlp_block_rows(c) as f64);
    let mlp_block = block * HALF * 3.0 * i;
    let kept_per_layer = match policy {
        Checkpoint::None => acts + mlp_all,
        Checkpoint::Remat => t * (HALF * (d + qw) + F32 * h),
        Checkpoint::Layer => t * HALF * d,
    };
    // A layer's backward: dout, dx2, dh2, dO, dQ, dK, dV, dh1 (f32 at most), and per MLP block
    // dm, dg, du and the block's dh2; the attention's head-major copies of Q, K, V, O, dO
    // (16-bit), its f32 dQ, dK, dV and D.
    let grads_in_flight =
        t * F32 * (4.0 * d + 2.0 * qw + qw + 2.0 * kw) + block * F32 * (3.0 * i + d);
    let attention = t * (HALF * (3.0 * qw + 2.0 * kw) + F32 * (qw + 2.0 * kw + h));
    // The residual stream and its gradient between layers, the final norm's output.
    let stream = t * d * (2.0 * HALF + F32);
    StepMemory {
        weights: HALF * params,
        grads: F32 * params,
        optimizer: if optimizer { 2.0 * F32 * params } else { 0.0 },
        kept: c.num_hidden_layers as f64 * kept_per_layer,
        working: acts + mlp_block + grads_in_flight + attention + stream + RESERVE_BYTES,
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
    bail!(
        "{what} would not fit on this GPU: it needs {} but {:.1} GiB is free; use fewer layers, a shorter sequence, a leaner checkpoint policy (layer keeps least) or more GPUs",
        m.describe(),
        gib(free as f64)
    )
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
        assert_eq!(remat.working, layer.working);
        // 6.74B parameters: 12.6 GiB of bf16 weights, twice that of f32 gradients.
        assert!(
            (gib(remat.weights) - 12.55).abs() < 0.05,
            "{}",
            gib(remat.weights)
        );
        assert_eq!(remat.grads, 2.0 * remat.weights);
        let train = step_memory(&c, 16384, Checkpoint::Remat, true);
        assert_eq!(train.optimizer, 4.0 * remat.weights);
        // Remat keeps x and O (16-bit) and LSE per layer: 32 · 16384 · (2·8192 + 4·32) bytes.
        assert_eq!(remat.kept, 32.0 * 16384.0 * (2.0 * 8192.0 + 128.0));
        // HF with checkpointing fits 128K tokens of the whole 7B in 103 GiB; so do we (measured
        // 102.7 GiB with the MLP over row blocks), and the estimate stays above what was
        // measured.
        let long = step_memory(&c, 131072, Checkpoint::Layer, false);
        let est = gib(long.total());
        assert!((102.7..125.0).contains(&est), "{est}");
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
}
