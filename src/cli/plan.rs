//! `distflash plan`: print or save a schedule, of full causal attention or (with `--seq-len`
//! and the mask flags) of the blocks a mask leaves visible.

use super::attention::MaskArgs;
use super::create_output;
use anyhow::{Result, bail};
use clap::ValueEnum;
use distflash::plan::{self, Partition, Pass, Plan, Schedule};
use std::io::Write;
use std::path::PathBuf;

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Text,
    Json,
    Svg,
}

#[derive(clap::Args)]
pub struct Args {
    /// Number of workers (one sequence chunk each).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// `balanced` (DistFlashAttn), `unbalanced`, `zigzag` (a head and a tail chunk per worker) or
    /// `greedy` (blocks assigned by their real cost under the mask).
    #[arg(long, default_value = "balanced")]
    schedule: Schedule,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Write here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the plan of more than 128 workers too (megabytes, no longer readable).
    #[arg(long)]
    any_size: bool,
    /// Tokens in the sequence: needed with a mask, whose blocks are cut from real chunks.
    #[arg(long)]
    seq_len: Option<usize>,
    /// The mask (`--docs random:N` draws its lengths from seed 0).
    #[command(flatten)]
    mask: MaskArgs,
}

/// Most workers whose plan is still worth reading: it grows with their square, and 128 already
/// make 0.4 MB of text or a 3 MB picture (1000: 25 MB and 186 MB).
const READABLE_WORKERS: usize = 128;

pub fn run(args: Args) -> Result<()> {
    if args.workers > READABLE_WORKERS && !args.any_size {
        bail!(
            "the plan of {} workers is too large to read (it grows with the square of the workers; {READABLE_WORKERS} already make 0.4 MB of text): use --workers {READABLE_WORKERS} or fewer, or add --any-size to write it anyway",
            args.workers
        );
    }
    let out = args.out.as_deref().map(create_output).transpose()?;
    let (forward, backward) = match args.seq_len {
        Some(seq) => {
            let mask = args.mask.mask(seq, 0)?;
            let part = Partition::masked(seq, args.workers, args.schedule, &mask)?;
            (
                part.plan(Pass::Forward).clone(),
                part.plan(Pass::Backward).clone(),
            )
        }
        None if args.mask.given() => {
            bail!(
                "a mask cuts blocks from real chunks: give --seq-len with --doc-lens, --docs, --window or --global"
            )
        }
        None => (
            Plan::new(args.workers, args.schedule, Pass::Forward)?,
            Plan::new(args.workers, args.schedule, Pass::Backward)?,
        ),
    };
    let text = match args.format {
        Format::Text => plan::to_text(&forward),
        Format::Json => serde_json::to_string_pretty(&plan::to_json(&forward, &backward))? + "\n",
        Format::Svg => plan::to_svg(&forward),
    };
    match out {
        Some(mut file) => file.write_all(text.as_bytes())?,
        None => print!("{text}"),
    }
    Ok(())
}
