//! The static schedule of distributed causal attention: at each step, which block
//! (query chunk, key/value chunk) every worker computes, and which tensors move between whom.
//!
//! Worker `r` owns chunk `r` (its rows of Q, K, V). Block (i, j) is needed for j ≤ i. Two
//! schedules are offered (DESIGN.md, "The schedules"):
//! - `unbalanced`: at step t, worker r computes (r, r − t) if r ≥ t, fetching K/V from worker
//!   r − t. Worker P−1 works P steps, worker 0 one.
//! - `balanced` (DistFlashAttn): owners still compute offset t at step t, but a worker r < t,
//!   idle above, helps the worker P − t + r with the far block (P − t + r, r), using its own K/V
//!   and the fetched query chunk, and returns the partial (O, LSE) to be merged. Offsets t and
//!   P − t are covered together, so ⌊P/2⌋ + 1 steps suffice.
//!
//! The backward pass follows the same tasks; only what travels changes (see `Payload`).

mod render;
pub mod volume;

use anyhow::{Result, bail};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

pub use render::{to_json, to_svg, to_text};

/// Which schedule assigns blocks to workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Unbalanced,
    Balanced,
}

impl FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "unbalanced" => Ok(Schedule::Unbalanced),
            "balanced" => Ok(Schedule::Balanced),
            other => Err(format!(
                "unknown schedule '{other}': use 'balanced' or 'unbalanced'"
            )),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schedule::Unbalanced => "unbalanced",
            Schedule::Balanced => "balanced",
        })
    }
}

/// Forward or backward: same tasks, different tensors on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    Backward,
}

/// One block computed by one worker at one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Task {
    pub worker: usize,
    pub q_chunk: usize,
    pub kv_chunk: usize,
}

/// How a task relates to the worker computing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// (r, r): everything is local; the causal mask applies.
    Diagonal,
    /// (r, j), j < r: the worker's own queries against fetched K/V.
    Owner,
    /// (i, r), i > r: the worker's own K/V against fetched queries; results go back to i.
    Helper,
}

impl Task {
    pub fn role(&self) -> Role {
        if self.q_chunk == self.kv_chunk {
            Role::Diagonal
        } else if self.q_chunk == self.worker {
            Role::Owner
        } else {
            Role::Helper
        }
    }

    /// Cost in the model where an off-diagonal block costs 1 and a diagonal one, half masked, ½.
    pub fn cost(&self) -> f64 {
        if self.role() == Role::Diagonal {
            0.5
        } else {
            1.0
        }
    }
}

/// What a transfer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// K and V of a chunk (in their GQA-compressed form), fetched by an owner.
    KeyValue,
    /// Q of a chunk, fetched by a forward helper.
    Query,
    /// A helper's partial (O, LSE) for a query chunk, returned to be merged.
    PartialOut,
    /// Q, dO, LSE and D of a chunk, fetched by a backward helper.
    QueryGradInputs,
    /// dK and dV for a key/value chunk, returned by an owner to the chunk's worker.
    KvGrad,
    /// dQ for a query chunk, returned by a backward helper.
    QueryGrad,
}

impl Payload {
    /// Stable small number used to tag messages.
    pub fn index(self) -> u64 {
        self as u64
    }
}

/// Data moving from one worker to another. `chunk` names whose rows the tensors are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    pub from: usize,
    pub to: usize,
    pub chunk: usize,
    pub payload: Payload,
}

/// One step: tasks computed in parallel, the inputs fetched for them (issued one step early, so
/// they arrive while the previous step computes) and the results returned after them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    pub tasks: Vec<Task>,
    pub fetches: Vec<Transfer>,
    pub returns: Vec<Transfer>,
}

impl Step {
    /// The task `worker` computes at this step, if any.
    pub fn task_of(&self, worker: usize) -> Option<Task> {
        self.tasks.iter().copied().find(|t| t.worker == worker)
    }

    /// Time of the step in the cost model: its slowest task.
    pub fn cost(&self) -> f64 {
        self.tasks.iter().map(Task::cost).fold(0.0, f64::max)
    }
}

/// A complete schedule for one pass.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub workers: usize,
    pub schedule: Schedule,
    pub pass: Pass,
    pub steps: Vec<Step>,
}

impl Plan {
    /// Builds the plan for `workers` chunks (one per worker).
    pub fn new(workers: usize, schedule: Schedule, pass: Pass) -> Result<Plan> {
        if workers == 0 {
            bail!("workers must be at least 1");
        }
        let steps = task_steps(workers, schedule)
            .into_iter()
            .map(|tasks| {
                let (fetches, returns) = tasks
                    .iter()
                    .map(|t| moves(t, pass))
                    .unzip::<_, _, Vec<_>, Vec<_>>();
                Step {
                    tasks,
                    fetches: fetches.into_iter().flatten().collect(),
                    returns: returns.into_iter().flatten().collect(),
                }
            })
            .collect();
        Ok(Plan {
            workers,
            schedule,
            pass,
            steps,
        })
    }

    /// Work of one worker computing every block alone, in the cost model: P diagonal halves
    /// plus P(P−1)/2 full blocks.
    pub fn total_work(&self) -> f64 {
        let p = self.workers as f64;
        0.5 * p + p * (p - 1.0) / 2.0
    }

    /// Time of the plan in the cost model (steps run in lock-step).
    pub fn makespan(&self) -> f64 {
        self.steps.iter().map(Step::cost).sum()
    }

    /// Speedup over one worker if communication were free and blocks cost what the model says.
    pub fn ideal_speedup(&self) -> f64 {
        self.total_work() / self.makespan()
    }

    /// Share of worker-time spent idle in the cost model.
    pub fn idle_fraction(&self) -> f64 {
        1.0 - self.total_work() / (self.workers as f64 * self.makespan())
    }

    /// Share of the makespan each worker spends computing.
    pub fn busy_fractions(&self) -> Vec<f64> {
        let mut busy = vec![0.0; self.workers];
        for task in self.steps.iter().flat_map(|s| &s.tasks) {
            busy[task.worker] += task.cost();
        }
        busy.iter().map(|b| b / self.makespan()).collect()
    }
}

/// The tasks of each step; the pass does not change them.
fn task_steps(p: usize, schedule: Schedule) -> Vec<Vec<Task>> {
    let task = |worker, q_chunk, kv_chunk| Task {
        worker,
        q_chunk,
        kv_chunk,
    };
    let diagonal = (0..p).map(|r| task(r, r, r)).collect();
    let later: Vec<Vec<Task>> = match schedule {
        Schedule::Unbalanced => (1..p)
            .map(|t| (t..p).map(|r| task(r, r, r - t)).collect())
            .collect(),
        Schedule::Balanced => (1..=p / 2)
            .map(|t| {
                let owners = (t..p).map(|r| task(r, r, r - t));
                // Helpers take offset P − t unless the owners already cover it (t = P/2).
                let helpers = (0..t).filter(|_| p - t > t).map(|r| task(r, p - t + r, r));
                helpers.chain(owners).collect()
            })
            .collect(),
    };
    std::iter::once(diagonal).chain(later).collect()
}

/// The transfer that brings a task's remote operand, and the one that returns its result.
fn moves(task: &Task, pass: Pass) -> (Option<Transfer>, Option<Transfer>) {
    let (w, i, j) = (task.worker, task.q_chunk, task.kv_chunk);
    let t = |from, to, chunk, payload| {
        Some(Transfer {
            from,
            to,
            chunk,
            payload,
        })
    };
    match (task.role(), pass) {
        (Role::Diagonal, _) => (None, None),
        (Role::Owner, Pass::Forward) => (t(j, w, j, Payload::KeyValue), None),
        (Role::Owner, Pass::Backward) => {
            (t(j, w, j, Payload::KeyValue), t(w, j, j, Payload::KvGrad))
        }
        (Role::Helper, Pass::Forward) => {
            (t(i, w, i, Payload::Query), t(w, i, i, Payload::PartialOut))
        }
        (Role::Helper, Pass::Backward) => (
            t(i, w, i, Payload::QueryGradInputs),
            t(w, i, i, Payload::QueryGrad),
        ),
    }
}

/// Splits `seq` tokens into `workers` chunks of consecutive rows whose sizes differ by at most
/// one (the first `seq % workers` chunks take the extra row).
pub fn chunk_sizes(seq: usize, workers: usize) -> Result<Vec<usize>> {
    if workers == 0 {
        bail!("workers must be at least 1");
    }
    if seq < workers {
        bail!(
            "sequence length {seq} is shorter than the worker count {workers}: every worker needs at least one token; use --workers {seq} or fewer"
        );
    }
    Ok((0..workers)
        .map(|r| seq / workers + usize::from(r < seq % workers))
        .collect())
}

#[cfg(test)]
mod tests;
