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

use super::{Payload, Plan};
use crate::attn::Dims;

/// Elements carried by `payload` for a chunk of `rows` rows.
pub fn elements(payload: Payload, dims: &Dims, rows: usize) -> usize {
    let (q, kv, stat) = (dims.q_len(rows), dims.kv_len(rows), dims.stat_len(rows));
    match payload {
        Payload::KeyValue | Payload::KvGrad => 2 * kv,
        Payload::Query | Payload::QueryGrad => q,
        Payload::PartialOut => q + stat,
        Payload::QueryGradInputs => 2 * q + 2 * stat,
    }
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
    let (q, kv, stat) = (dims.q_len(rows), dims.kv_len(rows), dims.stat_len(rows));
    match payload {
        Payload::KeyValue => 2 * kv * input_bytes,
        Payload::Query => q * input_bytes,
        Payload::PartialOut => (q + stat) * 4,
        Payload::QueryGradInputs => 2 * q * input_bytes + 2 * stat * 4,
        Payload::KvGrad => 2 * kv * 4,
        Payload::QueryGrad => q * 4,
    }
}
