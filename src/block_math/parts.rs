//! The values one block's math reads and writes: the block itself, the online-softmax state,
//! a partial result and the gradients (a leaf: `block` and `merge` both build on it).

use crate::shape::Span;

/// Query rows `q` against key/value rows `kv`. Which of their pairs count is the mask's to say
/// (`shape::Mask`, passed beside the block): causal by position at least, so a block of any two
/// chunks, of any sizes, is well defined; its work is `Mask::visible_pairs(q, kv)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub q: Span,
    pub kv: Span,
}

/// Online-softmax state of one query chunk while blocks are folded in: running max `m`, running
/// sum `l` (both `[b, h, rows]`) and the unnormalised accumulator `acc` (`[b, h, rows, d]`).
#[derive(Clone, Debug)]
pub struct RunningState<T> {
    pub m: T,
    pub l: T,
    pub acc: T,
}

/// A finished (or partial) attention result: `out` `[b, h, rows, d]` and natural-log `lse`
/// `[b, h, rows]`. Two partials over disjoint key sets merge exactly (`merge`).
#[derive(Clone, Debug)]
pub struct Partial<T> {
    pub out: T,
    pub lse: T,
}

impl<T> Partial<T> {
    /// The same result, borrowed: what a backward reads.
    pub fn as_ref(&self) -> Partial<&T> {
        Partial {
            out: &self.out,
            lse: &self.lse,
        }
    }
}

/// Gradients a block backward accumulates into.
#[derive(Clone, Debug)]
pub struct Grads<T> {
    pub dq: T,
    pub dk: T,
    pub dv: T,
}

/// Where a block backward accumulates: dQ of its query rows, dK and dV of its key rows. Three
/// references, because they may live in different places (own chunks, scratch for fetched ones).
#[derive(Debug)]
pub struct GradsMut<'a, T> {
    pub dq: &'a mut T,
    pub dk: &'a mut T,
    pub dv: &'a mut T,
}

/// The saved query-side tensors a block backward reads: the query, the output gradient, and the
/// final LSE and D = rowsum(dO ∘ O) of those rows.
#[derive(Debug)]
pub struct QuerySide<'a, T> {
    pub q: &'a T,
    pub dout: &'a T,
    pub lse: &'a T,
    pub delta: &'a T,
}

// Manual impls: a bundle of shared references is copyable whatever `T` is (derive would demand
// `T: Copy`).
impl<T> Clone for QuerySide<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for QuerySide<'_, T> {}
