//! Conversions between the public sequence-major layout `[batch, seq, heads, head_dim]` (what
//! users, PyTorch and `--save` files use) and the internal head-major `[batch, heads, seq,
//! head_dim]`, and between a whole sequence and its row chunks.

use crate::shape::{Dims, Span};

/// Sizes of a 4-D tensor `[batch, a, b, inner]` being transposed to `[batch, b, a, inner]`.
fn swap_middle(data: &[f32], batch: usize, a: usize, b: usize, inner: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for n in 0..batch {
        for i in 0..a {
            for j in 0..b {
                let src = ((n * a + i) * b + j) * inner;
                let dst = ((n * b + j) * a + i) * inner;
                out[dst..dst + inner].copy_from_slice(&data[src..src + inner]);
            }
        }
    }
    out
}

/// `[batch, seq, heads, dim]` → `[batch, heads, seq, dim]`.
pub fn to_head_major(data: &[f32], batch: usize, seq: usize, heads: usize, dim: usize) -> Vec<f32> {
    swap_middle(data, batch, seq, heads, dim)
}

/// `[batch, heads, seq, dim]` → `[batch, seq, heads, dim]`.
pub fn to_seq_major(data: &[f32], batch: usize, seq: usize, heads: usize, dim: usize) -> Vec<f32> {
    swap_middle(data, batch, heads, seq, dim)
}

/// Rows `span` of a head-major tensor `[outer, seq, width]` (outer = batch·heads), as a
/// contiguous `[outer, span.len, width]` tensor: one worker's chunk.
pub fn take_rows(data: &[f32], outer: usize, seq: usize, width: usize, span: Span) -> Vec<f32> {
    (0..outer)
        .flat_map(|o| &data[(o * seq + span.start) * width..(o * seq + span.end()) * width])
        .copied()
        .collect()
}

/// Concatenates chunks `[outer, len_i, width]` along rows into `[outer, Σ len_i, width]`.
pub fn join_rows(chunks: &[Vec<f32>], outer: usize, width: usize) -> Vec<f32> {
    let seq: usize = chunks.iter().map(|c| c.len() / (outer * width)).sum();
    let mut out = Vec::with_capacity(outer * seq * width);
    for o in 0..outer {
        for chunk in chunks {
            let len = chunk.len() / (outer * width);
            out.extend_from_slice(&chunk[o * len * width..(o + 1) * len * width]);
        }
    }
    out
}

/// Every chunk's results (O, LSE, dQ, dK, dV, head-major), in chunk order, joined into the
/// whole sequence's: how a distributed run's ranks' pieces are put back together.
pub fn join_results<'a>(
    dims: &Dims,
    chunks: impl Iterator<Item = &'a [Vec<f32>; 5]> + Clone,
) -> [Vec<f32>; 5] {
    let (q_rows, kv_rows) = (dims.batch * dims.heads, dims.batch * dims.kv_heads);
    let shapes = [
        (q_rows, dims.head_dim),
        (q_rows, 1),
        (q_rows, dims.head_dim),
        (kv_rows, dims.head_dim),
        (kv_rows, dims.head_dim),
    ];
    std::array::from_fn(|i| {
        let pieces: Vec<Vec<f32>> = chunks.clone().map(|t| t[i].clone()).collect();
        join_rows(&pieces, shapes[i].0, shapes[i].1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip_and_place_elements() {
        let (b, n, h, d) = (2, 5, 3, 4);
        let data: Vec<f32> = (0..b * n * h * d).map(|x| x as f32).collect();
        let hm = to_head_major(&data, b, n, h, d);
        // element [1, 2, 0, 3] of the sequence-major tensor sits at [1, 0, 2, 3] head-major
        assert_eq!(hm[(h * n + 2) * d + 3], data[(n + 2) * h * d + 3]);
        assert_eq!(to_seq_major(&hm, b, n, h, d), data);
        let spans = [Span { start: 0, len: 2 }, Span { start: 2, len: 3 }];
        let parts: Vec<_> = spans
            .iter()
            .map(|&s| take_rows(&hm, b * h, n, d, s))
            .collect();
        assert_eq!(join_rows(&parts, b * h, d), hm);
    }
}
