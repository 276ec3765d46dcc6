//! The math of one attention block, independent of schedules and communication.
//!
//! Every tensor here is *head-major*: `[batch, heads, rows, head_dim]` for Q, K, V, O and their
//! gradients, `[batch, heads, rows]` for per-row statistics (m, l, LSE, D). Head-major keeps one
//! head's rows contiguous, which is what both the CPU tiles and the GPU kernels read. The public
//! file format (`--save`) is `[batch, seq, heads, head_dim]`; `layout` converts at that edge.
//!
//! A block is the query rows of one chunk against the key/value rows of another. Rows carry their
//! absolute position in the sequence (`Span`), so the causal mask is "key position ≤ query
//! position" for any pair of chunks, of any sizes, and a `shape::Mask` (packed documents, a
//! sliding window, global tokens) restricts that further by position alone.

mod block;
pub mod layout;
mod merge;
pub mod oracle;
mod parts;

pub use block::{backward_block, forward_block};
pub use merge::{delta, finalize, merge};
pub use parts::{Block, Grads, GradsMut, Partial, QuerySide, RunningState};

use crate::shape::{Dims, Mask, Span};

/// Forward FLOPs of a causal attention over `seq` tokens, counted as the usual 4·N²·H·d/2 (two
/// matrix products over the visible half), so our rates compare with published ones.
pub fn causal_forward_flops(dims: &Dims, seq: usize) -> f64 {
    4.0 * (seq as f64).powi(2) * dims.heads as f64 * dims.head_dim as f64 * dims.batch as f64 / 2.0
}

/// Backward FLOPs: 2.5× forward (five matrix products instead of two), the FlashAttention count.
pub fn causal_backward_flops(dims: &Dims, seq: usize) -> f64 {
    2.5 * causal_forward_flops(dims, seq)
}

/// Forward FLOPs of attention over `seq` tokens under `mask`: 4 per visible (query, key) pair,
/// head dimension and head; plain causal attention keeps [`causal_forward_flops`]'s count, so
/// rates under a mask compare with the causal ones of the same machine.
pub fn masked_forward_flops(dims: &Dims, mask: &Mask, seq: usize) -> f64 {
    if mask.is_causal() {
        return causal_forward_flops(dims, seq);
    }
    let whole = Span { start: 0, len: seq };
    let pairs = mask.visible_pairs(whole, whole) as f64;
    4.0 * pairs * dims.heads as f64 * dims.head_dim as f64 * dims.batch as f64
}

/// Backward FLOPs under `mask`: 2.5× its forward, as [`causal_backward_flops`].
pub fn masked_backward_flops(dims: &Dims, mask: &Mask, seq: usize) -> f64 {
    2.5 * masked_forward_flops(dims, mask, seq)
}
