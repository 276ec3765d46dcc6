//! Which keys each query sees. Always causal (a key at or before the query); optionally packed
//! documents (a query sees only its own document), a causal sliding window of W tokens (key k
//! visible to query q when q − W < k ≤ q) and G global prefix tokens every later token sees
//! (k < G and k ≤ q). Composed: k is visible to q iff k ≤ q and ((same document and within the
//! window) or k < G).
//!
//! Here, beside `Span`, because the plans (which blocks hold any visible pair) and the block math
//! (which pairs to add up) both read it, and `plan` and `block_math` import only `shape`.

use super::span::Span;
use crate::error::Error;
use anyhow::Result;
use serde::Serialize;
use std::fmt;

/// An attention mask over one sequence. The default is plain causal attention (one document, no
/// window, no global tokens), for a sequence of any length.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Mask {
    /// Document boundaries cu_seqlens style, `[0, l0, l0 + l1, …, seq]`; empty for one document.
    cu_seqlens: Vec<usize>,
    /// Keys a query sees back from itself, itself included; `None` for no window.
    window: Option<usize>,
    /// Tokens at the start of the sequence every later token sees, across documents.
    global: usize,
}

/// The keys one query sees: two disjoint runs of positions, the global prefix before the local
/// run (its own document, within the window, ending at the query itself). Either may be empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Visible {
    pub global: Span,
    pub local: Span,
}

impl Visible {
    /// The same keys as local indices of the key rows `kv` (a block's columns), clipped to them.
    pub fn relative_to(&self, kv: Span) -> Visible {
        Visible {
            global: self.global.relative_to(kv),
            local: self.local.relative_to(kv),
        }
    }

    /// How many keys are visible.
    pub fn count(&self) -> usize {
        self.global.len + self.local.len
    }
}

impl Mask {
    /// Full causal attention.
    pub fn causal() -> Mask {
        Mask::default()
    }

    /// The mask of a `seq`-token sequence packed from documents of `doc_lens` tokens (empty: one
    /// document), with an optional sliding `window` and `global` prefix tokens. Refuses, with a
    /// sentence, lengths that do not add up to `seq`, empty documents, a zero window and more
    /// global tokens than the sequence holds. Any lengths otherwise: no divisibility rules.
    pub fn new(
        seq: usize,
        doc_lens: &[usize],
        window: Option<usize>,
        global: usize,
    ) -> Result<Mask> {
        if let Some(i) = doc_lens.iter().position(|&l| l == 0) {
            return Err(Error::invalid_input(format!(
                "document {i} has length 0: every document needs at least one token"
            )));
        }
        let total: usize = doc_lens.iter().sum();
        if !doc_lens.is_empty() && total != seq {
            return Err(Error::invalid_input(format!(
                "the {} document lengths add up to {total} tokens but the sequence has {seq}: make them sum to the sequence length",
                doc_lens.len()
            )));
        }
        if window == Some(0) {
            return Err(Error::invalid_input(
                "a window of 0 tokens hides every key: use --window 1 or more (a token sees itself)",
            ));
        }
        if global > seq {
            return Err(Error::invalid_input(format!(
                "{global} global tokens do not fit a sequence of {seq}: use --global {seq} or fewer"
            )));
        }
        let cu_seqlens: Vec<usize> = if doc_lens.len() > 1 {
            std::iter::once(0)
                .chain(doc_lens.iter().scan(0, |end, &l| {
                    *end += l;
                    Some(*end)
                }))
                .collect()
        } else {
            Vec::new()
        };
        // A window as long as the sequence hides nothing; global tokens matter only where the
        // documents or the window hide something.
        let window = window.filter(|&w| w < seq);
        let restricted = !cu_seqlens.is_empty() || window.is_some();
        Ok(Mask {
            cu_seqlens,
            window,
            global: if restricted { global } else { 0 },
        })
    }

    /// True when the mask is plain causal attention: every block on or below the diagonal
    /// holds visible pairs, and the causal cost model and kernels apply unchanged.
    pub fn is_causal(&self) -> bool {
        *self == Mask::default()
    }

    /// Refuses a sequence of another length than the one the documents were given for.
    pub fn check_seq(&self, seq: usize) -> Result<()> {
        match self.cu_seqlens.last() {
            Some(&total) if total != seq => Err(Error::invalid_input(format!(
                "the documents cover {total} tokens but the sequence has {seq}: give document lengths that sum to the sequence length"
            ))),
            _ => Ok(()),
        }
    }

    /// Lengths of the documents, one for an unpacked sequence (empty: any length).
    pub fn doc_lens(&self) -> Vec<usize> {
        self.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect()
    }

    pub fn window(&self) -> Option<usize> {
        self.window
    }

    pub fn global(&self) -> usize {
        self.global
    }

    /// The keys query position `q` sees.
    pub fn visible(&self, q: usize) -> Visible {
        let doc_start = match self.cu_seqlens.partition_point(|&s| s <= q) {
            0 => 0,
            i => self.cu_seqlens[i - 1],
        };
        let local_start = match self.window {
            Some(w) => doc_start.max((q + 1).saturating_sub(w)),
            None => doc_start,
        };
        Visible {
            global: Span::between(0, self.global.min(local_start)),
            local: Span::between(local_start, q + 1),
        }
    }

    /// Visible (query, key) pairs of query rows `q` against key rows `kv`: a block's work.
    pub fn visible_pairs(&self, q: Span, kv: Span) -> u64 {
        (q.start..q.end())
            .map(|p| self.visible(p).relative_to(kv).count() as u64)
            .sum()
    }
}

impl fmt::Display for Mask {
    /// "causal", or what restricts it: "3 documents, window 256, 4 global tokens".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.cu_seqlens.is_empty() {
            parts.push(format!("{} documents", self.cu_seqlens.len() - 1));
        }
        if let Some(w) = self.window {
            parts.push(format!("window {w}"));
        }
        if self.global > 0 {
            parts.push(format!("{} global tokens", self.global));
        }
        if parts.is_empty() {
            f.write_str("causal")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, pair by pair.
    fn sees(doc_lens: &[usize], window: Option<usize>, global: usize, q: usize, k: usize) -> bool {
        let doc = |p: usize| {
            let mut end = 0;
            doc_lens
                .iter()
                .position(|&l| {
                    end += l;
                    p < end
                })
                .unwrap_or(0)
        };
        k <= q && ((doc(q) == doc(k) && window.is_none_or(|w| q - k < w)) || k < global)
    }

    #[test]
    fn visible_keys_follow_the_definition() {
        let seq = 23;
        let cases: [(&[usize], Option<usize>, usize); 8] = [
            (&[], None, 0),
            (&[23], Some(23), 5),
            (&[5, 1, 1, 9, 7], None, 0),
            (&[5, 1, 1, 9, 7], Some(3), 0),
            (&[5, 1, 1, 9, 7], Some(3), 2),
            (&[], Some(4), 3),
            (&[1; 23], Some(1), 7),
            (&[12, 11], Some(30), 23),
        ];
        for (docs, window, global) in cases {
            let mask = Mask::new(seq, docs, window, global).unwrap();
            for q in 0..seq {
                let v = mask.visible(q);
                assert!(
                    v.global.end() <= v.local.start,
                    "{docs:?} {window:?} {global} q{q}"
                );
                for k in 0..seq {
                    assert_eq!(
                        [v.global, v.local]
                            .iter()
                            .any(|s| (s.start..s.end()).contains(&k)),
                        sees(docs, window, global, q, k),
                        "{docs:?} {window:?} {global}: q{q} k{k}"
                    );
                }
            }
            // Block pair counts add up to the whole, for blocks cut anywhere.
            let cuts = [0, 4, 5, 13, 23];
            let spans: Vec<Span> = cuts.windows(2).map(|c| Span::between(c[0], c[1])).collect();
            let whole = mask.visible_pairs(Span::between(0, seq), Span::between(0, seq));
            let by_blocks: u64 = spans
                .iter()
                .flat_map(|&q| {
                    spans
                        .iter()
                        .map(|&kv| mask.visible_pairs(q, kv))
                        .collect::<Vec<_>>()
                })
                .sum();
            let direct = (0..seq)
                .flat_map(|q| (0..seq).map(move |k| (q, k)))
                .filter(|&(q, k)| sees(docs, window, global, q, k))
                .count() as u64;
            assert_eq!((whole, by_blocks), (direct, direct));
        }
    }

    #[test]
    fn trivial_masks_are_causal_and_bad_ones_are_refused_with_a_sentence() {
        assert!(Mask::new(10, &[10], Some(10), 3).unwrap().is_causal());
        assert!(Mask::new(10, &[], None, 4).unwrap().is_causal());
        assert!(!Mask::new(10, &[9, 1], None, 0).unwrap().is_causal());
        assert!(!Mask::new(10, &[], Some(9), 0).unwrap().is_causal());
        let err = |r: Result<Mask>| r.unwrap_err().to_string();
        assert!(err(Mask::new(10, &[3, 4], None, 0)).contains("add up to 7"));
        assert!(err(Mask::new(10, &[10, 0], None, 0)).contains("document 1 has length 0"));
        assert!(err(Mask::new(10, &[], Some(0), 0)).contains("--window 1"));
        assert!(err(Mask::new(10, &[], Some(2), 11)).contains("--global 10"));
        let packed = Mask::new(10, &[3, 7], Some(4), 1).unwrap();
        assert_eq!(packed.doc_lens(), vec![3, 7]);
        assert!(packed.check_seq(10).is_ok());
        assert!(
            packed
                .check_seq(12)
                .unwrap_err()
                .to_string()
                .contains("cover 10")
        );
        assert_eq!(packed.to_string(), "2 documents, window 4, 1 global tokens");
        assert_eq!(Mask::causal().to_string(), "causal");
    }

    #[test]
    fn a_refused_mask_is_the_callers_input_in_its_own_sentence() {
        use crate::error::{ErrorKind, kind_of};
        let e = Mask::new(16, &[5, 10], None, 0).unwrap_err();
        assert_eq!(kind_of(&e), Some(ErrorKind::InvalidInput));
        assert_eq!(
            format!("{e:#}"),
            "the 2 document lengths add up to 15 tokens but the sequence has 16: make them sum to the sequence length"
        );
        for bad in [
            Mask::new(16, &[0, 16], None, 0),
            Mask::new(16, &[], Some(0), 0),
            Mask::new(16, &[8, 8], None, 17),
            Mask::new(16, &[8, 8], None, 0).and_then(|m| m.check_seq(12).map(|()| m)),
        ] {
            assert_eq!(kind_of(&bad.unwrap_err()), Some(ErrorKind::InvalidInput));
        }
    }
}
