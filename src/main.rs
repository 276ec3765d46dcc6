//! The `distflash` command line. Each subcommand lives in `cli/`; this file only parses and
//! reports errors as one sentence with a non-zero exit, never a backtrace.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a print to a closed pipe (`distflash plan | head -1`) panics.
    // The default disposition ends the program quietly there, as every Unix tool does.
    // SAFETY: called first in main, before any thread starts; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Under a launcher every rank prints; say which one speaks.
            match std::env::var("RANK") {
                Ok(rank) => eprintln!("error (rank {rank}): {e:#}"),
                Err(_) => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
