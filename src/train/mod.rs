//! The training loop: every worker holds its chunks of each sequence (rotary positions those of
//! its rows), runs the model's forward and backward with distflash attention, and all-reduces
//! the gradients of the replicated weights; the loss is averaged over all tokens of all workers.
//! AdamW keeps its moments in f32 and updates the weights in the device's precision (f32 on the
//! CPU, 16-bit on a GPU), identically on every worker because the all-reduce is deterministic.
//! Rank 0 reports each step and saves checkpoints.

pub mod attention;
pub mod bench;
pub mod cuda_attention;
pub mod data;
pub mod state;
pub mod svg;

use crate::attn::Span;
use crate::backend::cpu::CpuBackend;
use crate::comm::{Buffer, Communicator, LocalComm, Wire};
use crate::exec::{chunk_spans, collect_results, run_workers};
use crate::model::attention::Attention;
use crate::model::config::Config;
use crate::model::cpu::Cpu;
use crate::model::ops::{AdamW, Ops};
use crate::model::weights::{self, Weights, specs};
use crate::model::{Checkpoint, Chunk, forward_backward};
use crate::plan::{Schedule, chunk_sizes};
use crate::resources::CpuTraining;
use anyhow::{Context, Result, bail};
use attention::{Distributed, ModelEdge};
use data::{Data, Sample};
use serde::Serialize;
use state::{RunKey, State};
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    pub workers: usize,
    pub schedule: Schedule,
    pub checkpoint: Checkpoint,
    /// Train until this many optimizer steps have been taken (counting resumed ones).
    pub steps: u64,
    pub adamw: AdamW,
    /// Steps of linear learning-rate warm-up.
    pub warmup: u64,
    /// Largest global gradient norm; larger gradients are scaled down to it (0: no clipping).
    pub clip: f64,
    pub save_dir: Option<PathBuf>,
    /// Save a checkpoint every this many steps (and at the end) when `save_dir` is set.
    pub save_every: u64,
    /// A checkpoint file (or a directory holding `state.safetensors`) to continue from.
    pub resume: Option<PathBuf>,
    pub timeout: Duration,
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
        Init::HuggingFace(dir) => weights::load_hf(&ops, c, dir)?,
    };
    Ok(w.tensors().into_iter().cloned().collect())
}

/// The state a run starts from: a resumed checkpoint, or fresh weights and zero moments.
fn initial_state(o: &Options) -> Result<State> {
    if let Some(path) = &o.resume {
        let file = if path.is_dir() {
            state::path_in(path)
        } else {
            path.clone()
        };
        return state::load(&file, &run_key(o));
    }
    let zeros: Vec<Vec<f32>> = specs(&o.config)
        .iter()
        .map(|s| vec![0.0; s.elements()])
        .collect();
    Ok(State {
        step: 0,
        samples: 0,
        weights: initial_weights(&o.config, &o.init)?,
        m: zeros.clone(),
        v: zeros,
    })
}

/// Host tensors (`specs` order) on the device of `ops`, shaped as the model's weights.
fn upload_weights<O: Ops>(ops: &O, c: &Config, host: &[Vec<f32>]) -> Result<Weights<O::T>> {
    upload_each(c, host, |data| ops.upload(data))
}

/// AdamW's moments to the device, in the precision the device's optimizer keeps them.
fn upload_moments<O: Ops>(ops: &O, c: &Config, host: &[Vec<f32>]) -> Result<Weights<O::T>> {
    upload_each(c, host, |data| ops.upload_state(data))
}

/// One tensor per weight spec, `specs` order, each made by `upload`.
fn upload_each<T>(
    c: &Config,
    host: &[Vec<f32>],
    mut upload: impl FnMut(&[f32]) -> Result<T>,
) -> Result<Weights<T>> {
    let mut it = host.iter();
    Weights::build(c, |s| {
        let data = it
            .next()
            .with_context(|| format!("no weights given for '{}'", s.name))?;
        upload(data)
    })
}

/// Device tensors back on the host, `specs` order.
fn download_weights<O: Ops>(ops: &O, w: &Weights<O::T>) -> Result<Vec<Vec<f32>>> {
    w.tensors().into_iter().map(|t| ops.download(t)).collect()
}

/// Per-step sums all workers add up: loss, probes right, probes asked.
#[derive(Default)]
struct Tally {
    loss_sum: f64,
    correct: u64,
    probes: u64,
}

/// Forward and backward of this worker's rows of `sample`, gradients into `grads`.
#[allow(clippy::too_many_arguments)]
fn accumulate<O: Ops>(
    ops: &O,
    cfg: &Config,
    w: &Weights<O::T>,
    grads: &mut Weights<O::T>,
    attn: &mut impl Attention<O::T>,
    mine: &[Span],
    sample: &Sample,
    policy: Checkpoint,
    scale: f64,
    tally: &mut Tally,
) -> Result<crate::model::Outcome> {
    let rows = |shift: usize| -> Vec<u32> {
        mine.iter()
            .flat_map(|s| &sample.tokens[s.start + shift..s.end() + shift])
            .copied()
            .collect()
    };
    let (tokens, targets) = (rows(0), rows(1));
    let chunk = Chunk {
        tokens: &tokens,
        targets: &targets,
        positions: mine,
    };
    let out = forward_backward(ops, cfg, w, grads, attn, chunk, policy, scale)?;
    tally.loss_sum += out.loss_sum;
    if let Some(p) = sample.probe
        && let Some(row) =
            crate::model::ops::row_positions(mine, tokens.len())?.position(|q| q == p)
    {
        tally.probes += 1;
        tally.correct += (out.argmax[row] == sample.tokens[p + 1]) as u64;
    }
    Ok(out)
}

/// One sequence's forward and backward on this worker's rows `mine` (gradients of its mean loss
/// into `grads`), then the gradients and the tally summed over all workers: the step of
/// `distflash grads` and of `bench train` under a launcher.
#[allow(clippy::too_many_arguments)]
fn reduced_sequence<O, B, C>(
    ops: &O,
    cfg: &Config,
    w: &Weights<O::T>,
    grads: &mut Weights<O::T>,
    attn: &mut Distributed<'_, B, C>,
    mine: &[Span],
    sample: &Sample,
    policy: Checkpoint,
) -> Result<(crate::model::Outcome, Tally)>
where
    O: Ops<T = B::Tensor>,
    B: ModelEdge,
    B::Tensor: Buffer,
    C: Communicator<B::Tensor>,
{
    let scale = 1.0 / (sample.tokens.len() - 1) as f64;
    let mut tally = Tally::default();
    let out = accumulate(
        ops, cfg, w, grads, attn, mine, sample, policy, scale, &mut tally,
    )?;
    all_reduce(ops, attn.comm, grads, &mut tally)?;
    Ok((out, tally))
}

/// The spans of the chunks `rank` owns out of `spans` (every chunk of the sequence), in
/// sequence order.
fn own_spans(spans: &[Span], workers: usize, schedule: Schedule, rank: usize) -> Vec<Span> {
    schedule
        .chunks_of(workers, rank)
        .into_iter()
        .map(|c| spans[c])
        .collect()
}

/// Sums gradients and the tally over all workers, on the device the gradients live on (the tally
/// travels as a three-element f32 tensor of that device).
fn all_reduce<O, C>(
    ops: &O,
    comm: &mut C,
    grads: &mut Weights<O::T>,
    tally: &mut Tally,
) -> Result<()>
where
    O: Ops,
    O::T: Wire,
    C: Communicator<O::T>,
{
    for g in grads.tensors_mut() {
        comm.all_reduce_sum(g)?;
    }
    let mut t = ops.upload_state(&[
        tally.loss_sum as f32,
        tally.correct as f32,
        tally.probes as f32,
    ])?;
    comm.all_reduce_sum(&mut t)?;
    let t = ops.download(&t)?;
    *tally = Tally {
        loss_sum: t[0] as f64,
        correct: t[1] as u64,
        probes: t[2] as u64,
    };
    Ok(())
}

/// The rows of each worker's chunk: one contiguous run per worker, so rotary positions are
/// the chunk's start plus the row.
fn spans_for(seq_len: usize, workers: usize, schedule: Schedule) -> Result<Vec<Span>> {
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    Ok(chunk_spans(&chunk_sizes(seq_len, workers, schedule)?))
}

/// The gradients of the mean loss of one sequence, without an update: the check against other
/// implementations (`distflash grads`, tests).
pub struct Gradients {
    pub loss: f64,
    /// In `specs` order.
    pub grads: Vec<Vec<f32>>,
    pub attention_forwards_per_layer: Vec<u32>,
    pub peak_activation_bytes: usize,
}

/// Loss and gradients of `weights` (host, `specs` order) on `tokens` (inputs and, shifted by
/// one, targets) with `workers` workers.
pub fn gradients(
    cfg: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    workers: usize,
    schedule: Schedule,
    policy: Checkpoint,
    timeout: Duration,
) -> Result<Gradients> {
    let ops = Cpu::<f32>::new();
    let run = Threads {
        workers,
        schedule,
        timeout,
    };
    gradients_threads_on(&ops, &CpuBackend, cfg, weights, tokens, run, policy)
}

/// How a threaded run splits its sequence: worker threads, schedule, and how long a worker
/// waits for a message.
#[derive(Clone, Copy, Debug)]
pub struct Threads {
    pub workers: usize,
    pub schedule: Schedule,
    pub timeout: Duration,
}

/// [`gradients`] on any device: `run.workers` threads share `ops`'s device (virtual workers on
/// one GPU), attention distributed by `backend` between them.
pub fn gradients_threads_on<O, B>(
    ops: &O,
    backend: &B,
    cfg: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    run: Threads,
    policy: Checkpoint,
) -> Result<Gradients>
where
    O: Ops<T = B::Tensor>,
    B: ModelEdge + Sync,
    B::Tensor: Buffer,
{
    if tokens.len() < 2 {
        bail!("gradients need at least 2 tokens (one input and its target)");
    }
    let Threads {
        workers,
        schedule,
        timeout,
    } = run;
    let seq = tokens.len() - 1;
    let spans = spans_for(seq, workers, schedule)?;
    let w = upload_weights(ops, cfg, weights)?;
    let sample = Sample {
        tokens: tokens.to_vec(),
        probe: None,
    };
    let results = run_workers(workers, timeout, |rank, comm: &mut LocalComm<B::Tensor>| {
        let mut grads = weights::zeros(ops, cfg)?;
        let mut attn = Distributed::new(backend, comm, cfg.dims(), spans.clone(), schedule)?;
        let mine = own_spans(&spans, workers, schedule, rank);
        let (out, tally) =
            reduced_sequence(ops, cfg, &w, &mut grads, &mut attn, &mine, &sample, policy)?;
        Ok(Gradients {
            loss: tally.loss_sum / seq as f64,
            grads: download_weights(ops, &grads)?,
            attention_forwards_per_layer: out.attention_forwards,
            peak_activation_bytes: out.peak_activation_bytes,
        })
    });
    Ok(collect_results(results)?.swap_remove(0))
}

/// Loss and gradients of `weights` (host, `specs` order) on `tokens` on one device, through the
/// model's device interface `ops` and the attention `attn` (which covers the whole sequence):
/// the single-GPU `distflash grads` with `CudaOps` and `CudaAttention`, or any other device.
pub fn gradients_on<O: Ops>(
    ops: &O,
    attn: &mut impl Attention<O::T>,
    cfg: &Config,
    weights: &[Vec<f32>],
    tokens: &[u32],
    policy: Checkpoint,
) -> Result<Gradients> {
    if tokens.len() < 2 {
        bail!("gradients need at least 2 tokens (one input and its target)");
    }
    let w = upload_weights(ops, cfg, weights)?;
    let mut grads = weights::zeros(ops, cfg)?;
    let out = whole_sequence(ops, cfg, &w, &mut grads, attn, tokens, policy)?;
    let seq = tokens.len() - 1;
    Ok(Gradients {
        loss: out.loss_sum / seq as f64,
        grads: download_weights(ops, &grads)?,
        attention_forwards_per_layer: out.attention_forwards,
        peak_activation_bytes: out.peak_activation_bytes,
    })
}

/// Forward and backward of a whole sequence on one device (`tokens`: the inputs, then the last
/// target); gradients of its mean loss accumulate into `grads`.
fn whole_sequence<O: Ops>(
    ops: &O,
    cfg: &Config,
    w: &Weights<O::T>,
    grads: &mut Weights<O::T>,
    attn: &mut impl Attention<O::T>,
    tokens: &[u32],
    policy: Checkpoint,
) -> Result<crate::model::Outcome> {
    let seq = tokens.len() - 1;
    let chunk = Chunk {
        tokens: &tokens[..seq],
        targets: &tokens[1..],
        positions: &[Span { start: 0, len: seq }],
    };
    forward_backward(ops, cfg, w, grads, attn, chunk, policy, 1.0 / seq as f64)
}

/// Trains as `o` says, with `o.workers` worker threads, calling `on_step` (from rank 0's thread)
/// after every step. Returns the final host weights (`specs` order).
pub fn train(o: &Options, on_step: impl Fn(&StepReport) + Sync) -> Result<Vec<Vec<f32>>> {
    CpuTraining::training(&o.config, o.seq_len, o.workers, o.workers, o.checkpoint)
        .ensure_fits()?;
    train_threads_on(&Cpu::<f32>::new(), &CpuBackend, o, on_step)
}

/// [`train`] on any device: `o.workers` threads share `ops`'s device (virtual workers on one
/// GPU: each holds its own weights, gradients and optimizer state; tensors move between them
/// through the in-process communicator). The device's memory is the caller's to check.
pub fn train_threads_on<O, B>(
    ops: &O,
    backend: &B,
    o: &Options,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>>
where
    O: Ops<T = B::Tensor>,
    B: ModelEdge + Sync,
    B::Tensor: Buffer,
{
    let (spans, start, key) = prepare(o)?;
    let results = run_workers(
        o.workers,
        o.timeout,
        |rank, comm: &mut LocalComm<B::Tensor>| {
            let job = Job {
                o,
                key: &key,
                start: &start,
                spans: &spans,
            };
            worker(ops, backend, &job, rank, comm, &on_step)
        },
    );
    Ok(collect_results(results)?.swap_remove(0))
}

/// Trains as `o` says on this machine's cores as this process's rank of a multi-process job
/// (`comm` connects the ranks; `o.workers` must be its world size). Rank 0 calls `on_step` and
/// saves; every rank returns the final weights, which are the same on all.
pub fn train_rank<C: Communicator<Vec<f32>>>(
    o: &Options,
    comm: &mut C,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>> {
    CpuTraining::training(&o.config, o.seq_len, o.workers, 1, o.checkpoint).ensure_fits()?;
    train_rank_on(&Cpu::<f32>::new(), &CpuBackend, o, comm, on_step)
}

/// [`train_rank`] on any device: the model's layers through `ops`, attention distributed by
/// `backend` over `comm`, gradients all-reduced over `comm` (NCCL for one process per GPU).
/// The device's memory is the caller's to check.
pub fn train_rank_on<O, B, C>(
    ops: &O,
    backend: &B,
    o: &Options,
    comm: &mut C,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>>
where
    O: Ops<T = B::Tensor>,
    B: ModelEdge,
    B::Tensor: Buffer,
    C: Communicator<B::Tensor>,
{
    if comm.world() != o.workers {
        bail!(
            "--workers {} does not match the job's {} ranks: under a launcher every process is one worker",
            o.workers,
            comm.world()
        );
    }
    let (spans, start, key) = prepare(o)?;
    let rank = comm.rank();
    let job = Job {
        o,
        key: &key,
        start: &start,
        spans: &spans,
    };
    worker(ops, backend, &job, rank, comm, &on_step).inspect_err(|e| {
        if !e.chain().any(|c| c.is::<crate::comm::PeerFailed>()) {
            comm.abort(&format!("{e:#}"));
        }
    })
}

/// Everything every rank derives alike before the first step: chunk spans, the starting state
/// (fresh or resumed) and the run's identity for checkpoints; the checks that refuse a run.
fn prepare(o: &Options) -> Result<(Vec<Span>, State, RunKey)> {
    let spans = spans_for(o.seq_len, o.workers, o.schedule)?;
    if o.batch == 0 {
        bail!("--batch must be at least 1");
    }
    o.data.check(o.seq_len, o.config.vocab_size)?;
    if let Some(dir) = &o.save_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the save directory {}", dir.display()))?;
    }
    let start = initial_state(o)?;
    if start.step > o.steps {
        bail!(
            "the checkpoint has already taken {} steps, more than --steps {}",
            start.step,
            o.steps
        );
    }
    Ok((spans, start, run_key(o)))
}

/// Trains on one device as `o` says (`o.workers` must be 1), through its `Ops` with attention
/// `attn` over the whole sequence: one GPU with `CudaOps` and `CudaAttention`. Calls `on_step`
/// after every step and saves like rank 0 of a threaded run. Returns the final host weights.
pub fn train_on<O: Ops>(
    ops: &O,
    attn: &mut impl Attention<O::T>,
    o: &Options,
    on_step: impl Fn(&StepReport) + Sync,
) -> Result<Vec<Vec<f32>>> {
    if o.workers != 1 {
        bail!(
            "training on one device takes --workers 1, not {}",
            o.workers
        );
    }
    let (spans, start, key) = prepare(o)?;
    let alone = |_: &mut _, _: &mut _, _: &mut _| Ok(());
    run_steps(ops, o, &key, &start, &spans, true, attn, alone, &on_step)
}

/// What every worker of a run shares: the options, the run's identity, the starting state and
/// the chunk spans.
struct Job<'a> {
    o: &'a Options,
    key: &'a RunKey,
    start: &'a State,
    spans: &'a [Span],
}

/// One worker's run: its rows of every sequence through `ops`, attention distributed by
/// `backend` over `comm`, gradients summed over `comm` after each step.
fn worker<O, B, C>(
    ops: &O,
    backend: &B,
    job: &Job<'_>,
    rank: usize,
    comm: &mut C,
    on_step: &(impl Fn(&StepReport) + Sync),
) -> Result<Vec<Vec<f32>>>
where
    O: Ops<T = B::Tensor>,
    B: ModelEdge,
    B::Tensor: Buffer,
    C: Communicator<B::Tensor>,
{
    let o = job.o;
    let mut attn = Distributed::new(
        backend,
        comm,
        o.config.dims(),
        job.spans.to_vec(),
        o.schedule,
    )?;
    let reduce =
        |a: &mut Distributed<'_, B, C>, g: &mut _, t: &mut _| all_reduce(ops, a.comm, g, t);
    run_steps(
        ops,
        o,
        job.key,
        job.start,
        &own_spans(job.spans, o.workers, o.schedule, rank),
        rank == 0,
        &mut attn,
        reduce,
        on_step,
    )
}

/// The steps of a run on any device: this worker's rows `mine` of every sequence, `reduce`
/// summing gradients and the tally over the workers (nothing to do for one). The reporter calls
/// `on_step` and saves.
#[allow(clippy::too_many_arguments)]
fn run_steps<O: Ops, A: Attention<O::T>>(
    ops: &O,
    o: &Options,
    key: &RunKey,
    start: &State,
    mine: &[Span],
    reporter: bool,
    attn: &mut A,
    mut reduce: impl FnMut(&mut A, &mut Weights<O::T>, &mut Tally) -> Result<()>,
    on_step: &(impl Fn(&StepReport) + Sync),
) -> Result<Vec<Vec<f32>>> {
    let cfg = &o.config;
    let specs = specs(cfg);
    let mut w = upload_weights(ops, cfg, &start.weights)?;
    let mut m = upload_moments(ops, cfg, &start.m)?;
    let mut v = upload_moments(ops, cfg, &start.v)?;
    let scale = 1.0 / (o.seq_len * o.batch) as f64;
    let mut samples = start.samples;
    // The checkpoint a non-finite step leaves in place (the resumed one, if any) and its step.
    let mut saved = o.resume.as_ref().map(|path| (path.clone(), start.step));
    for step in start.step + 1..=o.steps {
        let began = Instant::now();
        let mut grads = weights::zeros(ops, cfg)?;
        let mut tally = Tally::default();
        let mut last = None;
        for _ in 0..o.batch {
            let sample = o.data.sample(samples, o.seq_len, cfg.vocab_size);
            samples += 1;
            last = Some(accumulate(
                ops,
                cfg,
                &w,
                &mut grads,
                attn,
                mine,
                &sample,
                o.checkpoint,
                scale,
                &mut tally,
            )?);
        }
        reduce(attn, &mut grads, &mut tally)?;
        let norm = sum_squares(ops, &grads)?.sqrt();
        let lr = o.adamw.lr * (step as f64 / o.warmup.max(1) as f64).min(1.0);
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
        };
        // Every worker sees the same all-reduced loss and norm, so all stop at the same step.
        if !loss.is_finite() || !norm.is_finite() {
            if reporter {
                on_step(&report(began.elapsed().as_secs_f64()));
            }
            let what = format!("the loss is {loss} and the gradient norm {norm}");
            return Err(diverged(o, step, saved.as_ref(), &what));
        }
        if o.clip > 0.0 && norm > o.clip {
            for g in grads.tensors_mut() {
                ops.scale(g, o.clip / norm)?;
            }
        }
        let hp = AdamW { lr, ..o.adamw };
        let (ws, gs, ms, vs) = (
            w.tensors_mut(),
            grads.tensors(),
            m.tensors_mut(),
            v.tensors_mut(),
        );
        for ((((p, g), m), v), s) in ws.into_iter().zip(gs).zip(ms).zip(vs).zip(&specs) {
            ops.adamw(p, g, m, v, &hp, step, s.decays())?;
        }
        let saving = o.save_dir.is_some() && (step % o.save_every.max(1) == 0 || step == o.steps);
        if (saving || step == o.steps) && !sum_squares(ops, &w)?.is_finite() {
            let what = "its update made weights non-finite";
            return Err(diverged(o, step, saved.as_ref(), what));
        }
        if !reporter {
            continue;
        }
        on_step(&report(began.elapsed().as_secs_f64()));
        if let Some(dir) = &o.save_dir
            && saving
        {
            let state = State {
                step,
                samples,
                weights: download_weights(ops, &w)?,
                m: download_weights(ops, &m)?,
                v: download_weights(ops, &v)?,
            };
            let path = state::path_in(dir);
            state::save(&path, key, &state)?;
            saved = Some((path, step));
        }
    }
    download_weights(ops, &w)
}

/// Σ x² over every tensor of `w`: the squared gradient norm, and a finiteness test of weights.
fn sum_squares<O: Ops>(ops: &O, w: &Weights<O::T>) -> Result<f64> {
    w.tensors().iter().map(|t| ops.sum_squares(t)).sum()
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
    use crate::comm::Solo;

    /// The single-device path through `Ops` gives the threaded path's gradients bit for bit.
    #[test]
    fn gradients_on_one_device_match_the_workers_path() {
        let cfg = Config::preset("tiny").unwrap();
        let w = initial_weights(&cfg, &Init::Random { seed: 3 }).unwrap();
        let tokens: Vec<u32> = (0..49).map(|i| (i * 37 % 256) as u32).collect();
        let policy = Checkpoint::Remat;
        let timeout = Duration::from_secs(60);
        let threads = gradients(&cfg, &w, &tokens, 1, Schedule::Balanced, policy, timeout).unwrap();
        let mut alone = Solo;
        let spans = vec![Span { start: 0, len: 48 }];
        let mut attn = Distributed::new(
            &CpuBackend,
            &mut alone,
            cfg.dims(),
            spans,
            Schedule::Balanced,
        )
        .unwrap();
        let one = gradients_on(&Cpu::<f32>::new(), &mut attn, &cfg, &w, &tokens, policy).unwrap();
        // The threaded path sums the loss through an f32 all-reduce.
        assert!(
            (one.loss - threads.loss).abs() < 1e-6,
            "{} {}",
            one.loss,
            threads.loss
        );
        assert_eq!(one.grads, threads.grads);
        assert_eq!(one.attention_forwards_per_layer, vec![1, 1]);
        let err = gradients_on(
            &Cpu::<f32>::new(),
            &mut attn,
            &cfg,
            &w[..3],
            &tokens,
            policy,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.starts_with("no weights given for"), "{err}");
    }
}
