//! Communication volume predicted by a plan: how many elements each payload holds and how many
//! bytes each worker sends. `exec` is tested to send exactly this much.
//!
//! With `n_c` rows in chunk c, `B` batch, `H` query heads, `G` KV heads and `d` head dim:
//!
//! | payload | elements |
//! | --- | --- |
//! | K/V | 2·B·G·n·d |
//! | Q | B·H·n·d |
//! | partial (O, LSE) | B·H·n·(d + 1) |
//! | Q, dO, LSE, D | B·H·n·(2d + 2) |
//! | dK, dV | 2·B·G·n·d |
//! | dQ | B·H·n·d |
//!
//! The closed forms per pass (equal chunks n = N/P) and their relation to the paper's N·d
//! forward and 2N·d backward are derived in `docs/communication.md`.

use super::parts::{Payload, Step, Transfer};
use super::plans::Plan;
use crate::shape::{Dims, Part, Precision};

/// The tensors `payload` carries for a chunk of `rows` rows, in the order they travel.
pub fn parts(payload: Payload, dims: &Dims, rows: usize) -> Vec<Part> {
    let (q, kv, stat) = (dims.q_len(rows), dims.kv_len(rows), dims.stat_len(rows));
    let input = |len| Part {
        len,
        precision: Precision::Input,
    };
    let f32 = |len| Part {
        len,
        precision: Precision::F32,
    };
    match payload {
        Payload::KeyValue => vec![input(kv), input(kv)],
        Payload::Query => vec![input(q)],
        Payload::PartialOut => vec![f32(q), f32(stat)],
        Payload::QueryGradInputs => vec![input(q), input(q), f32(stat), f32(stat)],
        Payload::KvGrad => vec![f32(kv), f32(kv)],
        Payload::QueryGrad => vec![f32(q)],
    }
}

/// Elements carried by `payload` for a chunk of `rows` rows.
pub fn elements(payload: Payload, dims: &Dims, rows: usize) -> usize {
    parts(payload, dims, rows).iter().map(|p| p.len).sum()
}

/// Elements each worker sends over the whole plan, given the chunk sizes.
pub fn elements_sent(plan: &Plan, dims: &Dims, chunk_rows: &[usize]) -> Vec<usize> {
    let mut sent = vec![0; plan.workers];
    for transfer in plan
        .steps
        .iter()
        .flat_map(|s| s.fetches.iter().chain(&s.returns))
    {
        sent[transfer.from] += elements(transfer.payload, dims, chunk_rows[transfer.chunk]);
    }
    sent
}

/// Bytes carried by `payload` for a chunk of `rows` rows when inputs (Q, K, V, dO) travel as
/// `input_bytes`-byte values and statistics, partial results and gradients as f32 — what the
/// GPU path sends (bf16 inputs: `input_bytes` = 2).
pub fn bytes(payload: Payload, dims: &Dims, rows: usize, input_bytes: usize) -> usize {
    parts(payload, dims, rows)
        .iter()
        .map(|p| match p.precision {
            Precision::Input => p.len * input_bytes,
            Precision::F32 => p.len * 4,
        })
        .sum()
}

/// The most bytes of communication buffers each worker holds at once during the backward pass,
/// when inputs travel as `input_bytes`-byte values. At step t the executor
/// (`exec::Worker::backward`, overlapping transfers with compute) holds the inputs fetched for
/// step t, the receive buffers of step t + 1's fetches (posted before step t computes), the f32
/// gradients it computes for other workers' chunks (each returned at the end of step t) and the
/// receive buffers of the gradients returned to it at step t; all of them are gone by step
/// t + 1. The memory estimate of a multi-GPU rank adds this to its own tensors
/// (`model::cost::rank_step_memory`).
pub fn backward_buffers(
    plan: &Plan,
    dims: &Dims,
    chunk_rows: &[usize],
    input_bytes: usize,
) -> Vec<usize> {
    let size = |t: &Transfer| bytes(t.payload, dims, chunk_rows[t.chunk], input_bytes);
    let fetched = |w: usize, step: Option<&Step>| -> usize {
        step.map_or(0, |s| {
            s.fetches.iter().filter(|t| t.to == w).map(size).sum()
        })
    };
    (0..plan.workers)
        .map(|w| {
            plan.steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let returns: usize = s
                        .returns
                        .iter()
                        .filter(|t| t.from == w || t.to == w)
                        .map(size)
                        .sum();
                    fetched(w, Some(s)) + fetched(w, plan.steps.get(i + 1)) + returns
                })
                .max()
                .unwrap_or(0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Pass, Schedule};

    #[test]
    fn backward_buffers_of_two_workers() {
        // Balanced, two workers: at step 1 worker 1 computes its queries against worker 0's
        // K/V (fetched, posted during step 0) and returns dK, dV of chunk 0 to worker 0.
        let dims = Dims {
            batch: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let plan = Plan::new(2, Schedule::Balanced, Pass::Backward).unwrap();
        let rows = [10, 10];
        let kv = 2 * 10 * 2 * 8; // K and V of chunk 0: 320 values
        assert_eq!(
            backward_buffers(&plan, &dims, &rows, 2),
            // Worker 0 receives the f32 gradients; worker 1 holds the 16-bit K/V it fetched and
            // the f32 gradients it computed.
            vec![kv * 4, kv * 2 + kv * 4]
        );
        let one = Plan::new(1, Schedule::Balanced, Pass::Backward).unwrap();
        assert_eq!(backward_buffers(&one, &dims, &[10], 2), vec![0]);
    }

    #[test]
    fn backward_buffers_count_every_payload_the_worker_touches() {
        // Against a direct count over all steps: no step holds more than the sum of what the
        // worker receives and returns over the whole pass, and the step that holds most holds
        // at least its largest single transfer.
        let dims = Dims {
            batch: 2,
            heads: 8,
            kv_heads: 2,
            head_dim: 16,
        };
        for workers in 2..=8 {
            for schedule in [Schedule::Unbalanced, Schedule::Balanced, Schedule::Zigzag] {
                let plan = Plan::new(workers, schedule, Pass::Backward).unwrap();
                let rows: Vec<usize> = (0..plan.chunks()).map(|c| 7 + c).collect();
                let got = backward_buffers(&plan, &dims, &rows, 2);
                for (w, &held) in got.iter().enumerate() {
                    let mine: Vec<usize> = plan
                        .steps
                        .iter()
                        .flat_map(|s| {
                            let fetched = s.fetches.iter().filter(|t| t.to == w);
                            fetched.chain(s.returns.iter().filter(|t| t.from == w || t.to == w))
                        })
                        .map(|t| bytes(t.payload, &dims, rows[t.chunk], 2))
                        .collect();
                    let total: usize = mine.iter().sum();
                    let largest = mine.iter().copied().max().unwrap_or(0);
                    assert!(held <= total, "{workers} {schedule} w{w}: {held} > {total}");
                    assert!(
                        held >= largest,
                        "{workers} {schedule} w{w}: {held} < {largest}"
                    );
                }
            }
        }
    }
}
