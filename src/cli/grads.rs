//! `distflash grads`: the loss and every parameter gradient of one sequence, without an update,
//! written as safetensors under Hugging Face parameter names, so another implementation (the
//! `bench/peers/hf_parity.py` script) can compare them with its own.

use super::train::ModelArgs;
use super::values;
use anyhow::{Context, Result, bail};
use distflash::model::weights::specs;
use distflash::tensor_file::{self, Named};
use distflash::train;
use distflash::train::documents::Documents;
use distflash::train::memory::{HostState, MemoryCheck};
use distflash::train::step_plan::Purpose;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// A JSON array of N + 1 token ids: N inputs, each followed by its target.
    #[arg(long)]
    tokens: PathBuf,
    /// Where to write the gradients (safetensors, named like the weights).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 4, value_parser = values::whole::<usize>)]
    workers: usize,
    /// The step's flags, as `train` takes them (no optimizer runs here: `--offload optimizer`
    /// is refused, and `--shard optimizer` all-reduces as `none` does; sharded gradients are
    /// gathered whole for the file).
    #[command(flatten)]
    step: super::step::StepArgs,
    #[command(flatten)]
    packing: super::train::PackingArgs,
    /// The id that ends each document of --tokens (and belongs to it), for --documents
    /// separate.
    #[arg(long, value_parser = values::whole::<u32>)]
    eos_token: Option<u32>,
    /// With --device cuda, several workers are virtual workers sharing the GPU.
    #[command(flatten)]
    place: super::args::DeviceArgs,
    /// Start on the GPU even when the estimated peak exceeds the free memory (the estimate adds a
    /// 1.5 GiB allowance to the step's tensors; a run that really does not fit then fails at an
    /// allocation).
    #[arg(long)]
    ignore_memory_estimate: bool,
}

pub fn run(args: Args) -> Result<()> {
    let rt = args.place.runtime(Some(args.workers), |_| 4)?;
    if rt.is_reporter() {
        super::outputs::ensure_writable(&args.out)?;
    }
    let (config, init) = args.model.resolve(None)?;
    let plan = args.step.plan(
        Purpose::Gradients,
        rt.workers(),
        &config,
        rt.device,
        rt.is_reporter(),
    )?;
    let text = std::fs::read_to_string(&args.tokens)
        .with_context(|| format!("cannot read {}", args.tokens.display()))?;
    let tokens: Vec<u32> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array of token ids", args.tokens.display()))?;
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= config.vocab_size) {
        bail!(
            "token {t} is outside the vocabulary of {}",
            config.vocab_size
        );
    }
    let memory = MemoryCheck {
        config: config.clone(),
        model: args.model.name(None),
        seq: tokens.len().saturating_sub(1),
        plan,
        host_state: HostState::Weights,
        ignore_estimate: args.ignore_memory_estimate,
    };
    super::checks::ensure_split(memory.seq, plan.schedule(), &rt)?;
    // The memory check before the weights are made: a 7B model's alone fill gigabytes.
    memory.check(&rt, None)?;
    let host = train::initial_weights(&config, &init)?;
    let packing = args.packing.packing();
    if packing.documents == Documents::Separate && args.eos_token.is_none() {
        bail!(
            "--documents separate masks attention at the end-of-document tokens: name their id with --eos-token"
        );
    }
    let documents = train::SequenceDocuments {
        eos: args.eos_token,
        packing,
    };
    let Some(g) = train::gradients(&config, &host, &tokens, &plan, &documents, &memory, &rt)?
    else {
        return Ok(()); // a rank other than 0: rank 0 writes the gradients
    };
    let specs = specs(&config);
    let named: Vec<Named<'_>> = specs
        .iter()
        .zip(&g.grads)
        .map(|(s, d)| Named {
            name: &s.name,
            shape: s.shape.clone(),
            data: d,
        })
        .collect();
    tensor_file::write(&args.out, &named, &[("format", "pt")])?;
    println!(
        "{}",
        serde_json::json!({
            "loss": g.loss,
            "tokens": tokens.len() - 1,
            "workers": rt.workers(),
            "device": rt.device,
            "checkpoint": plan.checkpoint(),
            "attention_forwards_per_layer": g.attention_forwards_per_layer,
            "peak_activation_bytes": g.peak_activation_bytes,
            "pass_bytes_sent": g.pass_bytes_sent,
        })
    );
    Ok(())
}
