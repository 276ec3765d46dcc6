//! The GPU's side of `--offload`: a checkpoint's tensors (`activations`), or AdamW's moments
//! (`optimizer`, `train::moments`), copied into pinned host memory and back. Pinned (page-locked) buffers are what a copy engine reads and writes
//! without the driver staging them, so the copies run asynchronously at the link's speed;
//! allocating them is slow (the driver locks the pages), so a buffer goes back to a shelf when
//! its checkpoint has been fetched and the next step's stash of the same size takes it again.

use crate::backend::cuda::{InputDtype, Tensor};
use anyhow::{Result, anyhow, bail};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice};
use std::sync::{Arc, Mutex};

/// Pinned buffers of one element type no checkpoint holds now, for reuse.
pub struct Shelf<T>(Mutex<Vec<PinnedHostSlice<T>>>);

impl<T: DeviceRepr> Shelf<T> {
    /// A buffer of `len` elements: a shelved one of that length, else a new one.
    fn take(&self, ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedHostSlice<T>> {
        if len == 0 {
            bail!("an empty tensor has nothing to offload; this worker holds no rows");
        }
        let mut shelf = self
            .0
            .lock()
            .map_err(|_| anyhow!("pinned memory shelf lock poisoned"))?;
        if let Some(i) = shelf.iter().position(|b| b.len() == len) {
            return Ok(shelf.swap_remove(i));
        }
        drop(shelf);
        // SAFETY: the buffer's contents are unset; the only use of it is as the destination of
        // the device-to-host copy that `stash` issues right away, and a fetch reads it only
        // after that copy (the buffer's event orders them). Flags 0: plain page-locked memory
        // (not write-combined, which the device's writes into it would not gain from).
        unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0) }.map_err(|e| {
            anyhow!(
                "could not pin {:.2} GiB of host memory for an offloaded tensor (a checkpoint, or AdamW's moments): {e:?}; run without --offload or free host memory",
                (len * size_of::<T>()) as f64 / (1u64 << 30) as f64
            )
        })
    }

    fn give(&self, buffer: PinnedHostSlice<T>) {
        if let Ok(mut shelf) = self.0.lock() {
            shelf.push(buffer);
        }
    }
}

/// The pinned buffers of one device's offloaded tensors: 16-bit activations, and f32
/// statistics and moments.
#[derive(Clone)]
pub struct HostPool(Arc<Shelves>);

pub struct Shelves {
    half: Shelf<u16>,
    f32: Shelf<f32>,
}

impl Default for HostPool {
    fn default() -> Self {
        HostPool(Arc::new(Shelves {
            half: Shelf(Mutex::default()),
            f32: Shelf(Mutex::default()),
        }))
    }
}

/// An element type with a shelf of its own in a [`HostPool`].
pub trait Shelved: DeviceRepr + Sized {
    fn shelf(s: &Shelves) -> &Shelf<Self>;
}

impl Shelved for u16 {
    fn shelf(s: &Shelves) -> &Shelf<u16> {
        &s.half
    }
}

impl Shelved for f32 {
    fn shelf(s: &Shelves) -> &Shelf<f32> {
        &s.f32
    }
}

/// A pinned buffer lent out of a [`HostPool`], shelved again when dropped.
pub struct Pinned<T: Shelved> {
    buffer: Option<PinnedHostSlice<T>>,
    pool: HostPool,
}

impl<T: Shelved> Drop for Pinned<T> {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            T::shelf(&self.pool.0).give(b);
        }
    }
}

/// One offloaded tensor in pinned host memory, its variant kept.
pub enum HostTensor {
    Half {
        dtype: InputDtype,
        data: Pinned<u16>,
    },
    F32(Pinned<f32>),
}

fn copy_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> anyhow::Error {
    move |e| anyhow!("the {what} copy of an offloaded tensor failed: {e:?}")
}

/// Makes work queued on `later` from now on wait for everything queued on `earlier` so far.
fn order(earlier: &Arc<CudaStream>, later: &Arc<CudaStream>) -> Result<()> {
    let event = earlier.record_event(None).map_err(copy_err("offload"))?;
    later.wait(&event).map_err(copy_err("offload"))
}

/// The GPU's streams as the offload uses them: `compute` runs the model and owns every
/// tensor's allocation; `copies` runs the stashes and fetches, to and from host memory, beside
/// it; `returns` runs the write-backs of values that live in host memory ([`Streams::stash_into`]),
/// so that an offloaded update's tensor k goes down while tensor k + 1 comes up on `copies` (the
/// link carries both directions at once).
pub struct Streams<'a> {
    pub compute: &'a Arc<CudaStream>,
    pub copies: Arc<CudaStream>,
    pub returns: Arc<CudaStream>,
}

impl Streams<'_> {
    /// Issues the copy of `t` into a pinned buffer of `pool` on `copies`, after everything
    /// `compute` has queued (the tensor's producer). The device buffer of `t` may be freed on
    /// `compute` as soon as this returns: cudarc orders that free after the copy's read (the
    /// buffer's read event, which `memcpy_dtoh` records on `copies`) by making `compute` wait
    /// for the copy, so the caller keeps `t` until it has issued the next layer's work
    /// (`model::offload`).
    pub fn stash(&self, pool: &HostPool, t: &Tensor) -> Result<HostTensor> {
        order(self.compute, &self.copies)?;
        Ok(match t {
            Tensor::Half { dtype, data } => HostTensor::Half {
                dtype: *dtype,
                data: self.stash_slice(pool, data)?,
            },
            Tensor::F32(data) => HostTensor::F32(self.stash_slice(pool, data)?),
        })
    }

    fn stash_slice<T: Shelved>(&self, pool: &HostPool, data: &CudaSlice<T>) -> Result<Pinned<T>> {
        let mut buffer = T::shelf(&pool.0).take(self.compute.context(), data.len())?;
        self.copies
            .memcpy_dtoh(data, &mut buffer)
            .map_err(copy_err("device-to-host"))?;
        Ok(Pinned {
            buffer: Some(buffer),
            pool: pool.clone(),
        })
    }

    /// Issues the copy of `t` over `h` (the stash of a tensor of its precision and length) on
    /// `returns`, after everything `compute` has queued: an offloaded value written back where
    /// it lives (`train::moments`). The pinned buffer's own event (cudarc's, which every copy
    /// of it waits for on its stream and records there) orders the copy after the fetch that
    /// read it on `copies`, and the next fetch after it. `t` may be freed on `compute` as soon
    /// as this returns (cudarc makes the free wait for the copy's read of it).
    pub fn stash_into(&self, t: &Tensor, h: &mut HostTensor) -> Result<()> {
        order(self.compute, &self.returns)?;
        match (t, h) {
            (
                Tensor::Half { dtype, data },
                HostTensor::Half {
                    dtype: into,
                    data: buffer,
                },
            ) if dtype == into => self.stash_over(data, buffer),
            (Tensor::F32(data), HostTensor::F32(buffer)) => self.stash_over(data, buffer),
            _ => bail!("a tensor can be stashed only over the stash of one of its precision"),
        }
    }

    fn stash_over<T: Shelved>(&self, data: &CudaSlice<T>, into: &mut Pinned<T>) -> Result<()> {
        let buffer = into.buffer.as_mut().expect("shelved only when dropped");
        if buffer.len() != data.len() {
            bail!(
                "a tensor of {} elements cannot be stashed over the stash of one of {}",
                data.len(),
                buffer.len()
            );
        }
        self.returns
            .memcpy_dtoh(data, buffer)
            .map_err(copy_err("device-to-host"))
    }

    /// Issues the copy of `h` into a new tensor allocated on `compute`, on `copies` once the
    /// allocation is made. Ops on `compute` may read the tensor only after
    /// [`Streams::landed`].
    pub fn fetch(&self, h: &HostTensor) -> Result<Tensor> {
        Ok(match h {
            HostTensor::Half { dtype, data } => Tensor::Half {
                dtype: *dtype,
                data: self.fetch_slice(data)?,
            },
            HostTensor::F32(data) => Tensor::F32(self.fetch_slice(data)?),
        })
    }

    fn fetch_slice<T: Shelved>(&self, data: &Pinned<T>) -> Result<CudaSlice<T>> {
        let src = data.buffer.as_ref().expect("shelved only when dropped");
        // SAFETY: every element is written by the copy below before any op reads the tensor
        // (ops on `compute` wait for `copies` first: `landed`).
        let mut out = unsafe { self.compute.alloc::<T>(src.len()) }.map_err(|e| {
            anyhow!("could not allocate a fetched offloaded tensor on the GPU: {e:?}")
        })?;
        order(self.compute, &self.copies)?;
        self.copies
            .memcpy_htod(src, &mut out)
            .map_err(copy_err("host-to-device"))?;
        Ok(out)
    }

    /// Makes work queued on `compute` from now on wait for every copy issued so far.
    pub fn landed(&self) -> Result<()> {
        order(&self.copies, self.compute)
    }
}
