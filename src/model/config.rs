//! The LLaMA-family architecture's numbers, read from a Hugging Face `config.json` of any family
//! `model::family` describes, or taken from a preset, checked once so the layers can assume them.

use super::family::{Family, ModelType, Window};
use super::rope::{RopeScaling, Rotary};
use crate::shape::{Dims, MAX_HEAD_DIM, Mask};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::Path;

/// One LLaMA-family model shape. Field names follow Hugging Face's `LlamaConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Which Hugging Face architecture this is: its [`Family`] decides the biases, the window and
    /// the saved `config.json`'s `model_type`, so transformers loads a saved model as what it was.
    pub model_type: ModelType,
    /// `LlamaConfig`'s `attention_bias`: biases on the q, k, v and o projections, in a family
    /// whose config reads it ([`super::family::Biases::Switched`]). See [`Config::qkv_bias`].
    pub attention_bias: bool,
    /// Mistral's `sliding_window` ([`Window::EveryLayer`]): each token sees itself and the W − 1
    /// tokens before it (`None`: full causal attention). See [`Config::mask`].
    pub sliding_window: Option<usize>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// How the rotary frequencies are rescaled for a context longer than pretraining's.
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
}

/// The widest hidden size distflash trains: the GPU's norm backward holds a row's columns in
/// its threads' registers, 32 a thread over at most 1024 (`model::cuda::shapes::norm_backward`).
/// Published models stay far below it (LLaMA-3-405B's is 16384).
pub const MAX_HIDDEN_SIZE: usize = 32768;

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
            model_type: ModelType::Llama,
            attention_bias: false,
            sliding_window: None,
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: false,
        };
        let config = match name {
            "tiny" => Config {
                model_type: ModelType::Llama,
                attention_bias: false,
                sliding_window: None,
                vocab_size: 256,
                hidden_size: 64,
                intermediate_size: 176,
                num_hidden_layers: 2,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                rms_norm_eps: 1e-5,
                rope_theta: 10000.0,
                rope_scaling: RopeScaling::None,
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

    /// Reads a Hugging Face `config.json` of a model of a family distflash implements.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        Config::from_json(&v).with_context(|| format!("in {}", path.display()))
    }

    /// Parses the fields of a `LlamaConfig` (or the config of another family, by `model_type`;
    /// none means LLaMA); missing optional ones take Hugging Face's defaults for the family.
    /// Anything that would change the math and that distflash does not implement — another
    /// architecture, MLP biases, a sliding window, dropout, partial or unknown rotary scaling —
    /// is refused with a sentence naming it, never ignored.
    pub fn from_json(v: &Value) -> Result<Config> {
        if !v.is_object() {
            bail!(
                "the config is {}, not an object: give a Hugging Face config.json, an object of fields such as \"hidden_size\"",
                json_kind(v)
            );
        }
        // A field that is there but not a count is named as such, never taken for missing
        // (nor replaced by a default).
        let given = |key: &str| -> Result<Option<usize>> {
            match v.get(key).filter(|x| !x.is_null()) {
                None => Ok(None),
                Some(x) => match x.as_u64() {
                    Some(n) => Ok(Some(n as usize)),
                    None => {
                        bail!("'{key}' is {x}, not a non-negative integer: give a whole number")
                    }
                },
            }
        };
        let int = |key: &str| -> Result<usize> {
            given(key)?.with_context(|| format!("the config has no integer '{key}'"))
        };
        let model_type = model_type(v)?;
        let family = model_type.family();
        refuse_other_math(v)?;
        let sliding_window = sliding_window(v, family)?;
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            bail!("hidden_act '{act}' is unsupported: LLaMA uses 'silu'");
        }
        if v.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            bail!("'mlp_bias: true' is unsupported: distflash's MLPs have no biases");
        }
        let attention_bias = attention_bias(v, family)?;
        // transformers 5 nests the rotary settings in `rope_parameters`; 4 keeps them on top,
        // with the scaling in `rope_scaling`.
        let rope = v.get("rope_parameters").unwrap_or(v);
        let scaling = match v.get("rope_scaling").filter(|s| !s.is_null()) {
            Some(legacy) => legacy,
            None => rope,
        };
        let rope_scaling = RopeScaling::from_json(scaling, v)?;
        let heads = int("num_attention_heads")?;
        let hidden = int("hidden_size")?;
        let config = Config {
            model_type,
            attention_bias,
            sliding_window,
            vocab_size: int("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: int("intermediate_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: given("num_key_value_heads")?.unwrap_or(heads),
            head_dim: given("head_dim")?.unwrap_or(family.head_dim.default_for(hidden, heads)),
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta: rope
                .get("rope_theta")
                .and_then(Value::as_f64)
                .unwrap_or(10000.0),
            rope_scaling,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }

    /// The attention mask of a sequence of `seq` tokens packed from documents of `doc_lens`
    /// tokens (empty: one document): causal, within each document, within the sliding window
    /// where the config has one. A window of at least `seq` tokens hides nothing, so one
    /// document under it is plain causal attention (which the GPU kernels compute).
    pub fn mask(&self, seq: usize, doc_lens: &[usize]) -> Result<Mask> {
        let window = self.sliding_window.filter(|&w| w < seq);
        Mask::new(seq, doc_lens, window, 0)
    }

    /// What the model's family is.
    pub fn family(&self) -> &'static Family {
        self.model_type.family()
    }

    /// Whether the q, k and v projections have biases: Qwen2's always do, LLaMA's with
    /// `attention_bias` ([`super::family::Biases`]).
    pub fn qkv_bias(&self) -> bool {
        self.family().biases.qkv(self.attention_bias)
    }

    /// Whether the output projection has a bias: LLaMA's with `attention_bias` (Qwen2's never).
    pub fn o_bias(&self) -> bool {
        self.family().biases.o(self.attention_bias)
    }

    /// The config as Hugging Face writes it, so a saved model loads in `transformers`.
    pub fn to_json(&self) -> Value {
        let (rope_scaling, rope_keys) = self.rope_scaling.to_json();
        let family = self.family();
        let mut v = json!({
            "architectures": [family.architecture],
            "model_type": family.model_type,
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
            "rope_scaling": rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
        });
        let biases = match family.biases.switched() {
            true => json!({"attention_bias": self.attention_bias}),
            false => json!({}),
        };
        let window = match family.window {
            Window::None => json!({}),
            Window::OffOnly => json!({"use_sliding_window": false, "sliding_window": null}),
            Window::EveryLayer => json!({"sliding_window": self.sliding_window}),
        };
        for extra in [biases, window, rope_keys] {
            for (key, value) in extra.as_object().expect("an object") {
                v[key] = value.clone();
            }
        }
        v
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
        if self.hidden_size > MAX_HIDDEN_SIZE {
            bail!(
                "hidden_size {} is unsupported: at most {MAX_HIDDEN_SIZE}",
                self.hidden_size
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
        self.rope_scaling.validate(self.head_dim)?;
        let family = self.family();
        if let Some(w) = self.sliding_window
            && (w == 0 || family.window != Window::EveryLayer)
        {
            bail!(
                "sliding_window {w} is unsupported here: distflash trains windows of at least 1 token, in models whose every layer has the window (Mistral's)"
            );
        }
        if self.attention_bias && !family.biases.switched() {
            bail!(
                "attention_bias is not a {} setting; model_type '{}' fixes its own biases",
                family.title,
                family.model_type
            );
        }
        Ok(())
    }

    /// The rotary table of sequences of `sequence` tokens (`rope::Rotary::new`): the
    /// frequencies of `rope_theta` rescaled as `rope_scaling` says.
    pub fn rotary(&self, sequence: usize) -> Rotary {
        Rotary::new(self.rope_theta, self.head_dim, self.rope_scaling, sequence)
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

/// The config's `model_type` (LLaMA when it has none), or a sentence naming an unimplemented
/// one.
fn model_type(v: &Value) -> Result<ModelType> {
    let Some(kind) = v.get("model_type").and_then(Value::as_str) else {
        return Ok(ModelType::Llama);
    };
    match ModelType::ALL.into_iter().find(|t| t.name() == kind) {
        Some(t) => Ok(t),
        None => {
            let names: Vec<&str> = ModelType::ALL.iter().map(|t| t.name()).collect();
            bail!(
                "model_type '{kind}' is not implemented: distflash trains {} models",
                names.join(", ")
            )
        }
    }
}

/// `attention_bias`, which only some families' configs read (`LlamaConfig`'s, for all four
/// attention projections): elsewhere transformers ignores it, so a `true` there is a config
/// that does not mean what it says and is refused.
fn attention_bias(v: &Value, family: &Family) -> Result<bool> {
    let bias = v.get("attention_bias").and_then(Value::as_bool) == Some(true);
    if bias && !family.biases.switched() {
        bail!(
            "'attention_bias: true' is not read by transformers for model_type '{}' (its biases are fixed: {}): remove the key",
            family.model_type,
            family.biases.fixed()
        );
    }
    Ok(bias)
}

/// The window of `family`'s [`Window`] kind: Mistral's `sliding_window` (null: none). Qwen2
/// keeps a `sliding_window` size even when `use_sliding_window` (default false) turns it off,
/// and a window that is on, which covers only its layers from `max_window_layers` on, is
/// refused; LLaMA has no window, so one there is refused unless `use_sliding_window: false` says
/// it is off. `layer_types`, where given, must agree: every layer sliding under a window, full
/// otherwise.
fn sliding_window(v: &Value, family: &Family) -> Result<Option<usize>> {
    let given = v.get("sliding_window").filter(|w| !w.is_null());
    let switch = v.get("use_sliding_window").and_then(Value::as_bool);
    let window = match (family.window, given) {
        (_, None) => None,
        (Window::OffOnly, Some(_)) if switch != Some(true) => None,
        (Window::OffOnly, Some(w)) => bail!(
            "{}'s sliding window (sliding_window {w} in the layers from max_window_layers on) is not implemented: set use_sliding_window to false to train with full causal attention, which equals the window for sequences of at most {w} tokens",
            family.title
        ),
        (Window::None, Some(_)) if switch == Some(false) => None,
        (Window::None, Some(w)) => bail!(
            "sliding_window {w} is not a {} setting (transformers ignores it for model_type '{}'): remove it, or give model_type 'mistral' for a model with a sliding window",
            family.title,
            family.model_type
        ),
        (Window::EveryLayer, Some(w)) => match w.as_u64() {
            Some(w) if w >= 1 => Some(w as usize),
            _ => bail!(
                "sliding_window {w} must be a whole number of at least 1 (the keys a token sees, itself included), or null for full causal attention"
            ),
        },
    };
    let want = if window.is_some() {
        "sliding_attention"
    } else {
        "full_attention"
    };
    if let Some(types) = v.get("layer_types").and_then(Value::as_array)
        && let Some(other) = types.iter().find(|l| l.as_str() != Some(want))
    {
        bail!(
            "layer_types lists a '{}' layer; distflash trains one attention in every layer ('{want}' for this config): make every entry '{want}'",
            other.as_str().unwrap_or("non-string")
        );
    }
    Ok(window)
}

/// Refuses a config whose math distflash does not implement: dropout, a partial rotary
/// embedding or quantized weights, each named with what to do.
fn refuse_other_math(v: &Value) -> Result<()> {
    if let Some(p) = v.get("attention_dropout").and_then(Value::as_f64)
        && p != 0.0
    {
        bail!(
            "attention_dropout {p} is unsupported: distflash trains without dropout; set it to 0"
        );
    }
    if let Some(p) = v.get("partial_rotary_factor").and_then(Value::as_f64)
        && p != 1.0
    {
        bail!("partial_rotary_factor {p} is unsupported: rotary embeddings cover the whole head");
    }
    if v.get("quantization_config").is_some_and(|q| !q.is_null()) {
        bail!(
            "quantized checkpoints (quantization_config) are unsupported: start from 16- or 32-bit weights"
        );
    }
    Ok(())
}

/// What a JSON value is, for messages: "an array", "a string", ...
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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

    /// Every family's model saves as transformers names it and reads back as itself.
    #[test]
    fn every_family_saves_its_names_and_reads_back_as_itself() {
        for t in ModelType::ALL {
            let c = Config {
                model_type: t,
                ..Config::preset("tiny").unwrap()
            };
            let saved = c.to_json();
            assert_eq!(saved["model_type"], t.family().model_type);
            assert_eq!(saved["architectures"][0], t.family().architecture);
            assert_eq!(Config::from_json(&saved).unwrap(), c, "{}", t.name());
        }
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

    #[test]
    fn rope_scaling_reads_both_transformers_layouts_and_round_trips() {
        let mut v = Config::preset("tiny").unwrap().to_json();
        let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["rope_scaling"] = llama3.clone();
        let c = Config::from_json(&v).unwrap();
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Llama3 { factor: 8.0, .. }
        ));
        assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
        v["rope_scaling"] = Value::Null;
        let mut params = llama3;
        params["rope_theta"] = json!(500000.0);
        v["rope_parameters"] = params;
        let c5 = Config::from_json(&v).unwrap();
        assert_eq!((c5.rope_theta, c5.rope_scaling), (500000.0, c.rope_scaling));
        v["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4});
        assert_eq!(
            Config::from_json(&v).unwrap().rope_scaling,
            RopeScaling::Linear { factor: 2.0 }
        );
        // YaRN and dynamic NTK, as transformers 5 nests them; dynamic reads the config's
        // max_position_embeddings, and both survive a save and a load.
        v["max_position_embeddings"] = json!(4096);
        for params in [
            json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "beta_fast": 16}),
            json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}),
        ] {
            v["rope_parameters"] = params;
            let c = Config::from_json(&v).unwrap();
            assert_ne!(c.rope_scaling, RopeScaling::None);
            assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
        }
    }

    #[test]
    fn qwen2_has_qkv_biases_llama_attention_bias_all_four_and_both_round_trip() {
        // A Qwen2Config as transformers 5 saves it: no attention_bias key, the window off.
        let mut v = Config::preset("tiny").unwrap().to_json();
        let o = v.as_object_mut().unwrap();
        o.remove("attention_bias");
        o.remove("mlp_bias");
        v["model_type"] = json!("qwen2");
        v["use_sliding_window"] = json!(false);
        v["sliding_window"] = json!(4096);
        v["max_window_layers"] = json!(28);
        v["layer_types"] = json!(["full_attention", "full_attention"]);
        let q = Config::from_json(&v).unwrap();
        assert_eq!(q.model_type, ModelType::Qwen2);
        assert!(q.qkv_bias() && !q.o_bias());
        let saved = q.to_json();
        assert_eq!(saved["model_type"], "qwen2");
        assert_eq!(saved["architectures"][0], "Qwen2ForCausalLM");
        assert_eq!(Config::from_json(&saved).unwrap(), q);

        let mut l = Config::preset("tiny").unwrap().to_json();
        l["attention_bias"] = json!(true);
        let c = Config::from_json(&l).unwrap();
        assert!(c.qkv_bias() && c.o_bias());
        assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
        let plain = Config::preset("tiny").unwrap();
        assert!(!plain.qkv_bias() && !plain.o_bias());
    }

    #[test]
    fn math_it_does_not_implement_is_refused_with_a_sentence() {
        let base = Config::preset("tiny").unwrap().to_json();
        let refused = |key: &str, value: Value, words: &str| {
            let mut v = base.clone();
            v[key] = value;
            let e = format!("{:#}", Config::from_json(&v).unwrap_err());
            assert!(e.contains(words), "{key}: {e}");
        };
        refused(
            "model_type",
            json!("gemma"),
            "model_type 'gemma' is not implemented",
        );
        refused(
            "sliding_window",
            json!(16),
            "sliding_window 16 is not a LLaMA setting",
        );
        refused(
            "attention_dropout",
            json!(0.1),
            "attention_dropout 0.1 is unsupported",
        );
        refused(
            "hidden_size",
            json!(MAX_HIDDEN_SIZE + 64),
            "hidden_size 32832 is unsupported: at most 32768",
        );
        refused(
            "partial_rotary_factor",
            json!(0.5),
            "partial_rotary_factor 0.5",
        );
        refused(
            "rope_scaling",
            json!({"rope_type": "longrope", "factor": 4.0}),
            "'longrope' is not implemented yet",
        );
        refused(
            "rope_scaling",
            json!({"rope_type": "dynamic", "factor": 2.0}),
            "needs max_position_embeddings",
        );
        refused(
            "rope_scaling",
            json!({"rope_type": "linear"}),
            "needs a number 'factor'",
        );
        refused(
            "rope_scaling",
            json!({"rope_type": "linear", "factor": 0.5}),
            "at least 1",
        );
        let mut mistral = base.clone();
        mistral["model_type"] = json!("mistral");
        mistral["sliding_window"] = Value::Null;
        assert!(Config::from_json(&mistral).is_ok());
        mistral["attention_bias"] = json!(true);
        let e = Config::from_json(&mistral).unwrap_err().to_string();
        assert!(e.contains("'attention_bias: true' is not read"), "{e}");
        let mut qwen = base.clone();
        qwen["model_type"] = json!("qwen2");
        qwen["attention_bias"] = Value::Null;
        qwen["sliding_window"] = json!(64);
        qwen["use_sliding_window"] = json!(true);
        let e = Config::from_json(&qwen).unwrap_err().to_string();
        assert!(
            e.contains("Qwen2's sliding window (sliding_window 64"),
            "{e}"
        );
        qwen["use_sliding_window"] = json!(false);
        assert!(Config::from_json(&qwen).is_ok());
        qwen["layer_types"] = json!(["full_attention", "sliding_attention"]);
        let e = Config::from_json(&qwen).unwrap_err().to_string();
        assert!(
            e.contains("layer_types lists a 'sliding_attention' layer"),
            "{e}"
        );
    }

    #[test]
    fn mistral_reads_its_window_whose_mask_hides_keys_only_past_it() {
        let mut v = Config::preset("tiny").unwrap().to_json();
        v["model_type"] = json!("mistral");
        v.as_object_mut().unwrap().remove("attention_bias");
        v["sliding_window"] = json!(16);
        let c = Config::from_json(&v).unwrap();
        assert_eq!(c.sliding_window, Some(16));
        assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
        assert!(c.mask(16, &[]).unwrap().is_causal());
        let m = c.mask(40, &[]).unwrap();
        assert_eq!(m.window(), Some(16));
        v["layer_types"] = json!(["sliding_attention", "sliding_attention"]);
        assert!(Config::from_json(&v).is_ok());
        v["layer_types"] = json!(["sliding_attention", "full_attention"]);
        let e = Config::from_json(&v).unwrap_err().to_string();
        assert!(e.contains("make every entry 'sliding_attention'"), "{e}");
        v["layer_types"] = Value::Null;
        v["sliding_window"] = json!(0);
        let e = Config::from_json(&v).unwrap_err().to_string();
        assert!(e.contains("sliding_window 0 must be a whole number"), "{e}");
    }
}
