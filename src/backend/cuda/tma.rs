//! Tensor maps for the TMA loads of the Hopper forward kernel (`kernels/forward_wgmma.cu`).
//!
//! A tensor map tells the GPU's tensor memory accelerator how a tensor lies in global memory and
//! which box one load copies; the kernel then moves a whole K or V tile with one instruction per
//! 64 columns instead of 16 cp.async per thread, and the 128-byte swizzle it lands in is the
//! layout the kernel's wgmma descriptors read. A head dim that is not a multiple of 64 (80, 96)
//! ends in a box that reaches past the row, whose extra columns land as zeros: the kernel's
//! padded tile. The shape arithmetic is plain and tested without a
//! GPU; the encoding is the driver's (`cuTensorMapEncodeTiled`).

use super::strides::Strides;
use anyhow::{Result, anyhow, bail};
use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::{
    self, CUtensorMapDataType_enum::*, CUtensorMapFloatOOBfill_enum::*,
    CUtensorMapInterleave_enum::*, CUtensorMapL2promotion_enum::*, CUtensorMapSwizzle_enum::*,
};

/// Columns of one box: 64 16-bit values are the 128 bytes the swizzle spans.
const BOX_COLUMNS: usize = 64;

/// An encoded tensor map, passed to a kernel by value (a `__grid_constant__` parameter).
#[repr(transparent)]
pub(crate) struct TensorMap(sys::CUtensorMap);

// SAFETY: CUtensorMap is plain bytes (repr(C), the alignment the kernel's parameter declares),
// which the driver copies into the kernel's parameter space.
unsafe impl DeviceRepr for TensorMap {}

/// Where a `[batch, heads, rows, head_dim]` tensor of 16-bit values lies under its
/// [`Strides`], read in boxes of 64 columns × `box_rows` rows of one (batch, head): the
/// driver's dims and strides (fastest first, strides in bytes and without the element's own).
/// The dims need not be in the order of their strides, so one shape serves head-major and
/// sequence-major tensors.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TileMapShape {
    dims: [u64; 4],
    strides: [u64; 3],
    box_dims: [u32; 4],
}

impl TileMapShape {
    pub(crate) fn new(
        strides: &Strides,
        [batch, heads, rows, head_dim]: [usize; 4],
        box_rows: usize,
    ) -> Result<Self> {
        if batch == 0 || heads == 0 || rows == 0 || head_dim == 0 {
            bail!(
                "a tensor map needs at least one row of one head \
                 ({batch} × {heads} × {rows} rows of {head_dim})"
            );
        }
        if !(1..=256).contains(&box_rows) {
            bail!("a TMA box has 1 to 256 rows, not {box_rows}");
        }
        let bytes = |s: i64| -> Result<u64> {
            let b = u64::try_from(s).map_err(|_| anyhow!("TMA strides are positive, not {s}"))? * 2;
            if !b.is_multiple_of(16) || b >= 1 << 40 {
                bail!("a TMA stride must be a multiple of 16 bytes below 2^40, not {b}");
            }
            Ok(b)
        };
        Ok(TileMapShape {
            dims: [head_dim, rows, heads, batch].map(|d| d as u64),
            strides: [
                bytes(strides.row)?,
                bytes(strides.head)?,
                bytes(strides.batch)?,
            ],
            box_dims: [BOX_COLUMNS as u32, box_rows as u32, 1, 1],
        })
    }

    /// Encodes the map for the tensor at device address `ptr` (16-bit values, bf16 or fp16),
    /// with the 128-byte swizzle and zeros for rows past the end.
    pub(crate) fn encode(&self, ptr: sys::CUdeviceptr, bf16: bool) -> Result<TensorMap> {
        if !ptr.is_multiple_of(16) {
            bail!("TMA needs 16-byte aligned tensors; this one starts at {ptr:#x}");
        }
        let dtype = if bf16 {
            CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        } else {
            CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        };
        let element_strides = [1u32; 4];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every array holds the rank (4) entries the driver reads, or rank − 1 for the
        // strides; `map` is writable and outlives the call; the driver only records `ptr`.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                4,
                ptr as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.box_dims.as_ptr(),
                element_strides.as_ptr(),
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(|e| {
            anyhow!("could not describe a tensor to the GPU's TMA unit ({self:?}): {e:?}")
        })?;
        Ok(TensorMap(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_of_head_and_sequence_major_tiles() {
        // 2 batches · 8 heads of 1000 rows × 128, boxes of 64 columns × 128 rows of one head.
        let hm = Strides::head_major(8, 1000, 128);
        let s = TileMapShape::new(&hm, [2, 8, 1000, 128], 128).unwrap();
        assert_eq!(s.dims, [128, 1000, 8, 2]);
        assert_eq!(s.strides, [256, 256_000, 2_048_000]);
        assert_eq!(s.box_dims, [64, 128, 1, 1]);
        // Sequence-major: rows 8·128 elements apart, heads 128.
        let sm = Strides::seq_major(8, 1000, 128);
        let s = TileMapShape::new(&sm, [2, 8, 1000, 128], 128).unwrap();
        assert_eq!(s.strides, [2048, 256, 2_048_000]);
        // Head dim 80: the second box of 64 columns reaches past the row (the kernel's padding,
        // filled with zeros); rows stay 160 bytes apart.
        let hm80 = Strides::head_major(8, 1000, 80);
        let s = TileMapShape::new(&hm80, [2, 8, 1000, 80], 128).unwrap();
        assert_eq!(s.dims, [80, 1000, 8, 2]);
        assert_eq!(s.strides, [160, 160_000, 1_280_000]);
        assert_eq!(s.box_dims, [64, 128, 1, 1]);
    }

    #[test]
    fn shapes_tma_cannot_load_are_refused() {
        let hm = Strides::head_major(1, 10, 128);
        assert!(TileMapShape::new(&hm, [0, 1, 10, 128], 128).is_err());
        assert!(TileMapShape::new(&hm, [1, 1, 0, 128], 128).is_err());
        assert!(TileMapShape::new(&hm, [1, 1, 10, 0], 128).is_err());
        assert!(TileMapShape::new(&hm, [1, 1, 10, 128], 257).is_err());
        let odd = Strides { row: 132, ..hm };
        let err = TileMapShape::new(&odd, [1, 1, 10, 128], 128)
            .unwrap_err()
            .to_string();
        assert!(err.contains("multiple of 16 bytes"), "{err}");
    }
}
