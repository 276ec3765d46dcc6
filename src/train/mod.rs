//! The training loop: every worker holds its chunks of each sequence (rotary positions those of
//! its rows), runs the model's forward and backward with distflash attention, and all-reduces
//! the gradients of the replicated weights; the loss is averaged over all tokens of all workers.
//! AdamW keeps its moments in f32 and updates the weights in the device's precision (f32 on the
//! CPU, 16-bit on a GPU), identically on every worker because the all-reduce is deterministic.
//! Rank 0 reports each step and saves checkpoints.

pub mod data;
pub mod documents;
pub mod lr;
pub mod memory;
pub mod model_attention;
pub mod moments;
mod parquet_docs;
pub mod shard;
pub mod state;
mod step;
pub mod step_plan;
pub mod step_timing;
pub mod svg;
mod tally;
pub mod tokens;

use crate::comm::{Communicator, Solo};
use crate::model::Keep;
use crate::model::config::Config;
use crate::model::cpu::Cpu;
use crate::model::hf_weights::{self, HfWeights};
use crate::model::ops::{AdamW, Ops};
use crate::model::weights::{self, Weights, parameters};
use crate::plan::Partition;
use crate::resources;
use crate::runtime::{Job, ModelDevice, Runtime};
use crate::shape::Span;
use anyhow::{Context, Result, bail};
use data::{Data, Sample};
use documents::{Documents, Packing};
use lr::{Decay, LrSchedule};
use memory::MemoryCheck;
use model_attention::ModelAttention;
use serde::Serialize;
use shard::{Held, Optimizer, StateFrom, Update};
use state::{Part, RunKey, Saved, State};
use std::path::PathBuf;
use std::time::Instant;
use step::{Pass, accumulate_held, model_partition, reduce_step, reduced_sequence};
use step_plan::StepPlan;
use tally::{Tally, all_reduce_tally, collectives};

/// Where the first weights come from.
#[derive(Clone, Debug)]
pub enum Init {
    Random {
        seed: u64,
    },
    /// A Hugging Face model directory (`config.json`, `model.safetensors`).
    HuggingFace(PathBuf),
}

/// Everything a training run is asked to do.
pub struct Options {
    pub config: Config,
    pub init: Init,
    pub data: Data,
    pub seq_len: usize,
    /// Sequences per optimizer step (gradients accumulate over them).
    pub batch: usize,
    /// How each step runs: the sequence's split, what layers keep and where, the sharding.
    pub plan: StepPlan,
    /// Train until this many optimizer steps have been taken (counting resumed ones).
    pub steps: u64,
    /// AdamW's hyper-parameters; its `lr` is the schedule's peak.
    pub adamw: AdamW,
    /// Steps of linear learning-rate warm-up.
    pub warmup: u64,
    /// How the learning rate falls after the warm-up, and to what (`lr::LrSchedule`).
    pub decay: Decay,
    pub min_lr: f64,
    /// Largest global gradient norm; larger gradients are scaled down to it (0: no clipping).
    pub clip: f64,
    pub save_dir: Option<PathBuf>,
    /// Save a checkpoint every this many steps (and at the end) when `save_dir` is set.
    pub save_every: u64,
    /// A checkpoint file (or a directory holding `state.safetensors`) to continue from.
    pub resume: Option<PathBuf>,
    /// Held-out sequences whose loss is reported every few steps.
    pub eval: Option<Eval>,
    /// Whether the documents packed into a sequence see each other, and where their rotary
    /// positions count from (`documents`).
    pub packing: Packing,
    /// Whether the reporter gathers the final weights whole on the host (f32, 4 bytes a
    /// parameter: 25 GiB at 7B) and returns them: to save a model, or to compare runs. A long
    /// run with nothing to save leaves that host memory to its offloaded checkpoints and moments;
    /// its last weights are then checked finite where they are.
    pub final_weights: bool,
}

/// Held-out data (`--eval-data`): the mean loss of its first `sequences` sequences, every
/// `every` steps and at the last.
pub struct Eval {
    pub data: Data,
    pub every: u64,
    pub sequences: u64,
}

/// One optimizer step, as reported (and written as a JSON line).
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    /// Steps taken after this one (1-based).
    pub step: u64,
    /// Mean loss over every token of the step's sequences.
    pub loss: f64,
    /// Recall probes answered right / asked (synthetic task; 0 / 0 otherwise).
    pub recall_correct: u64,
    pub recall_total: u64,
    pub grad_norm: f64,
    pub lr: f64,
    pub tokens_per_sec: f64,
    pub step_secs: f64,
    /// Attention forwards each layer ran per sequence (remat and none: 1, layer: 2).
    pub attention_forwards_per_layer: Vec<u32>,
    /// Peak bytes of layer activations one worker held for the backward.
    pub peak_activation_bytes: usize,
    /// Mean loss over the held-out sequences, at the steps that evaluate (`Options::eval`),
    /// and its perplexity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_perplexity: Option<f64>,
}

impl Options {
    /// Whether step `step` ends with a checkpoint (given a save directory): every
    /// `save_every`, and the last.
    fn saves_at(&self, step: u64) -> bool {
        step.is_multiple_of(self.save_every.max(1)) || step == self.steps
    }
}

fn run_key(o: &Options) -> RunKey {
    RunKey {
        config: o.config.clone(),
        data: o.data.describe(),
        seq_len: o.seq_len,
        batch: o.batch,
    }
}

/// Fresh weights (host, `specs` order): random from the seed, or a Hugging Face directory's.
pub fn initial_weights(c: &Config, init: &Init) -> Result<Vec<Vec<f32>>> {
    let ops = Cpu::<f32>::new();
    let w = match init {
        Init::Random { seed } => weights::random(&ops, c, *seed)?,
        Init::HuggingFace(dir) => hf_weights::load_hf(&ops, c, dir)?,
    };
    Ok(w.tensors().into_iter().cloned().collect())
}

/// Where a run's state comes from.
enum Start {
    /// Step 0: weights made where each worker keeps them, zero moments allocated there.
    Fresh(Source),
    /// A checkpoint, mapped: each worker reads its pieces (re-sharded on load).
    Resumed(Saved),
}

/// The weights of a fresh run, opened (and checked) once before any worker starts.
enum Source {
    /// Drawn on the device from the seed's counter-based streams.
    Random { seed: u64 },
    /// Read piece by piece from a model folder's mapped files.
    Folder(HfWeights),
}

impl Source {
    /// The pieces `spans` of the weights on `ops`'s device.
    fn draw<O: Ops>(&self, ops: &O, c: &Config, spans: &[Span]) -> Result<Weights<O::T>> {
        match self {
            Source::Random { seed } => weights::random_pieces(ops, c, *seed, spans),
            Source::Folder(folder) => folder.pieces(ops, c, spans),
        }
    }
}

impl Start {
    /// The step and the samples already taken.
    fn taken(&self) -> (u64, u64) {
        match self {
            Start::Fresh(_) => (0, 0),
            Start::Resumed(s) => (s.step, s.samples),
        }
    }
}

/// The state a run starts from: a resumed checkpoint, or fresh weights and zero moments.
fn initial_state(o: &Options) -> Result<Start> {
    if let Some(path) = &o.resume {
        return state::load(&state::file_at(path), &run_key(o)).map(Start::Resumed);
    }
    Ok(Start::Fresh(match &o.init {
        Init::Random { seed } => Source::Random { seed: *seed },
        Init::HuggingFace(dir) => Source::Folder(HfWeights::open(dir, &o.config)?),
    }))
}

/// The gradients of the mean loss of one sequence, without an update: the check against other
/// implementations (`distflash grads`, tests).
pub struct Gradients {
    pub loss: f64,
    /// In `specs` order.
    pub grads: Vec<Vec<f32>>,
    pub attention_forwards_per_layer: Vec<u32>,
    pub peak_activation_bytes: usize,
    /// Bytes the reporter sent during the forward and backward, before the gradients are
    /// summed: attention's keys, values and their gradients (and, under `--shard full`, the
    /// layers' weight gathers and gradient reduce-scatters). Masked-out blocks move nothing.
    pub pass_bytes_sent: u64,
}

/// Loss and gradients of `weights` (host, `specs` order) on `tokens` (inputs and, shifted by
/// one, targets), each step as `plan` says (the sequence split across `runtime`'s workers by its
/// schedule, the gradients reduce-scattered and gathered back whole where it shards them): on
/// the reporter (`None` on the other ranks of a launched job). Its documents are ended by
/// `documents.eos` and treated as `documents.packing` says.
pub fn gradients(
    cfg: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    plan: &StepPlan,
    documents: &SequenceDocuments,
    memory: &MemoryCheck,
    runtime: &Runtime,
) -> Result<Option<Gradients>> {
    if tokens.len() < 2 {
        bail!("gradients need at least 2 tokens (one input and its target)");
    }
    documents.packing.check()?;
    plan.ensure_workers(runtime.workers())?;
    let partition = model_partition(cfg, tokens.len() - 1, plan.schedule(), runtime)?;
    let opened = runtime.open()?;
    let plan = &memory.check(runtime, opened.gpu())?;
    let job = GradientsJob {
        cfg,
        weights,
        tokens,
        partition,
        plan,
        documents,
    };
    opened.run_reporter(&job)
}

/// How [`gradients`] finds and treats the documents of its one sequence: the token that ends
/// each (`None`: the sequence is one document) and the packing.
#[derive(Clone, Copy, Debug, Default)]
pub struct SequenceDocuments {
    pub eos: Option<u32>,
    pub packing: Packing,
}

/// One worker's part of [`gradients`].
struct GradientsJob<'a> {
    cfg: &'a Config,
    weights: &'a [Vec<f32>],
    tokens: &'a [u32],
    partition: Partition,
    plan: &'a StepPlan,
    documents: &'a SequenceDocuments,
}

impl Job for GradientsJob<'_> {
    type Output = Gradients;

    fn run<D: ModelDevice, C: Communicator<D::Tensor>>(
        &self,
        device: &D,
        comm: &mut C,
    ) -> Result<Gradients> {
        let (ops, cfg) = (device.ops(), self.cfg);
        let rank = comm.rank();
        let held = Held::from_host(ops, cfg, self.weights, self.plan, rank)?;
        let sample = Sample {
            tokens: self.tokens.to_vec(),
            probe: None,
            eos: self.documents.eos,
        };
        let mine = self.partition.own_spans(comm.rank());
        let mut attn = ModelAttention::new(device, comm, cfg.dims(), &self.partition)?;
        let seq = self.partition.seq();
        let packing = self.documents.packing;
        let pass = Pass::of_sequence(&sample, &mine, packing, self.plan.keep());
        let (out, tally, reduced, pass_bytes_sent) =
            reduced_sequence(ops, cfg, &held, &mut attn, &pass)?;
        let pieces = held.shard.reduce_scatters_grads();
        let reduced: Vec<_> = reduced.iter().collect();
        let reporter = rank == 0;
        let mut solo = Solo;
        let comm = collectives(&mut attn, &mut solo);
        let grads = held.host(ops, comm, &reduced, pieces, reporter)?;
        Ok(Gradients {
            loss: tally.loss_sum / seq as f64,
            grads,
            attention_forwards_per_layer: out.attention_forwards,
            peak_activation_bytes: out.peak_activation_bytes,
            pass_bytes_sent,
        })
    }
}

/// What a training run returns on its reporter.
#[derive(Debug)]
pub struct Trained {
    /// The plan the steps ran: `o.plan` with what the device's memory decided (whole layers,
    /// `--offload auto`).
    pub plan: StepPlan,
    /// The final host weights (`specs` order) when `Options::final_weights` asks for them.
    pub weights: Option<Vec<Vec<f32>>>,
}

/// Trains as `o` says on `runtime`'s workers, calling `on_step` (from the reporter) after every
/// step. Returns, on the reporter, the plan run and the final weights asked for; `None` on the
/// other ranks of a launched job (their weights are the same).
pub fn train(
    o: &Options,
    memory: &MemoryCheck,
    runtime: &Runtime,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Option<Trained>> {
    o.plan.ensure_workers(runtime.workers())?;
    let partition = model_partition(&o.config, o.seq_len, o.plan.schedule(), runtime)?;
    if let Some(e) = &o.eval {
        e.data.check(o.seq_len, o.config.vocab_size)?;
        if e.sequences == 0 {
            bail!("--eval-sequences must be at least 1");
        }
    }
    let opened = runtime.open()?;
    let plan = memory.check(runtime, opened.gpu())?;
    let (start, key) = prepare(o)?;
    let job = TrainJob {
        o,
        plan,
        key,
        start,
        partition,
        on_step,
    };
    let weights = opened.run_reporter(&job)?;
    Ok(weights.map(|weights| Trained { plan, weights }))
}

/// One worker's run: its rows of every sequence, attention across the workers, gradients
/// summed over them after each step.
struct TrainJob<'a, F> {
    o: &'a Options,
    /// `o.plan` as the memory check left it (with the whole layers decided).
    plan: StepPlan,
    key: RunKey,
    start: Start,
    partition: Partition,
    on_step: F,
}

impl<F: Fn(&StepReport) + Sync> Job for TrainJob<'_, F> {
    type Output = Option<Vec<Vec<f32>>>;

    fn run<D: ModelDevice, C: Communicator<D::Tensor>>(
        &self,
        device: &D,
        comm: &mut C,
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let rank = comm.rank();
        let mine = self.partition.own_spans(rank);
        let ops = device.ops();
        let mut attn = ModelAttention::new(device, comm, self.o.config.dims(), &self.partition)?;
        run_steps(ops, self, &mine, rank, &mut attn)
    }
}

/// Everything every rank derives alike before the first step: the starting state (fresh or
/// resumed) and the run's identity for checkpoints; the checks that refuse a run.
fn prepare(o: &Options) -> Result<(Start, RunKey)> {
    if o.batch == 0 {
        bail!("--batch must be at least 1");
    }
    o.packing.check()?;
    if o.packing.documents == Documents::Separate && matches!(o.data, Data::Bytes { .. }) {
        bail!(
            "--documents separate masks attention at the end-of-document tokens, and byte data (--data without --tokenizer) has none: give --tokenizer, or --documents packed"
        );
    }
    o.data.check(o.seq_len, o.config.vocab_size)?;
    if let Some(dir) = &o.save_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the save directory {}", dir.display()))?;
    }
    let start = initial_state(o)?;
    let (taken, _) = start.taken();
    if taken > o.steps {
        bail!(
            "the checkpoint has already taken {taken} steps, more than --steps {}",
            o.steps
        );
    }
    if let Some(dir) = &o.save_dir {
        let existing = std::fs::metadata(state::path_in(dir)).map_or(0, |m| m.len());
        let saves = (taken + 1..=o.steps).filter(|&s| o.saves_at(s)).count();
        let need = save_disk_bytes(parameters(&o.config), saves, existing);
        resources::ensure_disk(
            dir,
            need,
            &format!(
                "saving this run's checkpoints and model in {}",
                dir.display()
            ),
            "give a --save-dir on a disk with more room, or save less often (--save-every) after freeing space",
        )?;
    }
    Ok((start, run_key(o)))
}

/// Disk bytes a run's saves take beyond what its save directory holds now, for a model of
/// `params` parameters saving `saves` checkpoints over a checkpoint of `existing` bytes (0 for
/// none): a checkpoint (f32 weights and both AdamW moments, 12 bytes a parameter) is written
/// whole beside the previous one before it replaces it, and the final `model.safetensors`
/// (f32 weights, 4 bytes a parameter) beside the last.
pub fn save_disk_bytes(params: usize, saves: usize, existing: u64) -> f64 {
    let (state, model, existing) = (12.0 * params as f64, 4.0 * params as f64, existing as f64);
    let (peak, last) = match saves {
        0 => (existing, existing),
        1 => (existing + state, state),
        _ => (2.0 * state, state),
    };
    peak.max(last + model) - existing
}

/// The steps of `job` on any device: worker `rank`'s rows `mine` of every sequence, gradients
/// and the tally summed over the workers, AdamW as the plan shards it. The reporter calls
/// `job.on_step` and saves, and returns the final weights if `final_weights` asks for them.
fn run_steps<D: ModelDevice, C: Communicator<D::Tensor>, F: Fn(&StepReport) + Sync>(
    ops: &D::Ops,
    job: &TrainJob<'_, F>,
    mine: &[Span],
    rank: usize,
    attn: &mut ModelAttention<'_, D, C>,
) -> Result<Option<Vec<Vec<f32>>>> {
    let TrainJob {
        o,
        key,
        start,
        on_step,
        ..
    } = job;
    let (cfg, plan) = (&o.config, &job.plan);
    let reporter = rank == 0;
    let mut held = match start {
        Start::Fresh(source) => Held::drawn(cfg, plan, rank, |spans| source.draw(ops, cfg, spans))?,
        Start::Resumed(saved) => Held::drawn(cfg, plan, rank, |spans| {
            Weights::build_pieces(cfg, spans, |k, _, span| {
                ops.upload_exact(&saved.piece(Part::Weights, k, span)?)
            })
        })?,
    };
    let from = match start {
        Start::Fresh(_) => StateFrom::Fresh,
        Start::Resumed(saved) => StateFrom::Saved(saved),
    };
    let mut opt = Optimizer::made(ops, cfg, plan, rank, &held, from)?;
    let mut solo = Solo;
    let scale = 1.0 / (o.seq_len * o.batch) as f64;
    let (first, mut samples) = start.taken();
    // The checkpoint a non-finite step leaves in place (the resumed one, if any) and its step.
    let mut saved = o.resume.as_ref().map(|path| (path.clone(), first));
    for step in first + 1..=o.steps {
        let began = Instant::now();
        let mut grads = held.step_grads(ops, cfg)?;
        let mut tally = Tally::default();
        let mut last = None;
        for b in 0..o.batch {
            let sample = o.data.sample(samples, o.seq_len, cfg.vocab_size);
            samples += 1;
            let pass = Pass {
                sample: &sample,
                mine,
                packing: o.packing,
                keep: plan.keep(),
                scale,
                at_head: None,
            };
            let fresh = b == 0;
            let grads = (&mut grads, fresh);
            last = Some(accumulate_held(
                ops, cfg, &held, grads, attn, &pass, &mut tally,
            )?);
        }
        let reduced = reduce_step(ops, attn, held.shard, grads, &mut tally)?;
        let comm = collectives(attn, &mut solo);
        let (grads, norm) = opt.gradients(ops, comm, reduced)?;
        let lr = LrSchedule {
            peak: o.adamw.lr,
            floor: o.min_lr,
            warmup: o.warmup,
            decay: o.decay,
            steps: o.steps,
        }
        .at(step);
        let loss = tally.loss_sum * scale;
        let out = last.expect("batch is at least 1");
        let report = |secs: f64| StepReport {
            step,
            loss,
            recall_correct: tally.correct,
            recall_total: tally.probes,
            grad_norm: norm,
            lr,
            tokens_per_sec: (o.seq_len * o.batch) as f64 / secs,
            step_secs: secs,
            attention_forwards_per_layer: out.attention_forwards.clone(),
            peak_activation_bytes: out.peak_activation_bytes,
            eval_loss: None,
            eval_perplexity: None,
        };
        // Every worker sees the same all-reduced loss and norm, so all stop at the same step.
        if !loss.is_finite() || !norm.is_finite() {
            if reporter {
                on_step(&report(began.elapsed().as_secs_f64()));
            }
            let what = format!("the loss is {loss} and the gradient norm {norm}");
            return Err(diverged(o, step, saved.as_ref(), &what));
        }
        let update = Update {
            adamw: AdamW { lr, ..o.adamw },
            step,
            clip: o.clip,
        };
        opt.apply(ops, comm, &mut held.w, (grads, norm), &update)?;
        let save = o.save_dir.as_ref().filter(|_| o.saves_at(step));
        let gathered = match save {
            Some(_) => opt.checkpoint(ops, comm, &held, reporter)?,
            None => None,
        };
        if let Some(host) = &gathered
            && !all_finite(&host.weights)
        {
            let what = "its update made weights non-finite";
            return Err(diverged(o, step, saved.as_ref(), what));
        }
        let eval_loss =
            match &o.eval {
                Some(e) if step.is_multiple_of(e.every.max(1)) || step == o.steps => Some(
                    evaluate(ops, &held, attn, &mut solo, mine, (e, plan.keep()), o)?,
                ),
                _ => None,
            };
        if !reporter {
            continue;
        }
        let mut r = report(began.elapsed().as_secs_f64());
        r.eval_loss = eval_loss;
        r.eval_perplexity = eval_loss.map(f64::exp);
        on_step(&r);
        if let (Some(dir), Some(host)) = (save, gathered) {
            let state = State {
                step,
                samples,
                weights: host.weights,
                m: host.m,
                v: host.v,
            };
            let path = state::path_in(dir);
            state::save(&path, key, &state)?;
            saved = Some((path, step));
        }
    }
    let what = "its last update made weights non-finite";
    if !o.final_weights {
        // Each worker checks the pieces it holds (a sum of squares of f32 values is finite
        // exactly when every value is).
        if !ops.sum_squares(&held.w.tensors())?.is_finite() {
            return Err(diverged(o, o.steps, saved.as_ref(), what));
        }
        return Ok(None);
    }
    let weights = opt.exact_weights(ops, collectives(attn, &mut solo), &held, reporter)?;
    if reporter && !all_finite(&weights) {
        return Err(diverged(o, o.steps, saved.as_ref(), what));
    }
    Ok(Some(weights))
}

/// The mean loss over `eval`'s held-out sequences, summed over the workers. The model has one
/// pass, forward and backward, so the held-out loss costs a step's work a sequence; its
/// gradients go to scratch tensors that are dropped.
fn evaluate<D: ModelDevice, C: Communicator<D::Tensor>>(
    ops: &D::Ops,
    held: &Held<D::Tensor>,
    attn: &mut ModelAttention<'_, D, C>,
    solo: &mut Solo,
    mine: &[Span],
    (eval, keep): (&Eval, Keep),
    o: &Options,
) -> Result<f64> {
    let cfg = &o.config;
    let mut tally = Tally::default();
    let mut scratch = held.step_grads(ops, cfg)?;
    for i in 0..eval.sequences {
        let sample = eval.data.sample(i, o.seq_len, cfg.vocab_size);
        let pass = Pass {
            sample: &sample,
            mine,
            packing: o.packing,
            keep,
            scale: 1.0,
            at_head: None,
        };
        let grads = (&mut scratch, i == 0);
        accumulate_held(ops, cfg, held, grads, attn, &pass, &mut tally)?;
    }
    drop(scratch);
    all_reduce_tally(ops, collectives(attn, solo), &mut tally)?;
    Ok(tally.loss_sum / (eval.sequences as usize * o.seq_len) as f64)
}

/// Whether every weight is a finite number: non-finite ones are never saved or returned.
fn all_finite(weights: &[Vec<f32>]) -> bool {
    weights.iter().flatten().all(|x| x.is_finite())
}

/// The sentence that ends a run whose step `step` went non-finite (`what`), saying what was kept
/// and how to go on.
fn diverged(o: &Options, step: u64, saved: Option<&(PathBuf, u64)>, what: &str) -> anyhow::Error {
    let kept = match (saved, &o.save_dir) {
        (Some((path, s)), _) => format!(
            "the last good checkpoint, {} of step {s}, is kept",
            path.display()
        ),
        (None, Some(_)) => "no checkpoint had been saved yet and none is written".into(),
        (None, None) => "nothing was saved (no --save-dir)".into(),
    };
    anyhow::anyhow!(
        "training diverged at step {step}: {what}, so it stopped there and {kept}; lower --lr (now {}) or raise --warmup (now {}), and keep --clip on",
        short(o.adamw.lr),
        o.warmup
    )
}

/// `x` as a person writes it: 0.01, 3, 1e30 (not thirty-one digits).
fn short(x: f64) -> String {
    if x == 0.0 || (1e-4..1e6).contains(&x.abs()) {
        x.to_string()
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_need_a_checkpoint_beside_the_previous_and_the_model_beside_the_last() {
        // One parameter: a checkpoint is 12 bytes, the model 4.
        assert_eq!(save_disk_bytes(1, 0, 0), 4.0);
        assert_eq!(save_disk_bytes(1, 1, 0), 16.0);
        // Resumed over a checkpoint on disk: the new one is written beside it, then replaces it.
        assert_eq!(save_disk_bytes(1, 1, 12), 12.0);
        assert_eq!(save_disk_bytes(1, 3, 0), 24.0);
        assert_eq!(save_disk_bytes(1, 3, 12), 12.0);
        assert_eq!(save_disk_bytes(1_000, 2, 0), 24_000.0);
    }

    #[test]
    fn weights_that_do_not_match_the_model_are_refused() {
        let cfg = Config::preset("tiny").unwrap();
        let w = initial_weights(&cfg, &Init::Random { seed: 3 }).unwrap();
        let tokens: Vec<u32> = (0..49).map(|i| (i * 37 % 256) as u32).collect();
        let rt = Runtime::cpu_threads(1, std::time::Duration::from_secs(60));
        let asked = step_plan::Asked::default();
        let gradients_of_one = step_plan::Purpose::Gradients;
        let plan = StepPlan::resolve(asked, gradients_of_one, 1, &cfg, rt.device)
            .unwrap()
            .plan;
        let memory = MemoryCheck {
            config: cfg.clone(),
            model: "tiny".into(),
            seq: 48,
            plan,
            host_state: memory::HostState::Weights,
            ignore_estimate: false,
        };
        let err = gradients(
            &cfg,
            &w[..3],
            &tokens,
            &plan,
            &SequenceDocuments::default(),
            &memory,
            &rt,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.starts_with("no weights given for"), "{err}");
    }
}
