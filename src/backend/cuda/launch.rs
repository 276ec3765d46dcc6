//! Launch shapes of the kernels, as plain arithmetic so it is tested without a GPU. The tile
//! sizes mirror the `#define`s in `kernels/forward.cu` and `kernels/backward.cu`; a change there
//! must change these too (the shared-memory sizes would be wrong otherwise).

use crate::attn::Dims;
use anyhow::{Result, bail};
use cudarc::driver::LaunchConfig;

/// Query rows per forward CTA (`FWD_BQ`: 8 warps × 16 rows).
pub(crate) const FWD_BQ: usize = 128;
/// Key rows per forward pipeline stage (`FWD_BKV`).
const FWD_BKV: usize = 64;
const FWD_THREADS: u32 = 256;
/// Query rows per backward inner step (`BWD_BQ`).
const BWD_BQ: usize = 64;
/// Rows per block of the row-wise helper kernels (one warp per row).
const ROWS_PER_BLOCK: usize = 8;
/// CUDA's limit on `gridDim.y`.
const MAX_GRID_Y: usize = 65_535;

/// Head dims the kernels are instantiated for.
pub(crate) const HEAD_DIMS: [usize; 2] = [64, 128];
/// Warps per backward CTA the kernel supports (each owns 16 key rows).
pub(crate) const BWD_WARP_CHOICES: [usize; 2] = [4, 8];

/// Rejects shapes the kernels were not built for, in one sentence.
pub(crate) fn check_dims(dims: &Dims) -> Result<()> {
    dims.validate()?;
    if !HEAD_DIMS.contains(&dims.head_dim) {
        bail!(
            "the CUDA backend supports head dim 64 or 128, not {}; use --device cpu for other sizes",
            dims.head_dim
        );
    }
    Ok(())
}

fn grid_x(dims: &Dims) -> Result<u32> {
    u32::try_from(dims.batch * dims.heads)
        .map_err(|_| anyhow::anyhow!("batch × heads is too large for one launch"))
}

fn tiles(rows: usize, tile: usize, what: &str) -> Result<u32> {
    let n = rows.div_ceil(tile);
    if n > MAX_GRID_Y {
        bail!(
            "{rows} {what} rows need {n} tiles, more than CUDA's grid limit of {MAX_GRID_Y}: split the sequence into chunks"
        );
    }
    Ok(n as u32)
}

/// Dynamic shared memory of the forward kernel: the Q tile and two stages of K and V.
pub(crate) fn forward_smem(head_dim: usize) -> u32 {
    ((FWD_BQ + 4 * FWD_BKV) * head_dim * 2) as u32
}

/// Forward: one CTA per (batch·head, 128-row query tile).
pub(crate) fn forward_config(dims: &Dims, q_rows: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (grid_x(dims)?, tiles(q_rows, FWD_BQ, "query")?, 1),
        block_dim: (FWD_THREADS, 1, 1),
        shared_mem_bytes: forward_smem(dims.head_dim),
    })
}

/// Dynamic shared memory of the backward kernel: the K and V tiles, two stages of Q, dO, LSE
/// and D, and the dSᵀ tile (16-bit).
pub(crate) fn backward_smem(head_dim: usize, warps: usize) -> u32 {
    let bkv = 16 * warps;
    (2 * bkv * head_dim * 2 + 4 * BWD_BQ * head_dim * 2 + 4 * BWD_BQ * 4 + bkv * BWD_BQ * 2) as u32
}

/// Backward: one CTA per (batch·query head, key tile of 16·warps rows).
pub(crate) fn backward_config(dims: &Dims, kv_rows: usize, warps: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (grid_x(dims)?, tiles(kv_rows, 16 * warps, "key")?, 1),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: backward_smem(dims.head_dim, warps),
    })
}

/// Row-wise helpers: one warp per row.
pub(crate) fn rows_config(rows: usize) -> Result<LaunchConfig> {
    let blocks = u32::try_from(rows.div_ceil(ROWS_PER_BLOCK).max(1))
        .map_err(|_| anyhow::anyhow!("{rows} rows are too many for one launch"))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Elementwise helpers: grid-stride loops, so a bounded grid covers any length.
pub(crate) fn elementwise_config(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (len.div_ceil(256).clamp(1, 65_536) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(head_dim: usize) -> Dims {
        Dims {
            batch: 2,
            heads: 32,
            kv_heads: 8,
            head_dim,
        }
    }

    #[test]
    fn forward_grid_covers_uneven_rows() {
        let c = forward_config(&dims(128), 1000).unwrap();
        assert_eq!(c.grid_dim, (64, 8, 1)); // 1000 rows → 8 tiles of 128 (last partial)
        assert_eq!(c.block_dim, (256, 1, 1));
        assert_eq!(c.shared_mem_bytes, 96 * 1024);
        assert_eq!(forward_smem(64), 48 * 1024);
    }

    #[test]
    fn backward_fits_in_shared_memory() {
        // 227 KiB is the per-block limit on sm_90; 4 warps must leave room for two CTAs.
        assert!(backward_smem(128, 8) <= 227 * 1024);
        assert!(2 * backward_smem(128, 4) <= 227 * 1024);
        let c = backward_config(&dims(128), 129, 4).unwrap();
        assert_eq!(c.grid_dim, (64, 3, 1)); // 64-key tiles
        assert_eq!(c.block_dim, (128, 1, 1));
        assert_eq!(backward_config(&dims(64), 129, 8).unwrap().grid_dim.1, 2);
    }

    #[test]
    fn rejects_unsupported_shapes() {
        let err = check_dims(&dims(96)).unwrap_err().to_string();
        assert!(err.contains("head dim 64 or 128"), "{err}");
        let mut d = dims(128);
        d.kv_heads = 5;
        assert!(check_dims(&d).is_err());
        assert!(check_dims(&dims(64)).is_ok());
        let err = forward_config(&dims(128), 128 * 70_000)
            .unwrap_err()
            .to_string();
        assert!(err.contains("grid limit"), "{err}");
    }

    #[test]
    fn helper_grids() {
        assert_eq!(rows_config(17).unwrap().grid_dim.0, 3);
        assert_eq!(rows_config(0).unwrap().grid_dim.0, 1);
        assert_eq!(elementwise_config(1 << 30).grid_dim.0, 65_536);
    }
}
