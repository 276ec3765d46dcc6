//! A worker that fails mid-plan makes every other worker return an error naming it, quickly,
//! instead of waiting forever.

use anyhow::{Result, bail};
use distflash::backend::cpu::CpuBackend;
use distflash::block_math::layout;
use distflash::comm::{Communicator, LocalComm, PeerFailed, Tag};
use distflash::exec::{OwnChunk, Worker};
use distflash::inputs::Inputs;
use distflash::plan::{Partition, Pass, Schedule};
use distflash::runtime::{collect_results, run_workers};
use distflash::shape::Dims;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
enum Fault {
    Error,
    Panic,
    /// Deliver tensors one element short: a peer that disagrees about shapes.
    Truncate,
}

/// Passes everything through, except that send number `fail_at` goes wrong.
struct Faulty<'a> {
    inner: &'a mut LocalComm,
    sends: usize,
    fail_at: usize,
    fault: Fault,
}

impl Communicator<Vec<f32>> for Faulty<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn send(&mut self, to: usize, tag: Tag, parts: &[&Vec<f32>]) -> Result<()> {
        self.sends += 1;
        if self.sends == self.fail_at {
            match self.fault {
                Fault::Panic => panic!("injected panic"),
                Fault::Error => bail!("injected failure"),
                Fault::Truncate => {
                    let short: Vec<Vec<f32>> = parts.iter().map(|p| p[1..].to_vec()).collect();
                    let refs: Vec<&Vec<f32>> = short.iter().collect();
                    return self.inner.send(to, tag, &refs);
                }
            }
        }
        self.inner.send(to, tag, parts)
    }
    fn recv(&mut self, from: usize, tag: Tag) -> Result<Vec<Vec<f32>>> {
        self.inner.recv(from, tag)
    }
    fn all_reduce_sum(&mut self, buf: &mut Vec<f32>) -> Result<()> {
        self.inner.all_reduce_sum(buf)
    }
    fn barrier(&mut self) -> Result<()> {
        self.inner.barrier()
    }
    fn abort(&mut self, reason: &str) {
        self.inner.abort(reason)
    }
    fn bytes_sent(&self) -> u64 {
        self.inner.bytes_sent()
    }
}

fn run_with_fault(culprit: usize, fault: Fault) -> Vec<Result<()>> {
    let (workers, seq) = (6, 60);
    let dims = Dims {
        batch: 1,
        heads: 2,
        kv_heads: 2,
        head_dim: 8,
    };
    let x = Inputs::random(dims, seq, 1);
    let partition = Partition::new(seq, workers, Schedule::Balanced).unwrap();
    let (spans, plan) = (partition.spans(), partition.plan(Pass::Forward));
    // A long timeout: the test passes only if failure propagation, not the timeout, ends waits.
    run_workers(workers, Duration::from_secs(120), |rank, comm| {
        let take = |t: &[f32]| layout::take_rows(t, 2, seq, 8, spans[rank]);
        let own = [OwnChunk {
            q: take(&x.q),
            k: take(&x.k),
            v: take(&x.v),
        }];
        let mut faulty = Faulty {
            inner: comm,
            sends: 0,
            fail_at: if rank == culprit { 2 } else { 0 },
            fault,
        };
        let mut worker = Worker {
            backend: &CpuBackend,
            comm: &mut faulty,
            dims,
            spans,
            compute: Duration::ZERO,
            overlap: true,
        };
        worker.forward(plan, &own[..]).map(|_| ())
    })
}

fn assert_everyone_names(culprit: usize, results: &[Result<()>], cause: &str) {
    for (rank, r) in results.iter().enumerate() {
        let err = r.as_ref().expect_err("every worker must fail");
        if rank == culprit {
            assert!(
                format!("{err:#}").contains(cause),
                "culprit's own error: {err:#}"
            );
        } else {
            let peer = err.chain().find_map(|c| c.downcast_ref::<PeerFailed>());
            let peer = peer.unwrap_or_else(|| {
                panic!("worker {rank}: {err:#} does not name the failed worker")
            });
            assert_eq!(peer.rank, culprit);
            assert!(
                format!("{err:#}").contains(&format!("worker {culprit} failed")),
                "{err:#}"
            );
        }
    }
}

#[test]
fn an_error_mid_plan_stops_every_worker_with_its_name() {
    let start = Instant::now();
    let results = run_with_fault(3, Fault::Error);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "workers waited instead of stopping"
    );
    assert_everyone_names(3, &results, "injected failure");
    let err = collect_results(results).unwrap_err();
    assert!(
        format!("{err:#}").starts_with("worker 3 failed: injected failure"),
        "{err:#}"
    );
}

#[test]
fn a_panic_mid_plan_stops_every_worker_with_its_name() {
    let results = run_with_fault(1, Fault::Panic);
    assert_everyone_names(1, &results, "injected panic");
}

#[test]
fn tensors_of_the_wrong_size_are_refused_by_the_receiver() {
    let results = run_with_fault(2, Fault::Truncate);
    let err = collect_results(results).unwrap_err();
    assert!(
        format!("{err:#}").contains("expected tensors of"),
        "{err:#}"
    );
}

#[test]
fn a_peer_that_never_sends_ends_in_a_timeout_error() {
    let results = run_workers(
        2,
        Duration::from_millis(200),
        |rank, comm: &mut LocalComm| {
            if rank == 1 {
                // Worker 1 "hangs": it neither sends nor fails until worker 0 has given up.
                std::thread::sleep(Duration::from_millis(600));
                return Ok(());
            }
            comm.recv(1, Tag(7)).map(|_| ())
        },
    );
    let err = results[0].as_ref().unwrap_err();
    assert!(format!("{err:#}").contains("never arrived"), "{err:#}");
}
