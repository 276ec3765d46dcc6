//! The up-front checks of a run, shared by the commands that run workers: the sequence split,
//! the fastest rate the devices could reach (the least-time rule), and settings that change
//! nothing here.

use anyhow::Result;
use distflash::model::Offload;
use distflash::plan::Schedule;
use distflash::resources;
use distflash::runtime::{Device, Runtime, Topology};
use distflash::train::shard::Shard;

/// [`resources::ensure_split`] for a job on `rt`: thread workers each hold their own plans.
pub fn ensure_split(seq: usize, schedule: Schedule, rt: &Runtime) -> Result<()> {
    let threads = matches!(rt.topology, Topology::Threads(_));
    resources::ensure_split(seq, rt.workers(), schedule, threads)
}

/// The fastest `rt`'s devices could compute together: this machine's cores, or its GPUs (a
/// launched job's add up; threads share one).
pub fn peak_flops(rt: &Runtime) -> f64 {
    match (rt.device, &rt.topology) {
        (Device::Cpu, _) => resources::cpu_peak_flops(),
        (Device::Cuda, Topology::Ranks(env)) => resources::gpu_peak_flops() * env.world as f64,
        (Device::Cuda, Topology::Threads(_)) => resources::gpu_peak_flops(),
    }
}

/// Warns (one line on stderr; the run goes on) of settings that are valid but change nothing
/// useful here: offloaded activations on the CPU, whose activations are in host memory already
/// (the offload only adds copies), and sharding with a single worker, who holds every piece.
pub fn warn_ineffective(device: Device, offload: Offload, shard: Option<Shard>, workers: usize) {
    if device == Device::Cpu && offload.activations() {
        eprintln!(
            "warning: --offload activations moves checkpoints to host memory, where the CPU's already are: here it only adds copies (it saves GPU memory with --device cuda)"
        );
    }
    if let Some(shard) = shard.filter(|&s| s != Shard::None && workers == 1) {
        eprintln!(
            "warning: --shard {} cuts the model's state across the workers, but one worker holds every piece: it changes nothing here (use --workers 2 or more to shard)",
            shard.name()
        );
    }
}
