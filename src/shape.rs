//! The shapes several modules share and none owns: an attention problem's dimensions, a run of
//! sequence positions, the attention mask (which keys each query sees), and the element count
//! and precision of one tensor a transfer carries. A leaf: it imports nothing of the crate but
//! `error` (its refusals are the caller's input, marked so), so `plan`, `block_math`, `comm`,
//! `model` and `sim` can all speak of shapes without importing each other.

use crate::error::Error;
use anyhow::Result;

/// Largest head dimension any backend accepts; tiles and GPU registers are sized for it.
pub const MAX_HEAD_DIM: usize = 256;

/// The shape of an attention problem apart from sequence length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; query head `h` reads KV head `h / (heads / kv_heads)` (GQA/MQA).
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Dims {
    /// Checks the shape once, up front, so kernels can assume it and users get one sentence.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::invalid_input("batch must be at least 1"));
        }
        if self.heads == 0 || self.kv_heads == 0 {
            return Err(Error::invalid_input(
                "heads and kv-heads must be at least 1",
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::invalid_input(format!(
                "heads ({}) must be a multiple of kv-heads ({}): each KV head serves an equal group of query heads",
                self.heads, self.kv_heads
            )));
        }
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM {
            return Err(Error::invalid_input(format!(
                "head dim {} is unsupported: use 1..={MAX_HEAD_DIM}",
                self.head_dim
            )));
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Softmax scale 1/sqrt(head_dim).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Flat (batch, KV head) index read by flat (batch, query head) index `bh`.
    pub fn kv_index(&self, bh: usize) -> usize {
        (bh / self.heads) * self.kv_heads + (bh % self.heads) / self.group()
    }

    /// Elements of a query-side tensor (Q, O, dO, dQ) with `rows` rows.
    pub fn q_len(&self, rows: usize) -> usize {
        self.batch * self.heads * rows * self.head_dim
    }

    /// Elements of a key/value-side tensor (K, V, dK, dV) with `rows` rows.
    pub fn kv_len(&self, rows: usize) -> usize {
        self.batch * self.kv_heads * rows * self.head_dim
    }

    /// Elements of a per-row statistic (m, l, LSE, D) with `rows` rows.
    pub fn stat_len(&self, rows: usize) -> usize {
        self.batch * self.heads * rows
    }
}

mod span;
pub use span::Span;

mod mask;
pub use mask::{Mask, Visible};

/// How a tensor of a payload is stored: in the backend's input precision (Q, K, V, dO: bf16 or
/// fp16 on a GPU) or always f32 (statistics, partial results, gradients).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Input,
    F32,
}

/// One tensor of a payload: its element count and precision. A receiver allocates from this
/// before the data arrives (NCCL needs the buffer up front) and checks what it got against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub len: usize,
    pub precision: Precision,
}
