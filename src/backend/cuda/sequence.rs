//! The whole-sequence fast path for single-GPU training and benchmarks: a causal sequence, under
//! any [`Mask`] (packed documents, a sliding window, global tokens), in one forward launch (state
//! in registers, O in the input dtype and LSE written once) and one backward launch after the
//! D = rowsum(dO∘O) pre-pass, through the same kernels as the block API.

use super::blocks::{BlockCall, writes_kv_grads};
use super::strides::CallStrides;
use super::{CudaBackend, Tensor, launch};
use crate::block_math::{Block, Grads, GradsMut, Partial, QuerySide};
use crate::shape::{Dims, Mask, Span};
use anyhow::Result;

/// One whole-sequence call besides its tensors: the problem's dims, the sequence's length, the
/// mask over it and the strides its tensors lie under. The forward and the backward of one
/// sequence take the same call.
#[derive(Clone, Copy, Debug)]
pub struct SequenceCall<'a> {
    pub dims: &'a Dims,
    pub seq: usize,
    pub mask: &'a Mask,
    pub strides: &'a CallStrides,
}

impl SequenceCall<'_> {
    /// The call's one block: the whole sequence.
    fn block(&self) -> BlockCall<'_> {
        BlockCall {
            dims: self.dims,
            block: whole(self.seq),
            mask: self.mask,
            strides: self.strides,
        }
    }
}

impl CudaBackend {
    /// Whole-sequence causal attention forward under `call`'s mask: Q `[b, h, seq, d]`, K and V
    /// `[b, kv_h, seq, d]` in the input dtype, laid out under its strides. Returns O (input
    /// dtype, under Q's strides, which must be dense) and LSE (f32, natural log). Every row
    /// sees at least itself, under any mask.
    pub fn causal_forward(
        &self,
        call: &SequenceCall<'_>,
        [q, k, v]: [&Tensor; 3],
    ) -> Result<Partial<Tensor>> {
        let SequenceCall {
            dims, seq, strides, ..
        } = *call;
        let mut out = Partial {
            out: self.alloc_half(strides.extents(dims, seq, seq).0)?,
            lse: Tensor::F32(self.alloc_f32(dims.stat_len(seq))?),
        };
        self.causal_forward_into(call, [q, k, v], &mut out)?;
        Ok(out)
    }

    /// [`Self::causal_forward`] into caller-owned buffers (no allocation: for training loops
    /// and timing). Every element of `out` is overwritten.
    pub fn causal_forward_into(
        &self,
        call: &SequenceCall<'_>,
        [q, k, v]: [&Tensor; 3],
        out: &mut Partial<Tensor>,
    ) -> Result<()> {
        call.mask.check_seq(call.seq)?;
        self.forward_final(&call.block(), [q, k, v], out)
    }

    /// The gradients [`Self::causal_backward`] returns: dQ in f32 under Q's strides; dK and dV
    /// in the input dtype where the kernel writes them itself ([`sequence_kv_grads_half`]:
    /// MHA), else in f32 (summed over each KV head's query group), under K's strides.
    pub fn sequence_grads(
        &self,
        dims: &Dims,
        seq: usize,
        strides: &CallStrides,
    ) -> Result<Grads<Tensor>> {
        let (ql, kvl) = strides.extents(dims, seq, seq);
        let kv = || {
            if sequence_kv_grads_half(dims, seq) {
                self.alloc_half(kvl)
            } else {
                Ok(Tensor::F32(self.alloc_f32(kvl)?))
            }
        };
        Ok(Grads {
            dq: Tensor::F32(self.alloc_f32(ql)?),
            dk: kv()?,
            dv: kv()?,
        })
    }

    /// Whole-sequence causal attention backward of `call` (the forward's) from the forward's O
    /// and LSE, every tensor under its strides (O and dO under Q's). Returns the gradients of
    /// [`Self::sequence_grads`].
    pub fn causal_backward(
        &self,
        call: &SequenceCall<'_>,
        [q, k, v]: [&Tensor; 3],
        fwd: Partial<&Tensor>,
        dout: &Tensor,
    ) -> Result<Grads<Tensor>> {
        let mut grads = self.sequence_grads(call.dims, call.seq, call.strides)?;
        self.causal_backward_into(call, [q, k, v], fwd, dout, &mut grads)?;
        Ok(grads)
    }

    /// [`Self::causal_backward`] into caller-owned gradients, which are overwritten (f32 ones
    /// zeroed, then accumulated; 16-bit dK and dV written once). Allocates only D (one f32 per
    /// query row).
    pub fn causal_backward_into(
        &self,
        call: &SequenceCall<'_>,
        [q, k, v]: [&Tensor; 3],
        fwd: Partial<&Tensor>,
        dout: &Tensor,
        grads: &mut Grads<Tensor>,
    ) -> Result<()> {
        let SequenceCall {
            dims,
            seq,
            mask,
            strides,
        } = *call;
        launch::check_dims(dims)?;
        mask.check_seq(seq)?;
        let delta = self.delta_in(dims, seq, (fwd.out, strides.q), (dout, strides.q))?;
        for (t, what) in [
            (&mut grads.dq, "dQ"),
            (&mut grads.dk, "dK"),
            (&mut grads.dv, "dV"),
        ] {
            if let Tensor::F32(t) = t {
                self.stream
                    .memset_zeros(t)
                    .map_err(|e| anyhow::anyhow!("could not clear {what}: {e:?}"))?;
            }
        }
        let query = QuerySide {
            q,
            dout,
            lse: fwd.lse,
            delta: &delta,
        };
        let grads = GradsMut {
            dq: &mut grads.dq,
            dk: &mut grads.dk,
            dv: &mut grads.dv,
        };
        self.backward_in(&call.block(), query, (k, v), grads)
    }
}

/// Whether a whole-sequence backward of `dims` gets dK and dV in the input dtype, written by
/// the kernel itself ([`writes_kv_grads`]), rather than f32: what its callers allocate (the
/// model's attention, the binding) and what the memory count holds.
pub fn sequence_kv_grads_half(dims: &Dims, seq: usize) -> bool {
    writes_kv_grads(dims, whole(seq))
}

/// The block of a whole sequence: every query against every key.
fn whole(seq: usize) -> Block {
    let span = Span { start: 0, len: seq };
    Block { q: span, kv: span }
}
