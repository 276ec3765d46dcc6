//! The static schedule of distributed causal attention: at each step, which blocks
//! (query chunk, key/value chunk) every worker computes, and which tensors move between whom.
//!
//! The sequence is cut into chunks of consecutive rows; each chunk (its Q, K, V) belongs to one
//! worker. Block (i, j) is needed for j ≤ i. The schedules offered (docs/architecture.md,
//! "Schedules"):
//! - `unbalanced`: P chunks, worker r owns chunk r. At step t, worker r computes (r, r − t) if
//!   r ≥ t, fetching K/V from worker r − t. Worker P−1 works P steps, worker 0 one.
//! - `balanced` (DistFlashAttn): the same chunks; owners still compute offset t at step t, but a
//!   worker r < t, idle above, helps the worker P − t + r with the far block (P − t + r, r),
//!   using its own K/V and the fetched query chunk, and returns the partial (O, LSE) to be
//!   merged. Offsets t and P − t are covered together, so ⌊P/2⌋ + 1 steps suffice.
//! - `zigzag` (head-tail, as other context-parallel systems use): 2P half-size chunks, worker r
//!   owns chunks r and 2P − 1 − r. At step t every worker computes its queries against the K/V
//!   of worker r − t (mod P): each step gives every worker the same work, two quarter-size blocks
//!   (or three smaller ones at step 0), so P steps make a speedup of P even for P = 2, where
//!   `balanced` reaches only 4/3.
//! - `greedy` (cost-aware, for masks): `balanced`'s chunks and roles, but each block goes to its
//!   query's or its key's owner by its real cost, heaviest first (`greedy.rs`), so the blocks
//!   of a long packed document are shared by the workers holding their keys. Under full
//!   causal attention it takes `balanced`'s ⌊P/2⌋ + 1 steps.
//!
//! The backward pass follows the same tasks; only what travels changes (see `Payload`).
//!
//! Under a mask (`shape::Mask`: packed documents, a sliding window, global tokens) a plan is
//! made from the real work: a block in which the mask hides every pair is neither computed nor
//! fetched (the schedule's task is left out, with the transfers only it needed, and steps left
//! empty go), so with a window no wider than a chunk only neighbouring chunks move (the paper's
//! appendix F); the cost model counts each block's visible pairs.

mod greedy;
mod partition;
mod render;
pub mod volume;

use crate::shape::{Mask, Span};
use anyhow::{Result, bail};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

pub use partition::Partition;
pub use render::{to_json, to_svg, to_text};

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
    fn owners(self, workers: usize) -> Vec<usize> {
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

/// A complete schedule for one pass.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub workers: usize,
    pub schedule: Schedule,
    pub pass: Pass,
    /// The worker owning each chunk.
    pub owner: Vec<usize>,
    pub steps: Vec<Step>,
    /// The mask the plan was made for; the executor applies it to every block it computes.
    pub mask: Mask,
    /// Cost of block (i, j) at `i · chunks + j` from its visible pairs, one unit being the
    /// pairs of a full block between two worker-sized chunks; `None` under plain causal
    /// attention, whose cost model counts areas (a diagonal block is half a full one).
    #[serde(skip)]
    block_costs: Option<Vec<f64>>,
}

impl Plan {
    /// The plan of full causal attention for `workers` workers: every block on or below the
    /// diagonal.
    pub fn new(workers: usize, schedule: Schedule, pass: Pass) -> Result<Plan> {
        if workers == 0 {
            bail!("workers must be at least 1");
        }
        let chunks = schedule.chunks(workers);
        let steps = task_steps(workers, schedule, |i, j| area_cost(workers, chunks, i, j));
        Ok(Plan::from_tasks(
            workers,
            schedule,
            pass,
            steps,
            Mask::causal(),
            None,
        ))
    }

    /// The plan for chunks `spans` (the schedule's chunks for `workers` workers, in sequence
    /// order) under `mask`: the schedule's tasks less those whose block holds no visible pair.
    /// Plain causal attention gives [`Plan::new`]'s plan.
    pub fn masked(
        workers: usize,
        schedule: Schedule,
        pass: Pass,
        spans: &[Span],
        mask: &Mask,
    ) -> Result<Plan> {
        if mask.is_causal() {
            return Plan::new(workers, schedule, pass);
        }
        if workers == 0 {
            bail!("workers must be at least 1");
        }
        let chunks = schedule.chunks(workers);
        if spans.len() != chunks {
            bail!(
                "the {schedule} schedule cuts the sequence into {chunks} chunks for {workers} workers, not {}",
                spans.len()
            );
        }
        let seq: usize = spans.iter().map(|s| s.len).sum();
        let unit = (seq as f64 / workers as f64).powi(2);
        let costs: Vec<f64> = (0..chunks * chunks)
            .map(|b| match (b / chunks, b % chunks) {
                (i, j) if j <= i => mask.visible_pairs(spans[i], spans[j]) as f64 / unit,
                _ => 0.0, // above the diagonal: causal hides it
            })
            .collect();
        let steps = task_steps(workers, schedule, |i, j| costs[i * chunks + j])
            .into_iter()
            .map(|tasks| {
                tasks
                    .into_iter()
                    .filter(|t| costs[t.q_chunk * chunks + t.kv_chunk] > 0.0)
                    .collect::<Vec<_>>()
            })
            .filter(|tasks| !tasks.is_empty())
            .collect();
        Ok(Plan::from_tasks(
            workers,
            schedule,
            pass,
            steps,
            mask.clone(),
            Some(costs),
        ))
    }

    /// The same tasks for `pass`: what travels is derived again, nothing else changes.
    pub fn for_pass(&self, pass: Pass) -> Plan {
        let tasks = self.steps.iter().map(|s| s.tasks.clone()).collect();
        let costs = self.block_costs.clone();
        let (workers, schedule) = (self.workers, self.schedule);
        Plan::from_tasks(workers, schedule, pass, tasks, self.mask.clone(), costs)
    }

    /// A plan of these tasks, with the transfers they need: a remote operand is fetched once a
    /// step per worker however many of its tasks use it, a result returned once.
    fn from_tasks(
        workers: usize,
        schedule: Schedule,
        pass: Pass,
        task_steps: Vec<Vec<Task>>,
        mask: Mask,
        block_costs: Option<Vec<f64>>,
    ) -> Plan {
        let owner = schedule.owners(workers);
        let steps = task_steps
            .into_iter()
            .map(|tasks| {
                let mut fetches = Vec::new();
                let mut returns = Vec::new();
                for task in &tasks {
                    let (fetch, ret) = moves(task, role(&owner, task), &owner, pass);
                    fetches.extend(fetch.filter(|f| !fetches.contains(f)));
                    returns.extend(ret.filter(|r| !returns.contains(r)));
                }
                Step {
                    tasks,
                    fetches,
                    returns,
                }
            })
            .collect();
        Plan {
            workers,
            schedule,
            pass,
            owner,
            steps,
            mask,
            block_costs,
        }
    }

    /// The blocks on or below the diagonal (query chunk ≥ key chunk, in sequence order) that
    /// no task computes, because the mask hides every pair of them.
    pub fn skipped_blocks(&self) -> Vec<(usize, usize)> {
        let computed: std::collections::HashSet<(usize, usize)> = self
            .steps
            .iter()
            .flat_map(|s| s.tasks.iter().map(|t| (t.q_chunk, t.kv_chunk)))
            .collect();
        (0..self.chunks())
            .flat_map(|i| (0..=i).map(move |j| (i, j)))
            .filter(|b| !computed.contains(b))
            .collect()
    }

    /// Number of chunks the sequence is cut into.
    pub fn chunks(&self) -> usize {
        self.owner.len()
    }

    /// The chunks `worker` owns, in sequence order.
    pub fn chunks_of(&self, worker: usize) -> Vec<usize> {
        (0..self.chunks())
            .filter(|&c| self.owner[c] == worker)
            .collect()
    }

    /// Where `task`'s operands live.
    pub fn role(&self, task: &Task) -> Role {
        role(&self.owner, task)
    }

    /// Cost in the model where a block between two worker-sized chunks (N/P rows) costs 1 and a
    /// causal diagonal block half its area; under a mask, the block's visible pairs in that unit.
    pub fn task_cost(&self, task: &Task) -> f64 {
        match &self.block_costs {
            Some(costs) => costs[task.q_chunk * self.chunks() + task.kv_chunk],
            None => area_cost(self.workers, self.chunks(), task.q_chunk, task.kv_chunk),
        }
    }

    /// Time of a step in the cost model: its busiest worker.
    pub fn step_cost(&self, step: &Step) -> f64 {
        // One pass over the step's tasks (a pass per worker made plans cubic to cost).
        let mut busy = vec![0.0; self.workers];
        for t in &step.tasks {
            busy[t.worker] += self.task_cost(t);
        }
        busy.into_iter().fold(0.0, f64::max)
    }

    /// Work of one worker computing every block alone, in the cost model: P diagonal halves
    /// plus P(P−1)/2 full blocks, P²/2 in all, however the sequence is chunked; under a mask,
    /// the visible pairs of the whole sequence in the same unit.
    pub fn total_work(&self) -> f64 {
        if let Some(costs) = &self.block_costs {
            return costs.iter().sum();
        }
        let p = self.workers as f64;
        p * p / 2.0
    }

    /// Time of the plan in the cost model (steps run in lock-step).
    pub fn makespan(&self) -> f64 {
        self.steps.iter().map(|s| self.step_cost(s)).sum()
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
            busy[task.worker] += self.task_cost(task);
        }
        let makespan = self.makespan();
        busy.iter().map(|b| b / makespan).collect()
    }
}

/// The causal area model's cost of block (i, j) of `chunks` chunks over `workers` workers: a
/// block between two worker-sized chunks costs 1, a diagonal block half its area.
fn area_cost(workers: usize, chunks: usize, i: usize, j: usize) -> f64 {
    let side = workers as f64 / chunks as f64;
    let area = if i == j { 0.5 } else { 1.0 };
    area * side * side
}

fn role(owner: &[usize], task: &Task) -> Role {
    match (
        owner[task.q_chunk] == task.worker,
        owner[task.kv_chunk] == task.worker,
    ) {
        (true, true) => Role::Local,
        (true, false) => Role::Owner,
        _ => Role::Helper,
    }
}

/// The tasks of each step, from the block costs for the schedule that reads them (`greedy`);
/// the pass does not change them.
fn task_steps(p: usize, schedule: Schedule, cost: impl Fn(usize, usize) -> f64) -> Vec<Vec<Task>> {
    let task = |worker, q_chunk, kv_chunk| Task {
        worker,
        q_chunk,
        kv_chunk,
    };
    match schedule {
        Schedule::Unbalanced => (0..p)
            .map(|t| (t..p).map(|r| task(r, r, r - t)).collect())
            .collect(),
        Schedule::Balanced => (0..=p / 2)
            .map(|t| {
                let owners = (t..p).map(|r| task(r, r, r - t));
                // Helpers take offset P − t unless the owners already cover it (t = P/2).
                let helpers = (0..t)
                    .filter(|_| t > 0 && p - t > t)
                    .map(|r| task(r, p - t + r, r));
                helpers.chain(owners).collect()
            })
            .collect(),
        Schedule::Zigzag => {
            let own = |w: usize| [w, 2 * p - 1 - w];
            (0..p)
                .map(|t| {
                    (0..p)
                        .flat_map(|w| {
                            let source = (w + p - t) % p;
                            own(w).into_iter().flat_map(move |q| {
                                own(source)
                                    .into_iter()
                                    .filter(move |&kv| kv <= q)
                                    .map(move |kv| task(w, q, kv))
                            })
                        })
                        .collect()
                })
                .collect()
        }
        Schedule::Greedy => greedy::steps(p, cost),
    }
}

/// The transfer that brings a task's remote operand, and the one that returns its result.
fn moves(
    task: &Task,
    role: Role,
    owner: &[usize],
    pass: Pass,
) -> (Option<Transfer>, Option<Transfer>) {
    let (w, i, j) = (task.worker, task.q_chunk, task.kv_chunk);
    let t = |from, to, chunk, payload| {
        Some(Transfer {
            from,
            to,
            chunk,
            payload,
        })
    };
    let (qo, kvo) = (owner[i], owner[j]);
    match (role, pass) {
        (Role::Local, _) => (None, None),
        (Role::Owner, Pass::Forward) => (t(kvo, w, j, Payload::KeyValue), None),
        (Role::Owner, Pass::Backward) => (
            t(kvo, w, j, Payload::KeyValue),
            t(w, kvo, j, Payload::KvGrad),
        ),
        (Role::Helper, Pass::Forward) => (
            t(qo, w, i, Payload::Query),
            t(w, qo, i, Payload::PartialOut),
        ),
        (Role::Helper, Pass::Backward) => (
            t(qo, w, i, Payload::QueryGradInputs),
            t(w, qo, i, Payload::QueryGrad),
        ),
    }
}

/// Splits `seq` tokens into the schedule's chunks for `workers` workers: consecutive rows,
/// sizes differing by at most one (the first `seq % chunks` chunks take the extra row).
pub fn chunk_sizes(seq: usize, workers: usize, schedule: Schedule) -> Result<Vec<usize>> {
    if workers == 0 {
        bail!("workers must be at least 1");
    }
    let chunks = schedule.chunks(workers);
    if seq == 0 {
        bail!(
            "the sequence is empty (0 tokens): give --seq-len of at least {chunks}, one token per chunk"
        );
    }
    if seq < chunks {
        bail!(
            "sequence length {seq} is too short for {workers} workers with the {schedule} schedule: it cuts the sequence into {chunks} chunks of at least one token; use --workers {} or fewer",
            seq * workers / chunks
        );
    }
    Ok((0..chunks)
        .map(|r| seq / chunks + usize::from(r < seq % chunks))
        .collect())
}

#[cfg(test)]
mod tests;
