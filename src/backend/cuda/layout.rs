//! Layout changes on the GPU between the model's sequence-major `[rows, heads, head_dim]` and the
//! block API's head-major `[heads, rows, head_dim]` (`kernels/layout.cu`), so the distributed
//! executor (`train::model_attention::Distributed`) can sit behind the model's interface without a
//! trip through the host; the whole-sequence path reads the model's tensors in place
//! (`strides`) and uses only the rounding ([`CudaBackend::round_to_half`]). The output is always
//! 16-bit in the backend's input dtype; f32 input (gradients from the backward, an f32 dO) is
//! rounded to nearest in the same pass.
//!
//! The kernel's index arithmetic is written again in Rust in the tests here (`source_vector`, line
//! for line), which check it against `block_math::layout`, the host reference every other path
//! uses.

use super::launch::Masking;
use super::{CudaBackend, InputDtype, Kind, Tensor, launch};
use crate::backend::{ModelEdge, Order};
use anyhow::{Result, anyhow, bail};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use std::ops::Range;
use std::sync::Arc;

/// One sentence unless `found` is a 16-bit tensor of `dtype` or an f32 one, of `len` elements.
fn check_input(found: (Kind, usize), dtype: InputDtype, len: usize, what: &str) -> Result<()> {
    let (kind, n) = found;
    if (kind == Kind::Half(dtype) || kind == Kind::F32) && n == len {
        return Ok(());
    }
    bail!(
        "{what} must be a {} or an f32 tensor of {len} elements, got {} tensor of {n}",
        dtype.name(),
        kind.a()
    )
}

impl CudaBackend {
    /// `t`, a `[rows, heads, head_dim]` or `[heads, rows, head_dim]` tensor (the other layout
    /// than `to`), in layout `to` as a new 16-bit tensor of the input dtype. `what` names `t` in
    /// errors.
    pub fn relayout(
        &self,
        t: &Tensor,
        rows: usize,
        heads: usize,
        head_dim: usize,
        to: Order,
        what: &str,
    ) -> Result<Tensor> {
        launch::check_head_dim(head_dim)?;
        let len = rows * heads * head_dim;
        check_input((t.kind(), t.len()), self.dtype, len, what)?;
        let mut out = self.alloc_half(len)?;
        if len == 0 {
            return Ok(out);
        }
        let Tensor::Half { data: dst, .. } = &mut out else {
            bail!("a fresh 16-bit buffer came back as f32");
        };
        let kern = self.kernels(head_dim, Masking::Causal)?;
        let (rows, heads) = (rows as i64, heads as i64);
        let head_major = i32::from(to == Order::ToHeadMajor);
        let cfg = launch::elementwise_config(len / 8);
        match t {
            Tensor::Half { data: src, .. } => {
                let mut b = self.stream.launch_builder(&kern.relayout_half);
                b.arg(src).arg(dst).arg(&rows).arg(&heads).arg(&head_major);
                self.launch("relayout_half", b, cfg)?;
            }
            Tensor::F32(src) => {
                let mut b = self.stream.launch_builder(&kern.relayout_f32_half);
                b.arg(src).arg(dst).arg(&rows).arg(&heads).arg(&head_major);
                self.launch("relayout_f32_half", b, cfg)?;
            }
        }
        Ok(out)
    }
}

impl CudaBackend {
    /// `t`, an f32 (or 16-bit) tensor of whole `head_dim`-element vectors, as a new 16-bit
    /// tensor of the input dtype in the same layout: the attention's f32 gradients rounded for
    /// the model. A relayout of one head is the identity, so this is the relayout kernel's
    /// rounding pass alone.
    pub fn round_to_half(&self, t: &Tensor, head_dim: usize, what: &str) -> Result<Tensor> {
        if head_dim == 0 || !t.len().is_multiple_of(head_dim) {
            bail!(
                "{what} must hold whole vectors of {head_dim} elements, not {}",
                t.len()
            );
        }
        self.relayout(t, t.len() / head_dim, 1, head_dim, Order::ToSeqMajor, what)
    }
}

/// A copy of `src[range]`.
fn copy_slice<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    src: &CudaSlice<T>,
    range: Range<usize>,
) -> Result<CudaSlice<T>> {
    let err = |e| anyhow!("could not copy part of a tensor on the GPU: {e:?}");
    let mut out = stream.alloc_zeros::<T>(range.len()).map_err(err)?;
    stream
        .memcpy_dtod(&src.slice(range), &mut out)
        .map_err(err)?;
    Ok(out)
}

/// `src` copied over `dst[at..at + src.len()]`.
fn write_slice<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    dst: &mut CudaSlice<T>,
    at: usize,
    src: &CudaSlice<T>,
) -> Result<()> {
    stream
        .memcpy_dtod(src, &mut dst.slice_mut(at..at + src.len()))
        .map_err(|e| anyhow!("could not copy into part of a tensor on the GPU: {e:?}"))
}

impl CudaBackend {
    /// A copy of elements `range` of `t`, in its precision.
    pub fn copy_range(&self, t: &Tensor, range: Range<usize>) -> Result<Tensor> {
        if range.end > t.len() {
            bail!(
                "elements {range:?} are not inside a tensor of {} elements",
                t.len()
            );
        }
        Ok(match t {
            Tensor::Half { dtype, data } => Tensor::Half {
                dtype: *dtype,
                data: copy_slice(&self.stream, data, range)?,
            },
            Tensor::F32(data) => Tensor::F32(copy_slice(&self.stream, data, range)?),
        })
    }

    /// Writes `src` over elements `at..at + src.len()` of `dst`, a tensor of the same precision.
    pub fn write_at(&self, dst: &mut Tensor, at: usize, src: &Tensor) -> Result<()> {
        if at + src.len() > dst.len() {
            bail!(
                "{} elements written at {at} do not fit a tensor of {}",
                src.len(),
                dst.len()
            );
        }
        match (dst, src) {
            (
                Tensor::Half { dtype, data },
                Tensor::Half {
                    dtype: d,
                    data: from,
                },
            ) if dtype == d => write_slice(&self.stream, data, at, from),
            (Tensor::F32(data), Tensor::F32(from)) => write_slice(&self.stream, data, at, from),
            _ => bail!("a tensor can only be written into one of its own precision"),
        }
    }

    /// `t` cut into consecutive parts of `lens` elements (copies): a zigzag worker's rows into
    /// its two chunks.
    pub fn split(&self, t: &Tensor, lens: &[usize]) -> Result<Vec<Tensor>> {
        if lens.iter().sum::<usize>() != t.len() {
            bail!(
                "cannot cut a tensor of {} elements into parts of {lens:?}",
                t.len()
            );
        }
        let mut at = 0;
        lens.iter()
            .map(|&len| {
                at += len;
                self.copy_range(t, at - len..at)
            })
            .collect()
    }

    /// `parts` one after another in one tensor (all 16-bit of the backend's dtype, or all f32).
    pub fn join(&self, parts: &[Tensor]) -> Result<Tensor> {
        let len = parts.iter().map(Tensor::len).sum();
        let mut out = match parts.first() {
            Some(Tensor::F32(_)) => Tensor::F32(self.alloc_f32(len)?),
            _ => self.alloc_half(len)?,
        };
        let mut at = 0;
        for p in parts {
            self.write_at(&mut out, at, p)?;
            at += p.len();
        }
        Ok(out)
    }
}

/// On the GPU both directions produce 16-bit tensors: the executor's inputs, and the model's
/// activations (f32 results of the block API are rounded in the same pass).
impl ModelEdge for CudaBackend {
    fn relayout(
        &self,
        t: &Tensor,
        rows: usize,
        heads: usize,
        d: usize,
        to: Order,
        what: &str,
    ) -> Result<Tensor> {
        CudaBackend::relayout(self, t, rows, heads, d, to, what)
    }

    fn split(&self, t: &Tensor, lens: &[usize]) -> Result<Vec<Tensor>> {
        CudaBackend::split(self, t, lens)
    }

    fn join(&self, parts: &[Tensor]) -> Result<Tensor> {
        CudaBackend::join(self, parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_math::layout;

    /// The kernels' index arithmetic (`source_vector` in `kernels/layout.cu`, kept identical):
    /// which `head_dim`-vector output vector `out` is read from.
    fn source_vector(out: usize, rows: usize, heads: usize, to: Order) -> usize {
        match to {
            Order::ToHeadMajor => {
                let (h, r) = (out / rows, out % rows);
                r * heads + h
            }
            Order::ToSeqMajor => {
                let (r, h) = (out / heads, out % heads);
                h * rows + r
            }
        }
    }

    /// The kernels' move, on the host: output vector by output vector, through `source_vector`.
    fn relayout_host(src: &[f32], rows: usize, heads: usize, dim: usize, to: Order) -> Vec<f32> {
        (0..rows * heads)
            .flat_map(|out| {
                let at = source_vector(out, rows, heads, to) * dim;
                src[at..at + dim].iter().copied()
            })
            .collect()
    }

    #[test]
    fn index_arithmetic_matches_the_host_layout() {
        // Uneven sizes, GQA-like head counts and a single row or head, so no square hides a
        // swapped index.
        for (rows, heads, dim) in [(5, 3, 4), (7, 1, 8), (1, 4, 2), (13, 8, 16), (6, 2, 1)] {
            let seq: Vec<f32> = (0..rows * heads * dim).map(|x| x as f32).collect();
            let head = relayout_host(&seq, rows, heads, dim, Order::ToHeadMajor);
            assert_eq!(head, layout::to_head_major(&seq, 1, rows, heads, dim));
            assert_eq!(
                relayout_host(&head, rows, heads, dim, Order::ToSeqMajor),
                seq
            );
        }
    }

    #[test]
    fn every_source_vector_is_read_once() {
        let (rows, heads) = (9, 4);
        for to in [Order::ToHeadMajor, Order::ToSeqMajor] {
            let mut seen: Vec<usize> = (0..rows * heads)
                .map(|o| source_vector(o, rows, heads, to))
                .collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..rows * heads).collect::<Vec<_>>());
        }
    }

    #[test]
    fn wrong_inputs_are_sentences() {
        let bf = InputDtype::Bf16;
        assert!(check_input((Kind::Half(bf), 12), bf, 12, "Q").is_ok());
        assert!(check_input((Kind::F32, 12), bf, 12, "dO").is_ok());
        let err = check_input((Kind::Half(InputDtype::F16), 12), bf, 12, "Q")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "Q must be a bf16 or an f32 tensor of 12 elements, got a fp16 tensor of 12"
        );
        let err = check_input((Kind::F32, 10), bf, 12, "dO")
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("got an f32 tensor of 10"), "{err}");
    }
}
