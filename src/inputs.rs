//! Random attention inputs from a seed, so a run, its check and a peer's check all see the same
//! numbers.

use crate::attn::oracle::Problem;
use crate::shape::Dims;
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

/// Whole-sequence Q, K, V and dO in head-major layout (see `attn`).
pub struct Inputs {
    pub dims: Dims,
    pub seq: usize,
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
        }
    }

    /// The oracle's view of these inputs.
    pub fn problem(&self) -> Problem<'_> {
        Problem {
            dims: self.dims,
            seq: self.seq,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            dout: &self.dout,
        }
    }
}
