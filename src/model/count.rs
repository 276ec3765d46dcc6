//! Device memory counted from the code: a wrapper over any `Ops` device whose tensors carry a
//! ticket for their bytes, added to a shared counter when the tensor is made (or cloned) and
//! taken off when it is dropped, so the counter's peak is the most bytes of tensors the model
//! held at once. Around the CPU backend it measures that backend's own peak; around
//! `model::counting::Lengths` (a device that allocates nothing) it is the memory estimate of the
//! real forward and backward. Mirrors `profile::Profiled`'s shape: each call is passed through.

use super::attention::Attention;
use super::ops::{AdamW, LossOut, Ops};
use super::rope::Rotary;
use crate::shape::Span;
use anyhow::{Result, anyhow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What a tensor holds, for the breakdown of the peak: set on the counter by whoever makes the
/// tensors ([`Counter::set_kind`]), recorded by each tensor as it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Weights,
    Grads,
    Optimizer,
    /// What the forward keeps for the backward: the step's tensors alive when
    /// [`Counter::mark_kept`] is called (at the end of the forward).
    Kept,
    /// Everything else the step makes: activations, their gradients, scratch.
    Step,
}

const KINDS: usize = 5;

/// Bytes by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bytes {
    pub weights: usize,
    pub grads: usize,
    pub optimizer: usize,
    pub kept: usize,
    pub step: usize,
}

impl Bytes {
    fn of(live: &[usize; KINDS]) -> Bytes {
        Bytes {
            weights: live[0],
            grads: live[1],
            optimizer: live[2],
            kept: live[3],
            step: live[4],
        }
    }

    /// All of them.
    pub fn total(&self) -> usize {
        self.weights + self.grads + self.optimizer + self.kept + self.step
    }
}

#[derive(Debug, Default)]
struct State {
    live: [usize; KINDS],
    kind: usize,
    /// Tickets are numbered as they are made; those of the step below this number, made before
    /// [`Counter::mark_kept`], are kept activations.
    next: u64,
    kept_below: u64,
    /// The live bytes by kind at the highest moment so far.
    at_peak: [usize; KINDS],
    peak: usize,
    /// Host copies (stashes) by kind, and their peak.
    host: [usize; KINDS],
    host_at_peak: [usize; KINDS],
    host_peak: usize,
    /// Each of the step's device tensors alive, by ticket: what made it and its bytes (the
    /// weights, gradients and moments are no part of the working set's breakdown).
    tensors: BTreeMap<u64, (&'static str, usize)>,
    /// The step's device bytes at the peak by what made them (an op's scratch under its name).
    step_at_peak: BTreeMap<&'static str, Part>,
}

/// Some of the step's bytes at the peak: how many tensors (0 for an op's scratch) and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Part {
    pub tensors: usize,
    pub bytes: usize,
}

impl State {
    /// Records the moment as the peak if it is one: the live tensors and `extra` bytes of
    /// scratch made by `what`.
    fn note(&mut self, extra: usize, what: &'static str) {
        let total = self.live.iter().sum::<usize>() + extra;
        if total > self.peak {
            self.peak = total;
            self.at_peak = self.live;
            self.at_peak[Kind::Step as usize] += extra;
            let mut parts = BTreeMap::<&'static str, Part>::new();
            let step = Kind::Step as usize;
            for (&n, &(made_by, bytes)) in &self.tensors {
                // Those made before `mark_kept` are kept activations now.
                if self.kind_of(step, n) == step {
                    let part = parts.entry(made_by).or_default();
                    part.tensors += 1;
                    part.bytes += bytes;
                }
            }
            if extra > 0 {
                parts.entry(what).or_default().bytes += extra;
            }
            self.step_at_peak = parts;
        }
    }

    /// The kind a ticket made as `kind` with number `n` is counted as now.
    fn kind_of(&self, kind: usize, n: u64) -> usize {
        match kind == Kind::Step as usize && n < self.kept_below {
            true => Kind::Kept as usize,
            false => kind,
        }
    }
}

/// Live and peak bytes of a device's tensors, shared by the tensors' tickets.
#[derive(Debug, Default)]
pub struct Counter {
    state: Mutex<State>,
}

impl Counter {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A poisoned lock means a panic elsewhere mid-update; the counts stay usable.
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s)
    }

    /// Tensors made from now on are counted as `kind`.
    pub fn set_kind(&self, kind: Kind) {
        self.with(|s| s.kind = kind as usize)
    }

    /// The step's tensors alive now are kept activations from now on.
    pub fn mark_kept(&self) {
        self.with(|s| {
            let (step, kept) = (Kind::Step as usize, Kind::Kept as usize);
            s.live[kept] += std::mem::take(&mut s.live[step]);
            s.host[kept] += std::mem::take(&mut s.host[step]);
            s.kept_below = s.next;
        })
    }

    /// Counts `bytes` of a new tensor made by `what` (on the host when `host`) as `kind` (the
    /// current one when `None`); returns its ticket.
    fn hold(
        &self,
        kind: Option<usize>,
        bytes: usize,
        host: bool,
        what: &'static str,
    ) -> (usize, u64) {
        self.with(|s| {
            let k = kind.unwrap_or(s.kind);
            let n = s.next;
            s.next += 1;
            let k = s.kind_of(k, n);
            if host {
                s.host[k] += bytes;
                let total = s.host.iter().sum();
                if total > s.host_peak {
                    s.host_peak = total;
                    s.host_at_peak = s.host;
                }
            } else {
                s.live[k] += bytes;
                if k == Kind::Step as usize {
                    s.tensors.insert(n, (what, bytes));
                }
                s.note(0, what);
            }
            (k, n)
        })
    }

    fn release(&self, kind: usize, n: u64, bytes: usize, host: bool) {
        self.with(|s| {
            let k = s.kind_of(kind, n);
            match host {
                true => s.host[k] -= bytes,
                false => {
                    s.live[k] -= bytes;
                    s.tensors.remove(&n);
                }
            }
        })
    }

    /// Counts `bytes` as `kind` for the rest of the count: a buffer a device keeps, outside
    /// any tensor (a table uploaded once).
    pub fn keep(&self, kind: Kind, bytes: usize) {
        self.hold(Some(kind as usize), bytes, false, "a kept table");
    }

    /// A moment at which `bytes` more than the live tensors exist: the scratch buffers of the
    /// op `what` (and its outputs, not yet counted), gone when it returns.
    pub fn spike(&self, bytes: usize, what: &'static str) {
        self.with(|s| s.note(bytes, what))
    }

    /// Bytes of the tensors alive now, by kind.
    pub fn live(&self) -> Bytes {
        self.with(|s| Bytes::of(&s.live))
    }

    /// The most bytes alive at once so far, by kind at that moment (scratch counted as the
    /// step's).
    pub fn peak(&self) -> Bytes {
        self.with(|s| Bytes::of(&s.at_peak))
    }

    /// The most bytes of host copies (`Ops::stash`) alive at once, by kind at that moment.
    pub fn host_peak(&self) -> Bytes {
        self.with(|s| Bytes::of(&s.host_at_peak))
    }

    /// The step's bytes at the peak (the working set) by what made them, most first: where a
    /// cut would pay.
    pub fn working_at_peak(&self) -> Vec<(&'static str, Part)> {
        let mut parts: Vec<_> = self.with(|s| s.step_at_peak.clone().into_iter().collect());
        parts.sort_by_key(|&(what, p)| (std::cmp::Reverse(p.bytes), what));
        parts
    }
}

/// A tensor (on the device, or its host copy) and its counted bytes.
pub struct Tracked<T> {
    pub inner: T,
    bytes: usize,
    kind: usize,
    ticket: u64,
    host: bool,
    /// The op that made it (a clone keeps its original's).
    what: &'static str,
    counter: Arc<Counter>,
}

impl<T> Tracked<T> {
    fn new(
        inner: T,
        bytes: usize,
        kind: Option<usize>,
        host: bool,
        what: &'static str,
        counter: &Arc<Counter>,
    ) -> Self {
        let (kind, ticket) = counter.hold(kind, bytes, host, what);
        Tracked {
            inner,
            bytes,
            kind,
            ticket,
            host,
            what,
            counter: counter.clone(),
        }
    }
}

impl<T> Drop for Tracked<T> {
    fn drop(&mut self) {
        self.counter
            .release(self.kind, self.ticket, self.bytes, self.host);
    }
}

/// A clone is a new tensor of the same size and kind (a kept activation's clone is the step's:
/// it is made after the forward).
impl<T: Clone> Clone for Tracked<T> {
    fn clone(&self) -> Self {
        let (inner, kind) = (self.inner.clone(), Some(self.kind));
        Tracked::new(inner, self.bytes, kind, self.host, self.what, &self.counter)
    }
}

/// `inner` with every tensor it makes counted in `counter`.
pub struct Metered<O> {
    pub inner: O,
    pub counter: Arc<Counter>,
}

impl<O: Ops> Metered<O> {
    /// `t`, made by the op `what`, counted from now until it is dropped.
    pub fn track(&self, t: O::T, what: &'static str) -> Tracked<O::T> {
        let bytes = self.inner.bytes(&t);
        Tracked::new(t, bytes, None, false, what, &self.counter)
    }

    fn tracked(&self, t: Result<O::T>, what: &'static str) -> Result<Tracked<O::T>> {
        t.map(|t| self.track(t, what))
    }
}

impl<O: Ops> Ops for Metered<O> {
    type T = Tracked<O::T>;

    fn upload(&self, host: &[f32]) -> Result<Self::T> {
        self.tracked(self.inner.upload(host), "upload")
    }

    fn upload_state(&self, host: &[f32]) -> Result<Self::T> {
        self.tracked(self.inner.upload_state(host), "upload")
    }

    fn download(&self, t: &Self::T) -> Result<Vec<f32>> {
        self.inner.download(&t.inner)
    }

    /// Host copies are counted apart from the device's tensors ([`Counter::host_peak`]), at
    /// the bytes of the tensor they copy, as the kind that tensor is.
    type Host = Tracked<O::Host>;

    fn stash(&self, t: &Self::T) -> Result<Self::Host> {
        let h = self.inner.stash(&t.inner)?;
        Ok(Tracked::new(
            h,
            t.bytes,
            Some(t.kind),
            true,
            t.what,
            &self.counter,
        ))
    }

    fn stash_into(&self, t: &Self::T, h: &mut Self::Host) -> Result<()> {
        self.inner.stash_into(&t.inner, &mut h.inner)
    }

    fn fetch(&self, h: &Self::Host) -> Result<Self::T> {
        self.tracked(self.inner.fetch(&h.inner), h.what)
    }

    fn await_fetches(&self) -> Result<()> {
        self.inner.await_fetches()
    }

    fn zeros(&self, len: usize) -> Result<Self::T> {
        self.tracked(self.inner.zeros(len), "zeros")
    }

    fn activation_zeros(&self, len: usize) -> Result<Self::T> {
        self.tracked(self.inner.activation_zeros(len), "activation_zeros")
    }

    fn random_uniform(&self, len: usize, key: u64, offset: u64, amp: f32) -> Result<Self::T> {
        self.tracked(self.inner.random_uniform(len, key, offset, amp), "random")
    }

    fn len(&self, t: &Self::T) -> usize {
        self.inner.len(&t.inner)
    }

    fn elem_bytes(&self) -> usize {
        self.inner.elem_bytes()
    }

    fn bytes(&self, t: &Self::T) -> usize {
        t.bytes
    }

    fn rows(&self, t: &Self::T, width: usize, start: usize, len: usize) -> Result<Self::T> {
        self.tracked(self.inner.rows(&t.inner, width, start, len), "rows")
    }

    fn set_rows(&self, dst: &mut Self::T, width: usize, start: usize, src: &Self::T) -> Result<()> {
        self.inner
            .set_rows(&mut dst.inner, width, start, &src.inner)
    }

    /// The parts are passed to `inner` as copies (`join` takes a slice of its own tensors),
    /// which are not counted: only sharded runs join.
    fn join(&self, parts: &[Self::T]) -> Result<Self::T> {
        let parts: Vec<O::T> = parts.iter().map(|p| p.inner.clone()).collect();
        self.tracked(self.inner.join(&parts), "join")
    }

    fn add_assign(&self, dst: &mut Self::T, src: &Self::T) -> Result<()> {
        self.inner.add_assign(&mut dst.inner, &src.inner)
    }

    fn sum_squares(&self, t: &Self::T) -> Result<f64> {
        self.inner.sum_squares(&t.inner)
    }

    fn scale(&self, t: &mut Self::T, s: f64) -> Result<()> {
        self.inner.scale(&mut t.inner, s)
    }

    fn embed(&self, table: &Self::T, tokens: &[u32], dim: usize) -> Result<Self::T> {
        self.tracked(self.inner.embed(&table.inner, tokens, dim), "embed")
    }

    fn embed_backward(
        &self,
        dtable: &mut Self::T,
        tokens: &[u32],
        dy: &Self::T,
        dim: usize,
    ) -> Result<()> {
        self.inner
            .embed_backward(&mut dtable.inner, tokens, &dy.inner, dim)
    }

    fn linear(
        &self,
        x: &Self::T,
        w: &Self::T,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Self::T> {
        self.tracked(
            self.inner.linear(&x.inner, &w.inner, rows, inp, out),
            "linear",
        )
    }

    fn linear_backward(
        &self,
        dy: &Self::T,
        x: &Self::T,
        w: &Self::T,
        rows: usize,
        inp: usize,
        out: usize,
        dx: &mut Self::T,
        dw: &mut Self::T,
    ) -> Result<()> {
        self.inner.linear_backward(
            &dy.inner,
            &x.inner,
            &w.inner,
            rows,
            inp,
            out,
            &mut dx.inner,
            &mut dw.inner,
        )
    }

    fn bias_add(&self, y: &mut Self::T, b: &Self::T, rows: usize, width: usize) -> Result<()> {
        self.inner.bias_add(&mut y.inner, &b.inner, rows, width)
    }

    fn bias_backward(
        &self,
        dy: &Self::T,
        rows: usize,
        width: usize,
        db: &mut Self::T,
    ) -> Result<()> {
        self.inner
            .bias_backward(&dy.inner, rows, width, &mut db.inner)
    }

    fn rmsnorm(
        &self,
        x: &Self::T,
        w: &Self::T,
        rows: usize,
        dim: usize,
        eps: f64,
    ) -> Result<(Self::T, Self::T)> {
        let (y, rstd) = self.inner.rmsnorm(&x.inner, &w.inner, rows, dim, eps)?;
        Ok((self.track(y, "rmsnorm"), self.track(rstd, "rmsnorm")))
    }

    fn rmsnorm_backward(
        &self,
        x: &Self::T,
        w: &Self::T,
        rstd: &Self::T,
        dy: &Self::T,
        rows: usize,
        dim: usize,
        dx: &mut Self::T,
        dw: &mut Self::T,
    ) -> Result<()> {
        self.inner.rmsnorm_backward(
            &x.inner,
            &w.inner,
            &rstd.inner,
            &dy.inner,
            rows,
            dim,
            &mut dx.inner,
            &mut dw.inner,
        )
    }

    fn rope(
        &self,
        x: &mut Self::T,
        rows: usize,
        heads: usize,
        head_dim: usize,
        positions: &[Span],
        rotary: &Rotary,
        inverse: bool,
    ) -> Result<()> {
        self.inner.rope(
            &mut x.inner,
            rows,
            heads,
            head_dim,
            positions,
            rotary,
            inverse,
        )
    }

    fn swiglu(&self, g: &Self::T, u: &Self::T) -> Result<Self::T> {
        self.tracked(self.inner.swiglu(&g.inner, &u.inner), "swiglu")
    }

    fn swiglu_backward(
        &self,
        g: &Self::T,
        u: &Self::T,
        dm: &Self::T,
    ) -> Result<(Self::T, Self::T)> {
        let (dg, du) = self.inner.swiglu_backward(&g.inner, &u.inner, &dm.inner)?;
        Ok((
            self.track(dg, "swiglu_backward"),
            self.track(du, "swiglu_backward"),
        ))
    }

    fn cross_entropy(
        &self,
        h: &Self::T,
        w: &Self::T,
        targets: &[u32],
        dim: usize,
        vocab: usize,
        scale: f64,
        dw: &mut Self::T,
    ) -> Result<LossOut<Self::T>> {
        let out = self.inner.cross_entropy(
            &h.inner,
            &w.inner,
            targets,
            dim,
            vocab,
            scale,
            &mut dw.inner,
        )?;
        Ok(LossOut {
            loss_sum: out.loss_sum,
            argmax: out.argmax,
            dh: self.track(out.dh, "cross_entropy"),
        })
    }

    fn adamw(
        &self,
        param: &mut Self::T,
        grad: &Self::T,
        m: &mut Self::T,
        v: &mut Self::T,
        hp: &AdamW,
        step: u64,
        decay: bool,
    ) -> Result<()> {
        self.inner.adamw(
            &mut param.inner,
            &grad.inner,
            &mut m.inner,
            &mut v.inner,
            hp,
            step,
            decay,
        )
    }
}

/// `inner` attention with its outputs counted as `ops`'s tensors.
pub struct MeteredAttention<'m, O, A> {
    pub ops: &'m Metered<O>,
    pub inner: A,
}

impl<O: Ops, A: Attention<O::T>> Attention<Tracked<O::T>> for MeteredAttention<'_, O, A> {
    fn forward(
        &mut self,
        q: &Tracked<O::T>,
        k: &Tracked<O::T>,
        v: &Tracked<O::T>,
    ) -> Result<(Tracked<O::T>, Tracked<O::T>)> {
        let (o, lse) = self.inner.forward(&q.inner, &k.inner, &v.inner)?;
        Ok((
            self.ops.track(o, "attention"),
            self.ops.track(lse, "attention"),
        ))
    }

    fn backward(
        &mut self,
        q: &Tracked<O::T>,
        k: &Tracked<O::T>,
        v: &Tracked<O::T>,
        o: &Tracked<O::T>,
        lse: &Tracked<O::T>,
        dout: &Tracked<O::T>,
    ) -> Result<(Tracked<O::T>, Tracked<O::T>, Tracked<O::T>)> {
        let (dq, dk, dv) = self.inner.backward(
            &q.inner,
            &k.inner,
            &v.inner,
            &o.inner,
            &lse.inner,
            &dout.inner,
        )?;
        Ok((
            self.ops.track(dq, "attention_backward"),
            self.ops.track(dk, "attention_backward"),
            self.ops.track(dv, "attention_backward"),
        ))
    }
}

/// One sentence unless `got` elements are the `want` an op expects of `what`.
pub(crate) fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(anyhow!(
            "{what} has {got} elements where {want} were expected"
        ));
    }
    Ok(())
}
