//! Where an attention tensor's elements lie in memory, as the kernels read it (`Strides` in
//! `kernels/common.cuh`, whose twin this is): a `[batch, heads, rows, head_dim]` view with the
//! head dim contiguous, element `(b, h, r, c)` at `b·batch + h·head + r·row + c`.
//!
//! One kernel then reads and writes every layout in use without a copy: the block API's own
//! head-major tensors, the model's sequence-major `[rows, heads, head_dim]` (a linear layer's
//! output as is) and any torch view (`[b, s, h, d]` from `flash_attn`, transformers' transposed
//! `[b, h, s, d]`, a slice of a fused QKV projection). Relayout copies cost as much memory as the
//! tensors themselves and a pass over each: at 128K tokens of llama2-7b, 5 GiB and a tenth of
//! the attention's time (`bench/notes/gpu-train.md`, in git history at 40b4b1d:
//! bench/HISTORY.md).

use crate::error::Error;
use crate::shape::Dims;
use anyhow::Result;
use cudarc::driver::DeviceRepr;

/// The 16-byte vectors (cp.async, TMA, the kernels' paired stores) every row and every stride
/// must be made of, in 16-bit elements.
const VECTOR: usize = 8;

/// Element strides of an attention tensor viewed as `[batch, heads, rows, head_dim]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    pub batch: i64,
    pub head: i64,
    pub row: i64,
}

// SAFETY: three i64 in C layout, the kernels' `struct Strides { long long batch, head, row; }`;
// passed by value into the kernel's parameter space.
unsafe impl DeviceRepr for Strides {}

impl Strides {
    /// `[batch, heads, rows, head_dim]` contiguous: the block API's tensors.
    pub fn head_major(heads: usize, rows: usize, head_dim: usize) -> Strides {
        let row = head_dim as i64;
        Strides {
            batch: (heads * rows * head_dim) as i64,
            head: rows as i64 * row,
            row,
        }
    }

    /// `[batch, rows, heads, head_dim]` contiguous: the model's activations and torch's
    /// `[b, s, h, d]`.
    pub fn seq_major(heads: usize, rows: usize, head_dim: usize) -> Strides {
        Strides {
            batch: (rows * heads * head_dim) as i64,
            head: head_dim as i64,
            row: (heads * head_dim) as i64,
        }
    }

    /// Offset of element `(b, h, r, 0)`.
    pub fn offset(&self, b: usize, h: usize, r: usize) -> usize {
        (b as i64 * self.batch + h as i64 * self.head + r as i64 * self.row) as usize
    }

    /// Elements a buffer must hold for the view: one past its last element.
    pub fn extent(&self, batch: usize, heads: usize, rows: usize, head_dim: usize) -> usize {
        if batch == 0 || heads == 0 || rows == 0 {
            return 0;
        }
        self.offset(batch - 1, heads - 1, rows - 1) + head_dim
    }

    /// The same view with the stride of every dimension of size one replaced by a multiple of
    /// the vector past the view's extent (torch gives such dimensions any stride, 0 or 1
    /// included, which the kernels' vectors and the TMA unit could not take, and which never
    /// move the address).
    pub fn normalized(self, batch: usize, heads: usize, rows: usize, head_dim: usize) -> Strides {
        let [b, h, r] = [self.batch, self.head, self.row].map(|s| s.max(0));
        let span = Strides {
            batch: if batch > 1 { b } else { 0 },
            head: if heads > 1 { h } else { 0 },
            row: if rows > 1 { r } else { 0 },
        }
        .extent(batch, heads, rows, head_dim);
        let outer = span.div_ceil(VECTOR).max(1) as i64 * VECTOR as i64;
        let pick = |size: usize, s: i64| if size > 1 { s } else { outer };
        Strides {
            batch: pick(batch, self.batch),
            head: pick(heads, self.head),
            row: pick(rows, self.row),
        }
    }

    /// One sentence unless the kernels can read (and, with `written`, write) `what`, a
    /// `[batch, heads, rows, head_dim]` view under these strides: non-negative strides in whole
    /// 16-byte vectors, and for a written tensor no two elements at one address. Call on
    /// [`Strides::normalized`] strides.
    pub fn check(
        &self,
        [batch, heads, rows, head_dim]: [usize; 4],
        written: bool,
        what: &str,
    ) -> Result<()> {
        let dims = [(self.batch, batch), (self.head, heads), (self.row, rows)];
        for (s, _) in dims {
            if s < 0 || !(s as usize).is_multiple_of(VECTOR) {
                return Err(Error::invalid_input(format!(
                    "{what} has a stride of {s} elements, which the attention kernels cannot read (they move 16-byte vectors): pass a tensor whose batch, sequence and head strides are multiples of {VECTOR} elements and whose last dim is contiguous, e.g. .contiguous()"
                )));
            }
        }
        if self.row > i64::from(i32::MAX) {
            return Err(Error::invalid_input(format!(
                "{what} has rows {} elements apart, beyond the kernels' 32-bit row strides: pass a tensor whose rows lie closer, e.g. .contiguous()",
                self.row
            )));
        }
        if written {
            let mut sorted = dims.iter().filter(|(_, n)| *n > 1).collect::<Vec<_>>();
            sorted.sort_by_key(|(s, _)| *s);
            let mut reach = head_dim as i64;
            for &&(s, n) in &sorted {
                if s < reach {
                    return Err(Error::invalid_input(format!(
                        "{what} would overlap itself under strides {self:?} (batch, head, row): the attention writes it, so pass a tensor without overlapping rows, e.g. torch.empty of its shape"
                    )));
                }
                reach += s * (n as i64 - 1);
            }
        }
        Ok(())
    }
}

/// The strides of one attention call: the query side (Q, O, dO, dQ) and the key side (K, V,
/// dK, dV), each shared by the tensors of its side (`kernels/common.cuh`, `HeadRows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallStrides {
    pub q: Strides,
    pub kv: Strides,
}

impl CallStrides {
    /// Head-major tensors of `q_rows` and `kv_rows` rows: the block API's.
    pub fn head_major(dims: &Dims, q_rows: usize, kv_rows: usize) -> CallStrides {
        CallStrides {
            q: Strides::head_major(dims.heads, q_rows, dims.head_dim),
            kv: Strides::head_major(dims.kv_heads, kv_rows, dims.head_dim),
        }
    }

    /// Sequence-major tensors of one sequence of `rows` tokens: the model's.
    pub fn seq_major(dims: &Dims, rows: usize) -> CallStrides {
        CallStrides {
            q: Strides::seq_major(dims.heads, rows, dims.head_dim),
            kv: Strides::seq_major(dims.kv_heads, rows, dims.head_dim),
        }
    }

    /// Elements the query side's and the key side's tensors must hold.
    pub fn extents(&self, dims: &Dims, q_rows: usize, kv_rows: usize) -> (usize, usize) {
        (
            self.q.extent(dims.batch, dims.heads, q_rows, dims.head_dim),
            self.kv
                .extent(dims.batch, dims.kv_heads, kv_rows, dims.head_dim),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_math::layout;

    #[test]
    fn head_and_sequence_major_match_the_host_layouts() {
        // The host's relayout (block_math::layout) is the reference: element (b, s, h, c) of a
        // [b, s, h, d] tensor goes to (b, h, s, c) of the head-major one.
        let (b, s, h, d) = (2, 5, 3, 8);
        let seq: Vec<f32> = (0..b * s * h * d).map(|i| i as f32).collect();
        let head = layout::to_head_major(&seq, b, s, h, d);
        let (sm, hm) = (Strides::seq_major(h, s, d), Strides::head_major(h, s, d));
        for bi in 0..b {
            for hi in 0..h {
                for r in 0..s {
                    for c in 0..d {
                        assert_eq!(
                            seq[sm.offset(bi, hi, r) + c],
                            head[hm.offset(bi, hi, r) + c]
                        );
                    }
                }
            }
        }
        assert_eq!(sm.extent(b, h, s, d), seq.len());
        assert_eq!(hm.extent(b, h, s, d), seq.len());
        assert_eq!(
            Strides::head_major(4, 100, 64).extent(3, 4, 100, 64),
            3 * 4 * 100 * 64
        );
    }

    #[test]
    fn views_the_kernels_take_and_refuse() {
        let full = [2, 4, 16, 64];
        assert!(Strides::seq_major(4, 16, 64).check(full, true, "q").is_ok());
        assert!(
            Strides::head_major(4, 16, 64)
                .check(full, true, "q")
                .is_ok()
        );
        // A slice of a fused QKV projection ([b, s, 3, h, d]): rows 3·h·d apart, readable, and
        // writable too (its rows do not overlap).
        let fused = Strides {
            batch: 16 * 3 * 4 * 64,
            head: 64,
            row: 3 * 4 * 64,
        };
        assert!(fused.check(full, true, "q").is_ok());
        let odd = Strides {
            row: 4 * 64 + 4,
            ..Strides::seq_major(4, 16, 64)
        };
        let err = odd.check(full, false, "k").unwrap_err().to_string();
        assert!(err.starts_with("k has a stride of 260 elements"), "{err}");
        // Heads that share rows (an expanded GQA view, head stride 0) may be read, not written.
        let shared = Strides {
            head: 0,
            ..Strides::seq_major(1, 16, 64)
        };
        let shared = shared.normalized(2, 4, 16, 64);
        assert_eq!(shared.head, 0);
        assert!(shared.check(full, false, "k").is_ok());
        let err = shared.check(full, true, "dk").unwrap_err().to_string();
        assert!(err.starts_with("dk would overlap itself"), "{err}");
        // Rows closer than a head dim overlap.
        let close = Strides {
            batch: 4096,
            head: 64,
            row: 32,
        };
        assert!(close.check([1, 1, 16, 64], true, "o").is_err());
    }

    #[test]
    fn dimensions_of_one_get_strides_past_the_view() {
        // torch may give a batch of one the stride 1: it never moves the address, and becomes
        // a multiple of the vector past the view.
        let s = Strides {
            batch: 1,
            head: 64,
            row: 256,
        };
        let n = s.normalized(1, 4, 10, 64);
        assert_eq!((n.head, n.row), (64, 256));
        assert!(n.batch as usize >= s.extent(1, 4, 10, 64) && n.batch % 8 == 0);
        assert!(n.check([1, 4, 10, 64], true, "q").is_ok());
        let one_row = Strides {
            batch: 64,
            head: 64,
            row: 1,
        }
        .normalized(1, 1, 1, 64);
        assert_eq!(one_row.extent(1, 1, 1, 64), 64);
        assert!(one_row.check([1, 1, 1, 64], true, "q").is_ok());
    }

    #[test]
    fn call_strides_cover_both_sides() {
        let dims = Dims {
            batch: 1,
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
        };
        let c = CallStrides::seq_major(&dims, 1000);
        assert_eq!(
            c.extents(&dims, 1000, 1000),
            (dims.q_len(1000), dims.kv_len(1000))
        );
        assert_eq!(c.q.row, 8 * 128);
        assert_eq!(c.kv.row, 2 * 128);
        let h = CallStrides::head_major(&dims, 300, 700);
        assert_eq!(
            h.extents(&dims, 300, 700),
            (dims.q_len(300), dims.kv_len(700))
        );
    }
}
