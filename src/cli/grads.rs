//! `distflash grads`: the loss and every parameter gradient of one sequence, without an update,
//! written as safetensors under Hugging Face parameter names, so another implementation (the
//! `bench/peers/hf_parity.py` script) can compare them with its own.

use super::gpu::GpuRun;
use super::train::{Device, ModelArgs};
use anyhow::{Context, Result, bail};
use distflash::backend::cuda::InputDtype;
use distflash::model::Checkpoint;
use distflash::model::weights::specs;
use distflash::plan::Schedule;
use distflash::tensor_file::{self, Named};
use distflash::train;
use std::path::PathBuf;
use std::time::Duration;

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
    #[arg(long, default_value_t = 4)]
    workers: usize,
    #[arg(long, default_value = "balanced")]
    schedule: Schedule,
    #[arg(long, default_value = "remat")]
    checkpoint: Checkpoint,
    /// cpu (f32, --workers threads) or cuda (one GPU, --dtype).
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// 16-bit format of weights and activations with --device cuda.
    #[arg(long, default_value = "bf16")]
    dtype: InputDtype,
    /// Start on the GPU even when the estimated peak exceeds the free memory (the estimate adds a
    /// 1.5 GiB allowance to the step's tensors; a run that really does not fit then fails at an
    /// allocation).
    #[arg(long)]
    ignore_memory_estimate: bool,
}

pub fn run(args: Args) -> Result<()> {
    let (config, init) = args.model.resolve()?;
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
    let g = match args.device {
        Device::Cpu => {
            let seq = tokens.len().saturating_sub(1);
            distflash::resources::CpuTraining::gradients(
                &config,
                seq,
                args.workers,
                args.workers,
                args.checkpoint,
            )
            .ensure_fits()?;
            let host = train::initial_weights(&config, &init)?;
            train::gradients(
                &config,
                &host,
                &tokens,
                args.workers,
                args.schedule,
                args.checkpoint,
                Duration::from_secs(600),
            )?
        }
        Device::Cuda => {
            let (backend, _) = GpuRun {
                gpu: 0,
                dtype: args.dtype,
                config: &config,
                model: &args.model.name(),
                seq: tokens.len().saturating_sub(1),
                ranks: None,
                checkpoint: args.checkpoint,
                optimizer: false,
                model_copies: args.workers,
                ignore_estimate: args.ignore_memory_estimate,
            }
            .open()?;
            let host = train::initial_weights(&config, &init)?;
            let run = train::Threads {
                workers: args.workers,
                schedule: args.schedule,
                timeout: Duration::from_secs(600),
            };
            super::gpu::gradients(backend, &config, &host, &tokens, run, args.checkpoint)?
        }
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
            "workers": args.workers,
            "device": args.device,
            "checkpoint": args.checkpoint,
            "attention_forwards_per_layer": g.attention_forwards_per_layer,
            "peak_activation_bytes": g.peak_activation_bytes,
        })
    );
    Ok(())
}
