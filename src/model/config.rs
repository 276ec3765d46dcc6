//! The LLaMA architecture's numbers, read from a Hugging Face `config.json` or taken from a
//! preset, checked once so the layers can assume them.

use crate::shape::{Dims, MAX_HEAD_DIM};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::Path;

/// One LLaMA-family model shape. Field names follow Hugging Face's `LlamaConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
}

/// Names accepted by `--preset`, with what each is for.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "tiny",
        "2 layers, width 64, 4 query / 2 KV heads, byte vocabulary: trains on a CPU",
    ),
    (
        "llama2-7b",
        "LLaMA-2-7B: 32 layers, width 4096, 32 heads, vocabulary 32000",
    ),
    (
        "llama-7b-gqa",
        "LLaMA-2-7B with grouped-query attention: 8 KV heads",
    ),
    (
        "llama-7b-33h",
        "7B with 33 heads of 128 (width 4224), which tensor-parallel systems pad",
    ),
];

impl Config {
    /// A named preset, or an error listing the names.
    pub fn preset(name: &str) -> Result<Config> {
        let llama7b = Config {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            tie_word_embeddings: false,
        };
        let config = match name {
            "tiny" => Config {
                vocab_size: 256,
                hidden_size: 64,
                intermediate_size: 176,
                num_hidden_layers: 2,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                rms_norm_eps: 1e-5,
                rope_theta: 10000.0,
                tie_word_embeddings: false,
            },
            "llama2-7b" => llama7b,
            "llama-7b-gqa" => Config {
                num_key_value_heads: 8,
                ..llama7b
            },
            "llama-7b-33h" => Config {
                hidden_size: 33 * 128,
                num_attention_heads: 33,
                num_key_value_heads: 33,
                ..llama7b
            },
            other => {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                bail!(
                    "unknown preset '{other}': choose one of {}",
                    names.join(", ")
                )
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads a Hugging Face `config.json` of a LLaMA model.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        Config::from_json(&v).with_context(|| format!("in {}", path.display()))
    }

    /// Parses the fields of a `LlamaConfig`; missing optional ones take Hugging Face's defaults.
    pub fn from_json(v: &Value) -> Result<Config> {
        let int = |key: &str| -> Result<usize> {
            v.get(key)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .with_context(|| format!("the config has no integer '{key}'"))
        };
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            bail!("hidden_act '{act}' is unsupported: LLaMA uses 'silu'");
        }
        for key in ["attention_bias", "mlp_bias"] {
            if v.get(key).and_then(Value::as_bool) == Some(true) {
                bail!("'{key}: true' is unsupported: LLaMA layers have no biases");
            }
        }
        // transformers 5 nests the rotary settings in `rope_parameters`; 4 keeps them on top.
        let rope = v.get("rope_parameters").unwrap_or(v);
        let kind = rope
            .get("rope_type")
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" || v.get("rope_scaling").is_some_and(|s| !s.is_null()) {
            bail!("rope scaling ('{kind}') is unsupported: only plain rotary embeddings are");
        }
        let heads = int("num_attention_heads")?;
        let hidden = int("hidden_size")?;
        let config = Config {
            vocab_size: int("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: int("intermediate_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: int("num_key_value_heads").unwrap_or(heads),
            head_dim: int("head_dim").unwrap_or(hidden / heads.max(1)),
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta: rope
                .get("rope_theta")
                .and_then(Value::as_f64)
                .unwrap_or(10000.0),
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }

    /// The config as Hugging Face writes it, so a saved model loads in `transformers`.
    pub fn to_json(&self) -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": false,
            "mlp_bias": false,
        })
    }

    /// Checks the shape once, so the layers can assume it and users get one sentence.
    pub fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({}): each KV head serves an equal group of query heads",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM || !self.head_dim.is_multiple_of(2) {
            bail!(
                "head_dim {} is unsupported: use an even number in 2..={MAX_HEAD_DIM}",
                self.head_dim
            );
        }
        if !(self.rope_theta > 0.0 && self.rms_norm_eps >= 0.0) {
            bail!("rope_theta must be positive and rms_norm_eps non-negative");
        }
        Ok(())
    }

    /// The attention shape of one sequence (batch 1).
    pub fn dims(&self) -> Dims {
        Dims {
            batch: 1,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
        }
    }

    /// Width of the query projection (heads × head dim).
    pub fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the key and value projections.
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_hf_json_round_trips() {
        for (name, _) in PRESETS {
            let c = Config::preset(name).unwrap();
            assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
        }
        assert_eq!(
            Config::preset("llama-7b-gqa").unwrap().num_key_value_heads,
            8
        );
        assert!(Config::preset("gpt2").is_err());
    }

    #[test]
    fn reads_transformers_5_rope_parameters_and_refuses_bad_heads() {
        let mut v = Config::preset("tiny").unwrap().to_json();
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 500000.0});
        assert_eq!(Config::from_json(&v).unwrap().rope_theta, 500000.0);
        v["num_key_value_heads"] = json!(3);
        let e = Config::from_json(&v).unwrap_err().to_string();
        assert!(e.contains("multiple of num_key_value_heads"), "{e}");
    }
}
