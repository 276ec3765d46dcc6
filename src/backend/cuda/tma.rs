//! Tensor maps for the TMA copies of the Hopper kernels: the forward's loads of Q, K and V
//! (`kernels/forward_wgmma.cu`), the backward's loads of Q and dO and its reductions into dQ
//! (`kernels/backward_wgmma.cu`, `backward_wgmma_wide.cu`).
//!
//! A tensor map tells the GPU's tensor memory accelerator how a tensor lies in global memory and
//! which box one copy moves; a kernel then loads a whole tile with one instruction per 64
//! columns instead of 16 cp.async per thread, into the 128-byte swizzle its wgmma descriptors
//! read, and the backward adds a dQ tile with one instruction per 32 f32 columns, from the
//! first thread of each warpgroup, instead of one bulk reduction per row. A head dim that is
//! not a multiple of a box (80, 96) ends in a box that reaches past the row: its extra columns
//! load as zeros (the forward's padded tile) and are not written by a reduction. The shape
//! arithmetic is plain and tested without a GPU; the encoding is the driver's
//! (`cuTensorMapEncodeTiled`).

use super::strides::Strides;
use anyhow::{Result, anyhow, bail};
use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::{
    self, CUtensorMapDataType_enum::*, CUtensorMapFloatOOBfill_enum::*,
    CUtensorMapInterleave_enum::*, CUtensorMapL2promotion_enum::*, CUtensorMapSwizzle_enum::*,
};

/// Bytes of one box row: the span of the 128-byte swizzle.
const BOX_ROW_BYTES: usize = 128;

/// The element type of a mapped tensor: the inputs' 16-bit types or the f32 of an accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapElement {
    Bf16,
    F16,
    F32,
}

impl MapElement {
    fn bytes(self) -> usize {
        match self {
            MapElement::Bf16 | MapElement::F16 => 2,
            MapElement::F32 => 4,
        }
    }

    fn driver_type(self) -> sys::CUtensorMapDataType {
        match self {
            MapElement::Bf16 => CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            MapElement::F16 => CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            MapElement::F32 => CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

/// An encoded tensor map, passed to a kernel by value (a `__grid_constant__` parameter).
#[repr(transparent)]
pub(crate) struct TensorMap(sys::CUtensorMap);

// SAFETY: CUtensorMap is plain bytes (repr(C), the alignment the kernel's parameter declares),
// which the driver copies into the kernel's parameter space.
unsafe impl DeviceRepr for TensorMap {}

/// Where a `[batch, heads, rows, head_dim]` tensor lies under its [`Strides`], copied in boxes
/// of 128 bytes of columns (64 16-bit values, 32 f32) × `box_rows` rows of one (batch, head):
/// the driver's dims and strides (fastest first, strides in bytes and without the element's
/// own). The dims need not be in the order of their strides, so one shape serves head-major and
/// sequence-major tensors.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TileMapShape {
    element: MapElement,
    dims: [u64; 4],
    strides: [u64; 3],
    box_dims: [u32; 4],
}

impl TileMapShape {
    pub(crate) fn new(
        strides: &Strides,
        [batch, heads, rows, head_dim]: [usize; 4],
        box_rows: usize,
        element: MapElement,
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
            let b = u64::try_from(s).map_err(|_| anyhow!("TMA strides are positive, not {s}"))?
                * element.bytes() as u64;
            if !b.is_multiple_of(16) || b >= 1 << 40 {
                bail!("a TMA stride must be a multiple of 16 bytes below 2^40, not {b}");
            }
            Ok(b)
        };
        Ok(TileMapShape {
            element,
            dims: [head_dim, rows, heads, batch].map(|d| d as u64),
            strides: [
                bytes(strides.row)?,
                bytes(strides.head)?,
                bytes(strides.batch)?,
            ],
            box_dims: [
                (BOX_ROW_BYTES / element.bytes()) as u32,
                box_rows as u32,
                1,
                1,
            ],
        })
    }

    /// Encodes the map for the tensor at device address `ptr`, with the 128-byte swizzle and
    /// zeros for what a load reads past the end (a reduction writes nothing there).
    pub(crate) fn encode(&self, ptr: sys::CUdeviceptr) -> Result<TensorMap> {
        if !ptr.is_multiple_of(16) {
            bail!("TMA needs 16-byte aligned tensors; this one starts at {ptr:#x}");
        }
        let element_strides = [1u32; 4];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every array holds the rank (4) entries the driver reads, or rank − 1 for the
        // strides; `map` is writable and outlives the call; the driver only records `ptr`.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                self.element.driver_type(),
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
        let s = TileMapShape::new(&hm, [2, 8, 1000, 128], 128, MapElement::Bf16).unwrap();
        assert_eq!(s.dims, [128, 1000, 8, 2]);
        assert_eq!(s.strides, [256, 256_000, 2_048_000]);
        assert_eq!(s.box_dims, [64, 128, 1, 1]);
        // Sequence-major: rows 8·128 elements apart, heads 128.
        let sm = Strides::seq_major(8, 1000, 128);
        let s = TileMapShape::new(&sm, [2, 8, 1000, 128], 128, MapElement::Bf16).unwrap();
        assert_eq!(s.strides, [2048, 256, 2_048_000]);
        // Head dim 80: the second box of 64 columns reaches past the row (the kernel's padding,
        // filled with zeros); rows stay 160 bytes apart.
        let hm80 = Strides::head_major(8, 1000, 80);
        let s = TileMapShape::new(&hm80, [2, 8, 1000, 80], 128, MapElement::Bf16).unwrap();
        assert_eq!(s.dims, [80, 1000, 8, 2]);
        assert_eq!(s.strides, [160, 160_000, 1_280_000]);
        assert_eq!(s.box_dims, [64, 128, 1, 1]);
        // The backward's f32 dQ, sequence-major: strides in 4-byte elements, boxes of 32
        // columns (128 bytes) × 64 rows.
        let s = TileMapShape::new(&sm, [2, 8, 1000, 128], 64, MapElement::F32).unwrap();
        assert_eq!(s.dims, [128, 1000, 8, 2]);
        assert_eq!(s.strides, [4096, 512, 4_096_000]);
        assert_eq!(s.box_dims, [32, 64, 1, 1]);
    }

    #[test]
    fn shapes_tma_cannot_load_are_refused() {
        let hm = Strides::head_major(1, 10, 128);
        assert!(TileMapShape::new(&hm, [0, 1, 10, 128], 128, MapElement::Bf16).is_err());
        assert!(TileMapShape::new(&hm, [1, 1, 0, 128], 128, MapElement::Bf16).is_err());
        assert!(TileMapShape::new(&hm, [1, 1, 10, 0], 128, MapElement::Bf16).is_err());
        assert!(TileMapShape::new(&hm, [1, 1, 10, 128], 257, MapElement::Bf16).is_err());
        let odd = Strides { row: 132, ..hm };
        let err = TileMapShape::new(&odd, [1, 1, 10, 128], 128, MapElement::Bf16)
            .unwrap_err()
            .to_string();
        assert!(err.contains("multiple of 16 bytes"), "{err}");
    }
}
