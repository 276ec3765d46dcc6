//! One rank of a multi-process job: the rendezvous (ranks check that they were started alike),
//! the communicators (a TCP mesh between CPU ranks; NCCL between GPU ranks, rank 0's NCCL id
//! handed out by the rendezvous, with the TCP mesh beside it to carry failures and results),
//! and the end of the job: a failure announced to every rank, outputs gathered to rank 0.

use super::job::{Collect, Job, Waits, is_peer_failure};
use crate::backend::cuda::CudaBackend;
use crate::comm::nccl::{self, NcclComm};
use crate::comm::rendezvous::{self, LaunchEnv};
use crate::comm::{Communicator, Tag, TcpComm, connect_mesh};
use crate::model::cpu::Cpu;
use crate::model::cuda::CudaOps;
use anyhow::Result;

/// Tag of the gathered outputs: above the plans' (pass << 40) tags, below the collectives'.
const GATHER: Tag = Tag(1 << 50);

/// The TCP mesh of this rank, after a rendezvous that hands out `payload` (rank 0's).
fn join_mesh(
    (args_hash, waits): (u64, Waits),
    env: &LaunchEnv,
    payload: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<(TcpComm, Vec<u8>)> {
    let joined = rendezvous::join(env, args_hash, waits.rendezvous, payload)?;
    let payload = joined.payload.clone();
    let mesh = connect_mesh(joined, waits.rendezvous, waits.message)?;
    Ok((mesh, payload))
}

/// Runs `job` as this CPU rank: the TCP mesh carries the tensors too.
pub(super) fn on_cpu_rank<J: Job>(
    rt: (u64, Waits),
    env: &LaunchEnv,
    job: &J,
    collect: Collect<J::Output>,
) -> Result<Option<Vec<J::Output>>> {
    let (mut comm, _) = join_mesh(rt, env, || Ok(Vec::new()))?;
    let mine = job.run(&Cpu::<f32>::new(), &mut comm);
    finish(mine, &mut comm, collect)
}

/// Runs `job` as this GPU rank: NCCL carries the tensors, the TCP mesh ends every rank with the
/// reason when one fails and carries the outputs to rank 0.
pub(super) fn on_gpu_rank<J: Job>(
    rt: (u64, Waits),
    env: &LaunchEnv,
    backend: CudaBackend,
    job: &J,
    collect: Collect<J::Output>,
) -> Result<Option<Vec<J::Output>>> {
    let (mut host, id) = join_mesh(rt, env, nccl::new_id)?;
    let mine = CudaOps::new(backend).and_then(|ops| {
        let mut comm = NcclComm::connect(ops.backend(), env.rank, env.world, &id)?;
        job.run(&ops, &mut comm)
    });
    finish(mine, &mut host, collect)
}

/// This rank's end of the job over the host mesh `host`: a failure is announced to every rank
/// (unless it is only the report of another's); outputs go to rank 0 as `collect` says.
fn finish<R, H: Communicator<Vec<f32>>>(
    mine: Result<R>,
    host: &mut H,
    collect: Collect<R>,
) -> Result<Option<Vec<R>>> {
    let mine = match mine {
        Ok(mine) => mine,
        Err(e) => {
            if !is_peer_failure(&e) {
                host.abort(&format!("{e:#}"));
            }
            return Err(e);
        }
    };
    let all = match collect {
        Collect::Reporter => (host.rank() == 0).then(|| vec![mine]),
        Collect::All { to_parts, .. } if host.rank() != 0 => {
            let parts = to_parts(&mine);
            host.send(0, GATHER, &parts.iter().collect::<Vec<_>>())?;
            None
        }
        Collect::All { from_parts, .. } => {
            let mut all = vec![mine];
            for from in 1..host.world() {
                let parts = host.recv(from, GATHER)?;
                all.push(
                    from_parts(parts)
                        .map_err(|e| e.context(format!("results of worker {from}")))?,
                );
            }
            Some(all)
        }
    };
    host.barrier()?;
    Ok(all)
}
