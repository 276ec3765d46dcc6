//! Launch shapes of the model kernels, as plain arithmetic so CI checks them without a GPU.
//! Elementwise kernels use the attention backend's `elementwise_config` (over a thread per 8
//! elements for those that move 8 at a time: [`vector`]); the loss's row chunks, a memory
//! budget the estimate counts too, are `model::cost`'s.

use crate::backend::cuda::elementwise_config;
use anyhow::{Result, anyhow};
use cudarc::driver::LaunchConfig;

/// Threads per block of the per-row loss kernel and the reductions.
const BLOCK: u32 = 256;
/// Blocks of the gradient-norm reduction (one f64 partial each, summed on the host).
pub(crate) const REDUCE_BLOCKS: usize = 1024;
/// Row groups of the norm-gain gradient: each adds every `ROW_GROUPS`-th row of its columns.
const ROW_GROUPS: usize = 64;

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
}
