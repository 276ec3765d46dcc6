//! Packed documents in training: where a sequence's documents end (each end-of-document token
//! ends one, and belongs to it), and, asked for, the rotary positions restarted at each
//! document's start, so a packed sequence of documents A, B trains as A and B would alone (as
//! packed training with position ids does in transformers and torchtitan). The mask itself, the
//! documents' lengths with the model's sliding window, is `Config::mask`'s; every worker derives
//! it from the same sample, so it costs no communication.

use crate::shape::Span;
use anyhow::{Result, bail};
use serde::Serialize;

/// What a sequence packed from several documents attends across (`--documents`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Documents {
    /// Full causal attention across the packed documents (the documents see each other).
    #[default]
    Packed,
    /// Each token sees only its own document: attention is masked at the boundaries.
    Separate,
}

/// Where rotary positions count from (`--positions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Positions {
    /// A token's position in the sequence.
    #[default]
    Continue,
    /// A token's position in its document: 0 at every document's first token.
    Restart,
}

/// How training treats the documents packed into its sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Packing {
    pub documents: Documents,
    pub positions: Positions,
}

impl Packing {
    /// Full causal attention and positions in the sequence: what training did before documents.
    pub fn packed() -> Packing {
        Packing::default()
    }

    /// Documents masked at their boundaries, their positions restarted or not.
    pub fn separate(positions: Positions) -> Packing {
        Packing {
            documents: Documents::Separate,
            positions,
        }
    }

    /// Refuses restarted positions in documents that see each other: a token would attend to
    /// the tokens before its document at positions that no longer say how far back they are.
    pub fn check(&self) -> Result<()> {
        if self.positions == Positions::Restart && self.documents == Documents::Packed {
            bail!(
                "--positions restart restarts rotary positions at each document, but --documents packed lets documents see each other: add --documents separate"
            );
        }
        Ok(())
    }
}

/// Lengths of the documents of `inputs`: every `eos` ends one (the token is its last), and the
/// tokens after the last `eos` are one more. Without an end-of-document token (synthetic data)
/// the sequence is one document.
pub fn doc_lens(inputs: &[u32], eos: Option<u32>) -> Vec<usize> {
    let mut lens = Vec::new();
    let mut start = 0;
    if let Some(eos) = eos {
        for (i, &t) in inputs.iter().enumerate() {
            if t == eos {
                lens.push(i + 1 - start);
                start = i + 1;
            }
        }
    }
    if start < inputs.len() {
        lens.push(inputs.len() - start);
    }
    lens
}

/// The rotary positions of the rows `mine` (runs of sequence positions, in row order) when every
/// document of `doc_lens` starts again at 0: each run cut where a document starts, each piece
/// counting from its offset in its document. Covers the same rows as `mine`, in the same order.
pub fn restarted(mine: &[Span], doc_lens: &[usize]) -> Vec<Span> {
    let starts: Vec<usize> = doc_lens
        .iter()
        .scan(0, |end, &l| {
            let start = *end;
            *end += l;
            Some(start)
        })
        .collect();
    let doc_start = |p: usize| match starts.partition_point(|&s| s <= p) {
        0 => 0,
        i => starts[i - 1],
    };
    let mut runs = Vec::new();
    for run in mine {
        let mut at = run.start;
        while at < run.end() {
            let next = starts[starts.partition_point(|&s| s <= at)..]
                .first()
                .map_or(run.end(), |&s| s.min(run.end()));
            runs.push(Span {
                start: at - doc_start(at),
                len: next - at,
            });
            at = next;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_of_document_token_ends_its_document() {
        assert_eq!(doc_lens(&[5, 9, 5, 7, 8], Some(9)), vec![2, 3]);
        assert_eq!(doc_lens(&[9, 9, 1, 9], Some(9)), vec![1, 1, 2]);
        assert_eq!(doc_lens(&[1, 2, 3], Some(9)), vec![3]);
        assert_eq!(doc_lens(&[1, 9, 3], None), vec![3]);
    }

    /// Each row's restarted position is its distance from its document's first token, the
    /// definition, for runs cut anywhere (documents crossing runs, ending at a run's end, of
    /// one token).
    #[test]
    fn restarted_positions_count_from_each_document_start() {
        let docs = [1, 5, 1, 9, 7];
        let starts = [0, 1, 6, 7, 16];
        let doc_of = |p: usize| starts.into_iter().rfind(|&s| s <= p).unwrap();
        let cases: [&[Span]; 3] = [
            &[Span { start: 0, len: 23 }],
            &[Span { start: 3, len: 4 }, Span { start: 14, len: 9 }],
            &[Span { start: 6, len: 1 }, Span { start: 16, len: 1 }],
        ];
        for mine in cases {
            let runs = restarted(mine, &docs);
            let got: Vec<usize> = runs.iter().flat_map(|r| r.start..r.end()).collect();
            let want: Vec<usize> = mine
                .iter()
                .flat_map(|r| r.start..r.end())
                .map(|p| p - doc_of(p))
                .collect();
            assert_eq!(got, want, "{mine:?}");
        }
        let whole = restarted(&[Span { start: 0, len: 23 }], &docs);
        assert_eq!(whole.len(), docs.len(), "one run a document");
    }
}
