//! The model families distflash trains, one Hugging Face `model_type` each, and everything that
//! tells one from another, described in one table ([`ModelType::family`]): the names
//! transformers saves it under, how its config says which attention projections have biases,
//! whether it has an attention window and how that is switched, the head dim a config without
//! `head_dim` means, and whether each head's queries and keys are normed. The config reader, the weights and the layer read these
//! descriptions and never ask which family they have, so a family that is a new combination of
//! them is one entry here.

/// The `model_type`s distflash implements: one decoder, differing as each [`Family`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    Llama,
    Qwen2,
    Mistral,
    Qwen3,
}

impl ModelType {
    /// Every implemented type, for parsing and for the refusal of the others.
    pub const ALL: [ModelType; 4] = [
        ModelType::Llama,
        ModelType::Qwen2,
        ModelType::Mistral,
        ModelType::Qwen3,
    ];

    /// What this type is.
    pub fn family(self) -> &'static Family {
        match self {
            ModelType::Llama => &Family {
                model_type: "llama",
                title: "LLaMA",
                architecture: "LlamaForCausalLM",
                biases: Biases::Switched,
                window: Window::None,
                head_dim: HeadDim::Split,
                qk_norm: false,
            },
            ModelType::Qwen2 => &Family {
                model_type: "qwen2",
                title: "Qwen2",
                architecture: "Qwen2ForCausalLM",
                biases: Biases::Qkv,
                window: Window::OffOnly,
                head_dim: HeadDim::Split,
                qk_norm: false,
            },
            ModelType::Mistral => &Family {
                model_type: "mistral",
                title: "Mistral",
                architecture: "MistralForCausalLM",
                biases: Biases::None,
                window: Window::EveryLayer,
                head_dim: HeadDim::Split,
                qk_norm: false,
            },
            // `Qwen3Config`: LLaMA's `attention_bias`, Qwen2's window switch, heads of 128
            // unless `head_dim` says otherwise, and q_norm and k_norm on every head.
            ModelType::Qwen3 => &Family {
                model_type: "qwen3",
                title: "Qwen3",
                architecture: "Qwen3ForCausalLM",
                biases: Biases::Switched,
                window: Window::OffOnly,
                head_dim: HeadDim::Fixed(128),
                qk_norm: true,
            },
        }
    }

    /// The `model_type` string Hugging Face writes.
    pub fn name(self) -> &'static str {
        self.family().model_type
    }
}

/// One family's description.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    /// The config's `model_type`.
    pub model_type: &'static str,
    /// The family's name in sentences ("Qwen2's sliding window ...").
    pub title: &'static str,
    /// The `architectures` entry of its causal language model, which transformers loads.
    pub architecture: &'static str,
    pub biases: Biases,
    pub window: Window,
    pub head_dim: HeadDim,
    /// Whether each head's query and key vectors are RMS-normed (the config's `rms_norm_eps`,
    /// gains `self_attn.q_norm.weight` and `k_norm.weight` of `head_dim`) after their
    /// projections and before rotary embeddings turn them (Qwen3's).
    pub qk_norm: bool,
}

/// Which attention projections have biases, and whether the config's `attention_bias` says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Biases {
    /// `attention_bias` (default false) puts biases on q, k, v and o (`LlamaConfig`'s reading).
    Switched,
    /// q, k and v always have biases, o never; `attention_bias` is not read (Qwen2's).
    Qkv,
    /// None, and `attention_bias` is not read.
    None,
}

impl Biases {
    /// Whether the config's `attention_bias` is read (elsewhere a `true` there is refused, as
    /// transformers would ignore it).
    pub fn switched(self) -> bool {
        self == Biases::Switched
    }

    /// The q, k and v projections' biases, given the config's `attention_bias`.
    pub fn qkv(self, attention_bias: bool) -> bool {
        match self {
            Biases::Switched => attention_bias,
            Biases::Qkv => true,
            Biases::None => false,
        }
    }

    /// The output projection's bias, given the config's `attention_bias`.
    pub fn o(self, attention_bias: bool) -> bool {
        self == Biases::Switched && attention_bias
    }

    /// The biases a family that does not read `attention_bias` has, in words.
    pub fn fixed(self) -> &'static str {
        match self {
            Biases::Qkv => "q, k and v have them, o does not",
            Biases::Switched | Biases::None => "none",
        }
    }
}

/// How a family's config describes a sliding attention window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// No window: a `sliding_window` is refused unless `use_sliding_window: false` says it is off
    /// (LLaMA).
    None,
    /// `use_sliding_window` (default false) switches on a window over the layers from
    /// `max_window_layers` on, which distflash does not implement: only off is read, a
    /// `sliding_window` size beside it ignored, as transformers does (Qwen2's).
    OffOnly,
    /// `sliding_window` W on every layer, null for none (Mistral's).
    EveryLayer,
}

/// The head dim of a config without `head_dim`, as the family's transformers config defaults it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadDim {
    /// `hidden_size / num_attention_heads`.
    Split,
    /// This many, whatever the width (Qwen3's 128: Qwen3-0.6B has 16 heads of 128 in a width
    /// of 1024).
    Fixed(usize),
}

impl HeadDim {
    /// The head dim of a config of `hidden` width and `heads` query heads that gives none.
    pub fn default_for(self, hidden: usize, heads: usize) -> usize {
        match self {
            HeadDim::Split => hidden / heads.max(1),
            HeadDim::Fixed(d) => d,
        }
    }
}
