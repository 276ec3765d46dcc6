//! Workers as threads of this process over an in-process communicator. A failing worker (error
//! or panic) aborts the group, so the others return an error naming it instead of waiting.

use crate::comm::{Buffer, Communicator, LocalComm, PeerFailed, local_group};
use anyhow::{Result, anyhow};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

/// Runs `work(rank, endpoint)` on `world` threads. A worker that fails tells the others (through
/// `abort`), so every call returns: one result per worker, in rank order, all `Ok` or all `Err`.
pub fn run_workers<B: Buffer + Send, R: Send>(
    world: usize,
    timeout: Duration,
    work: impl Fn(usize, &mut LocalComm<B>) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    let endpoints = local_group::<B>(world, timeout);
    std::thread::scope(|scope| {
        let handles: Vec<_> = endpoints
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                let work = &work;
                scope.spawn(move || {
                    // The closing barrier makes a worker that finished its own part still
                    // learn of (and report) a failure elsewhere: the group either succeeds or fails.
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        let value = work(rank, &mut comm)?;
                        comm.barrier()?;
                        Ok(value)
                    }))
                    .unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(anyhow!("panicked: {what}"))
                    });
                    if let Err(e) = &outcome
                        && e.downcast_ref::<PeerFailed>().is_none()
                    {
                        comm.abort(&format!("{e:#}"));
                    }
                    outcome
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("worker thread could not be joined")))
            })
            .collect()
    })
}

/// All workers' values, or the root cause if any failed: the first error that is not merely a
/// report of another worker's failure, named by its worker.
pub fn collect_results<R>(results: Vec<Result<R>>) -> Result<Vec<R>> {
    if results.iter().all(Result::is_ok) {
        return Ok(results
            .into_iter()
            .map(|r| r.expect("checked ok"))
            .collect());
    }
    let mut errors: Vec<(usize, anyhow::Error)> = results
        .into_iter()
        .enumerate()
        .filter_map(|(rank, r)| r.err().map(|e| (rank, e)))
        .collect();
    let root = errors
        .iter()
        .position(|(_, e)| !e.chain().any(|c| c.is::<PeerFailed>()))
        .unwrap_or(0);
    let (rank, error) = errors.swap_remove(root);
    Err(error.context(format!("worker {rank} failed")))
}
