//! `distflash launch`: start one process per worker on this node with the variables torchrun
//! sets, watch them, and end the job as soon as one fails.

use super::values;
use anyhow::{Result, anyhow, bail};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Processes to start on this node (one per GPU or CPU worker).
    #[arg(long, value_parser = values::whole::<usize>)]
    nproc_per_node: usize,
    /// Rank 0's address, which every process connects to.
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    /// Rank 0's port; by default a free one is picked.
    #[arg(long, value_parser = values::whole::<u16>)]
    master_port: Option<u16>,
    /// Seconds the others get to stop by themselves after one process fails, before being killed.
    #[arg(long, default_value_t = 5, value_parser = values::whole::<u64>)]
    grace_secs: u64,
    /// The distflash command each process runs, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// A port nobody listens on now (the OS picks it); rank 0 binds it moments later. Binding also
/// proves `addr` is one of this node's, which rank 0 needs.
fn free_port(addr: &str) -> Result<u16> {
    let listener = TcpListener::bind((addr, 0)).map_err(|e| {
        anyhow!(
            "--master-addr {addr} cannot be listened on here ({e}): give an address of this node, such as 127.0.0.1"
        )
    })?;
    Ok(listener.local_addr()?.port())
}

/// Launches `args`'s ranks; `check_command` refuses (and exits on) a command they could not
/// parse, before any rank starts.
pub fn run(args: Args, check_command: fn(&[String])) -> Result<()> {
    if args.nproc_per_node == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    distflash::resources::ensure_processes(args.nproc_per_node)?;
    check_command(&args.command);
    let free = free_port(&args.master_addr)?;
    let port = args.master_port.unwrap_or(free);
    let exe = std::env::current_exe()?;
    let mut children: Vec<Option<Child>> = Vec::new();
    for rank in 0..args.nproc_per_node {
        let child = Command::new(&exe)
            .args(&args.command)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", args.nproc_per_node.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc_per_node.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match child {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                kill_all(&mut children);
                bail!("could not start rank {rank}: {e}");
            }
        }
    }
    watch(children, Duration::from_secs(args.grace_secs))
}

/// Waits for every child. The first failure starts the grace period; whoever is still running
/// after it is killed, and the launcher reports the first failed rank. Ranks that fail because
/// a peer did follow it within milliseconds, so among failures seen in the same poll the one
/// killed by a signal is the cause (its peers exit with an error about it).
fn watch(mut children: Vec<Option<Child>>, grace: Duration) -> Result<()> {
    let mut failed: Option<(usize, String)> = None;
    let mut deadline: Option<Instant> = None;
    while children.iter().any(Option::is_some) {
        let mut now_failed = Vec::new();
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Some(status) = child.try_wait()? {
                *slot = None;
                if !status.success() {
                    now_failed.push((rank, status));
                }
            }
        }
        if failed.is_none()
            && let Some((rank, status)) = now_failed
                .iter()
                .find(|(_, s)| s.signal().is_some())
                .or(now_failed.first())
        {
            failed = Some((*rank, status.to_string()));
            deadline = Some(Instant::now() + grace);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            kill_all(&mut children);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match failed {
        Some((rank, status)) => bail!("rank {rank} failed ({status}); the job was stopped"),
        None => Ok(()),
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for child in children.iter_mut().flatten() {
        // Already-exited children make kill fail; either way we reap it.
        let _ = child.kill();
        let _ = child.wait();
    }
    children.iter_mut().for_each(|c| *c = None);
}
