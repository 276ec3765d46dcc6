//! Attention under masks (packed documents, sliding windows, global tokens), distributed on CPU
//! threads: against the f64 oracle under the same mask for every worker count 1..=8 and every
//! schedule, with documents of random lengths (one-token ones included, crossing chunk
//! boundaries) and windows narrower and wider than a chunk; bytes moved against the masked
//! plan's prediction and against the unmasked one; and the flags of `attention`, `plan` and
//! `simulate`.

mod common;

use common::distflash;
use distflash::block_math::oracle;
use distflash::harness::{AttentionRun, on_cpu_threads as run_attention};
use distflash::inputs::{Inputs, random_doc_lens};
use distflash::plan::{Partition, Pass, Schedule, volume};
use distflash::shape::{Dims, Mask};
use std::process::Output;
use std::time::Duration;

const SCHEDULES: [Schedule; 4] = [
    Schedule::Unbalanced,
    Schedule::Balanced,
    Schedule::Zigzag,
    Schedule::Greedy,
];
const TOL: f64 = 1e-5;
const TIMEOUT: Duration = Duration::from_secs(60);

fn dims(heads: usize, kv_heads: usize, head_dim: usize) -> Dims {
    Dims {
        batch: 2,
        heads,
        kv_heads,
        head_dim,
    }
}

/// max |got − want| / max |want|, infinite for a non-finite result. The scale has a floor of
/// 0.1: under a window of one token (or one-token documents) dQ and dK are exactly zero, and
/// f32 lands a few 1e-7 from it.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "tensor sizes differ");
    if got.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    let err = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
    err / scale.max(0.1)
}

/// Every worker count up to 8 the sequence allows and every schedule, against the oracle run
/// under the same mask.
fn check_against_oracle(x: &Inputs, most_workers: usize) {
    let fwd = oracle::forward(&x.problem());
    let bwd = oracle::backward(&x.problem());
    for workers in 1..=most_workers.min(x.seq / 2) {
        for schedule in SCHEDULES {
            let run = run_attention(x, workers, schedule, TIMEOUT).unwrap();
            let what = format!("{} seq {} P={workers} {schedule}", x.mask, x.seq);
            for (name, got, want) in [
                ("out", &run.out, &fwd.out),
                ("lse", &run.lse, &fwd.lse),
                ("dq", &run.dq, &bwd.dq),
                ("dk", &run.dk, &bwd.dk),
                ("dv", &run.dv, &bwd.dv),
            ] {
                let e = rel_err(got, want);
                assert!(e <= TOL, "{what}: {name} relative error {e:e} > {TOL:e}");
            }
        }
    }
}

fn masked(
    d: Dims,
    seq: usize,
    seed: u64,
    docs: &[usize],
    window: Option<usize>,
    global: usize,
) -> Inputs {
    let mask = Mask::new(seq, docs, window, global).unwrap();
    Inputs::random(d, seq, seed).with_mask(mask).unwrap()
}

#[test]
fn packed_documents_match_the_oracle() {
    let d = dims(4, 2, 8);
    // One-token documents, at the start, inside and at the end; documents crossing chunks.
    check_against_oracle(&masked(d, 64, 1, &[1, 17, 1, 1, 30, 13, 1], None, 0), 8);
    let lens = random_doc_lens(71, 9, 2).unwrap();
    check_against_oracle(&masked(d, 71, 3, &lens, None, 0), 8);
    // Every token its own document: only the diagonal is visible.
    check_against_oracle(&masked(d, 24, 4, &[1; 24], None, 0), 8);
}

#[test]
fn sliding_windows_narrower_and_wider_than_a_chunk_match_the_oracle() {
    let d = dims(2, 1, 16);
    // 80 tokens: chunks of 10 (P = 8) to 80 rows, 5 to 40 for zigzag.
    check_against_oracle(&masked(d, 80, 5, &[], Some(3), 0), 8);
    check_against_oracle(&masked(d, 80, 6, &[], Some(27), 0), 8);
    check_against_oracle(&masked(d, 80, 7, &[], Some(1), 0), 8);
}

#[test]
fn documents_windows_and_global_tokens_together_match_the_oracle() {
    let d = dims(3, 3, 8);
    let lens = random_doc_lens(67, 6, 8).unwrap();
    check_against_oracle(&masked(d, 67, 9, &lens, Some(7), 0), 8);
    check_against_oracle(&masked(d, 67, 10, &lens, Some(5), 3), 8);
    check_against_oracle(&masked(d, 67, 11, &lens, None, 4), 8);
}

#[test]
fn masks_across_many_tiles_match_the_oracle() {
    // 320 rows: a worker's chunk spans several 64-row query and 128-row key tiles, and a row far
    // from the start sees the global prefix and its window as two runs with a gap between.
    let d = Dims {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        head_dim: 8,
    };
    check_against_oracle(&masked(d, 320, 12, &[200, 1, 119], Some(40), 3), 3);
}

/// Every result of a run, as bit patterns.
fn tensors(run: &AttentionRun) -> Vec<Vec<u32>> {
    [&run.out, &run.lse, &run.dq, &run.dk, &run.dv]
        .iter()
        .map(|t| t.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn a_mask_that_hides_nothing_computes_exactly_what_causal_attention_does() {
    // The first document is all global tokens, so every later token still sees every earlier
    // one: the masked path, bit for bit the causal one. (Not `greedy`, whose assignment follows
    // the visible pairs and so sums the same blocks in another order.)
    let d = dims(4, 2, 8);
    let causal = Inputs::random(d, 90, 13);
    let hides_nothing = masked(d, 90, 13, &[30, 60], None, 30);
    assert!(!hides_nothing.mask.is_causal());
    for workers in [1, 3, 4] {
        for schedule in [Schedule::Unbalanced, Schedule::Balanced, Schedule::Zigzag] {
            let a = run_attention(&causal, workers, schedule, TIMEOUT).unwrap();
            let b = run_attention(&hides_nothing, workers, schedule, TIMEOUT).unwrap();
            assert!(
                tensors(&a) == tensors(&b),
                "P={workers} {schedule}: results differ"
            );
        }
    }
}

/// Bytes each worker sent, forward and backward, as the plan predicts them (f32 on the CPU).
fn predicted(x: &Inputs, part: &Partition) -> Vec<(u64, u64)> {
    let rows: Vec<usize> = part.spans().iter().map(|s| s.len).collect();
    let sent = |pass| volume::elements_sent(part.plan(pass), &x.dims, &rows);
    let (f, b) = (sent(Pass::Forward), sent(Pass::Backward));
    f.iter()
        .zip(&b)
        .map(|(&f, &b)| (4 * f as u64, 4 * b as u64))
        .collect()
}

#[test]
fn bytes_moved_equal_the_masked_plan_and_are_fewer_than_without_the_mask() {
    let d = dims(4, 2, 8);
    let seq = 96;
    let lens = random_doc_lens(seq, 7, 14).unwrap();
    for (docs, window) in [(&lens[..], None), (&[][..], Some(6)), (&lens[..], Some(20))] {
        let x = masked(d, seq, 15, docs, window, 0);
        for workers in 1..=8 {
            for schedule in SCHEDULES {
                let what = format!("{} P={workers} {schedule}", x.mask);
                let part = Partition::masked(seq, workers, schedule, &x.mask).unwrap();
                let want = predicted(&x, &part);
                let run = run_attention(&x, workers, schedule, TIMEOUT).unwrap();
                let got: Vec<(u64, u64)> = run
                    .workers
                    .iter()
                    .map(|w| (w.forward_bytes_sent, w.backward_bytes_sent))
                    .collect();
                assert_eq!(got, want, "{what}");
                let full = predicted(&x, &Partition::new(seq, workers, schedule).unwrap());
                let total = |v: &[(u64, u64)]| v.iter().map(|(f, b)| f + b).sum::<u64>();
                assert!(total(&got) <= total(&full), "{what}");
                // A window narrower than a chunk leaves out every block two chunks or more
                // from the diagonal, and so every K/V fetch and query handed to a helper
                // for them.
                if window == Some(6) && workers >= 3 {
                    assert!(total(&got) < total(&full), "{what}: nothing saved");
                }
            }
        }
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn attention_checks_masked_runs_against_the_oracle() {
    let common = [
        "attention",
        "--seq-len",
        "150",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--head-dim",
        "8",
        "--workers",
        "3",
        "--check",
        "--json",
    ];
    for mask in [
        &["--doc-lens", "100,1,49", "--window", "16"][..],
        &["--docs", "random:5", "--global", "2", "--window", "9"][..],
    ] {
        let out = distflash(&[&common[..], mask].concat());
        assert!(out.status.success(), "{mask:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["check"]["passed"], true, "{mask:?}");
        let fraction = v["mask"]["visible_fraction"].as_f64().unwrap();
        assert!(fraction > 0.0 && fraction < 0.5, "{mask:?}: {fraction}");
        let docs = v["mask"]["doc_lens"].as_array().unwrap();
        assert_eq!(docs.len(), if mask[0] == "--docs" { 5 } else { 3 });
    }
}

#[test]
fn bad_masks_are_refused_with_one_sentence() {
    for (args, says) in [
        (
            &["--doc-lens", "100,20"][..],
            "add up to 120 tokens but the sequence has 150",
        ),
        (&["--doc-lens", "150,0"][..], "document 1 has length 0"),
        (&["--window", "0"][..], "--window 1 or more"),
        (&["--global", "151"][..], "--global 150 or fewer"),
        (&["--docs", "many"][..], "--docs takes random:N"),
        (&["--docs", "random:151"][..], "use 1 to 150 documents"),
    ] {
        let out = distflash(
            &[
                &["attention", "--seq-len", "150", "--workers", "2"][..],
                args,
            ]
            .concat(),
        );
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let out = distflash(&["plan", "--window", "8"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("give --seq-len"), "{}", stderr(&out));
}

#[test]
fn plan_lists_and_draws_the_skipped_blocks() {
    let args = ["plan", "--workers", "4", "--seq-len", "64", "--window", "8"];
    let text = distflash(&[&args[..], &["--format", "text"]].concat());
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8(text.stdout).unwrap();
    // A window of 8 within chunks of 16: only neighbours meet, in 2 steps.
    assert!(
        text.contains("window 8 (3 blocks skipped): 2 steps"),
        "{text}"
    );
    assert!(text.contains("skipped (the mask hides every pair; neither computed nor fetched): Q2·KV0, Q3·KV0, Q3·KV1"), "{text}");
    let json = distflash(&[&args[..], &["--format", "json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        v["skipped_blocks"],
        serde_json::json!([[2, 0], [3, 0], [3, 1]])
    );
    assert_eq!(v["mask"]["window"], 8);
    let svg = distflash(&[&args[..], &["--format", "svg"]].concat());
    let svg = String::from_utf8(svg.stdout).unwrap();
    assert!(svg.contains("Q3·KV0: skipped") && svg.trim_end().ends_with("</svg>"));
}

#[test]
fn simulate_predicts_from_the_masked_plans() {
    let run = |extra: &[&str]| {
        let base = ["simulate", "--workers", "4", "--seq-len", "65536", "--json"];
        let out = distflash(&[&base[..], extra].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["predictions"][0]["forward_secs"].as_f64().unwrap()
    };
    let full = run(&[]);
    let windowed = run(&["--window", "4096"]);
    // A 4K window sees about 1/8 of the causal pairs of 64K tokens.
    assert!(windowed < 0.25 * full, "{windowed} against {full}");
}
