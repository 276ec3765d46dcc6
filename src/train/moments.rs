//! Where AdamW's state waits between updates (its two f32 moments, and the master of 16-bit
//! weights, `model::ops::AdamState`): on the device beside the weights, or
//! (`--offload optimizer`) in host memory, streamed through the device a tensor at a time by
//! the update. Offloaded, tensor k + 1's state is fetched ([`Ops::fetch`], on a GPU the copy
//! stream) while tensor k's is updated by the device's one `adamw`, and tensor k's goes back
//! into its own host buffers ([`Ops::stash_into`], on a GPU a second copy stream, so the link
//! carries k's down while k + 1's comes up; the host memory is the state's, once) as soon as
//! its update is issued, so the device holds two tensors' state at once instead of all of it:
//! for llama2-7b that is 1.2 GiB of staging for 62.8 GiB of state (counted where it happens:
//! `train::memory::estimate`).
//!
//! Why stream through the device rather than update on the host: one AdamW implementation (the
//! device's, so an offloaded run computes the same bits as one that is not), for about the same
//! time. For llama2-7b the state is 2 × 25.1 GiB of f32 moments and 12.6 GiB of masters (the
//! bf16 weights' low halves); streamed, each update moves it up and back, 63 GiB each way over
//! PCIe at about 50 GB/s a direction: 1.3 s a step with both directions at once, 2.6 s if they
//! took turns, beside the ~250 s of a 256K-token step (about 1%) or the ~15 s of a 64K one. On
//! the host, the f32 gradients (25.1 GiB) would come down and the 16-bit weights (12.6 GiB) go
//! back up, 0.8 s of link, and the state be read and written in host memory (126 GiB at
//! ~100 GB/s with all cores, 1.3 s): no gain worth a second AdamW that must round as the
//! kernel does, run on cores the step's data loading shares.
//!
//! The copies are exact, so the update's arithmetic is the device-resident update's.

use crate::model::ops::{AdamState, Ops};
use anyhow::Result;

/// Every parameter tensor's AdamW state (`specs` order; a worker's pieces when sharded): the
/// moments and any master copy, on the device or in host memory.
pub enum Moments<O: Ops> {
    Device(Vec<AdamState<O::T>>),
    Host(Vec<AdamState<O::Host>>),
}

/// Whether AdamW keeps a master copy of `param`: a parameter narrower than f32 (the GPU's 16-bit
/// weights) would lose every update below half its step.
pub fn needs_master<O: Ops>(ops: &O, param: &O::T) -> bool {
    ops.bytes(param) < size_of::<f32>() * ops.len(param)
}

/// A whole parameter's state as a fresh run starts it: zero moments and, for a 16-bit
/// parameter, its master (`Ops::master_of`).
pub fn fresh_state<O: Ops>(ops: &O, param: &O::T) -> Result<AdamState<O::T>> {
    let len = ops.len(param);
    let (m, v) = (ops.zeros(len)?, ops.zeros(len)?);
    let master = match needs_master(ops, param) {
        true => Some(ops.master_of(param)?),
        false => None,
    };
    Ok(AdamState { m, v, master })
}

impl<O: Ops> Moments<O> {
    /// `tensors` tensors' state, each made on the device by `make(k)`; offloaded, each is
    /// stashed to host memory and dropped before the next is made, so start-up never holds
    /// more than one tensor's on the device either.
    pub fn made(
        ops: &O,
        tensors: usize,
        offload: bool,
        mut make: impl FnMut(usize) -> Result<AdamState<O::T>>,
    ) -> Result<Self> {
        if !offload {
            return Ok(Moments::Device(
                (0..tensors).map(make).collect::<Result<_>>()?,
            ));
        }
        let host = (0..tensors)
            .map(|k| make(k)?.try_map(|t| ops.stash(&t)))
            .collect::<Result<_>>()?;
        Ok(Moments::Host(host))
    }

    /// Runs `update(k, state)` on every tensor's state in order, with it on the device.
    /// Offloaded: the fetch of tensor k + 1's is issued before tensor k's update (so it runs
    /// beside it) and tensor k's is copied back over its host buffers after it.
    pub fn update_each(
        &mut self,
        ops: &O,
        mut update: impl FnMut(usize, AdamState<&mut O::T>) -> Result<()>,
    ) -> Result<()> {
        let host = match self {
            Moments::Device(states) => {
                for (k, state) in states.iter_mut().enumerate() {
                    update(k, state.as_mut())?;
                }
                return Ok(());
            }
            Moments::Host(host) => host,
        };
        let fetch = |h: &AdamState<O::Host>| h.as_ref().try_map(|h| ops.fetch(h));
        let mut next = host.first().map(fetch).transpose()?;
        for k in 0..host.len() {
            ops.await_fetches()?;
            let mut state = next.take().expect("each tensor's state fetched one ahead");
            next = host.get(k + 1).map(fetch).transpose()?;
            update(k, state.as_mut())?;
            let home = host[k].as_mut();
            ops.stash_into(&state.m, home.m)?;
            ops.stash_into(&state.v, home.v)?;
            if let (Some(t), Some(h)) = (&state.master, home.master) {
                ops.stash_into(t, h)?;
            }
        }
        Ok(())
    }

    /// Runs `read(k, state)` on every tensor's state in order, with it on the device (one
    /// tensor's at a time when offloaded): what a checkpoint saves.
    pub fn read_each(
        &self,
        ops: &O,
        mut read: impl FnMut(usize, AdamState<&O::T>) -> Result<()>,
    ) -> Result<()> {
        match self {
            Moments::Device(states) => {
                for (k, state) in states.iter().enumerate() {
                    read(k, state.as_ref())?;
                }
            }
            Moments::Host(host) => {
                for (k, h) in host.iter().enumerate() {
                    let state = h.as_ref().try_map(|h| ops.fetch(h))?;
                    ops.await_fetches()?;
                    read(k, state.as_ref())?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::Cpu;

    /// Both stores hand the update each tensor's own state, in order, and keep what it wrote:
    /// tensor k's moments start at k and 10k and, for odd k, its master at 100k; each update
    /// adds 1 to m, doubles v and subtracts 1 from the master.
    #[test]
    fn each_tensor_gets_its_own_state_and_keeps_the_update() {
        let cpu = Cpu::<f32>::new();
        let lens = [3, 1, 4, 1, 5];
        for offload in [false, true] {
            let mut moments = Moments::made(&cpu, lens.len(), offload, |k| {
                let n = lens[k];
                Ok(AdamState {
                    m: vec![k as f32; n],
                    v: vec![10.0 * k as f32; n],
                    master: (k % 2 == 1).then(|| vec![100.0 * k as f32; n]),
                })
            })
            .unwrap();
            for _ in 0..2 {
                moments
                    .update_each(&cpu, |k, s| {
                        assert_eq!(s.m.len(), lens[k], "offload {offload}: tensor {k}");
                        assert_eq!(s.master.is_some(), k % 2 == 1, "offload {offload}: {k}");
                        s.m.iter_mut().for_each(|x| *x += 1.0);
                        s.v.iter_mut().for_each(|x| *x *= 2.0);
                        if let Some(master) = s.master {
                            master.iter_mut().for_each(|x| *x -= 1.0);
                        }
                        Ok(())
                    })
                    .unwrap();
            }
            let mut seen = 0;
            moments
                .read_each(&cpu, |k, s| {
                    let n = lens[k];
                    let want = AdamState {
                        m: vec![k as f32 + 2.0; n],
                        v: vec![40.0 * k as f32; n],
                        master: (k % 2 == 1).then(|| vec![100.0 * k as f32 - 2.0; n]),
                    };
                    assert_eq!(s.m, &want.m, "offload {offload}: m {k}");
                    assert_eq!(s.v, &want.v, "offload {offload}: v {k}");
                    assert_eq!(s.master, want.master.as_ref(), "offload {offload}: {k}");
                    seen += 1;
                    Ok(())
                })
                .unwrap();
            assert_eq!(seen, lens.len());
        }
    }

    #[test]
    fn a_tensor_is_not_stashed_over_a_stash_of_another_length() {
        let cpu = Cpu::<f32>::new();
        let mut h = cpu.stash(&vec![1.0; 4]).unwrap();
        let e = cpu
            .stash_into(&vec![2.0; 3], &mut h)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "a tensor of 3 elements cannot be stashed over the stash of one of 4"
        );
        cpu.stash_into(&vec![2.0; 4], &mut h).unwrap();
        assert_eq!(cpu.fetch(&h).unwrap(), vec![2.0; 4]);
    }
}
