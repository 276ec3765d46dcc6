//! What a plan is made of: the schedule named, the passes, a worker's tasks and roles, the
//! payloads and transfers between workers, and a step of them all (a leaf: the plans and the
//! greedy schedule build on it).

use anyhow::Result;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// Which schedule assigns blocks to workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Unbalanced,
    Balanced,
    Zigzag,
    Greedy,
}

impl FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "unbalanced" => Ok(Schedule::Unbalanced),
            "balanced" => Ok(Schedule::Balanced),
            "zigzag" => Ok(Schedule::Zigzag),
            "greedy" => Ok(Schedule::Greedy),
            other => Err(format!(
                "unknown schedule '{other}': use 'balanced', 'unbalanced', 'zigzag' or 'greedy'"
            )),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schedule::Unbalanced => "unbalanced",
            Schedule::Balanced => "balanced",
            Schedule::Zigzag => "zigzag",
            Schedule::Greedy => "greedy",
        })
    }
}

impl Schedule {
    /// How many chunks the sequence is cut into for `workers` workers.
    pub fn chunks(self, workers: usize) -> usize {
        match self {
            Schedule::Unbalanced | Schedule::Balanced | Schedule::Greedy => workers,
            Schedule::Zigzag => 2 * workers,
        }
    }

    /// The chunks `worker` owns out of `workers`, in sequence order (one; a zigzag worker's
    /// head and tail).
    pub fn chunks_of(self, workers: usize, worker: usize) -> Vec<usize> {
        let owners = self.owners(workers);
        (0..owners.len()).filter(|&c| owners[c] == worker).collect()
    }

    /// The worker that owns each chunk.
    pub(super) fn owners(self, workers: usize) -> Vec<usize> {
        (0..self.chunks(workers))
            .map(|c| if c < workers { c } else { 2 * workers - 1 - c })
            .collect()
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

/// Where a task's operands live relative to the worker computing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Both chunks are the worker's own (the diagonal, or two chunks of one zigzag worker).
    Local,
    /// The worker's own queries against fetched K/V.
    Owner,
    /// The worker's own K/V against fetched queries; results go back to the queries' owner.
    Helper,
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
/// they arrive while the previous step computes) and the results returned after them. A chunk
/// moves at most once per step to a worker, however many of its tasks use it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    pub tasks: Vec<Task>,
    pub fetches: Vec<Transfer>,
    pub returns: Vec<Transfer>,
}

impl Step {
    /// The tasks `worker` computes at this step.
    pub fn tasks_of(&self, worker: usize) -> impl Iterator<Item = Task> + '_ {
        self.tasks
            .iter()
            .copied()
            .filter(move |t| t.worker == worker)
    }
}
