//! One rank's call of distributed attention on the chunk its caller holds: the entry of the
//! Python binding's `dist_flash_attn`, where every rank of a group passes its own rows and
//! nothing else (no whole sequence exists anywhere). From the rank's row count, the world and
//! the schedule it derives the [`Partition`] every rank derives alike (ranks hold equal chunks,
//! so none needs to hear another's size), checks the tensors it is handed against it, and runs
//! the executor's forward and backward over any backend and communicator: in-process channels
//! between virtual ranks, NCCL between processes. The same plans, prefetch and tags as
//! `distflash attention`; only the caller owning the tensors differs.
//!
//! Tensors are the executor's: head-major, one per own chunk (a balanced rank holds one, a
//! zigzag rank two: chunks r and 2P − 1 − r, in sequence order).

use crate::backend::Backend;
use crate::block_math::{Grads, Partial};
use crate::comm::{Communicator, Wire};
use crate::error::Error;
use crate::exec::{OwnChunk, Saved, Worker};
use crate::plan::{Partition, Pass, Schedule};
use crate::shape::{Dims, Mask};
use anyhow::Result;

/// The schedules a caller holding equal chunks can name (`unbalanced` idles half the ranks,
/// `greedy` equals `balanced` without a mask, so neither is offered).
pub const SCHEDULES: [Schedule; 2] = [Schedule::Balanced, Schedule::Zigzag];

/// Rank `rank` of `world`, holding `rows` consecutive rows of the sequence as it is split by
/// `schedule`, under a mask over the whole sequence: the partition and the checks of one call.
#[derive(Clone, Debug)]
pub struct RankAttention {
    pub dims: Dims,
    pub rank: usize,
    partition: Partition,
}

impl RankAttention {
    /// Refuses, with a sentence, a world of 0, a rank outside it, a schedule other than
    /// `balanced` and `zigzag`, an empty chunk, under `zigzag` an odd one (its two halves are
    /// chunks of the plan and must be equal), and a `mask` made for another sequence length
    /// than `rows × world`. Blocks the mask hides wholly are neither computed nor fetched.
    pub fn new(
        dims: Dims,
        rows: usize,
        world: usize,
        rank: usize,
        schedule: Schedule,
        mask: &Mask,
    ) -> Result<Self> {
        dims.validate()?;
        if world == 0 {
            return Err(Error::invalid_input(
                "the world size is 0; a group needs at least one rank",
            ));
        }
        if rank >= world {
            return Err(Error::invalid_input(format!(
                "rank {rank} is outside a world of {world} ranks (0..{world})"
            )));
        }
        if !SCHEDULES.contains(&schedule) {
            return Err(Error::invalid_input(format!(
                "schedule '{schedule}' is not offered here: use 'balanced' or 'zigzag'"
            )));
        }
        if rows == 0 {
            return Err(Error::invalid_input(
                "this rank's chunk is empty; every rank must hold at least one token",
            ));
        }
        if schedule == Schedule::Zigzag && !rows.is_multiple_of(2) {
            return Err(Error::invalid_input(format!(
                "under 'zigzag' each rank holds two equal chunks (r and 2P-1-r), but this rank holds {rows} tokens, an odd number; make the sequence a multiple of 2 x world = {}",
                2 * world
            )));
        }
        let partition = Partition::masked(rows * world, world, schedule, mask)?;
        debug_assert_eq!(
            partition.rows_of(rank),
            rows,
            "equal chunks by construction"
        );
        Ok(RankAttention {
            dims,
            rank,
            partition,
        })
    }

    /// Rows of each chunk this rank owns, in sequence order (one, or a zigzag rank's two).
    pub fn chunk_rows(&self) -> Vec<usize> {
        self.partition
            .own_spans(self.rank)
            .iter()
            .map(|s| s.len)
            .collect()
    }

    /// The whole sequence's partition (the same on every rank).
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Refuses a communicator of another group shape, or tensors of other lengths than this
    /// rank's chunks need: a sentence instead of a receive that never matches or a kernel
    /// reading past a tensor.
    fn check<T: Wire, C: Communicator<T>>(&self, comm: &C, own: &[OwnChunk<T>]) -> Result<()> {
        let world = self.partition.workers();
        if (comm.rank(), comm.world()) != (self.rank, world) {
            return Err(Error::invalid_input(format!(
                "the call is for rank {} of {world}, but its communicator is rank {} of {}",
                self.rank,
                comm.rank(),
                comm.world()
            )));
        }
        let rows = self.chunk_rows();
        if own.len() != rows.len() {
            return Err(Error::invalid_input(format!(
                "rank {} owns {} chunks under '{}', but was handed {}",
                self.rank,
                rows.len(),
                self.partition.schedule(),
                own.len()
            )));
        }
        for (c, (chunk, &n)) in own.iter().zip(&rows).enumerate() {
            let (q, kv) = (self.dims.q_len(n), self.dims.kv_len(n));
            for (t, want, what) in [(&chunk.q, q, "q"), (&chunk.k, kv, "k"), (&chunk.v, kv, "v")] {
                check_len(t, want, what, c)?;
            }
        }
        Ok(())
    }

    /// The forward of this rank's chunks (`own`, in sequence order): their final O (f32) and
    /// LSE, in the same order. Every rank of the group must call it together.
    pub fn forward<B: Backend, C: Communicator<B::Tensor>>(
        &self,
        backend: &B,
        comm: &mut C,
        own: &[OwnChunk<B::Tensor>],
    ) -> Result<Vec<Partial<B::Tensor>>>
    where
        B::Tensor: Wire,
    {
        self.check(comm, own)?;
        Worker::new(backend, comm, self.dims, self.partition.spans())
            .forward(self.partition.plan(Pass::Forward), own)
    }

    /// The backward of this rank's chunks from the forward's O and LSE and the output's
    /// gradient dO (one each per own chunk, in order): dQ, dK, dV (f32) per chunk. D =
    /// rowsum(dO ∘ O) is computed here, so O is read only for it.
    pub fn backward<B: Backend, C: Communicator<B::Tensor>>(
        &self,
        backend: &B,
        comm: &mut C,
        own: &[OwnChunk<B::Tensor>],
        forward: Vec<Partial<B::Tensor>>,
        dout: Vec<B::Tensor>,
    ) -> Result<Vec<Grads<B::Tensor>>>
    where
        B::Tensor: Wire,
    {
        self.check(comm, own)?;
        let rows = self.chunk_rows();
        if forward.len() != rows.len() || dout.len() != rows.len() {
            return Err(Error::invalid_input(format!(
                "rank {} owns {} chunks, but was handed {} forward results and {} output gradients",
                self.rank,
                rows.len(),
                forward.len(),
                dout.len()
            )));
        }
        let mut saved = Vec::with_capacity(rows.len());
        for (c, ((f, dout), &n)) in forward.into_iter().zip(dout).zip(&rows).enumerate() {
            let (q, stat) = (self.dims.q_len(n), self.dims.stat_len(n));
            check_len(&f.out, q, "the output", c)?;
            check_len(&f.lse, stat, "the LSE", c)?;
            check_len(&dout, q, "the output's gradient", c)?;
            saved.push(Saved {
                delta: backend.delta(&self.dims, n, &f.out, &dout)?,
                dout,
                lse: f.lse,
            });
        }
        Worker::new(backend, comm, self.dims, self.partition.spans()).backward(
            self.partition.plan(Pass::Backward),
            own,
            &saved,
        )
    }
}

fn check_len<T: Wire>(t: &T, want: usize, what: &str, chunk: usize) -> Result<()> {
    if t.elements() != want {
        return Err(Error::invalid_input(format!(
            "{what} of own chunk {chunk} holds {} elements where its rows need {want}",
            t.elements()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorKind, kind_of};

    #[test]
    fn every_refusal_of_a_call_is_the_callers_input() {
        let dims = Dims {
            batch: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let new = |d, rows, world, rank, s, mask: &Mask| {
            RankAttention::new(d, rows, world, rank, s, mask).unwrap_err()
        };
        let causal = Mask::causal();
        let of_ten = Mask::new(10, &[5, 5], None, 0).unwrap();
        let bad_dims = Dims {
            kv_heads: 3,
            ..dims
        };
        for (e, sentence) in [
            (
                new(dims, 8, 0, 0, Schedule::Balanced, &causal),
                "the world size is 0; a group needs at least one rank",
            ),
            (
                new(dims, 8, 2, 2, Schedule::Balanced, &causal),
                "rank 2 is outside a world of 2 ranks (0..2)",
            ),
            (
                new(dims, 8, 2, 0, Schedule::Unbalanced, &causal),
                "schedule 'unbalanced' is not offered here: use 'balanced' or 'zigzag'",
            ),
            (
                new(dims, 0, 2, 0, Schedule::Balanced, &causal),
                "this rank's chunk is empty; every rank must hold at least one token",
            ),
            (
                new(bad_dims, 8, 2, 0, Schedule::Balanced, &causal),
                "heads (2) must be a multiple of kv-heads (3): each KV head serves an equal group of query heads",
            ),
            (
                new(dims, 8, 2, 0, Schedule::Balanced, &of_ten),
                "the documents cover 10 tokens but the sequence has 16: give document lengths that sum to the sequence length",
            ),
        ] {
            assert_eq!(format!("{e:#}"), sentence);
            assert_eq!(kind_of(&e), Some(ErrorKind::InvalidInput), "{e:#}");
        }
        let e = new(dims, 7, 2, 0, Schedule::Zigzag, &causal);
        assert!(format!("{e:#}").contains("holds 7 tokens, an odd number"));
        assert_eq!(kind_of(&e), Some(ErrorKind::InvalidInput));
    }
}
