//! The model's gradients: against finite differences (f64, dense attention), distributed over
//! 1..4 workers against one worker and against the f64 model, equal under every checkpoint
//! policy, and bit for bit the same with each layer's checkpoint offloaded to host memory.

use distflash::model::attention_api::Dense;
use distflash::model::config::Config;
use distflash::model::cpu::Cpu;
use distflash::model::family::ModelType;
use distflash::model::rope::RopeScaling;
use distflash::model::weights::{Weights, specs};
use distflash::model::{Checkpoint, Chunk, Keep, Offload, forward_backward};
use distflash::plan::Schedule;
use distflash::runtime::{Device, Runtime};
use distflash::shape::Span;
use distflash::train::documents::{Packing, Positions, restarted};
use distflash::train::memory::{HostState, MemoryCheck};
use distflash::train::step_plan::Shard;
use distflash::train::step_plan::{Asked, Purpose, StepPlan, WholeLayers};
use distflash::train::{Gradients, SequenceDocuments};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::time::Duration;

/// `train::gradients` with `workers` CPU worker threads, the sequence one document.
fn gradients(
    c: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    workers: usize,
    schedule: Schedule,
    keep: Keep,
    timeout: Duration,
) -> anyhow::Result<Gradients> {
    let documents = SequenceDocuments::default();
    let how = (schedule, keep, &documents);
    gradients_of(c, weights, tokens, workers, how, timeout)
}

/// [`gradients`] of a sequence whose documents `documents` says how to find and treat.
fn gradients_of(
    c: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    workers: usize,
    (schedule, keep, documents): (Schedule, Keep, &SequenceDocuments),
    timeout: Duration,
) -> anyhow::Result<Gradients> {
    let asked = Asked {
        schedule,
        checkpoint: keep.checkpoint,
        offload: keep.offload.into(),
        shard: Some(Shard::None),
        whole_layers: WholeLayers::Exactly(keep.whole_layers),
    };
    let plan = StepPlan::resolve(asked, Purpose::Gradients, workers, c, Device::Cpu)?.plan;
    let memory = MemoryCheck {
        config: c.clone(),
        model: "small".into(),
        seq: tokens.len() - 1,
        plan,
        host_state: HostState::Weights,
        ignore_estimate: false,
    };
    let rt = Runtime::cpu_threads(workers, timeout);
    let g = distflash::train::gradients(c, weights, tokens, &plan, documents, &memory, &rt)?;
    Ok(g.expect("worker threads report"))
}

fn small(tied: bool) -> Config {
    Config {
        vocab_size: 24,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: tied,
        model_type: ModelType::Llama,
        attention_bias: false,
        sliding_window: None,
    }
}

/// `small(false)` with projection biases: Qwen2's (q, k, v) or LLaMA's `attention_bias` (q, k,
/// v and o).
fn biased(model_type: ModelType) -> Config {
    Config {
        model_type,
        attention_bias: model_type == ModelType::Llama,
        ..small(false)
    }
}

/// `small(false)` with a rotary scaling: YaRN (whose attention factor scales q and k) or dynamic
/// NTK past a trained context of 8 tokens (so the sequence length, not a worker's rows, sets
/// the frequencies).
fn rescaled(yarn: bool) -> Config {
    let rope_scaling = if yarn {
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 64.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: false,
            attention_factor: 1.3,
        }
    } else {
        RopeScaling::Dynamic {
            factor: 4.0,
            max_position_embeddings: 8.0,
        }
    };
    Config {
        rope_scaling,
        head_dim: 8,
        hidden_size: 32,
        ..small(false)
    }
}

/// A Mistral `small(false)` whose sliding window of 4 hides keys in every sequence here.
fn windowed() -> Config {
    Config {
        model_type: ModelType::Mistral,
        sliding_window: Some(4),
        ..small(false)
    }
}

/// A Qwen3 `small`: each head's q and k RMS-normed before rotation, heads of 8, so the 4 query
/// heads are twice the hidden width (q_width 32, hidden 16, as Qwen3-0.6B's 16 heads of 128 are
/// twice its 1024), and tied embeddings, as the small Qwen3s have.
fn qwen3() -> Config {
    Config {
        model_type: ModelType::Qwen3,
        head_dim: 8,
        tie_word_embeddings: true,
        ..small(false)
    }
}

/// Qwen3-0.6B's `config.json` reads as transformers reads it: 16 heads of 128 in a width of 1024,
/// tied embeddings, θ 10⁶, q_norm and k_norm of 128 in every layer and no biases; without
/// `head_dim` the head is still 128 (`Qwen3Config`'s default, not width / heads);
/// `attention_bias` puts biases on q, k, v and o, as `LlamaConfig`'s does; a window that is on
/// is refused, as Qwen2's is.
#[test]
fn qwen3_configs_read_as_transformers_reads_them() {
    let mut v: serde_json::Value = serde_json::from_str(
        r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936}"#,
    )
    .unwrap();
    let c = Config::from_json(&v).unwrap();
    assert_eq!(c.model_type, ModelType::Qwen3);
    assert_eq!((c.head_dim, c.q_width(), c.kv_width()), (128, 2048, 1024));
    assert!(c.tie_word_embeddings && !c.qkv_bias() && !c.o_bias());
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-6));
    let names: Vec<String> = specs(&c).into_iter().map(|s| s.name).collect();
    let layer0: Vec<&str> = names[1..12].iter().map(|n| &n[15..]).collect();
    assert_eq!(
        layer0,
        [
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ]
    );
    // 0.6B: 596M parameters with the embedding counted once.
    let params = distflash::model::weights::parameters(&c);
    assert_eq!(params, 596_049_920);
    assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);

    v.as_object_mut().unwrap().remove("head_dim");
    assert_eq!(Config::from_json(&v).unwrap().head_dim, 128);
    v["attention_bias"] = serde_json::json!(true);
    let biased = Config::from_json(&v).unwrap();
    assert!(biased.qkv_bias() && biased.o_bias());
    assert_eq!(Config::from_json(&biased.to_json()).unwrap(), biased);
    v["use_sliding_window"] = serde_json::json!(true);
    v["sliding_window"] = serde_json::json!(4096);
    let e = Config::from_json(&v).unwrap_err().to_string();
    assert!(
        e.contains("Qwen3's sliding window (sliding_window 4096"),
        "{e}"
    );
}

/// Weights large enough that attention is far from uniform and every path carries gradient.
fn host_weights(c: &Config, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    specs(c)
        .iter()
        .map(|s| {
            (0..s.elements())
                .map(|_| {
                    let r: f32 = rng.random_range(-0.5..0.5);
                    if s.decays() { r } else { 1.0 + r }
                })
                .collect()
        })
        .collect()
}

fn tokens(c: &Config, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..=n)
        .map(|_| rng.random_range(0..c.vocab_size as u32))
        .collect()
}

/// Mean loss and gradients of the f64 model with dense attention (one chunk), the sequence one
/// document.
fn f64_model(
    c: &Config,
    host: &[Vec<f64>],
    toks: &[u32],
    policy: Checkpoint,
) -> (f64, Vec<Vec<f64>>) {
    f64_model_of(c, host, toks, policy, (&[], Positions::Continue))
}

/// [`f64_model`] of a sequence packed from documents of `doc_lens` tokens (empty: one), each
/// seeing only itself, its rotary positions as `positions` says.
fn f64_model_of(
    c: &Config,
    host: &[Vec<f64>],
    toks: &[u32],
    policy: Checkpoint,
    (doc_lens, positions): (&[usize], Positions),
) -> (f64, Vec<Vec<f64>>) {
    let ops = Cpu::<f64>::new();
    let mut it = host.iter();
    let w: Weights<Vec<f64>> = Weights::build(c, |_| Ok(it.next().unwrap().clone())).unwrap();
    let mut g: Weights<Vec<f64>> = Weights::build(c, |s| Ok(vec![0.0; s.elements()])).unwrap();
    let n = toks.len() - 1;
    let mut attn = Dense {
        dims: c.dims(),
        rows: n,
        mask: c.mask(n, doc_lens).unwrap(),
    };
    let whole = [Span { start: 0, len: n }];
    let runs = match positions {
        Positions::Continue => whole.to_vec(),
        Positions::Restart => restarted(&whole, doc_lens),
    };
    let chunk = Chunk {
        tokens: &toks[..n],
        targets: &toks[1..],
        positions: &runs,
        sequence: n,
    };
    let out = forward_backward(
        &ops,
        c,
        (&w, &mut g),
        &mut attn,
        chunk,
        Keep::on_device(policy),
        1.0 / n as f64,
    )
    .unwrap();
    (
        out.loss_sum / n as f64,
        g.tensors().into_iter().cloned().collect(),
    )
}

fn widen(host: &[Vec<f32>]) -> Vec<Vec<f64>> {
    host.iter()
        .map(|t| t.iter().map(|&x| x as f64).collect())
        .collect()
}

/// max |a − b| / max |b| over one tensor.
fn rel(a: &[f32], b: &[f64]) -> f64 {
    let err = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max);
    err / b.iter().map(|y| y.abs()).fold(f64::MIN_POSITIVE, f64::max)
}

#[test]
fn gradients_match_finite_differences_in_f64() {
    let configs = [
        small(false),
        small(true),
        biased(ModelType::Qwen2),
        biased(ModelType::Llama),
        rescaled(true),
        windowed(),
        qwen3(),
        Config {
            attention_bias: true,
            tie_word_embeddings: false,
            ..qwen3()
        },
    ];
    for c in configs {
        let tied = c.tie_word_embeddings;
        let host = widen(&host_weights(&c, 1));
        let toks = tokens(&c, 9, 2);
        let (_, grads) = f64_model(&c, &host, &toks, Checkpoint::Remat);
        let h = 1e-5;
        let mut rng = StdRng::seed_from_u64(3);
        for (t, spec) in specs(&c).iter().enumerate() {
            for _ in 0..4 {
                let i = rng.random_range(0..spec.elements());
                let mut plus = host.clone();
                plus[t][i] += h;
                let mut minus = host.clone();
                minus[t][i] -= h;
                let fd = (f64_model(&c, &plus, &toks, Checkpoint::None).0
                    - f64_model(&c, &minus, &toks, Checkpoint::None).0)
                    / (2.0 * h);
                let got = grads[t][i];
                assert!(
                    (got - fd).abs() <= 1e-7 + 1e-6 * fd.abs(),
                    "{} [{i}] ({:?}, tied {tied}): backward {got:e}, finite difference {fd:e}",
                    spec.name,
                    c.model_type
                );
            }
        }
    }
}

#[test]
fn distributed_equals_one_worker_and_the_f64_model() {
    for c in [
        small(false),
        biased(ModelType::Qwen2),
        rescaled(false),
        windowed(),
        qwen3(),
    ] {
        distributed_equals_one_worker_and_the_f64_model_for(&c);
    }
}

fn distributed_equals_one_worker_and_the_f64_model_for(c: &Config) {
    let host = host_weights(c, 4);
    let toks = tokens(c, 23, 5);
    let (loss64, grads64) = f64_model(c, &widen(&host), &toks, Checkpoint::None);
    let run = |workers, schedule| {
        gradients(
            c,
            &host,
            &toks,
            workers,
            schedule,
            Keep::on_device(Checkpoint::Remat),
            Duration::from_secs(60),
        )
        .unwrap()
    };
    let one = run(1, Schedule::Balanced);
    assert!(
        (one.loss - loss64).abs() < 1e-5 * loss64,
        "f32 loss {} vs f64 {loss64}",
        one.loss
    );
    for (s, (g, want)) in specs(c).iter().zip(one.grads.iter().zip(&grads64)) {
        assert!(
            rel(g, want) < 1e-4,
            "{} ({:?}): relative error {:e} against f64",
            s.name,
            c.model_type,
            rel(g, want)
        );
    }
    for workers in 1..=4 {
        for schedule in [Schedule::Balanced, Schedule::Unbalanced, Schedule::Zigzag] {
            let many = run(workers, schedule);
            assert!((many.loss - one.loss).abs() < 1e-6 * one.loss);
            for (s, (g, want)) in specs(c).iter().zip(many.grads.iter().zip(&one.grads)) {
                let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
                assert!(
                    rel(g, &want) < 1e-5,
                    "{} with {workers} workers ({schedule}): relative error {:e}",
                    s.name,
                    rel(g, &want)
                );
            }
        }
    }
}

#[test]
fn checkpoint_policies_give_the_same_gradients() {
    for c in [small(false), qwen3()] {
        checkpoint_policies_give_the_same_gradients_for(&c);
    }
}

fn checkpoint_policies_give_the_same_gradients_for(c: &Config) {
    let c = c.clone();
    let host = host_weights(&c, 6);
    let toks = tokens(&c, 16, 7);
    let run = |policy| {
        gradients(
            &c,
            &host,
            &toks,
            3,
            Schedule::Balanced,
            Keep::on_device(policy),
            Duration::from_secs(60),
        )
        .unwrap()
    };
    let none = run(Checkpoint::None);
    let layer = run(Checkpoint::Layer);
    let remat = run(Checkpoint::Remat);
    assert_eq!(none.attention_forwards_per_layer, vec![1, 1]);
    assert_eq!(layer.attention_forwards_per_layer, vec![2, 2]);
    assert_eq!(remat.attention_forwards_per_layer, vec![1, 1]);
    for other in [&layer, &remat] {
        assert_eq!(other.loss, none.loss);
        assert_eq!(
            other.grads, none.grads,
            "recomputation must repeat the same arithmetic"
        );
    }
    assert!(none.peak_activation_bytes > remat.peak_activation_bytes);
    assert!(remat.peak_activation_bytes > layer.peak_activation_bytes);
}

/// Qwen3 norms each head's q and k (the independent check of where the norm sits): with the
/// norms' eps 0, scaling one query head's rows of Wq, and one KV head's rows of Wk, by any
/// positive factor leaves the f64 loss as it was, to rounding; the same scaling of a LLaMA
/// (no norms) changes it, so the check could fail. A norm over the whole projection, or over
/// the wrong heads, would not be invariant to a single head's scale.
#[test]
fn qwen3_norms_each_query_and_key_head_on_its_own() {
    let scaled_loss_change = |c: &Config| {
        let host = widen(&host_weights(c, 17));
        let toks = tokens(c, 11, 18);
        let (loss, _) = f64_model(c, &host, &toks, Checkpoint::None);
        let mut scaled = host.clone();
        let hd = c.head_dim;
        let d = c.hidden_size;
        for (name, head, factor) in [("q_proj", 1, 3.0), ("k_proj", 0, 0.25)] {
            let at = specs(c)
                .iter()
                .position(|s| s.name == format!("model.layers.1.self_attn.{name}.weight"))
                .unwrap();
            for x in &mut scaled[at][head * hd * d..(head + 1) * hd * d] {
                *x *= factor;
            }
        }
        let (after, _) = f64_model(c, &scaled, &toks, Checkpoint::None);
        (after - loss).abs() / loss
    };
    let exact = Config {
        rms_norm_eps: 0.0,
        ..qwen3()
    };
    let change = scaled_loss_change(&exact);
    assert!(change < 1e-12, "Qwen3's loss moved by {change:e}");
    let llama = Config {
        model_type: ModelType::Llama,
        ..exact
    };
    let change = scaled_loss_change(&llama);
    assert!(change > 1e-3, "LLaMA's loss moved by only {change:e}");
}

/// The memory count holds Qwen3's normed heads: under `--checkpoint none` each layer keeps q
/// and k before their norms (16-bit) and the norms' rstd (f32, one a row and head) beside what
/// the same model without the norms keeps, on a Qwen3-0.6B-shaped model (two of its layers),
/// from one row to past an MLP block and a loss chunk.
#[test]
fn the_memory_count_holds_qwen3s_normed_heads() {
    use distflash::train::memory::estimate::{Step, estimate};
    use distflash::train::memory::lengths::Precision;
    let cfg = Config {
        vocab_size: 151936,
        hidden_size: 1024,
        intermediate_size: 3072,
        num_hidden_layers: 2,
        num_attention_heads: 16,
        num_key_value_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        ..qwen3()
    };
    let plain = Config {
        model_type: ModelType::Llama,
        ..cfg.clone()
    };
    let (qw, kw) = (16 * 128, 8 * 128);
    for seq in [1, 100, 441, 4096, 21846, 65536] {
        let kept = |c: &Config| {
            let step = Step {
                cfg: c,
                seq,
                keep: Keep::on_device(Checkpoint::None),
                optimizer: false,
            };
            estimate(step, Precision::Cuda { master_bytes: 2 })
                .unwrap()
                .step_memory()
                .kept
        };
        let normed = 2.0 * (seq * (2 * (qw + kw) + 4 * (16 + 8))) as f64;
        assert_eq!(kept(&cfg) - kept(&plain), normed, "{seq}");
    }
}

/// Offloading each layer's checkpoint to host memory and fetching it back one layer ahead of
/// the backward changes no bit of the loss or of any gradient, under every checkpoint policy and
/// schedule on 1 to 4 workers, while the device-side peak of kept activations falls: with 5
/// layers, the backward holds two layers' checkpoints instead of five.
#[test]
fn offloaded_checkpoints_give_the_same_bits_and_a_lower_peak() {
    let c = Config {
        num_hidden_layers: 5,
        ..small(false)
    };
    let host = host_weights(&c, 8);
    let toks = tokens(&c, 21, 9);
    for checkpoint in [Checkpoint::None, Checkpoint::Layer, Checkpoint::Remat] {
        for workers in 1..=4 {
            for schedule in [Schedule::Balanced, Schedule::Unbalanced, Schedule::Zigzag] {
                let run = |offload| {
                    let keep = Keep {
                        offload,
                        ..Keep::on_device(checkpoint)
                    };
                    gradients(
                        &c,
                        &host,
                        &toks,
                        workers,
                        schedule,
                        keep,
                        Duration::from_secs(60),
                    )
                    .unwrap()
                };
                let (kept, offloaded) = (run(Offload::NONE), run(Offload::ACTIVATIONS));
                let what = format!("{checkpoint}, {workers} workers, {schedule}");
                assert_eq!(
                    offloaded.loss.to_bits(),
                    kept.loss.to_bits(),
                    "{what}: loss"
                );
                assert_eq!(offloaded.grads, kept.grads, "{what}: gradients");
                assert_eq!(
                    offloaded.attention_forwards_per_layer,
                    kept.attention_forwards_per_layer
                );
                assert!(
                    offloaded.peak_activation_bytes < kept.peak_activation_bytes,
                    "{what}: offloaded peak {} vs {}",
                    offloaded.peak_activation_bytes,
                    kept.peak_activation_bytes
                );
            }
        }
    }
}

/// Whole layers (`--whole-layers`) keep every activation of the last layers so that their
/// backward recomputes nothing: the same arithmetic, so no bit of the loss or of any gradient
/// changes, under `layer` and `remat`, with and without offloaded checkpoints, on 1 to 3
/// workers; the peak of kept activations grows with each whole layer after the first, up to what
/// `none` keeps when every layer is whole; under `layer`, the whole layers' attention runs once.
#[test]
fn whole_layers_give_the_same_bits_and_hold_more() {
    let c = Config {
        num_hidden_layers: 4,
        ..small(false)
    };
    let host = host_weights(&c, 8);
    let toks = tokens(&c, 21, 9);
    for checkpoint in [Checkpoint::Layer, Checkpoint::Remat] {
        for offload in [Offload::NONE, Offload::ACTIVATIONS] {
            for workers in 1..=3 {
                let run = |whole_layers, checkpoint| {
                    let keep = Keep {
                        offload,
                        whole_layers,
                        ..Keep::on_device(checkpoint)
                    };
                    let schedule = Schedule::Balanced;
                    let timeout = Duration::from_secs(60);
                    gradients(&c, &host, &toks, workers, schedule, keep, timeout).unwrap()
                };
                let what = format!("{checkpoint}, {offload}, {workers} workers");
                let none = run(0, checkpoint);
                let mut peak = none.peak_activation_bytes;
                for whole in 1..=4 {
                    let got = run(whole, checkpoint);
                    let what = format!("{what}, {whole} whole");
                    assert_eq!(got.loss.to_bits(), none.loss.to_bits(), "{what}: loss");
                    assert_eq!(got.grads, none.grads, "{what}: gradients");
                    let forwards: Vec<u32> = (0..4)
                        .map(|l| match checkpoint == Checkpoint::Layer && l + whole < 4 {
                            true => 2,
                            false => 1,
                        })
                        .collect();
                    assert_eq!(got.attention_forwards_per_layer, forwards, "{what}");
                    // The last layer's backward comes first and would recompute all of it at
                    // once: keeping it whole costs no peak; each one after it does.
                    let grew = got.peak_activation_bytes > peak;
                    let free = whole == 1 && got.peak_activation_bytes == peak;
                    assert!(
                        grew || free,
                        "{what}: peak {} after {peak}",
                        got.peak_activation_bytes
                    );
                    peak = got.peak_activation_bytes;
                }
                if offload == Offload::NONE {
                    let all = run(0, Checkpoint::None);
                    assert_eq!(peak, all.peak_activation_bytes, "{what}: all whole is none");
                }
            }
        }
    }
}

/// The meter's peak with offload is what the estimate's accounting says: three of five layers'
/// checkpoints fewer than keeping them all (the backward of the last layer holds its own and the
/// one fetched for the next layer).
#[test]
fn offload_leaves_two_layers_checkpoints_on_the_device() {
    let peak = |layers, offload| {
        let c = Config {
            num_hidden_layers: layers,
            ..small(false)
        };
        let keep = Keep {
            offload,
            ..Keep::on_device(Checkpoint::Remat)
        };
        let host = host_weights(&c, 8);
        let toks = tokens(&c, 21, 9);
        gradients(
            &c,
            &host,
            &toks,
            1,
            Schedule::Balanced,
            keep,
            Duration::from_secs(60),
        )
        .unwrap()
        .peak_activation_bytes
    };
    // Without offload each layer adds its checkpoint; with it, the peak stops growing at two.
    let per_layer = peak(3, Offload::NONE) - peak(2, Offload::NONE);
    assert!(per_layer > 0);
    assert_eq!(
        peak(5, Offload::NONE) - peak(2, Offload::NONE),
        3 * per_layer
    );
    for layers in [2, 3, 5] {
        assert_eq!(peak(layers, Offload::ACTIVATIONS), peak(2, Offload::NONE));
    }
}

/// The window changes the model (so the checks above that pass under it could fail without it):
/// the same weights and tokens give another loss under full causal attention, and the workers'
/// loss is the windowed f64 model's.
#[test]
fn the_sliding_window_is_applied_in_training() {
    let c = windowed();
    let host = host_weights(&c, 8);
    let toks = tokens(&c, 23, 9);
    let (windowed64, _) = f64_model(&c, &widen(&host), &toks, Checkpoint::None);
    let causal = Config {
        sliding_window: None,
        ..c.clone()
    };
    let (causal64, _) = f64_model(&causal, &widen(&host), &toks, Checkpoint::None);
    assert!(
        (windowed64 - causal64).abs() > 1e-3 * causal64,
        "{windowed64} {causal64}"
    );
    let two = gradients(
        &c,
        &host,
        &toks,
        2,
        Schedule::Zigzag,
        Keep::on_device(Checkpoint::Layer),
        Duration::from_secs(60),
    )
    .unwrap();
    assert!((two.loss - windowed64).abs() < 1e-5 * windowed64);
}

/// The end-of-document id of the packed-document tests (random tokens avoid it).
const EOS: u32 = 3;

/// `n + 1` random tokens (inputs and the last target) holding `EOS` exactly at the last token of
/// each document of `doc_lens` but the last, whose end is the sequence's.
fn packed_tokens(c: &Config, doc_lens: &[usize], seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n: usize = doc_lens.iter().sum();
    let mut toks: Vec<u32> = (0..=n)
        .map(|_| {
            loop {
                let t = rng.random_range(0..c.vocab_size as u32);
                if t != EOS {
                    break t;
                }
            }
        })
        .collect();
    let mut end = 0;
    for &l in &doc_lens[..doc_lens.len() - 1] {
        end += l;
        toks[end - 1] = EOS;
    }
    toks
}

/// Whether some chunk boundary of `workers` workers under `schedule` falls exactly at a document
/// end, and some document crosses one.
fn boundaries(seq: usize, workers: usize, schedule: Schedule, doc_lens: &[usize]) -> (bool, bool) {
    let part = distflash::plan::Partition::new(seq, workers, schedule).unwrap();
    let cuts: Vec<usize> = part
        .spans()
        .iter()
        .map(|s| s.start)
        .filter(|&s| s > 0)
        .collect();
    let ends: Vec<usize> = doc_lens
        .iter()
        .scan(0, |e, &l| {
            *e += l;
            Some(*e)
        })
        .collect();
    let starts: Vec<usize> = ends.iter().zip(doc_lens).map(|(e, l)| e - l).collect();
    let at_end = cuts.iter().any(|c| ends.contains(c));
    let crossed = cuts
        .iter()
        .any(|&c| starts.iter().zip(&ends).any(|(&s, &e)| s < c && c < e));
    (at_end, crossed)
}

/// Under `--documents separate` the loss and every gradient on 1 to 4 workers and every schedule
/// are the f64 model's with each document masked off from the others (with and without
/// restarted positions; with the model's sliding window too): documents of one token, documents
/// crossing chunk boundaries and ending exactly at one. The mask changes the loss, so the check
/// could fail.
#[test]
fn separate_documents_equal_the_f64_model_on_every_worker_count_and_schedule() {
    let docs = [1, 5, 1, 9, 7];
    let (mut ended_at_cut, mut crossed) = (false, false);
    for c in [small(false), windowed()] {
        let host = host_weights(&c, 11);
        let toks = packed_tokens(&c, &docs, 12);
        let (packed64, _) = f64_model(&c, &widen(&host), &toks, Checkpoint::None);
        for positions in [Positions::Continue, Positions::Restart] {
            let (loss64, grads64) = f64_model_of(
                &c,
                &widen(&host),
                &toks,
                Checkpoint::None,
                (&docs, positions),
            );
            assert!(
                (loss64 - packed64).abs() > 1e-3 * packed64,
                "the mask changes the loss: {loss64} {packed64}"
            );
            let documents = SequenceDocuments {
                eos: Some(EOS),
                packing: Packing::separate(positions),
            };
            for workers in 1..=4 {
                for schedule in [
                    Schedule::Balanced,
                    Schedule::Unbalanced,
                    Schedule::Zigzag,
                    Schedule::Greedy,
                ] {
                    let (at, across) = boundaries(23, workers, schedule, &docs);
                    ended_at_cut |= at;
                    crossed |= across;
                    let keep = Keep::on_device(Checkpoint::Remat);
                    let g = gradients_of(
                        &c,
                        &host,
                        &toks,
                        workers,
                        (schedule, keep, &documents),
                        Duration::from_secs(60),
                    )
                    .unwrap();
                    let what = format!(
                        "{:?} {positions:?} {workers} workers {schedule}",
                        c.model_type
                    );
                    assert!(
                        (g.loss - loss64).abs() < 1e-5 * loss64,
                        "{what}: f32 loss {} vs f64 {loss64}",
                        g.loss
                    );
                    for (s, (g, want)) in specs(&c).iter().zip(g.grads.iter().zip(&grads64)) {
                        assert!(
                            rel(g, want) < 1e-4,
                            "{what}: {} relative error {:e} against f64",
                            s.name,
                            rel(g, want)
                        );
                    }
                }
            }
        }
    }
    assert!(ended_at_cut && crossed, "the cases cover both boundaries");
}

/// The independent check: with positions restarted, a sequence packed from documents A, B, C
/// (one of a single token) gives the summed loss and gradients of A, B and C each run alone as
/// its own sequence (its last input's target the next document's first token), up to f32
/// rounding; documents that see each other do not.
#[test]
fn separate_documents_train_as_the_documents_alone() {
    let c = small(false);
    let docs = [9, 1, 13];
    let host = host_weights(&c, 13);
    let toks = packed_tokens(&c, &docs, 14);
    let n = toks.len() - 1;
    let keep = Keep::on_device(Checkpoint::Remat);
    let timeout = Duration::from_secs(60);
    let mut want_loss = 0.0;
    let mut want: Vec<Vec<f64>> = specs(&c).iter().map(|s| vec![0.0; s.elements()]).collect();
    let mut start = 0;
    for &l in &docs {
        let alone = gradients(
            &c,
            &host,
            &toks[start..=start + l],
            1,
            Schedule::Balanced,
            keep,
            timeout,
        )
        .unwrap();
        want_loss += alone.loss * l as f64;
        for (w, g) in want.iter_mut().zip(&alone.grads) {
            for (w, &g) in w.iter_mut().zip(g) {
                *w += g as f64 * l as f64;
            }
        }
        start += l;
    }
    let run = |packing| {
        let documents = SequenceDocuments {
            eos: Some(EOS),
            packing,
        };
        gradients_of(
            &c,
            &host,
            &toks,
            3,
            (Schedule::Zigzag, keep, &documents),
            timeout,
        )
        .unwrap()
    };
    let packed = run(Packing::separate(Positions::Restart));
    assert!(
        (packed.loss * n as f64 - want_loss).abs() < 1e-5 * want_loss,
        "packed {} vs the documents alone {want_loss}",
        packed.loss * n as f64
    );
    for (s, (g, w)) in specs(&c).iter().zip(packed.grads.iter().zip(&want)) {
        let summed: Vec<f32> = g.iter().map(|&x| x * n as f32).collect();
        assert!(
            rel(&summed, w) < 1e-5,
            "{}: relative error {:e} against the documents alone",
            s.name,
            rel(&summed, w)
        );
    }
    let seeing = run(Packing::packed());
    assert!((seeing.loss * n as f64 - want_loss).abs() > 1e-3 * want_loss);
}

/// Short documents hide most blocks, which the plans neither compute nor fetch: the bytes a
/// worker sends in a step's forward and backward fall below the unmasked run's on 4 workers.
#[test]
fn short_documents_move_fewer_bytes() {
    let c = small(false);
    let docs = [4; 16];
    let host = host_weights(&c, 15);
    let toks = packed_tokens(&c, &docs, 16);
    let run = |packing| {
        let documents = SequenceDocuments {
            eos: Some(EOS),
            packing,
        };
        let how = (
            Schedule::Balanced,
            Keep::on_device(Checkpoint::Remat),
            &documents,
        );
        gradients_of(&c, &host, &toks, 4, how, Duration::from_secs(60))
            .unwrap()
            .pass_bytes_sent
    };
    let (separate, packed) = (
        run(Packing::separate(Positions::Continue)),
        run(Packing::packed()),
    );
    assert!(packed > 0);
    assert!(
        separate < packed,
        "separate {separate} vs packed {packed} bytes"
    );
}
