//! Host memory (and the disk space of its saves) a run needs, checked before anything is
//! allocated: a request too large for this machine is refused with the figure and a fix, instead
//! of an allocation abort, the system's out-of-memory kill or a save failing hours in. The
//! estimates err on the side of more, never less; a model step's memory is counted from the
//! code (`train::memory`).

use crate::error::Error;
use crate::model::cost;
use crate::plan::{self, Schedule};
use crate::shape::Dims;
use anyhow::{Result, anyhow, bail};
use std::ffi::CString;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const F32: f64 = 4.0;
const F64: f64 = 8.0;

/// What a process holds beside its tensors: the binary, thread stacks, the allocator's slack.
pub const PROCESS_BYTES: f64 = (64u64 << 20) as f64;

/// Bytes in a MiB, for messages.
const MIB: f64 = (1u64 << 20) as f64;

/// Bytes in a GiB, for messages.
const GIB: f64 = (1u64 << 30) as f64;

/// This machine's available memory in bytes (`MemAvailable` of /proc/meminfo): what a new
/// allocation can take without pushing other processes out. `None` where the figure is not
/// published (not Linux), and then nothing is refused.
pub fn available() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_available(&info)
}

/// Free bytes of the file system that holds `dir` (`statvfs`: the blocks an unprivileged
/// process may still write). `None` where it cannot be read, and then nothing is refused.
pub fn disk_free(dir: &Path) -> Option<f64> {
    let path = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `st` points to writable memory the size of
    // a statvfs; the call only fills it, and it is read only when the call succeeded.
    let st = unsafe {
        if libc::statvfs(path.as_ptr(), st.as_mut_ptr()) != 0 {
            return None;
        }
        st.assume_init()
    };
    Some(st.f_bavail as f64 * st.f_frsize as f64)
}

/// Refuses `what` when it would write more than the disk under `dir` has free (a full disk is
/// no kind of [`Error`]: not the memory the work needs, nor the caller's input).
pub fn ensure_disk(dir: &Path, need: f64, what: &str, fix: &str) -> Result<()> {
    match disk_free(dir).and_then(|free| shortfall(need, free, what, fix)) {
        Some(sentence) => Err(anyhow!(sentence)),
        None => Ok(()),
    }
}

/// `MemAvailable`, in bytes, from the text of /proc/meminfo.
fn parse_available(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

/// Refuses `what` when it needs more than this machine has available: "`what` needs X GiB,
/// Y GiB available: `fix`".
pub fn ensure_fits(need: f64, what: &str, fix: &str) -> Result<()> {
    match available() {
        Some(have) => refuse_above(need, have, what, fix),
        None => Ok(()),
    }
}

/// [`ensure_fits`] against a given amount, so the sentence is testable on any machine: out
/// of memory ([`Error::out_of_memory`]).
pub fn refuse_above(need: f64, have: f64, what: &str, fix: &str) -> Result<()> {
    match shortfall(need, have, what, fix) {
        Some(sentence) => Err(Error::out_of_memory(sentence)),
        None => Ok(()),
    }
}

/// "`what` needs X GiB, Y GiB available: `fix`" when `need` bytes exceed the `have` there are.
fn shortfall(need: f64, have: f64, what: &str, fix: &str) -> Option<String> {
    (need > have).then(|| {
        format!(
            "{what} needs {:.1} GiB, {:.1} GiB available: {fix}",
            need / GIB,
            have / GIB
        )
    })
}

/// Bytes of a schedule's plans (forward and backward, with their transfers) per block of
/// chunks, as each copy holds them, rounded up from what was measured (max RSS): `simulate`
/// over 2048 workers holds 77 per block; `attention` over 256, 281 and 512 CPU workers, each
/// thread with its own copy, 83, 105 and 80 per worker and block.
const PLAN_BYTES_PER_BLOCK: f64 = 112.0;

/// Most bytes the plans of one command may take, every copy together: they grow with the
/// square of the chunks (times the threads holding a copy), and building 2 GiB of them
/// already takes about a minute, so a larger request is refused before it starts.
const PLAN_BUDGET: f64 = 2.0 * GIB;

/// Bytes of the plans `copies` holders of `workers`' schedule keep (each thread worker keeps
/// its own; a rank of a launched job, or a simulation, one).
pub fn plan_bytes(workers: usize, schedule: Schedule, copies: usize) -> f64 {
    let chunks = schedule.chunks(workers) as f64;
    PLAN_BYTES_PER_BLOCK * chunks * chunks * copies.max(1) as f64
}

/// The one rule for splitting a sequence across workers, checked by every command before any
/// work: `seq` tokens must give each of the schedule's chunks one, and the plans of `workers`
/// must fit both the [`PLAN_BUDGET`] and the available memory; a refusal names the most
/// workers that would pass. With `copy_per_worker` every worker is a thread of this process
/// holding its own copy; otherwise the process holds one.
pub fn ensure_split(
    seq: usize,
    workers: usize,
    schedule: Schedule,
    copy_per_worker: bool,
) -> Result<()> {
    let budget = available().map_or(PLAN_BUDGET, |have| have.min(PLAN_BUDGET));
    let need = |w: usize| plan_bytes(w, schedule, if copy_per_worker { w } else { 1 });
    if need(workers) <= budget {
        return plan::chunk_sizes(seq, workers, schedule).map(drop);
    }
    // The need grows with the workers: the most that fit, by bisection.
    let (mut fits, mut over) = (1, workers);
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        if need(mid) <= budget {
            fits = mid
        } else {
            over = mid
        }
    }
    // Name the tighter limit: where the tokens allow fewer workers than the plans, the split's
    // own sentence (which names that count) is the one to give.
    if seq / schedule.chunks(1) <= fits {
        plan::chunk_sizes(seq, workers, schedule)?;
    }
    let holders = match copy_per_worker {
        true => ", each thread worker holding its own",
        false => "",
    };
    bail!(
        "the schedule of {workers} workers needs {:.1} GiB of plans (they grow with the square of the workers{holders}), more than the {:.1} GiB allowed: use --workers {fits} or fewer",
        need(workers) / GIB,
        budget / GIB
    )
}

/// Most bytes a rendered plan may have: a plan grows with the square of its chunks, and one
/// of 64 MiB (1600 workers of text, 500 of JSON) is far past reading and takes seconds.
pub const RENDERED_LIMIT: f64 = 64.0 * MIB;

/// Refuses to render a plan (`what`) of an estimated `bytes`, above [`RENDERED_LIMIT`].
pub fn ensure_rendered(bytes: f64, what: &str, fix: &str) -> Result<()> {
    if bytes > RENDERED_LIMIT {
        bail!(
            "{what} would be about {:.0} MiB, more than the {:.0} MiB a plan is written up to: {fix}",
            bytes / MIB,
            RENDERED_LIMIT / MIB
        );
    }
    Ok(())
}

/// Longest run, in seconds, that is started: beyond a month a request is taken for a typo
/// (a batch or step count with zeros too many) rather than a plan.
const LONGEST_RUN_SECS: f64 = 30.0 * 86400.0;

/// This machine's cores (1 where the system does not say).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Fastest rate (FLOP/s) this machine's CPU could compute at: every core's f32 vector units
/// well run (50 GFLOP/s a core; the tiny model trains at about 5). Above what a run achieves,
/// so estimates made with it are the least a run can take.
pub fn cpu_peak_flops() -> f64 {
    let cores = cores();
    50e9 * cores as f64
}

/// Fastest rate (FLOP/s) one GPU could compute at: 16-bit tensor cores at an H200's dense peak.
pub fn gpu_peak_flops() -> f64 {
    cost::H200_BF16_PEAK_TFLOPS * 1e12
}

/// Refuses `what` when `flops` at `rate` (FLOP/s: [`cpu_peak_flops`], [`gpu_peak_flops`])
/// would take longer than [`LONGEST_RUN_SECS`], naming the least time it would take and the
/// fix.
pub fn ensure_duration(flops: f64, rate: f64, what: &str, fix: &str) -> Result<()> {
    let secs = flops / rate;
    if secs > LONGEST_RUN_SECS {
        bail!(
            "{what} would take at least {} even at {:.0} GFLOP/s, more than the {} a run may: {fix}",
            duration(secs),
            rate / 1e9,
            duration(LONGEST_RUN_SECS)
        );
    }
    Ok(())
}

/// Seconds as people say them: "3.2 hours", "41 days", "2.1 years".
fn duration(secs: f64) -> String {
    match secs {
        s if s < 3600.0 => format!("{:.0} minutes", s / 60.0),
        s if s < 2.0 * 86400.0 => format!("{:.1} hours", s / 3600.0),
        s if s < 2.0 * 365.0 * 86400.0 => format!("{:.0} days", s / 86400.0),
        s => format!("{:.1} years", s / (365.0 * 86400.0)),
    }
}

/// Processes a launch may start per core: ranks beyond the cores take turns, and many times
/// over they no longer answer each other within the timeouts.
const PROCESSES_PER_CORE: usize = 4;

/// Refuses starting `processes` processes on this machine: more than [`PROCESSES_PER_CORE`]
/// per core, or more than its available memory holds at [`PROCESS_BYTES`] each.
pub fn ensure_processes(processes: usize) -> Result<()> {
    let cores = cores();
    let by_memory = available().map_or(usize::MAX, |have| (have / PROCESS_BYTES) as usize);
    let most = (cores * PROCESSES_PER_CORE).min(by_memory);
    if processes > most {
        bail!(
            "{processes} processes are too many for this machine ({cores} cores, {:.1} GiB available, {:.0} MiB a process at least): use --nproc-per-node {most} or fewer",
            available().unwrap_or(0.0) / GIB,
            PROCESS_BYTES / MIB
        );
    }
    Ok(())
}

/// Host bytes of one `distflash attention` process over `seq` tokens of shape `dims`.
///
/// Always: the inputs Q, K, V and dO (f32, `inputs::Inputs`) and the results O, LSE, dQ, dK, dV
/// three times over (each worker's part, the copies `exec::driver::assemble` joins and the
/// joined whole). With `cpu_workers` > 0 the workers are threads of this process on the CPU and
/// also hold their own copy of the inputs and, in flight, up to two chunks of every tensor a
/// step moves per worker: counted as one more copy of inputs and results. A `--device cuda`
/// process (`cpu_workers` = 0) keeps those on the GPU. `check` adds the f64 oracle: its output
/// and LSE, then its per-query-head dQ, dK, dV and the reduced dK, dV, all alive together.
/// Measured (max RSS, 16K tokens on 4 CPU workers; 4K with `--check`) the estimate is 4% and
/// 13% above the peak.
pub fn attention_bytes(dims: &Dims, seq: usize, cpu_workers: usize, check: bool) -> f64 {
    let n = seq as f64;
    let q = (dims.batch * dims.heads * dims.head_dim) as f64 * n;
    let kv = (dims.batch * dims.kv_heads * dims.head_dim) as f64 * n;
    let lse = (dims.batch * dims.heads) as f64 * n;
    let inputs = F32 * (2.0 * q + 2.0 * kv);
    let results = F32 * (2.0 * q + 2.0 * kv + lse);
    let workers = if cpu_workers > 0 {
        inputs + results
    } else {
        0.0
    };
    let oracle = if check {
        F64 * (q + lse) + F64 * (3.0 * q + 2.0 * kv)
    } else {
        0.0
    };
    PROCESS_BYTES + inputs + 3.0 * results + workers + oracle
}

/// Refuses an `attention` run whose [`attention_bytes`] exceed the available memory, naming
/// the longest sequence that would fit (the need grows linearly with it).
pub fn ensure_attention_fits(
    dims: &Dims,
    seq: usize,
    cpu_workers: usize,
    check: bool,
) -> Result<()> {
    let Some(have) = available() else {
        return Ok(());
    };
    let need = attention_bytes(dims, seq, cpu_workers, check);
    // The need grows linearly with the sequence, and with the batch.
    let room = (have - PROCESS_BYTES) / (need - PROCESS_BYTES);
    let longest = (seq as f64 * room).floor();
    let shorten = match longest >= 1.0 {
        true => format!("use --seq-len {longest:.0} or less"),
        // Not one token fits: the batch (or the heads) is what is too large.
        false => format!(
            "use --batch {:.0} or less",
            (dims.batch as f64 * room).floor()
        ),
    };
    let oracle = need - attention_bytes(dims, seq, cpu_workers, false);
    let fix = format!(
        "{shorten}{}",
        if check {
            format!(
                ", or leave out --check (its f64 oracle needs {:.1} GiB of it)",
                oracle / GIB
            )
        } else {
            String::new()
        }
    );
    refuse_above(need, have, &format!("attention over {seq} tokens"), &fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_larger_than_the_free_disk_is_refused_with_the_figures() {
        let free = disk_free(Path::new(".")).expect("statvfs works on Linux");
        assert!(free > 0.0);
        assert!(ensure_disk(Path::new("."), 1.0, "saving", "fix").is_ok());
        let e = ensure_disk(Path::new("."), 1e30, "saving", "free some space")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("saving needs "), "{e}");
        assert!(e.ends_with("GiB available: free some space"), "{e}");
        assert_eq!(disk_free(Path::new("/no/such/dir")), None);
    }

    #[test]
    fn a_split_names_the_tighter_of_the_tokens_and_the_plans() {
        assert!(ensure_split(1024, 8, Schedule::Balanced, true).is_ok());
        // Too few tokens for the chunks: the split's own sentence.
        let e = ensure_split(128, 100_000, Schedule::Balanced, false).unwrap_err();
        assert!(e.to_string().contains("use --workers 128 or fewer"), "{e}");
        // Tokens enough, plans not: the most workers whose plans fit.
        let e = ensure_split(1 << 30, 100_000, Schedule::Zigzag, false)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("the schedule of 100000 workers needs"), "{e}");
        let most: usize = e
            .rsplit("--workers ")
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            plan_bytes(most, Schedule::Zigzag, 1) <= PLAN_BUDGET,
            "{most}"
        );
        assert!(plan_bytes(most + 1, Schedule::Zigzag, 1) > available().unwrap().min(PLAN_BUDGET));
    }

    #[test]
    fn durations_are_said_in_the_unit_people_use() {
        assert_eq!(duration(600.0), "10 minutes");
        assert_eq!(duration(5.0 * 3600.0), "5.0 hours");
        assert_eq!(duration(40.0 * 86400.0), "40 days");
        assert_eq!(duration(3.0 * 365.0 * 86400.0), "3.0 years");
        assert!(ensure_duration(1e12, 1e12, "this", "do less").is_ok());
        let e = ensure_duration(1e20, 1e12, "this", "do less")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "this would take at least 3.2 years even at 1000 GFLOP/s, more than the 30 days a run may: do less"
        );
    }

    #[test]
    fn a_launch_is_bounded_by_the_cores() {
        let cores = std::thread::available_parallelism().unwrap().get();
        assert!(ensure_processes(cores).is_ok());
        let e = ensure_processes(cores * PROCESSES_PER_CORE + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("processes are too many for this machine"), "{e}");
    }

    fn dims() -> Dims {
        Dims {
            batch: 2,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
        }
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   24192740 kB\n";
        assert_eq!(parse_available(text), Some(24192740.0 * 1024.0));
        assert_eq!(parse_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn the_refusal_names_both_figures_and_the_fix() {
        let err = refuse_above(3.0 * GIB, 2.0 * GIB, "this", "do less")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "this needs 3.0 GiB, 2.0 GiB available: do less");
        assert!(refuse_above(GIB, 2.0 * GIB, "this", "do less").is_ok());
    }

    #[test]
    fn too_little_memory_is_out_of_memory_and_too_little_disk_no_kind() {
        use crate::error::{ErrorKind, kind_of};
        let e = refuse_above(3.0 * GIB, 2.0 * GIB, "this", "do less").unwrap_err();
        assert_eq!(kind_of(&e), Some(ErrorKind::OutOfMemory));
        if available().is_some() {
            let e = ensure_fits(1e30, "this", "do less").unwrap_err();
            assert_eq!(kind_of(&e), Some(ErrorKind::OutOfMemory));
            assert!(format!("{e:#}").starts_with("this needs "), "{e:#}");
        }
        let e = ensure_disk(Path::new("."), 1e30, "saving", "free some space").unwrap_err();
        assert_eq!(kind_of(&e), None);
    }

    #[test]
    fn attention_counts_at_least_its_inputs_and_results() {
        let (d, seq) = (dims(), 1000);
        let tensors = 4 * (2 * d.q_len(seq) + 2 * d.kv_len(seq)) * 2 + 4 * d.batch * d.heads * seq;
        assert!(attention_bytes(&d, seq, 0, false) >= tensors as f64);
        // The CPU workers' copies and the oracle only add.
        assert!(attention_bytes(&d, seq, 4, false) > attention_bytes(&d, seq, 0, false));
        let oracle = 8 * (d.q_len(seq) + 2 * d.kv_len(seq));
        assert!(
            attention_bytes(&d, seq, 4, true) - attention_bytes(&d, seq, 4, false) >= oracle as f64
        );
        // Linear in the sequence, beside the process's own.
        let grown = |n| attention_bytes(&d, n, 4, true) - PROCESS_BYTES;
        let ratio = grown(2 * seq) / grown(seq);
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
    }
}
