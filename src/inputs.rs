//! Random attention inputs from a seed, so a run, its check and a peer's check all see the same
//! numbers.

use crate::attn::Dims;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

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
    /// scale shows), V and dO in [−1, 1).
    pub fn random(dims: Dims, seq: usize, seed: u64) -> Inputs {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut fill = |len: usize, amp: f32| -> Vec<f32> {
            (0..len).map(|_| rng.random_range(-amp..amp)).collect()
        };
        Inputs {
            q: fill(dims.q_len(seq), 2.0),
            k: fill(dims.kv_len(seq), 2.0),
            v: fill(dims.kv_len(seq), 1.0),
            dout: fill(dims.q_len(seq), 1.0),
            dims,
            seq,
        }
    }
}
