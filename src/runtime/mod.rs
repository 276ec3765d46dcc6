//! Where a job runs, decided once for every command: the device (this machine's cores or a GPU)
//! × the topology (one worker; worker threads of this process, which on a GPU are virtual
//! workers sharing it; or one rank of a multi-process job started by `distflash launch` or
//! torchrun-style variables, one GPU each). The runtime opens the device ([`Runtime::open`], so
//! the job can check its memory need before anything of it is allocated) and the communicators,
//! runs the job's one per-worker function on every worker, and brings the results to the
//! reporter (rank 0).
//!
//! It knows nothing of what a job computes: `harness`, `train` and `train::step_timing` write
//! their work as a [`Job`] generic over the device and the communicator, and every command runs
//! the same code on every topology.

mod device;
mod job;
mod ranks;
mod threads;

pub use device::{ModelDevice, NoFastPath};
pub use job::{Gather, Job, Waits};
pub use threads::{collect_results, run_workers};

use crate::backend::cuda::{CudaBackend, HEAD_DIMS, InputDtype};
use crate::comm::rendezvous::LaunchEnv;
use crate::comm::{LocalComm, Solo};
use crate::model::cpu::Cpu;
use crate::model::cuda::CudaOps;

use anyhow::{Result, bail};
use job::Collect;
use serde::Serialize;
use std::time::Duration;

/// The device a job computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// This machine's cores, in f32 (worker threads, or one process per worker under a launcher).
    Cpu,
    /// NVIDIA GPUs: 16-bit inputs (`--dtype`), f32 accumulation; one GPU per process, or
    /// virtual workers sharing GPU 0.
    Cuda,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

/// How the workers of a job are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Worker threads of this process sharing the device, over in-process channels (one
    /// worker: no communication at all). On a GPU, several are *virtual* workers: the
    /// multi-GPU algorithm checked exactly on one device, not fast.
    Threads(usize),
    /// This process is one rank of a multi-process job, one worker per rank: TCP between CPU
    /// ranks; NCCL between GPU ranks (GPU LOCAL_RANK each), with a TCP mesh beside it for
    /// failures and gathered results.
    Ranks(LaunchEnv),
}

/// Where and how a job runs: everything a command decides about devices and workers.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub device: Device,
    /// The 16-bit format of a GPU's inputs and activations (the CPU computes in f32).
    pub dtype: InputDtype,
    pub topology: Topology,
    pub waits: Waits,
    /// A hash of the command line: ranks of one job must have been started alike.
    pub args_hash: u64,
}

/// What a command asked for, before [`Runtime::resolve`] decides.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub device: Device,
    /// `--dtype`: only meaningful on a GPU.
    pub dtype: Option<InputDtype>,
    /// `--workers`, if given.
    pub workers: Option<usize>,
    /// The command's default worker count without a launcher, by device.
    pub default_workers: fn(Device) -> usize,
    pub waits: Waits,
    pub args_hash: u64,
}

impl Runtime {
    /// The one worker-count rule: under a launcher (RANK/WORLD_SIZE set) every process is one
    /// worker and `--workers`, if given, must equal WORLD_SIZE; otherwise `--workers` threads
    /// (virtual workers on a GPU), or the command's default.
    pub fn resolve(r: Request) -> Result<Runtime> {
        Self::resolve_with(r, LaunchEnv::from_env()?)
    }

    /// [`Runtime::resolve`] with the launch variables given (tests).
    pub fn resolve_with(r: Request, launch: Option<LaunchEnv>) -> Result<Runtime> {
        let dtype = match (r.device, r.dtype) {
            (Device::Cpu, Some(d)) => bail!(
                "--dtype {} applies to --device cuda; the CPU computes in f32: drop --dtype or add --device cuda",
                d.name()
            ),
            (_, d) => d.unwrap_or(InputDtype::Bf16),
        };
        let topology = match (r.workers, launch) {
            (Some(0), _) => bail!("--workers must be at least 1"),
            (Some(w), Some(env)) if w != env.world => bail!(
                "--workers {w} does not match WORLD_SIZE={}: under a launcher every process is one worker; drop --workers or start {w} processes",
                env.world
            ),
            (_, Some(env)) => Topology::Ranks(env),
            (Some(w), None) => Topology::Threads(w),
            (None, None) => Topology::Threads((r.default_workers)(r.device)),
        };
        Ok(Runtime {
            device: r.device,
            dtype,
            topology,
            waits: r.waits,
            args_hash: r.args_hash,
        })
    }

    /// `workers` threads on this machine's cores (tests and library callers).
    pub fn cpu_threads(workers: usize, message_timeout: Duration) -> Runtime {
        Runtime {
            device: Device::Cpu,
            dtype: InputDtype::Bf16,
            topology: Topology::Threads(workers),
            waits: Waits {
                rendezvous: message_timeout,
                message: message_timeout,
            },
            args_hash: 0,
        }
    }

    /// Workers the sequence is split across.
    pub fn workers(&self) -> usize {
        match &self.topology {
            Topology::Threads(n) => *n,
            Topology::Ranks(env) => env.world,
        }
    }

    /// Whether this process reports and writes files: rank 0 of a launched job, or the only
    /// process.
    pub fn is_reporter(&self) -> bool {
        match &self.topology {
            Topology::Threads(_) => true,
            Topology::Ranks(env) => env.rank == 0,
        }
    }

    /// The GPU this process drives: LOCAL_RANK under a launcher, else GPU 0.
    pub fn gpu(&self) -> usize {
        match &self.topology {
            Topology::Threads(_) => 0,
            Topology::Ranks(env) => env.local_rank,
        }
    }

    /// Workers holding their own copy of everything on this process's device: virtual workers
    /// share one GPU; a rank has its device to itself.
    pub fn workers_per_device(&self) -> usize {
        match &self.topology {
            Topology::Threads(n) => *n,
            Topology::Ranks(_) => 1,
        }
    }

    /// The precision of the computation, as reports name it.
    pub fn precision(&self) -> &'static str {
        match self.device {
            Device::Cpu => "f32",
            Device::Cuda => self.dtype.name(),
        }
    }

    /// Opens this process's device (on a GPU: the context, and its free memory for the job's
    /// memory check), before anything of a job is allocated.
    pub fn open(&self) -> Result<Opened<'_>> {
        let gpu = match self.device {
            Device::Cpu => None,
            Device::Cuda => {
                let backend = CudaBackend::new(self.gpu(), self.dtype)?;
                let facts = OpenedGpu {
                    ordinal: self.gpu(),
                    free_bytes: backend.memory()?.free,
                    head_dims: &HEAD_DIMS,
                };
                Some((backend, facts))
            }
        };
        Ok(Opened { runtime: self, gpu })
    }

    /// Runs `job` on `workers` threads sharing `device` (one: on this thread, alone).
    fn on_threads<D: ModelDevice, J: Job>(
        &self,
        device: &D,
        workers: usize,
        job: &J,
        collect: Collect<J::Output>,
    ) -> Result<Option<Vec<J::Output>>> {
        if workers == 1 {
            return Ok(Some(vec![job.run(device, &mut Solo)?]));
        }
        let results = run_workers(
            workers,
            self.waits.message,
            |_, comm: &mut LocalComm<D::Tensor>| job.run(device, comm),
        );
        let mut all = collect_results(results)?;
        if matches!(collect, Collect::Reporter) {
            all.truncate(1);
        }
        Ok(Some(all))
    }
}

/// A runtime whose device is open: the job's memory can be checked against it, then the job
/// runs.
pub struct Opened<'a> {
    runtime: &'a Runtime,
    gpu: Option<(CudaBackend, OpenedGpu)>,
}

impl Opened<'_> {
    /// The opened GPU's facts (`None` on the CPU).
    pub fn gpu(&self) -> Option<&OpenedGpu> {
        self.gpu.as_ref().map(|(_, facts)| facts)
    }

    /// Runs `job` on every worker and returns every worker's output, in rank order, on the
    /// reporter (`None` on the other ranks of a launched job, whose outputs travel to rank 0).
    pub fn run_all<J: Job>(self, job: &J) -> Result<Option<Vec<J::Output>>>
    where
        J::Output: Gather,
    {
        let all = Collect::All {
            to_parts: J::Output::to_parts,
            from_parts: J::Output::from_parts,
        };
        self.dispatch(job, all)
    }

    /// Runs `job` on every worker and returns the reporter's output (`None` on other ranks): for
    /// jobs whose workers end alike (training) or report for themselves (benchmarks).
    pub fn run_reporter<J: Job>(self, job: &J) -> Result<Option<J::Output>> {
        let out = self.dispatch(job, Collect::Reporter)?;
        Ok(out.and_then(|all| all.into_iter().next()))
    }

    /// Runs `job` on the opened device as the topology says.
    fn dispatch<J: Job>(
        self,
        job: &J,
        collect: Collect<J::Output>,
    ) -> Result<Option<Vec<J::Output>>> {
        let rt = self.runtime;
        match (self.gpu, &rt.topology) {
            (None, Topology::Threads(n)) => rt.on_threads(&Cpu::<f32>::new(), *n, job, collect),
            (None, Topology::Ranks(env)) => {
                ranks::on_cpu_rank((rt.args_hash, rt.waits), env, job, collect)
            }
            (Some((backend, _)), Topology::Threads(n)) => {
                rt.on_threads(&CudaOps::new(backend)?, *n, job, collect)
            }
            (Some((backend, _)), Topology::Ranks(env)) => {
                ranks::on_gpu_rank((rt.args_hash, rt.waits), env, backend, job, collect)
            }
        }
    }
}

/// What a job may ask of the GPU it is about to run on, before it allocates anything.
#[derive(Clone, Debug)]
pub struct OpenedGpu {
    pub ordinal: usize,
    pub free_bytes: usize,
    /// Head dims the attention kernels take.
    pub head_dims: &'static [usize],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(device: Device, dtype: Option<InputDtype>, workers: Option<usize>) -> Request {
        Request {
            device,
            dtype,
            workers,
            default_workers: |d| match d {
                Device::Cpu => 4,
                Device::Cuda => 1,
            },
            waits: Waits {
                rendezvous: Duration::from_secs(1),
                message: Duration::from_secs(1),
            },
            args_hash: 0,
        }
    }

    fn env(rank: usize, world: usize) -> LaunchEnv {
        LaunchEnv {
            rank,
            world,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
        }
    }

    #[test]
    fn one_rule_decides_the_workers() {
        let r = |d, w, l| Runtime::resolve_with(request(d, None, w), l);
        assert_eq!(r(Device::Cpu, None, None).unwrap().workers(), 4);
        assert_eq!(r(Device::Cuda, None, None).unwrap().workers(), 1);
        assert_eq!(
            r(Device::Cpu, Some(3), None).unwrap().topology,
            Topology::Threads(3)
        );
        let launched = r(Device::Cuda, None, Some(env(1, 2))).unwrap();
        assert_eq!(launched.topology, Topology::Ranks(env(1, 2)));
        assert_eq!((launched.workers(), launched.gpu()), (2, 1));
        assert!(!launched.is_reporter());
        assert_eq!(launched.workers_per_device(), 1);
        assert!(r(Device::Cpu, Some(2), Some(env(0, 2))).is_ok());
        let err = r(Device::Cpu, Some(3), Some(env(0, 2)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match WORLD_SIZE=2"), "{err}");
        let err = r(Device::Cpu, Some(0), None).unwrap_err().to_string();
        assert!(err.contains("at least 1"), "{err}");
    }

    #[test]
    fn dtype_belongs_to_the_gpu() {
        let fp16 = Some(InputDtype::F16);
        let err = Runtime::resolve_with(request(Device::Cpu, fp16, None), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--dtype fp16 applies to --device cuda"),
            "{err}"
        );
        let gpu = Runtime::resolve_with(request(Device::Cuda, fp16, None), None).unwrap();
        assert_eq!(gpu.precision(), "fp16");
        let cpu = Runtime::resolve_with(request(Device::Cpu, None, None), None).unwrap();
        assert_eq!(cpu.precision(), "f32");
    }
}
