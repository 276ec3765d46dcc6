//! `distflash train`: trains a LLaMA-family model whose attention is distflash, with a progress
//! bar (or JSON lines), metrics and a loss-curve SVG in the save directory, checkpoints and
//! resume.

mod metrics;
mod progress;

use super::values;
use anyhow::{Context, Result, bail};
use distflash::model::config::Config;
use distflash::model::cost;
use distflash::model::ops::AdamW;
use distflash::model::weights::{self, specs};
use distflash::model::{Checkpoint, Offload};
use distflash::resources;
use distflash::runtime::Device;
use distflash::tensor_file::{self, Named};
use distflash::train::data::Data;
use distflash::train::documents::{Documents, Packing, Positions};
use distflash::train::lr::Decay;
use distflash::train::memory::{HostState, MemoryCheck};
use distflash::train::step_plan::{Purpose, whole_layers_said, whole_mlp_said};
use distflash::train::tokens::TokenFile;
use distflash::train::{self, Eval, Init, Options, StepReport, state, svg};
use metrics::Metrics;
use progress::{Progress, WINDOW};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// Where the model's shape and first weights come from (shared with `grads`).
#[derive(clap::Args)]
pub struct ModelArgs {
    /// A built-in model shape: tiny, llama2-7b, llama-7b-gqa, llama-7b-33h.
    #[arg(long)]
    preset: Option<String>,
    /// A Hugging Face config.json to take the shape from.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A Hugging Face model directory (config.json and model.safetensors) to start from.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Seed of random weights (when not --init-from).
    #[arg(long, default_value_t = 0, value_parser = values::whole::<u64>)]
    seed: u64,
}

impl ModelArgs {
    /// The config and where weights come from: the named model; when none is named, the one the
    /// checkpoint being resumed (`resume`) was saved with, else `tiny`.
    pub fn resolve(&self, resume: Option<&Path>) -> Result<(Config, Init)> {
        let named = [
            self.preset.is_some(),
            self.config.is_some(),
            self.init_from.is_some(),
        ];
        if named.iter().filter(|&&n| n).count() > 1 {
            bail!("--preset, --config and --init-from each name a model: give one");
        }
        if let Some(dir) = &self.init_from {
            let config = Config::from_file(&dir.join("config.json"))?;
            return Ok((config, Init::HuggingFace(dir.clone())));
        }
        let config = match (&self.config, &self.preset, resume) {
            (Some(path), _, _) => Config::from_file(path)?,
            (None, None, Some(checkpoint)) => state::saved_config(&state::file_at(checkpoint))?,
            (None, preset, _) => Config::preset(preset.as_deref().unwrap_or("tiny"))?,
        };
        Ok((config, Init::Random { seed: self.seed }))
    }

    /// How messages name the model: the preset, or the file or directory it came from (the
    /// resumed checkpoint's, when none is named).
    pub fn name(&self, resume: Option<&Path>) -> String {
        match (&self.preset, &self.config, &self.init_from, resume) {
            (Some(p), _, _, _) => p.clone(),
            (_, Some(path), _, _) | (_, _, Some(path), _) => path.display().to_string(),
            (_, _, _, Some(checkpoint)) => format!("the model of {}", checkpoint.display()),
            _ => "tiny".into(),
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Train on this text instead of the synthetic recall task: with --tokenizer, JSON lines (a
    /// `text` field per document) or a plain text file (one document), tokenized once into a
    /// token file beside it; without, one token per byte.
    #[arg(long)]
    data: Option<PathBuf>,
    /// A Hugging Face tokenizer.json that tokenizes --data (its ids must fit the model's
    /// vocabulary).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Held-out text, read like --data (tokenized by --tokenizer): its loss and perplexity are
    /// reported every --eval-every steps and at the last.
    #[arg(long)]
    eval_data: Option<PathBuf>,
    #[arg(long, default_value_t = 50, value_parser = values::count::<u64>)]
    eval_every: u64,
    /// Held-out sequences of --seq-len tokens each evaluation averages over (each costs about a
    /// training sequence's forward and backward).
    #[arg(long, default_value_t = 8, value_parser = values::count::<u64>)]
    eval_sequences: u64,
    /// The end-of-document token (a token or an id) put after every document [default: the
    /// tokenizer's `</s>`, `<|end_of_text|>`, `<|endoftext|>`, `<eos>` or `<|im_end|>`].
    #[arg(long)]
    eos_token: Option<String>,
    #[command(flatten)]
    packing: PackingArgs,
    /// Seed of the data (synthetic sequences, window offsets of bytes, the order of token
    /// windows).
    #[arg(long, default_value_t = 0, value_parser = values::whole::<u64>)]
    data_seed: u64,
    /// Tokens per sequence, split across the workers.
    #[arg(long, default_value_t = 128, value_parser = values::whole::<usize>)]
    seq_len: usize,
    /// Sequences per optimizer step.
    #[arg(long, default_value_t = 8, value_parser = values::count::<usize>)]
    batch: usize,
    /// Workers the sequence is split across [default: WORLD_SIZE under a launcher, else 4].
    #[arg(long, value_parser = values::whole::<usize>)]
    workers: Option<usize>,
    #[command(flatten)]
    place: super::args::DeviceArgs,
    #[command(flatten)]
    step: super::step::StepArgs,
    /// Optimizer steps to reach (a resumed run counts its saved steps).
    #[arg(long, default_value_t = 1000, value_parser = values::count::<u64>)]
    steps: u64,
    /// Peak learning rate [default: 5e-3 for models under 100M parameters, such as `tiny`;
    /// larger models must name theirs: such rates make them diverge, and fine-tuning one usually
    /// takes 1e-5 to 3e-4].
    #[arg(long, value_parser = values::non_negative)]
    lr: Option<f64>,
    /// Steps of linear warm-up from 0 to the peak rate.
    #[arg(long, default_value_t = 20, value_parser = values::whole::<u64>)]
    warmup: u64,
    /// After the warm-up: constant (the peak), linear or cosine (from the peak down to --min-lr
    /// at --steps).
    #[arg(long, value_enum, default_value = "constant")]
    decay: Decay,
    /// Where linear and cosine decay end.
    #[arg(long, default_value_t = 0.0, value_parser = values::non_negative)]
    min_lr: f64,
    #[arg(long, default_value_t = 0.0, value_parser = values::non_negative)]
    weight_decay: f64,
    /// Largest global gradient norm (0: no clipping).
    #[arg(long, default_value_t = 1.0, value_parser = values::non_negative)]
    clip: f64,
    /// Directory for checkpoints (state.safetensors), metrics.jsonl, loss.svg and the final
    /// model (config.json, model.safetensors, loadable by transformers and --init-from).
    #[arg(long)]
    save_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 50, value_parser = values::count::<u64>)]
    save_every: u64,
    /// Continue from a checkpoint file or a save directory, with the model it was saved with (when no --preset or --config names one).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Start afresh in a --save-dir that holds a run, replacing its checkpoint, metrics and final
    /// model, removed as training starts (without it such a directory is refused: --resume
    /// continues it).
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// Print one JSON line per step and a JSON summary instead of the progress bar.
    #[arg(long)]
    json: bool,
    /// Start on the GPU even when the estimated peak exceeds the free memory (the estimate adds a
    /// 1.5 GiB allowance to the step's tensors; a run that really does not fit then fails at an
    /// allocation).
    #[arg(long)]
    ignore_memory_estimate: bool,
}

/// How the documents packed into a sequence are treated (shared with `grads`).
#[derive(clap::Args)]
pub struct PackingArgs {
    /// packed: full causal attention across the documents packed into a sequence; separate:
    /// each token attends only within its own document, the documents ended by the
    /// end-of-document token (which belongs to the document it ends; a synthetic sequence is
    /// one document). On the CPU and on GPUs alike.
    #[arg(long, value_enum, default_value = "packed")]
    documents: Documents,
    /// continue: rotary positions count along the sequence; restart: from 0 at every
    /// document's first token, as if each document were its own sequence (needs --documents
    /// separate).
    #[arg(long, value_enum, default_value = "continue")]
    positions: Positions,
}

impl PackingArgs {
    pub fn packing(&self) -> Packing {
        Packing {
            documents: self.documents,
            positions: self.positions,
        }
    }
}

/// Parameters from which `--lr` must be given: the default [`SMALL_MODEL_LR`] suits the small
/// models only.
const LR_DEFAULT_BELOW_PARAMETERS: usize = 100_000_000;

/// The default peak learning rate of a small model. The main job (`tiny` on the recall task)
/// finds its recall circuit at steps 190–502 over seeds 0–6 at 5e-3, where 1e-2 found it within
/// 1000 steps for one seed of four (AdamW's steps at 1e-2 are too coarse to settle the filler's
/// loss below ~0.22, and the recall circuit forms late or not at all): bench/train-cpu.md.
const SMALL_MODEL_LR: f64 = 5e-3;

/// The peak learning rate: `--lr`, or [`SMALL_MODEL_LR`] for a small model; a large one must
/// name its own (measured on an H200: a Llama-3-8B shape at 1e-2 went from loss 12.6 to 42.9 in
/// three steps).
fn peak_lr(asked: Option<f64>, config: &Config, model: &str) -> Result<f64> {
    if let Some(lr) = asked {
        return Ok(lr);
    }
    let parameters = weights::parameters(config);
    if parameters < LR_DEFAULT_BELOW_PARAMETERS {
        return Ok(SMALL_MODEL_LR);
    }
    bail!(
        "{model} has {:.2}B parameters: give its learning rate with --lr (the default {SMALL_MODEL_LR} suits models under 100M parameters and makes larger ones diverge; fine-tuning usually takes 1e-5 to 3e-4)",
        parameters as f64 / 1e9
    )
}

/// The files of a run in its save directory that a fresh run there would replace: its
/// checkpoint, its metrics and its final model.
fn run_files(dir: &Path) -> [PathBuf; 3] {
    [
        state::path_in(dir),
        dir.join("metrics.jsonl"),
        dir.join("model.safetensors"),
    ]
}

/// Refuses a fresh run's `--save-dir` that holds another run's [`run_files`].
fn ensure_no_run(dir: &Path) -> Result<()> {
    let held: Vec<String> = run_files(dir)
        .iter()
        .filter(|f| f.exists())
        .filter_map(|f| Some(f.file_name()?.to_string_lossy().into_owned()))
        .collect();
    if !held.is_empty() {
        bail!(
            "--save-dir {} holds a run ({}): continue it with --resume {0}, replace it with --overwrite, or choose another directory",
            dir.display(),
            held.join(", ")
        );
    }
    Ok(())
}

/// Removes the [`run_files`] of the run `--overwrite` replaces, so that none of the old run
/// (a checkpoint to resume by mistake) outlives the start of the new one.
fn remove_run(dir: &Path) -> Result<()> {
    for file in run_files(dir).iter().filter(|f| f.exists()) {
        std::fs::remove_file(file).map_err(|e| super::outputs::cannot_write(file, e))?;
    }
    Ok(())
}

/// Refuses a `--resume` that names no checkpoint, saying why: a save directory whose run
/// stopped before its first save holds none yet.
fn ensure_checkpoint(resume: &Path) -> Result<()> {
    let file = state::file_at(resume);
    if file.exists() {
        return Ok(());
    }
    if resume.is_dir() {
        bail!(
            "{} holds no checkpoint yet (its run stopped before the first save, which comes every --save-every steps): start afresh with --save-dir {0} --overwrite instead of --resume",
            resume.display()
        );
    }
    bail!(
        "there is no checkpoint at {}: give --resume a run's save directory or its checkpoint file",
        resume.display()
    )
}

#[derive(Serialize)]
struct Summary {
    device: Device,
    /// Steps taken in all, the resumed ones included.
    steps: u64,
    /// The checkpoint's step this run resumed from (none when it started afresh).
    resumed_from: Option<u64>,
    /// Steps this run took.
    steps_this_run: u64,
    /// Seconds from the command's start to its first step's (config, weights, device, data).
    startup_secs: Option<f64>,
    wall_secs: f64,
    workers: usize,
    seq_len: usize,
    batch: usize,
    checkpoint: Checkpoint,
    /// The last layers that kept every activation (`--whole-layers`, as decided).
    whole_layers: usize,
    /// Whether the MLP ran over whole rows (the memory check's choice beside the whole layers).
    whole_mlp: bool,
    offload: Offload,
    loss_first: f64,
    loss_last: f64,
    /// Recall accuracy over the last steps' sequences, each scored before it was trained on.
    recall_accuracy_last: Option<f64>,
    attention_forwards_per_layer: Vec<u32>,
    peak_activation_bytes: usize,
    tokens_per_sec: f64,
    /// The held-out loss of the first and the last evaluation (`--eval-data`).
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_loss_first: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_loss_last: Option<f64>,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0), |(s, n), x| (s + x, n + 1));
    sum / n.max(1) as f64
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let rt = args.place.runtime(args.workers, |device| match device {
        Device::Cpu => 4,
        Device::Cuda => 1,
    })?;
    let workers = rt.workers();
    if args.resume.is_some() && args.model.init_from.is_some() {
        bail!(
            "--resume continues a checkpoint, which holds its own weights, and --init-from would start from a model's: give one of them"
        );
    }
    if let Some(resume) = &args.resume {
        ensure_checkpoint(resume)?;
    }
    // Under a launcher rank 0 reports and writes files; the others only train.
    let reporter = rt.is_reporter();
    if let Some(dir) = &args.save_dir
        && reporter
    {
        super::outputs::ensure_writable_dir(dir)?;
        if args.resume.is_none() && !args.overwrite {
            ensure_no_run(dir)?;
        }
    }
    let (config, init) = args.model.resolve(args.resume.as_deref())?;
    super::checks::ensure_split(args.seq_len, args.step.schedule(), &rt)?;
    let plan = args
        .step
        .plan(Purpose::Train, workers, &config, rt.device, reporter)?;
    let lr = peak_lr(args.lr, &config, &args.model.name(args.resume.as_deref()))?;
    if args.min_lr > lr {
        bail!(
            "--min-lr {} is above the peak learning rate {lr}, where the decay would climb instead: give a --min-lr of {lr} or less",
            args.min_lr
        );
    }
    let text = |path: &PathBuf| match &args.tokenizer {
        Some(tokenizer) => Ok(Data::Tokens {
            file: TokenFile::open(path, tokenizer, args.eos_token.as_deref())?,
            seed: args.data_seed,
        }),
        None => Data::bytes(path, args.data_seed),
    };
    let data = match (&args.data, &args.tokenizer) {
        (Some(path), _) => text(path)?,
        (None, Some(_)) => bail!("--tokenizer tokenizes --data: give the text to train on"),
        (None, None) => Data::Synthetic {
            seed: args.data_seed,
        },
    };
    let eval = match &args.eval_data {
        Some(path) => Some(Eval {
            data: text(path)?,
            every: args.eval_every,
            sequences: args.eval_sequences,
        }),
        None => None,
    };
    let memory = MemoryCheck {
        config: config.clone(),
        model: args.model.name(args.resume.as_deref()),
        seq: args.seq_len,
        plan,
        // Without a save nothing of the state comes to the host (`Options::final_weights`).
        host_state: match args.save_dir {
            Some(_) => HostState::WeightsAndMoments,
            None => HostState::None,
        },
        ignore_estimate: args.ignore_memory_estimate,
    };
    // This machine's memory (a GPU's is checked once it is opened), then the time.
    memory.check(&rt, None)?;
    // Every sequence trained, and every held-out one evaluated (each about a training
    // sequence's cost), at every --eval-every steps and the last.
    let evaluated = match &args.eval_data {
        Some(_) => (args.steps / args.eval_every + 1) * args.eval_sequences,
        None => 0,
    };
    let sequences = args.steps as f64 * args.batch as f64 + evaluated as f64;
    resources::ensure_duration(
        sequences * cost::step_flops(&config, args.seq_len),
        super::checks::peak_flops(&rt),
        &format!(
            "training {} steps of {} sequences of {} tokens{}",
            args.steps,
            args.batch,
            args.seq_len,
            match evaluated {
                0 => String::new(),
                n => format!(" with {n} held-out sequences"),
            }
        ),
        match evaluated {
            0 => "lower --steps, --batch or --seq-len",
            _ => "lower --steps, --batch, --seq-len or --eval-sequences, or raise --eval-every",
        },
    )?;
    let opts = Options {
        config,
        init,
        data,
        seq_len: args.seq_len,
        batch: args.batch,
        plan,
        steps: args.steps,
        adamw: AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: args.weight_decay,
        },
        warmup: args.warmup,
        decay: args.decay,
        min_lr: args.min_lr,
        clip: args.clip,
        save_dir: args.save_dir.clone(),
        save_every: args.save_every,
        resume: args.resume.clone(),
        eval,
        packing: args.packing.packing(),
        final_weights: args.save_dir.is_some(),
    };
    let metrics = match &args.save_dir {
        Some(dir) if reporter => {
            if args.overwrite {
                remove_run(dir)?;
            }
            Some(Metrics::open(dir, args.resume.is_some())?)
        }
        _ => None,
    };
    let progress =
        (!args.json && reporter).then(|| Progress::start(args.steps, args.batch, args.seq_len));
    let reports = Mutex::new((Vec::<StepReport>::new(), metrics));
    let began = Instant::now();
    // From the command's start to its first step's: config, weights, device, data.
    let startup = Mutex::new(None::<f64>);
    let on_step = |r: &StepReport| {
        let line = serde_json::to_string(r).expect("reports serialize");
        let mut guard = reports.lock().expect("reporting never panics");
        let (list, file) = &mut *guard;
        if list.is_empty() {
            let to_first = started.elapsed().as_secs_f64() - r.step_secs;
            *startup.lock().expect("reporting never panics") = Some(to_first);
        }
        list.push(r.clone());
        if let Some(f) = file {
            f.record(r.step, &line);
        }
        match &progress {
            Some(p) => p.step(r),
            None => println!("{line}"),
        }
        // A diverged run stops after this report: draw its curve now, NaN shown.
        if !r.loss.is_finite()
            && let Some(dir) = &args.save_dir
        {
            let _ = write_curve(dir, list);
        }
    };
    let Some(trained) = train::train(&opts, &memory, &rt, on_step)? else {
        return Ok(()); // a rank other than 0: rank 0 reports and saves
    };
    // The plan as it ran: whole layers and `--offload auto` decided by the device's memory.
    let (plan, weights) = (trained.plan, trained.weights);
    if let Some(p) = &progress {
        p.finish();
    }
    let wall = began.elapsed().as_secs_f64();
    let (list, _) = reports.into_inner().expect("reporting never panics");
    if let (Some(dir), Some(weights)) = (&args.save_dir, &weights) {
        save_model(dir, &opts.config, weights)?;
        write_curve(dir, &list)?;
    }
    let Some(last) = list.last() else {
        println!(
            "nothing to do: the checkpoint is already at step {0}, the --steps {0} asked for; raise --steps to train further",
            args.steps
        );
        return Ok(());
    };
    let resumed_from = args.resume.as_ref().map(|_| list[0].step - 1);
    // Disjoint windows, so a short run still compares its start with its end.
    let window = (list.len() / 2).clamp(1, WINDOW);
    let tail = &list[list.len() - window..];
    let probes: u64 = tail.iter().map(|r| r.recall_total).sum();
    let summary = Summary {
        device: rt.device,
        steps: last.step,
        resumed_from,
        steps_this_run: list.len() as u64,
        startup_secs: startup.into_inner().expect("reporting never panics"),
        wall_secs: wall,
        workers,
        seq_len: args.seq_len,
        batch: args.batch,
        checkpoint: plan.checkpoint(),
        whole_layers: plan.whole_layers(),
        whole_mlp: plan.keep().whole_mlp,
        offload: plan.offload(),
        loss_first: mean(list.iter().take(window).map(|r| r.loss)),
        loss_last: mean(tail.iter().map(|r| r.loss)),
        recall_accuracy_last: (probes > 0)
            .then(|| tail.iter().map(|r| r.recall_correct).sum::<u64>() as f64 / probes as f64),
        attention_forwards_per_layer: last.attention_forwards_per_layer.clone(),
        peak_activation_bytes: last.peak_activation_bytes,
        tokens_per_sec: mean(list.iter().map(|r| r.tokens_per_sec)),
        eval_loss_first: list.iter().find_map(|r| r.eval_loss),
        eval_loss_last: list.iter().rev().find_map(|r| r.eval_loss),
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary, window);
    }
    Ok(())
}

fn print_summary(s: &Summary, window: usize) {
    let resumed = match s.resumed_from {
        Some(from) => format!(" (resumed at step {from}, now at step {})", s.steps),
        None => String::new(),
    };
    let offload = match s.offload.any() {
        true => format!(", offload {}", s.offload),
        false => String::new(),
    };
    println!(
        "trained {} steps{resumed} in {:.1} s: {} workers, {} tokens/sequence, {} sequences/step, checkpoint {}{}{}{offload}",
        s.steps_this_run,
        s.wall_secs,
        s.workers,
        s.seq_len,
        s.batch,
        s.checkpoint,
        whole_layers_said(s.whole_layers),
        whole_mlp_said(s.whole_mlp)
    );
    if let Some(secs) = s.startup_secs {
        println!("start-up (to the first step) {secs:.1} s");
    }
    println!(
        "loss {:.4} -> {:.4} (mean of the first and last {window} steps), {:.0} tokens/s",
        s.loss_first, s.loss_last, s.tokens_per_sec
    );
    if let (Some(first), Some(last)) = (s.eval_loss_first, s.eval_loss_last) {
        println!(
            "held-out loss {first:.4} -> {last:.4} (perplexity {:.1} -> {:.1})",
            first.exp(),
            last.exp()
        );
    }
    if let Some(acc) = s.recall_accuracy_last {
        println!(
            "recall accuracy {:.1}% over the last {window} steps' sequences (chance: {:.1}%)",
            100.0 * acc,
            100.0 / train::data::VALUES as f64
        );
    }
    println!(
        "attention forwards per layer per sequence: {:?}; peak activation memory per worker {:.2} MiB",
        s.attention_forwards_per_layer,
        s.peak_activation_bytes as f64 / (1 << 20) as f64
    );
}

/// Writes the trained weights as a Hugging Face model directory.
pub fn save_model(dir: &Path, config: &Config, weights: &[Vec<f32>]) -> Result<()> {
    let specs = specs(config);
    let named: Vec<Named<'_>> = specs
        .iter()
        .zip(weights)
        .map(|(s, w)| Named {
            name: &s.name,
            shape: s.shape.clone(),
            data: w,
        })
        .collect();
    // transformers loads only safetensors files that say they hold PyTorch tensors.
    tensor_file::write(&dir.join("model.safetensors"), &named, &[("format", "pt")])?;
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config.to_json())?)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn write_curve(dir: &Path, list: &[StepReport]) -> Result<()> {
    // A resumed run appends to metrics.jsonl; draw the whole run from it.
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let mut points: Vec<(u64, f64)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // A non-finite loss is written as null: keep it as NaN for the curve to show.
        .filter_map(|v| Some((v["step"].as_u64()?, v["loss"].as_f64().unwrap_or(f64::NAN))))
        .collect();
    if points.is_empty() {
        points = list.iter().map(|r| (r.step, r.loss)).collect();
    }
    points.sort_by_key(|p| p.0);
    points.dedup_by_key(|p| p.0);
    let (steps, loss): (Vec<u64>, Vec<f64>) = points.into_iter().unzip();
    let path = dir.join("loss.svg");
    std::fs::write(&path, svg::loss_curve("training loss", &steps, &loss))
        .with_context(|| format!("cannot write {}", path.display()))
}
