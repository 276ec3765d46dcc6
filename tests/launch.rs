//! Several processes on loopback: the launcher, the rendezvous and the socket communicator,
//! with the failures a user meets (a rank that never arrives, a port in use, ranks started
//! differently, a rank that dies).

mod common;

use common::trajectory;
use distflash::tensor_file;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distflash");
const SMALL: [&str; 8] = [
    "--seq-len",
    "45",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--head-dim",
    "8",
];

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("distflash-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Starts one rank by hand, the way a Slurm script would.
fn rank(rank: usize, world: usize, port: u16, args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn launched_processes_match_the_threaded_run_and_the_oracle() {
    let (threads, procs) = (
        temp_path("threads.safetensors"),
        temp_path("procs.safetensors"),
    );
    let mut args = vec!["attention", "--workers", "3", "--check", "--json", "--save"];
    let t = Command::new(BIN)
        .args(&args)
        .arg(&threads)
        .args(SMALL)
        .output()
        .unwrap();
    assert!(t.status.success(), "{}", stderr(&t));
    args.drain(1..3); // the launcher sets the worker count
    let p = Command::new(BIN)
        .args(["launch", "--nproc-per-node", "3", "--"])
        .args(&args)
        .arg(&procs)
        .args(SMALL)
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", stderr(&p));
    let report: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(report["workers"], 3);
    assert_eq!(report["check"]["passed"], true);
    let (a, b) = (
        tensor_file::read(&threads).unwrap(),
        tensor_file::read(&procs).unwrap(),
    );
    for name in ["out", "lse", "dq", "dk", "dv"] {
        assert_eq!(a[name].0, b[name].0, "{name} shape");
        let diff = a[name]
            .1
            .iter()
            .zip(&b[name].1)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(
            diff <= 1e-6,
            "{name}: processes and threads differ by {diff}"
        );
    }
}

#[test]
fn a_rank_that_never_arrives_ends_rank_zero_with_a_sentence() {
    let port = free_port();
    let start = Instant::now();
    let mut args = vec!["attention", "--rendezvous-timeout", "2"];
    args.extend(SMALL);
    let out = rank(0, 2, port, &args).wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("rank(s) [1] did not arrive within 2 s"),
        "{}",
        stderr(&out)
    );
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_missing_rank_zero_ends_the_others_with_a_sentence() {
    let port = free_port();
    let mut args = vec!["attention", "--rendezvous-timeout", "1"];
    args.extend(SMALL);
    let out = rank(1, 2, port, &args).wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("rank 0 at 127.0.0.1"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("error (rank 1)"), "{}", stderr(&out));
}

#[test]
fn ranks_with_different_arguments_all_stop_with_the_same_sentence() {
    let port = free_port();
    let mut a = vec!["attention", "--seed", "1"];
    let mut b = vec!["attention", "--seed", "2"];
    a.extend(SMALL);
    b.extend(SMALL);
    let r0 = rank(0, 2, port, &a);
    let r1 = rank(1, 2, port, &b);
    for out in [
        r0.wait_with_output().unwrap(),
        r1.wait_with_output().unwrap(),
    ] {
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("rank 1 was started with different arguments"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_world_size_mismatch_is_named() {
    let port = free_port();
    let mut args = vec!["attention", "--rendezvous-timeout", "10"];
    args.extend(SMALL);
    let r0 = rank(0, 2, port, &args);
    let r1 = rank(1, 3, port, &args);
    for out in [
        r0.wait_with_output().unwrap(),
        r1.wait_with_output().unwrap(),
    ] {
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("WORLD_SIZE=3 but rank 0 with WORLD_SIZE=2"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_port_in_use_fails_rank_zero_and_the_launcher_stops_the_rest() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let start = Instant::now();
    let out = Command::new(BIN)
        .args([
            "launch",
            "--nproc-per-node",
            "3",
            "--grace-secs",
            "1",
            "--master-port",
            &port,
            "--",
        ])
        .args(["attention", "--rendezvous-timeout", "60"])
        .args(SMALL)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "MASTER_PORT {port} on 127.0.0.1 is already in use"
        )),
        "{err}"
    );
    assert!(err.contains("rank 0 failed"), "{err}");
    // The other ranks would wait 60 s for rank 0; the launcher ends them after the grace period.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn training_as_processes_follows_the_threaded_trajectory_exactly() {
    let args = [
        "train",
        "--steps",
        "6",
        "--json",
        "--seq-len",
        "64",
        "--batch",
        "2",
    ];
    let threads = Command::new(BIN)
        .args(args)
        .args(["--workers", "3"])
        .output()
        .unwrap();
    assert!(threads.status.success(), "{}", stderr(&threads));
    let procs = Command::new(BIN)
        .args(["launch", "--nproc-per-node", "3", "--"])
        .args(args)
        .output()
        .unwrap();
    assert!(procs.status.success(), "{}", stderr(&procs));
    let (a, b) = (trajectory(&threads), trajectory(&procs));
    assert_eq!(a.len(), 6, "{}", String::from_utf8_lossy(&threads.stdout));
    assert_eq!(a, b);
}
