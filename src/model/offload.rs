//! Where each layer's checkpoint waits between the forward that makes it and the backward that
//! reads it: on the device, or (`--offload activations`) in host memory. Offloaded, a layer's
//! kept tensors are stashed to the host as its forward ends ([`Ops::stash`]) and fetched back
//! ([`Ops::fetch`]) one layer ahead of the backward: taking layer l for its backward first
//! issues the fetch of layer l − 1, so that copy runs while layer l computes and only two
//! layers' checkpoints are on the device at once instead of all of them. The copies are exact,
//! so an offloaded step computes the same bits as one that keeps everything on the device.
//!
//! Under `--checkpoint none` the checkpoint is every activation, and all of it is offloaded.

use super::config::Config;
use super::layer::{Checkpoint, Kept, mlp_block_rows};
use super::meter::Meter;
use super::ops::Ops;
use anyhow::{Result, bail};
use std::fmt;

/// What goes to host memory during a step (`--offload`): each layer's checkpoint
/// (`activations`, this module), AdamW's moments (`optimizer`, `train::moments`), or both.
/// Spelled as `--offload` takes it (`train::step_plan::AskedOffload`, which also takes `auto`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    activations: bool,
    optimizer: bool,
}

impl Offload {
    /// Everything stays on the device.
    pub const NONE: Offload = Offload {
        activations: false,
        optimizer: false,
    };
    /// Each layer's checkpoint (what `--checkpoint` keeps) waits in host memory.
    pub const ACTIVATIONS: Offload = Offload {
        activations: true,
        optimizer: false,
    };
    /// AdamW's state (its moments and the masters of 16-bit weights) lives in host memory
    /// between updates.
    pub const OPTIMIZER: Offload = Offload {
        activations: false,
        optimizer: true,
    };
    /// Both.
    pub const ALL: Offload = Offload {
        activations: true,
        optimizer: true,
    };

    /// Whether the layers' checkpoints go to host memory.
    pub fn activations(self) -> bool {
        self.activations
    }

    /// Whether AdamW's moments live in host memory.
    pub fn optimizer(self) -> bool {
        self.optimizer
    }

    /// Whether anything goes to host memory.
    pub fn any(self) -> bool {
        self != Offload::NONE
    }

    /// What either of `self` and `other` moves.
    pub fn and(self, other: Offload) -> Offload {
        Offload {
            activations: self.activations || other.activations,
            optimizer: self.optimizer || other.optimizer,
        }
    }
}

impl fmt::Display for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.activations, self.optimizer) {
            (false, false) => "none",
            (true, false) => "activations",
            (false, true) => "optimizer",
            (true, true) => "activations,optimizer",
        })
    }
}

/// Written as `--offload` spells it (`"activations,optimizer"`), in reports and estimates.
impl serde::Serialize for Offload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What a step keeps of each layer's activations for the backward, and where it keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    pub checkpoint: Checkpoint,
    pub offload: Offload,
    /// The last `whole_layers` layers keep every activation, on the device, whatever
    /// `checkpoint` and `offload` say: their backward recomputes nothing. Memory the step
    /// leaves free, spent on speed (the step plan's choice); the last layers, because their
    /// backward comes first and frees it soonest.
    pub whole_layers: usize,
    /// The MLP runs over every row at once instead of in blocks of [`mlp_block_rows`]: its six
    /// products over 16K rows of LLaMA-7B's shape took 20.15 ms whole against 20.98 ms in
    /// blocks on an H100 (`gpu_timing ops`, `bench/results/norm-one-pass-2026-12-06`), at the
    /// cost of wide tensors as long as the sequence. Memory the step leaves free, spent on
    /// speed (the step plan's choice).
    pub whole_mlp: bool,
}

impl Keep {
    /// `checkpoint`'s tensors kept on the device.
    pub fn on_device(checkpoint: Checkpoint) -> Keep {
        Keep {
            checkpoint,
            offload: Offload::NONE,
            whole_layers: 0,
            whole_mlp: false,
        }
    }

    /// Rows the MLP of a pass over `rows` rows of `cfg` handles at once.
    pub fn mlp_rows(&self, cfg: &Config, rows: usize) -> usize {
        match self.whole_mlp {
            true => rows,
            false => mlp_block_rows(cfg),
        }
    }

    /// Whether layer `l` of `layers` keeps every activation on the device.
    pub fn whole(&self, l: usize, layers: usize) -> bool {
        l + self.whole_layers >= layers
    }

    /// What layer `l` of `layers` keeps for its backward.
    pub fn policy(&self, l: usize, layers: usize) -> Checkpoint {
        match self.whole(l, layers) {
            true => Checkpoint::None,
            false => self.checkpoint,
        }
    }
}

/// One layer's checkpoint; offloaded, with its bytes (for the meter, which counts the device's).
enum Slot<O: Ops> {
    Device(Kept<O::T>),
    Host(Kept<O::Host>, usize),
    Taken,
}

/// The layers' checkpoints in forward order; the backward takes them back last first.
pub(super) struct Checkpoints<'a, O: Ops> {
    ops: &'a O,
    offload: Offload,
    layers: Vec<Slot<O>>,
    /// The device tensors of the last layer stashed (its index, checkpoint and bytes), dropped
    /// when the next layer's stash is issued: the copy to the host then runs beside that
    /// layer's forward, where dropping them at once would make the device wait for it (a
    /// buffer's free is ordered after its last use). The last layer's is the one its backward
    /// reads, with no fetch.
    draining: Option<(usize, Kept<O::T>, usize)>,
}

impl<'a, O: Ops> Checkpoints<'a, O> {
    pub(super) fn new(ops: &'a O, offload: Offload, layers: usize) -> Self {
        Checkpoints {
            ops,
            offload,
            layers: Vec::with_capacity(layers),
            draining: None,
        }
    }

    /// Drops the draining layer's device tensors and their bytes from the meter.
    fn drain(&mut self, meter: &mut Meter) {
        if let Some((_, kept, bytes)) = self.draining.take() {
            drop(kept);
            meter.release(bytes);
        }
    }

    /// The next layer's checkpoint (`bytes` of it, held on the meter), its copy to the host
    /// issued when offloading, unless it stays (`on_device`: a whole layer); the previous
    /// layer's device copy is dropped then.
    pub(super) fn push(
        &mut self,
        kept: Kept<O::T>,
        bytes: usize,
        on_device: bool,
        meter: &mut Meter,
    ) -> Result<()> {
        if !self.offload.activations() || on_device {
            self.layers.push(Slot::Device(kept));
            return Ok(());
        }
        let host = kept.try_map(|t| self.ops.stash(t))?;
        self.drain(meter);
        self.draining = Some((self.layers.len(), kept, bytes));
        self.layers.push(Slot::Host(host, bytes));
        Ok(())
    }

    /// Brings layer `l`'s checkpoint to the device if it is on the host: the draining device
    /// copy if it is that layer's, else a fetch.
    fn bring(&mut self, l: usize, meter: &mut Meter) -> Result<()> {
        let slot = std::mem::replace(&mut self.layers[l], Slot::Taken);
        self.layers[l] = match slot {
            Slot::Host(_, _) if matches!(self.draining, Some((d, _, _)) if d == l) => {
                let (_, kept, _) = self.draining.take().expect("matched");
                Slot::Device(kept)
            }
            Slot::Host(host, bytes) => {
                let kept = host.try_map(|h| self.ops.fetch(h))?;
                meter.hold(bytes);
                Slot::Device(kept)
            }
            other => other,
        };
        Ok(())
    }

    /// Layer `l`'s checkpoint on the device for its backward, the fetch of layer `l − 1`'s
    /// issued first so it overlaps this layer's backward.
    pub(super) fn take(&mut self, l: usize, meter: &mut Meter) -> Result<Kept<O::T>> {
        if l >= self.layers.len() {
            bail!(
                "layer {l}'s checkpoint was asked for, but only {} layers ran forward",
                self.layers.len()
            );
        }
        self.bring(l, meter)?;
        self.drain(meter);
        if self.offload.activations() {
            self.ops.await_fetches()?;
        }
        if l > 0 {
            self.bring(l - 1, meter)?;
        }
        match std::mem::replace(&mut self.layers[l], Slot::Taken) {
            Slot::Device(kept) => Ok(kept),
            _ => bail!("layer {l}'s checkpoint was taken twice"),
        }
    }
}
