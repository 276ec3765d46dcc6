//! Where a training step's time goes: wrappers around the model's device interface and its
//! attention that wait for the device after every call and add the wait to the call's name
//! (`distflash bench train --profile`). Waiting serialises host and device, so a profiled step
//! takes a little longer than an unprofiled one; the shares are the point — they say which op to
//! make faster next.

use super::attention::Attention;
use super::ops::{AdamW, LossOut, Ops};
use super::rope::Rotary;
use crate::shape::Span;
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// Time spent in one kind of call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spent {
    pub calls: u64,
    pub secs: f64,
}

/// One kind of call's total, for reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpTime {
    pub op: &'static str,
    pub calls: u64,
    pub secs: f64,
}

/// Totals per call name, and how to wait for the device.
pub struct Profile<'a> {
    sync: &'a (dyn Fn() -> Result<()> + Sync),
    spent: Mutex<BTreeMap<&'static str, Spent>>,
}

impl<'a> Profile<'a> {
    /// `sync` blocks until the device has finished all queued work.
    pub fn new(sync: &'a (dyn Fn() -> Result<()> + Sync)) -> Self {
        Profile {
            sync,
            spent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs `f` and adds its time, device work included, to `op`.
    fn time<R>(&self, op: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let began = Instant::now();
        let out = f()?;
        (self.sync)()?;
        let secs = began.elapsed().as_secs_f64();
        let mut spent = self
            .spent
            .lock()
            .map_err(|_| anyhow::anyhow!("profile lock poisoned"))?;
        let s = spent.entry(op).or_default();
        s.calls += 1;
        s.secs += secs;
        Ok(out)
    }

    /// The totals so far, most time first.
    pub fn totals(&self) -> Vec<OpTime> {
        let spent = self.spent.lock().map(|s| s.clone()).unwrap_or_default();
        let mut out: Vec<OpTime> = spent
            .into_iter()
            .map(|(op, s)| OpTime {
                op,
                calls: s.calls,
                secs: s.secs,
            })
            .collect();
        out.sort_by(|a, b| b.secs.total_cmp(&a.secs));
        out
    }
}

/// `inner` with every call timed into `profile`.
pub struct Profiled<'p, O> {
    pub inner: &'p O,
    pub profile: &'p Profile<'p>,
}

impl<O: Ops> Ops for Profiled<'_, O> {
    type T = O::T;

    fn upload(&self, host: &[f32]) -> Result<O::T> {
        self.profile.time("upload", || self.inner.upload(host))
    }

    fn upload_state(&self, host: &[f32]) -> Result<O::T> {
        self.profile
            .time("upload_state", || self.inner.upload_state(host))
    }

    fn download(&self, t: &O::T) -> Result<Vec<f32>> {
        self.profile.time("download", || self.inner.download(t))
    }

    type Host = O::Host;

    fn stash(&self, t: &O::T) -> Result<O::Host> {
        self.profile.time("stash", || self.inner.stash(t))
    }

    fn stash_into(&self, t: &O::T, h: &mut O::Host) -> Result<()> {
        self.profile.time("stash", || self.inner.stash_into(t, h))
    }

    fn fetch(&self, h: &O::Host) -> Result<O::T> {
        self.profile.time("fetch", || self.inner.fetch(h))
    }

    fn await_fetches(&self) -> Result<()> {
        self.profile
            .time("await_fetches", || self.inner.await_fetches())
    }

    fn join(&self, parts: &[O::T]) -> Result<O::T> {
        self.profile.time("join", || self.inner.join(parts))
    }

    fn zeros(&self, len: usize) -> Result<O::T> {
        self.profile.time("zeros", || self.inner.zeros(len))
    }

    fn activation_zeros(&self, len: usize) -> Result<O::T> {
        self.profile
            .time("activation_zeros", || self.inner.activation_zeros(len))
    }

    fn random_uniform(&self, len: usize, key: u64, offset: u64, amp: f32) -> Result<O::T> {
        self.profile.time("random_uniform", || {
            self.inner.random_uniform(len, key, offset, amp)
        })
    }

    fn len(&self, t: &O::T) -> usize {
        self.inner.len(t)
    }

    fn elem_bytes(&self) -> usize {
        self.inner.elem_bytes()
    }

    fn bytes(&self, t: &O::T) -> usize {
        self.inner.bytes(t)
    }

    fn rows(&self, t: &O::T, width: usize, start: usize, len: usize) -> Result<O::T> {
        self.profile
            .time("rows", || self.inner.rows(t, width, start, len))
    }

    fn set_rows(&self, dst: &mut O::T, width: usize, start: usize, src: &O::T) -> Result<()> {
        self.profile
            .time("set_rows", || self.inner.set_rows(dst, width, start, src))
    }

    fn add_assign(&self, dst: &mut O::T, src: &O::T) -> Result<()> {
        self.profile
            .time("add_assign", || self.inner.add_assign(dst, src))
    }

    fn sum_squares(&self, t: &O::T) -> Result<f64> {
        self.profile
            .time("sum_squares", || self.inner.sum_squares(t))
    }

    fn scale(&self, t: &mut O::T, s: f64) -> Result<()> {
        self.profile.time("scale", || self.inner.scale(t, s))
    }

    fn embed(&self, table: &O::T, tokens: &[u32], dim: usize) -> Result<O::T> {
        self.profile
            .time("embed", || self.inner.embed(table, tokens, dim))
    }

    fn embed_backward(
        &self,
        dtable: &mut O::T,
        tokens: &[u32],
        dy: &O::T,
        dim: usize,
    ) -> Result<()> {
        self.profile.time("embed_backward", || {
            self.inner.embed_backward(dtable, tokens, dy, dim)
        })
    }

    fn linear(&self, x: &O::T, w: &O::T, rows: usize, inp: usize, out: usize) -> Result<O::T> {
        self.profile
            .time("linear", || self.inner.linear(x, w, rows, inp, out))
    }

    fn linear_backward(
        &self,
        dy: &O::T,
        x: &O::T,
        w: &O::T,
        rows: usize,
        inp: usize,
        out: usize,
        dx: &mut O::T,
        dw: &mut O::T,
    ) -> Result<()> {
        self.profile.time("linear_backward", || {
            self.inner.linear_backward(dy, x, w, rows, inp, out, dx, dw)
        })
    }

    fn bias_add(&self, y: &mut O::T, b: &O::T, rows: usize, width: usize) -> Result<()> {
        self.profile
            .time("bias_add", || self.inner.bias_add(y, b, rows, width))
    }

    fn bias_backward(&self, dy: &O::T, rows: usize, width: usize, db: &mut O::T) -> Result<()> {
        self.profile.time("bias_backward", || {
            self.inner.bias_backward(dy, rows, width, db)
        })
    }

    fn rmsnorm(
        &self,
        x: &O::T,
        w: &O::T,
        rows: usize,
        dim: usize,
        eps: f64,
    ) -> Result<(O::T, O::T)> {
        self.profile
            .time("rmsnorm", || self.inner.rmsnorm(x, w, rows, dim, eps))
    }

    fn rmsnorm_backward(
        &self,
        x: &O::T,
        w: &O::T,
        rstd: &O::T,
        dy: &O::T,
        rows: usize,
        dim: usize,
        dx: &mut O::T,
        dw: &mut O::T,
    ) -> Result<()> {
        self.profile.time("rmsnorm_backward", || {
            self.inner
                .rmsnorm_backward(x, w, rstd, dy, rows, dim, dx, dw)
        })
    }

    fn rope(
        &self,
        x: &mut O::T,
        rows: usize,
        heads: usize,
        head_dim: usize,
        positions: &[Span],
        rotary: &Rotary,
        inverse: bool,
    ) -> Result<()> {
        let op = if inverse { "rope_backward" } else { "rope" };
        self.profile.time(op, || {
            self.inner
                .rope(x, rows, heads, head_dim, positions, rotary, inverse)
        })
    }

    fn swiglu(&self, g: &O::T, u: &O::T) -> Result<O::T> {
        self.profile.time("swiglu", || self.inner.swiglu(g, u))
    }

    fn swiglu_backward(&self, g: &O::T, u: &O::T, dm: &O::T) -> Result<(O::T, O::T)> {
        self.profile
            .time("swiglu_backward", || self.inner.swiglu_backward(g, u, dm))
    }

    fn cross_entropy(
        &self,
        h: &O::T,
        w: &O::T,
        targets: &[u32],
        dim: usize,
        vocab: usize,
        scale: f64,
        dw: &mut O::T,
    ) -> Result<LossOut<O::T>> {
        self.profile.time("cross_entropy", || {
            self.inner
                .cross_entropy(h, w, targets, dim, vocab, scale, dw)
        })
    }

    fn adamw(
        &self,
        param: &mut O::T,
        grad: &O::T,
        m: &mut O::T,
        v: &mut O::T,
        hp: &AdamW,
        step: u64,
        decay: bool,
    ) -> Result<()> {
        self.profile.time("adamw", || {
            self.inner.adamw(param, grad, m, v, hp, step, decay)
        })
    }
}

/// `inner` with its forwards and backwards timed into `profile`.
pub struct ProfiledAttention<'p, A> {
    pub inner: &'p mut A,
    pub profile: &'p Profile<'p>,
}

impl<T, A: Attention<T>> Attention<T> for ProfiledAttention<'_, A> {
    fn forward(&mut self, q: &T, k: &T, v: &T) -> Result<(T, T)> {
        let inner = &mut *self.inner;
        self.profile
            .time("attention_forward", || inner.forward(q, k, v))
    }

    fn backward(&mut self, q: &T, k: &T, v: &T, o: &T, lse: &T, dout: &T) -> Result<(T, T, T)> {
        let inner = &mut *self.inner;
        self.profile.time("attention_backward", || {
            inner.backward(q, k, v, o, lse, dout)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::Cpu;

    #[test]
    fn counts_and_times_each_call_under_its_name() {
        let cpu = Cpu::<f64>::new();
        let sync = || Ok(());
        let profile = Profile::new(&sync);
        let ops = Profiled {
            inner: &cpu,
            profile: &profile,
        };
        let x = ops.upload(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        let w = ops.upload(&[1.0, 0.0, 0.0, 1.0]).unwrap();
        let y = ops.linear(&x, &w, 2, 2, 2).unwrap();
        assert_eq!(ops.download(&y).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        ops.linear(&y, &w, 2, 2, 2).unwrap();
        let totals = profile.totals();
        let calls: BTreeMap<_, _> = totals.iter().map(|t| (t.op, t.calls)).collect();
        assert_eq!(
            calls,
            BTreeMap::from([("download", 1), ("linear", 2), ("upload", 2)])
        );
        assert!(totals.iter().all(|t| t.secs >= 0.0));
        assert!(totals.windows(2).all(|p| p[0].secs >= p[1].secs));
    }
}
