//! What `distflash train` shows while it runs.

use distflash::train::StepReport;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most steps over which the summary averages loss and recall at the start and the end, and
/// the bar its recall.
pub(super) const WINDOW: usize = 20;

/// How often the plain-text progress line is printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// What the reporter shows while training: indicatif's bar when stderr is a terminal, else a
/// plain-text line every [`LINE_EVERY`] (logs of a batch job), both ticking during a long step
/// so a run is never silent.
pub struct Progress {
    shown: Shown,
    recall: Mutex<Recall>,
}

/// Where the progress is shown.
enum Shown {
    Bar(ProgressBar),
    Line(Arc<Mutex<Line>>),
}

/// The bar's look, with `tail` after the message. The bar takes what the terminal's width
/// leaves (at 80 columns about a dozen), so the line never wraps.
fn style(tail: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{{elapsed_precise}} [{{wide_bar}}] {{pos}}/{{len}}  {{msg}}{tail}"
    ))
    .expect("valid template")
    .progress_chars("=> ")
}

/// What the recall figure is, said once above the progress: one step's few sequences make it
/// jump (8 probes: 0.00 to 0.38 and back), so it is averaged over the last steps.
fn legend() -> String {
    format!("recall: share of probes answered right over the last {WINDOW} steps (moving average)")
}

/// Recall probes answered right and asked over the last [`WINDOW`] steps.
#[derive(Default)]
struct Recall {
    steps: VecDeque<(u64, u64)>,
}

impl Recall {
    /// Adds a step's probes; the mean of the last [`WINDOW`] steps' (`None` before any probe).
    fn add(&mut self, correct: u64, total: u64) -> Option<f64> {
        self.steps.push_back((correct, total));
        if self.steps.len() > WINDOW {
            self.steps.pop_front();
        }
        let (c, t) = self
            .steps
            .iter()
            .fold((0, 0), |(c, t), &(dc, dt)| (c + dc, t + dt));
        (t > 0).then(|| c as f64 / t as f64)
    }
}

/// The plain-text progress: the latest step's numbers and when a line was last printed.
pub struct Line {
    steps: u64,
    began: Instant,
    printed: Instant,
    step: u64,
    message: String,
    done: bool,
    /// Whether the [`legend`] was printed (with the first line of a step's numbers).
    explained: bool,
}

impl Line {
    fn print(&mut self) {
        let secs = self.began.elapsed().as_secs_f64();
        // Before this run's first report the step is not known yet (a resumed run starts late).
        if self.step > 0 && !std::mem::replace(&mut self.explained, true) {
            eprintln!("{}", legend());
        }
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
        let recall = Mutex::default();
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(steps);
            bar.set_style(style(""));
            bar.println(legend());
            bar.set_message(first);
            bar.enable_steady_tick(Duration::from_secs(1));
            let shown = Shown::Bar(bar);
            return Progress { shown, recall };
        }
        let now = Instant::now();
        let line = Arc::new(Mutex::new(Line {
            steps,
            began: now,
            printed: now,
            step: 0,
            message: first,
            done: false,
            explained: false,
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
        Progress {
            shown: Shown::Line(line),
            recall,
        }
    }

    /// Shows step `r`'s numbers.
    pub fn step(&self, r: &StepReport) {
        let recall = self
            .recall
            .lock()
            .expect("progress never panics")
            .add(r.recall_correct, r.recall_total)
            .map_or(String::new(), |mean| format!("  recall {mean:.2}"));
        let message = format!("loss {:.3}{recall}  {:.0} tok/s", r.loss, r.tokens_per_sec);
        match &self.shown {
            Shown::Bar(bar) => {
                if bar.position() == 0 {
                    // A rate exists from the first step on; before it the ETA would read 0 s.
                    bar.set_style(style("  ETA {eta}"));
                }
                bar.set_position(r.step);
                bar.set_message(message);
            }
            Shown::Line(line) => {
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
        match &self.shown {
            Shown::Bar(bar) => {
                bar.finish();
                // indicatif leaves the cursor at the end of the bar's line: without a newline
                // the summary (on stdout) would start on it.
                eprintln!();
            }
            Shown::Line(line) => {
                let mut l = line.lock().expect("progress never panics");
                l.done = true;
                l.print();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_is_the_mean_of_the_last_steps_probes() {
        let mut r = Recall::default();
        assert_eq!(r.add(0, 0), None);
        assert_eq!(r.add(3, 8), Some(3.0 / 8.0));
        assert_eq!(r.add(0, 8), Some(3.0 / 16.0));
        for _ in 0..WINDOW {
            r.add(8, 8);
        }
        // The first steps have left the window.
        assert_eq!(
            r.add(4, 8),
            Some((8.0 * (WINDOW - 1) as f64 + 4.0) / (8.0 * WINDOW as f64))
        );
    }

    /// A terminal of 80 columns that keeps each write (a drawn line) made on it.
    #[derive(Debug, Default)]
    struct Columns80(Arc<Mutex<Vec<String>>>);

    impl indicatif::TermLike for Columns80 {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push(s.to_string());
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_fits_80_columns() {
        let term = Columns80::default();
        let seen = term.0.clone();
        let target = indicatif::ProgressDrawTarget::term_like(Box::new(term));
        let bar = ProgressBar::with_draw_target(Some(100_000), target);
        bar.set_style(style("  ETA {eta}"));
        bar.set_position(31_234);
        // Wide figures: a loss above 10, a GPU's rate.
        bar.set_message("loss 12.345  recall 0.38  1234567 tok/s");
        bar.finish();
        let writes = seen.lock().unwrap().clone();
        let line = writes.iter().rfind(|l| l.contains("recall")).unwrap();
        assert!(
            line.chars().count() <= 80,
            "{} columns: {line}",
            line.chars().count()
        );
        assert!(line.contains("[==") && line.contains("ETA"), "{line}");
    }
}
