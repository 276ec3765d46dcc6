//! Device memory counted from the code: a wrapper over any `Ops` device whose tensors carry a
//! ticket for their bytes, added to a shared counter when the tensor is made (or cloned) and
//! taken off when it is dropped, so the counter's peak is the most bytes of tensors the model
//! held at once. Around the CPU backend it measures that backend's own peak; around
//! `train::memory::lengths::Lengths` (a device that allocates nothing) it is the memory estimate of the
//! real forward and backward. The wrapper is `instrument::Instrumented`, the counter its
//! instrument ([`Metered`]).

use crate::model::instrument::{Instrument, Instrumented};
use crate::model::ops::Ops;
use anyhow::{Result, anyhow};
use serde::Serialize;
use std::borrow::Cow;
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

impl<T> Tracked<T> {
    /// `inner`, a device tensor of `bytes` made by `what`, counted in `counter` as the kind it
    /// is set to: how a device that is not an `Ops` wrapper (the counting device's block API
    /// and communicator, `train::memory::counted`) hands out counted tensors.
    pub fn made(inner: T, bytes: usize, what: &'static str, counter: &Arc<Counter>) -> Self {
        Tracked::new(inner, bytes, None, false, what, counter)
    }

    /// The counter this tensor is counted in: where a tensor made like it goes.
    pub fn counter(&self) -> &Arc<Counter> {
        &self.counter
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

/// Any device with every tensor it makes counted in the counter, its instrument.
pub type Metered<'d, O> = Instrumented<'d, O, Arc<Counter>>;

/// Metering: every tensor made, and every host copy stashed, carries a ticket of its bytes in
/// the counter until it is dropped.
impl<O: Ops> Instrument<O> for Arc<Counter> {
    type T = Tracked<O::T>;
    /// Host copies are counted apart from the device's tensors ([`Counter::host_peak`]), at
    /// the bytes of the tensor they copy, as the kind that tensor is.
    type Host = Tracked<O::Host>;

    fn made(&self, ops: &O, t: O::T, what: &'static str) -> Tracked<O::T> {
        let bytes = ops.bytes(&t);
        Tracked::new(t, bytes, None, false, what, self)
    }

    fn stashed(&self, t: &Tracked<O::T>, h: O::Host) -> Tracked<O::Host> {
        Tracked::new(h, t.bytes, Some(t.kind), true, t.what, self)
    }

    fn made_by(h: &Tracked<O::Host>) -> &'static str {
        h.what
    }

    fn tensor(t: &Tracked<O::T>) -> &O::T {
        &t.inner
    }

    fn tensor_mut(t: &mut Tracked<O::T>) -> &mut O::T {
        &mut t.inner
    }

    fn host(h: &Tracked<O::Host>) -> &O::Host {
        &h.inner
    }

    fn host_mut(h: &mut Tracked<O::Host>) -> &mut O::Host {
        &mut h.inner
    }

    /// The parts are passed to the device as copies, which are not counted: only sharded runs
    /// join.
    fn tensors(parts: &[Tracked<O::T>]) -> Cow<'_, [O::T]> {
        Cow::Owned(parts.iter().map(|p| p.inner.clone()).collect())
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
