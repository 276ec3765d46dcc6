//! The element types the model math runs in: f32 for training, f64 for the finite-difference
//! gradient check, which needs more digits than f32 has to see a gradient's error.

use ndarray::LinalgScalar;
use std::fmt::Debug;
use std::ops::{AddAssign, MulAssign, SubAssign};

/// A real number the CPU model ops accept.
pub trait Float:
    num_traits::Float
    + LinalgScalar
    + AddAssign
    + SubAssign
    + MulAssign
    + Send
    + Sync
    + Debug
    + Default
    + 'static
{
    /// The nearest value of this type (constants and f32 file data come in this way).
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
}

impl Float for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    fn f64(self) -> f64 {
        self as f64
    }
}

impl Float for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn f64(self) -> f64 {
        self
    }
}

/// Bytes of a 16-bit element: the GPU's weights and activations (and the attention inputs a
/// GPU rank sends).
pub const HALF_BYTES: usize = 2;
