//! Where AdamW's moments wait between updates: on the device beside the weights, or
//! (`--offload optimizer`) in host memory, streamed through the device a tensor at a time by
//! the update. Offloaded, tensor k + 1's moments are fetched ([`Ops::fetch`], on a GPU the copy
//! stream) while tensor k's are updated by the device's one `adamw`, and tensor k's go back
//! into their own host buffers ([`Ops::stash_into`], on a GPU a second copy stream, so the
//! link carries k's down while k + 1's come up; the host memory is the moments', once) as
//! soon as its update is issued, so the device holds two tensors' moments
//! at once instead of all of them: for llama2-7b that is 1 GiB of staging for 50.2 GiB of
//! moments (`model::cost::moment_staging_elements`).
//!
//! Why stream through the device rather than update on the host: one AdamW implementation (the
//! device's, so an offloaded run computes the same bits as one that is not), for about the same
//! time. For llama2-7b the moments are 2 × 25.1 GiB of f32; streamed, each update moves them up
//! and back, 50 GiB each way over PCIe at about 50 GB/s a direction: 1 s a step with both
//! directions at once, 2 s if they took turns, beside the ~250 s of a 256K-token step (under
//! 1%) or the ~15 s of a 64K one. On the host, the f32 gradients (25.1 GiB) would come down and
//! the 16-bit weights (12.6 GiB) go back up, 0.8 s of link, and the moments be read and written
//! in host memory (100 GiB at ~100 GB/s with all cores, 1 s): 1-2 s, no gain worth a second
//! AdamW that must round as the kernel does, run on cores the step's data loading shares.
//!
//! The copies are exact, so the update's arithmetic is the device-resident update's.

use crate::model::ops::Ops;
use anyhow::Result;

/// One tensor's two moments, `(m, v)`.
type Pair<T> = (T, T);

/// Every parameter tensor's moments (`specs` order; a worker's pieces when sharded), on the
/// device or in host memory.
pub enum Moments<O: Ops> {
    Device(Vec<Pair<O::T>>),
    Host(Vec<Pair<O::Host>>),
}

impl<O: Ops> Moments<O> {
    /// `tensors` tensors' moments, each pair made on the device by `make(k)`; offloaded, each
    /// pair is stashed to host memory and dropped before the next is made, so start-up never
    /// holds more than one tensor's on the device either.
    pub fn made(
        ops: &O,
        tensors: usize,
        offload: bool,
        mut make: impl FnMut(usize) -> Result<Pair<O::T>>,
    ) -> Result<Self> {
        if !offload {
            return Ok(Moments::Device(
                (0..tensors).map(make).collect::<Result<_>>()?,
            ));
        }
        let host = (0..tensors)
            .map(|k| {
                let (m, v) = make(k)?;
                Ok((ops.stash(&m)?, ops.stash(&v)?))
            })
            .collect::<Result<_>>()?;
        Ok(Moments::Host(host))
    }

    /// Runs `update(k, m, v)` on every tensor's moments in order, with them on the device.
    /// Offloaded: the fetch of tensor k + 1's is issued before tensor k's update (so it runs
    /// beside it) and tensor k's are copied back over their host buffers after it.
    pub fn update_each(
        &mut self,
        ops: &O,
        mut update: impl FnMut(usize, &mut O::T, &mut O::T) -> Result<()>,
    ) -> Result<()> {
        let host = match self {
            Moments::Device(pairs) => {
                for (k, (m, v)) in pairs.iter_mut().enumerate() {
                    update(k, m, v)?;
                }
                return Ok(());
            }
            Moments::Host(host) => host,
        };
        let fetch =
            |(m, v): &Pair<O::Host>| -> Result<Pair<O::T>> { Ok((ops.fetch(m)?, ops.fetch(v)?)) };
        let mut next = host.first().map(fetch).transpose()?;
        for k in 0..host.len() {
            ops.await_fetches()?;
            let (mut m, mut v) = next
                .take()
                .expect("each tensor's moments fetched one ahead");
            next = host.get(k + 1).map(fetch).transpose()?;
            update(k, &mut m, &mut v)?;
            ops.stash_into(&m, &mut host[k].0)?;
            ops.stash_into(&v, &mut host[k].1)?;
        }
        Ok(())
    }

    /// Runs `read(k, m, v)` on every tensor's moments in order, with them on the device (one
    /// tensor's at a time when offloaded): what a checkpoint saves.
    pub fn read_each(
        &self,
        ops: &O,
        mut read: impl FnMut(usize, &O::T, &O::T) -> Result<()>,
    ) -> Result<()> {
        match self {
            Moments::Device(pairs) => {
                for (k, (m, v)) in pairs.iter().enumerate() {
                    read(k, m, v)?;
                }
            }
            Moments::Host(host) => {
                for (k, (m, v)) in host.iter().enumerate() {
                    let (m, v) = (ops.fetch(m)?, ops.fetch(v)?);
                    ops.await_fetches()?;
                    read(k, &m, &v)?;
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

    /// Both stores hand the update each tensor's own moments, in order, and keep what it wrote:
    /// tensor k's moments start at k and 10k, each update adds 1 to m and doubles v.
    #[test]
    fn each_tensor_gets_its_own_moments_and_keeps_the_update() {
        let cpu = Cpu::<f32>::new();
        let lens = [3, 1, 4, 1, 5];
        for offload in [false, true] {
            let mut moments = Moments::made(&cpu, lens.len(), offload, |k| {
                let n = lens[k];
                Ok((vec![k as f32; n], vec![10.0 * k as f32; n]))
            })
            .unwrap();
            for _ in 0..2 {
                moments
                    .update_each(&cpu, |k, m, v| {
                        assert_eq!(m.len(), lens[k], "offload {offload}: tensor {k}");
                        m.iter_mut().for_each(|x| *x += 1.0);
                        v.iter_mut().for_each(|x| *x *= 2.0);
                        Ok(())
                    })
                    .unwrap();
            }
            let mut seen = 0;
            moments
                .read_each(&cpu, |k, m, v| {
                    assert_eq!(
                        m,
                        &vec![k as f32 + 2.0; lens[k]],
                        "offload {offload}: m {k}"
                    );
                    assert_eq!(
                        v,
                        &vec![40.0 * k as f32; lens[k]],
                        "offload {offload}: v {k}"
                    );
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
