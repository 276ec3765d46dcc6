//! One wrapper over any `Ops` device and its attention that spells out each call of the device
//! interface once and leaves what is done around it to an [`Instrument`]. Metering
//! (`count`: every tensor made carries a ticket of its bytes) and profiling (`profile`: every
//! call timed) are two small instruments, so an op added to `Ops` is added here alone and both
//! see it.

use super::attention_api::Attention;
use super::ops::{
    AdamState, AdamStep, AdamW, LinearBackward, LossInput, LossOut, NormBackward, Ops, RopeCall,
    Rows,
};
use anyhow::Result;
use std::borrow::Cow;

/// What is done around the calls of a device `O`: what its tensors and host copies become
/// (`T`, `Host`) and how a call is run. The wrapper hands the instrument each tensor an op
/// makes, and unwraps each argument before passing it on.
pub trait Instrument<O: Ops>: Sync {
    /// A tensor of `O` as the instrumented device hands it out.
    type T: Clone + Send + Sync;
    /// A host copy of a tensor of `O` as the instrumented device hands it out.
    type Host: Send + Sync;

    /// Runs `call`, the device's op `op`: by default just that.
    fn around<R>(&self, op: &'static str, call: impl FnOnce() -> Result<R>) -> Result<R> {
        let _ = op;
        call()
    }
    /// `t`, just made on `ops` by the op `what`.
    fn made(&self, ops: &O, t: O::T, what: &'static str) -> Self::T;
    /// `h`, the host copy of `t` just stashed.
    fn stashed(&self, t: &Self::T, h: O::Host) -> Self::Host;
    /// The op that made the tensor `h` copies: a fetch remakes that tensor.
    fn made_by(h: &Self::Host) -> &'static str;

    /// The device's own tensor inside `t`.
    fn tensor(t: &Self::T) -> &O::T;
    fn tensor_mut(t: &mut Self::T) -> &mut O::T;
    /// The device's own host copy inside `h`.
    fn host(h: &Self::Host) -> &O::Host;
    fn host_mut(h: &mut Self::Host) -> &mut O::Host;
    /// `parts` as the device's own tensors, for `join` (which takes a slice of them).
    fn tensors(parts: &[Self::T]) -> Cow<'_, [O::T]>;
}

/// `inner` with every call run through `instrument` and every tensor it makes handed to it.
/// The device is borrowed: a profile wraps the device a step was handed, and the counting
/// device is lent to its attention beside the wrapper.
pub struct Instrumented<'d, O, I> {
    pub inner: &'d O,
    pub instrument: I,
}

impl<O: Ops, I: Instrument<O>> Instrumented<'_, O, I> {
    /// Runs `call`, the op `op`, under the instrument.
    fn call<R>(&self, op: &'static str, call: impl FnOnce() -> Result<R>) -> Result<R> {
        self.instrument.around(op, call)
    }

    /// `t`, made by the op `what`, instrumented.
    fn made(&self, t: O::T, what: &'static str) -> I::T {
        self.instrument.made(self.inner, t, what)
    }

    /// Runs `call`, the op `op`, which makes one tensor, and instruments that tensor.
    fn make(&self, op: &'static str, call: impl FnOnce() -> Result<O::T>) -> Result<I::T> {
        let t = self.call(op, call)?;
        Ok(self.made(t, op))
    }
}

impl<O: Ops, I: Instrument<O>> Ops for Instrumented<'_, O, I> {
    type T = I::T;

    fn upload(&self, host: &[f32]) -> Result<I::T> {
        self.make("upload", || self.inner.upload(host))
    }

    fn upload_state(&self, host: &[f32]) -> Result<I::T> {
        self.make("upload_state", || self.inner.upload_state(host))
    }

    fn download(&self, t: &I::T) -> Result<Vec<f32>> {
        self.call("download", || self.inner.download(I::tensor(t)))
    }

    fn master_of(&self, param: &I::T) -> Result<I::T> {
        self.make("master_of", || self.inner.master_of(I::tensor(param)))
    }

    fn upload_master(&self, exact: &[f32]) -> Result<I::T> {
        self.make("upload_master", || self.inner.upload_master(exact))
    }

    fn upload_exact(&self, exact: &[f32]) -> Result<I::T> {
        self.make("upload_exact", || self.inner.upload_exact(exact))
    }

    fn exact_of(&self, param: &I::T, master: &I::T) -> Result<Option<I::T>> {
        let t = self.call("exact_of", || {
            self.inner.exact_of(I::tensor(param), I::tensor(master))
        })?;
        Ok(t.map(|t| self.made(t, "exact_of")))
    }

    type Host = I::Host;

    fn stash(&self, t: &I::T) -> Result<I::Host> {
        let h = self.call("stash", || self.inner.stash(I::tensor(t)))?;
        Ok(self.instrument.stashed(t, h))
    }

    fn stash_into(&self, t: &I::T, h: &mut I::Host) -> Result<()> {
        self.call("stash", || {
            self.inner.stash_into(I::tensor(t), I::host_mut(h))
        })
    }

    fn fetch(&self, h: &I::Host) -> Result<I::T> {
        let t = self.call("fetch", || self.inner.fetch(I::host(h)))?;
        Ok(self.made(t, I::made_by(h)))
    }

    fn await_fetches(&self) -> Result<()> {
        self.call("await_fetches", || self.inner.await_fetches())
    }

    fn zeros(&self, len: usize) -> Result<I::T> {
        self.make("zeros", || self.inner.zeros(len))
    }

    fn scratch(&self, len: usize) -> Result<I::T> {
        self.make("scratch", || self.inner.scratch(len))
    }

    fn activation_zeros(&self, len: usize) -> Result<I::T> {
        self.make("activation_zeros", || self.inner.activation_zeros(len))
    }

    fn random_uniform(&self, len: usize, key: u64, offset: u64, amp: f32) -> Result<I::T> {
        self.make("random_uniform", || {
            self.inner.random_uniform(len, key, offset, amp)
        })
    }

    fn len(&self, t: &I::T) -> usize {
        self.inner.len(I::tensor(t))
    }

    fn elem_bytes(&self) -> usize {
        self.inner.elem_bytes()
    }

    fn bytes(&self, t: &I::T) -> usize {
        self.inner.bytes(I::tensor(t))
    }

    fn rows(&self, t: &I::T, width: usize, start: usize, len: usize) -> Result<I::T> {
        self.make("rows", || self.inner.rows(I::tensor(t), width, start, len))
    }

    fn set_rows(&self, dst: &mut I::T, width: usize, start: usize, src: &I::T) -> Result<()> {
        self.call("set_rows", || {
            let (dst, src) = (I::tensor_mut(dst), I::tensor(src));
            self.inner.set_rows(dst, width, start, src)
        })
    }

    fn join(&self, parts: &[I::T]) -> Result<I::T> {
        self.make("join", || self.inner.join(&I::tensors(parts)))
    }

    fn add_assign(&self, dst: &mut I::T, src: &I::T) -> Result<()> {
        self.call("add_assign", || {
            self.inner.add_assign(I::tensor_mut(dst), I::tensor(src))
        })
    }

    fn sum_squares(&self, ts: &[&I::T]) -> Result<f64> {
        let ts: Vec<_> = ts.iter().map(|t| I::tensor(t)).collect();
        self.call("sum_squares", || self.inner.sum_squares(&ts))
    }

    fn embed(&self, table: &I::T, tokens: &[u32], dim: usize) -> Result<I::T> {
        self.make("embed", || self.inner.embed(I::tensor(table), tokens, dim))
    }

    fn embed_backward(
        &self,
        dtable: &mut I::T,
        tokens: &[u32],
        dy: &I::T,
        dim: usize,
    ) -> Result<()> {
        self.call("embed_backward", || {
            let (dtable, dy) = (I::tensor_mut(dtable), I::tensor(dy));
            self.inner.embed_backward(dtable, tokens, dy, dim)
        })
    }

    fn linear(
        &self,
        x: Rows<&I::T>,
        w: &I::T,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<I::T> {
        self.make("linear", || {
            let (x, w) = (x.map(I::tensor), I::tensor(w));
            self.inner.linear(x, w, rows, inp, out)
        })
    }

    fn linear_add(
        &self,
        x: &I::T,
        w: &I::T,
        y: Rows<&mut I::T>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        self.call("linear_add", || {
            let (x, w, y) = (I::tensor(x), I::tensor(w), y.map(I::tensor_mut));
            self.inner.linear_add(x, w, y, rows, inp, out)
        })
    }

    fn linear_backward(
        &self,
        operands: LinearBackward<'_, I::T>,
        dx: Rows<&mut I::T>,
        dw: &mut I::T,
    ) -> Result<()> {
        self.call("linear_backward", || {
            let (dx, dw) = (dx.map(I::tensor_mut), I::tensor_mut(dw));
            self.inner.linear_backward(operands.map(I::tensor), dx, dw)
        })
    }

    fn bias_add(&self, y: &mut I::T, b: &I::T, rows: usize, width: usize) -> Result<()> {
        self.call("bias_add", || {
            let (y, b) = (I::tensor_mut(y), I::tensor(b));
            self.inner.bias_add(y, b, rows, width)
        })
    }

    fn bias_backward(&self, dy: &I::T, rows: usize, width: usize, db: &mut I::T) -> Result<()> {
        self.call("bias_backward", || {
            let (dy, db) = (I::tensor(dy), I::tensor_mut(db));
            self.inner.bias_backward(dy, rows, width, db)
        })
    }

    fn rmsnorm(
        &self,
        x: &I::T,
        w: &I::T,
        rows: usize,
        dim: usize,
        eps: f64,
    ) -> Result<(I::T, I::T)> {
        let (y, rstd) = self.call("rmsnorm", || {
            let (x, w) = (I::tensor(x), I::tensor(w));
            self.inner.rmsnorm(x, w, rows, dim, eps)
        })?;
        Ok((self.made(y, "rmsnorm"), self.made(rstd, "rmsnorm")))
    }

    fn rmsnorm_backward(
        &self,
        operands: NormBackward<'_, I::T>,
        dx: &mut I::T,
        dw: &mut I::T,
    ) -> Result<()> {
        self.call("rmsnorm_backward", || {
            let (dx, dw) = (I::tensor_mut(dx), I::tensor_mut(dw));
            self.inner.rmsnorm_backward(operands.map(I::tensor), dx, dw)
        })
    }

    fn rope(&self, x: &mut I::T, call: RopeCall<'_>) -> Result<()> {
        let op = if call.inverse {
            "rope_backward"
        } else {
            "rope"
        };
        self.call(op, || self.inner.rope(I::tensor_mut(x), call))
    }

    fn swiglu(&self, g: &I::T, u: &I::T) -> Result<I::T> {
        self.make("swiglu", || self.inner.swiglu(I::tensor(g), I::tensor(u)))
    }

    fn swiglu_backward(&self, g: &I::T, u: &I::T, dm: &I::T) -> Result<(I::T, I::T)> {
        let (dg, du) = self.call("swiglu_backward", || {
            let (g, u, dm) = (I::tensor(g), I::tensor(u), I::tensor(dm));
            self.inner.swiglu_backward(g, u, dm)
        })?;
        let what = "swiglu_backward";
        Ok((self.made(dg, what), self.made(du, what)))
    }

    fn cross_entropy(&self, input: LossInput<'_, I::T>, dw: &mut I::T) -> Result<LossOut<I::T>> {
        let out = self.call("cross_entropy", || {
            let dw = I::tensor_mut(dw);
            self.inner.cross_entropy(input.map(I::tensor), dw)
        })?;
        Ok(LossOut {
            loss_sum: out.loss_sum,
            argmax: out.argmax,
            dh: self.made(out.dh, "cross_entropy"),
        })
    }

    fn adamw(
        &self,
        param: &mut I::T,
        grad: &I::T,
        state: AdamState<&mut I::T>,
        hp: &AdamW,
        at: AdamStep,
        decay: bool,
    ) -> Result<()> {
        self.call("adamw", || {
            let (param, grad) = (I::tensor_mut(param), I::tensor(grad));
            let state = state.try_map(|t| Ok(I::tensor_mut(t)))?;
            self.inner.adamw(param, grad, state, hp, at, decay)
        })
    }
}

/// `inner`, attention on `ops`'s device, with its calls run through `ops`'s instrument and its
/// outputs handed to it as `ops`'s tensors.
pub struct InstrumentedAttention<'w, 'd, O, I, A> {
    pub ops: &'w Instrumented<'d, O, I>,
    pub inner: &'w mut A,
}

impl<O: Ops, I: Instrument<O>, A: Attention<O::T>> Attention<I::T>
    for InstrumentedAttention<'_, '_, O, I, A>
{
    fn forward(&mut self, q: &I::T, k: &I::T, v: &I::T) -> Result<(I::T, I::T)> {
        let inner = &mut *self.inner;
        let (o, lse) = self.ops.call("attention_forward", || {
            inner.forward(I::tensor(q), I::tensor(k), I::tensor(v))
        })?;
        // O and LSE are counted as made by "attention", the name the memory estimate's
        // breakdown (`bench train --estimate`) has always given them.
        Ok((
            self.ops.made(o, "attention"),
            self.ops.made(lse, "attention"),
        ))
    }

    fn backward(
        &mut self,
        q: &I::T,
        k: &I::T,
        v: &I::T,
        o: &I::T,
        lse: &I::T,
        dout: &I::T,
    ) -> Result<(I::T, I::T, I::T)> {
        let inner = &mut *self.inner;
        let what = "attention_backward";
        let (dq, dk, dv) = self.ops.call(what, || {
            let (q, k, v) = (I::tensor(q), I::tensor(k), I::tensor(v));
            let (o, lse, dout) = (I::tensor(o), I::tensor(lse), I::tensor(dout));
            inner.backward(q, k, v, o, lse, dout)
        })?;
        let made = |t| self.ops.made(t, what);
        Ok((made(dq), made(dk), made(dv)))
    }
}
