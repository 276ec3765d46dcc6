//! What the integration tests share: the binary, a scratch folder, a training run's trajectory,
//! and the small training job several of them run (each test crate uses its part).
#![allow(dead_code)]

use distflash::model::config::Config;
use distflash::model::ops::AdamW;
use distflash::runtime::{Device, Runtime};
use distflash::train::data::Data;
use distflash::train::documents::Packing;
use distflash::train::lr::Decay;
use distflash::train::memory::{HostState, MemoryCheck};
use distflash::train::step_plan::Shard;
use distflash::train::step_plan::{Asked, Purpose, StepPlan};
use distflash::train::{Init, Options, StepReport};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Runs the `distflash` binary with `args`.
pub fn distflash(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distflash"))
        .args(args)
        .output()
        .expect("binary runs")
}

/// An empty scratch folder of the test suite `suite`, unique to this process.
pub fn temp_dir(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("distflash-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Per-step losses and gradient norms of a `train --json` run, without the timings.
pub fn trajectory(out: &Output) -> Vec<(f64, f64)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("step").is_some() && v.get("loss").is_some())
        .map(|v| {
            (
                v["loss"].as_f64().unwrap(),
                v["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The training plan of `asked` over `workers` CPU worker threads.
pub fn plan(asked: Asked, workers: usize, config: &Config) -> StepPlan {
    StepPlan::resolve(asked, Purpose::Train, workers, config, Device::Cpu)
        .unwrap()
        .plan
}

/// `asked` with sharding `shard`.
pub fn sharded(shard: Shard) -> Asked {
    Asked {
        shard: Some(shard),
        ..Asked::default()
    }
}

/// A narrowed `tiny` model trained on the synthetic task on `workers` threads, unsharded,
/// saving every 2 steps when `save_dir` is given.
pub fn tiny_options(
    workers: usize,
    steps: u64,
    save_dir: Option<&Path>,
    resume: Option<&Path>,
) -> Options {
    tiny_options_with(sharded(Shard::None), workers, steps, save_dir, resume)
}

/// [`tiny_options`] with the step's choices `asked`.
pub fn tiny_options_with(
    asked: Asked,
    workers: usize,
    steps: u64,
    save_dir: Option<&Path>,
    resume: Option<&Path>,
) -> Options {
    let mut config = Config::preset("tiny").unwrap();
    config.hidden_size = 32;
    config.head_dim = 8;
    config.intermediate_size = 48;
    Options {
        plan: plan(asked, workers, &config),
        config,
        init: Init::Random { seed: 1 },
        data: Data::Synthetic { seed: 2 },
        seq_len: 48,
        batch: 2,
        steps,
        adamw: AdamW {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        warmup: 2,
        decay: Decay::Constant,
        min_lr: 0.0,
        clip: 1.0,
        save_dir: save_dir.map(Path::to_path_buf),
        save_every: 2,
        resume: resume.map(Path::to_path_buf),
        eval: None,
        packing: Packing::packed(),
        final_weights: true,
    }
}

/// `train::train` of `o` on the CPU worker threads its plan is for (one: alone, no
/// communicator), returning the final weights.
pub fn train_on_threads(
    o: &Options,
    on_step: impl Fn(&StepReport) + Sync,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let w = train_returning(o, on_step)?;
    Ok(w.expect("final_weights asks for the weights"))
}

/// `train::train` of `o` on the CPU worker threads its plan is for, returning what it returns
/// to the reporter: the final weights if `o.final_weights` asks for them.
pub fn train_returning(
    o: &Options,
    on_step: impl Fn(&StepReport) + Sync,
) -> anyhow::Result<Option<Vec<Vec<f32>>>> {
    let memory = MemoryCheck {
        config: o.config.clone(),
        model: "tiny".into(),
        seq: o.seq_len,
        plan: o.plan,
        host_state: HostState::Weights,
        ignore_estimate: false,
    };
    let rt = Runtime::cpu_threads(o.plan.workers(), Duration::from_secs(60));
    let trained = distflash::train::train(o, &memory, &rt, on_step)?;
    Ok(trained.expect("worker threads report").weights)
}

/// AdamW in f64, written from the formula (bias-corrected moments, decoupled decay), on `p`
/// from `g` at 1-based `step`: the reference the devices' updates are held to over many steps.
pub fn adamw_f64(
    p: &mut [f64],
    g: &[f32],
    (m, v): (&mut [f64], &mut [f64]),
    hp: &AdamW,
    step: u64,
) {
    let c1 = 1.0 - hp.beta1.powi(step as i32);
    let c2 = 1.0 - hp.beta2.powi(step as i32);
    for i in 0..p.len() {
        let g = f64::from(g[i]);
        m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * g;
        v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * g * g;
        let update = (m[i] / c1) / ((v[i] / c2).sqrt() + hp.eps);
        p[i] -= hp.lr * (update + hp.weight_decay * p[i]);
    }
}
