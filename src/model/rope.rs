//! Rotary position embeddings' frequencies: the `rope_scaling` (`rope_parameters` in
//! transformers 5) types that extend a model's context, read from and written to Hugging Face's
//! JSON, and the table one run applies ([`Rotary`]), computed as transformers computes it (f32
//! frequencies from f64 scalars) so the angles match its own.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// How rotary frequencies θ^(−2i/d) are rescaled to extend a model's context. A raised
/// `rope_theta` needs none of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain rotary embeddings (`default`).
    None,
    /// Position interpolation (`linear`): every frequency divided by `factor`, as if positions
    /// were.
    Linear { factor: f64 },
    /// Llama 3.1's (`llama3`): wavelengths longer than `original / low_freq_factor` are
    /// interpolated (divided by `factor`), shorter than `original / high_freq_factor` kept, and
    /// a linear blend of the two between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Dynamic NTK (`dynamic`): for a sequence of L > `max_position_embeddings` tokens, θ is
    /// raised to θ·(factor·L/max − (factor − 1))^(d/(d−2)); up to `max_position_embeddings`
    /// the frequencies are plain. transformers takes L from the longest position it sees
    /// (max position + 1); in training distflash takes the run's sequence length (`--seq-len`,
    /// or the tokens of `grads`), which every sequence of a run has, so it is that formula at
    /// the length trained on, fixed for the run.
    Dynamic {
        factor: f64,
        max_position_embeddings: f64,
    },
    /// YaRN (`yarn`): frequencies making fewer than `beta_slow` turns over the original context
    /// are interpolated (divided by `factor`), more than `beta_fast` kept, a linear ramp over the
    /// dimensions between (its ends rounded out when `truncate`); cos and sin are multiplied by
    /// `attention_factor` (its default 0.1·ln(factor) + 1, or the ratio of two such terms from
    /// `mscale` and `mscale_all_dim`, resolved when read).
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        attention_factor: f64,
    },
}

/// The rotary table of one run: a head's `head_dim / 2` inverse frequencies and the factor cos
/// and sin are multiplied by (YaRN's attention factor; 1 otherwise). The device's `rope` applies
/// it: x ↦ scale·R(pos·inv_freq)·x, and its backward scale·R(−pos·inv_freq), the transpose.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotary {
    pub inv_freq: Vec<f32>,
    pub scale: f32,
}

impl Rotary {
    /// The table of `scaling` on θ `theta` for heads of `head_dim`, for sequences of `sequence`
    /// tokens (only dynamic NTK reads it). transformers computes the frequencies in f32 from
    /// f64 scalars; so does this (and the GPU ops take them from here), to match its angles.
    pub fn new(theta: f64, head_dim: usize, scaling: RopeScaling, sequence: usize) -> Rotary {
        let d = head_dim;
        // θ^(2i/d) in f32, from an f64 θ, as `base ** (arange(0, d, 2).float() / d)`.
        let powers = |theta: f64| -> Vec<f32> {
            (0..d / 2)
                .map(|i| (theta as f32).powf((2 * i) as f32 / d as f32))
                .collect()
        };
        let plain = |theta: f64| -> Vec<f32> { powers(theta).iter().map(|p| 1.0 / p).collect() };
        let (inv_freq, scale) = match scaling {
            RopeScaling::None => (plain(theta), 1.0),
            RopeScaling::Linear { factor } => {
                let f = factor as f32;
                (plain(theta).iter().map(|x| x / f).collect(), 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => (
                llama3(
                    &plain(theta),
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                ),
                1.0,
            ),
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings: max,
            } => {
                let len = (sequence as f64).max(max);
                let raised =
                    theta * (factor * len / max - (factor - 1.0)).powf(d as f64 / (d as f64 - 2.0));
                (plain(raised), 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
            } => {
                let (low, high) = yarn_range(
                    theta,
                    d,
                    original_max_position_embeddings,
                    (beta_fast, beta_slow),
                    truncate,
                );
                let f = factor as f32;
                let inv = powers(theta)
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        let (extrapolated, interpolated) = (1.0 / p, 1.0 / (f * p));
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        interpolated * (1.0 - keep) + extrapolated * keep
                    })
                    .collect();
                (inv, attention_factor as f32)
            }
        };
        Rotary { inv_freq, scale }
    }
}

/// Llama 3.1's rescaling of the plain frequencies `plain`, in f32 as transformers does.
fn llama3(plain: &[f32], factor: f64, low: f64, high: f64, original: f64) -> Vec<f32> {
    let (factor, low, high) = (factor as f32, low as f32, high as f32);
    let original = original as f32;
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    plain
        .iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            if wavelen > low_wavelen {
                f / factor
            } else if wavelen < high_wavelen {
                f
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// YaRN's ramp over the frequency index i: from the dimension where a frequency makes
/// `beta_fast` turns over `original` positions to where it makes `beta_slow`, in f64, its ends
/// rounded out when `truncate` and clamped to [0, d − 1]; a ramp of no width is widened by 0.001
/// (transformers' guard against dividing by zero). As f32, the precision the ramp is taken in.
fn yarn_range(
    theta: f64,
    d: usize,
    original: f64,
    (beta_fast, beta_slow): (f64, f64),
    truncate: bool,
) -> (f32, f32) {
    let dim = d as f64;
    let correction = |turns: f64| {
        dim * (original / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    (low as f32, high as f32)
}

/// YaRN's multiplier of log(scale) + 1 (transformers' `get_mscale`): 1 for no scaling.
fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl RopeScaling {
    /// Reads `rope_type` (or the older `type`) and its parameters from a `rope_scaling` /
    /// `rope_parameters` object (or the config itself, where neither is given); `config` is the
    /// whole config, whose `max_position_embeddings` dynamic NTK reads (and YaRN, when its
    /// parameters have no `original_max_position_embeddings`, as transformers does).
    pub(crate) fn from_json(v: &Value, config: &Value) -> Result<RopeScaling> {
        let kind = v
            .get("rope_type")
            .or_else(|| v.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let number = |key: &str| {
            v.get(key)
                .and_then(Value::as_f64)
                .with_context(|| format!("rope scaling '{kind}' needs a number '{key}'"))
        };
        // `or` in transformers: absent, null and 0 all take the default.
        let or = |key: &str, default: f64| {
            v.get(key)
                .and_then(Value::as_f64)
                .filter(|&x| x != 0.0)
                .unwrap_or(default)
        };
        let max_positions = || {
            config
                .get("max_position_embeddings")
                .and_then(Value::as_f64)
                .with_context(|| {
                    format!(
                        "rope scaling '{kind}' needs max_position_embeddings (the context the model was trained for) in the config"
                    )
                })
        };
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: number("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: number("factor")?,
                low_freq_factor: number("low_freq_factor")?,
                high_freq_factor: number("high_freq_factor")?,
                original_max_position_embeddings: number("original_max_position_embeddings")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: number("factor")?,
                max_position_embeddings: max_positions()?,
            },
            "yarn" => {
                let factor = number("factor")?;
                let attention_factor = match v.get("attention_factor").and_then(Value::as_f64) {
                    Some(a) => a,
                    None => match (or("mscale", 0.0), or("mscale_all_dim", 0.0)) {
                        (m, all) if m != 0.0 && all != 0.0 => {
                            yarn_mscale(factor, m) / yarn_mscale(factor, all)
                        }
                        _ => yarn_mscale(factor, 1.0),
                    },
                };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: match v
                        .get("original_max_position_embeddings")
                        .and_then(Value::as_f64)
                    {
                        Some(o) => o,
                        None => max_positions()?,
                    },
                    beta_fast: or("beta_fast", 32.0),
                    beta_slow: or("beta_slow", 1.0),
                    truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                    attention_factor,
                }
            }
            "longrope" => bail!(
                "rope scaling 'longrope' is not implemented yet: train with 'linear', 'llama3', 'dynamic' or 'yarn' scaling, or a raised rope_theta"
            ),
            other => {
                bail!(
                    "rope scaling '{other}' is unknown: use 'default', 'linear', 'llama3', 'dynamic' or 'yarn'"
                )
            }
        };
        Ok(scaling)
    }

    /// One sentence unless the parameters make sense for heads of `head_dim`.
    pub(crate) fn validate(self, head_dim: usize) -> Result<()> {
        let factor = match self {
            RopeScaling::None => return Ok(()),
            RopeScaling::Linear { factor }
            | RopeScaling::Llama3 { factor, .. }
            | RopeScaling::Dynamic { factor, .. }
            | RopeScaling::Yarn { factor, .. } => factor,
        };
        if !(factor >= 1.0 && factor.is_finite()) {
            bail!("rope scaling factor {factor} must be a finite number of at least 1");
        }
        match self {
            RopeScaling::Llama3 {
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
                ..
            } if !(high_freq_factor > low_freq_factor
                && low_freq_factor > 0.0
                && original_max_position_embeddings > 0.0) =>
            {
                bail!(
                    "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and a positive original_max_position_embeddings"
                )
            }
            RopeScaling::Dynamic {
                max_position_embeddings,
                ..
            } if !(max_position_embeddings >= 1.0 && head_dim > 2) => bail!(
                "dynamic rope scaling needs a positive max_position_embeddings and a head_dim above 2 (its exponent is d/(d-2)), not {max_position_embeddings} and {head_dim}"
            ),
            RopeScaling::Yarn {
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                ..
            } if !(original_max_position_embeddings > 0.0
                && beta_fast > 0.0
                && beta_slow > 0.0
                && attention_factor > 0.0
                && attention_factor.is_finite()) =>
            {
                bail!(
                    "yarn rope scaling needs a positive original_max_position_embeddings, beta_fast, beta_slow and attention_factor"
                )
            }
            _ => Ok(()),
        }
    }

    /// As Hugging Face writes it (`null` for plain rotary embeddings), and the top-level keys it
    /// needs beside (dynamic NTK's `max_position_embeddings`).
    pub(crate) fn to_json(self) -> (Value, Value) {
        let none = json!({});
        match self {
            RopeScaling::None => (Value::Null, none),
            RopeScaling::Linear { factor } => {
                (json!({"rope_type": "linear", "factor": factor}), none)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => (
                json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings,
                }),
                none,
            ),
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } => (
                json!({"rope_type": "dynamic", "factor": factor}),
                json!({"max_position_embeddings": max_position_embeddings as u64}),
            ),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
            } => (
                json!({
                    "rope_type": "yarn",
                    "factor": factor,
                    "original_max_position_embeddings": original_max_position_embeddings as u64,
                    "beta_fast": beta_fast,
                    "beta_slow": beta_slow,
                    "truncate": truncate,
                    "attention_factor": attention_factor,
                }),
                none,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::Cpu;
    use crate::model::ops::{Ops, RopeCall};
    use crate::shape::Span;
    use std::f64::consts::PI;

    /// θ^(−2i/d) in f64.
    fn plain64(theta: f64, d: usize) -> Vec<f64> {
        (0..d / 2)
            .map(|i| theta.powf(-((2 * i) as f64) / d as f64))
            .collect()
    }

    /// |got − want| within `ulps` f32 units of want, for every frequency.
    fn close(got: &[f32], want: &[f64], ulps: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                ((g as f64) - w).abs() <= ulps * f32::EPSILON as f64 * w.abs(),
                "{what}: frequency {i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn llama3_and_linear_scaling_rescale_the_frequencies_as_specified() {
        let plain = Rotary::new(500000.0, 128, RopeScaling::None, 1).inv_freq;
        let linear = Rotary::new(500000.0, 128, RopeScaling::Linear { factor: 4.0 }, 1);
        for (s, p) in linear.inv_freq.iter().zip(&plain) {
            assert_eq!(*s, p / 4.0);
        }
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let scaled = Rotary::new(500000.0, 128, llama3, 1);
        assert_eq!(scaled.scale, 1.0);
        // The rule in f64: wavelengths above 8192 interpolated by 8, below 2048 kept, a linear
        // blend of the two in the ratio (8192 / wavelength - 1) / 3 between.
        let (mut kept, mut divided, mut blended) = (0, 0, 0);
        let want: Vec<f64> = plain
            .iter()
            .map(|&p| {
                let f = p as f64;
                let wavelen = 2.0 * PI / f;
                if wavelen > 8192.0 {
                    divided += 1;
                    f / 8.0
                } else if wavelen < 2048.0 {
                    kept += 1;
                    f
                } else {
                    blended += 1;
                    let t = (8192.0 / wavelen - 1.0) / 3.0;
                    (1.0 - t) * f / 8.0 + t * f
                }
            })
            .collect();
        close(&scaled.inv_freq, &want, 4.0, "llama3");
        assert!(
            kept > 0 && divided > 0 && blended > 0,
            "{kept} {divided} {blended}"
        );
    }

    /// YaRN from the paper's definitions in f64: a frequency making r = L/(2π/f) turns over the
    /// original context L is kept above β_fast turns, interpolated below β_slow, and between
    /// blended by a ramp that is linear in the dimension index; the dimension where r turns are
    /// made is d·ln(L/(2πr)) / (2 ln θ).
    fn yarn64(theta: f64, d: usize, factor: f64, original: f64, truncate: bool) -> Vec<f64> {
        let dim_of =
            |turns: f64| d as f64 * (original / (2.0 * PI * turns)).ln() / (2.0 * theta.ln());
        let (mut lo, mut hi) = (dim_of(32.0), dim_of(1.0));
        if truncate {
            (lo, hi) = (lo.floor(), hi.ceil());
        }
        let (lo, hi) = (lo.max(0.0), hi.min(d as f64 - 1.0));
        plain64(theta, d)
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                f / factor * ramp + f * (1.0 - ramp)
            })
            .collect()
    }

    fn yarn(v: Value) -> RopeScaling {
        RopeScaling::from_json(&v, &json!({"max_position_embeddings": 4096})).unwrap()
    }

    #[test]
    fn yarn_ramps_between_kept_and_interpolated_frequencies_and_scales_cos_and_sin() {
        let scaling = yarn(json!({"rope_type": "yarn", "factor": 4.0}));
        let r = Rotary::new(10000.0, 128, scaling, 1);
        let want = yarn64(10000.0, 128, 4.0, 4096.0, true);
        close(&r.inv_freq, &want, 8.0, "yarn");
        let plain = plain64(10000.0, 128);
        let kept = want.iter().zip(&plain).filter(|(w, p)| w == p).count();
        let divided = want
            .iter()
            .zip(&plain)
            .filter(|(w, p)| (**w - **p / 4.0).abs() < 1e-15 * **p)
            .count();
        assert!(
            kept > 0 && divided > 0 && kept + divided < 64,
            "{kept} {divided}"
        );
        assert!(((r.scale as f64) - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-7);
        // Untruncated, the ramp's ends are the exact dimensions.
        let untruncated = yarn(json!({"rope_type": "yarn", "factor": 4.0, "truncate": false}));
        let u = Rotary::new(10000.0, 128, untruncated, 1);
        close(
            &u.inv_freq,
            &yarn64(10000.0, 128, 4.0, 4096.0, false),
            8.0,
            "untruncated",
        );
        assert_ne!(u.inv_freq, r.inv_freq);
    }

    #[test]
    fn yarn_reads_the_attention_factor_its_mscales_and_the_original_context() {
        let factor = |v: Value| match yarn(v) {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            other => panic!("{other:?}"),
        };
        let base = json!({"rope_type": "yarn", "factor": 8.0});
        assert_eq!(factor(base.clone()), 0.1 * 8f64.ln() + 1.0);
        let mut given = base.clone();
        given["attention_factor"] = json!(1.5);
        assert_eq!(factor(given), 1.5);
        let mut ratio = base.clone();
        ratio["mscale"] = json!(0.707);
        ratio["mscale_all_dim"] = json!(1.0);
        let want = (0.1 * 0.707 * 8f64.ln() + 1.0) / (0.1 * 8f64.ln() + 1.0);
        assert!((factor(ratio) - want).abs() < 1e-15);
        // The original context: the parameters', else the config's max_position_embeddings.
        let original = |v: Value| match yarn(v) {
            RopeScaling::Yarn {
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                ..
            } => (original_max_position_embeddings, beta_fast, beta_slow),
            other => panic!("{other:?}"),
        };
        assert_eq!(original(base.clone()), (4096.0, 32.0, 1.0));
        let mut own = base.clone();
        own["original_max_position_embeddings"] = json!(32768);
        own["beta_fast"] = json!(0);
        assert_eq!(original(own), (32768.0, 32.0, 1.0));
        let e = RopeScaling::from_json(&base, &json!({})).unwrap_err();
        assert!(
            e.to_string().contains("needs max_position_embeddings"),
            "{e}"
        );
        let s = yarn(base);
        assert_eq!(
            RopeScaling::from_json(&s.to_json().0, &json!({})).unwrap(),
            s
        );
    }

    #[test]
    fn dynamic_ntk_raises_theta_only_past_the_trained_context() {
        let scaling = RopeScaling::Dynamic {
            factor: 4.0,
            max_position_embeddings: 2048.0,
        };
        let d = 64;
        for short in [1, 100, 2048] {
            let r = Rotary::new(10000.0, d, scaling, short);
            close(&r.inv_freq, &plain64(10000.0, d), 4.0, "within the context");
        }
        // A run of 8192-token sequences: θ·(4·8192/2048 − 3)^(64/62) = θ·13^(32/31).
        let r = Rotary::new(10000.0, d, scaling, 8192);
        let theta = 10000.0 * 13f64.powf(64.0 / 62.0);
        close(&r.inv_freq, &plain64(theta, d), 16.0, "past the context");
        assert_eq!(r.scale, 1.0);
        let (json, top) = scaling.to_json();
        assert_eq!(RopeScaling::from_json(&json, &top).unwrap(), scaling);
        assert!(
            RopeScaling::Dynamic {
                factor: 2.0,
                max_position_embeddings: 2048.0
            }
            .validate(2)
            .is_err()
        );
    }

    #[test]
    fn the_scale_multiplies_the_rotation_and_its_transpose() {
        let ops = Cpu::<f64>::new();
        let (rows, heads, d) = (5, 2, 8);
        let x: Vec<f64> = (0..rows * heads * d)
            .map(|i| ((i * 7 % 11) as f64) - 5.0)
            .collect();
        let positions = [Span {
            start: 3,
            len: rows,
        }];
        let plain = Rotary::new(10000.0, d, RopeScaling::None, 1);
        let scaled = Rotary {
            scale: 1.25,
            ..plain.clone()
        };
        let call = RopeCall {
            rows,
            heads,
            head_dim: d,
            positions: &positions,
            rotary: &plain,
            inverse: false,
        };
        let mut y1 = x.clone();
        ops.rope(&mut y1, call).unwrap();
        let call = RopeCall {
            rotary: &scaled,
            ..call
        };
        let mut y = x.clone();
        ops.rope(&mut y, call).unwrap();
        for (a, b) in y.iter().zip(&y1) {
            assert!((a - 1.25 * b).abs() < 1e-12);
        }
        // The backward of x ↦ sRx is dy ↦ sRᵀdy: after both, s²x.
        let call = RopeCall {
            inverse: true,
            ..call
        };
        ops.rope(&mut y, call).unwrap();
        for (a, b) in y.iter().zip(&x) {
            assert!((a - 1.5625 * b).abs() < 1e-12);
        }
    }
}
