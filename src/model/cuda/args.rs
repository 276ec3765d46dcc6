//! Tensor arguments of the model ops: the checks that turn a wrong variant or length into a
//! sentence, and the pushing of a tensor as the kernels take it, `(pointer, is 16-bit)`.

use crate::backend::cuda::{InputDtype, Tensor};
use anyhow::{Result, anyhow, bail};
use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};

/// What `t` holds, in words ("bf16", "f32").
fn variant(t: &Tensor) -> &'static str {
    match t {
        Tensor::Half { dtype, .. } => dtype.name(),
        Tensor::F32(_) => "f32",
    }
}

/// `t`, if 16-bit, is in the device's format `dtype`; either variant is fine.
pub(crate) fn check_format(t: &Tensor, dtype: InputDtype, what: &str) -> Result<()> {
    if let Tensor::Half { dtype: d, .. } = t
        && *d != dtype
    {
        bail!(
            "{what} holds {} values but this device computes in {}",
            d.name(),
            dtype.name()
        );
    }
    Ok(())
}

/// `t` has `len` elements and, if 16-bit, the device's format `dtype`; either variant is fine.
pub(crate) fn check(t: &Tensor, dtype: InputDtype, len: usize, what: &str) -> Result<()> {
    check_format(t, dtype, what)?;
    if t.len() != len {
        bail!("{what} has {} elements where {len} were expected", t.len());
    }
    Ok(())
}

/// Why `t` is not an f32 buffer of `len` elements.
fn not_f32(t: &Tensor, len: usize, what: &str) -> anyhow::Error {
    match t {
        Tensor::F32(data) => anyhow!(
            "{what} has {} elements where {len} were expected",
            data.len()
        ),
        Tensor::Half { .. } => anyhow!("{what} must be an f32 tensor, not {}", variant(t)),
    }
}

/// `t` as an f32 buffer of `len` elements (statistics, moments, atomically accumulated grads).
pub(crate) fn f32_ref<'a>(t: &'a Tensor, len: usize, what: &str) -> Result<&'a CudaSlice<f32>> {
    match t {
        Tensor::F32(data) if data.len() == len => Ok(data),
        other => Err(not_f32(other, len, what)),
    }
}

/// [`f32_ref`], writable.
pub(crate) fn f32_mut<'a>(
    t: &'a mut Tensor,
    len: usize,
    what: &str,
) -> Result<&'a mut CudaSlice<f32>> {
    f32_ref(t, len, what)?;
    match t {
        Tensor::F32(data) => Ok(data),
        other => Err(not_f32(other, len, what)),
    }
}

/// Pushes a tensor the kernel reads: its pointer, then 1 if it is 16-bit, else 0.
pub(crate) fn push<'a>(b: &mut LaunchArgs<'a>, t: &'a Tensor) {
    match t {
        Tensor::Half { data, .. } => b.arg(data).arg(&1i32),
        Tensor::F32(data) => b.arg(data).arg(&0i32),
    };
}

/// Pushes a tensor the kernel writes, like [`push`].
pub(crate) fn push_mut<'a>(b: &mut LaunchArgs<'a>, t: &'a mut Tensor) {
    match t {
        Tensor::Half { data, .. } => b.arg(data).arg(&1i32),
        Tensor::F32(data) => b.arg(data).arg(&0i32),
    };
}

/// A size the kernels take as a 32-bit `int`.
pub(crate) fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{what} of {v} does not fit the kernels' int"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_do_not_fit_are_sentences() {
        assert_eq!(int(4096, "a width").unwrap(), 4096);
        let e = int(1 << 31, "a width").unwrap_err().to_string();
        assert_eq!(e, "a width of 2147483648 does not fit the kernels' int");
    }
}
