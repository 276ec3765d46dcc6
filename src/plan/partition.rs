//! How one sequence is cut among the workers, decided once: the chunk spans, which worker owns
//! which chunk, and the forward and backward plans over them (under the sequence's mask, so
//! blocks it hides are left out of both). Every layer above (the executor,
//! the training loop, the simulator, the memory estimate) reads this instead of recomputing it.

use super::parts::{Pass, Schedule};
use super::plans::{Plan, chunk_sizes};
use crate::shape::{Mask, Span};
use anyhow::Result;

/// A sequence of `seq` tokens split across `workers` workers by `schedule`.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    seq: usize,
    spans: Vec<Span>,
    forward: Plan,
    backward: Plan,
}

impl Partition {
    /// Chunks of consecutive rows whose sizes differ by at most one (see [`chunk_sizes`]), and
    /// the schedule's plans of full causal attention over them. Refuses a sequence shorter
    /// than the chunk count.
    pub fn new(seq: usize, workers: usize, schedule: Schedule) -> Result<Partition> {
        Partition::masked(seq, workers, schedule, &Mask::causal())
    }

    /// [`Partition::new`]'s chunks with the plans of attention under `mask`: blocks it hides
    /// entirely are neither computed nor fetched. Documents need not align with chunks.
    pub fn masked(
        seq: usize,
        workers: usize,
        schedule: Schedule,
        mask: &Mask,
    ) -> Result<Partition> {
        mask.check_seq(seq)?;
        let spans: Vec<Span> = chunk_sizes(seq, workers, schedule)?
            .into_iter()
            .scan(0, |start, len| {
                let span = Span { start: *start, len };
                *start += len;
                Some(span)
            })
            .collect();
        let forward = Plan::masked(workers, schedule, Pass::Forward, &spans, mask)?;
        Ok(Partition {
            seq,
            spans,
            backward: forward.for_pass(Pass::Backward),
            forward,
        })
    }

    /// The mask both plans were made for.
    pub fn mask(&self) -> &Mask {
        &self.forward.mask
    }

    /// Visible (query, key) pairs of block (`q_chunk`, `kv_chunk`): its real work.
    pub fn visible_pairs(&self, q_chunk: usize, kv_chunk: usize) -> u64 {
        self.mask()
            .visible_pairs(self.spans[q_chunk], self.spans[kv_chunk])
    }

    /// Tokens of the whole sequence.
    pub fn seq(&self) -> usize {
        self.seq
    }

    pub fn workers(&self) -> usize {
        self.forward.workers
    }

    pub fn schedule(&self) -> Schedule {
        self.forward.schedule
    }

    /// Every chunk's rows, in sequence order (chunk `c` is `spans()[c]`).
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    pub fn plan(&self, pass: Pass) -> &Plan {
        match pass {
            Pass::Forward => &self.forward,
            Pass::Backward => &self.backward,
        }
    }

    /// The chunks `worker` owns, in sequence order (one; a zigzag worker's head and tail).
    pub fn chunks_of(&self, worker: usize) -> Vec<usize> {
        self.forward.chunks_of(worker)
    }

    /// The rows of the chunks `worker` owns, in sequence order: a worker holds them as one
    /// tensor, chunk after chunk.
    pub fn own_spans(&self, worker: usize) -> Vec<Span> {
        self.chunks_of(worker)
            .into_iter()
            .map(|c| self.spans[c])
            .collect()
    }

    /// How many rows `worker` holds.
    pub fn rows_of(&self, worker: usize) -> usize {
        self.own_spans(worker).iter().map(|s| s.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_tile_the_sequence_and_every_row_has_one_owner() {
        for schedule in [
            Schedule::Balanced,
            Schedule::Unbalanced,
            Schedule::Zigzag,
            Schedule::Greedy,
        ] {
            for workers in 1..=5 {
                for seq in [schedule.chunks(workers), 17, 64, 101] {
                    let p = Partition::new(seq, workers, schedule).unwrap();
                    let mut next = 0;
                    for s in p.spans() {
                        assert_eq!(s.start, next, "{schedule} {workers} {seq}");
                        next = s.end();
                    }
                    assert_eq!(next, seq);
                    let mut owned: Vec<Span> = (0..workers).flat_map(|w| p.own_spans(w)).collect();
                    owned.sort_by_key(|s| s.start);
                    assert_eq!(owned, p.spans());
                    let rows: usize = (0..workers).map(|w| p.rows_of(w)).sum();
                    assert_eq!(rows, seq);
                }
            }
        }
        let zz = Partition::new(8, 2, Schedule::Zigzag).unwrap();
        assert_eq!(zz.chunks_of(0), vec![0, 3]);
        assert_eq!(
            zz.own_spans(1),
            vec![Span { start: 2, len: 2 }, Span { start: 4, len: 2 }]
        );
        assert!(Partition::new(3, 2, Schedule::Zigzag).is_err());
    }
}
