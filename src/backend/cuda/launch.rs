//! Launch shapes of the kernels, as plain arithmetic so it is tested without a GPU. The tile
//! sizes mirror the `#define`s in `kernels/forward.cu` and `kernels/backward.cu`; a change there
//! must change these too (the shared-memory sizes would be wrong otherwise).

use crate::error::Error;
use crate::shape::Dims;
use anyhow::{Result, bail};
use cudarc::driver::LaunchConfig;

/// Key rows per forward pipeline stage (`FWD_BKV`).
const FWD_BKV: usize = 64;
/// Query rows per backward inner step (`BWD_BQ`).
const BWD_BQ: usize = 64;
/// The wgmma backward's query tile (`WG_BQ`): the rows of one TMA box of Q, dO and dQ.
pub(crate) const WGMMA_BWD_QUERY_ROWS: usize = BWD_BQ;
/// Rows per block of the row-wise helper kernels (one warp per row).
const ROWS_PER_BLOCK: usize = 8;
/// The most CTAs one attention launch takes: its grid is one-dimensional and the kernels index
/// it in 32-bit signed arithmetic (`cta_work`, `kernels/common.cuh`).
const MAX_CTAS: usize = i32::MAX as usize;

/// The head dim the wgmma kernels' shared tiles and accumulators have for a model's `head_dim`
/// (`WG_DIM` in `kernels/wgmma.cuh`), or `None` where they do not run. Their tiles are column
/// atoms of 64 in the 128-byte swizzle, so 80 and 96 run in tiles of 128 whose extra columns are
/// zeros (TMA's out-of-bounds fill, cp.async's zero fill): exact, and only the products whose
/// output spans the head dim pay for the padding (those that sum over it stop at `head_dim`).
/// FlashAttention-3 rounds head dims up the same way. 192 and 256 run in tiles of their own
/// width, with half the keys a tile ([`wgmma_wide`]).
pub(crate) fn wgmma_tile_dim(head_dim: usize) -> Option<usize> {
    match head_dim {
        64 => Some(64),
        80 | 96 | 128 => Some(128),
        192 | 256 => Some(head_dim),
        _ => None,
    }
}
/// Whether the wgmma kernels run `head_dim` in their wide shape (`WIDE_HEADS` in
/// `kernels/wgmma.cuh`): key tiles of 64 instead of 128, since at 192 and 256 a warpgroup's f32
/// accumulators over a row of the head dim (O; dK and dV) take 96 or 128 registers a thread,
/// and the forward's five K and V stages of 128 keys would not fit shared memory.
pub(crate) fn wgmma_wide(head_dim: usize) -> bool {
    wgmma_cols(head_dim) > 128
}
/// Key rows per tile of the wgmma kernels: the forward's K and V stages (`WF_BKV`, the rows of
/// one TMA box of K and V) and the backward's CTA (`WG_BKV` in `kernels/backward_wgmma.cuh`: 64
/// per computing warpgroup, or 64 shared by both). 64 where the head dim is wide
/// ([`wgmma_wide`]), 128 elsewhere.
pub(crate) fn wgmma_keys(head_dim: usize) -> usize {
    if wgmma_wide(head_dim) { 64 } else { 128 }
}
/// Query rows per wgmma forward CTA (`WF_BQ`).
pub(crate) const WGMMA_FWD_ROWS: usize = 128;
/// The wgmma forward's TMA barriers (eleven of 8 bytes: Q, K and V stages full, K and V stages
/// free), rounded up.
const WGMMA_FWD_BARRIERS: usize = 128;
/// Extra dynamic shared memory of the wgmma kernels: they round their base up to the 1024-byte
/// boundary their swizzled tiles need (`smem_base1024`).
const WGMMA_ALIGN_SLACK: usize = 1024;
/// The wgmma backward's TMA barriers: per stage of its query tiles, "full" and "empty" (8 bytes
/// each).
const WGMMA_BWD_BARRIERS: usize = 32;
/// The wide wgmma backward's buffers and dQ schedule (`kernels/backward_wgmma_wide.cu`), decided
/// here once: the kernel takes them as `#define`s ([`WideBackward::defines`]) and
/// [`backward_smem`] sizes its shared memory from the same values. At head dim 192: two stages
/// of Q and of dO, a staged dQ share per warpgroup, one dSᵀ tile, and each tile's dQ after its
/// dK and dV. At 256, as 227 KiB hold: one dO stage and one dQ share that the warpgroups take in
/// turns; and dQ a tile late, where it fills a wait (warpgroup 1's share beside warpgroup 0's
/// Sᵀ, whose exponentials then run under 1's dPᵀ; 0's beside its dV while 1 forms dSᵀ), which
/// needs a second dSᵀ tile. Late, the backward ran 4–5% faster at 256 and 4–5% slower at 192,
/// whose dQ products of 32 columns read shared memory at twice the rate of the Sᵀ beside them
/// (`bench/results/wide-2026-12-04`, call 2).
pub(crate) struct WideBackward {
    /// Stages of Q's ring and of dO's.
    q_stages: usize,
    do_stages: usize,
    /// Staged shares of dQ (one per warpgroup, or one they take in turns).
    dq_shares: usize,
    /// Whether each tile's dQ is computed in the next tile.
    dq_late: bool,
}

impl WideBackward {
    pub(crate) fn for_head_dim(head_dim: usize) -> WideBackward {
        let at_256 = head_dim == 256;
        WideBackward {
            q_stages: 2,
            do_stages: if at_256 { 1 } else { 2 },
            dq_shares: if at_256 { 1 } else { 2 },
            dq_late: at_256,
        }
    }

    /// dSᵀ tiles: a late dQ reads tile n's while tile n + 1's is written.
    fn ds_tiles(&self) -> usize {
        if self.dq_late { 2 } else { 1 }
    }

    /// The `#define` lines that give the kernel these choices.
    pub(crate) fn defines(&self) -> String {
        format!(
            "#define WW_Q_STAGES {}\n#define WW_DO_STAGES {}\n#define WW_DQ_BUFFERS {}\n#define WW_DQ_LATE {}\n#define WW_DS_TILES {}\n",
            self.q_stages,
            self.do_stages,
            self.dq_shares,
            self.dq_late as u8,
            self.ds_tiles()
        )
    }
}

/// Head dims the kernels are instantiated for: the mma.sync kernels take any of them (on every
/// GPU from sm_80), and so do the wgmma kernels on sm_90 ([`wgmma_tile_dim`]).
pub const HEAD_DIMS: [usize; 6] = [64, 80, 96, 128, 192, 256];

/// Opt-in dynamic shared memory per block (bytes) of a compute capability: 227 KiB on Hopper
/// and datacenter Blackwell, 163 KiB on A100 and Orin (8.0, 8.7), 99 KiB elsewhere (8.6, 8.9,
/// 12.x): what [`Tuning::for_device`] sizes the tiles to.
pub(crate) fn smem_limit(capability: (i32, i32)) -> usize {
    match capability {
        (9, 0) | (10, _) => 227 * 1024,
        (8, 0) | (8, 7) => 163 * 1024,
        _ => 99 * 1024,
    }
}

/// Which attention module a launch takes: the causal one, compiled with the mask arguments
/// folded away (`MASKED 0` in `kernels/common.cuh`), or the one that reads them. Two modules
/// rather than a run-time test because the test cost plain causal attention 12–17% of its
/// backward rate on an H200 (`bench/HISTORY.md`, v11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Masking {
    Causal = 0,
    Masked = 1,
}

impl Masking {
    /// Both modules, for the tests that compile every variant.
    #[cfg(test)]
    pub(crate) const BOTH: [Masking; 2] = [Masking::Causal, Masking::Masked];

    /// The module `mask` needs.
    pub(crate) fn of(mask: &crate::shape::Mask) -> Masking {
        if mask.is_causal() {
            Masking::Causal
        } else {
            Masking::Masked
        }
    }
}

/// Compile-time shape choices of the kernels (they become `#define`s). Each trades registers
/// against reuse of shared-memory fragments; [`Tuning::for_head_dim`] is the fastest measured on
/// an H200 (see `bench/HISTORY.md`), the others stay selectable for re-tuning elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// Warps per forward CTA (4, 8 or 12).
    pub fwd_warps: usize,
    /// m16 row tiles per forward warp (1 or 2): more rows reuse each K/V fragment more.
    pub fwd_mtiles: usize,
    /// Keep Q's fragments in registers (true) or re-read them from shared memory per tile.
    pub fwd_q_in_registers: bool,
    /// The forward on Hopper's warpgroup MMA (`kernels/forward_wgmma.cu`: two computing
    /// warpgroups and one that loads, 128 query rows, key tiles of 128, or 64 at head dims 192
    /// and 256) instead of the mma.sync kernel the three fields above shape; used only where
    /// [`Tuning::for_device`] keeps it.
    pub fwd_wgmma: bool,
    /// Warps per backward CTA (4 or 8), each owning 16 key rows (the mma.sync backward).
    pub bwd_warps: usize,
    /// The backward on Hopper's warpgroup MMA (`kernels/backward_wgmma.cu`: two computing
    /// warpgroups in ping-pong turns and one that loads and adds dQ, 128-key tiles; at head
    /// dims 192 and 256 `backward_wgmma_wide.cu`, 64-key tiles whose work the computing
    /// warpgroups split) instead of the mma.sync kernel; used only where [`Tuning::for_device`]
    /// keeps it (compute capability 9.0: [`wgmma_tile_dim`]).
    pub bwd_wgmma: bool,
    /// Backward warps sharing 32 keys (2 or 4; the mma.sync backward): 4 halves the dK and dV
    /// registers per thread, which head dims above 128 need not to spill.
    pub bwd_key_split: usize,
    /// Pipeline stages of the mma.sync backward's query tiles (1 or 2): one leaves head dim
    /// 256's K, V, Q and dO tiles within an A100's shared memory ([`Tuning::for_device`]).
    pub bwd_q_stages: usize,
    /// Launch the forward's CTAs head by head (all query tiles of one head, then the next)
    /// instead of tile by tile across every head: the CTAs that run together then stream one
    /// head's K and V, which L2 can hold, not every head's. Heads with fewer tiles than the
    /// device has SMs go in groups that fill them, tile by tile within a group, so that the
    /// longest CTAs start first (`cta_work` in `kernels/common.cuh`).
    pub fwd_key_major: bool,
    /// The same for the backward's CTAs: one head's key tiles together, so they read one
    /// head's Q, dO, LSE and D and add into its dQ.
    pub bwd_key_major: bool,
    /// The backward adds into dQ (and a GQA group into its f32 dK and dV) in a fixed order,
    /// so that the same inputs give the same bits on every run: each CTA waits for its turn
    /// at every query tile (`kernels/common.cuh`, "The deterministic backward"). Off by
    /// default: it costs speed. Set by [`CudaBackend::with_deterministic`](super::CudaBackend::with_deterministic).
    pub deterministic: bool,
}

impl Tuning {
    /// The measured best for a head dim: 8 forward warps of 32 rows each (two m16 tiles reuse
    /// every K/V fragment twice); above head dim 64 Q is re-read from shared memory to free the
    /// registers this needs, at 64 it fits in registers. 8 backward warps (128-key tiles), on
    /// the warpgroup MMA where the device has it (see [`Tuning::for_device`]).
    ///
    /// At head dims 96, 192 and 256 the f32 accumulators would spill at that shape (O is rows ×
    /// head dim over a warp's 32 lanes, dK and dV keys × head dim; ptxas's counts are checked by
    /// `compile.rs`'s tests): there the forward warps own 16 rows each, and above 128 the
    /// backward's 32 keys are shared by 4 warps (64-key tiles). 128 keeps its measured shape.
    /// On Hopper every head dim runs on the wgmma kernels instead. The mma.sync shapes are
    /// chosen to fit registers and shared memory, not yet timed against alternatives.
    pub fn for_head_dim(head_dim: usize) -> Tuning {
        let wide = head_dim > 128;
        Tuning {
            fwd_warps: 8,
            fwd_mtiles: if head_dim <= 80 || head_dim == 128 {
                2
            } else {
                1
            },
            fwd_q_in_registers: head_dim <= 64,
            fwd_wgmma: wgmma_tile_dim(head_dim).is_some(),
            bwd_warps: 8,
            bwd_wgmma: wgmma_tile_dim(head_dim).is_some(),
            bwd_key_split: if wide { 4 } else { 2 },
            bwd_q_stages: 2,
            fwd_key_major: true,
            bwd_key_major: true,
            deterministic: false,
        }
    }

    /// This variant as it can run for `head_dim` on a device of compute capability
    /// `capability`: the wgmma kernels exist only for sm_90 (H100/H200), so elsewhere they fall
    /// back to the mma.sync kernels rather than failing. Where the mma.sync kernels' tiles
    /// exceed the device's shared memory ([`smem_limit`]; head dim 256 off Hopper) the forward
    /// runs with 4 warps (half the query rows) and the backward single-buffers its query tiles,
    /// each only if that then fits (otherwise loading the kernels names the bytes refused).
    pub fn for_device(self, head_dim: usize, capability: (i32, i32)) -> Tuning {
        let wgmma = wgmma_tile_dim(head_dim).is_some() && capability == (9, 0);
        let mut t = Tuning {
            fwd_wgmma: self.fwd_wgmma && wgmma,
            bwd_wgmma: self.bwd_wgmma && wgmma,
            ..self
        };
        let limit = smem_limit(capability) as u32;
        let narrow = Tuning { fwd_warps: 4, ..t };
        if !t.fwd_wgmma
            && forward_smem(head_dim, &t) > limit
            && forward_smem(head_dim, &narrow) <= limit
        {
            t = narrow;
        }
        let single = Tuning {
            bwd_q_stages: 1,
            ..t
        };
        if !t.bwd_wgmma
            && backward_smem(head_dim, &t) > limit
            && backward_smem(head_dim, &single) <= limit
        {
            t = single;
        }
        t
    }

    /// Threads per forward CTA as launched.
    pub fn fwd_threads(&self) -> usize {
        // wgmma: two warpgroups that compute and one that loads (`WF_THREADS`).
        32 * if self.fwd_wgmma { 12 } else { self.fwd_warps }
    }

    /// Threads per backward CTA as launched.
    pub fn bwd_threads(&self) -> usize {
        // wgmma: two warpgroups that compute and one that loads and adds dQ (`WG_THREADS`).
        32 * if self.bwd_wgmma { 12 } else { self.bwd_warps }
    }

    /// Rejects combinations the kernels were not written for.
    pub fn validate(&self) -> Result<()> {
        if ![4, 8, 12].contains(&self.fwd_warps) {
            bail!("forward warps must be 4, 8 or 12, not {}", self.fwd_warps);
        }
        if ![1, 2].contains(&self.fwd_mtiles) {
            bail!(
                "forward row tiles per warp must be 1 or 2, not {}",
                self.fwd_mtiles
            );
        }
        if ![4, 8].contains(&self.bwd_warps) {
            bail!("backward warps must be 4 or 8, not {}", self.bwd_warps);
        }
        if ![2, 4].contains(&self.bwd_key_split) {
            bail!(
                "backward warps per 32 keys must be 2 or 4, not {}",
                self.bwd_key_split
            );
        }
        if ![1, 2].contains(&self.bwd_q_stages) {
            bail!(
                "backward query-tile stages must be 1 or 2, not {}",
                self.bwd_q_stages
            );
        }
        Ok(())
    }

    /// Query rows per forward CTA.
    pub fn fwd_rows(&self) -> usize {
        if self.fwd_wgmma {
            WGMMA_FWD_ROWS
        } else {
            16 * self.fwd_warps * self.fwd_mtiles
        }
    }

    /// The `#define` lines that select this variant in the kernel sources.
    pub(crate) fn defines(&self) -> String {
        format!(
            "#define FWD_WARPS {}\n#define FWD_MT {}\n#define FWD_QREG {}\n#define FWD_WGMMA {}\n#define BWD_WARPS {}\n#define BWD_WGMMA {}\n#define BWD_KSPLIT {}\n#define BWD_QSTAGES {}\n#define FWD_KEY_MAJOR {}\n#define BWD_KEY_MAJOR {}\n#define DETERMINISTIC {}\n",
            self.fwd_warps,
            self.fwd_mtiles,
            self.fwd_q_in_registers as u8,
            self.fwd_wgmma as u8,
            self.bwd_warps,
            self.bwd_wgmma as u8,
            self.bwd_key_split,
            self.bwd_q_stages,
            self.fwd_key_major as u8,
            self.bwd_key_major as u8,
            self.deterministic as u8
        )
    }
}

/// Rejects shapes the kernels were not built for, in one sentence.
pub(crate) fn check_dims(dims: &Dims) -> Result<()> {
    dims.validate()?;
    check_head_dim(dims.head_dim)
}

/// Rejects a head dim the kernels were not instantiated for, in one sentence.
pub(crate) fn check_head_dim(head_dim: usize) -> Result<()> {
    if !HEAD_DIMS.contains(&head_dim) {
        return Err(Error::invalid_input(format!(
            "{}; use --device cpu for other sizes",
            unsupported_head_dim(head_dim)
        )));
    }
    Ok(())
}

/// The sentence that names the head dims the kernels take (`HEAD_DIMS`), for a refused one.
pub(crate) fn unsupported_head_dim(head_dim: usize) -> String {
    let (last, rest) = HEAD_DIMS
        .split_last()
        .expect("the kernels take some head dim");
    let listed: Vec<String> = rest.iter().map(usize::to_string).collect();
    format!(
        "the CUDA backend supports head dims {} and {last}, not {head_dim}",
        listed.join(", ")
    )
}

/// A one-dimensional grid of `per_head` CTAs for each (batch, head), within [`MAX_CTAS`].
fn grid(dims: &Dims, per_head: usize, what: &str) -> Result<(u32, u32, u32)> {
    let heads = dims.batch * dims.heads;
    let n = heads * per_head;
    if n > MAX_CTAS {
        bail!(
            "{heads} batch × heads × {per_head} {what} make {n} thread blocks, more than one launch takes ({MAX_CTAS}): split the sequence into chunks"
        );
    }
    Ok((n as u32, 1, 1))
}

/// Dynamic shared memory of the forward kernel: the Q tile and two stages of K and V; the
/// wgmma kernel has a third stage of V (its P·V runs one tile late), its TMA barriers and 1 KiB
/// of slack to align the tiles to 1024 bytes; its tiles are [`wgmma_tile_dim`] wide, its K and
/// V tiles [`wgmma_keys`] long.
pub(crate) fn forward_smem(head_dim: usize, tuning: &Tuning) -> u32 {
    if tuning.fwd_wgmma {
        ((WGMMA_FWD_ROWS + 5 * wgmma_keys(head_dim)) * wgmma_cols(head_dim) * 2
            + WGMMA_FWD_BARRIERS
            + WGMMA_ALIGN_SLACK) as u32
    } else {
        ((tuning.fwd_rows() + 4 * FWD_BKV) * head_dim * 2) as u32
    }
}

/// Forward: one CTA per (batch·head, query tile), in the order `fwd_key_major` picks.
pub(crate) fn forward_config(dims: &Dims, q_rows: usize, tuning: &Tuning) -> Result<LaunchConfig> {
    let tiles = q_rows.div_ceil(tuning.fwd_rows());
    Ok(LaunchConfig {
        grid_dim: grid(dims, tiles, "query tiles")?,
        block_dim: (tuning.fwd_threads() as u32, 1, 1),
        shared_mem_bytes: forward_smem(dims.head_dim, tuning),
    })
}

/// Dynamic shared memory of the backward kernel: the K and V tiles, `bwd_q_stages` stages (the
/// wgmma kernel: two) of Q, dO, LSE, D and the rows' mask starts (read by the masked module
/// only, reserved in both so one size serves), and the Pᵀ and dSᵀ tiles (16-bit). The wgmma
/// kernel keeps no Pᵀ tile (Pᵀ stays in registers) but three of dSᵀ (its warpgroups take turns
/// half a tile apart, and a tile's dQ runs in the next tile's turn), stages each query tile's
/// dQ (f32, one copy per warpgroup at head dim 64, where each sums over its own keys) for the
/// TMA reduction into global memory, has the barriers of its query-tile stages, and needs 1 KiB
/// of slack to align its tiles to 1024 bytes. Its tiles are [`wgmma_tile_dim`] wide; the wide
/// kernel's buffers are [`WideBackward`]'s.
pub(crate) fn backward_smem(head_dim: usize, tuning: &Tuning) -> u32 {
    let bkv = backward_keys(head_dim, tuning);
    if tuning.bwd_wgmma && wgmma_wide(head_dim) {
        // K and V; the rings of Q and dO; Pᵀ in f32 and dSᵀ in 16 bits; the staged shares of
        // dQ (half the head dim each, f32); LSE and row starts per Q stage, D per dO stage; a
        // full and an empty barrier per stage; the alignment slack.
        let b = WideBackward::for_head_dim(head_dim);
        let tiles = (2 * bkv + (b.q_stages + b.do_stages) * BWD_BQ) * head_dim * 2;
        let scores = bkv * BWD_BQ * (4 + 2 * b.ds_tiles());
        let dq = b.dq_shares * BWD_BQ * head_dim / 2 * 4;
        let vectors = (2 * b.q_stages + b.do_stages) * BWD_BQ * 4;
        let barriers = 2 * (b.q_stages + b.do_stages) * 8;
        return (tiles + scores + dq + vectors + barriers + WGMMA_ALIGN_SLACK) as u32;
    }
    let (stages, cols) = if tuning.bwd_wgmma {
        (2, wgmma_cols(head_dim))
    } else {
        (tuning.bwd_q_stages, head_dim)
    };
    let tiles = 2 * bkv * cols * 2 + stages * BWD_BQ * (2 * cols * 2 + 3 * 4);
    let scores = if tuning.bwd_wgmma { 3 } else { 2 } * bkv * BWD_BQ * 2;
    let wgmma_extra = if tuning.bwd_wgmma {
        let dq_parts = if cols == 128 { 1 } else { 2 };
        dq_parts * BWD_BQ * cols * 4 + WGMMA_BWD_BARRIERS + WGMMA_ALIGN_SLACK
    } else {
        0
    };
    (tiles + scores + wgmma_extra) as u32
}

/// The wgmma kernels' tile width for `head_dim` ([`wgmma_tile_dim`]; [`Tuning::for_device`]
/// selects them only where it has one, and `kernels/wgmma.cuh` refuses to compile any other).
pub(crate) fn wgmma_cols(head_dim: usize) -> usize {
    wgmma_tile_dim(head_dim).unwrap_or(head_dim)
}

/// Key rows per backward CTA: 32 per `bwd_key_split` warps in the mma.sync kernel; in the wgmma
/// ones 64 per warpgroup, or 64 at wide head dims.
fn backward_keys(head_dim: usize, tuning: &Tuning) -> usize {
    if tuning.bwd_wgmma {
        wgmma_keys(head_dim)
    } else {
        32 * tuning.bwd_warps / tuning.bwd_key_split
    }
}

/// Backward: one CTA per (batch·query head, key tile), in the order `bwd_key_major` picks.
pub(crate) fn backward_config(
    dims: &Dims,
    kv_rows: usize,
    tuning: &Tuning,
) -> Result<LaunchConfig> {
    let tiles = kv_rows.div_ceil(backward_keys(dims.head_dim, tuning));
    Ok(LaunchConfig {
        grid_dim: grid(dims, tiles, "key tiles")?,
        block_dim: (tuning.bwd_threads() as u32, 1, 1),
        shared_mem_bytes: backward_smem(dims.head_dim, tuning),
    })
}

/// Turn counters (i32, zeroed before the launch) of the deterministic backward of a block of
/// `q_rows` queries and `kv_rows` keys: one per (batch·query head, query tile) for dQ and, where
/// a GQA group adds into shared f32 dK and dV (`shared_kv`), one per (batch·KV head, key tile).
/// The layout is `dq_turns` and `kv_turns` in `kernels/common.cuh`.
pub(crate) fn backward_turns(
    dims: &Dims,
    q_rows: usize,
    kv_rows: usize,
    shared_kv: bool,
    tuning: &Tuning,
) -> usize {
    let dq = dims.batch * dims.heads * q_rows.div_ceil(BWD_BQ);
    let kv = dims.batch * dims.kv_heads * kv_rows.div_ceil(backward_keys(dims.head_dim, tuning));
    dq + if shared_kv { kv } else { 0 }
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
        let t = Tuning {
            fwd_wgmma: false,
            ..Tuning::for_head_dim(128)
        };
        let c = forward_config(&dims(128), 1000, &t).unwrap();
        assert_eq!(c.grid_dim, (64 * 4, 1, 1)); // 1000 rows → 4 tiles of 256 (last partial)
        assert_eq!(c.block_dim, (256, 1, 1));
        assert_eq!(c.shared_mem_bytes, 128 * 1024);
        assert_eq!(forward_smem(64, &t), 64 * 1024);
        let wide = Tuning {
            fwd_warps: 4,
            fwd_mtiles: 2,
            ..t
        };
        assert_eq!(
            forward_config(&dims(64), 1000, &wide).unwrap().block_dim.0,
            128
        );
        // The largest variant still fits the 227 KiB per-block limit.
        let big = Tuning {
            fwd_warps: 12,
            fwd_mtiles: 2,
            ..t
        };
        assert!(forward_smem(128, &big) <= 227 * 1024);
        // wgmma: 128 rows per CTA of 384 threads; Q, two stages of K and three of V (32 KiB
        // each), barriers.
        let wg = Tuning::for_head_dim(128).for_device(128, (9, 0));
        let c = forward_config(&dims(128), 1000, &wg).unwrap();
        assert_eq!((c.grid_dim.0, c.block_dim.0), (64 * 8, 384));
        assert_eq!(c.shared_mem_bytes, (6 * 32 + 1) * 1024 + 128);
    }

    #[test]
    fn tuning_validation_and_defines() {
        let t = Tuning::for_head_dim(128);
        assert!(t.validate().is_ok());
        assert!(t.defines().contains("#define FWD_QREG 0\n"));
        assert!(
            Tuning::for_head_dim(64)
                .defines()
                .contains("#define FWD_QREG 1\n")
        );
        let bad = Tuning { bwd_warps: 6, ..t };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("backward warps")
        );
        assert!(Tuning { fwd_mtiles: 3, ..t }.validate().is_err());
        let e = Tuning {
            bwd_key_split: 3,
            ..t
        };
        assert!(
            e.validate()
                .unwrap_err()
                .to_string()
                .contains("per 32 keys")
        );
        let e = Tuning {
            bwd_q_stages: 0,
            ..t
        };
        assert!(e.validate().unwrap_err().to_string().contains("stages"));
        assert!(t.defines().ends_with(
            "#define BWD_KSPLIT 2\n#define BWD_QSTAGES 2\n#define FWD_KEY_MAJOR 1\n#define BWD_KEY_MAJOR 1\n#define DETERMINISTIC 0\n"
        ));
    }

    #[test]
    fn backward_fits_in_shared_memory() {
        // 227 KiB is the per-block limit on sm_90; 4 warps must leave room for two CTAs.
        let sync = |warps| Tuning {
            bwd_warps: warps,
            bwd_wgmma: false,
            ..Tuning::for_head_dim(128)
        };
        assert!(backward_smem(128, &sync(8)) <= 227 * 1024);
        assert!(2 * backward_smem(128, &sync(4)) <= 227 * 1024);
        let c = backward_config(&dims(128), 129, &sync(4)).unwrap();
        assert_eq!(c.grid_dim, (64 * 3, 1, 1)); // 64-key tiles, the last partial
        assert_eq!(c.block_dim, (128, 1, 1));
        assert_eq!(
            backward_config(&dims(64), 129, &sync(8))
                .unwrap()
                .grid_dim
                .0,
            64 * 2
        );
        // wgmma: K, V (32 KiB each), two stages of Q and dO (16 KiB each), three dSᵀ (16 KiB
        // each), LSE, D and row starts (1.5 KiB), dQ (64 rows of 512 bytes), alignment slack
        // (1 KiB), four barriers; 128-key tiles of 384 threads.
        let wg = Tuning::for_head_dim(128).for_device(128, (9, 0));
        assert!(wg.bwd_wgmma);
        assert_eq!(
            backward_smem(128, &wg),
            (64 + 64 + 48 + 1 + 1) * 1024 + 512 + 64 * 512 + 32
        );
        let c = backward_config(&dims(128), 129, &wg).unwrap();
        assert_eq!((c.grid_dim.0, c.block_dim.0), (64 * 2, 384));
    }

    /// The deterministic backward's turn counters: one per (batch·head, 64-row query tile),
    /// then one per (batch·KV head, key tile) only where a GQA group shares f32 dK and dV; the
    /// key tiles are the kernel's (128 keys on wgmma, 64 in its wide shape at head dim 256 and
    /// in the mma.sync kernel there).
    #[test]
    fn deterministic_turns_cover_every_query_tile_and_shared_key_tile() {
        let gqa = Dims {
            batch: 2,
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
        };
        let wg = Tuning::for_head_dim(128).for_device(128, (9, 0));
        assert_eq!(backward_turns(&gqa, 1000, 700, false, &wg), 2 * 8 * 16);
        assert_eq!(
            backward_turns(&gqa, 1000, 700, true, &wg),
            2 * 8 * 16 + 2 * 2 * 6
        );
        let d256 = Dims {
            head_dim: 256,
            ..gqa
        };
        for capability in [(9, 0), (8, 0)] {
            let t = Tuning::for_head_dim(256).for_device(256, capability);
            assert_eq!(backward_turns(&d256, 64, 129, true, &t), 2 * 8 + 2 * 2 * 3);
        }
    }

    #[test]
    fn wgmma_only_where_it_exists() {
        let t = Tuning::for_head_dim(128);
        assert!(t.for_device(128, (9, 0)).bwd_wgmma);
        assert!(t.for_device(128, (9, 0)).fwd_wgmma);
        assert!(!t.for_device(128, (8, 0)).fwd_wgmma);
        assert!(!t.for_device(128, (8, 0)).bwd_wgmma, "A100 has no wgmma");
        assert!(
            !t.for_device(128, (10, 0)).bwd_wgmma,
            "sm_90a code runs only on 9.0"
        );
        for d in [80, 96] {
            let t = Tuning::for_head_dim(d).for_device(d, (9, 0));
            assert!(
                t.fwd_wgmma && t.bwd_wgmma,
                "d{d} runs in zero-padded tiles of 128"
            );
        }
        for d in [192, 256] {
            let t = Tuning::for_head_dim(d).for_device(d, (9, 0));
            assert!(
                t.fwd_wgmma && t.bwd_wgmma,
                "d{d} runs in tiles of its own width"
            );
            assert!(wgmma_wide(d) && !wgmma_wide(128));
            assert_eq!((wgmma_keys(d), backward_keys(d, &t)), (64, 64));
            let off = Tuning::for_head_dim(d).for_device(d, (8, 0));
            assert!(!off.fwd_wgmma && !off.bwd_wgmma);
        }
        assert_eq!(
            [64, 80, 96, 128, 192, 256, 112].map(wgmma_tile_dim),
            [
                Some(64),
                Some(128),
                Some(128),
                Some(128),
                Some(192),
                Some(256),
                None
            ]
        );
        assert_eq!(
            (
                wgmma_keys(128),
                backward_keys(128, &t.for_device(128, (9, 0)))
            ),
            (128, 128)
        );
        let t64 = Tuning::for_head_dim(64).for_device(64, (9, 0));
        assert!(t64.fwd_wgmma && t64.bwd_wgmma);
        assert_eq!(
            backward_smem(64, &t64),
            (32 + 32 + 48 + 1 + 1) * 1024 + 512 + 2 * 64 * 256 + 32
        );
        assert_eq!(forward_smem(64, &t64), (6 * 16 + 1) * 1024 + 128);
        let off = Tuning {
            bwd_wgmma: false,
            ..t
        };
        assert!(!off.for_device(128, (9, 0)).bwd_wgmma);
        assert!(off.defines().contains("#define BWD_WGMMA 0\n"));
        assert!(t.defines().contains("#define FWD_WGMMA 1\n"));
    }

    /// Every head dim's variant, as chosen for an A100 and an H100/H200, fits that device's
    /// shared memory, and the shapes the kernels assume hold: whole 16-column tiles, thread
    /// counts the tiles divide among.
    #[test]
    fn every_head_dim_fits_every_device() {
        for head_dim in HEAD_DIMS {
            for capability in [(8, 0), (9, 0)] {
                let t = Tuning::for_head_dim(head_dim).for_device(head_dim, capability);
                assert!(t.validate().is_ok());
                let limit = smem_limit(capability) as u32;
                let (f, b) = (forward_smem(head_dim, &t), backward_smem(head_dim, &t));
                assert!(
                    f <= limit,
                    "d{head_dim} {capability:?}: forward {f} > {limit}"
                );
                assert!(
                    b <= limit,
                    "d{head_dim} {capability:?}: backward {b} > {limit}"
                );
                assert_eq!(head_dim % 16, 0);
                if !t.bwd_wgmma {
                    assert_eq!(backward_keys(head_dim, &t) % 32, 0);
                }
            }
        }
        // Head dim 256 off Hopper: 4 forward warps of 16 rows (Q, 2 stages of K and V: 160
        // KiB), one query-tile stage in the backward (K, V 32 KiB each, Q, dO 32 KiB each,
        // LSE, D and row starts (768 bytes), Pᵀ and dSᵀ 8 KiB each).
        let a100 = Tuning::for_head_dim(256).for_device(256, (8, 0));
        assert_eq!(
            (a100.fwd_warps, a100.fwd_mtiles, a100.bwd_q_stages),
            (4, 1, 1)
        );
        assert_eq!(forward_smem(256, &a100), (64 + 256) * 512);
        assert_eq!(backward_smem(256, &a100), 4 * 32 * 1024 + 768 + 16 * 1024);
        assert_eq!(backward_keys(256, &a100), 64);
        // On Hopper the wgmma kernels' wide shapes (64-key tiles). The forward: Q (128 rows),
        // two stages of K and three of V (64 rows each), barriers, slack. The backward: K, V;
        // at 256 two Q tiles and one dO tile, at 192 two of each (64 rows); Pᵀ (f32) and dSᵀ
        // (two at 256, for its late dQ); one staged share of dQ at 256 (64 rows × 128 f32), two
        // at 192 (64 × 96); LSE and row starts per Q stage, D per dO stage; barriers; slack.
        // 226 and 218 KiB.
        let h100 = Tuning::for_head_dim(256).for_device(256, (9, 0));
        assert!(h100.fwd_wgmma && h100.bwd_wgmma);
        assert_eq!(forward_smem(256, &h100), (128 + 5 * 64) * 512 + 128 + 1024);
        assert_eq!(
            backward_smem(256, &h100),
            (2 + 2 + 1) * 32 * 1024 + 32 * 1024 + 32 * 1024 + 5 * 256 + 48 + 1024
        );
        let h192 = Tuning::for_head_dim(192).for_device(192, (9, 0));
        assert_eq!(forward_smem(192, &h192), (128 + 5 * 64) * 384 + 128 + 1024);
        assert_eq!(
            backward_smem(192, &h192),
            (2 + 2 + 2) * 24 * 1024 + 24 * 1024 + 2 * 24 * 1024 + 6 * 256 + 64 + 1024
        );
        // 192 fits an A100 with both stages; 80 and 96 keep 128-key backward tiles.
        let t = Tuning::for_head_dim(192).for_device(192, (8, 0));
        assert_eq!((t.fwd_warps, t.bwd_q_stages, t.bwd_key_split), (8, 2, 4));
        for d in [80, 96] {
            let t = Tuning::for_head_dim(d).for_device(d, (8, 0));
            assert_eq!((backward_keys(d, &t), t.bwd_key_split), (128, 2));
            assert_eq!(forward_smem(d, &t) as usize, (t.fwd_rows() + 256) * d * 2);
            // On Hopper their wgmma tiles are those of head dim 128.
            let (h, h128) = (
                Tuning::for_head_dim(d).for_device(d, (9, 0)),
                Tuning::for_head_dim(128).for_device(128, (9, 0)),
            );
            assert_eq!(forward_smem(d, &h), forward_smem(128, &h128));
            assert_eq!(backward_smem(d, &h), backward_smem(128, &h128));
        }
        // 64 and 128 keep their measured shapes everywhere.
        for d in [64, 128] {
            for capability in [(8, 0), (9, 0)] {
                let t = Tuning::for_head_dim(d).for_device(d, capability);
                assert_eq!(
                    (
                        t.fwd_warps,
                        t.fwd_mtiles,
                        t.bwd_warps,
                        t.bwd_key_split,
                        t.bwd_q_stages
                    ),
                    (8, 2, 8, 2, 2)
                );
            }
        }
        // Where even the narrow shapes exceed the device, the variant stays as it was and the
        // kernel load names the bytes refused.
        let small = Tuning::for_head_dim(256).for_device(256, (8, 6));
        assert_eq!((small.fwd_warps, small.bwd_q_stages), (8, 2));
        assert_eq!(smem_limit((8, 6)), 99 * 1024);
    }

    /// `swz` of kernels/common.cuh, in Rust: the 16-byte chunk that logical chunk `chunk` of
    /// `row` occupies in a row of `row_elems` 16-bit values. Keep the two identical.
    fn swz_chunk(row_elems: usize, row: usize, chunk: usize) -> usize {
        let whole = (row_elems / 8) & !7;
        let tail = row_elems / 8 - whole;
        let tail_shift = if tail == 4 { 1 } else { 2 };
        if tail == 0 || chunk < whole {
            chunk ^ (row & 7)
        } else {
            chunk ^ ((row >> tail_shift) & (tail - 1))
        }
    }

    /// The mma.sync kernels' shared-memory swizzle at every head dim: a permutation of each
    /// row's chunks (else tiles would overlap: wrong results), and each ldmatrix phase (one
    /// logical chunk of 8 rows from a multiple of 8) on 8 different bank groups of 16 bytes.
    #[test]
    fn swizzle_is_a_conflict_free_permutation() {
        for d in HEAD_DIMS {
            let chunks = d / 8;
            for row in 0..64 {
                let mut seen: Vec<usize> = (0..chunks).map(|c| swz_chunk(d, row, c)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..chunks).collect::<Vec<_>>(), "d{d} row {row}");
            }
            for r0 in (0..64).step_by(8) {
                for c in 0..chunks {
                    let mut groups: Vec<usize> = (r0..r0 + 8)
                        .map(|r| (r * chunks + swz_chunk(d, r, c)) % 8)
                        .collect();
                    groups.sort_unstable();
                    groups.dedup();
                    assert_eq!(groups.len(), 8, "d{d}: rows {r0}.., chunk {c} conflict");
                }
            }
        }
    }

    #[test]
    fn rejects_unsupported_shapes() {
        let err = check_dims(&dims(112)).unwrap_err().to_string();
        assert!(
            err.contains("head dims 64, 80, 96, 128, 192 and 256, not 112"),
            "{err}"
        );
        for d in HEAD_DIMS {
            assert!(check_dims(&dims(d)).is_ok());
        }
        let mut d = dims(128);
        d.kv_heads = 5;
        assert!(check_dims(&d).is_err());
        assert!(check_dims(&dims(64)).is_ok());
        let t = Tuning::for_head_dim(128).for_device(128, (9, 0));
        let err = forward_config(&dims(128), 128 << 26, &t)
            .unwrap_err()
            .to_string();
        assert!(err.contains("split the sequence"), "{err}");
        assert!(forward_config(&dims(128), 128 << 24, &t).is_ok());
    }

    #[test]
    fn helper_grids() {
        assert_eq!(rows_config(17).unwrap().grid_dim.0, 3);
        assert_eq!(rows_config(0).unwrap().grid_dim.0, 1);
        assert_eq!(elementwise_config(1 << 30).grid_dim.0, 65_536);
    }
}
