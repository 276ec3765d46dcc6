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
// What several commands share, each a leaf the commands name (never this root, which names
// them): argument groups, up-front checks, output paths.
mod args;
mod checks;
mod outputs;
mod step;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
        Command::Launch(args) => launch::run(args, check_launched),
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(target) => bench::run(target),
        Command::Train(args) => train::run(args),
        Command::Grads(args) => grads::run(args),
    }
}

/// Refuses a command `distflash launch` would start the ranks with if they could not parse it,
/// printing clap's message once here rather than once per rank (help and version are printed
/// once, too, and end the launch). Passed to the launcher, which cannot name this root.
fn check_launched(command: &[String]) {
    let argv = std::iter::once("distflash").chain(command.iter().map(String::as_str));
    if let Err(e) = try_parse_from(argv) {
        e.exit();
    }
}
