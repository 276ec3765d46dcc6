//! The command-line contract: JSON fields other tools rely on, the saved file's layout, and one
//! sentence (no panic) for bad input.

mod common;

use common::distflash;
use distflash::block_math::{layout, oracle};
use distflash::inputs::Inputs;
use distflash::shape::{Dims, Mask};
use distflash::tensor_file;

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("distflash-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn plan_json_has_the_documented_fields() {
    let out = distflash(&[
        "plan",
        "--workers",
        "8",
        "--schedule",
        "balanced",
        "--format",
        "json",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["workers"], 8);
    assert_eq!(v["schedule"], "balanced");
    assert_eq!(v["steps"].as_array().unwrap().len(), 5);
    assert!(v["steps"][0][0]["q_chunk"].is_number() && v["steps"][0][0]["kv_chunk"].is_number());
    assert!(
        v["transfers"][1]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["payload"] == "key_value")
    );
    assert!((v["ideal_speedup"].as_f64().unwrap() - 32.0 / 4.5).abs() < 1e-9);
    assert!(v["idle_fraction"].is_number());
}

#[test]
fn plan_svg_is_written_to_a_file() {
    let path = temp_path("plan.svg");
    let out = distflash(&[
        "plan",
        "--workers",
        "5",
        "--format",
        "svg",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("worker 4"));
}

#[test]
fn saved_file_has_public_layouts_and_matches_the_oracle() {
    let path = temp_path("run.safetensors");
    let out = distflash(&[
        "attention",
        "--workers",
        "3",
        "--seq-len",
        "37",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "8",
        "--batch",
        "2",
        "--seed",
        "9",
        "--check",
        "--json",
        "--save",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["check"]["passed"], true);
    assert_eq!(report["per_worker"].as_array().unwrap().len(), 3);
    assert!(report["forward_gflops"].as_f64().unwrap() > 0.0);

    let t = tensor_file::read(&path).unwrap();
    let (b, n, h, hk, d) = (2, 37, 4, 2, 8);
    for name in ["q", "dout", "out", "dq"] {
        assert_eq!(t[name].0, vec![b, n, h, d], "{name}");
    }
    for name in ["k", "v", "dk", "dv"] {
        assert_eq!(t[name].0, vec![b, n, hk, d], "{name}");
    }
    assert_eq!(t["lse"].0, vec![b, h, n]);
    // Recompute from the saved inputs alone: the file is self-contained and in the stated layout.
    let dims = Dims {
        batch: b,
        heads: h,
        kv_heads: hk,
        head_dim: d,
    };
    let hm = |name: &str, heads| layout::to_head_major(&t[name].1, b, n, heads, d);
    let x = Inputs {
        dims,
        seq: n,
        mask: Mask::causal(),
        q: hm("q", h),
        k: hm("k", hk),
        v: hm("v", hk),
        dout: hm("dout", h),
    };
    let want = oracle::forward(&x.problem());
    let got = hm("out", h);
    let err = got
        .iter()
        .zip(&want.out)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    assert!(err < 1e-5, "saved out differs from the oracle by {err}");
    let lse_err = t["lse"]
        .1
        .iter()
        .zip(&want.lse)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    assert!(
        lse_err < 1e-5,
        "saved lse differs from the oracle by {lse_err}"
    );
    let want_g = oracle::backward(&x.problem());
    let dk = hm("dk", hk);
    let dk_err = dk
        .iter()
        .zip(&want_g.dk)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    assert!(
        dk_err < 1e-5,
        "saved dk differs from the oracle by {dk_err}"
    );
}

#[test]
fn bad_input_gets_one_sentence_and_a_nonzero_exit() {
    let cases: [(&[&str], &str); 16] = [
        (
            &["attention", "--heads", "6", "--kv-heads", "4"],
            "must be a multiple of kv-heads",
        ),
        (&["attention", "--workers", "0"], "at least 1"),
        (
            &["attention", "--seq-len", "3", "--workers", "4"],
            "too short for 4 workers",
        ),
        (
            &["attention", "--head-dim", "0"],
            "head dim 0 is unsupported",
        ),
        (
            &["attention", "--head-dim", "257"],
            "head dim 257 is unsupported",
        ),
        (
            &["attention", "--schedule", "ring"],
            "unknown schedule 'ring'",
        ),
        (
            &["plan", "--out", "/nonexistent-dir/x.svg"],
            "cannot write /nonexistent-dir/x.svg",
        ),
        (
            &["bench", "train", "--estimate", "--workers", "0"],
            "at least 1",
        ),
        (
            &[
                "bench",
                "train",
                "--estimate",
                "--seq-len",
                "3",
                "--workers",
                "4",
            ],
            "too short for 4 workers",
        ),
        // Per-block timings, refused before any GPU is looked for.
        (
            &["bench", "attention", "--blocks", "1"],
            "per-block rates need at least 2 workers' chunks",
        ),
        (
            &["bench", "attention", "--blocks", "3", "--seqs", "4096"],
            "4096 tokens do not divide by 3",
        ),
        (
            &["bench", "attention", "--blocks", "2", "--window", "64"],
            "--blocks times causal blocks only",
        ),
        // The small models' default learning rate would make a 7B diverge.
        (
            &["train", "--preset", "llama2-7b"],
            "llama2-7b has 6.74B parameters: give its learning rate with --lr",
        ),
        // --dtype is a GPU's format: on the CPU it would be silently ignored.
        (
            &["attention", "--dtype", "fp16"],
            "--dtype fp16 applies to --device cuda",
        ),
        (
            &["train", "--dtype", "bf16", "--steps", "1"],
            "--dtype bf16 applies to --device cuda",
        ),
        (
            &[
                "grads", "--dtype", "fp16", "--tokens", "t.json", "--out", "g.st",
            ],
            "--dtype fp16 applies to --device cuda",
        ),
    ];
    for (args, needle) in cases {
        let out = distflash(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn memory_estimate_of_one_gpu_of_several() {
    let estimate = |extra: &[&str]| -> serde_json::Value {
        let args = [
            &[
                "bench",
                "train",
                "--estimate",
                "--json",
                "--seq-len",
                "262144",
            ][..],
            extra,
        ]
        .concat();
        let out = distflash(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let gib = |v: &serde_json::Value| v["estimated_gib"].as_f64().unwrap();
    let one = estimate(&["--checkpoint", "layer"]);
    let two = estimate(&["--workers", "2", "--checkpoint", "layer"]);
    let zigzag = estimate(&[
        "--workers",
        "2",
        "--checkpoint",
        "layer",
        "--schedule",
        "zigzag",
    ]);
    assert_eq!(two["workers"], 2);
    assert_eq!(zigzag["schedule"], "zigzag");
    // Each GPU holds the weights and gradients but half the activations (plus the executor's
    // buffers): less than one GPU with all of them, more than half of that.
    assert!(
        gib(&two) < gib(&one) && gib(&two) > gib(&one) / 2.0,
        "{two} {one}"
    );
    assert!((96.0..96.5).contains(&gib(&two)), "{two}");
    assert!(gib(&zigzag) > gib(&two), "{zigzag} {two}");
    // Offloaded, every layer's checkpoint (x, 16-bit, under layer) waits in pinned host memory
    // and 30 of 32 leave the GPU: at the peak it holds the layer running backward and the one
    // being fetched.
    let offloaded = estimate(&["--checkpoint", "layer", "--offload", "activations"]);
    assert_eq!(offloaded["offload"], "activations");
    let bytes = |v: &serde_json::Value, k: &str| v["estimated_bytes"][k].as_f64().unwrap();
    assert_eq!(bytes(&one, "pinned_host"), 0.0);
    let checkpoints = 32.0 * 262144.0 * 4096.0 * 2.0;
    assert_eq!(bytes(&offloaded, "pinned_host"), checkpoints);
    let saved = gib(&one) - gib(&offloaded);
    let want = 30.0 / 32.0 * checkpoints / (1u64 << 30) as f64;
    assert!((saved - want).abs() < 1e-6, "{saved} vs {want}");
    let text = distflash(&[
        "bench",
        "train",
        "--estimate",
        "--seq-len",
        "131072",
        "--offload",
        "activations",
    ]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("offload activations")
            && text.contains("about 55.2 GiB")
            && text.contains("plus 64.5 GiB of pinned host memory"),
        "{text}"
    );
}

/// `--offload optimizer` (alone, `activations,optimizer`, `all`) moves AdamW's moments to pinned
/// host memory in the estimate; a misspelt part is refused
/// naming the spellings, and the step benchmark, which runs no optimizer, refuses it outside
/// `--estimate --optimizer`.
#[test]
fn offload_optimizer_moves_the_moments_to_the_host() {
    let estimate = |extra: &[&str]| -> serde_json::Value {
        let base = ["bench", "train", "--estimate", "--json", "--optimizer"];
        let out = distflash(&[&base[..], &["--seq-len", "262144"], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let bytes = |v: &serde_json::Value, k: &str| v["estimated_bytes"][k].as_f64().unwrap();
    let plain = estimate(&["--offload", "activations"]);
    for spelling in ["activations,optimizer", "all", "optimizer,activations"] {
        let both = estimate(&["--offload", spelling]);
        assert_eq!(both["offload"], "activations,optimizer", "{spelling}");
        assert_eq!(bytes(&both, "optimizer"), 0.0);
        assert_eq!(bytes(&both, "pinned_optimizer"), bytes(&plain, "optimizer"));
        assert_eq!(bytes(&both, "pinned_host"), bytes(&plain, "pinned_host"));
        // The update streams two tensors' moments through the GPU after the backward has freed
        // its tensors: at 256K they are not part of the peak.
        assert_eq!(bytes(&both, "staging"), 0.0);
        let saved =
            plain["estimated_gib"].as_f64().unwrap() - both["estimated_gib"].as_f64().unwrap();
        let moments = bytes(&plain, "optimizer") / (1u64 << 30) as f64;
        assert!((saved - moments).abs() < 1e-6, "{saved} vs {moments}");
    }
    let alone = estimate(&["--offload", "optimizer"]);
    assert_eq!(alone["offload"], "optimizer");
    assert_eq!(bytes(&alone, "pinned_host"), 0.0);
    let refused = |args: &[&str], says: &str| {
        let out = distflash(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    };
    refused(
        &["train", "--offload", "activations,moments", "--steps", "1"],
        "unknown offload 'moments' in 'activations,moments': use auto, none, activations, optimizer, activations,optimizer or all",
    );
    refused(
        &["train", "--offload", "none,optimizer", "--steps", "1"],
        "unknown offload 'none'",
    );
    refused(
        &["train", "--offload", "auto,optimizer", "--steps", "1"],
        "unknown offload 'auto'",
    );
    refused(
        &["bench", "train", "--offload", "optimizer"],
        "--offload optimizer moves AdamW's moments, which bench train counts only with --optimizer",
    );
}

#[test]
fn cuda_without_a_gpu_says_so_in_one_sentence() {
    let out = distflash(&[
        "attention",
        "--device",
        "cuda",
        "--seq-len",
        "64",
        "--heads",
        "2",
        "--kv-heads",
        "1",
    ]);
    if out.status.success() {
        return; // a machine with a GPU: the run itself is the check
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no CUDA driver found; use --device cpu")
            || err.contains("could not open CUDA device"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn training_on_cuda_without_a_gpu_says_so_in_one_sentence() {
    let tokens = temp_path("tokens.json");
    std::fs::write(&tokens, "[1, 2, 3, 4, 5]").unwrap();
    let grads_out = temp_path("grads.safetensors");
    let cases: [&[&str]; 3] = [
        &[
            "bench",
            "train",
            "--device",
            "cuda",
            "--preset",
            "tiny",
            "--seq-len",
            "64",
        ],
        &[
            "train",
            "--device",
            "cuda",
            "--steps",
            "1",
            "--seq-len",
            "64",
        ],
        &[
            "grads",
            "--device",
            "cuda",
            "--tokens",
            tokens.to_str().unwrap(),
            "--out",
            grads_out.to_str().unwrap(),
        ],
    ];
    for args in cases {
        let out = distflash(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        // CI has no GPU: the backend says so in one sentence.
        assert!(
            err.contains("no CUDA driver found; use --device cpu"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn bench_train_reports_time_throughput_and_flops() {
    let out = distflash(&[
        "bench",
        "train",
        "--preset",
        "tiny",
        "--seq-len",
        "96",
        "--layers",
        "1",
        "--repeats",
        "2",
        "--checkpoint",
        "layer",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["impl"], "distflash");
    assert_eq!(v["layers"], 1);
    assert_eq!(v["seq"], 96);
    assert_eq!(v["checkpoint"], "layer");
    assert_eq!(v["all_secs"].as_array().unwrap().len(), 2);
    assert_eq!(v["attention_forwards_per_layer"], serde_json::json!([2]));
    let step = v["step_secs"].as_f64().unwrap();
    assert!((v["tokens_per_sec"].as_f64().unwrap() * step - 96.0).abs() < 1e-6);
    assert!(v["model_tflop_per_step"].as_f64().unwrap() > 0.0);
    assert!(
        v["mfu"].is_null(),
        "no MFU against a GPU peak for a CPU run"
    );
}

#[test]
fn bench_train_over_threads_or_a_launcher_splits_the_sequence_and_loses_nothing() {
    let step = [
        "--preset",
        "tiny",
        "--seq-len",
        "96",
        "--repeats",
        "1",
        "--json",
    ];
    let alone = distflash(&[&["bench", "train"][..], &step].concat());
    let launched = distflash(
        &[
            &["launch", "--nproc-per-node", "3", "--", "bench", "train"][..],
            &step,
            &["--schedule", "unbalanced"],
        ]
        .concat(),
    );
    let threads = distflash(
        &[
            &["bench", "train"][..],
            &step,
            &["--workers", "2", "--shard", "full"],
        ]
        .concat(),
    );
    for out in [&alone, &launched, &threads] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let json = |out: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Only rank 0 reports.
    let (alone, launched, threads) = (json(&alone), json(&launched), json(&threads));
    assert_eq!(alone["workers"], 1);
    assert_eq!(launched["workers"], 3);
    assert_eq!(threads["workers"], 2);
    assert_eq!(threads["shard"], "full");
    // The same weights and tokens: the loss of the split sequence, summed over the ranks by the
    // all-reduce, is the whole sequence's up to f32 rounding.
    let a = alone["loss"].as_f64().unwrap();
    for split in [&launched, &threads] {
        let b = split["loss"].as_f64().unwrap();
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{a} vs {b}");
    }
    assert!((a - 256f64.ln()).abs() < 0.5, "{a}");
}

#[test]
fn bench_report_tables_ours_beside_the_peers() {
    let dir = temp_path("results");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("ours.jsonl"),
        r#"{"impl":"distflash","seq":4096,"head_dim":128,"fwd_tflops":300.0,"bwd_tflops":250.0,"fwdbwd_tflops":262.0,"command":"distflash bench attention"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("sdpa.jsonl"),
        "{\"impl\":\"sdpa_flash2\",\"seq\":4096,\"head_dim\":128,\"fwdbwd_tflops\":131.0}\n{\"impl\":\"sdpa_cudnn\",\"seq\":4096,\"head_dim\":128,\"fwdbwd_tflops\":524.0}\n",
    )
    .unwrap();
    let out = distflash(&["bench", "report", "--results", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.contains("| 128 | 4096 | 300 | 250 | 262 | 131 | 524 | 2.00× | 0.50× |"),
        "{md}"
    );
    assert!(md.contains("distflash bench attention"), "{md}");
    assert!(!md.contains("Training steps"), "{md}");

    // Training-step lines get their own table, distflash beside checkpointed transformers.
    let train = temp_path("train-results");
    std::fs::create_dir_all(&train).unwrap();
    std::fs::write(
        train.join("runs.jsonl"),
        [
            r#"{"impl":"distflash","layers":32,"seq":16384,"checkpoint":"remat","step_secs":1.5,"tokens_per_sec":10922.7,"mfu":0.58,"peak_memory_gib":50.0}"#,
            r#"{"impl":"hf_transformers","layers":32,"seq":16384,"checkpoint":"hf_gradient_checkpointing","step_secs":2.25,"tokens_per_sec":7281.8,"mfu":0.387,"peak_memory_gib":28.4}"#,
            r#"{"impl":"hf_transformers","layers":32,"seq":32768,"checkpoint":"none","status":"oom","peak_memory_gib":138.8}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let out = distflash(&["bench", "report", "--results", train.to_str().unwrap()]);
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.contains(
            "| 16384 | 32 | distflash | 1 | remat | 1.500 s | 10923 | 58.0% | 50.0 GiB | 1.50× |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| 32768 | 32 | hf_transformers | 1 | none | out of memory | — | — | 138.8 GiB | — |"
        ),
        "{md}"
    );
    assert!(
        !md.contains("head dim"),
        "no attention table without attention lines: {md}"
    );

    let empty = temp_path("no-results");
    std::fs::create_dir_all(&empty).unwrap();
    let out = distflash(&["bench", "report", "--results", empty.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no JSON lines"));
}

#[test]
fn the_learning_rate_warms_up_then_decays_to_the_floor() {
    let out = distflash(&[
        "train",
        "--steps",
        "4",
        "--warmup",
        "2",
        "--decay",
        "linear",
        "--lr",
        "1e-2",
        "--min-lr",
        "1e-3",
        "--seq-len",
        "32",
        "--batch",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lrs: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["lr"].as_f64())
        .collect();
    // Up to the peak in two steps, then a straight line to the floor at step 4.
    let want = [5e-3, 1e-2, 5.5e-3, 1e-3];
    assert_eq!(lrs.len(), 4, "{lrs:?}");
    for (got, want) in lrs.iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{lrs:?}");
    }
}

/// `bench train --optimizer` times the whole step as `train` runs it: each step ends with
/// AdamW's update, so a run of three steps measures its last on weights two updates have moved
/// (another loss, to the bit, than without the optimizer), while a single step's loss, made
/// before its update, is the plain step's; the report says so, and the CPU has no ideal step.
#[test]
fn bench_train_with_the_optimizer_times_the_update_too() {
    let run = |extra: &[&str]| -> serde_json::Value {
        let base = ["bench", "train", "--device", "cpu", "--preset", "tiny"];
        let args = [&base[..], &["--seq-len", "64", "--json"], extra].concat();
        let out = distflash(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let three = ["--warmup", "2", "--repeats", "1"];
    let plain = run(&three);
    let updated = run(&[&three[..], &["--optimizer"]].concat());
    assert_eq!(plain["optimizer"], false);
    assert_eq!(updated["optimizer"], true);
    assert_ne!(
        plain["loss"], updated["loss"],
        "the updates moved the weights"
    );
    let one = ["--warmup", "0", "--repeats", "1"];
    assert_eq!(
        run(&one)["loss"],
        run(&[&one[..], &["--optimizer"]].concat())["loss"]
    );
    assert!(updated["ideal_step_secs"].is_null());
    // The moments offloaded are the same update, bit for bit.
    let offloaded = run(&[&three[..], &["--optimizer", "--offload", "optimizer"]].concat());
    assert_eq!(offloaded["loss"], updated["loss"]);
}
