//! What `distflash train` shows while it runs.

use distflash::train::StepReport;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the plain-text progress line is printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// What the reporter shows while training: indicatif's bar when stderr is a terminal, else a
/// plain-text line every [`LINE_EVERY`] (logs of a batch job), both ticking during a long step
/// so a run is never silent.
pub enum Progress {
    Bar(ProgressBar),
    Line(Arc<Mutex<Line>>),
}

/// The bar's look, with `tail` after the message.
fn style(tail: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} steps  {{msg}}{tail}"
    ))
    .expect("valid template")
    .progress_chars("=> ")
}

/// The plain-text progress: the latest step's numbers and when a line was last printed.
pub struct Line {
    steps: u64,
    began: Instant,
    printed: Instant,
    step: u64,
    message: String,
    done: bool,
}

impl Line {
    fn print(&mut self) {
        let secs = self.began.elapsed().as_secs_f64();
        // Before this run's first report the step is not known yet (a resumed run starts late).
        match self.step {
            0 => eprintln!("[{secs:.0} s] {}", self.message),
            step => eprintln!("[{secs:.0} s] step {step}/{}  {}", self.steps, self.message),
        }
        self.printed = Instant::now();
    }
}

impl Progress {
    /// Starts showing a run of `steps` steps of `batch` sequences of `seq_len` tokens.
    pub fn start(steps: u64, batch: usize, seq_len: usize) -> Progress {
        let first = format!("first step running: {batch} sequences of {seq_len} tokens");
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(steps);
            bar.set_style(style(""));
            bar.set_message(first);
            bar.enable_steady_tick(Duration::from_secs(1));
            return Progress::Bar(bar);
        }
        let now = Instant::now();
        let line = Arc::new(Mutex::new(Line {
            steps,
            began: now,
            printed: now,
            step: 0,
            message: first,
            done: false,
        }));
        let ticking = line.clone();
        // Prints during a long step too; ends with the run (or the process).
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let mut l = ticking.lock().expect("progress never panics");
                if l.done {
                    break;
                }
                if l.printed.elapsed() >= LINE_EVERY {
                    l.print();
                }
            }
        });
        Progress::Line(line)
    }

    /// Shows step `r`'s numbers.
    pub fn step(&self, r: &StepReport) {
        let recall = if r.recall_total > 0 {
            format!(
                "  recall {:.2}",
                r.recall_correct as f64 / r.recall_total as f64
            )
        } else {
            String::new()
        };
        let message = format!("loss {:.4}{recall}  {:.0} tok/s", r.loss, r.tokens_per_sec);
        match self {
            Progress::Bar(bar) => {
                if bar.position() == 0 {
                    // A rate exists from the first step on; before it the ETA would read 0 s.
                    bar.set_style(style("  ETA {eta}"));
                }
                bar.set_position(r.step);
                bar.set_message(message);
            }
            Progress::Line(line) => {
                let mut l = line.lock().expect("progress never panics");
                (l.step, l.message) = (r.step, message);
                if l.printed.elapsed() >= LINE_EVERY {
                    l.print();
                }
            }
        }
    }

    /// Ends the display with the last numbers.
    pub fn finish(&self) {
        match self {
            Progress::Bar(bar) => bar.finish(),
            Progress::Line(line) => {
                let mut l = line.lock().expect("progress never panics");
                l.done = true;
                l.print();
            }
        }
    }
}
