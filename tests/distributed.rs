//! Distributed attention against the f64 oracle and against the plan's byte count, for every
//! worker count 1..=8, both schedules, MHA/GQA/MQA, several head dims, even and uneven chunks.

use distflash::block_math::oracle;
use distflash::harness::on_cpu_threads as run_attention;
use distflash::inputs::Inputs;
use distflash::plan::{Pass, Plan, Schedule, chunk_sizes, volume};
use distflash::shape::{Dims, Mask};
use std::time::Duration;

/// max |got − want| / max |want|: relative to the tensor's scale, so a tensor of small entries
/// is not judged by an absolute bar.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "tensor sizes differ");
    let err = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
    assert!(got.iter().all(|g| g.is_finite()), "non-finite output");
    err / scale.max(f64::MIN_POSITIVE)
}

const TOL: f64 = 1e-5;

fn dims(batch: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Dims {
    Dims {
        batch,
        heads,
        kv_heads,
        head_dim,
    }
}

fn check_against_oracle(d: Dims, seq: usize, seed: u64) {
    let x = Inputs::random(d, seq, seed);
    let fwd = oracle::forward(&x.problem());
    let bwd = oracle::backward(&x.problem());
    for workers in 1..=8.min(seq / 2) {
        for schedule in [Schedule::Unbalanced, Schedule::Balanced, Schedule::Zigzag] {
            let run = run_attention(&x, workers, schedule, Duration::from_secs(60)).unwrap();
            let what = format!("{d:?} seq {seq} workers {workers} {schedule}");
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

#[test]
fn mha_matches_oracle_even_and_uneven() {
    check_against_oracle(dims(2, 3, 3, 16), 48, 1); // divides 1,2,3,4,6,8
    check_against_oracle(dims(1, 2, 2, 32), 37, 2); // prime: uneven for every P > 1
}

#[test]
fn gqa_and_mqa_match_oracle() {
    check_against_oracle(dims(2, 6, 2, 8), 29, 3);
    check_against_oracle(dims(1, 4, 1, 24), 40, 4);
}

#[test]
fn head_dims_from_1_to_256_match_oracle() {
    for (i, hd) in [1, 7, 64, 256].into_iter().enumerate() {
        check_against_oracle(dims(1, 2, 1, hd), 19, 10 + i as u64);
    }
}

#[test]
fn chunks_spanning_several_tiles_match_oracle() {
    // 300 rows: chunks of 37..300 rows cross the 64-row query and 128-row key tiles.
    check_against_oracle(dims(1, 2, 1, 16), 300, 5);
}

#[test]
fn bytes_sent_equal_the_plan_prediction() {
    let d = dims(2, 4, 2, 8);
    let seq = 53;
    let x = Inputs::random(d, seq, 6);
    for workers in 1..=8 {
        for schedule in [Schedule::Unbalanced, Schedule::Balanced, Schedule::Zigzag] {
            let rows = chunk_sizes(seq, workers, schedule).unwrap();
            let run = run_attention(&x, workers, schedule, Duration::from_secs(60)).unwrap();
            let fwd = volume::elements_sent(
                &Plan::new(workers, schedule, Pass::Forward).unwrap(),
                &d,
                &rows,
            );
            let bwd = volume::elements_sent(
                &Plan::new(workers, schedule, Pass::Backward).unwrap(),
                &d,
                &rows,
            );
            for (w, report) in run.workers.iter().enumerate() {
                assert_eq!(
                    report.forward_bytes_sent,
                    4 * fwd[w] as u64,
                    "P={workers} {schedule} worker {w} forward"
                );
                assert_eq!(
                    report.backward_bytes_sent,
                    4 * bwd[w] as u64,
                    "P={workers} {schedule} worker {w} backward"
                );
            }
        }
    }
}

#[test]
fn more_workers_than_tokens_is_an_error_not_a_panic() {
    let x = Inputs::random(dims(1, 1, 1, 4), 3, 7);
    let err = run_attention(&x, 4, Schedule::Balanced, Duration::from_secs(5))
        .err()
        .unwrap();
    assert!(
        format!("{err:#}").contains("too short for 4 workers"),
        "{err:#}"
    );
}

#[test]
fn a_lone_worker_sends_nothing_and_equals_two_workers() {
    let x = Inputs::random(dims(2, 4, 2, 16), 70, 8);
    let alone = run_attention(&x, 1, Schedule::Balanced, Duration::from_secs(60)).unwrap();
    assert_eq!(alone.workers.len(), 1);
    assert_eq!(alone.workers[0].forward_bytes_sent, 0);
    assert_eq!(alone.workers[0].backward_bytes_sent, 0);
    let two = run_attention(&x, 2, Schedule::Zigzag, Duration::from_secs(60)).unwrap();
    // The same f32 sums in another order: a few ulps of the largest values.
    for (a, b) in [
        (&alone.out, &two.out),
        (&alone.dq, &two.dq),
        (&alone.dv, &two.dv),
    ] {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(err <= 1e-5 * scale, "{err} against {scale}");
    }
}

#[test]
fn a_run_after_a_warm_up_on_the_same_communicators_reports_only_its_own_bytes() {
    use distflash::harness::Strategy;
    let d = dims(1, 4, 2, 8);
    let (seq, workers) = (40, 3);
    let x = Inputs::random(d, seq, 9);
    let how = Strategy {
        warmup: true,
        ..Strategy::from(Schedule::Balanced)
    };
    let run = run_attention(&x, workers, how, Duration::from_secs(60)).unwrap();
    let rows = chunk_sizes(seq, workers, Schedule::Balanced).unwrap();
    let fwd = volume::elements_sent(
        &Plan::new(workers, Schedule::Balanced, Pass::Forward).unwrap(),
        &d,
        &rows,
    );
    let bwd = volume::elements_sent(
        &Plan::new(workers, Schedule::Balanced, Pass::Backward).unwrap(),
        &d,
        &rows,
    );
    for (w, report) in run.workers.iter().enumerate() {
        assert_eq!(report.forward_bytes_sent, 4 * fwd[w] as u64, "worker {w}");
        assert_eq!(report.backward_bytes_sent, 4 * bwd[w] as u64, "worker {w}");
    }
}

#[test]
fn serialised_communication_gives_the_same_bits_and_bytes() {
    use distflash::harness::Strategy;
    let x = Inputs::random(dims(1, 4, 2, 8), 45, 11);
    for workers in 1..=5 {
        for schedule in [Schedule::Unbalanced, Schedule::Balanced, Schedule::Zigzag] {
            let overlapped = run_attention(&x, workers, schedule, Duration::from_secs(60)).unwrap();
            let serial = Strategy {
                overlap: false,
                ..Strategy::from(schedule)
            };
            let serial = run_attention(&x, workers, serial, Duration::from_secs(60)).unwrap();
            let what = format!("P={workers} {schedule}");
            assert_eq!(overlapped.out, serial.out, "{what}");
            assert_eq!(overlapped.dq, serial.dq, "{what}");
            assert_eq!(overlapped.dk, serial.dk, "{what}");
            for (a, b) in overlapped.workers.iter().zip(&serial.workers) {
                assert_eq!(a.forward_bytes_sent, b.forward_bytes_sent, "{what}");
                assert_eq!(a.backward_bytes_sent, b.backward_bytes_sent, "{what}");
            }
        }
    }
}

#[test]
fn repeated_runs_report_median_times_and_the_same_results() {
    use distflash::harness::Strategy;
    let x = Inputs::random(dims(1, 4, 2, 8), 45, 12);
    let once = run_attention(&x, 3, Schedule::Zigzag, Duration::from_secs(60)).unwrap();
    let how = Strategy {
        warmup: true,
        repeats: 3,
        ..Strategy::from(Schedule::Zigzag)
    };
    let thrice = run_attention(&x, 3, how, Duration::from_secs(60)).unwrap();
    assert_eq!(once.out, thrice.out);
    assert_eq!(once.dv, thrice.dv);
    for (a, b) in once.workers.iter().zip(&thrice.workers) {
        assert_eq!(a.forward_bytes_sent, b.forward_bytes_sent);
        assert_eq!(a.backward_bytes_sent, b.backward_bytes_sent);
    }
    assert!(thrice.forward_secs > 0.0 && thrice.backward_secs > 0.0);
}

/// Every rank's chunk of `x` as the binding's callers hold it: `rank_call` runs each
/// rank with only its own rows (head-major per own chunk), and the chunks' results are joined
/// back into whole-sequence tensors (out, lse, dq, dk, dv).
fn run_by_rank(x: &Inputs, world: usize, schedule: Schedule) -> [Vec<f32>; 5] {
    use distflash::backend::cpu::CpuBackend;
    use distflash::block_math::layout;
    use distflash::comm::LocalComm;
    use distflash::exec::OwnChunk;
    use distflash::rank_call::RankAttention;
    use distflash::runtime::{collect_results, run_workers};

    let d = x.dims;
    let (q_rows, kv_rows) = (d.batch * d.heads, d.batch * d.kv_heads);
    let rows = x.seq / world;
    let results = run_workers(
        world,
        Duration::from_secs(60),
        |rank, comm: &mut LocalComm| {
            let call = RankAttention::new(d, rows, world, rank, schedule, &x.mask)?;
            let spans = call.partition().own_spans(rank);
            // The rule `distflash.chunk_spans` (python/distflash/dist.py) cuts sequences by.
            let (n, c) = (rows, rows / 2);
            let starts: Vec<usize> = spans.iter().map(|s| s.start).collect();
            match schedule {
                Schedule::Zigzag => assert_eq!(starts, [rank * c, (2 * world - 1 - rank) * c]),
                _ => assert_eq!(starts, [rank * n]),
            }
            let take = |t: &[f32], outer, s| layout::take_rows(t, outer, x.seq, d.head_dim, s);
            let own: Vec<_> = spans
                .iter()
                .map(|&s| OwnChunk {
                    q: take(&x.q, q_rows, s),
                    k: take(&x.k, kv_rows, s),
                    v: take(&x.v, kv_rows, s),
                })
                .collect();
            let fwd = call.forward(&CpuBackend, comm, &own)?;
            let outs: Vec<_> = fwd.iter().map(|p| (p.out.clone(), p.lse.clone())).collect();
            let dout = spans.iter().map(|&s| take(&x.dout, q_rows, s)).collect();
            let grads = call.backward(&CpuBackend, comm, &own, fwd, dout)?;
            Ok(spans
                .into_iter()
                .zip(outs)
                .zip(grads)
                .map(|((s, (o, l)), g)| (s.start, [o, l, g.dq, g.dk, g.dv]))
                .collect::<Vec<_>>())
        },
    );
    let mut chunks: Vec<_> = collect_results(results).unwrap().concat();
    chunks.sort_by_key(|(start, _)| *start);
    layout::join_results(&d, chunks.iter().map(|(_, t)| t))
}

#[test]
fn ranks_holding_only_their_chunks_match_oracle() {
    // GQA (6 query heads over 2 kv heads) and MHA; 1..=4 ranks of 10 tokens each (zigzag:
    // two chunks of 5), so chunks cross no tile but every block kind occurs.
    // Causal, and under a mask over the whole sequence (a one-token document, documents
    // across chunks, a window narrower than a chunk, a global token).
    let masks = |seq: usize| {
        [
            Mask::causal(),
            Mask::new(seq, &[1, seq / 2 - 1, seq - seq / 2], Some(4), 1).unwrap(),
        ]
    };
    for ((d, seed), mask) in [(dims(2, 6, 2, 8), 21), (dims(1, 2, 2, 16), 22)]
        .into_iter()
        .flat_map(|c| [0, 1].map(|m| (c, m)))
    {
        for world in 1..=4 {
            let x = Inputs::random(d, 10 * world, seed)
                .with_mask(masks(10 * world)[mask].clone())
                .unwrap();
            let fwd = oracle::forward(&x.problem());
            let bwd = oracle::backward(&x.problem());
            for schedule in [Schedule::Balanced, Schedule::Zigzag] {
                let got = run_by_rank(&x, world, schedule);
                let want = [&fwd.out, &fwd.lse, &bwd.dq, &bwd.dk, &bwd.dv];
                for ((name, got), want) in
                    ["out", "lse", "dq", "dk", "dv"].iter().zip(&got).zip(want)
                {
                    let e = rel_err(got, want);
                    assert!(
                        e <= TOL,
                        "{d:?} {world} ranks {schedule} {}: {name} relative error {e:e} > {TOL:e}",
                        x.mask
                    );
                }
            }
        }
    }
}

#[test]
fn a_rank_call_refuses_what_its_group_cannot_run() {
    use distflash::backend::cpu::CpuBackend;
    use distflash::comm::Solo;
    use distflash::exec::OwnChunk;
    use distflash::rank_call::RankAttention;

    let d = dims(1, 2, 1, 4);
    let err = |r: anyhow::Result<RankAttention>| r.unwrap_err().to_string();
    let new = |rows, world, rank, s| RankAttention::new(d, rows, world, rank, s, &Mask::causal());
    assert_eq!(
        err(new(8, 0, 0, Schedule::Balanced)),
        "the world size is 0; a group needs at least one rank"
    );
    assert!(err(new(8, 2, 2, Schedule::Balanced)).starts_with("rank 2 is outside a world of 2"));
    assert!(err(new(8, 2, 0, Schedule::Unbalanced)).contains("use 'balanced' or 'zigzag'"));
    assert!(err(new(0, 2, 0, Schedule::Balanced)).contains("chunk is empty"));
    assert!(err(new(7, 2, 0, Schedule::Zigzag)).contains("holds 7 tokens, an odd number"));

    let chunk = |rows: usize| OwnChunk {
        q: vec![0.0; d.q_len(rows)],
        k: vec![0.0; d.kv_len(rows)],
        v: vec![0.0; d.kv_len(rows)],
    };
    let two = new(8, 2, 0, Schedule::Balanced).unwrap();
    let e = two
        .forward(&CpuBackend, &mut Solo, &[chunk(8)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("rank 0 of 2, but its communicator is rank 0 of 1"),
        "{e}"
    );
    let one = new(8, 1, 0, Schedule::Zigzag).unwrap();
    let e = one
        .forward(&CpuBackend, &mut Solo, &[chunk(8)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("owns 2 chunks under 'zigzag', but was handed 1"),
        "{e}"
    );
    let e = one
        .forward(&CpuBackend, &mut Solo, &[chunk(4), chunk(3)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("q of own chunk 1 holds 24 elements where its rows need 32"),
        "{e}"
    );
}
