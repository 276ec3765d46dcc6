//! Launch shapes of the model kernels and the row chunks of the loss, as plain arithmetic so CI
//! checks them without a GPU. Elementwise and one-warp-per-row kernels use the attention
//! backend's shapes (`elementwise_config`, `rows_config`).

use anyhow::{Result, anyhow};
use cudarc::driver::LaunchConfig;
use std::ops::Range;

/// Logits (f32) that may exist at once in the loss: 64 Mi elements, 256 MiB (plus half that for
/// their 16-bit gradient), so a vocabulary of 32000 is processed 2097 rows at a time.
pub(crate) const LOSS_LOGITS: usize = 1 << 26;
/// Threads per block of the per-row loss kernel and the reductions.
const BLOCK: u32 = 256;
/// Blocks of the gradient-norm reduction (one f64 partial each, summed on the host).
const REDUCE_BLOCKS: usize = 1024;
/// Row groups of the norm-gain gradient: each adds every `ROW_GROUPS`-th row of its columns.
const ROW_GROUPS: usize = 64;

/// Rows per loss chunk for `vocab` logits per row (at least one).
pub(crate) fn loss_chunk_rows(vocab: usize) -> usize {
    (LOSS_LOGITS / vocab.max(1)).max(1)
}

/// The row ranges the loss processes one after another.
pub(crate) fn loss_chunks(rows: usize, vocab: usize) -> impl Iterator<Item = Range<usize>> {
    let step = loss_chunk_rows(vocab);
    (0..rows)
        .step_by(step)
        .map(move |r| r..(r + step).min(rows))
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
    fn loss_chunks_cover_every_row_once_within_the_budget() {
        assert_eq!(loss_chunk_rows(32000), 2097);
        for (rows, vocab) in [
            (0, 32000),
            (1, 32000),
            (5000, 32000),
            (4194, 32000),
            (300, 256),
        ] {
            let chunks: Vec<_> = loss_chunks(rows, vocab).collect();
            let mut next = 0;
            for c in &chunks {
                assert_eq!(c.start, next);
                assert!(!c.is_empty() && c.len() * vocab <= LOSS_LOGITS);
                next = c.end;
            }
            assert_eq!(next, rows);
        }
        assert_eq!(loss_chunks(5000, 32000).count(), 3);
        assert_eq!(loss_chunks(4194, 32000).count(), 2);
        // A vocabulary larger than the budget still makes progress, a row at a time.
        assert_eq!(loss_chunk_rows(LOSS_LOGITS * 2), 1);
    }

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
