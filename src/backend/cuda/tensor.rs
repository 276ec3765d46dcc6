//! The backend's tensors: the 16-bit input formats (bf16, fp16) and their rounding, the
//! [`Tensor`] every kernel reads and writes (16-bit inputs or f32 statistics and gradients), and
//! the argument checks that turn a wrong element type or length into one sentence before a
//! launch.

use anyhow::{Result, anyhow, bail};
use cudarc::driver::CudaSlice;

/// 16-bit floating-point format of the inputs (Q, K, V, dO) on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputDtype {
    Bf16,
    F16,
}

impl InputDtype {
    /// Converts f32 to this format's bit pattern (round to nearest even).
    pub(super) fn encode(self, x: f32) -> u16 {
        match self {
            InputDtype::Bf16 => half::bf16::from_f32(x).to_bits(),
            InputDtype::F16 => half::f16::from_f32(x).to_bits(),
        }
    }

    pub(super) fn decode(self, bits: u16) -> f32 {
        match self {
            InputDtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
            InputDtype::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// `x` as the device will see it after upload: rounded to this format and back.
    pub fn round(self, x: f32) -> f32 {
        self.decode(self.encode(x))
    }

    /// Whether AdamW's master of a weight in this format is only the f32's low half
    /// ([`master_split`]): bf16 has f32's exponent, so the weight is the f32's upper half,
    /// rounded, and the low half completes it. An fp16 weight's rounding leaves a remainder no
    /// 16 bits hold exactly (its exponent range is f32's narrow part), so its master is an f32
    /// copy.
    pub fn master_is_low_half(self) -> bool {
        self == InputDtype::Bf16
    }

    /// Bytes per element of AdamW's master of a weight in this format.
    pub fn master_bytes(self) -> usize {
        if self.master_is_low_half() { 2 } else { 4 }
    }

    /// Name as written on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            InputDtype::Bf16 => "bf16",
            InputDtype::F16 => "fp16",
        }
    }
}

impl std::str::FromStr for InputDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bf16" | "bfloat16" => Ok(InputDtype::Bf16),
            "fp16" | "f16" | "float16" | "half" => Ok(InputDtype::F16),
            _ => bail!("unknown input dtype {s:?}: use bf16 or fp16"),
        }
    }
}

/// An f32 master as a bf16 weight and the master's low half: the weight is the upper 16 bits
/// of `x`'s bits rounded to nearest, ties away from zero (round to nearest even could not be
/// undone: at a tie both neighbours are even), and the low half is `x`'s lower 16 bits, so
/// [`master_join`] gives `x` back bit for bit. A NaN's weight is a NaN. `kernels/model.cu`'s
/// `master_split` is this, run by AdamW on the device.
pub fn master_split(x: f32) -> (u16, u16) {
    let bits = x.to_bits();
    let hi = match x.is_nan() {
        true => 0x7fc0,
        false => (bits.wrapping_add(0x8000) >> 16) as u16,
    };
    (hi, bits as u16)
}

/// The f32 master of a bf16 weight `hi` with low half `lo` ([`master_split`]'s inverse): a
/// weight rounded up carries one too many in its upper half, which the low half, read as
/// signed, takes back.
pub fn master_join(hi: u16, lo: u16) -> f32 {
    f32::from_bits((u32::from(hi) << 16).wrapping_add(lo as i16 as i32 as u32))
}

/// A tensor on the GPU: 16-bit inputs (raw bits, tagged with their format) or f32 statistics,
/// accumulators and gradients. Cloning copies the device buffer (the model's `Ops` needs it).
#[derive(Clone, Debug)]
pub enum Tensor {
    /// Q, K, V, dO, and O of the fast path: the kernels read the bits as bf16 or fp16.
    Half {
        dtype: InputDtype,
        data: CudaSlice<u16>,
    },
    /// Everything kept in full precision (m, l, acc, LSE, D, block-API O, gradients).
    F32(CudaSlice<f32>),
}

impl Tensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Tensor::Half { data, .. } => data.len(),
            Tensor::F32(data) => data.len(),
        }
    }

    /// True for a tensor of no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy on the device, or a sentence when the device cannot make it (`Clone` would panic).
    pub fn try_clone(&self) -> Result<Tensor> {
        let err = |e| anyhow!("could not copy a tensor on the device: {e:?}");
        Ok(match self {
            Tensor::Half { dtype, data } => Tensor::Half {
                dtype: *dtype,
                data: data.try_clone().map_err(err)?,
            },
            Tensor::F32(data) => Tensor::F32(data.try_clone().map_err(err)?),
        })
    }

    pub(super) fn kind(&self) -> Kind {
        match self {
            Tensor::Half { dtype, .. } => Kind::Half(*dtype),
            Tensor::F32(_) => Kind::F32,
        }
    }

    pub(super) fn describe(&self) -> String {
        format!("{} tensor of {}", self.kind().a(), self.len())
    }
}

/// Element type of a [`Tensor`], so shape checks are plain data (and testable without a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Half(InputDtype),
    F32,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Half(d) => d.name(),
            Kind::F32 => "f32",
        }
    }

    /// "a bf16", "an f32": the name with its article.
    pub(super) fn a(self) -> String {
        let article = if self == Kind::F32 { "an" } else { "a" };
        format!("{article} {}", self.name())
    }
}

/// One sentence when an argument has the wrong element type or length.
fn expect(found: (Kind, usize), want: (Kind, usize), what: &str) -> Result<()> {
    if found != want {
        bail!(
            "{what} must be {} tensor of {} elements, got {} tensor of {}",
            want.0.a(),
            want.1,
            found.0.a(),
            found.1
        );
    }
    Ok(())
}

/// Checks that `t` is a 16-bit tensor of the backend's dtype with `len` elements.
pub(super) fn half<'a>(
    t: &'a Tensor,
    dtype: InputDtype,
    len: usize,
    what: &str,
) -> Result<&'a CudaSlice<u16>> {
    expect((t.kind(), t.len()), (Kind::Half(dtype), len), what)?;
    match t {
        Tensor::Half { data, .. } => Ok(data),
        Tensor::F32(_) => bail!("{what} must be a {} tensor", dtype.name()),
    }
}

pub(super) fn f32_ref<'a>(t: &'a Tensor, len: usize, what: &str) -> Result<&'a CudaSlice<f32>> {
    expect((t.kind(), t.len()), (Kind::F32, len), what)?;
    match t {
        Tensor::F32(data) => Ok(data),
        Tensor::Half { .. } => bail!("{what} must be an f32 tensor"),
    }
}

/// As [`half`], mutable: a tensor a kernel writes.
pub(super) fn half_mut<'a>(
    t: &'a mut Tensor,
    dtype: InputDtype,
    len: usize,
    what: &str,
) -> Result<&'a mut CudaSlice<u16>> {
    half(t, dtype, len, what)?; // validates, with the sentence
    match t {
        Tensor::Half { data, .. } => Ok(data),
        Tensor::F32(_) => bail!("{what} must be a {} tensor", dtype.name()),
    }
}

pub(super) fn f32_mut<'a>(
    t: &'a mut Tensor,
    len: usize,
    what: &str,
) -> Result<&'a mut CudaSlice<f32>> {
    f32_ref(t, len, what)?; // validates, with the sentence
    match t {
        Tensor::F32(data) => Ok(data),
        Tensor::Half { .. } => bail!("{what} must be an f32 tensor"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_parsing_and_rounding() {
        assert_eq!("bf16".parse::<InputDtype>().unwrap(), InputDtype::Bf16);
        assert_eq!("fp16".parse::<InputDtype>().unwrap(), InputDtype::F16);
        let err = "fp8".parse::<InputDtype>().unwrap_err().to_string();
        assert!(err.contains("bf16 or fp16"), "{err}");
        for dt in [InputDtype::Bf16, InputDtype::F16] {
            assert_eq!(dt.decode(dt.encode(1.5)), 1.5);
            assert_eq!(dt.decode(dt.encode(f32::NEG_INFINITY)), f32::NEG_INFINITY);
        }
        // bf16 keeps 8 significant bits, fp16 11.
        assert_eq!(
            InputDtype::Bf16.decode(InputDtype::Bf16.encode(1.0 + 1.0 / 512.0)),
            1.0
        );
        assert!(InputDtype::F16.decode(InputDtype::F16.encode(1.0 + 1.0 / 512.0)) > 1.0);
    }

    /// Every low half, above and below zero, across exponents: the split joins back to the
    /// same bits, its weight is the f32's nearest bf16 (ties away from zero, where round to
    /// nearest even may differ), and infinities and NaN stay what they are.
    #[test]
    fn a_master_splits_into_its_nearest_bf16_and_a_low_half_that_joins_back() {
        let dt = InputDtype::Bf16;
        for upper in [
            0x0000u32, 0x0001, 0x3f80, 0x3f81, 0x4049, 0x7f7f, 0x8000, 0xbf80, 0xff7f,
        ] {
            for low in 0..=0xffffu32 {
                let x = f32::from_bits(upper << 16 | low);
                let (hi, lo) = master_split(x);
                assert_eq!(master_join(hi, lo).to_bits(), x.to_bits(), "{x:e}");
                let w = dt.decode(hi);
                let (err, rne) = ((w - x).abs(), (dt.round(x) - x).abs());
                assert!(err == rne || w.is_infinite(), "{x:e}: {w:e}");
                if low == 0x8000 {
                    assert!(w.abs() > x.abs(), "{x:e}: a tie goes away from zero");
                }
            }
        }
        for x in [f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0] {
            let (hi, lo) = master_split(x);
            assert_eq!((dt.decode(hi).to_bits(), lo), (x.to_bits(), 0));
        }
        for bits in [0x7fc0_0000u32, 0x7fff_ffff, 0xffff_ffff, 0x7f80_0001] {
            let (hi, _) = master_split(f32::from_bits(bits));
            assert!(dt.decode(hi).is_nan(), "{bits:#x}");
        }
        assert_eq!((dt.master_bytes(), InputDtype::F16.master_bytes()), (2, 4));
    }

    #[test]
    fn argument_checks_are_sentences() {
        let bf = Kind::Half(InputDtype::Bf16);
        assert!(expect((bf, 10), (bf, 10), "Q").is_ok());
        let err = expect((Kind::Half(InputDtype::F16), 10), (bf, 10), "Q")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "Q must be a bf16 tensor of 10 elements, got a fp16 tensor of 10"
        );
        let err = expect((Kind::F32, 9), (Kind::F32, 12), "LSE")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "LSE must be an f32 tensor of 12 elements, got an f32 tensor of 9"
        );
        assert!(expect((bf, 12), (Kind::F32, 12), "dQ").is_err());
    }
}
