//! `distflash plan`: print or save a schedule.

use super::create_output;
use anyhow::Result;
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
}

pub fn run(args: Args) -> Result<()> {
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
