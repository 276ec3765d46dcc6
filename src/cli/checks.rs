//! The up-front checks of a run, shared by the commands that run workers: the sequence split and
//! the fastest rate the devices could reach (the least-time rule). Settings that change nothing
//! here are the step plan's to warn of (`train::step_plan`).

use anyhow::Result;
use distflash::plan::Schedule;
use distflash::resources;
use distflash::runtime::{Device, Runtime, Topology};

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
