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

use super::parts::Payload;
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
