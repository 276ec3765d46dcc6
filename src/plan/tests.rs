use super::*;
use crate::shape::{Mask, Span};
use std::collections::HashMap;

const ALL: [Schedule; 4] = [
    Schedule::Unbalanced,
    Schedule::Balanced,
    Schedule::Zigzag,
    Schedule::Greedy,
];

fn both(workers: usize) -> [(Plan, Plan); 4] {
    ALL.map(|s| {
        (
            Plan::new(workers, s, Pass::Forward).unwrap(),
            Plan::new(workers, s, Pass::Backward).unwrap(),
        )
    })
}

#[test]
fn every_causal_block_is_computed_exactly_once() {
    for p in 1..=16 {
        for (plan, _) in both(p) {
            let mut seen = HashMap::new();
            for task in plan.steps.iter().flat_map(|s| &s.tasks) {
                *seen.entry((task.q_chunk, task.kv_chunk)).or_insert(0) += 1;
            }
            for i in 0..plan.chunks() {
                for j in 0..=i {
                    assert_eq!(
                        seen.remove(&(i, j)),
                        Some(1),
                        "P={p} {}: block ({i},{j})",
                        plan.schedule
                    );
                }
            }
            assert!(
                seen.is_empty(),
                "P={p} {}: non-causal blocks {seen:?}",
                plan.schedule
            );
        }
    }
}

#[test]
fn every_task_has_a_local_operand_and_zigzag_steps_are_even() {
    for p in 1..=16 {
        for (plan, _) in both(p) {
            for step in &plan.steps {
                for t in &step.tasks {
                    let local =
                        plan.owner[t.q_chunk] == t.worker || plan.owner[t.kv_chunk] == t.worker;
                    assert!(local, "P={p} {}: {t:?} has no local operand", plan.schedule);
                }
                let loads: Vec<f64> = (0..p)
                    .map(|w| step.tasks_of(w).map(|t| plan.task_cost(&t)).sum())
                    .collect();
                match plan.schedule {
                    Schedule::Zigzag => assert!(
                        loads.iter().all(|&l| (l - 0.5).abs() < 1e-12),
                        "P={p}: zigzag step loads {loads:?}"
                    ),
                    _ => assert!((0..p).all(|w| step.tasks_of(w).count() <= 1)),
                }
            }
        }
    }
}

/// Every remote operand is fetched by exactly one transfer of the same step, from its owner;
/// every helper result goes back to the query's owner; nothing else moves.
fn assert_transfers_match_the_tasks(plan: &Plan) {
    let p = plan.workers;
    for (t, step) in plan.steps.iter().enumerate() {
        let mut want_fetch = Vec::new();
        let mut want_return = Vec::new();
        for task in &step.tasks {
            let (w, i, j) = (task.worker, task.q_chunk, task.kv_chunk);
            let (qo, kvo) = (plan.owner[i], plan.owner[j]);
            let want = |list: &mut Vec<_>, x| {
                if !list.contains(&x) {
                    list.push(x);
                }
            };
            match (plan.role(task), plan.pass) {
                (Role::Local, _) => {}
                (Role::Owner, Pass::Forward) => {
                    want(&mut want_fetch, (kvo, w, j, Payload::KeyValue))
                }
                (Role::Owner, Pass::Backward) => {
                    want(&mut want_fetch, (kvo, w, j, Payload::KeyValue));
                    want(&mut want_return, (w, kvo, j, Payload::KvGrad));
                }
                (Role::Helper, Pass::Forward) => {
                    want(&mut want_fetch, (qo, w, i, Payload::Query));
                    want(&mut want_return, (w, qo, i, Payload::PartialOut));
                }
                (Role::Helper, Pass::Backward) => {
                    want(&mut want_fetch, (qo, w, i, Payload::QueryGradInputs));
                    want(&mut want_return, (w, qo, i, Payload::QueryGrad));
                }
            }
        }
        let as_tuple = |v: &Vec<Transfer>| {
            let mut v: Vec<_> = v
                .iter()
                .map(|x| (x.from, x.to, x.chunk, x.payload))
                .collect();
            v.sort_by_key(|x| (x.0, x.1, x.2, x.3.index()));
            v
        };
        want_fetch.sort_by_key(|x| (x.0, x.1, x.2, x.3.index()));
        want_return.sort_by_key(|x| (x.0, x.1, x.2, x.3.index()));
        let what = format!("P={p} {} {:?} step {t}", plan.schedule, plan.pass);
        assert_eq!(as_tuple(&step.fetches), want_fetch, "{what}");
        assert_eq!(as_tuple(&step.returns), want_return, "{what}");
        assert!(
            step.fetches
                .iter()
                .chain(&step.returns)
                .all(|x| x.from != x.to && x.from < p && x.to < p)
        );
    }
}

#[test]
fn transfers_match_the_tasks_that_need_them() {
    for p in 1..=16 {
        for (fwd, bwd) in both(p) {
            assert_transfers_match_the_tasks(&fwd);
            assert_transfers_match_the_tasks(&bwd);
        }
    }
}

/// Masks of a 97-token sequence: packed documents (one-token ones among them), windows
/// narrower and wider than a chunk, global tokens.
fn masks() -> Vec<Mask> {
    let docs = [1, 30, 1, 1, 20, 40, 4];
    [
        (&docs[..], None, 0),
        (&[][..], Some(3), 0),
        (&[][..], Some(40), 0),
        (&docs[..], Some(9), 0),
        (&docs[..], Some(5), 2),
    ]
    .into_iter()
    .map(|(d, w, g)| Mask::new(97, d, w, g).unwrap())
    .collect()
}

#[test]
fn masked_plans_compute_exactly_the_blocks_with_visible_pairs() {
    for mask in masks() {
        for p in 1..=8 {
            for schedule in ALL {
                let part = Partition::masked(97, p, schedule, &mask).unwrap();
                let (fwd, bwd) = (part.plan(Pass::Forward), part.plan(Pass::Backward));
                let what = format!("{mask} P={p} {schedule}");
                let mut seen = HashMap::new();
                for task in fwd.steps.iter().flat_map(|s| &s.tasks) {
                    *seen.entry((task.q_chunk, task.kv_chunk)).or_insert(0) += 1;
                }
                for i in 0..fwd.chunks() {
                    for j in 0..fwd.chunks() {
                        let visible = part.visible_pairs(i, j) > 0;
                        let times = seen.get(&(i, j)).copied().unwrap_or(0);
                        assert_eq!(times, usize::from(visible), "{what}: block ({i},{j})");
                        assert_eq!(fwd.skipped_blocks().contains(&(i, j)), j <= i && !visible);
                    }
                }
                assert!(fwd.steps.iter().all(|s| !s.tasks.is_empty()), "{what}");
                let tasks = |plan: &Plan| -> Vec<Vec<Task>> {
                    plan.steps.iter().map(|s| s.tasks.clone()).collect()
                };
                assert_eq!(tasks(fwd), tasks(bwd), "{what}");
                assert_transfers_match_the_tasks(fwd);
                assert_transfers_match_the_tasks(bwd);
                // The cost model counts visible pairs, a full worker-sized block being 1.
                let unit = (97.0 / p as f64).powi(2);
                let whole = Span { start: 0, len: 97 };
                let pairs = mask.visible_pairs(whole, whole) as f64;
                assert!(
                    (fwd.total_work() * unit - pairs).abs() < 1e-6 * pairs,
                    "{what}"
                );
                let speedup = fwd.ideal_speedup();
                assert!(
                    speedup > 0.0 && speedup <= p as f64 + 1e-9,
                    "{what}: {speedup}"
                );
                assert!(
                    (0.0..1.0).contains(&(fwd.idle_fraction() + 1e-12)),
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn a_window_no_wider_than_a_chunk_moves_only_neighbouring_chunks() {
    // Appendix F: with W ≤ N/P, query chunk i meets key chunks i and i − 1 only.
    for p in 2..=8 {
        let seq = 12 * p + 5;
        let mask = Mask::new(seq, &[], Some(12), 0).unwrap();
        for schedule in [Schedule::Unbalanced, Schedule::Balanced] {
            let part = Partition::masked(seq, p, schedule, &mask).unwrap();
            for pass in [Pass::Forward, Pass::Backward] {
                let plan = part.plan(pass);
                assert_eq!(plan.steps.len(), 2, "P={p} {schedule}: {:?}", plan.steps);
                for task in plan.steps.iter().flat_map(|s| &s.tasks) {
                    assert!(
                        task.q_chunk - task.kv_chunk <= 1,
                        "P={p} {schedule}: {task:?}"
                    );
                }
                for t in plan
                    .steps
                    .iter()
                    .flat_map(|s| s.fetches.iter().chain(&s.returns))
                {
                    assert_eq!(t.from.abs_diff(t.to), 1, "P={p} {schedule}: {t:?}");
                }
            }
        }
    }
}

#[test]
fn a_causal_mask_gives_the_unmasked_plans() {
    for p in 1..=8 {
        for schedule in ALL {
            let part = Partition::masked(50, p, schedule, &Mask::causal()).unwrap();
            assert_eq!(
                part.plan(Pass::Forward),
                &Plan::new(p, schedule, Pass::Forward).unwrap()
            );
            assert_eq!(
                part.plan(Pass::Backward),
                &Plan::new(p, schedule, Pass::Backward).unwrap()
            );
        }
    }
    let err = Partition::masked(50, 2, Schedule::Balanced, &masks()[0]).unwrap_err();
    assert!(err.to_string().contains("cover 97 tokens"), "{err}");
}

#[test]
fn paper_speedups_for_eight_workers() {
    let balanced = Plan::new(8, Schedule::Balanced, Pass::Forward).unwrap();
    let unbalanced = Plan::new(8, Schedule::Unbalanced, Pass::Forward).unwrap();
    assert_eq!(balanced.steps.len(), 5);
    assert_eq!(unbalanced.steps.len(), 8);
    assert!((balanced.ideal_speedup() - 32.0 / 4.5).abs() < 1e-12);
    assert!((unbalanced.ideal_speedup() - 32.0 / 7.5).abs() < 1e-12);
    assert!((balanced.idle_fraction() - (1.0 - 32.0 / 36.0)).abs() < 1e-12);
}

#[test]
fn balanced_odd_worker_counts_have_no_idle_time_and_beat_unbalanced() {
    for p in (3..=15).step_by(2) {
        let plan = Plan::new(p, Schedule::Balanced, Pass::Forward).unwrap();
        assert_eq!(plan.steps.len(), p / 2 + 1);
        assert!(plan.idle_fraction().abs() < 1e-12, "P={p}");
    }
    for p in 2..=16 {
        let b = Plan::new(p, Schedule::Balanced, Pass::Forward).unwrap();
        let u = Plan::new(p, Schedule::Unbalanced, Pass::Forward).unwrap();
        assert!(b.ideal_speedup() >= u.ideal_speedup(), "P={p}");
        // The unbalanced plan idles about half the machine.
        assert!(
            (u.idle_fraction() - (1.0 - u.total_work() / (p as f64 * (p as f64 - 0.5)))).abs()
                < 1e-12
        );
    }
}

#[test]
fn zigzag_is_perfectly_balanced_for_every_worker_count() {
    for p in 1..=16 {
        let plan = Plan::new(p, Schedule::Zigzag, Pass::Forward).unwrap();
        assert_eq!(plan.steps.len(), p);
        assert!((plan.ideal_speedup() - p as f64).abs() < 1e-9, "P={p}");
        assert!(plan.idle_fraction().abs() < 1e-9);
        assert_eq!(plan.chunks_of(0), vec![0, 2 * p - 1]);
    }
    // Where the paper's schedule cannot help: two workers.
    let balanced = Plan::new(2, Schedule::Balanced, Pass::Forward).unwrap();
    assert!((balanced.ideal_speedup() - 4.0 / 3.0).abs() < 1e-12);
}

#[test]
fn chunk_sizes_cover_the_sequence_evenly() {
    assert_eq!(
        chunk_sizes(10, 4, Schedule::Balanced).unwrap(),
        vec![3, 3, 2, 2]
    );
    assert_eq!(chunk_sizes(8, 8, Schedule::Unbalanced).unwrap(), vec![1; 8]);
    assert_eq!(
        chunk_sizes(9, 2, Schedule::Zigzag).unwrap(),
        vec![3, 2, 2, 2]
    );
    assert!(chunk_sizes(3, 4, Schedule::Balanced).is_err());
    assert!(chunk_sizes(7, 4, Schedule::Zigzag).is_err());
    assert!(chunk_sizes(3, 0, Schedule::Balanced).is_err());
    assert!(Plan::new(0, Schedule::Balanced, Pass::Forward).is_err());
}

#[test]
fn renderings_carry_the_schedule() {
    let fwd = Plan::new(4, Schedule::Balanced, Pass::Forward).unwrap();
    let bwd = Plan::new(4, Schedule::Balanced, Pass::Backward).unwrap();
    let json = to_json(&fwd, &bwd);
    assert_eq!(json["workers"], 4);
    assert_eq!(json["schedule"], "balanced");
    assert_eq!(
        json["steps"][1][0],
        serde_json::json!({"worker": 0, "q_chunk": 3, "kv_chunk": 0})
    );
    assert_eq!(json["transfers"][1][0]["payload"], "query");
    assert!((json["ideal_speedup"].as_f64().unwrap() - fwd.ideal_speedup()).abs() < 1e-12);
    assert!(json["idle_fraction"].is_number());
    let text = to_text(&fwd);
    assert!(text.contains("Q3·KV0*"), "{text}");
    let svg = to_svg(&fwd);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("Q3·KV0 → w3") && svg.contains("marker-end"));
}

#[test]
fn masked_renderings_show_the_skipped_blocks() {
    let mask = Mask::new(40, &[], Some(5), 0).unwrap();
    let part = Partition::masked(40, 4, Schedule::Balanced, &mask).unwrap();
    let (fwd, bwd) = (part.plan(Pass::Forward), part.plan(Pass::Backward));
    let text = to_text(fwd);
    assert!(text.contains("under window 5 (3 blocks skipped)"), "{text}");
    assert!(text.contains("Q2·KV0, Q3·KV0, Q3·KV1"), "{text}");
    let json = to_json(fwd, bwd);
    assert_eq!(
        json["skipped_blocks"],
        serde_json::json!([[2, 0], [3, 0], [3, 1]])
    );
    assert_eq!(json["mask"]["window"], 5);
    let svg = to_svg(fwd);
    assert_eq!(svg.matches(": skipped</title>").count(), 3);
    assert_eq!(svg.matches(": cost ").count(), 7);
}

#[test]
fn greedy_matches_balanced_under_causal_attention() {
    for p in 1..=16 {
        let greedy = Plan::new(p, Schedule::Greedy, Pass::Forward).unwrap();
        let balanced = Plan::new(p, Schedule::Balanced, Pass::Forward).unwrap();
        assert_eq!(greedy.steps.len(), balanced.steps.len(), "P={p}");
        assert!(
            (greedy.ideal_speedup() - balanced.ideal_speedup()).abs() < 1e-12,
            "P={p}"
        );
    }
}

#[test]
fn greedy_balances_packed_documents_by_their_real_work() {
    // One long document over the last chunks and short ones before it: the long document's
    // blocks all sit in the last query chunks, which balanced leaves to their owners.
    let mask = Mask::new(256, &[10, 10, 10, 10, 16, 200], None, 0).unwrap();
    let plan = |schedule| {
        Partition::masked(256, 8, schedule, &mask)
            .unwrap()
            .plan(Pass::Forward)
            .clone()
    };
    let (greedy, balanced) = (plan(Schedule::Greedy), plan(Schedule::Balanced));
    assert!(
        greedy.ideal_speedup() > 1.15 * balanced.ideal_speedup(),
        "greedy {} against balanced {}",
        greedy.ideal_speedup(),
        balanced.ideal_speedup()
    );
    // Never worse than balanced on the other masks, for any worker count.
    for mask in masks() {
        for p in 1..=8 {
            let speedup = |schedule| {
                let part = Partition::masked(97, p, schedule, &mask).unwrap();
                part.plan(Pass::Forward).ideal_speedup()
            };
            let (g, b) = (speedup(Schedule::Greedy), speedup(Schedule::Balanced));
            assert!(g >= b - 1e-12, "{mask} P={p}: greedy {g} < balanced {b}");
        }
    }
}

#[test]
fn greedy_moves_no_more_than_balanced_under_causal_attention() {
    let dims = crate::shape::Dims {
        batch: 1,
        heads: 4,
        kv_heads: 4,
        head_dim: 8,
    };
    for p in 1..=16 {
        for pass in [Pass::Forward, Pass::Backward] {
            let sent = |schedule| {
                let plan = Plan::new(p, schedule, pass).unwrap();
                volume::elements_sent(&plan, &dims, &vec![10; p])
                    .iter()
                    .sum::<usize>()
            };
            let (g, b) = (sent(Schedule::Greedy), sent(Schedule::Balanced));
            assert!(g <= b, "P={p} {pass:?}: greedy {g} > balanced {b}");
        }
    }
}
