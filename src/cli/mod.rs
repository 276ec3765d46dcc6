//! Argument definitions and dispatch.

mod attention;
mod bench;
mod bench_train;
mod grads;
mod launch;
mod plan;
mod simulate;
mod train;
mod values;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use distflash::backend::cuda::InputDtype;
use distflash::model::Offload;
use distflash::plan::Schedule;
use distflash::resources;
use distflash::runtime::{Device, Request, Runtime, Topology, Waits};
use distflash::train::shard::Shard;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

/// Exact distributed FlashAttention (DistFlashAttn) for long-context training.
#[derive(Parser)]
#[command(name = "distflash", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the schedule: which block each worker computes at each step and what moves where.
    Plan(plan::Args),
    /// Run distributed causal attention forward and backward on random inputs.
    Attention(attention::Args),
    /// Start one process per worker on this node (sets RANK, WORLD_SIZE, LOCAL_RANK,
    /// MASTER_ADDR, MASTER_PORT like torchrun), e.g. `distflash launch --nproc-per-node 4 --
    /// attention --check`.
    Launch(launch::Args),
    /// Predict distributed attention time on P devices from device and link rates.
    Simulate(simulate::Args),
    /// Measure this machine's rates.
    #[command(subcommand)]
    Bench(bench::Target),
    /// Train a LLaMA-family model whose attention is distflash (default: the tiny preset on the
    /// synthetic long-range recall task, 4 CPU workers).
    Train(train::Args),
    /// Loss and every parameter gradient of one token sequence, as safetensors (for parity
    /// checks against other implementations).
    Grads(grads::Args),
}

/// The command line's definition, with every subcommand taking negative numbers as values: `--lr
/// -1` then reaches the flag's parser (`values`), which names the valid range, instead of
/// clap taking `-1` for an unknown flag.
fn command() -> clap::Command {
    fn negatives(c: clap::Command) -> clap::Command {
        c.allow_negative_numbers(true).mut_subcommands(negatives)
    }
    negatives(Cli::command())
}

/// Parses a command line (`args` starting with the program's name) under [`command`].
pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

/// Parses this process's command line, printing clap's message and exiting on an error.
pub fn parse() -> Cli {
    try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Plan(args) => plan::run(args),
        Command::Attention(args) => attention::run(args),
        Command::Launch(args) => launch::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(target) => bench::run(target),
        Command::Train(args) => train::run(args),
        Command::Grads(args) => grads::run(args),
    }
}

/// Opens `path` for writing before any work starts, so an unwritable path costs nothing.
fn create_output(path: &Path) -> Result<File> {
    File::create(path).map_err(|e| cannot_write(path, e))
}

/// Refuses, before any work starts, an output file the command could not write at its end;
/// what `path` holds now is left as it is until then.
fn ensure_writable(path: &Path) -> Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| cannot_write(path, e))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Creates the output directory `dir` and proves a file can be written in it, before any work
/// starts.
fn ensure_writable_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| cannot_write(dir, e))?;
    ensure_writable(&dir.join(format!(".distflash-probe-{}", std::process::id())))
}

/// The one sentence for an output that cannot be written: the path, the system's reason, the fix.
fn cannot_write(path: &Path, e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot write {}: {e}; choose a writable path",
        path.display()
    )
}

/// [`resources::ensure_split`] for a job on `rt`: thread workers each hold their own plans.
fn ensure_split(seq: usize, schedule: Schedule, rt: &Runtime) -> Result<()> {
    let threads = matches!(rt.topology, Topology::Threads(_));
    resources::ensure_split(seq, rt.workers(), schedule, threads)
}

/// The fastest `rt`'s devices could compute together: this machine's cores, or its GPUs (a
/// launched job's add up; threads share one).
fn peak_flops(rt: &Runtime) -> f64 {
    match (rt.device, &rt.topology) {
        (Device::Cpu, _) => resources::cpu_peak_flops(),
        (Device::Cuda, Topology::Ranks(env)) => resources::gpu_peak_flops() * env.world as f64,
        (Device::Cuda, Topology::Threads(_)) => resources::gpu_peak_flops(),
    }
}

/// Warns (one line on stderr; the run goes on) of settings that are valid but change nothing
/// useful here: offloaded activations on the CPU, whose activations are in host memory already
/// (the offload only adds copies), and sharding with a single worker, who holds every piece.
fn warn_ineffective(device: Device, offload: Offload, shard: Option<Shard>, workers: usize) {
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
