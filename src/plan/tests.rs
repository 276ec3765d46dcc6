use super::*;
use std::collections::HashMap;

fn both(workers: usize) -> [(Plan, Plan); 2] {
    [Schedule::Unbalanced, Schedule::Balanced].map(|s| {
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
            for i in 0..p {
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
fn each_worker_does_at_most_one_task_per_step_with_one_local_operand() {
    for p in 1..=16 {
        for (plan, _) in both(p) {
            for step in &plan.steps {
                let mut workers: Vec<_> = step.tasks.iter().map(|t| t.worker).collect();
                workers.sort();
                workers.dedup();
                assert_eq!(
                    workers.len(),
                    step.tasks.len(),
                    "P={p}: a worker has two tasks in one step"
                );
                for t in &step.tasks {
                    assert!(
                        t.q_chunk == t.worker || t.kv_chunk == t.worker,
                        "P={p}: {t:?} has no local operand"
                    );
                }
            }
        }
    }
}

/// Every remote operand is fetched by exactly one transfer of the same step, from its owner;
/// every helper result goes back to the query's owner; nothing else moves.
#[test]
fn transfers_match_the_tasks_that_need_them() {
    for p in 1..=16 {
        for (fwd, bwd) in both(p) {
            for plan in [&fwd, &bwd] {
                for (t, step) in plan.steps.iter().enumerate() {
                    let mut want_fetch = Vec::new();
                    let mut want_return = Vec::new();
                    for task in &step.tasks {
                        let (w, i, j) = (task.worker, task.q_chunk, task.kv_chunk);
                        match (task.role(), plan.pass) {
                            (Role::Diagonal, _) => {}
                            (Role::Owner, Pass::Forward) => {
                                want_fetch.push((j, w, j, Payload::KeyValue))
                            }
                            (Role::Owner, Pass::Backward) => {
                                want_fetch.push((j, w, j, Payload::KeyValue));
                                want_return.push((w, j, j, Payload::KvGrad));
                            }
                            (Role::Helper, Pass::Forward) => {
                                want_fetch.push((i, w, i, Payload::Query));
                                want_return.push((w, i, i, Payload::PartialOut));
                            }
                            (Role::Helper, Pass::Backward) => {
                                want_fetch.push((i, w, i, Payload::QueryGradInputs));
                                want_return.push((w, i, i, Payload::QueryGrad));
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
                    assert_eq!(
                        as_tuple(&step.fetches),
                        want_fetch,
                        "P={p} {:?} step {t}",
                        plan.pass
                    );
                    assert_eq!(
                        as_tuple(&step.returns),
                        want_return,
                        "P={p} {:?} step {t}",
                        plan.pass
                    );
                    assert!(
                        step.fetches
                            .iter()
                            .chain(&step.returns)
                            .all(|x| x.from != x.to && x.from < p && x.to < p)
                    );
                }
            }
        }
    }
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
fn chunk_sizes_cover_the_sequence_evenly() {
    assert_eq!(chunk_sizes(10, 4).unwrap(), vec![3, 3, 2, 2]);
    assert_eq!(chunk_sizes(8, 8).unwrap(), vec![1; 8]);
    assert!(chunk_sizes(3, 4).is_err());
    assert!(chunk_sizes(3, 0).is_err());
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
