//! The whole-sequence fast path for single-GPU training and benchmarks: a causal sequence, under
//! any [`Mask`] (packed documents, a sliding window, global tokens), in one forward launch (state
//! in registers, O in the input dtype and LSE written once) and one backward launch after the
//! D = rowsum(dO∘O) pre-pass, through the same kernels as the block API.

use super::tensor::f32_mut;
use super::{CudaBackend, Tensor, launch};
use crate::attn::{Block, Grads, GradsMut, Partial, QuerySide};
use crate::backend::Backend;
use crate::shape::{Dims, Mask, Span};
use anyhow::Result;

impl CudaBackend {
    /// Whole-sequence causal attention forward under `mask`: Q `[b, h, seq, d]`, K and V
    /// `[b, kv_h, seq, d]` in the input dtype. Returns O (input dtype, head-major) and LSE (f32,
    /// natural log). Every row sees at least itself, under any mask.
    pub fn causal_forward(
        &self,
        dims: &Dims,
        seq: usize,
        mask: &Mask,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Partial<Tensor>> {
        let mut out = Partial {
            out: self.alloc_half(dims.q_len(seq))?,
            lse: Tensor::F32(self.alloc_f32(dims.stat_len(seq))?),
        };
        self.causal_forward_into(dims, seq, mask, q, k, v, &mut out)?;
        Ok(out)
    }

    /// [`Self::causal_forward`] into caller-owned buffers (no allocation: for training loops
    /// and timing). Every element of `out` is overwritten.
    #[allow(clippy::too_many_arguments)]
    pub fn causal_forward_into(
        &self,
        dims: &Dims,
        seq: usize,
        mask: &Mask,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Partial<Tensor>,
    ) -> Result<()> {
        mask.check_seq(seq)?;
        let whole = Span { start: 0, len: seq };
        self.forward_final(
            dims,
            Block {
                q: whole,
                kv: whole,
            },
            mask,
            q,
            k,
            v,
            out,
        )
    }

    /// Whole-sequence causal attention backward under `mask` (the forward's) from the forward's
    /// O and LSE. Returns dQ, dK, dV in f32 (head-major; dK, dV summed over each KV head's query
    /// group).
    #[allow(clippy::too_many_arguments)]
    pub fn causal_backward(
        &self,
        dims: &Dims,
        seq: usize,
        mask: &Mask,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        fwd: &Partial<Tensor>,
        dout: &Tensor,
    ) -> Result<Grads<Tensor>> {
        let mut grads = Grads {
            dq: Tensor::F32(self.alloc_f32(dims.q_len(seq))?),
            dk: Tensor::F32(self.alloc_f32(dims.kv_len(seq))?),
            dv: Tensor::F32(self.alloc_f32(dims.kv_len(seq))?),
        };
        self.causal_backward_into(dims, seq, mask, q, k, v, fwd, dout, &mut grads)?;
        Ok(grads)
    }

    /// [`Self::causal_backward`] into caller-owned f32 gradients, which are overwritten (zeroed,
    /// then accumulated). Allocates only D (one f32 per query row).
    #[allow(clippy::too_many_arguments)]
    pub fn causal_backward_into(
        &self,
        dims: &Dims,
        seq: usize,
        mask: &Mask,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        fwd: &Partial<Tensor>,
        dout: &Tensor,
        grads: &mut Grads<Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        mask.check_seq(seq)?;
        let delta = self.delta(dims, seq, &fwd.out, dout)?;
        for (t, len, what) in [
            (&mut grads.dq, dims.q_len(seq), "dQ"),
            (&mut grads.dk, dims.kv_len(seq), "dK"),
            (&mut grads.dv, dims.kv_len(seq), "dV"),
        ] {
            let t = f32_mut(t, len, what)?;
            self.stream
                .memset_zeros(t)
                .map_err(|e| anyhow::anyhow!("could not clear {what}: {e:?}"))?;
        }
        let whole = Span { start: 0, len: seq };
        let query = QuerySide {
            q,
            dout,
            lse: &fwd.lse,
            delta: &delta,
        };
        self.backward_block(
            dims,
            Block {
                q: whole,
                kv: whole,
            },
            mask,
            query,
            k,
            v,
            GradsMut {
                dq: &mut grads.dq,
                dk: &mut grads.dk,
                dv: &mut grads.dv,
            },
        )
    }
}
