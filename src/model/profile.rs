//! Where a training step's time goes: the model's device interface and its attention wrapped
//! (`instrument::Instrumented`, a [`Profile`] its instrument) to wait for the device after every
//! call and add the wait to the call's name (`distflash bench train --profile`). Waiting
//! serialises host and device, so a profiled step takes a little longer than an unprofiled one;
//! the shares are the point — they say which op to make faster next.

use super::instrument::{Instrument, Instrumented};
use super::ops::Ops;
use anyhow::Result;
use serde::Serialize;
use std::borrow::Cow;
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

/// Any device with every call timed into the profile, its instrument.
pub type Profiled<'p, O> = Instrumented<'p, O, &'p Profile<'p>>;

/// Profiling: every call timed under its op's name; the tensors are the device's own.
impl<O: Ops> Instrument<O> for &Profile<'_> {
    type T = O::T;
    type Host = O::Host;

    fn around<R>(&self, op: &'static str, call: impl FnOnce() -> Result<R>) -> Result<R> {
        self.time(op, call)
    }

    fn made(&self, _: &O, t: O::T, _: &'static str) -> O::T {
        t
    }

    fn stashed(&self, _: &O::T, h: O::Host) -> O::Host {
        h
    }

    fn made_by(_: &O::Host) -> &'static str {
        "fetch"
    }

    fn tensor(t: &O::T) -> &O::T {
        t
    }

    fn tensor_mut(t: &mut O::T) -> &mut O::T {
        t
    }

    fn host(h: &O::Host) -> &O::Host {
        h
    }

    fn host_mut(h: &mut O::Host) -> &mut O::Host {
        h
    }

    fn tensors(parts: &[O::T]) -> Cow<'_, [O::T]> {
        Cow::Borrowed(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::Cpu;
    use crate::model::ops::Rows;

    #[test]
    fn counts_and_times_each_call_under_its_name() {
        let cpu = Cpu::<f64>::new();
        let sync = || Ok(());
        let profile = Profile::new(&sync);
        let ops = Profiled {
            inner: &cpu,
            instrument: &profile,
        };
        let x = ops.upload(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        let w = ops.upload(&[1.0, 0.0, 0.0, 1.0]).unwrap();
        let y = ops.linear(Rows::whole(&x), &w, 2, 2, 2).unwrap();
        assert_eq!(ops.download(&y).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        ops.linear(Rows::whole(&y), &w, 2, 2, 2).unwrap();
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
