//! `distflash plan`: print or save a schedule, of full causal attention or (with `--seq-len`
//! and the mask flags) of the blocks a mask leaves visible.

use super::attention::MaskArgs;
use super::outputs::create_output;
use super::values;
use anyhow::{Result, bail};
use clap::ValueEnum;
use distflash::plan::{self, Partition, Pass, Plan, Schedule};
use distflash::resources;
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
    #[arg(long, default_value_t = 8, value_parser = values::whole::<usize>)]
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
    #[arg(long, value_parser = values::whole::<usize>)]
    seq_len: Option<usize>,
    /// The mask (`--docs random:N` draws its lengths from seed 0).
    #[command(flatten)]
    mask: MaskArgs,
}

/// Most workers whose plan is still worth reading: it grows with their square, and 128 already
/// make 0.4 MB of text or a 3 MB picture (1000: 25 MB and 186 MB).
const READABLE_WORKERS: usize = 128;

impl Format {
    /// Bytes the rendering takes per block of chunks (it has a cell or an entry for each),
    /// measured on balanced plans of 512 workers: 6.5 MB of text, 69 MB of JSON, 50 MB of SVG.
    fn bytes_per_block(self) -> f64 {
        match self {
            Format::Text => 25.0,
            Format::Json => 265.0,
            Format::Svg => 192.0,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    // Past the size cap --any-size would not help, so that refusal comes first.
    let per_block = args.format.bytes_per_block();
    let blocks = |workers: usize| (args.schedule.chunks(workers) as f64).powi(2);
    let chunks_per_worker = args.schedule.chunks(1) as f64;
    let most = ((resources::RENDERED_LIMIT / per_block).sqrt() / chunks_per_worker).floor();
    resources::ensure_rendered(
        per_block * blocks(args.workers),
        &format!("the plan of {} workers", args.workers),
        &format!("use --workers {most} or fewer"),
    )?;
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
