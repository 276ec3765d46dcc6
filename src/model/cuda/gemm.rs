//! The model's matrix products through cuBLAS (`cublasGemmEx`: 16-bit A and B, f32 compute, C
//! in 16 bits or f32), with the row-major → column-major arithmetic as plain data so CI tests it.
//!
//! cuBLAS is column-major; our matrices are row-major, and a row-major `[r, c]` matrix is the
//! column-major `[c, r]` matrix of its transpose. Each product below is therefore written for
//! the transposes: y = x Wᵀ becomes yᵀ = W xᵀ, and so on.

use crate::backend::cuda::{InputDtype, Tensor};
use anyhow::{Result, anyhow, bail};
use cudarc::cublas::{CudaBlas, result, sys};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use std::ffi::c_int;
use std::ops::Range;
use std::sync::Arc;

/// One cuBLAS product C = op(A) op(B) + beta C in column-major terms (C is m×n).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmShape {
    pub transa: bool,
    pub transb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl GemmShape {
    /// y `[rows, out]` = x `[rows, inp]` Wᵀ, with A = W `[out, inp]`, B = x.
    pub(crate) fn forward(rows: usize, inp: usize, out: usize) -> Self {
        GemmShape {
            transa: true,
            transb: false,
            m: out,
            n: rows,
            k: inp,
            lda: inp,
            ldb: inp,
            ldc: out,
        }
    }

    /// dx `[rows, inp]` (+)= dy `[rows, out]` W, with A = W `[out, inp]`, B = dy.
    pub(crate) fn input_grad(rows: usize, inp: usize, out: usize) -> Self {
        GemmShape {
            transa: false,
            transb: false,
            m: inp,
            n: rows,
            k: out,
            lda: inp,
            ldb: out,
            ldc: inp,
        }
    }

    /// dW `[out, inp]` (+)= dyᵀ x, with A = x `[rows, inp]`, B = dy `[rows, out]`.
    pub(crate) fn weight_grad(rows: usize, inp: usize, out: usize) -> Self {
        GemmShape {
            transa: false,
            transb: true,
            m: inp,
            n: out,
            k: rows,
            lda: inp,
            ldb: out,
            ldc: inp,
        }
    }

    /// Elements of A, B and C this product reads or writes.
    pub(crate) fn lens(&self) -> [usize; 3] {
        let a_cols = if self.transa { self.m } else { self.k };
        let b_cols = if self.transb { self.k } else { self.n };
        [self.lda * a_cols, self.ldb * b_cols, self.ldc * self.n]
    }
}

/// The element type of a GEMM's output, as cuBLAS names it.
pub(crate) trait GemmOut {
    fn data_type(dtype: InputDtype) -> sys::cudaDataType;
}

impl GemmOut for u16 {
    fn data_type(dtype: InputDtype) -> sys::cudaDataType {
        half_type(dtype)
    }
}

impl GemmOut for f32 {
    fn data_type(_: InputDtype) -> sys::cudaDataType {
        sys::cudaDataType::CUDA_R_32F
    }
}

fn half_type(dtype: InputDtype) -> sys::cudaDataType {
    match dtype {
        InputDtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        InputDtype::F16 => sys::cudaDataType::CUDA_R_16F,
    }
}

fn int(v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| anyhow!("{v} is too large for a cuBLAS dimension"))
}

/// A cuBLAS handle on the model's stream, for products of 16-bit matrices in `dtype`.
pub(crate) struct Blas {
    handle: CudaBlas,
    stream: Arc<CudaStream>,
    dtype: InputDtype,
}

impl Blas {
    pub(crate) fn new(stream: Arc<CudaStream>, dtype: InputDtype) -> Result<Blas> {
        let handle = CudaBlas::new(stream.clone())
            .map_err(|e| anyhow!("could not open cuBLAS on the GPU: {e:?}"))?;
        Ok(Blas {
            handle,
            stream,
            dtype,
        })
    }

    /// [`Blas::gemm`] into the elements `range` of a tensor of either variant (the accumulating
    /// products: the backward's, and the residual stream's rows).
    pub(crate) fn gemm_into(
        &self,
        shape: GemmShape,
        a: &impl DevicePtr<u16>,
        b: &impl DevicePtr<u16>,
        (c, range): (&mut Tensor, Range<usize>),
        [alpha, beta]: [f32; 2],
    ) -> Result<()> {
        if range.end > c.len() {
            bail!(
                "GEMM output elements {range:?} are not inside a tensor of {}",
                c.len()
            );
        }
        match c {
            Tensor::Half { data, .. } => {
                self.gemm(shape, a, b, &mut data.slice_mut(range), [alpha, beta])
            }
            Tensor::F32(data) => self.gemm(shape, a, b, &mut data.slice_mut(range), [alpha, beta]),
        }
    }

    /// C = alpha·op(A) op(B) + beta·C, A and B 16-bit, f32 compute. Fails with a sentence when
    /// an operand is shorter than the shape needs.
    pub(crate) fn gemm<T: GemmOut>(
        &self,
        shape: GemmShape,
        a: &impl DevicePtr<u16>,
        b: &impl DevicePtr<u16>,
        c: &mut impl DevicePtrMut<T>,
        [alpha, beta]: [f32; 2],
    ) -> Result<()> {
        let (stream, dtype) = (&self.stream, self.dtype);
        let [a_len, b_len, c_len] = shape.lens();
        for (what, have, need) in [
            ("A", a.len(), a_len),
            ("B", b.len(), b_len),
            ("C", c.len(), c_len),
        ] {
            if have < need {
                bail!("GEMM operand {what} has {have} elements where {need} are needed");
            }
        }
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (m, n, k) = (int(shape.m)?, int(shape.n)?, int(shape.k)?);
        let (lda, ldb, ldc) = (int(shape.lda)?, int(shape.ldb)?, int(shape.ldc)?);
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| anyhow!("could not bind the CUDA context: {e:?}"))?;
        let (a, _read_a) = a.device_ptr(stream);
        let (b, _read_b) = b.device_ptr(stream);
        let (c, _write_c) = c.device_ptr_mut(stream);
        // SAFETY: the handle was created on this stream's context and is bound to it; A, B and C
        // are live device buffers of at least the lengths the shape addresses (checked above), of
        // the types passed (16-bit `dtype` for A and B, `T` for C); alpha and beta are f32 as
        // CUBLAS_COMPUTE_32F requires, and they outlive the call. The guards keep the buffers'
        // event bookkeeping until the call is queued.
        unsafe {
            result::gemm_ex(
                *self.handle.handle(),
                op(shape.transa),
                op(shape.transb),
                m,
                n,
                k,
                &alpha as *const f32 as *const _,
                a as *const _,
                half_type(dtype),
                lda,
                b as *const _,
                half_type(dtype),
                ldb,
                &beta as *const f32 as *const _,
                c as *mut _,
                T::data_type(dtype),
                ldc,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| anyhow!("cuBLAS GEMM {shape:?} failed: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C = op(A) op(B) + beta C, column-major, as cuBLAS defines it.
    fn reference(s: GemmShape, a: &[f64], b: &[f64], c: &mut [f64], beta: f64) {
        let at = |i: usize, p: usize| {
            if s.transa {
                a[p + i * s.lda]
            } else {
                a[i + p * s.lda]
            }
        };
        let bt = |p: usize, j: usize| {
            if s.transb {
                b[j + p * s.ldb]
            } else {
                b[p + j * s.ldb]
            }
        };
        for j in 0..s.n {
            for i in 0..s.m {
                let dot: f64 = (0..s.k).map(|p| at(i, p) * bt(p, j)).sum();
                c[i + j * s.ldc] = dot + beta * c[i + j * s.ldc];
            }
        }
    }

    fn data(len: usize, seed: usize) -> Vec<f64> {
        (0..len)
            .map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0)
            .collect()
    }

    /// Row-major `[r, c]` times row-major `[c, n]`.
    fn matmul(a: &[f64], b: &[f64], r: usize, c: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; r * n];
        for i in 0..r {
            for j in 0..n {
                out[i * n + j] = (0..c).map(|p| a[i * c + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    fn transpose(a: &[f64], r: usize, c: usize) -> Vec<f64> {
        (0..c * r).map(|i| a[(i % r) * c + i / r]).collect()
    }

    #[test]
    fn the_three_products_match_row_major_math() {
        let (rows, inp, out) = (5, 3, 4);
        let x = data(rows * inp, 1);
        let w = data(out * inp, 2);
        let dy = data(rows * out, 3);

        let s = GemmShape::forward(rows, inp, out);
        assert_eq!(s.lens(), [out * inp, rows * inp, rows * out]);
        let mut y = vec![0.0; rows * out];
        reference(s, &w, &x, &mut y, 0.0);
        assert_eq!(y, matmul(&x, &transpose(&w, out, inp), rows, inp, out));

        let s = GemmShape::input_grad(rows, inp, out);
        assert_eq!(s.lens(), [out * inp, rows * out, rows * inp]);
        let mut dx = vec![1.0; rows * inp];
        reference(s, &w, &dy, &mut dx, 1.0);
        let want: Vec<f64> = matmul(&dy, &w, rows, out, inp)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        assert_eq!(dx, want);

        let s = GemmShape::weight_grad(rows, inp, out);
        assert_eq!(s.lens(), [rows * inp, rows * out, out * inp]);
        let mut dw = vec![2.0; out * inp];
        reference(s, &x, &dy, &mut dw, 1.0);
        let want: Vec<f64> = matmul(&transpose(&dy, rows, out), &x, out, rows, inp)
            .iter()
            .map(|v| v + 2.0)
            .collect();
        assert_eq!(dw, want);
    }
}
