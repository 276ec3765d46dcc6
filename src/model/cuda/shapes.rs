//! Launch shapes of the model kernels, as plain arithmetic so CI checks them without a GPU.
//! Elementwise kernels use the attention backend's `elementwise_config` (over a thread per 8
//! elements for those that move 8 at a time: [`vector`]); the loss's row chunks, a memory
//! budget the estimate counts too, are `model::cost`'s.

use crate::backend::cuda::elementwise_config;
use crate::model::config::MAX_HIDDEN_SIZE;
use anyhow::{Result, anyhow, bail};
use cudarc::driver::LaunchConfig;

/// Threads per block of the per-row loss kernel and the reductions.
const BLOCK: u32 = 256;
/// Blocks of the gradient-norm reduction (one f64 partial each, summed on the host).
pub(crate) const REDUCE_BLOCKS: usize = 1024;
/// Row groups of a bias's gradient: each adds every `ROW_GROUPS`-th row of its columns.
const ROW_GROUPS: usize = 64;
/// Runs of 8 columns each thread of the norm's backward holds (`NORM_RUNS` in kernels/model.cu).
const NORM_RUNS: usize = 4;
/// Threads the norm's backward spreads over the card: about as many as it holds at once (an
/// H100's 132 SMs of 2048 are 270K), so every row's loads are in flight while each block's
/// gain gradient leaves in one atomic a column.
const NORM_THREADS: usize = 1 << 18;

/// The elementwise kernels that move 8 elements a thread (`ELEMENTWISE` in kernels/model.cu):
/// the backend's elementwise shape over one thread per 8 elements.
pub(crate) fn vector(len: usize) -> LaunchConfig {
    elementwise_config(len.div_ceil(8))
}

/// One block of [`BLOCK`] threads per row (the loss and norm kernels).
pub(crate) fn block_per_row(rows: usize) -> Result<LaunchConfig> {
    let blocks = u32::try_from(rows.max(1))
        .map_err(|_| anyhow!("{rows} rows are too many for one launch"))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The norm's backward (`rmsnorm_backward`): a block covers a row with runs of 8 columns a
/// thread, at most [`NORM_RUNS`] runs (a block of [`BLOCK`] where that covers it, else wider,
/// up to 1024: [`MAX_HIDDEN_SIZE`] columns), and the grid takes the rows in turn.
pub(crate) fn norm_backward(rows: usize, dim: usize) -> Result<LaunchConfig> {
    let runs_of = |per: usize| dim.div_ceil(per).next_multiple_of(32).max(32);
    let threads = runs_of(8).min(BLOCK as usize).max(runs_of(8 * NORM_RUNS));
    if threads > 1024 {
        bail!(
            "a norm over {dim} columns is wider than the GPU's norm backward takes ({MAX_HIDDEN_SIZE})"
        );
    }
    let blocks = rows.clamp(1, NORM_THREADS / threads);
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The sum-of-squares reduction: at most [`REDUCE_BLOCKS`] blocks, so as many partials.
pub(crate) fn reduce(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            len.div_ceil(BLOCK as usize).clamp(1, REDUCE_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Column sums over rows: a thread per column (x), [`ROW_GROUPS`] row groups (y).
pub(crate) fn column_sums(cols: usize, rows: usize) -> Result<LaunchConfig> {
    let x = u32::try_from(cols.div_ceil(BLOCK as usize).max(1))
        .map_err(|_| anyhow!("{cols} columns are too many for one launch"))?;
    Ok(LaunchConfig {
        grid_dim: (x, rows.clamp(1, ROW_GROUPS) as u32, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes() {
        assert_eq!(block_per_row(0).unwrap().grid_dim, (1, 1, 1));
        assert_eq!(block_per_row(2097).unwrap().grid_dim, (2097, 1, 1));
        assert_eq!(block_per_row(7).unwrap().block_dim.0 % 32, 0);
        assert_eq!(reduce(10).grid_dim.0, 1);
        assert_eq!(reduce(1 << 30).grid_dim.0, REDUCE_BLOCKS as u32);
        let c = column_sums(4096, 10).unwrap();
        assert_eq!((c.grid_dim.0, c.grid_dim.1), (16, 10));
        assert_eq!(column_sums(64, 100_000).unwrap().grid_dim, (1, 64, 1));
        assert_eq!(column_sums(64, 0).unwrap().grid_dim.1, 1);
    }

    #[test]
    fn the_norm_backward_block_covers_a_row_and_no_more() {
        for dim in [
            1,
            8,
            100,
            128,
            2048,
            2049,
            4096,
            8192,
            8200,
            11008,
            MAX_HIDDEN_SIZE,
        ] {
            let c = norm_backward(100, dim).unwrap();
            let threads = c.block_dim.0 as usize;
            assert!(
                threads.is_multiple_of(32) && (32..=1024).contains(&threads),
                "{dim}"
            );
            assert!(
                8 * NORM_RUNS * threads >= dim,
                "{dim} columns, {threads} threads"
            );
            // No wider than the row needs: a block of 256 or one run of 8 a thread.
            assert!(
                threads <= 256 || 8 * NORM_RUNS * (threads - 32) < dim,
                "{dim}"
            );
        }
        assert_eq!(norm_backward(100, 4096).unwrap().block_dim.0, 256);
        assert_eq!(norm_backward(100, 128).unwrap().block_dim.0, 32);
        assert_eq!(norm_backward(16384, 4096).unwrap().grid_dim.0, 1024);
        assert_eq!(norm_backward(0, 4096).unwrap().grid_dim.0, 1);
        assert_eq!(norm_backward(524_288, 128).unwrap().grid_dim.0, 8192);
        let wide = norm_backward(1, MAX_HIDDEN_SIZE + 1)
            .unwrap_err()
            .to_string();
        assert!(wide.contains("wider than"), "{wide}");
    }
}
