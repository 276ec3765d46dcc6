//! A `Plan`: every step of one pass under a schedule, made from the chunks' costs (the greedy
//! schedule's steps from `greedy`), and the chunk sizes a schedule cuts a sequence into.

use super::greedy;
use super::parts::{Pass, Payload, Role, Schedule, Step, Task, Transfer};
use crate::shape::{Mask, Span};
use anyhow::{Result, bail};
use serde::Serialize;

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
