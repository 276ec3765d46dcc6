//! Where AdamW's moments wait between updates: on the device beside the weights, or
//! (`--offload optimizer`) in host memory, streamed through the device a tensor at a time by
//! the update. Offloaded, tensor k + 1's moments are fetched ([`Ops::fetch`], on a GPU the copy
//! stream) while tensor k's are updated by the device's one `adamw`, and tensor k's go back
//! ([`Ops::stash`]) as soon as its update is issued, so the device holds two tensors' moments
//! at once instead of all of them: for llama2-7b that is 1 GiB of staging for 50.2 GiB of
//! moments (`model::cost::moment_staging_elements`).
//!
//! Why stream through the device rather than update on the host: one AdamW implementation (the
//! device's, so an offloaded run computes the same bits as one that is not), and the cost is
//! the link's, not the CPU's. For llama2-7b the moments are 2 × 25.1 GiB of f32; each update
//! moves them up and back, 100 GiB over PCIe at about 50 GB/s, about 2 s a step, beside the
//! ~250 s of a 256K-token step (under 1%). On the host, AdamW would read and write the same
//! 50 GiB of moments plus the gradients (downloaded, 25 GiB) and the weights (both ways) at a
//! host's ~100 GB/s with all cores: no faster, and a second implementation to keep equal.
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
    /// beside it) and tensor k's are stashed back after it.
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
            host[k] = (ops.stash(&m)?, ops.stash(&v)?);
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
