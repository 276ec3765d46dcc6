//! Bad input, as a new user types it, through the binary: each case ends with one sentence that
//! names the problem and the fix and a non-zero exit (or, where right, a quiet success). None
//! allocates much or waits long: memory is refused before allocation, waits are short.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distflash");

/// A small, fast training run: the tiny model on 32 tokens, one sequence a step.
const TINY: [&str; 8] = [
    "train",
    "--seq-len",
    "32",
    "--batch",
    "1",
    "--workers",
    "2",
    "--json",
];

fn distflash(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("distflash-bad-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The run failed with exit code `code` and one line on stderr holding every one of `words`.
fn fails(out: &Output, code: i32, words: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    for w in words {
        assert!(err.contains(w), "'{w}' not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one sentence expected: {err}"
    );
    err
}

/// A clap refusal: exit 2, clap's "invalid value" line naming the flag, and our reason.
fn refused_flag(args: &[&str], flag: &str, reason: &str) {
    let out = distflash(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.contains(flag) && first.contains(reason),
        "{args:?}: {err}"
    );
}

#[test]
fn invalid_hyper_parameters_are_refused_up_front() {
    let reason = "is not a finite number of 0 or more";
    refused_flag(&["train", "--lr", "nan"], "--lr", reason);
    refused_flag(&["train", "--lr=-1"], "--lr", reason);
    refused_flag(
        &["train", "--weight-decay", "nan"],
        "--weight-decay",
        reason,
    );
    refused_flag(&["train", "--clip=-1"], "--clip", reason);
    refused_flag(
        &["train", "--whole-layers", "some"],
        "--whole-layers",
        "'some' is not a number of layers: use auto or a whole number such as 4",
    );
    let out = distflash(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--whole-layers",
        "99",
    ]);
    fails(
        &out,
        1,
        &[
            "--whole-layers 99 is more layers than the model's",
            "give at most",
        ],
    );
    refused_flag(&["train", "--lr", "inf"], "--lr", reason);
    let count = "is not a whole number of 1 or more";
    refused_flag(&["train", "--save-every", "0"], "--save-every", count);
    refused_flag(&["train", "--steps", "0"], "--steps", count);
}

/// The f32 values of every tensor of a safetensors file.
fn tensors(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .iter()
        .flat_map(|(_, v)| {
            v.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_diverging_run_stops_and_keeps_the_last_good_checkpoint() {
    let dir = temp_dir("diverge");
    let d = dir.to_str().unwrap();
    let out = Command::new(BIN)
        .args(TINY)
        .args(["--lr", "1e30", "--steps", "20", "--save-every", "1"])
        .args(["--save-dir", d])
        .output()
        .unwrap();
    let err = fails(
        &out,
        1,
        &["training diverged at step", "lower --lr (now 1e30)"],
    );
    // The step that went non-finite was reported (loss null) and is the last line.
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    let step = last["step"].as_u64().unwrap();
    assert!(err.contains(&format!("at step {step}:")), "{err}");
    assert!(step < 20, "stopped at {step}");
    let finite = |v: &serde_json::Value| v.as_f64().is_some_and(f64::is_finite);
    assert!(
        !finite(&last["loss"]) || !finite(&last["grad_norm"]),
        "{last}"
    );
    // The checkpoint kept is the step before, and holds only finite numbers.
    let state = dir.join("state.safetensors");
    assert!(step > 1, "diverged at once: no checkpoint to keep");
    assert!(
        err.contains(&format!(
            "{} of step {}, is kept",
            state.display(),
            step - 1
        )),
        "{err}"
    );
    assert!(tensors(&state).iter().all(|x| x.is_finite()));
    // No final model of non-finite weights; the curve says what happened.
    assert!(!dir.join("model.safetensors").exists());
    let svg = std::fs::read_to_string(dir.join("loss.svg")).unwrap();
    assert!(svg.contains(&format!("the first at step {step}")), "{svg}");
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count() as u64, step);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn requests_too_large_for_memory_are_refused_before_allocating() {
    let started = Instant::now();
    // A machine with this much free would really run the ten-million-token cases.
    let roomy = distflash::resources::available().is_some_and(|b| b > 200.0 * (1u64 << 30) as f64);
    for args in [
        &["attention", "--seq-len", "100000000"][..],
        &["attention", "--seq-len", "100000000", "--device", "cuda"],
        &["attention", "--seq-len", "10000000"],
        &["attention", "--seq-len", "10000000", "--check"],
    ] {
        if roomy && args[2] == "10000000" {
            eprintln!("skipped {args:?}: this machine has room for it");
            continue;
        }
        let out = distflash(args);
        fails(
            &out,
            1,
            &[
                "attention over",
                "tokens needs",
                "GiB available: use --seq-len",
            ],
        );
    }
    let out = distflash(&["train", "--seq-len", "100000000", "--steps", "1"]);
    fails(
        &out,
        1,
        &[
            "training a model of 0.13M parameters on the CPU over 100000000 tokens",
            "GiB available: use --seq-len",
        ],
    );
    let out = distflash(&[
        "train",
        "--preset",
        "llama2-7b",
        "--lr",
        "1e-5",
        "--workers",
        "64",
        "--steps",
        "1",
    ]);
    fails(&out, 1, &["GiB available: use a smaller model"]);
    // Refused before anything was allocated: no time for gigabytes of random numbers.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// Starts `args` with stdout a pipe whose reading end closes at once; returns the output.
fn with_closed_stdout(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_stdout_ends_the_program_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [&["plan", "--workers", "64"][..], &TINY[..]] {
        let out = with_closed_stdout(args);
        assert_eq!(stderr(&out), "", "{args:?}");
        // Ended by SIGPIPE like any Unix tool (or done before it noticed).
        assert!(
            out.status.signal() == Some(libc::SIGPIPE) || out.status.success(),
            "{args:?}: {:?}",
            out.status
        );
    }
}

#[test]
fn an_empty_sequence_is_named_as_such() {
    for cmd in ["attention", "train"] {
        let out = distflash(&[cmd, "--seq-len", "0"]);
        fails(
            &out,
            1,
            &["the sequence is empty (0 tokens): give --seq-len of at least"],
        );
    }
}

/// Trains `TINY` for `steps` into `dir`, resuming from `resume` when given.
fn train(dir: &Path, steps: &str, resume: Option<&Path>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(&TINY[..7])
        .args(["--steps", steps, "--save-every", "1", "--save-dir"])
        .arg(dir);
    if let Some(r) = resume {
        cmd.arg("--resume").arg(r);
    }
    cmd.output().unwrap()
}

fn metric_steps(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn resuming_says_where_and_counts_each_step_once() {
    let dir = temp_dir("resume");
    let first = train(&dir, "2", None);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stdout(&first).starts_with("trained 2 steps in"),
        "{}",
        stdout(&first)
    );
    // Not a terminal: the plain progress line, at least at the end.
    assert!(stderr(&first).contains("step 2/2"), "{}", stderr(&first));
    let at_two = dir.join("at-two.safetensors");
    std::fs::copy(dir.join("state.safetensors"), &at_two).unwrap();
    let second = train(&dir, "4", Some(&dir));
    assert!(
        stdout(&second).starts_with("trained 2 steps (resumed at step 2, now at step 4) in"),
        "{}",
        stdout(&second)
    );
    // Going back to step 2 re-runs steps 3 and 4: their old lines go.
    let third = train(&dir, "4", Some(&at_two));
    assert!(third.status.success(), "{}", stderr(&third));
    assert_eq!(metric_steps(&dir), [1, 2, 3, 4]);
    // Already there: said, and nothing else happens.
    let again = train(&dir, "4", Some(&dir));
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stdout(&again).starts_with("nothing to do: the checkpoint is already at step 4"),
        "{}",
        stdout(&again)
    );
    assert_eq!(metric_steps(&dir), [1, 2, 3, 4]);
    // The JSON summary says it too.
    let json = Command::new(BIN)
        .args(TINY)
        .args(["--steps", "5", "--resume"])
        .arg(&dir)
        .output()
        .unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(stdout(&json).lines().last().unwrap()).unwrap();
    assert_eq!(
        (
            &summary["steps"],
            &summary["resumed_from"],
            &summary["steps_this_run"]
        ),
        (&5.into(), &4.into(), &1.into())
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn resume_refuses_a_second_source_of_weights_and_names_a_different_model() {
    let dir = temp_dir("other-model");
    assert!(train(&dir, "1", None).status.success());
    let d = dir.to_str().unwrap();
    let out = distflash(&["train", "--resume", d, "--init-from", d]);
    fails(
        &out,
        1,
        &["--resume continues a checkpoint", "give one of them"],
    );
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = 1.into();
    let other = dir.join("other.json");
    std::fs::write(&other, config.to_string()).unwrap();
    let out = Command::new(BIN)
        .args(&TINY[..7])
        .args(["--steps", "2", "--config"])
        .arg(&other)
        .args(["--resume", d])
        .output()
        .unwrap();
    let err = fails(
        &out,
        1,
        &[
            "holds a different model than this run's (num_hidden_layers 2 saved, 1 now)",
            "resume with the model it was saved with",
        ],
    );
    assert!(!err.contains("Config {"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A checkpoint holds its model: resuming without naming one continues with it (a fine-tuned
/// `--init-from` model, say), where falling back to `tiny` would refuse the checkpoint.
#[test]
fn resume_without_a_model_continues_the_checkpoints() {
    let dir = temp_dir("resume-own-model");
    assert!(train(&dir, "1", None).status.success());
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = 1.into();
    let one_layer = dir.join("one-layer.json");
    std::fs::write(&one_layer, config.to_string()).unwrap();
    let other = dir.join("one-layer");
    let run = |steps: &str, model: &[&str], resume: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(&TINY[..7])
            .args(["--steps", steps, "--save-dir"])
            .arg(&other)
            .args(model);
        if resume {
            cmd.arg("--resume").arg(&other);
        }
        cmd.output().unwrap()
    };
    let first = run("1", &["--config", one_layer.to_str().unwrap()], false);
    assert!(first.status.success(), "{}", stderr(&first));
    let resumed = run("2", &[], true);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(
        stdout(&resumed).starts_with("trained 1 steps (resumed at step 1, now at step 2) in"),
        "{}",
        stdout(&resumed)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn launch_variables_and_addresses_are_named() {
    let out = Command::new(BIN)
        .args(["train"])
        .env("RANK", "0")
        .output()
        .unwrap();
    fails(&out, 1, &["WORLD_SIZE is not set but RANK is:"]);
    // 192.0.2.1 is a documentation address, on no machine.
    let out = distflash(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "192.0.2.1",
        "--",
        "train",
    ]);
    fails(
        &out,
        1,
        &[
            "--master-addr 192.0.2.1 cannot be listened on here",
            "such as 127.0.0.1",
        ],
    );
    let out = Command::new(BIN)
        .args(["train", "--steps", "1"])
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "192.0.2.1"),
            ("MASTER_PORT", "29500"),
        ])
        .output()
        .unwrap();
    fails(
        &out,
        1,
        &[
            "rank 0 cannot listen on MASTER_ADDR=192.0.2.1",
            "give an address of rank 0's own machine",
        ],
    );
}

#[test]
fn a_foreign_listener_on_the_port_is_named_within_the_timeout() {
    let foreign = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = foreign.local_addr().unwrap().port().to_string();
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["train", "--steps", "1", "--rendezvous-timeout", "2"])
        .envs([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
        ])
        .env("MASTER_PORT", &port)
        .output()
        .unwrap();
    fails(
        &out,
        1,
        &[
            &format!("MASTER_PORT={port} did not answer as distflash rank 0 within 2 s"),
            "choose another MASTER_PORT",
        ],
    );
    // Once the timeout, not twice.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn launch_checks_the_command_once_before_starting_ranks() {
    let out = distflash(&["launch", "--nproc-per-node", "3", "--", "nonsense"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.matches("unrecognized subcommand 'nonsense'").count(),
        1,
        "{err}"
    );
}

/// The pids of the processes whose parent is `parent` and whose environment has `var`.
fn children_with(parent: u32, var: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The parent is the second field after the parenthesised command.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if ppid != Some(&parent.to_string()) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|v| v == var.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn the_launcher_names_the_rank_that_was_killed() {
    let mut launcher = Command::new(BIN)
        .args(["launch", "--nproc-per-node", "2", "--grace-secs", "1", "--"])
        .args(&TINY[..5])
        .args(["--steps", "100000", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let victim = loop {
        // Both ranks training: rank 1 is past the rendezvous.
        std::thread::sleep(Duration::from_millis(300));
        if let Some(&pid) = children_with(launcher.id(), "RANK=1").first() {
            std::thread::sleep(Duration::from_millis(700));
            break pid;
        }
        assert!(Instant::now() < deadline, "rank 1 never started");
    };
    let killed = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = launcher.wait().unwrap();
    let mut err = String::new();
    launcher
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: rank 1 failed (signal: 9"), "{err}");
}

#[test]
fn a_plan_too_large_to_read_is_refused_with_the_way_to_get_it() {
    let out = distflash(&["plan", "--workers", "1000"]);
    fails(
        &out,
        1,
        &[
            "the plan of 1000 workers is too large to read",
            "use --workers 128 or fewer, or add --any-size",
        ],
    );
    assert!(stdout(&out).is_empty());
    let out = distflash(&["plan", "--workers", "130", "--any-size"]);
    assert!(out.status.success() && !out.stdout.is_empty());
}

#[test]
fn a_long_first_step_is_not_silent_when_stderr_is_not_a_terminal() {
    let mut child = Command::new(BIN)
        .args([
            "train",
            "--batch",
            "100000000",
            "--steps",
            "1",
            "--seq-len",
            "16",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(7500));
    child.kill().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    assert!(
        err.contains("s] first step running: 100000000 sequences of 16 tokens"),
        "{err}"
    );
}

/// Each command with an oversize request: refused at once with one sentence, before any of it
/// is allocated.
fn refused_at_once(args: &[&str], words: &[&str]) -> String {
    let started = Instant::now();
    let out = distflash(args);
    let err = fails(&out, 1, words);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{args:?} took {:?}",
        started.elapsed()
    );
    err
}

#[test]
fn oversize_worker_counts_and_plans_are_refused_up_front() {
    let dir = temp_dir("plan-out");
    let out = dir.join("f");
    refused_at_once(
        &[
            "plan",
            "--workers",
            "100000",
            "--any-size",
            "--out",
            out.to_str().unwrap(),
        ],
        &[
            "the plan of 100000 workers would be about",
            "MiB a plan is written up to: use --workers 1638 or fewer",
        ],
    );
    assert!(!out.exists(), "nothing written");
    // Without --any-size too: adding it would not help.
    for args in [
        &["plan", "--workers", "2000", "--any-size"][..],
        &["plan", "--workers", "2000"],
    ] {
        refused_at_once(args, &["use --workers 1638 or fewer"]);
    }
    // train's rule: the sequence gives every chunk a token (128 tokens: 128 workers at most).
    refused_at_once(
        &["train", "--workers", "100000"],
        &[
            "is too short for 100000 workers",
            "use --workers 128 or fewer",
        ],
    );
    // Its 2048 tokens would allow 2048 workers, but not their plans, one copy a thread.
    refused_at_once(
        &["attention", "--workers", "100000"],
        &[
            "the schedule of 100000 workers needs",
            "each thread worker holding its own",
            "use --workers",
        ],
    );
    // Enough tokens, but the plans would not fit.
    refused_at_once(
        &["simulate", "--workers", "100000"],
        &[
            "the schedule of 100000 workers needs",
            "GiB of plans",
            "use --workers",
        ],
    );
    refused_at_once(
        &["attention", "--seq-len", "100000000", "--workers", "600"],
        &["each thread worker holding its own", "use --workers"],
    );
    for args in [
        &["bench", "cpu", "--matmul-size", "1000000"][..],
        &["bench", "cpu", "--seq-len", "100000000"],
    ] {
        refused_at_once(
            args,
            &[
                "bench cpu (a ",
                "GiB available: use a smaller --matmul-size or --seq-len",
            ],
        );
    }
    refused_at_once(
        &["bench", "train", "--estimate", "--seq-len", "0"],
        &["the sequence is empty (0 tokens): give --seq-len of at least 1"],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn work_that_would_take_more_than_a_month_is_refused_with_the_estimate() {
    refused_at_once(
        &["train", "--batch", "100000000", "--steps", "100000"],
        &[
            "training 100000 steps of 100000000 sequences of 128 tokens would take at least",
            "more than the 30 days a run may: lower --steps, --batch or --seq-len",
        ],
    );
    let dir = temp_dir("eval-work");
    let text = dir.join("text.txt");
    std::fs::write(&text, "a few words of held-out text").unwrap();
    let t = text.to_str().unwrap();
    refused_at_once(
        &[
            "train",
            "--data",
            t,
            "--eval-data",
            t,
            "--seq-len",
            "16",
            "--eval-sequences",
            "100000000000",
        ],
        &[
            "held-out sequences would take at least",
            "or --eval-sequences, or raise --eval-every",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
    refused_at_once(
        &["attention", "--repeats", "100000000", "--seq-len", "100000"],
        &["would take at least", "lower --repeats or --seq-len"],
    );
    refused_at_once(
        &[
            "bench",
            "train",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--seq-len",
            "65536",
            "--repeats",
            "100000000",
        ],
        &[
            "would take at least",
            "lower --repeats, --warmup or --seq-len",
        ],
    );
}

#[test]
fn a_cpu_gradient_too_large_for_memory_is_refused_before_the_weights_exist() {
    let dir = temp_dir("grads-7b");
    let tokens = dir.join("t.json");
    std::fs::write(&tokens, "[1, 2, 3, 4, 5, 6, 7, 8, 9]").unwrap();
    let roomy = distflash::resources::available().is_some_and(|b| b > 200.0 * (1u64 << 30) as f64);
    if !roomy {
        refused_at_once(
            &[
                "grads",
                "--preset",
                "llama2-7b",
                "--tokens",
                tokens.to_str().unwrap(),
                "--out",
                dir.join("g.safetensors").to_str().unwrap(),
            ],
            &[
                "a gradient step of a model of 6.74B parameters on the CPU",
                "GiB available: use a smaller model",
            ],
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_launch_of_more_processes_than_the_machine_holds_is_refused() {
    refused_at_once(
        &["launch", "--nproc-per-node", "100000", "--", "attention"],
        &[
            "100000 processes are too many for this machine",
            "use --nproc-per-node",
        ],
    );
}

#[test]
fn nonsense_numbers_are_refused_where_parsed() {
    let finite = "is not a finite number of 0 or more";
    let above = "is not a finite number above 0";
    let whole = "is not a whole number of 0 or more";
    let count = "is not a whole number of 1 or more";
    for (args, flag, reason) in [
        (
            &["simulate", "--link-gbps", "nan"][..],
            "--link-gbps",
            above,
        ),
        (&["simulate", "--link-gbps", "0"], "--link-gbps", above),
        (&["simulate", "--fwd-tflops", "-2"], "--fwd-tflops", above),
        (&["simulate", "--latency-us", "inf"], "--latency-us", finite),
        (&["simulate", "--input-bytes", "0"], "--input-bytes", count),
        (&["simulate", "--workers", "4,-2"], "--workers", count),
        // Negative numbers reach the flag's parser instead of being taken for flags.
        (&["train", "--lr", "-1"], "--lr", finite),
        (&["train", "--workers", "-3"], "--workers", whole),
        (&["train", "--batch", "0"], "--batch", count),
        (&["attention", "--seq-len", "-5"], "--seq-len", whole),
        (&["attention", "--repeats", "0"], "--repeats", count),
        (&["plan", "--workers", "-1"], "--workers", whole),
        (&["bench", "cpu", "--repeats", "0"], "--repeats", count),
        (
            &["launch", "--nproc-per-node", "-4", "--", "plan"],
            "--nproc-per-node",
            whole,
        ),
        (&["grads", "--workers", "-2"], "--workers", whole),
        (&["train", "--timeout", "0"], "--timeout", count),
    ] {
        refused_flag(args, flag, reason);
    }
}

#[test]
fn a_min_lr_above_the_peak_is_refused() {
    let out = distflash(&[
        "train", "--min-lr", "1", "--lr", "0.01", "--decay", "cosine",
    ]);
    fails(
        &out,
        1,
        &[
            "--min-lr 1 is above the peak learning rate 0.01",
            "give a --min-lr of 0.01 or less",
        ],
    );
}

#[test]
fn a_fresh_run_does_not_overwrite_a_finished_one() {
    let dir = temp_dir("overwrite");
    assert!(train(&dir, "2", None).status.success());
    let before = std::fs::read(dir.join("state.safetensors")).unwrap();
    let out = train(&dir, "3", None);
    fails(
        &out,
        1,
        &[
            "holds a run (state.safetensors, metrics.jsonl, model.safetensors)",
            "continue it with --resume",
            "replace it with --overwrite",
        ],
    );
    assert_eq!(
        std::fs::read(dir.join("state.safetensors")).unwrap(),
        before
    );
    // Asked for, it starts afresh there.
    let out = Command::new(BIN)
        .args(&TINY[..7])
        .args(["--steps", "1", "--save-dir"])
        .arg(&dir)
        .arg("--overwrite")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(metric_steps(&dir), vec![1]);
    // The checkpoint is the new run's.
    assert_ne!(
        std::fs::read(dir.join("state.safetensors")).unwrap(),
        before
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn resuming_a_directory_without_a_checkpoint_says_so() {
    let dir = temp_dir("no-checkpoint");
    std::fs::write(dir.join("metrics.jsonl"), "").unwrap();
    let out = train(&dir, "2", Some(&dir));
    fails(
        &out,
        1,
        &[
            "holds no checkpoint yet (its run stopped before the first save",
            "--overwrite instead of --resume",
        ],
    );
    let missing = dir.join("state-1.safetensors");
    let out = train(&dir, "2", Some(&missing));
    fails(
        &out,
        1,
        &[
            "there is no checkpoint at",
            "give --resume a run's save directory",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn settings_that_do_nothing_here_are_warned_of_and_the_run_goes_on() {
    let out = Command::new(BIN)
        .args([
            "train",
            "--seq-len",
            "32",
            "--batch",
            "1",
            "--steps",
            "1",
            "--json",
        ])
        .args([
            "--workers",
            "1",
            "--shard",
            "full",
            "--offload",
            "activations",
        ])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].starts_with("warning: --offload activations moves checkpoints to host memory, where the CPU's already are"), "{err}");
    assert!(lines[1].starts_with("warning: --shard full cuts the model's state across the workers, but one worker holds every piece"), "{err}");
}

#[test]
fn every_output_path_is_checked_before_the_work() {
    let dir = temp_dir("outputs");
    let tokens = dir.join("t.json");
    std::fs::write(&tokens, "[1, 2, 3, 4, 5, 6, 7, 8, 9]").unwrap();
    let t = tokens.to_str().unwrap();
    for (args, path) in [
        (
            &["grads", "--tokens", t, "--out", "/proc/x/g.safetensors"][..],
            "/proc/x/g.safetensors",
        ),
        (&["plan", "--out", "/proc/x/p.txt"], "/proc/x/p.txt"),
        (
            &["attention", "--save", "/proc/x/a.safetensors"],
            "/proc/x/a.safetensors",
        ),
        (
            &["train", "--steps", "1", "--save-dir", "/proc/x/run"],
            "/proc/x/run",
        ),
    ] {
        let err = refused_at_once(
            args,
            &[
                &format!("cannot write {path}: "),
                "; choose a writable path",
            ],
        );
        assert_eq!(err.matches("os error").count(), 1, "{err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_oversize_batch_is_named_as_the_fix() {
    let out = distflash(&["attention", "--batch", "100000000"]);
    fails(
        &out,
        1,
        &[
            "attention over 2048 tokens needs",
            "GiB available: use --batch",
        ],
    );
}

#[test]
fn a_config_of_the_wrong_shape_is_named_as_such() {
    let dir = temp_dir("configs");
    let config = dir.join("config.json");
    let c = config.to_str().unwrap();
    std::fs::write(&config, "[1, 2]").unwrap();
    fails(
        &distflash(&["train", "--config", c]),
        1,
        &["the config is an array, not an object: give a Hugging Face config.json"],
    );
    let fields = r#"{"vocab_size": 256, "hidden_size": 64, "intermediate_size": 176,
        "num_attention_heads": 4, "num_hidden_layers": -1}"#;
    std::fs::write(&config, fields).unwrap();
    fails(
        &distflash(&["train", "--config", c]),
        1,
        &["'num_hidden_layers' is -1, not a non-negative integer: give a whole number"],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_model_with_non_finite_weights_is_refused_at_load_naming_the_tensor() {
    let dir = temp_dir("nan-model");
    let out = Command::new(BIN)
        .args(&TINY[..7])
        .args(["--steps", "1", "--save-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The last value of the file (of whichever tensor lies last) becomes NaN.
    let model = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&model, bytes).unwrap();
    let out = distflash(
        &[
            &TINY[..7],
            &["--steps", "1", "--init-from", dir.to_str().unwrap()],
        ]
        .concat(),
    );
    fails(
        &out,
        1,
        &[
            "tensor '",
            "holds NaN at element",
            "the weights are damaged",
            "start from a model whose weights are all finite",
        ],
    );
    assert!(!stderr(&out).contains("learning rate"), "{}", stderr(&out));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_progress_fits_80_columns_and_says_its_recall_is_a_moving_average() {
    let out = distflash(&[
        "train",
        "--steps",
        "30",
        "--seq-len",
        "64",
        "--batch",
        "4",
        "--workers",
        "2",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            "recall: share of probes answered right over the last 20 steps (moving average)"
        ),
        "{err}"
    );
    let last = err.lines().rfind(|l| l.contains("step 30/30")).unwrap();
    assert!(last.contains("  recall "), "{last}");
    for line in err.lines() {
        assert!(
            line.chars().count() <= 80,
            "{} columns: {line}",
            line.chars().count()
        );
    }
}

/// Every GPU test is `#[ignore]`d with the way to run it, so that `cargo test` on a machine
/// without a GPU lists it as ignored rather than `ok`; `bench/peers/gpu_tests.sh` runs them
/// with `--include-ignored`. Only the gate's own checks, which need no GPU, run unasked.
#[test]
fn gpu_tests_are_listed_as_ignored_without_a_gpu() {
    let ignore =
        "#[ignore = \"needs an NVIDIA GPU: set DISTFLASH_GPU_TESTS=1 and pass --include-ignored\"]";
    let no_gpu = [
        "the_gate_runs_only_on_1_and_refuses_what_it_does_not_understand",
        "a_kernel_variant_is_parsed_from_its_keys_and_bad_ones_are_refused",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ignored = 0;
    for file in ["gpu_attention.rs", "gpu_ops.rs", "gpu_model_attention.rs"] {
        let text = std::fs::read_to_string(root.join("tests").join(file)).unwrap();
        for test in text.split("#[test]\n").skip(1) {
            let name = test
                .lines()
                .find(|l| l.starts_with("fn "))
                .unwrap_or_default();
            if no_gpu.iter().any(|n| name.contains(n)) {
                continue;
            }
            assert!(test.starts_with(ignore), "{file}: {name} is not ignored");
            ignored += 1;
        }
    }
    assert_eq!(ignored, 26);
    let script = std::fs::read_to_string(root.join("bench/peers/gpu_tests.sh")).unwrap();
    assert!(
        script.contains("--include-ignored"),
        "gpu_tests.sh must run them"
    );
}
