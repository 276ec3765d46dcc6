//! The model's attention on one GPU: the whole-sequence fast path of the CUDA backend
//! (`CudaBackend::causal_forward` / `causal_backward`, under the sequence's mask: its documents,
//! the model's sliding window) behind `model::attention_api::Attention`.
//!
//! The model hands over sequence-major 16-bit tensors (`[rows, heads, head_dim]`, a linear
//! layer's output as is), which the kernels read and write in place under their strides
//! (`CallStrides::seq_major`): no head-major copies. O comes out sequence-major in the input
//! dtype; LSE stays as the kernels wrote it (f32, `[heads, rows]`: the model only keeps it for
//! the backward). The backward's dQ comes out f32 and is rounded to the input dtype; dK and dV
//! are written in the input dtype by the kernel itself under MHA (`sequence_kv_grads_half`), else
//! accumulated in f32 and rounded. dO arrives as f32 from the output projection's backward (or
//! 16-bit) and is rounded first.
//!
//! One GPU holds the whole sequence here. A rank of a multi-GPU job uses
//! `train::model_attention::Distributed` on the CUDA backend over `comm::nccl::NcclComm` instead: the
//! same interface, with the executor's block API (head-major) and communication.

use crate::block_math::{Grads, Partial};

use crate::backend::cuda::{
    CallStrides, CudaBackend, SequenceCall, Tensor, sequence_kv_grads_half,
};
use crate::model::attention_api::{Attention, WholeSequence};
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};

/// Which call of [`CudaAttention`] a workspace is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Forward,
    /// With whether dO arrives in f32 (then rounded to 16 bits first) or 16-bit.
    Backward {
        dout_f32: bool,
    },
}

/// One moment of a [`CudaAttention`] call: what it holds then besides its inputs, and which of
/// the tensors it returns exist by then. The memory estimate (`train::memory::lengths`) counts each
/// call's moments from here, so any buffer added to `forward` or `backward` belongs here too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    /// Bytes of the call's own buffers.
    pub bytes: usize,
    /// The returned tensors that exist by then, as indices into what the call returns: the
    /// forward's (O, LSE), the backward's 16-bit (dQ, dK, dV).
    pub held: &'static [usize],
}

/// The moments of each call that may be its widest:
/// - forward: one, with nothing of its own (the kernel writes the returned O and LSE, and reads
///   Q, K, V in place);
/// - backward: the kernel's (dO's 16-bit rounding if dO came in f32 — the model's comes 16-bit,
///   `Ops::activation_zeros` —, D (f32, one a row and head) and the f32 dQ, with the returned
///   16-bit dK and dV under MHA, or f32 dK and dV accumulators otherwise); then the roundings,
///   D and dO's copy gone: under GQA dK's (both f32 accumulators and 16-bit dK) and dV's, and
///   last dQ's (its f32 accumulator beside all three 16-bit gradients). Rounding the smaller
///   K-side first keeps the last moment narrow.
pub fn moments(dims: &Dims, rows: usize, call: Call) -> Vec<Moment> {
    let q = rows * dims.heads * dims.head_dim;
    let kv = rows * dims.kv_heads * dims.head_dim;
    let half = crate::model::float::HALF_BYTES;
    match call {
        Call::Forward => vec![Moment {
            bytes: 0,
            held: &[0, 1],
        }],
        Call::Backward { dout_f32 } => {
            let direct = sequence_kv_grads_half(dims, rows);
            let kv_f32 = if direct { 0 } else { 4 * 2 * kv };
            let dout = if dout_f32 { half * q } else { 0 };
            let mut m = vec![Moment {
                bytes: dout + 4 * rows * dims.heads + 4 * q + kv_f32,
                held: if direct { &[1, 2] } else { &[] },
            }];
            if !direct {
                // dK rounded while dV's accumulator is still held (dV's rounding then holds
                // 2 bytes a K element less).
                m.push(Moment {
                    bytes: 4 * q + kv_f32,
                    held: &[1],
                });
            }
            m.push(Moment {
                bytes: 4 * q,
                held: &[0, 1, 2],
            });
            m
        }
    }
}

/// The backward's widest moment in bytes, its returned 16-bit gradients included: what the hand
/// count (`model::cost`) takes for the attention's part.
pub fn widest_backward(dims: &Dims, rows: usize, dout_f32: bool) -> usize {
    let half = crate::model::float::HALF_BYTES;
    let grads = [
        dims.heads * dims.head_dim,
        dims.kv_heads * dims.head_dim,
        dims.kv_heads * dims.head_dim,
    ]
    .map(|width| half * rows * width);
    moments(dims, rows, Call::Backward { dout_f32 })
        .iter()
        .map(|m| m.bytes + m.held.iter().map(|&i| grads[i]).sum::<usize>())
        .max()
        .unwrap_or(0)
}

/// Causal attention of one whole sequence of `rows` tokens on one GPU, under a mask.
pub struct CudaAttention<'b> {
    backend: &'b CudaBackend,
    dims: Dims,
    rows: usize,
    mask: Mask,
}

impl<'b> CudaAttention<'b> {
    /// Full causal attention of `rows` tokens with the heads of `dims` (batch 1: one sequence
    /// per call, as the model runs it); [`WholeSequence::set_mask`] restricts it.
    pub fn new(backend: &'b CudaBackend, dims: Dims, rows: usize) -> Result<Self> {
        dims.validate()?;
        if dims.batch != 1 {
            bail!(
                "the model's attention runs one sequence at a time (batch 1), not {}",
                dims.batch
            );
        }
        Ok(CudaAttention {
            backend,
            dims,
            rows,
            mask: Mask::causal(),
        })
    }

    fn strides(&self) -> CallStrides {
        CallStrides::seq_major(&self.dims, self.rows)
    }

    /// `t` in the input dtype: as is, or rounded from f32 into `slot`.
    fn half<'t>(
        &self,
        t: &'t Tensor,
        slot: &'t mut Option<Tensor>,
        what: &str,
    ) -> Result<&'t Tensor> {
        Ok(match t {
            Tensor::Half { .. } => t,
            Tensor::F32(_) => {
                slot.insert(self.backend.round_to_half(t, self.dims.head_dim, what)?)
            }
        })
    }
}

impl Attention<Tensor> for CudaAttention<'_> {
    fn forward(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let call = SequenceCall {
            dims: &self.dims,
            seq: self.rows,
            mask: &self.mask,
            strides: &self.strides(),
        };
        let p = self.backend.causal_forward(&call, [q, k, v])?;
        Ok((p.out, p.lse))
    }

    fn backward(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let d = self.dims.head_dim;
        // dO's rounded copy and D are freed as the kernel returns, before the f32 gradients
        // are rounded (`moments`).
        let g = {
            let mut slot = None;
            let dout = self.half(dout, &mut slot, "dO")?;
            let strides = self.strides();
            let mut grads = self
                .backend
                .sequence_grads(&self.dims, self.rows, &strides)?;
            let fwd = Partial { out: o, lse };
            let call = SequenceCall {
                dims: &self.dims,
                seq: self.rows,
                mask: &self.mask,
                strides: &strides,
            };
            self.backend
                .causal_backward_into(&call, [q, k, v], fwd, dout, &mut grads)?;
            grads
        };
        // Each f32 gradient is freed as its 16-bit copy is made, dK and dV first (`moments`).
        let round = |t: Tensor, what| match t {
            Tensor::Half { .. } => Ok(t),
            Tensor::F32(_) => self.backend.round_to_half(&t, d, what),
        };
        let Grads { dq, dk, dv } = g;
        let dk = round(dk, "dK")?;
        let dv = round(dv, "dV")?;
        let dq = round(dq, "dQ")?;
        Ok((dq, dk, dv))
    }
}

impl WholeSequence<Tensor> for CudaAttention<'_> {
    fn set_mask(&mut self, mask: &Mask) -> Result<()> {
        mask.check_seq(self.rows)?;
        self.mask = mask.clone();
        Ok(())
    }
}
