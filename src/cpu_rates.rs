//! Rates measured on this machine, so attention speed is stated against what the hardware does
//! on plain matrix products in the same run, not against a datasheet.

use crate::backend::{Backend, cpu::CpuBackend};
use crate::block_math::{self, Block};
use crate::inputs::Inputs;
use crate::shape::{Dims, Span};
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;
use std::time::Instant;

/// Median of `repeats` timings of `f`, in seconds, after one warm-up run.
pub fn median_secs(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// f32 matrix-multiply rate (GFLOP/s) on all cores: `size`³ products, their rows split in panels
/// across rayon threads, each panel through the same matrixmultiply kernels attention uses.
pub fn cpu_matmul_gflops(size: usize, repeats: usize) -> f64 {
    let a: Vec<f32> = (0..size * size).map(|i| (i % 13) as f32 - 6.0).collect();
    let b = Array2::from_shape_fn((size, size), |(i, j)| ((i * 5 + j * 11) % 17) as f32 - 8.0);
    let mut c = vec![0.0f32; size * size];
    let panel = size.div_ceil(rayon::current_num_threads() * 4).max(16) * size;
    let secs = median_secs(repeats, || {
        c.par_chunks_mut(panel)
            .zip(a.par_chunks(panel))
            .for_each(|(c, a)| {
                let rows = a.len() / size;
                let a = ArrayView2::from_shape((rows, size), a).expect("panel shape");
                let mut c = ArrayViewMut2::from_shape((rows, size), c).expect("panel shape");
                general_mat_mul(1.0, &a, &b, 0.0, &mut c);
            });
    });
    2.0 * (size as f64).powi(3) / secs / 1e9
}

/// Single-worker causal attention forward rate (GFLOP/s, counted as 4·N²·H·d/2) on the CPU.
pub fn cpu_attention_forward_gflops(dims: Dims, seq: usize, repeats: usize) -> f64 {
    let x = Inputs::random(dims, seq, 0);
    let whole = Span { start: 0, len: seq };
    let backend = CpuBackend;
    let secs = median_secs(repeats, || {
        let mut state = backend.new_state(&dims, seq).expect("cpu state");
        let block = Block {
            q: whole,
            kv: whole,
        };
        block_math::forward_block(&dims, block, &x.mask, &x.q, &x.k, &x.v, &mut state);
        std::hint::black_box(block_math::finalize(dims.head_dim, state));
    });
    block_math::causal_forward_flops(&dims, seq) / secs / 1e9
}
