//! Predicts what a sequence-parallel run over P devices takes before it runs, from its
//! partition (`plan::Partition`, the spans and plans `exec` runs): the time of distributed
//! attention from a few machine figures. (A rank's memory is counted from the code:
//! `train::memory::estimate::rank_estimate`.)
//!
//! Time is predicted by replaying the plans: each device has one compute stream and a link with
//! an outgoing and an incoming direction; a transfer occupies both ends' links for
//! latency + bytes / bandwidth; a block computes for flops / rate once its operand has arrived.
//!
//! With overlap, the fetches of step t are issued when step t − 1 starts computing (prefetch);
//! without it, a device communicates only between its computations. Returned partials are
//! sent when the helper's block ends and must arrive before the receiver finishes.
//! It is a model: kernels are assumed to run at one rate whatever the block size, and links do
//! not contend beyond the two ends of a transfer. Use it to reason about 8–64 devices before a
//! run and check it against runs on the devices we have.

use crate::plan::{Partition, Pass, Schedule, volume};
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};
use serde::Serialize;

/// Rates of one device and its link.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Machine {
    /// Attention forward rate (FLOP/s, counted as 4 per visible query-key pair and head dim).
    pub forward_flops: f64,
    /// Attention backward rate, FLOPs counted as 2.5× the forward's.
    pub backward_flops: f64,
    /// Bytes per second of one device's link in each direction.
    pub link_bandwidth: f64,
    /// Seconds every transfer costs on top of its bytes.
    pub link_latency: f64,
    /// Bytes per input value on the wire (2 for bf16).
    pub input_bytes: usize,
    /// Prefetch next step's inputs while the current step computes.
    pub overlap: bool,
}

/// The problem being predicted.
#[derive(Clone, Debug)]
pub struct Workload {
    pub dims: Dims,
    pub seq: usize,
    pub workers: usize,
    pub schedule: Schedule,
    /// Attention's mask: the plans replayed leave out the blocks it hides, and each block
    /// computes for its visible pairs.
    pub mask: Mask,
}

/// Predicted times of one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    pub workers: usize,
    pub forward_secs: f64,
    pub backward_secs: f64,
    /// The same plans with free communication: what compute alone takes.
    pub compute_only_secs: f64,
    /// Share of forward+backward time spent waiting for communication.
    pub exposed_comm_fraction: f64,
    /// Forward+backward on one device over this prediction.
    pub speedup_over_one: f64,
}

/// Link bookkeeping: when each device's outgoing and incoming directions are next free.
struct Links {
    out_free: Vec<f64>,
    in_free: Vec<f64>,
    bandwidth: f64,
    latency: f64,
}

impl Links {
    /// Moves `bytes` from `from` to `to`, starting no earlier than `ready`; returns the arrival.
    fn transfer(&mut self, from: usize, to: usize, bytes: usize, ready: f64) -> f64 {
        let start = ready.max(self.out_free[from]).max(self.in_free[to]);
        let end = start + self.latency + bytes as f64 / self.bandwidth;
        self.out_free[from] = end;
        self.in_free[to] = end;
        end
    }
}

/// Time of one pass over `part` of a problem of shape `dims`.
fn pass_secs(dims: &Dims, m: &Machine, part: &Partition, pass: Pass) -> f64 {
    let (rate, flops_scale) = match pass {
        Pass::Forward => (m.forward_flops, 1.0),
        Pass::Backward => (m.backward_flops, 2.5),
    };
    let spans = part.spans();
    let p = part.workers();
    let mut links = Links {
        out_free: vec![0.0; p],
        in_free: vec![0.0; p],
        bandwidth: m.link_bandwidth,
        latency: m.link_latency,
    };
    let mut started = vec![0.0f64; p]; // start of each device's current step
    let mut free = vec![0.0f64; p]; // end of each device's last compute (or blocking send)
    let mut finish = vec![0.0f64; p]; // last event each device must wait for
    for step in &part.plan(pass).steps {
        let mut arrival = vec![0.0f64; p];
        for f in &step.fetches {
            let ready = if m.overlap { started[f.to] } else { free[f.to] };
            let bytes = volume::bytes(f.payload, dims, spans[f.chunk].len, m.input_bytes);
            let arrived = links.transfer(f.from, f.to, bytes, ready);
            arrival[f.to] = arrival[f.to].max(arrived);
        }
        let mut work = vec![0.0f64; p]; // seconds of compute each device has this step
        for task in &step.tasks {
            let pairs = part.visible_pairs(task.q_chunk, task.kv_chunk);
            let per_pair = 4.0 * (dims.batch * dims.heads * dims.head_dim) as f64;
            work[task.worker] += flops_scale * per_pair * pairs as f64 / rate;
        }
        for dev in (0..p).filter(|&d| work[d] > 0.0) {
            started[dev] = free[dev].max(arrival[dev]);
            free[dev] = started[dev] + work[dev];
            finish[dev] = finish[dev].max(free[dev]);
        }
        for r in &step.returns {
            let bytes = volume::bytes(r.payload, dims, spans[r.chunk].len, m.input_bytes);
            let arrived = links.transfer(r.from, r.to, bytes, free[r.from]);
            finish[r.to] = finish[r.to].max(arrived);
            if !m.overlap {
                free[r.from] = arrived; // a blocking send holds the sender
            }
        }
    }
    finish.into_iter().fold(0.0, f64::max)
}

/// Predicts forward and backward time of `w` on `m`.
pub fn predict(w: &Workload, m: &Machine) -> Result<Prediction> {
    w.dims.validate()?;
    if m.forward_flops <= 0.0 || m.backward_flops <= 0.0 || m.link_bandwidth <= 0.0 {
        bail!("rates and bandwidth must be positive");
    }
    let part = Partition::masked(w.seq, w.workers, w.schedule, &w.mask)?;
    let both = |m: &Machine, part: &Partition| {
        (
            pass_secs(&w.dims, m, part, Pass::Forward),
            pass_secs(&w.dims, m, part, Pass::Backward),
        )
    };
    let (forward_secs, backward_secs) = both(m, &part);
    let free_links = Machine {
        link_bandwidth: f64::INFINITY,
        link_latency: 0.0,
        ..*m
    };
    let (forward_free, backward_free) = both(&free_links, &part);
    let compute_only_secs = forward_free + backward_free;
    let total = forward_secs + backward_secs;
    let alone = Partition::masked(w.seq, 1, w.schedule, &w.mask)?;
    let (forward_one, backward_one) = both(m, &alone);
    let one = forward_one + backward_one;
    Ok(Prediction {
        workers: w.workers,
        forward_secs,
        backward_secs,
        compute_only_secs,
        exposed_comm_fraction: ((total - compute_only_secs) / total).max(0.0),
        speedup_over_one: one / total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(bandwidth: f64, overlap: bool) -> Machine {
        Machine {
            forward_flops: 1e12,
            backward_flops: 1e12,
            link_bandwidth: bandwidth,
            link_latency: 0.0,
            input_bytes: 2,
            overlap,
        }
    }

    fn workload(workers: usize, schedule: Schedule) -> Workload {
        Workload {
            dims: Dims {
                batch: 1,
                heads: 8,
                kv_heads: 8,
                head_dim: 64,
            },
            seq: 8192,
            workers,
            schedule,
            mask: Mask::causal(),
        }
    }

    #[test]
    fn free_links_reproduce_the_cost_model() {
        for (schedule, ideal) in [
            (Schedule::Balanced, 32.0 / 4.5),
            (Schedule::Unbalanced, 32.0 / 7.5),
        ] {
            let p = predict(&workload(8, schedule), &machine(f64::INFINITY, true)).unwrap();
            // The model counts the diagonal as exactly half; real diagonals have n(n+1)/2 pairs.
            assert!(
                (p.speedup_over_one - ideal).abs() / ideal < 2e-3,
                "{schedule}: {}",
                p.speedup_over_one
            );
            assert!(p.exposed_comm_fraction < 1e-12);
        }
    }

    #[test]
    fn one_worker_is_the_single_device() {
        let p = predict(&workload(1, Schedule::Balanced), &machine(1e9, false)).unwrap();
        assert!((p.speedup_over_one - 1.0).abs() < 1e-12);
    }

    #[test]
    fn overlap_hides_communication_that_serialising_exposes() {
        let w = workload(4, Schedule::Balanced);
        let fast = predict(&w, &machine(300e9, true)).unwrap();
        let serial = predict(&w, &machine(300e9, false)).unwrap();
        assert!(
            serial.forward_secs + serial.backward_secs > fast.forward_secs + fast.backward_secs
        );
        assert!(fast.exposed_comm_fraction < serial.exposed_comm_fraction);
        // A slow link is exposed even with overlap.
        let slow = predict(&w, &machine(1e8, true)).unwrap();
        assert!(
            slow.exposed_comm_fraction > 0.5,
            "{}",
            slow.exposed_comm_fraction
        );
    }
}
