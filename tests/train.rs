//! The training loop and its command: resume equals an uninterrupted run, damaged or mismatched
//! checkpoints are refused with a sentence (and left as they were), bad configs give a sentence,
//! and `train` / `grads` write what they promise.

mod common;

use common::{distflash, sharded, temp_dir, tiny_options, tiny_options_with};
use common::{train_on_threads, train_returning};
use distflash::model::config::Config;
use distflash::model::cpu::Cpu;
use distflash::model::ops::{AdamState, AdamStep, AdamW, Ops};
use distflash::plan::Schedule;
use distflash::train::documents::{Packing, Positions};
use distflash::train::step_plan::Asked;
use distflash::train::step_plan::Shard;
use distflash::train::{Options, StepReport, state};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::path::Path;
use std::sync::Mutex;

/// The small training job on 3 CPU worker threads.
fn options(steps: u64, save_dir: Option<&Path>, resume: Option<&Path>) -> Options {
    tiny_options(3, steps, save_dir, resume)
}

/// `train::train` on the threads of `o`'s plan.
fn train(o: &Options, on_step: impl Fn(&StepReport) + Sync) -> anyhow::Result<Vec<Vec<f32>>> {
    train_on_threads(o, on_step)
}

fn run(o: &Options) -> (Vec<f64>, Vec<Vec<f32>>) {
    let losses = Mutex::new(Vec::new());
    let w = train(o, |r: &StepReport| losses.lock().unwrap().push(r.loss)).unwrap();
    (losses.into_inner().unwrap(), w)
}

/// A run that asks for no final weights (`train` without `--save-dir`, whose host memory goes to
/// offloaded checkpoints and moments) takes the same steps and brings nothing back.
#[test]
fn a_run_without_final_weights_takes_the_same_steps() {
    let (want, _) = run(&options(3, None, None));
    let o = Options {
        final_weights: false,
        ..options(3, None, None)
    };
    let losses = Mutex::new(Vec::new());
    let got = train_returning(&o, |r: &StepReport| losses.lock().unwrap().push(r.loss)).unwrap();
    assert!(got.is_none());
    assert_eq!(losses.into_inner().unwrap(), want);
}

#[test]
fn zigzag_workers_train_like_balanced_ones() {
    // Each zigzag worker holds a head and a tail chunk: two runs of positions (rotary
    // embeddings, targets, the recall probe's row) and two chunks through distflash.
    let balanced = options(4, None, None);
    let asked = Asked {
        schedule: Schedule::Zigzag,
        ..sharded(Shard::None)
    };
    let zigzag = tiny_options_with(asked, 3, 4, None, None);
    let (want, _) = run(&balanced);
    let (got, _) = run(&zigzag);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "zigzag {g} vs balanced {w}"
        );
    }
}

/// A lone worker (the single-device path: no communicator, no all-reduce) follows the
/// three-worker trajectory to f32 rounding.
#[test]
fn one_worker_follows_the_threaded_trajectory() {
    let o = options(3, None, None);
    let (three, _) = run(&o);
    let one = Mutex::new(Vec::new());
    let alone = tiny_options(1, 3, None, None);
    train_on_threads(&alone, |r: &StepReport| one.lock().unwrap().push(r.loss)).unwrap();
    let one = one.into_inner().unwrap();
    assert_eq!(one.len(), three.len());
    for (a, b) in one.iter().zip(&three) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "one worker {a} vs three {b}"
        );
    }
}

#[test]
fn resumed_run_follows_the_uninterrupted_trajectory() {
    let dir = temp_dir("train", "resume");
    let (whole, w_whole) = run(&options(5, None, None));
    let (first, _) = run(&options(3, Some(&dir), None));
    let (rest, w_rest) = run(&options(5, None, Some(&dir)));
    assert_eq!(first, whole[..3]);
    assert_eq!(
        rest,
        whole[3..],
        "resumed losses differ from the uninterrupted run"
    );
    assert_eq!(w_rest, w_whole);
    assert!(whole[4] < whole[0], "loss should fall: {whole:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn damaged_or_mismatched_checkpoints_are_refused_and_kept() {
    let dir = temp_dir("train", "damaged");
    run(&options(2, Some(&dir), None));
    let path = state::path_in(&dir);
    let good = std::fs::read(&path).unwrap();
    let resume = |o: &Options| train(o, |_| {}).unwrap_err().to_string();

    let mut other = options(4, None, Some(&dir));
    other.seq_len = 36;
    assert!(
        resume(&other).contains("resuming would not continue"),
        "{}",
        resume(&other)
    );

    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let e = resume(&options(4, None, Some(&dir)));
    assert!(e.contains("truncated or corrupt"), "{e}");

    let mut flipped = good.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x40;
    std::fs::write(&path, &flipped).unwrap();
    let e = resume(&options(4, None, Some(&dir)));
    assert!(e.contains("corrupt"), "{e}");

    // A failed resume writes nothing: a save directory's checkpoint survives it.
    std::fs::write(&path, &good).unwrap();
    let mut bad = options(4, Some(&dir), Some(&dir));
    bad.seq_len = 36;
    assert!(train(&bad, |_| {}).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), good);
    std::fs::remove_dir_all(dir).unwrap();
}

fn fails_with(args: &[&str], words: &str) {
    let out = distflash(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(err.contains(words), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one sentence expected: {err}"
    );
}

#[test]
fn bad_configs_give_a_sentence() {
    let dir = temp_dir("train", "bad");
    fails_with(&["train", "--preset", "gpt-5"], "unknown preset 'gpt-5'");
    let mut config = Config::preset("tiny").unwrap().to_json();
    config["num_key_value_heads"] = serde_json::json!(3);
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    fails_with(
        &["train", "--config", path.to_str().unwrap()],
        "must be a multiple of num_key_value_heads",
    );
    fails_with(
        &["train", "--init-from", dir.to_str().unwrap()],
        "multiple of",
    );
    config["num_key_value_heads"] = serde_json::json!(2);
    std::fs::write(&path, config.to_string()).unwrap();
    fails_with(
        &["train", "--init-from", dir.to_str().unwrap()],
        "no model.safetensors",
    );
    fails_with(&["train", "--workers", "0"], "at least 1");
    fails_with(
        &["train", "--preset", "llama2-7b", "--lr", "1e-5"],
        "training a model of 6.74B parameters on the CPU over 128 tokens with 4 workers here needs",
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `distflash grads --init-from model` of a short token list on `workers` workers, writing into
/// `dir`: its JSON report and the gradients.
fn grads_of(
    model: &str,
    dir: &std::path::Path,
    workers: &str,
) -> (serde_json::Value, distflash::tensor_file::Tensors) {
    let tokens = dir.join("tokens.json");
    std::fs::write(&tokens, "[1, 20, 70, 71, 72, 2, 20]").unwrap();
    let grads = dir.join("grads.safetensors");
    let out = distflash(&[
        "grads",
        "--init-from",
        model,
        "--tokens",
        tokens.to_str().unwrap(),
        "--out",
        grads.to_str().unwrap(),
        "--workers",
        workers,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&out.stdout).unwrap();
    (report, distflash::tensor_file::read(&grads).unwrap())
}

#[test]
fn train_writes_metrics_curve_and_model_and_grads_reads_it() {
    let dir = temp_dir("train", "cli");
    let d = dir.to_str().unwrap();
    let out = distflash(&[
        "train",
        "--steps",
        "3",
        "--seq-len",
        "32",
        "--workers",
        "2",
        "--batch",
        "1",
        "--save-dir",
        d,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["steps"], 3);
    assert_eq!(
        summary["attention_forwards_per_layer"],
        serde_json::json!([1, 1])
    );
    assert!(summary["recall_accuracy_last"].is_number());
    // The plan as it ran: `--offload auto` and `--whole-layers auto` decide nothing on the CPU.
    assert_eq!(summary["offload"], "none");
    assert_eq!(summary["whole_layers"], 0);
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 3);
    assert!(
        std::fs::read_to_string(dir.join("loss.svg"))
            .unwrap()
            .contains("<polyline")
    );

    let (report, g) = grads_of(d, &dir, "3");
    assert!(report["loss"].as_f64().unwrap() > 0.0);
    assert_eq!(g["lm_head.weight"].0, vec![256, 64]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// `distflash train` of the model `config` for 3 steps over 2 workers, sharded `full`, saving
/// into `dir/model`: the saved `config.json` and weights.
fn train_sharded_and_saved(
    dir: &Path,
    config: &serde_json::Value,
) -> (serde_json::Value, distflash::tensor_file::Tensors) {
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let model = dir.join("model");
    let out = distflash(&[
        "train",
        "--config",
        config_path.to_str().unwrap(),
        "--steps",
        "3",
        "--seq-len",
        "32",
        "--workers",
        "2",
        "--shard",
        "full",
        "--batch",
        "1",
        "--save-dir",
        model.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let saved = std::fs::read_to_string(model.join("config.json")).unwrap();
    let weights = distflash::tensor_file::read(&model.join("model.safetensors")).unwrap();
    (serde_json::from_str(&saved).unwrap(), weights)
}

/// A Qwen2 config trains (its q/k/v biases sharded like every tensor, from zero), and the saved
/// model says `qwen2` and holds the trained biases, which `grads --init-from` reads back.
#[test]
fn a_qwen2_model_trains_sharded_and_saves_and_reloads_its_biases() {
    let dir = temp_dir("train", "qwen2");
    let mut config = Config::preset("tiny").unwrap().to_json();
    config["model_type"] = serde_json::json!("qwen2");
    config.as_object_mut().unwrap().remove("attention_bias");
    let (saved, weights) = train_sharded_and_saved(&dir, &config);
    assert_eq!(saved["model_type"], "qwen2");
    let (shape, bias) = &weights["model.layers.1.self_attn.q_proj.bias"];
    assert_eq!(shape, &vec![64]);
    assert!(bias.iter().any(|&b| b != 0.0), "the bias trained from zero");
    assert!(!weights.contains_key("model.layers.0.self_attn.o_proj.bias"));

    let (_, g) = grads_of(dir.join("model").to_str().unwrap(), &dir, "2");
    let (shape, db) = &g["model.layers.0.self_attn.v_proj.bias"];
    assert_eq!(shape, &vec![32]);
    assert!(db.iter().any(|&x| x != 0.0));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A Qwen3 config as transformers writes it (no `head_dim`: Qwen3's 128, here 4 heads of 128 in
/// a width of 64; tied embeddings) trains sharded; the saved model says `qwen3` and holds each
/// layer's trained q_norm and k_norm gains of 128 under transformers' names, no `lm_head`, and
/// `grads --init-from` reads it back with gradients for the norms.
#[test]
fn a_qwen3_model_trains_sharded_and_saves_and_reloads_its_head_norms() {
    let dir = temp_dir("train", "qwen3");
    let mut config = Config::preset("tiny").unwrap().to_json();
    let o = config.as_object_mut().unwrap();
    o.remove("head_dim");
    o.remove("attention_bias");
    config["model_type"] = serde_json::json!("qwen3");
    config["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
    config["tie_word_embeddings"] = serde_json::json!(true);
    config["use_sliding_window"] = serde_json::json!(false);
    config["sliding_window"] = serde_json::Value::Null;
    config["rope_theta"] = serde_json::json!(1000000.0);
    let (saved, weights) = train_sharded_and_saved(&dir, &config);
    assert_eq!(saved["model_type"], "qwen3");
    assert_eq!(saved["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(saved["head_dim"], 128);
    for norm in ["q_norm", "k_norm"] {
        let (shape, gain) = &weights[&format!("model.layers.1.self_attn.{norm}.weight")];
        assert_eq!(shape, &vec![128]);
        assert!(gain.iter().any(|&g| g != 1.0), "{norm} trained from ones");
    }
    assert_eq!(
        weights["model.layers.0.self_attn.q_proj.weight"].0,
        [512, 64]
    );
    assert_eq!(
        weights["model.layers.0.self_attn.o_proj.weight"].0,
        [64, 512]
    );
    assert!(!weights.contains_key("lm_head.weight"));
    assert!(!weights.contains_key("model.layers.0.self_attn.q_proj.bias"));

    let (_, g) = grads_of(dir.join("model").to_str().unwrap(), &dir, "2");
    let (shape, dk) = &g["model.layers.0.self_attn.k_norm.weight"];
    assert_eq!(shape, &vec![128]);
    assert!(dk.iter().any(|&x| x != 0.0));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A Mistral config's sliding window trains on the CPU (its mask in every block the workers
/// compute; `tests/model.rs` checks the numbers). On the GPU the kernels take the same mask
/// (`tests/gpu_attention.rs` checks them under windows).
#[test]
fn a_mistral_window_trains_on_the_cpu() {
    let dir = temp_dir("train", "mistral");
    let mut config = Config::preset("tiny").unwrap().to_json();
    config["model_type"] = serde_json::json!("mistral");
    config.as_object_mut().unwrap().remove("attention_bias");
    config["sliding_window"] = serde_json::json!(16);
    let path = dir.join("mistral.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let p = path.to_str().unwrap();
    let run = ["train", "--config", p, "--seq-len", "32", "--steps", "2"];
    let out = distflash(&[&run[..], &["--workers", "2", "--schedule", "zigzag"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A synthetic sequence is one document: separate documents train it as packed ones do, bit for
/// bit (the mask is plain causal attention, the plans the same).
#[test]
fn synthetic_sequences_are_one_document() {
    let separate = Options {
        packing: Packing::separate(Positions::Restart),
        ..options(3, None, None)
    };
    assert_eq!(run(&separate), run(&options(3, None, None)));
}

/// `--documents separate` masks the sequence at its documents (`grads` gives another loss);
/// restarted positions need separate documents, and byte data has no documents to separate.
#[test]
fn separate_documents_mask_and_are_refused_where_there_are_none() {
    let dir = temp_dir("train", "documents");
    let train = ["train", "--seq-len", "32", "--steps", "1"];
    let separate = ["--documents", "separate"];
    let tokens = dir.join("tokens.json");
    std::fs::write(&tokens, "[1, 20, 3, 71, 72, 3, 20]").unwrap();
    let out = dir.join("grads.safetensors");
    let grads = [
        "grads",
        "--tokens",
        tokens.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--eos-token",
        "3",
    ];
    // The end-of-document id of `grads` masks the sequence: another loss.
    let loss = |extra: &[&str]| {
        let out = distflash(&[&grads[..], &["--workers", "2"], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["loss"].as_f64().unwrap()
    };
    let (masked, whole) = (loss(&separate), loss(&[]));
    let unnamed: Vec<&str> = [&grads[..5], &separate].concat();
    fails_with(&unnamed, "name their id with --eos-token");
    assert!((masked - whole).abs() > 1e-4 * whole, "{masked} {whole}");
    fails_with(
        &[&train[..], &["--positions", "restart"]].concat(),
        "--documents packed lets documents see each other: add --documents separate",
    );
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    fails_with(
        &[&train[..], &separate, &["--data", readme]].concat(),
        "byte data (--data without --tokenizer) has none: give --tokenizer",
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// 1000 AdamW steps at lr 2e-5 on the CPU track AdamW in f64 (`common::adamw_f64`) to f32
/// rounding: the weights of `Cpu<f32>` are f32, each step rounds them once (relative error at
/// most 2⁻²⁴ a step). A 16-bit weight, emulated by rounding the f32 weight to bf16 after each
/// update as the GPU's store does, is lost when updated in place: each update (about 2e-5, on
/// weights of magnitude 0.5 to 1) is below half a bf16 step, so the weight stays put while the
/// reference moves about 0.02. Updated through a master, it is the reference rounded once:
/// within one unit of bf16 rounding (u = 2⁻⁸) and the master's drift. `tests/gpu_ops.rs`
/// runs the same with the GPU's 16-bit kernel.
#[test]
fn a_thousand_small_adamw_steps_track_f64_and_a_16_bit_weight_needs_a_master() {
    let (n, steps, u) = (512, 1000u64, 2f64.powi(-8));
    let hp = AdamW {
        lr: 2e-5,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut rng = StdRng::seed_from_u64(3);
    let bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    let start: Vec<f32> = (0..n)
        .map(|i| bf16(rng.random_range(0.5f32..1.0) * if i % 2 == 0 { 1.0 } else { -1.0 }))
        .collect();
    let signs: Vec<f32> = (0..n)
        .map(|_| if rng.random_bool(0.5) { 1.0 } else { -1.0 })
        .collect();
    let cpu = Cpu::<f32>::new();
    let zeros = || (vec![0f32; n], vec![0f32; n]);
    // f32 weights; a 16-bit weight with a master; one updated in place.
    let (mut exact, mut with_master, mut in_place) = (start.clone(), start.clone(), start.clone());
    let mut master = start.clone();
    let (mut s1, mut s2, mut s3) = (zeros(), zeros(), zeros());
    let mut r: Vec<f64> = start.iter().map(|&x| x.into()).collect();
    let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
    fn state((m, v): &mut (Vec<f32>, Vec<f32>)) -> AdamState<&mut Vec<f32>> {
        AdamState { m, v, master: None }
    }
    for step in 1..=steps {
        let g: Vec<f32> = signs
            .iter()
            .map(|s| s * rng.random_range(0.5f32..1.5))
            .collect();
        cpu.adamw(
            &mut exact,
            &g,
            state(&mut s1),
            &hp,
            AdamStep::unscaled(step),
            true,
        )
        .unwrap();
        let through_master = AdamState {
            master: Some(&mut master),
            ..state(&mut s2)
        };
        cpu.adamw(
            &mut with_master,
            &g,
            through_master,
            &hp,
            AdamStep::unscaled(step),
            true,
        )
        .unwrap();
        cpu.adamw(
            &mut in_place,
            &g,
            state(&mut s3),
            &hp,
            AdamStep::unscaled(step),
            true,
        )
        .unwrap();
        // The 16-bit store.
        for w in with_master.iter_mut().chain(&mut in_place) {
            *w = bf16(*w);
        }
        common::adamw_f64(&mut r, &g, (&mut m, &mut v), &hp, step);
    }
    let relative = |w: &[f32]| {
        w.iter()
            .zip(&r)
            .map(|(&x, &r)| (f64::from(x) - r).abs() / r.abs())
            .fold(0.0, f64::max)
    };
    let f32_drift = steps as f64 * 2f64.powi(-24);
    let moved = r
        .iter()
        .zip(&start)
        .map(|(&r, &s)| (r - f64::from(s)).abs());
    let moved = moved.fold(0.0, f64::max);
    let (exact, master_err) = (relative(&exact), relative(&master));
    let (units, stuck) = (relative(&with_master) / u, relative(&in_place) / u);
    println!(
        "moved {moved:.2e}; f32 {exact:.2e}, master {master_err:.2e} (bound {f32_drift:.2e}); 16-bit in units of rounding: with a master {units:.3}, in place {stuck:.2}"
    );
    assert!(
        moved > 4.0 * u,
        "the reference must move several bf16 steps: {moved}"
    );
    assert!(exact <= f32_drift, "{exact}");
    assert!(master_err <= f32_drift, "{master_err}");
    assert!(units <= 1.0 + f32_drift + f32_drift / u, "{units}");
    assert!(
        stuck > 2.0,
        "the in-place update must show its drift: {stuck}"
    );
}

/// The global-norm clip rides inside AdamW ([`AdamStep::clipped`]): gradients of norm (one
/// `sum_squares` over every tensor) above the clip update the moments and the weights as the f64
/// update of the gradients scaled to the clip does; below the clip, or with none, they are taken
/// as they are. The moments start away from zero, so the weights depend on the scale too.
#[test]
fn a_clipped_update_is_the_update_of_the_gradients_scaled_to_the_clip() {
    let hp = AdamW {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut rng = StdRng::seed_from_u64(5);
    let mut draw = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(lo..hi)).collect()
    };
    let grads = [draw(37, -1.0, 1.0), draw(11, -1.0, 1.0)];
    let cpu = Cpu::<f32>::new();
    let squares: f64 = grads.iter().flatten().map(|&g| f64::from(g).powi(2)).sum();
    let summed = cpu.sum_squares(&[&grads[0], &grads[1]]).unwrap();
    assert!(
        (summed - squares).abs() <= 1e-12 * squares,
        "{summed} vs {squares}"
    );
    let norm = squares.sqrt();
    for (clip, scale) in [(norm / 4.0, 0.25), (norm * 2.0, 1.0), (0.0, 1.0)] {
        let at = AdamStep::clipped(3, clip, norm);
        assert!(
            (at.grad_scale - scale).abs() <= 1e-15,
            "{at:?} for clip {clip}"
        );
        for g in &grads {
            let n = g.len();
            let (p0, m0, v0) = (draw(n, -1.0, 1.0), draw(n, -0.1, 0.1), draw(n, 0.0, 0.01));
            let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
            let state = AdamState {
                m: &mut m,
                v: &mut v,
                master: None,
            };
            cpu.adamw(&mut p, g, state, &hp, at, true).unwrap();
            let widen = |x: &[f32]| x.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
            let (mut rp, mut rm, mut rv) = (widen(&p0), widen(&m0), widen(&v0));
            let scaled: Vec<f32> = g.iter().map(|&x| x * at.grad_scale as f32).collect();
            common::adamw_f64(&mut rp, &scaled, (&mut rm, &mut rv), &hp, 3);
            // Each is a few f32 operations from the same f32 inputs, so within a few roundings
            // of its operands' size (the weights ~1, the moments' starts ~0.1 and ~0.01, and
            // the new gradient's share, up to 0.1 and 0.05); a
            // moment from the unscaled gradient is off by 75% of its gradient's share.
            let sizes = [
                ("p", &p, &rp, 1.0f64),
                ("m", &m, &rm, 0.1),
                ("v", &v, &rv, 0.01),
            ];
            for (name, got, want, size) in sizes {
                for (&x, &r) in got.iter().zip(want.iter()) {
                    let err = (f64::from(x) - r).abs();
                    let bound = 1e-6 * size.max(r.abs());
                    assert!(err <= bound, "{name}: {x} vs {r} at clip {clip}");
                }
            }
        }
    }
}
