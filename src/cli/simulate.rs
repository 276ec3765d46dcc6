//! `distflash simulate`: predicted step time for P devices from device rates and link speed,
//! replaying the plans `exec` runs (see `distflash::sim`), under a mask when one is given.

use super::attention::MaskArgs;
use super::values;
use anyhow::Result;
use distflash::plan::Schedule;
use distflash::resources;
use distflash::shape::Dims;
use distflash::sim::{self, Machine, Workload};

#[derive(clap::Args)]
pub struct Args {
    /// Worker counts to predict, e.g. 1,2,4,8,16,32,64.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64", value_parser = values::count::<usize>)]
    workers: Vec<usize>,
    /// `balanced`, `unbalanced`, `zigzag` or `greedy` (see `plan`).
    #[arg(long, default_value = "balanced")]
    schedule: Schedule,
    #[arg(long, default_value_t = 131072, value_parser = values::whole::<usize>)]
    seq_len: usize,
    #[arg(long, default_value_t = 32, value_parser = values::count::<usize>)]
    heads: usize,
    #[arg(long, default_value_t = 32, value_parser = values::count::<usize>)]
    kv_heads: usize,
    #[arg(long, default_value_t = 128, value_parser = values::count::<usize>)]
    head_dim: usize,
    #[arg(long, default_value_t = 1, value_parser = values::count::<usize>)]
    batch: usize,
    /// One device's attention forward rate, TFLOP/s (default: about PyTorch FA2 on H200; docs/architecture.md).
    #[arg(long, default_value_t = 324.0, value_parser = values::positive)]
    fwd_tflops: f64,
    /// One device's attention backward rate, TFLOP/s.
    #[arg(long, default_value_t = 324.0, value_parser = values::positive)]
    bwd_tflops: f64,
    /// Link bandwidth per direction, GB/s (default: about NCCL P2P between two H200s; docs/architecture.md).
    #[arg(long, default_value_t = 300.0, value_parser = values::positive)]
    link_gbps: f64,
    /// Fixed cost per transfer, microseconds.
    #[arg(long, default_value_t = 20.0, value_parser = values::non_negative)]
    latency_us: f64,
    /// Bytes per input value on the wire (2 for bf16).
    #[arg(long, default_value_t = 2, value_parser = values::count::<usize>)]
    input_bytes: usize,
    /// Serialise communication with compute (the paper's ablation).
    #[arg(long)]
    no_overlap: bool,
    /// The mask (`--docs random:N` draws its lengths from seed 0).
    #[command(flatten)]
    mask: MaskArgs,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let machine = Machine {
        forward_flops: args.fwd_tflops * 1e12,
        backward_flops: args.bwd_tflops * 1e12,
        link_bandwidth: args.link_gbps * 1e9,
        link_latency: args.latency_us * 1e-6,
        input_bytes: args.input_bytes,
        overlap: !args.no_overlap,
    };
    let dims = Dims {
        batch: args.batch,
        heads: args.heads,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
    };
    for &workers in &args.workers {
        resources::ensure_split(args.seq_len, workers, args.schedule, false)?;
    }
    let mask = args.mask.mask(args.seq_len, 0)?;
    let predictions = args
        .workers
        .iter()
        .map(|&workers| {
            let w = Workload {
                dims,
                seq: args.seq_len,
                workers,
                schedule: args.schedule,
                mask: mask.clone(),
            };
            sim::predict(&w, &machine)
        })
        .collect::<Result<Vec<_>>>()?;
    if args.json {
        let out = serde_json::json!({ "machine": machine, "schedule": args.schedule,
            "seq_len": args.seq_len, "mask": mask.to_string(), "predictions": predictions });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{} schedule{}, seq {} ({mask}), heads {}/{}, head dim {}: {} / {} TFLOP/s fwd/bwd, {} GB/s links",
        args.schedule,
        if args.no_overlap {
            " without overlap"
        } else {
            ""
        },
        args.seq_len,
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.fwd_tflops,
        args.bwd_tflops,
        args.link_gbps
    );
    println!("workers  forward ms  backward ms  total ms  speedup  exposed comm");
    for p in &predictions {
        println!(
            "{:<8} {:>10.2} {:>12.2} {:>9.2} {:>7.2}x {:>12.1}%",
            p.workers,
            1e3 * p.forward_secs,
            1e3 * p.backward_secs,
            1e3 * (p.forward_secs + p.backward_secs),
            p.speedup_over_one,
            100.0 * p.exposed_comm_fraction
        );
    }
    Ok(())
}
