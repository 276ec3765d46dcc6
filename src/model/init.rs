//! The numbers of a random initialisation: a counter-based generator, so that element `i` of
//! parameter `k` is a pure function of (seed, k, i). Any worker can then draw just its shard of a
//! tensor, on the device that keeps it, and get the same weights as one process drawing the
//! whole model on the CPU: start-up needs no whole-model host copy and no upload.
//!
//! The value is built so that the CPU and the GPU kernel (`uniform` in `kernels/model.cu`, which
//! mirrors [`uniform`]) agree to the bit: 64-bit integer mixing, an integer below 2^24 converted
//! exactly to f32, and one f32 multiplication.

/// The standard deviation of the matrices (Hugging Face's `initializer_range`).
pub const INIT_STD: f32 = 0.02;

/// SplitMix64's output function: a bijective mixer of 64-bit counters.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64's increment, which spreads consecutive counters over the 64-bit range.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The key of parameter `tensor` (its index in `weights::specs`) under `seed`: distinct tensors
/// draw unrelated streams.
pub fn tensor_key(seed: u64, tensor: usize) -> u64 {
    mix(seed ^ mix((tensor as u64).wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// The f32 factor that turns [`uniform`]'s odd integers into values of `(-amp, amp)`: `amp`
/// divided by 2^23 (exact: a power of two).
pub fn step(amp: f32) -> f32 {
    amp / (1u32 << 23) as f32
}

/// Element `index` of the stream `key`: uniform on `(-amp, amp)` for `step = step(amp)`, in
/// 2^23 equally spaced values symmetric about zero (mean exactly 0, variance amp²/3 up to
/// 2^-46).
pub fn uniform(key: u64, index: u64, step: f32) -> f32 {
    let h = mix(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
    // 23 random bits k; 2k + 1 - 2^23 is odd and below 2^23 in magnitude, so exact in f32.
    let k = (h >> 41) as i32;
    (2 * k + 1 - (1 << 23)) as f32 * step
}

/// The half-width of the uniform distribution with standard deviation [`INIT_STD`].
pub fn init_amp() -> f32 {
    INIT_STD * 3f32.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_uniform_with_the_asked_spread() {
        // 2^16 draws: the sample mean's standard error is amp/sqrt(3·2^16) ≈ 1.3e-4 (6 of them
        // is 8e-4); the variance's relative standard error is sqrt(0.8/2^16) ≈ 3.5e-3.
        let amp = init_amp();
        let key = tensor_key(7, 3);
        let xs: Vec<f64> = (0..1u64 << 16)
            .map(|i| uniform(key, i, step(amp)) as f64)
            .collect();
        assert!(xs.iter().all(|&x| x.abs() < amp as f64));
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 8e-4, "mean {mean}");
        let want = (INIT_STD as f64).powi(2);
        assert!((var / want - 1.0).abs() < 0.02, "variance {var} vs {want}");
    }

    #[test]
    fn streams_differ_by_seed_and_tensor_and_values_are_odd_multiples_of_the_step() {
        let s = step(1.0);
        let first = |seed, t| {
            (0..64)
                .map(|i| uniform(tensor_key(seed, t), i, s))
                .collect()
        };
        let a: Vec<f32> = first(1, 0);
        assert_ne!(a, first(2, 0));
        assert_ne!(a, first(1, 1));
        for x in a {
            let n = x / s;
            assert_eq!(n, n.round());
            assert_eq!((n as i64).rem_euclid(2), 1, "{n}");
        }
    }
}
