//! The block API every device implements (`Backend`) and what the model's GPU path adds to it
//! (`ModelEdge`): a leaf, so `cpu` and `cuda` build on it.

use crate::block_math::{Block, GradsMut, Partial, QuerySide, RunningState};
use crate::shape::{Dims, Mask};
use anyhow::Result;

/// The block API every device implements. Tensors are head-major (see `block_math`); the backend
/// chooses their storage type and precision (f32 host vectors on the CPU, device buffers on CUDA).
/// Per-row statistics and gradient accumulators are always at least f32.
pub trait Backend: Sync {
    /// A tensor on this device.
    type Tensor: Send + Sync;

    /// Short name for reports ("cpu", "cuda:0").
    fn name(&self) -> String;

    /// Copies host f32 data to the device, in the backend's input precision.
    fn upload(&self, host: &[f32]) -> Result<Self::Tensor>;

    /// Copies a tensor back to the host as f32.
    fn download(&self, tensor: &Self::Tensor) -> Result<Vec<f32>>;

    /// Waits until all work issued so far has finished, so host clocks time device work.
    fn synchronize(&self) -> Result<()>;

    /// A zero-filled accumulator (f32) of `len` elements.
    fn zeros(&self, len: usize) -> Result<Self::Tensor>;

    /// `dst += src`, elementwise, for gradient accumulators.
    fn add_assign(&self, dst: &mut Self::Tensor, src: &Self::Tensor) -> Result<()>;

    /// A fresh online-softmax state for `rows` query rows: m = −∞, l = 0, acc = 0.
    fn new_state(&self, dims: &Dims, rows: usize) -> Result<RunningState<Self::Tensor>>;

    /// Folds block (Q rows `block.q`, K/V rows `block.kv`) into `state`, counting only the
    /// pairs `mask` leaves visible (causal by position at least). A backend that cannot apply
    /// a mask refuses it rather than compute another one.
    fn forward_block(
        &self,
        dims: &Dims,
        block: Block,
        mask: &Mask,
        q: &Self::Tensor,
        kv: (&Self::Tensor, &Self::Tensor),
        state: &mut RunningState<Self::Tensor>,
    ) -> Result<()>;

    /// Turns a running state into (O, LSE); rows that saw no key get O = 0, LSE = −∞.
    fn finalize(
        &self,
        dims: &Dims,
        rows: usize,
        state: RunningState<Self::Tensor>,
    ) -> Result<Partial<Self::Tensor>>;

    /// Merges `other` into `into`; both cover the same rows over disjoint keys.
    fn merge(
        &self,
        dims: &Dims,
        rows: usize,
        into: &mut Partial<Self::Tensor>,
        other: &Partial<Self::Tensor>,
    ) -> Result<()>;

    /// D = rowsum(dO ∘ O), the backward's per-row constant (f32, `[b, h, rows]`).
    fn delta(
        &self,
        dims: &Dims,
        rows: usize,
        out: &Self::Tensor,
        dout: &Self::Tensor,
    ) -> Result<Self::Tensor>;

    /// Backward of one block from the final O's statistics, under the `mask` the forward ran
    /// with: accumulates dQ (for `block.q` rows) and dK, dV (for `block.kv` rows) into `grads`.
    fn backward_block(
        &self,
        dims: &Dims,
        block: Block,
        mask: &Mask,
        query: QuerySide<'_, Self::Tensor>,
        kv: (&Self::Tensor, &Self::Tensor),
        grads: GradsMut<'_, Self::Tensor>,
    ) -> Result<()>;
}

/// Which way a layout change at the model's edge goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `[rows, heads, d]` → `[heads, rows, d]`.
    ToHeadMajor,
    /// `[heads, rows, d]` → `[rows, heads, d]`.
    ToSeqMajor,
}

/// A backend whose tensors the model holds too: the model hands attention sequence-major
/// tensors (`[rows, heads, d]`, a linear layer's output as is), the block API wants head-major
/// ones, so the layout changes at this edge, on the device (on the host for the CPU, by a kernel
/// on a GPU). To head-major the result is in the precision the executor reads, to sequence-major
/// in the one the model keeps activations in. `what` names the tensor in errors.
pub trait ModelEdge: Backend {
    fn relayout(
        &self,
        t: &Self::Tensor,
        rows: usize,
        heads: usize,
        d: usize,
        to: Order,
        what: &str,
    ) -> Result<Self::Tensor>;

    /// `t` cut into consecutive parts of `lens` elements (a zigzag worker's rows into its two
    /// chunks).
    fn split(&self, t: &Self::Tensor, lens: &[usize]) -> Result<Vec<Self::Tensor>>;

    /// `parts` one after another.
    fn join(&self, parts: &[Self::Tensor]) -> Result<Self::Tensor>;
}
