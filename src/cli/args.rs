//! The argument groups several commands flatten in: where a job runs (`--device`, `--dtype`)
//! and how long its workers wait.

use super::values;
use anyhow::Result;
use distflash::backend::cuda::InputDtype;
use distflash::runtime::{Device, Request, Runtime, Waits};
use std::time::Duration;

/// A hash of this process's arguments: ranks of one job must have been started alike.
fn args_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::env::args().skip(1).collect::<Vec<_>>().hash(&mut h);
    h.finish()
}

/// The `--timeout` and `--rendezvous-timeout` flags of every command that can run as several
/// workers (threads or processes), declared once.
#[derive(clap::Args, Debug, Clone)]
pub struct WaitArgs {
    /// Seconds a worker (thread or rank) waits for a message before declaring its sender stuck.
    #[arg(long, default_value_t = 600, value_parser = values::count::<u64>)]
    timeout: u64,
    /// Seconds ranks of a multi-process job (`distflash launch`, torchrun) wait for each other
    /// at start-up.
    #[arg(long, default_value_t = 60, value_parser = values::count::<u64>)]
    rendezvous_timeout: u64,
}

impl WaitArgs {
    pub fn waits(&self) -> Waits {
        Waits {
            rendezvous: Duration::from_secs(self.rendezvous_timeout),
            message: Duration::from_secs(self.timeout),
        }
    }
}

/// `--dtype`, declared once.
#[derive(clap::Args, Debug, Clone)]
pub struct DtypeArg {
    /// 16-bit format of inputs, weights and activations on a GPU: bf16 or fp16 [default: bf16].
    /// The CPU computes in f32.
    #[arg(long)]
    dtype: Option<InputDtype>,
}

impl DtypeArg {
    /// The GPU's format: the one asked for, or bf16.
    pub fn gpu(&self) -> InputDtype {
        self.dtype.unwrap_or(InputDtype::Bf16)
    }
}

/// Where a job runs: `--device`, `--dtype` and the waits, the flags every command that runs
/// workers shares. `--workers` stays with each command, whose default differs.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// cpu: this machine's cores (f32); cuda: NVIDIA GPUs (16-bit, --dtype; GPU LOCAL_RANK of
    /// each process under a launcher, else virtual workers sharing GPU 0).
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    #[command(flatten)]
    dtype: DtypeArg,
    #[command(flatten)]
    waits: WaitArgs,
}

impl DeviceArgs {
    /// The 16-bit format a GPU would compute in (`--dtype`, bf16 unless asked).
    pub fn gpu_dtype(&self) -> InputDtype {
        self.dtype.gpu()
    }

    /// The runtime of this command: `workers` as asked, the command's `default_workers` when
    /// not (both under the one rule of [`Runtime::resolve`]).
    pub fn runtime(
        &self,
        workers: Option<usize>,
        default_workers: fn(Device) -> usize,
    ) -> Result<Runtime> {
        Runtime::resolve(Request {
            device: self.device,
            dtype: self.dtype.dtype,
            workers,
            default_workers,
            waits: self.waits.waits(),
            args_hash: args_hash(),
        })
    }
}
