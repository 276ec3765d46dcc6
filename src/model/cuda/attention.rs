//! The model's attention on one GPU: the whole-sequence fast path of the CUDA backend
//! (`CudaBackend::causal_forward` / `causal_backward`, under the sequence's mask: its documents,
//! the model's sliding window) behind `model::attention::Attention`.
//!
//! The model hands over sequence-major 16-bit tensors (`[rows, heads, head_dim]`, a linear
//! layer's output as is); the kernels want head-major ones. The layout changes run on the GPU
//! (`CudaBackend::relayout`): Q, K, V, O and dO go to head-major, O comes back sequence-major in
//! the input dtype, and the backward's f32 dQ, dK, dV come back sequence-major in the input dtype
//! (the cast fused into the move). LSE stays as the kernels wrote it (f32, head-major): the model
//! only keeps it for the backward. dO may arrive as 16-bit or f32 (then it is rounded).
//!
//! One GPU holds the whole sequence here. A rank of a multi-GPU job uses
//! `train::attention::Distributed` on the CUDA backend over `comm::nccl::NcclComm` instead: the
//! same interface and layout kernel, with the executor's block API and communication.

use crate::attn::Partial;

use crate::backend::Order;
use crate::backend::cuda::{CudaBackend, Tensor};
use crate::model::attention::{Attention, WholeSequence};
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};

/// Which call of [`CudaAttention`] a workspace is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Forward,
    Backward,
}

/// Bytes of the buffers one [`CudaAttention`] call allocates besides the tensors it returns,
/// all alive at its widest moment: the memory estimate (`model::counting`) counts
/// them from here, so any buffer added to `forward` or `backward` belongs here too.
///
/// - forward: the head-major 16-bit Q, K, V (`head_major`) and the kernel's head-major O;
/// - backward, as the kernel runs (before its outputs exist): the head-major 16-bit Q, K, V, O
///   and dO, the copy of LSE and the kernel's D (f32, one a row and head each) and its
///   head-major f32 dQ, dK, dV. Those inputs are freed before the relayouts back, whose moment
///   (the f32 gradients and the 16-bit outputs) is narrower.
pub fn workspace_bytes(dims: &Dims, rows: usize, call: Call) -> usize {
    let q = rows * dims.heads * dims.head_dim;
    let kv = rows * dims.kv_heads * dims.head_dim;
    let half = crate::model::cost::HALF_BYTES;
    match call {
        Call::Forward => half * (q + 2 * kv) + half * q,
        Call::Backward => half * (3 * q + 2 * kv) + 2 * 4 * rows * dims.heads + 4 * (q + 2 * kv),
    }
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

    /// A `[rows, heads, head_dim]` tensor as `[heads, rows, head_dim]`, or back.
    fn relayout(&self, t: &Tensor, heads: usize, to: Order, what: &str) -> Result<Tensor> {
        self.backend
            .relayout(t, self.rows, heads, self.dims.head_dim, to, what)
    }

    /// Q, K and V head-major.
    fn head_major(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<[Tensor; 3]> {
        let (h, kv) = (self.dims.heads, self.dims.kv_heads);
        Ok([
            self.relayout(q, h, Order::ToHeadMajor, "Q")?,
            self.relayout(k, kv, Order::ToHeadMajor, "K")?,
            self.relayout(v, kv, Order::ToHeadMajor, "V")?,
        ])
    }
}

impl Attention<Tensor> for CudaAttention<'_> {
    fn forward(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let [q, k, v] = self.head_major(q, k, v)?;
        let p = self
            .backend
            .causal_forward(&self.dims, self.rows, &self.mask, &q, &k, &v)?;
        let o = self.relayout(&p.out, self.dims.heads, Order::ToSeqMajor, "O")?;
        Ok((o, p.lse))
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
        let (h, kv) = (self.dims.heads, self.dims.kv_heads);
        // The head-major inputs are freed as the kernel returns, before the f32 gradients are
        // relayouted: the widest moment is the kernel's.
        let g = {
            let [q, k, v] = self.head_major(q, k, v)?;
            let fwd = Partial {
                out: self.relayout(o, h, Order::ToHeadMajor, "O")?,
                // The backward reads LSE from a `Partial`, which owns it: a copy of h·rows floats.
                lse: lse.try_clone()?,
            };
            let dout = self.relayout(dout, h, Order::ToHeadMajor, "dO")?;
            self.backend
                .causal_backward(&self.dims, self.rows, &self.mask, &q, &k, &v, &fwd, &dout)?
        };
        Ok((
            self.relayout(&g.dq, h, Order::ToSeqMajor, "dQ")?,
            self.relayout(&g.dk, kv, Order::ToSeqMajor, "dK")?,
            self.relayout(&g.dv, kv, Order::ToSeqMajor, "dV")?,
        ))
    }
}

impl WholeSequence<Tensor> for CudaAttention<'_> {
    fn set_mask(&mut self, mask: &Mask) -> Result<()> {
        mask.check_seq(self.rows)?;
        self.mask = mask.clone();
        Ok(())
    }
}
