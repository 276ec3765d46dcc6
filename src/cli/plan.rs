//! `distflash plan`: print or save a schedule.

use super::create_output;
use anyhow::{Result, bail};
use clap::ValueEnum;
use distflash::plan::{self, Pass, Plan, Schedule};
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
    /// `balanced` (DistFlashAttn), `unbalanced` or `zigzag` (a head and a tail chunk per worker).
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
    let forward = Plan::new(args.workers, args.schedule, Pass::Forward)?;
    let text = match args.format {
        Format::Text => plan::to_text(&forward),
        Format::Json => {
            let backward = Plan::new(args.workers, args.schedule, Pass::Backward)?;
            serde_json::to_string_pretty(&plan::to_json(&forward, &backward))? + "\n"
        }
        Format::Svg => plan::to_svg(&forward),
    };
    match out {
        Some(mut file) => file.write_all(text.as_bytes())?,
        None => print!("{text}"),
    }
    Ok(())
}
