//! `distflash bench cpu`: this machine's f32 matrix-multiply rate next to the single-worker
//! attention forward rate, measured in the same run.

use anyhow::Result;
use clap::Subcommand;
use distflash::attn::Dims;
use distflash::bench;
use serde_json::json;

#[derive(Subcommand)]
pub enum Target {
    /// f32 GEMM rate and single-worker causal attention forward rate on all CPU cores.
    Cpu {
        #[arg(long, default_value_t = 4096)]
        seq_len: usize,
        #[arg(long, default_value_t = 8)]
        heads: usize,
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
        /// Side of the square matrices of the GEMM measurement.
        #[arg(long, default_value_t = 1024)]
        matmul_size: usize,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(target: Target) -> Result<()> {
    let Target::Cpu {
        seq_len,
        heads,
        head_dim,
        matmul_size,
        repeats,
        json,
    } = target;
    let dims = Dims {
        batch: 1,
        heads,
        kv_heads: heads,
        head_dim,
    };
    dims.validate()?;
    let gemm = bench::cpu_matmul_gflops(matmul_size, repeats);
    let attention = bench::cpu_attention_forward_gflops(dims, seq_len, repeats);
    let threads = rayon::current_num_threads();
    if json {
        println!(
            "{}",
            json!({
                "threads": threads,
                "matmul_size": matmul_size,
                "matmul_gflops": gemm,
                "seq_len": seq_len, "heads": heads, "head_dim": head_dim,
                "attention_forward_gflops": attention,
                "attention_over_matmul": attention / gemm,
            })
        );
    } else {
        println!("threads                          {threads}");
        println!("f32 matmul {matmul_size}³               {gemm:8.1} GFLOP/s");
        println!(
            "causal attention forward         {attention:8.1} GFLOP/s  (seq {seq_len}, {heads} heads, head dim {head_dim}, 1 worker)"
        );
        println!(
            "attention / matmul               {:8.1} %",
            100.0 * attention / gemm
        );
    }
    Ok(())
}
