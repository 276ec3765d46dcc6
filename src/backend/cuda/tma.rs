//! Tensor maps for the TMA loads of the Hopper forward kernel (`kernels/forward_wgmma.cu`).
//!
//! A tensor map tells the GPU's tensor memory accelerator how a tensor lies in global memory and
//! which box one load copies; the kernel then moves a whole K or V tile with one instruction per
//! 64 columns instead of 16 cp.async per thread, and the 128-byte swizzle it lands in is the
//! layout the kernel's wgmma descriptors read. The shape arithmetic is plain and tested without a
//! GPU; the encoding is the driver's (`cuTensorMapEncodeTiled`).

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

/// Where `matrices` row-major matrices of `rows` × `head_dim` 16-bit values lie one after the
/// other, read in boxes of 64 columns × `box_rows` rows: the driver's dims and strides (fastest
/// first, strides in bytes and without the element's own).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TileMapShape {
    dims: [u64; 3],
    strides: [u64; 2],
    box_dims: [u32; 3],
}

impl TileMapShape {
    pub(crate) fn new(
        matrices: usize,
        rows: usize,
        head_dim: usize,
        box_rows: usize,
    ) -> Result<Self> {
        if matrices == 0 || rows == 0 {
            bail!("a tensor map needs at least one row of one matrix ({matrices} × {rows} rows)");
        }
        if !head_dim.is_multiple_of(BOX_COLUMNS) {
            bail!("TMA tiles need a head dim that is a multiple of {BOX_COLUMNS}, not {head_dim}");
        }
        if !(1..=256).contains(&box_rows) {
            bail!("a TMA box has 1 to 256 rows, not {box_rows}");
        }
        let row_bytes = (head_dim * 2) as u64;
        Ok(TileMapShape {
            dims: [head_dim as u64, rows as u64, matrices as u64],
            strides: [row_bytes, row_bytes * rows as u64],
            box_dims: [BOX_COLUMNS as u32, box_rows as u32, 1],
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
        let element_strides = [1u32; 3];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every array holds the rank (3) entries the driver reads, or rank − 1 for the
        // strides; `map` is writable and outlives the call; the driver only records `ptr`.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                3,
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
    fn shape_of_head_major_tiles() {
        // 2·8 heads of 1000 rows × 128: boxes of 64 columns × 128 rows, one matrix at a time.
        let s = TileMapShape::new(16, 1000, 128, 128).unwrap();
        assert_eq!(s.dims, [128, 1000, 16]);
        assert_eq!(s.strides, [256, 256_000]);
        assert_eq!(s.box_dims, [64, 128, 1]);
        let s64 = TileMapShape::new(1, 7, 64, 128).unwrap();
        assert_eq!((s64.dims, s64.strides), ([64, 7, 1], [128, 896]));
    }

    #[test]
    fn shapes_tma_cannot_load_are_refused() {
        assert!(TileMapShape::new(0, 10, 128, 128).is_err());
        assert!(TileMapShape::new(1, 0, 128, 128).is_err());
        let err = TileMapShape::new(1, 10, 96, 128).unwrap_err().to_string();
        assert!(err.contains("multiple of 64"), "{err}");
        assert!(TileMapShape::new(1, 10, 128, 257).is_err());
    }
}
