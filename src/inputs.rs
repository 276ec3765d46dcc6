//! Random attention inputs from a seed, so a run, its check and a peer's check all see the same
//! numbers.

use crate::block_math::oracle::Problem;
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;

/// Values per independently seeded block.
const BLOCK: usize = 1 << 16;

/// `len` values uniform in [−amp, amp) for tensor number `tensor` of a seeded set.
fn uniform(len: usize, amp: f32, seed: u64, tensor: u64) -> Vec<f32> {
    let mut v = vec![0.0f32; len];
    v.par_chunks_mut(BLOCK).enumerate().for_each(|(i, block)| {
        let stream = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((tensor << 48) ^ i as u64);
        let mut rng = StdRng::seed_from_u64(stream);
        block
            .iter_mut()
            .for_each(|x| *x = rng.random_range(-amp..amp));
    });
    v
}

/// Whole-sequence Q, K, V and dO in head-major layout (see `block_math`), and the mask attention
/// runs under.
pub struct Inputs {
    pub dims: Dims,
    pub seq: usize,
    pub mask: Mask,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub dout: Vec<f32>,
}

impl Inputs {
    /// Uniform values: Q and K in [−2, 2) so softmax rows are far from uniform (a wrong mask or
    /// scale shows), V and dO in [−1, 1). Generated in parallel (long sequences hold billions
    /// of values), each block of values from its own seeded stream, so the result depends on
    /// the seed alone, not on the thread count.
    pub fn random(dims: Dims, seq: usize, seed: u64) -> Inputs {
        Inputs {
            q: uniform(dims.q_len(seq), 2.0, seed, 0),
            k: uniform(dims.kv_len(seq), 2.0, seed, 1),
            v: uniform(dims.kv_len(seq), 1.0, seed, 2),
            dout: uniform(dims.q_len(seq), 1.0, seed, 3),
            dims,
            seq,
            mask: Mask::causal(),
        }
    }

    /// The same inputs under `mask`, refused if it was made for another sequence length.
    pub fn with_mask(self, mask: Mask) -> Result<Inputs> {
        mask.check_seq(self.seq)?;
        Ok(Inputs { mask, ..self })
    }

    /// The oracle's view of these inputs.
    pub fn problem(&self) -> Problem<'_> {
        Problem {
            dims: self.dims,
            seq: self.seq,
            mask: &self.mask,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            dout: &self.dout,
        }
    }
}

/// `count` random document lengths, each at least one token, adding up to `seq`: the packing
/// `--docs random:N` tests. Cut points are drawn uniformly from the seed (so one-token
/// documents and documents longer than a chunk both occur), the same for every run of a seed.
pub fn random_doc_lens(seq: usize, count: usize, seed: u64) -> Result<Vec<usize>> {
    if count == 0 || count > seq {
        bail!(
            "cannot pack {seq} tokens into {count} documents of at least one token: use 1 to {seq} documents"
        );
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0xD0C5_D0C5_D0C5_D0C5);
    let mut cuts = std::collections::BTreeSet::new();
    while cuts.len() < count - 1 {
        cuts.insert(rng.random_range(1..seq));
    }
    let bounds: Vec<usize> = std::iter::once(0)
        .chain(cuts)
        .chain(std::iter::once(seq))
        .collect();
    Ok(bounds.windows(2).map(|w| w[1] - w[0]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_documents_cover_the_sequence_and_depend_on_the_seed_alone() {
        for (seq, count) in [(1, 1), (10, 10), (100, 7), (5000, 3)] {
            let lens = random_doc_lens(seq, count, 4).unwrap();
            assert_eq!(lens.len(), count);
            assert_eq!(lens.iter().sum::<usize>(), seq);
            assert!(lens.iter().all(|&l| l >= 1));
            assert_eq!(lens, random_doc_lens(seq, count, 4).unwrap());
        }
        assert_ne!(
            random_doc_lens(100, 7, 1).unwrap(),
            random_doc_lens(100, 7, 2).unwrap()
        );
        assert!(random_doc_lens(5, 6, 0).is_err());
        assert!(random_doc_lens(5, 0, 0).is_err());
    }
}
