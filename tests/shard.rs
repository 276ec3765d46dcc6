//! Sharded model state (`--shard optimizer|grads`, ZeRO-1/2): the collectives on every host
//! transport against the all-reduce and their byte predictions, sharded training against the
//! unsharded trajectory on threads and processes, and sharded checkpoints resumed with other
//! worker counts.

mod common;

use common::{sharded, tiny_options_with, train_on_threads, trajectory};
use distflash::comm::rendezvous::{LaunchEnv, join};
use distflash::comm::{
    Communicator, all_gather_bytes, connect_mesh, reduce_scatter_bytes, shard_span, shard_spans,
};
use distflash::runtime::run_workers;
use distflash::train::data::Data;
use distflash::train::step_plan::Asked;
use distflash::train::step_plan::Shard;
use distflash::train::{Options, StepReport, state};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_distflash");
const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn the_shard_rule_cuts_contiguous_pieces_differing_by_at_most_one() {
    for len in 0..40 {
        for world in 1..7 {
            let spans = shard_spans(len, world);
            let mut next = 0;
            for (r, s) in spans.iter().enumerate() {
                assert_eq!(s.start, next, "len {len} world {world}: contiguous");
                assert_eq!(s.len, len / world + usize::from(r < len % world));
                assert_eq!(*s, shard_span(len, world, r));
                next = s.end();
            }
            assert_eq!(next, len, "the pieces cover the tensor");
        }
    }
}

/// Rank `rank`'s test vector of `len` elements: values whose sums round in f32.
fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.1 + 1.0 / (rank + 3) as f32)
        .collect()
}

/// On one rank: all-gather and reduce-scatter of tensors of several lengths, checked against
/// every rank's data and against the all-reduce (the same bits: both sum in rank order), and the
/// bytes each sends against the prediction.
fn check_collectives(comm: &mut impl Communicator<Vec<f32>>) -> anyhow::Result<()> {
    let (me, world) = (comm.rank(), comm.world());
    for len in [1, world, 37, 64] {
        let mine = data(me, len);
        let own = shard_span(len, world, me);

        let before = comm.bytes_sent();
        let pieces = comm.all_gather(mine[own.start..own.end()].to_vec(), len)?;
        assert_eq!(
            comm.bytes_sent() - before,
            all_gather_bytes(len, world, me, 4)
        );
        for (r, (piece, s)) in pieces.iter().zip(shard_spans(len, world)).enumerate() {
            assert_eq!(piece[..], data(r, len)[s.start..s.end()], "piece of {r}");
        }

        let cut = shard_spans(len, world)
            .iter()
            .map(|s| mine[s.start..s.end()].to_vec())
            .collect();
        let before = comm.bytes_sent();
        let summed = comm.reduce_scatter_sum(cut)?;
        assert_eq!(
            comm.bytes_sent() - before,
            reduce_scatter_bytes(len, world, me, 4)
        );
        let mut whole = mine.clone();
        comm.all_reduce_sum(&mut whole)?;
        assert_eq!(summed[..], whole[own.start..own.end()], "len {len}");

        // Into the caller's buffers: the same pieces and sums, the same bytes.
        let before = comm.bytes_sent();
        let mut gathered = vec![f32::NAN; len];
        comm.all_gather_into(&mine[own.start..own.end()].to_vec(), &mut gathered)?;
        assert_eq!(
            comm.bytes_sent() - before,
            all_gather_bytes(len, world, me, 4)
        );
        for (r, s) in shard_spans(len, world).iter().enumerate() {
            let want = &data(r, len)[s.start..s.end()];
            assert_eq!(gathered[s.start..s.end()], *want, "span of {r}");
        }
        let before = comm.bytes_sent();
        let start: Vec<f32> = (0..own.len).map(|i| 0.37 * i as f32 - 1.3).collect();
        let mut acc = start.clone();
        comm.reduce_scatter_add(&mine, &mut acc)?;
        assert_eq!(
            comm.bytes_sent() - before,
            reduce_scatter_bytes(len, world, me, 4)
        );
        // acc + (the rank-order sum), with the bits of the reduce-scatter's sum added after.
        let want: Vec<f32> = start.iter().zip(&summed).map(|(a, s)| a + s).collect();
        assert_eq!(acc, want, "len {len}");
        // Written over the caller's buffer (whatever it held): the reduce-scatter's bits.
        let before = comm.bytes_sent();
        let mut out = vec![f32::NAN; own.len];
        comm.reduce_scatter_into(&mine, &mut out)?;
        assert_eq!(
            comm.bytes_sent() - before,
            reduce_scatter_bytes(len, world, me, 4)
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&summed), "len {len}: written over");

        // Several tensors gathered for a shared use (one copy for worker threads), one of them
        // shorter than the workers (empty pieces): every rank's values, the bytes predicted.
        let lens = [len, 2, 5];
        let theirs: Vec<Vec<f32>> = lens.iter().map(|&n| data(me, n)).collect();
        let pieces: Vec<Vec<f32>> = theirs
            .iter()
            .map(|t| {
                let s = shard_span(t.len(), world, me);
                t[s.start..s.end()].to_vec()
            })
            .collect();
        let before = comm.bytes_sent();
        let shared = comm.all_gather_shared(&pieces.iter().collect::<Vec<_>>(), &lens)?;
        let predicted: u64 = lens
            .iter()
            .map(|&n| all_gather_bytes(n, world, me, 4))
            .sum();
        assert_eq!(comm.bytes_sent() - before, predicted, "len {len}: shared");
        for (whole, &n) in shared.get().iter().zip(&lens) {
            for (r, s) in shard_spans(n, world).iter().enumerate() {
                let want = &data(r, n)[s.start..s.end()];
                assert_eq!(whole[s.start..s.end()], *want, "shared {n}: span of {r}");
            }
        }
        comm.release_shared(shared)?;
        // An f64 oracle: every rank's data and the start summed exactly. f32 makes `world`
        // additions (world - 1 among the ranks' values, one to the start), each rounded by at
        // most 2^-24 of a partial sum, which is at most the sum of magnitudes `m`.
        for (i, a) in acc.iter().enumerate() {
            let values: Vec<f64> = (0..world)
                .map(|r| f64::from(data(r, len)[own.start + i]))
                .collect();
            let exact = f64::from(start[i]) + values.iter().sum::<f64>();
            let m = f64::from(start[i].abs()) + values.iter().map(|v| v.abs()).sum::<f64>();
            let bound = world as f64 * 2f64.powi(-24) * m;
            assert!((f64::from(*a) - exact).abs() <= bound, "{a} vs {exact}");
        }
    }
    Ok(())
}

#[test]
fn collectives_over_threads_match_the_all_reduce_and_the_byte_prediction() {
    for world in 1..=4 {
        for r in run_workers(world, TIMEOUT, |_, comm| check_collectives(comm)) {
            r.unwrap();
        }
    }
}

#[test]
fn collectives_over_tcp_match_the_all_reduce_and_the_byte_prediction() {
    let world = 3;
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                scope.spawn(move || -> anyhow::Result<()> {
                    let env = LaunchEnv {
                        rank,
                        world,
                        local_rank: rank,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                    };
                    let joined = join(&env, 7, TIMEOUT, || Ok(Vec::new()))?;
                    let mut comm = connect_mesh(joined, TIMEOUT, TIMEOUT)?;
                    check_collectives(&mut comm)?;
                    comm.barrier()
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap().unwrap();
        }
    });
}

/// The sum a reduce-scatter writes over the caller's buffer (what `--shard full` does with a
/// step's first gradients, over accumulators that hold zeros) and the one it adds to zeros
/// differ only where every rank's value is `-0`: written over, the sum is `-0`; added to `+0`,
/// it is `+0`. Equal values, so the trajectories are the same; every other element has the same
/// bits.
#[test]
fn a_sum_written_over_zeros_differs_from_one_added_to_them_only_in_the_sign_of_zero() {
    for world in [2, 3] {
        let results = run_workers(world, TIMEOUT, |rank, comm| {
            let len = 2 * world;
            let mut mine = data(rank, len);
            mine[0] = -0.0;
            mine[1] = if rank == 0 { -0.0 } else { 0.0 };
            let mut written = vec![f32::NAN; 2];
            comm.reduce_scatter_into(&mine, &mut written)?;
            let mut added = vec![0.0; 2];
            comm.reduce_scatter_add(&mine, &mut added)?;
            Ok((written, added))
        });
        let (written, added) = results.into_iter().next().unwrap().unwrap();
        assert_eq!(written[0].to_bits(), (-0.0f32).to_bits(), "{world} workers");
        assert_eq!(added[0].to_bits(), 0.0f32.to_bits(), "{world} workers");
        assert_eq!(written[0], added[0], "{world} workers: equal values");
        assert_eq!(written[1].to_bits(), added[1].to_bits(), "{world} workers");
        assert_eq!(written[1].to_bits(), 0.0f32.to_bits(), "{world} workers");
    }
}

/// Worker threads' shared all-gather: rank 0 frees its one copy only once every other worker
/// has given its views back (it waits in `release_shared` for the slowest); a worker that fails
/// between the gather and the release ends rank 0's wait at once with its name; pieces of the
/// wrong length, or no tensors, are refused with a sentence.
#[test]
fn a_shared_gather_is_freed_only_after_every_worker_gives_it_back() {
    let hold = Duration::from_millis(300);
    let waited = run_workers(3, TIMEOUT, |rank, comm| {
        let piece = vec![rank as f32; 2];
        let shared = comm.all_gather_shared(&[&piece], &[6])?;
        assert_eq!(shared.get()[0], [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
        if rank == 2 {
            std::thread::sleep(hold);
        }
        let began = std::time::Instant::now();
        comm.release_shared(shared)?;
        Ok(began.elapsed())
    });
    let waited: Vec<Duration> = waited.into_iter().map(Result::unwrap).collect();
    assert!(waited[0] >= hold / 2, "rank 0 freed after {:?}", waited[0]);

    let began = std::time::Instant::now();
    let failed = run_workers(2, TIMEOUT, |rank, comm| {
        let piece = vec![1.0; 3];
        let shared = comm.all_gather_shared(&[&piece], &[6])?;
        if rank == 1 {
            anyhow::bail!("worker 1 gave up");
        }
        comm.release_shared(shared)
    });
    let took = began.elapsed();
    assert!(took < TIMEOUT / 4, "the release took {took:?}");
    let e = format!("{:#}", failed[0].as_ref().unwrap_err());
    assert!(e.contains("worker 1 failed"), "{e}");

    let wrong = run_workers(2, TIMEOUT, |rank, comm| {
        let piece = vec![1.0; 3 + rank];
        comm.all_gather_shared(&[&piece], &[6]).map(drop)
    });
    let e = wrong[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("all-gather: worker 1 holds 4 elements, but its piece of 6 over 2 workers is 3"),
        "{e}"
    );
    let none = run_workers(2, TIMEOUT, |_, comm| {
        let no_pieces: [&Vec<f32>; 0] = [];
        comm.all_gather_shared(&no_pieces, &[]).map(drop)
    });
    let e = none[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("0 pieces for 0 tensors"), "{e}");
}

#[test]
fn a_piece_that_breaks_the_shard_rule_is_refused_with_a_sentence() {
    let results = run_workers(2, TIMEOUT, |_, comm| {
        comm.reduce_scatter_sum(vec![vec![1.0; 2], vec![1.0; 4]])
    });
    for r in results {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("the shard rule over 2 workers gives"), "{e}");
    }
}

/// The collectives into the caller's buffers refuse a piece or an accumulator of the wrong
/// length with a sentence on the worker that holds it, and the other workers, waiting on its
/// loan, learn of its failure instead of waiting (or reading a loan that was never made).
#[test]
fn collectives_into_buffers_refuse_wrong_lengths_with_a_sentence() {
    let began = std::time::Instant::now();
    let gather = run_workers(2, TIMEOUT, |rank, comm| {
        let mut whole = vec![0.0; 6];
        comm.all_gather_into(&vec![1.0; 3 + rank], &mut whole)
    });
    let quick = |what: &str| {
        let took = began.elapsed();
        assert!(took < TIMEOUT / 4, "{what} took {took:?}: a worker waited");
    };
    quick("the all-gather");
    let e = gather[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("all-gather: worker 1 holds 4 elements, but its piece of 6 over 2 workers is 3"),
        "{e}"
    );
    let peer = format!("{:#}", gather[0].as_ref().unwrap_err());
    assert!(peer.contains("worker 1 failed"), "{peer}");
    let began = std::time::Instant::now();
    let scatter = run_workers(3, TIMEOUT, |rank, comm| {
        let mut acc = vec![0.0; if rank == 2 { 1 } else { 3 }];
        comm.reduce_scatter_add(&vec![1.0; 9], &mut acc)
    });
    let took = began.elapsed();
    assert!(took < TIMEOUT / 4, "the reduce-scatter took {took:?}");
    let e = scatter[2].as_ref().unwrap_err().to_string();
    assert!(
        e.contains(
            "reduce-scatter: worker 2 holds 1 elements, but its piece of 9 over 3 workers is 3"
        ),
        "{e}"
    );
    for r in &scatter[..2] {
        let peer = format!("{:#}", r.as_ref().unwrap_err());
        assert!(peer.contains("worker 2 failed"), "{peer}");
    }
    let began = std::time::Instant::now();
    let into = run_workers(2, TIMEOUT, |rank, comm| {
        let mut out = vec![0.0; 3 + rank];
        comm.reduce_scatter_into(&vec![1.0; 6], &mut out)
    });
    let took = began.elapsed();
    assert!(took < TIMEOUT / 4, "the reduce-scatter into took {took:?}");
    let e = into[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains(
            "reduce-scatter: worker 1 holds 4 elements, but its piece of 6 over 2 workers is 3"
        ),
        "{e}"
    );
    let peer = format!("{:#}", into[0].as_ref().unwrap_err());
    assert!(peer.contains("worker 1 failed"), "{peer}");
    // Tensors of different lengths on different workers: each refuses the other's loan.
    let began = std::time::Instant::now();
    let lens = run_workers(2, TIMEOUT, |rank, comm| {
        let len = 4 + 2 * rank;
        let mut acc = vec![0.0; len / 2];
        comm.reduce_scatter_add(&vec![1.0; len], &mut acc)
    });
    let took = began.elapsed();
    assert!(
        took < TIMEOUT / 4,
        "the mismatched reduce-scatter took {took:?}"
    );
    let all: Vec<String> = lens
        .iter()
        .map(|r| format!("{:#}", r.as_ref().unwrap_err()))
        .collect();
    assert!(
        all.iter().any(|e| e.contains("where the shard rule gives")),
        "{all:?}"
    );
}

/// Losses and gradient norms of every step, and the final weights, of `o` on the threads of its
/// plan.
fn run(o: &Options) -> (Vec<(f64, f64)>, Vec<Vec<f32>>) {
    let steps = Mutex::new(Vec::new());
    let on_step = |r: &StepReport| steps.lock().unwrap().push((r.loss, r.grad_norm));
    let w = train_on_threads(o, on_step).unwrap();
    (steps.into_inner().unwrap(), w)
}

/// The small training job of the other suites as `asked` on `workers` threads, saving every 5
/// steps.
fn options_with(
    asked: Asked,
    workers: usize,
    steps: u64,
    save_dir: Option<&Path>,
    resume: Option<&Path>,
) -> Options {
    Options {
        save_every: 5,
        ..tiny_options_with(asked, workers, steps, save_dir, resume)
    }
}

/// [`options_with`] sharded as `shard`.
fn options(
    shard: Shard,
    workers: usize,
    steps: u64,
    save_dir: Option<&Path>,
    resume: Option<&Path>,
) -> Options {
    options_with(sharded(shard), workers, steps, save_dir, resume)
}

fn temp_dir(name: &str) -> PathBuf {
    common::temp_dir("shard", name)
}

/// Relative agreement of two trajectories' losses and of two sets of weights.
fn assert_close(
    what: &str,
    a: &(Vec<(f64, f64)>, Vec<Vec<f32>>),
    b: &(Vec<(f64, f64)>, Vec<Vec<f32>>),
    rel: f64,
) {
    assert_eq!(a.0.len(), b.0.len(), "{what}: steps");
    for (s, (x, y)) in a.0.iter().zip(&b.0).enumerate() {
        assert!(
            (x.0 - y.0).abs() <= rel * y.0.abs(),
            "{what}: step {} loss {} vs {}",
            s + 1,
            x.0,
            y.0
        );
    }
    let scale = b.1.iter().flatten().fold(0f32, |m, x| m.max(x.abs())) as f64;
    for (t, (x, y)) in a.1.iter().zip(&b.1).enumerate() {
        for (p, q) in x.iter().zip(y) {
            assert!(
                ((p - q).abs() as f64) <= rel * scale,
                "{what}: tensor {t}: weight {p} vs {q}"
            );
        }
    }
}

/// Sharding changes no arithmetic but the global gradient norm's: each worker's sum of squares
/// is rounded to f32 and the P sums added in f32, a relative error of at most about
/// (P + 1)·2⁻²⁴ < 3·10⁻⁷ in the norm and so in the clipping factor. AdamW's step is invariant to a
/// uniform scale of the gradient up to its ε (1e-8 against gradients of order 1e-3), so each
/// weight's update moves by far less than that relative amount times the learning rate; over 10
/// steps of this tiny model the trajectories agree to 1e-5 relative (losses, and weights against
/// the largest weight), the bound the threaded tests use. `full` also reduces each sequence of
/// a batch separately (two f32 sums where the unsharded run adds the two gradients first: one
/// more rounding, 2⁻²⁴ relative, per element), which AdamW's normalised step carries to the
/// weights at the same order, within the same bound. Without clipping the norm is never used and
/// `optimizer` and `grads` have the unsharded run's bits exactly.
#[test]
fn sharded_training_follows_the_unsharded_trajectory_on_one_to_four_threads() {
    for workers in 1..=4 {
        let none = run(&options(Shard::None, workers, 10, None, None));
        assert!(none.0[9].0 < none.0[0].0, "the loss falls: {:?}", none.0);
        for shard in [Shard::Optimizer, Shard::Grads, Shard::Full] {
            let what = format!("{workers} workers, --shard {}", shard.name());
            assert_close(
                &what,
                &run(&options(shard, workers, 10, None, None)),
                &none,
                1e-5,
            );
        }
    }
    for workers in [2, 3] {
        let unclipped = |shard| Options {
            clip: 0.0,
            ..options(shard, workers, 4, None, None)
        };
        let none = run(&unclipped(Shard::None));
        for shard in [Shard::Optimizer, Shard::Grads] {
            let got = run(&unclipped(shard));
            let losses = |r: &(Vec<(f64, f64)>, _)| r.0.iter().map(|s| s.0).collect::<Vec<_>>();
            assert_eq!(
                losses(&got),
                losses(&none),
                "{workers} workers, {}",
                shard.name()
            );
            assert_eq!(
                got.1,
                none.1,
                "{workers} workers, {}: same bits",
                shard.name()
            );
        }
    }
}

/// A model whose output projection is its embedding table: under `full` the table's gradient
/// has two contributions in each backward (the head's, then the lookup's), the first written
/// over the step's zeros and the second added, so the trajectory is the unsharded one within
/// the threaded test's bound (for its reasons).
#[test]
fn a_tied_model_trains_sharded_on_the_unsharded_trajectory() {
    let tied = |shard, workers| {
        let mut o = options(shard, workers, 6, None, None);
        o.config.tie_word_embeddings = true;
        o
    };
    for workers in [2, 3] {
        let none = run(&tied(Shard::None, workers));
        assert!(none.0[5].0 < none.0[0].0, "the loss falls: {:?}", none.0);
        let what = format!("tied, {workers} workers, --shard full");
        assert_close(&what, &run(&tied(Shard::Full, workers)), &none, 1e-5);
    }
}

/// A P=2 sharded checkpoint holds the whole state (the same file an unsharded run saves, to the
/// norm's rounding), and resumed with 4 workers or 1 it continues the uninterrupted run.
#[test]
fn a_sharded_checkpoint_resumes_with_other_worker_counts() {
    let dir = temp_dir("resume");
    let whole = run(&options(Shard::Optimizer, 2, 10, None, None));
    let first = run(&options(Shard::Full, 2, 5, Some(&dir), None));
    assert_close(
        "the first half",
        &first,
        &(whole.0[..5].to_vec(), first.1.clone()),
        1e-5,
    );
    let key = state::RunKey {
        config: options(Shard::None, 1, 0, None, None).config,
        data: Data::Synthetic { seed: 2 }.describe(),
        seq_len: 48,
        batch: 2,
    };
    let saved = state::load(&state::path_in(&dir), &key).unwrap();
    assert_eq!(saved.step, 5);
    assert_eq!(
        saved.whole(state::Part::Weights).unwrap(),
        first.1,
        "the saved weights are the run's"
    );
    let unsharded = temp_dir("resume-unsharded");
    run(&options(Shard::None, 2, 5, Some(&unsharded), None));
    let reference = state::load(&state::path_in(&unsharded), &key).unwrap();
    let moments = |s: &state::Saved, part| s.whole(part).unwrap();
    for (what, part) in [
        ("m", state::Part::FirstMoment),
        ("v", state::Part::SecondMoment),
    ] {
        let (a, b) = (&moments(&saved, part), &moments(&reference, part));
        let scale = b.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert!((x - y).abs() <= 1e-5 * scale, "gathered {what}: {x} vs {y}");
        }
    }
    // A save interrupted mid-write leaves its temporary file half written beside the previous
    // checkpoint, which stays whole and is what a resume reads.
    let good = std::fs::read(state::path_in(&dir)).unwrap();
    std::fs::write(dir.join("state.tmp"), &good[..good.len() / 3]).unwrap();
    for (workers, shard) in [(4, Shard::Full), (1, Shard::Grads), (4, Shard::None)] {
        let rest = run(&options(shard, workers, 10, None, Some(&dir)));
        let what = format!("resumed on {workers} workers, --shard {}", shard.name());
        let tail = (whole.0[5..].to_vec(), whole.1.clone());
        assert_close(&what, &rest, &tail, 1e-5);
    }
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(unsharded).unwrap();
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Three processes under `distflash launch` (TCP between ranks): each sharding follows the
/// unsharded processes' trajectory for 10 steps and saves the same final model (the tolerance
/// of the threaded test, for the same reason); under `full` with `--offload all` (each rank's
/// moments in its own host store, and its checkpoints) the same bits as without.
#[test]
fn sharded_training_as_processes_follows_the_unsharded_trajectory() {
    let train = |shard: Shard, offload: &str| {
        let dir = temp_dir(&format!("launch-{}-{offload}", shard.name()));
        let out = Command::new(BIN)
            .args(["launch", "--nproc-per-node", "3", "--"])
            .args([
                "train",
                "--steps",
                "10",
                "--json",
                "--seq-len",
                "48",
                "--batch",
                "2",
            ])
            .args(["--shard", shard.name(), "--save-dir", dir.to_str().unwrap()])
            .args(["--offload", offload])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let model = distflash::tensor_file::read(&dir.join("model.safetensors")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut names: Vec<_> = model.keys().cloned().collect();
        names.sort();
        let weights = names.iter().map(|n| model[n].1.clone()).collect::<Vec<_>>();
        (trajectory(&out), weights)
    };
    let none = train(Shard::None, "none");
    assert_eq!(none.0.len(), 10);
    for shard in [Shard::Optimizer, Shard::Grads, Shard::Full] {
        let got = train(shard, "none");
        let what = format!("3 processes, --shard {}", shard.name());
        assert_close(&what, &got, &none, 1e-5);
        if shard == Shard::Full {
            assert_eq!(
                train(shard, "all"),
                got,
                "{what} --offload all: the same bits"
            );
        }
    }
}

/// `distflash grads` over 3 workers: reduce-scattered gradients (`grads`, and `full`, whose
/// layers' gradients are reduced as the backward makes them, from all-gathered weights) gathered
/// whole are the all-reduced ones. Each worker's whole-tensor gradients are the same as
/// unsharded and the reduce-scatter sums them in the all-reduce's order, so the files are equal
/// bit for bit.
#[test]
fn sharded_gradients_are_the_all_reduced_ones() {
    let dir = temp_dir("grads");
    let tokens = dir.join("tokens.json");
    std::fs::write(&tokens, "[1, 20, 70, 71, 72, 2, 20, 9, 30, 31, 5, 6, 7]").unwrap();
    let grads = |shard: Shard| {
        let out_file = dir.join(format!("{}.safetensors", shard.name()));
        let out = Command::new(BIN)
            .args(["grads", "--workers", "3", "--shard", shard.name()])
            .args(["--tokens", tokens.to_str().unwrap()])
            .args(["--out", out_file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            report["loss"].as_f64().unwrap(),
            distflash::tensor_file::read(&out_file).unwrap(),
        )
    };
    let none = grads(Shard::None);
    for shard in [Shard::Grads, Shard::Full] {
        let got = grads(shard);
        assert_eq!(got.0, none.0, "--shard {}: loss", shard.name());
        assert_eq!(got.1, none.1, "--shard {}: gradients", shard.name());
    }
    let bench = Command::new(BIN)
        .args([
            "bench",
            "train",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--seq-len",
            "32",
            "--workers",
            "2",
        ])
        .args([
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--json",
            "--shard",
            "full",
        ])
        .output()
        .unwrap();
    assert!(bench.status.success(), "{}", stderr(&bench));
    let report: serde_json::Value = serde_json::from_slice(&bench.stdout).unwrap();
    assert_eq!(report["shard"], "full");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_estimate_counts_the_sharded_state() {
    let estimate = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(BIN)
            .args([
                "bench",
                "train",
                "--estimate",
                "--json",
                "--preset",
                "llama2-7b",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let gib = |v: &serde_json::Value| v["estimated_gib"].as_f64().unwrap();
    let part = |v: &serde_json::Value, k: &str| v["estimated_bytes"][k].as_f64().unwrap();
    let eight = ["--workers", "8", "--seq-len", "1048576", "--optimizer"];
    let none = estimate(&eight);
    let optimizer = estimate(&[&eight[..], &["--shard", "optimizer"]].concat());
    let full = estimate(&[&eight[..], &["--shard", "full"]].concat());
    assert_eq!(
        part(&optimizer, "optimizer") * 8.0,
        part(&none, "optimizer")
    );
    assert_eq!(part(&optimizer, "weights"), part(&none, "weights"));
    assert!(part(&full, "weights") < part(&none, "weights") / 4.0);
    assert!(part(&full, "grads") < part(&none, "grads") / 4.0);
    // The figure: 1M tokens of llama2-7b with AdamW on 8 H200s, which unsharded would
    // not fit one H200's 139.3 GiB.
    assert!(gib(&full) <= 120.0, "{}", gib(&full));
    assert!(gib(&none) > 139.3, "{}", gib(&none));
}

/// The training loop with each layer's checkpoint offloaded to host memory, or AdamW's moments
/// (alone and with the checkpoints), takes the same steps bit for bit (losses, gradient norms,
/// final weights) as without offload, sharded or not, under each checkpoint policy, on one to
/// four workers: the offload moves tensors exactly and changes no arithmetic (the moments are
/// updated by the same `adamw`, in the same order).
#[test]
fn offloaded_training_follows_the_same_trajectory_bit_for_bit() {
    use distflash::model::{Checkpoint, Offload};
    let moments = [Offload::OPTIMIZER, Offload::ALL];
    let mut cases = vec![
        (
            Shard::None,
            Checkpoint::Remat,
            1,
            vec![Offload::ACTIVATIONS],
        ),
        (Shard::None, Checkpoint::None, 3, vec![Offload::ACTIVATIONS]),
        (
            Shard::Grads,
            Checkpoint::Remat,
            2,
            vec![Offload::ACTIVATIONS],
        ),
        (
            Shard::Full,
            Checkpoint::Layer,
            4,
            vec![Offload::ACTIVATIONS],
        ),
    ];
    for workers in 1..=4 {
        for shard in [Shard::None, Shard::Optimizer, Shard::Full] {
            cases.push((shard, Checkpoint::Remat, workers, moments.to_vec()));
        }
    }
    for (shard, checkpoint, workers, offloads) in cases {
        let o = |offload: Offload| {
            let asked = Asked {
                checkpoint,
                offload: offload.into(),
                ..sharded(shard)
            };
            options_with(asked, workers, 3, None, None)
        };
        let kept = run(&o(Offload::NONE));
        for offload in offloads {
            let got = run(&o(offload));
            let what = format!(
                "--offload {offload} --shard {} --checkpoint {checkpoint}, {workers} workers",
                shard.name()
            );
            assert_eq!(got.0, kept.0, "{what}: losses and gradient norms");
            assert_eq!(got.1, kept.1, "{what}: final weights");
        }
    }
}

/// A run with its moments offloaded saves the moments a run without offload saves, bit for bit
/// (one worker, and two sharded), and resumed with them offloaded or not it continues the
/// uninterrupted run bit for bit.
#[test]
fn offloaded_moments_are_saved_and_resumed() {
    use distflash::model::Offload;
    let key = state::RunKey {
        config: options(Shard::None, 1, 0, None, None).config,
        data: Data::Synthetic { seed: 2 }.describe(),
        seq_len: 48,
        batch: 2,
    };
    for (workers, shard) in [(1, Shard::None), (2, Shard::Optimizer)] {
        let o = |offload: Offload, steps, save: Option<&Path>, resume: Option<&Path>| {
            let asked = Asked {
                offload: offload.into(),
                ..sharded(shard)
            };
            options_with(asked, workers, steps, save, resume)
        };
        let whole = run(&o(Offload::NONE, 10, None, None));
        let (plain, offloaded) = (temp_dir("moments-plain"), temp_dir("moments-offloaded"));
        run(&o(Offload::NONE, 5, Some(&plain), None));
        let first = run(&o(Offload::OPTIMIZER, 5, Some(&offloaded), None));
        assert_eq!(first.0, whole.0[..5], "{workers} workers: the first half");
        let load = |dir: &Path| state::load(&state::path_in(dir), &key).unwrap();
        let (a, b) = (load(&offloaded), load(&plain));
        for part in [
            state::Part::Weights,
            state::Part::FirstMoment,
            state::Part::SecondMoment,
        ] {
            assert_eq!(
                a.whole(part).unwrap(),
                b.whole(part).unwrap(),
                "{workers} workers: saved {part:?}"
            );
        }
        for offload in [Offload::OPTIMIZER, Offload::NONE, Offload::ALL] {
            let rest = run(&o(offload, 10, None, Some(&offloaded)));
            let what = format!("{workers} workers, resumed with --offload {offload}");
            assert_eq!(rest.0, whole.0[5..], "{what}: losses and gradient norms");
            assert_eq!(rest.1, whole.1, "{what}: final weights");
        }
        std::fs::remove_dir_all(plain).unwrap();
        std::fs::remove_dir_all(offloaded).unwrap();
    }
}
