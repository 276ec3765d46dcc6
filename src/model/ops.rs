//! The device interface of the model: every primitive a LLaMA layer's forward and backward, the
//! loss and the optimizer need, each forward beside its backward. The model is written against
//! this trait only; `cpu` implements it (the spec) and a GPU backend implements the same calls.
//!
//! Matrices are row-major. Activations are `[rows, features]` with one row per token of the
//! worker's chunk; a linear layer's weight is `[out, in]` as Hugging Face stores it.

use super::rope::Rotary;
use crate::shape::Span;
use anyhow::{Result, anyhow, bail};
use std::ops::Range;

/// Hyperparameters of one AdamW update (decoupled weight decay, bias-corrected moments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// Which AdamW step an update is (1-based, for the bias corrections) and the factor every
/// gradient is multiplied by first: the global-norm clip's `clip / norm`, or 1. The clip is
/// applied inside the update rather than as a pass of its own, which would read and write every
/// gradient once more (9 ms of a 16-layer step on an H100); the product is the same f32 one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub step: u64,
    pub grad_scale: f64,
}

impl AdamStep {
    /// Step `step` from the gradients as they are.
    pub fn unscaled(step: u64) -> Self {
        AdamStep {
            step,
            grad_scale: 1.0,
        }
    }

    /// Step `step` from gradients of global norm `norm`, scaled down to `clip` where they are
    /// longer (`clip` 0: never).
    pub fn clipped(step: u64, clip: f64, norm: f64) -> Self {
        let grad_scale = if clip > 0.0 && norm > clip {
            clip / norm
        } else {
            1.0
        };
        AdamStep { step, grad_scale }
    }
}

/// One parameter tensor's AdamW state: its two f32 moments and, where the parameter is held in
/// 16 bits, its master: the f32 value the update applies to, kept as the device chooses
/// ([`Ops::master_of`]: an f32 copy, or a bf16 weight's low half). Without a master, an update
/// smaller than half a 16-bit step (at lr 1e-5, every update of a weight above about 0.005 in
/// bf16) is rounded away each step and lost; with it, AdamW updates the master and the
/// parameter is its rounding, so small updates accumulate as they would in f32. `T` is a
/// tensor, a host copy of one, or a reference to either (what [`Ops::adamw`] takes).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamState<T> {
    pub m: T,
    pub v: T,
    pub master: Option<T>,
}

impl<T> AdamState<T> {
    pub fn as_mut(&mut self) -> AdamState<&mut T> {
        AdamState {
            m: &mut self.m,
            v: &mut self.v,
            master: self.master.as_mut(),
        }
    }

    pub fn as_ref(&self) -> AdamState<&T> {
        AdamState {
            m: &self.m,
            v: &self.v,
            master: self.master.as_ref(),
        }
    }

    /// Each tensor through `f` (m, v, then the master), stopping at the first error.
    pub fn try_map<U>(self, mut f: impl FnMut(T) -> Result<U>) -> Result<AdamState<U>> {
        Ok(AdamState {
            m: f(self.m)?,
            v: f(self.v)?,
            master: self.master.map(f).transpose()?,
        })
    }
}

/// What the fused loss returns besides gradients: the summed (unscaled) loss of the rows and,
/// per row, the most likely next token (for accuracy probes).
pub struct LossOut<T> {
    pub loss_sum: f64,
    pub argmax: Vec<u32>,
    /// Gradient of the scaled loss with respect to the final hidden states.
    pub dh: T,
}

/// The rows of a row-major tensor a matrix product reads or writes: all of it
/// ([`Rows::whole`], which must be exactly the call's rows), or the call's rows from row `first`
/// of a taller tensor ([`Rows::window`]), used in place. The MLP's blocks of rows read and write
/// their rows of the layer's tensors this way; copying them out and back cost 2% of a step.
#[derive(Clone, Copy, Debug)]
pub struct Rows<R> {
    pub t: R,
    first: Option<usize>,
}

/// An f32 copy of `t` (zeros with `t` added): a master that is a whole f32 ([`Ops::master_of`]).
pub fn f32_copy<O: Ops + ?Sized>(ops: &O, t: &O::T) -> Result<O::T> {
    let mut copy = ops.zeros(ops.len(t))?;
    ops.add_assign(&mut copy, t)?;
    Ok(copy)
}

impl<R> Rows<R> {
    /// All of `t`: exactly the call's rows.
    pub fn whole(t: R) -> Self {
        Rows { t, first: None }
    }

    /// The call's rows of `t` from row `first`.
    pub fn window(t: R, first: usize) -> Self {
        Rows {
            t,
            first: Some(first),
        }
    }

    /// The same rows of `f(t)` (a wrapper's tensor to the device's it holds).
    pub fn map<S>(self, f: impl FnOnce(R) -> S) -> Rows<S> {
        Rows {
            t: f(self.t),
            first: self.first,
        }
    }

    /// The elements `rows` rows of `width` take in a tensor of `len` elements, or a sentence
    /// naming `what` when they are not inside it or a whole tensor is not exactly those rows.
    pub fn range(&self, len: usize, rows: usize, width: usize, what: &str) -> Result<Range<usize>> {
        match self.first {
            None if len != rows * width => {
                bail!(
                    "{what} has {len} elements where {} were expected",
                    rows * width
                )
            }
            None => Ok(0..len),
            Some(first) => {
                check_rows(len, width, first, rows).map_err(|e| anyhow!("{what}: {e}"))?;
                Ok(first * width..(first + rows) * width)
            }
        }
    }
}

/// What a linear layer's backward reads: the output's gradient `dy` `[rows, out]`, and the
/// forward's input `x` `[rows, inp]` and weight `w` `[out, inp]` with their shape. Grouped so a
/// call names what the backward reads in one place and what it accumulates into (dx, dW) as
/// arguments of their own; `T` is a device's tensor, and [`LinearBackward::map`] passes the
/// group to the device a wrapper holds.
pub struct LinearBackward<'a, T> {
    pub dy: Rows<&'a T>,
    pub x: Rows<&'a T>,
    pub w: &'a T,
    pub rows: usize,
    pub inp: usize,
    pub out: usize,
    /// dx's rows hold nothing yet (dx is a [`Ops::scratch`] buffer, or those rows were never
    /// written): the product writes them instead of adding to them, so no zeros are written
    /// first and none are read back.
    pub dx_empty: bool,
    /// dW holds nothing yet (a [`Ops::scratch`] buffer of a step's gradients, whose first
    /// product this is: `train::shard::Held::step_grads`): the product writes it instead of
    /// adding to it, so the step's gradients need no zeros, and none are read back.
    pub dw_empty: bool,
}

impl<'a, T> LinearBackward<'a, T> {
    /// Each tensor through `f` (a wrapper's tensor to the device's it holds), the shape kept.
    pub fn map<U>(self, f: impl Fn(&'a T) -> &'a U) -> LinearBackward<'a, U> {
        LinearBackward {
            dy: self.dy.map(&f),
            x: self.x.map(&f),
            w: f(self.w),
            rows: self.rows,
            inp: self.inp,
            out: self.out,
            dx_empty: self.dx_empty,
            dw_empty: self.dw_empty,
        }
    }
}

/// What an RMS norm's backward reads: the forward's input `x` `[rows, dim]`, gain `w` `[dim]`
/// and per-row `rstd` `[rows]` (what [`Ops::rmsnorm`] returned), the output's gradient `dy`
/// `[rows, dim]`, and the shape. Grouped so a call names what the backward reads in one place
/// and what it accumulates into (dx, dw) as arguments of their own; [`NormBackward::map`] passes
/// the group to the device a wrapper holds.
pub struct NormBackward<'a, T> {
    pub x: &'a T,
    pub w: &'a T,
    pub rstd: &'a T,
    pub dy: &'a T,
    pub rows: usize,
    pub dim: usize,
}

impl<'a, T> NormBackward<'a, T> {
    /// Each tensor through `f` (a wrapper's tensor to the device's it holds), the shape kept.
    pub fn map<U>(self, f: impl Fn(&'a T) -> &'a U) -> NormBackward<'a, U> {
        NormBackward {
            x: f(self.x),
            w: f(self.w),
            rstd: f(self.rstd),
            dy: f(self.dy),
            rows: self.rows,
            dim: self.dim,
        }
    }
}

/// One rotary embedding call besides the tensor it rotates in place: the tensor's shape
/// `[rows, heads, head_dim]`, where its rows sit (`positions`), the table (`rotary`) and the
/// direction (`inverse`: the backward). Grouped because they travel together: a layer's q and k,
/// forward and backward, are rotated by the same call but for `heads` and `inverse`. It holds no
/// tensor, so every device and wrapper passes it on as it is.
#[derive(Clone, Copy, Debug)]
pub struct RopeCall<'a> {
    pub rows: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub positions: &'a [Span],
    pub rotary: &'a Rotary,
    pub inverse: bool,
}

/// What the fused loss reads: the final hidden states `h` `[rows, dim]`, the output projection
/// `w` `[vocab, dim]`, one target token per row (`targets`, so `rows` is its length), and the
/// scale of the summed loss the gradients are of. Grouped as the loss's input, beside
/// [`LossOut`], its output, so a call names what the loss reads in one place and what it
/// accumulates into (dW) as an argument of its own; [`LossInput::map`] passes the group to the
/// device a wrapper holds.
pub struct LossInput<'a, T> {
    pub h: &'a T,
    pub w: &'a T,
    pub targets: &'a [u32],
    pub dim: usize,
    pub vocab: usize,
    pub scale: f64,
}

impl<'a, T> LossInput<'a, T> {
    /// Each tensor through `f` (a wrapper's tensor to the device's it holds), the rest kept.
    pub fn map<U>(self, f: impl Fn(&'a T) -> &'a U) -> LossInput<'a, U> {
        LossInput {
            h: f(self.h),
            w: f(self.w),
            targets: self.targets,
            dim: self.dim,
            vocab: self.vocab,
            scale: self.scale,
        }
    }
}

/// Per-layer primitives of a LLaMA model on one device.
pub trait Ops: Sync {
    /// A tensor on this device.
    type T: Clone + Send + Sync;

    /// Copies host f32 data to the device.
    fn upload(&self, host: &[f32]) -> Result<Self::T>;
    /// Copies optimizer state (AdamW's moments) to the device in the precision the device's
    /// `adamw` keeps it in: moments of squared gradients lose most of their information in
    /// 16 bits, so a mixed-precision device overrides this to keep f32.
    fn upload_state(&self, host: &[f32]) -> Result<Self::T> {
        self.upload(host)
    }
    /// Copies a tensor back to the host as f32.
    fn download(&self, t: &Self::T) -> Result<Vec<f32>>;

    /// AdamW's master of a 16-bit `param` as a fresh run starts it (the weights are exact
    /// then). Its form is the device's: an f32 copy here; where the 16-bit format shares
    /// f32's exponent (bf16), the CUDA device keeps only the f32's low half, the weight being
    /// its upper half (`backend::cuda::master_split`), so the master costs 2 bytes, not 4.
    fn master_of(&self, param: &Self::T) -> Result<Self::T> {
        f32_copy(self, param)
    }
    /// The master of weights whose exact values are `exact` (a resumed run's), in
    /// [`Ops::master_of`]'s form, for weights uploaded by [`Ops::upload_exact`].
    fn upload_master(&self, exact: &[f32]) -> Result<Self::T> {
        self.upload_state(exact)
    }
    /// Weights from their exact values (a resumed run's), rounded as AdamW rounds a master
    /// into its weight, so that they and [`Ops::upload_master`]'s master give the exact
    /// values back.
    fn upload_exact(&self, exact: &[f32]) -> Result<Self::T> {
        self.upload(exact)
    }
    /// The exact (f32) values of `param` from its master, where the master alone does not
    /// hold them (`None`: it is an f32 copy): what a checkpoint saves.
    fn exact_of(&self, _param: &Self::T, _master: &Self::T) -> Result<Option<Self::T>> {
        Ok(None)
    }

    /// A tensor's exact copy in host memory, apart from the device's working tensors: where an
    /// offloaded checkpoint waits for the backward (`offload`), and offloaded AdamW moments wait
    /// between updates (`train::moments`).
    type Host: Send + Sync;
    /// Starts copying `t` to host memory; `t` may be dropped as soon as this returns (a device
    /// orders the copy before the buffer's reuse).
    fn stash(&self, t: &Self::T) -> Result<Self::Host>;
    /// Starts copying `t` over `h`, the stash of a tensor of `t`'s length and precision, in
    /// place: a value that lives in host memory written back where it lives (offloaded AdamW
    /// moments, `train::moments`), so it needs no second buffer. Ordered after the fetches of
    /// `h` issued before it.
    fn stash_into(&self, t: &Self::T, h: &mut Self::Host) -> Result<()>;
    /// Starts copying `h` back into a new device tensor, bit for bit what was stashed; a device
    /// may run the copy beside other work until [`Ops::await_fetches`].
    fn fetch(&self, h: &Self::Host) -> Result<Self::T>;
    /// Makes ops issued from now on wait until every fetch issued so far has landed, and no
    /// longer (fetches issued later may still run beside them).
    fn await_fetches(&self) -> Result<()>;
    fn zeros(&self, len: usize) -> Result<Self::T>;
    /// `len` f32 elements whose values are unspecified, for a gradient whose first write
    /// overwrites it (`LinearBackward::dx_empty`, `dw_empty`): on the GPU, the memory as the
    /// allocator finds it (zero-filling the MLP's wide gradients cost 1% of a step); on the
    /// CPU, NaN.
    fn scratch(&self, len: usize) -> Result<Self::T>;
    /// Zeros in the precision of activations (`upload`'s: 16-bit on the GPU), for a gradient
    /// one product writes whole and a 16-bit kernel reads next (attention's dO from the output
    /// projection's backward), where an f32 accumulator and its rounding would only cost memory.
    fn activation_zeros(&self, len: usize) -> Result<Self::T>;
    /// Weights (the precision `upload` gives) drawn where they will live: elements
    /// `offset..offset + len` of the counter-based stream `key`, uniform on `(-amp, amp)`
    /// (`model::init`). A shard draws only its piece, and every device draws the same numbers,
    /// so start-up neither builds nor copies a host model.
    fn random_uniform(&self, len: usize, key: u64, offset: u64, amp: f32) -> Result<Self::T>;
    /// Elements of `t`, for memory accounting.
    fn len(&self, t: &Self::T) -> usize;
    /// Bytes per element, for memory accounting.
    fn elem_bytes(&self) -> usize;
    /// Bytes `t` takes on the device, for counting memory (`train::memory::count`): a mixed-precision
    /// device's f32 tensors are wider than its `elem_bytes`, so it overrides this.
    fn bytes(&self, t: &Self::T) -> usize {
        self.len(t) * self.elem_bytes()
    }

    /// Rows `start..start + len` of a `[rows, width]` tensor, as a new tensor of the same
    /// precision (the MLP runs over row blocks so its wide intermediates exist a block at a time).
    fn rows(&self, t: &Self::T, width: usize, start: usize, len: usize) -> Result<Self::T>;
    /// Writes `src` (`[len, width]`, the precision of `dst`) over rows `start..start + len` of
    /// `dst`.
    fn set_rows(&self, dst: &mut Self::T, width: usize, start: usize, src: &Self::T) -> Result<()>;

    /// `parts` one after another as one tensor (their common precision): a parameter rebuilt
    /// from its gathered shards.
    fn join(&self, parts: &[Self::T]) -> Result<Self::T>;

    /// `dst += src`.
    fn add_assign(&self, dst: &mut Self::T, src: &Self::T) -> Result<()>;
    /// Σ t² over every tensor of `ts`, for the global gradient norm: one answer for them all,
    /// so the GPU waits for the device once a step rather than once a tensor.
    fn sum_squares(&self, ts: &[&Self::T]) -> Result<f64>;

    /// Rows of `table` (`[vocab, dim]`) picked by `tokens`.
    fn embed(&self, table: &Self::T, tokens: &[u32], dim: usize) -> Result<Self::T>;
    /// `dtable[tokens[r]] += dy[r]`.
    fn embed_backward(
        &self,
        dtable: &mut Self::T,
        tokens: &[u32],
        dy: &Self::T,
        dim: usize,
    ) -> Result<()>;

    /// y = x Wᵀ for x `[rows, inp]` (its rows of a taller tensor, or all of it), W `[out, inp]`.
    fn linear(
        &self,
        x: Rows<&Self::T>,
        w: &Self::T,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Self::T>;
    /// y += x Wᵀ for x `[rows, inp]` into `rows` rows of y (a residual stream, in its own
    /// precision): the residual add done by the product as it writes, with one rounding where a
    /// `linear` and an `add_assign` would round twice and pass the rows through memory twice.
    fn linear_add(
        &self,
        x: &Self::T,
        w: &Self::T,
        y: Rows<&mut Self::T>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<()>;
    /// dx += dy W and dW += dyᵀ x (accumulating, so branches that share an input add up; each
    /// written instead where `operands` says it holds nothing yet), from `operands`' dy, x and
    /// W.
    fn linear_backward(
        &self,
        operands: LinearBackward<'_, Self::T>,
        dx: Rows<&mut Self::T>,
        dw: &mut Self::T,
    ) -> Result<()>;

    /// y[r] += b for every row r of y `[rows, width]`: a projection's bias, added in place after
    /// its `linear` (y keeps its precision).
    fn bias_add(&self, y: &mut Self::T, b: &Self::T, rows: usize, width: usize) -> Result<()>;
    /// db += Σ_r dy[r] over the rows of dy `[rows, width]`: the bias's gradient, accumulated.
    fn bias_backward(
        &self,
        dy: &Self::T,
        rows: usize,
        width: usize,
        db: &mut Self::T,
    ) -> Result<()>;

    /// y = x · rstd · w with rstd = 1/√(mean(x²) + eps) per row; returns (y, rstd).
    fn rmsnorm(
        &self,
        x: &Self::T,
        w: &Self::T,
        rows: usize,
        dim: usize,
        eps: f64,
    ) -> Result<(Self::T, Self::T)>;
    /// dx += rstd·(g − x·rstd²·mean(g∘x)) with g = dy∘w, and dw += Σ_rows dy∘x·rstd, from
    /// `operands`' x, w, rstd and dy.
    fn rmsnorm_backward(
        &self,
        operands: NormBackward<'_, Self::T>,
        dx: &mut Self::T,
        dw: &mut Self::T,
    ) -> Result<()>;

    /// Rotary embedding in place on x `[rows, heads, head_dim]` (`call`'s shape), Hugging
    /// Face's rotate-half pairing (i, i + head_dim/2). The rows sit at the positions of
    /// `call.positions`, runs of the sequence in row order (one run for a contiguous chunk, two
    /// for a zigzag worker's head and tail; see [`row_positions`]). `call.rotary` holds the
    /// head's `head_dim / 2` inverse frequencies and the factor cos and sin are multiplied by
    /// (`Config::rotary`). The backward (`call.inverse`) is the rotation by the opposite angle,
    /// times the same factor (the transpose).
    fn rope(&self, x: &mut Self::T, call: RopeCall<'_>) -> Result<()>;

    /// m = silu(g) ∘ u.
    fn swiglu(&self, g: &Self::T, u: &Self::T) -> Result<Self::T>;
    /// (dg, du) from dm: du = dm∘silu(g), dg = dm∘u∘σ(g)(1 + g(1 − σ(g))).
    fn swiglu_backward(&self, g: &Self::T, u: &Self::T, dm: &Self::T)
    -> Result<(Self::T, Self::T)>;

    /// Cross-entropy of logits h Wᵀ against `targets` (`input`'s), forward and backward fused
    /// and chunked over rows, so the logits of only a few rows exist at a time. The gradient is
    /// of `scale · Σ loss`; dW accumulates into `dw`.
    fn cross_entropy(
        &self,
        input: LossInput<'_, Self::T>,
        dw: &mut Self::T,
    ) -> Result<LossOut<Self::T>>;

    /// One AdamW update of `param` from `grad` times `at.grad_scale`, at step `at.step`; `decay`
    /// says whether weight decay applies (matrices yes, norm gains no). With a master in
    /// `state`, the master is updated and `param` becomes its rounding; without one, `param` is
    /// updated in place.
    fn adamw(
        &self,
        param: &mut Self::T,
        grad: &Self::T,
        state: AdamState<&mut Self::T>,
        hp: &AdamW,
        at: AdamStep,
        decay: bool,
    ) -> Result<()>;
}

/// One sentence unless `runs` (runs of the sequence in row order) cover exactly `rows` rows.
pub fn check_positions(runs: &[Span], rows: usize) -> Result<()> {
    let covered: usize = runs.iter().map(|r| r.len).sum();
    if covered != rows {
        bail!("the rows' positions cover {covered} rows, not the tensor's {rows}");
    }
    Ok(())
}

/// The position of every row of `runs`, checked to cover `rows` rows.
pub fn row_positions(runs: &[Span], rows: usize) -> Result<impl Iterator<Item = usize> + '_> {
    check_positions(runs, rows)?;
    Ok(runs.iter().flat_map(|r| r.start..r.end()))
}

/// One sentence unless rows `start..start + len` of width `width` lie inside `total` elements.
pub fn check_rows(total: usize, width: usize, start: usize, len: usize) -> Result<()> {
    if width == 0 || !total.is_multiple_of(width) || (start + len) * width > total {
        bail!(
            "rows {start}..{} of width {width} are not inside a tensor of {total} elements",
            start + len
        );
    }
    Ok(())
}
