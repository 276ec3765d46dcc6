//! The parameters of a LLaMA-family model, named and shaped as Hugging Face names them, so weights load
//! from and save to `model.safetensors` files that `transformers` reads. The same struct holds
//! gradients and optimizer moments.

use super::config::Config;
use super::init;
use super::ops::Ops;
use crate::shape::Span;
use anyhow::{Context, Result, bail};

/// One tensor of a decoder layer, in the order every list of a layer's tensors follows
/// (`specs`, gradients, shards, checkpoints). A family's layer has the tensors
/// [`LayerTensor::present`] says; a tensor it lacks is simply absent, so the layer's arithmetic
/// reads which ones are there ([`LayerWeights::get`]) and never which family it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    AttnNorm,
    Wq,
    Bq,
    Wk,
    Bk,
    Wv,
    Bv,
    Wo,
    Bo,
    QNorm,
    KNorm,
    MlpNorm,
    WGate,
    WUp,
    WDown,
}

impl LayerTensor {
    /// Every tensor any family's layer may have, in order.
    pub const ALL: [LayerTensor; 15] = [
        LayerTensor::AttnNorm,
        LayerTensor::Wq,
        LayerTensor::Bq,
        LayerTensor::Wk,
        LayerTensor::Bk,
        LayerTensor::Wv,
        LayerTensor::Bv,
        LayerTensor::Wo,
        LayerTensor::Bo,
        LayerTensor::QNorm,
        LayerTensor::KNorm,
        LayerTensor::MlpNorm,
        LayerTensor::WGate,
        LayerTensor::WUp,
        LayerTensor::WDown,
    ];

    /// Hugging Face's name of the tensor within `model.layers.{l}.`.
    pub fn name(self) -> &'static str {
        match self {
            LayerTensor::AttnNorm => "input_layernorm.weight",
            LayerTensor::Wq => "self_attn.q_proj.weight",
            LayerTensor::Bq => "self_attn.q_proj.bias",
            LayerTensor::Wk => "self_attn.k_proj.weight",
            LayerTensor::Bk => "self_attn.k_proj.bias",
            LayerTensor::Wv => "self_attn.v_proj.weight",
            LayerTensor::Bv => "self_attn.v_proj.bias",
            LayerTensor::Wo => "self_attn.o_proj.weight",
            LayerTensor::Bo => "self_attn.o_proj.bias",
            LayerTensor::QNorm => "self_attn.q_norm.weight",
            LayerTensor::KNorm => "self_attn.k_norm.weight",
            LayerTensor::MlpNorm => "post_attention_layernorm.weight",
            LayerTensor::WGate => "mlp.gate_proj.weight",
            LayerTensor::WUp => "mlp.up_proj.weight",
            LayerTensor::WDown => "mlp.down_proj.weight",
        }
    }

    /// The tensor's shape in a model of `c` (linear weights `[out, in]`).
    pub fn shape(self, c: &Config) -> Vec<usize> {
        let (d, i, q, kv) = (
            c.hidden_size,
            c.intermediate_size,
            c.q_width(),
            c.kv_width(),
        );
        match self {
            LayerTensor::AttnNorm | LayerTensor::MlpNorm | LayerTensor::Bo => vec![d],
            LayerTensor::Wq => vec![q, d],
            LayerTensor::Bq => vec![q],
            LayerTensor::Wk | LayerTensor::Wv => vec![kv, d],
            LayerTensor::Bk | LayerTensor::Bv => vec![kv],
            LayerTensor::QNorm | LayerTensor::KNorm => vec![c.head_dim],
            LayerTensor::Wo => vec![d, q],
            LayerTensor::WGate | LayerTensor::WUp => vec![i, d],
            LayerTensor::WDown => vec![d, i],
        }
    }

    /// Whether the tensor is a projection's weight, whose gradient one product of the layer's
    /// backward (`Ops::linear_backward`) adds to: or writes, where it holds nothing yet
    /// (`LinearBackward::dw_empty`). Norm gains and biases are summed over rows into theirs.
    pub fn is_projection(self) -> bool {
        matches!(
            self,
            LayerTensor::Wq
                | LayerTensor::Wk
                | LayerTensor::Wv
                | LayerTensor::Wo
                | LayerTensor::WGate
                | LayerTensor::WUp
                | LayerTensor::WDown
        )
    }

    /// Whether a layer of `c` has the tensor: the projections' biases where its family and
    /// `attention_bias` put them (`Config::qkv_bias`, `Config::o_bias`), the per-head query and
    /// key norms' gains where its family norms them, the rest always.
    pub fn present(self, c: &Config) -> bool {
        match self {
            LayerTensor::Bq | LayerTensor::Bk | LayerTensor::Bv => c.qkv_bias(),
            LayerTensor::Bo => c.o_bias(),
            LayerTensor::QNorm | LayerTensor::KNorm => c.family().qk_norm,
            _ => true,
        }
    }

    /// The tensors a layer of `c` has, in order.
    pub fn of(c: &Config) -> impl Iterator<Item = LayerTensor> + use<'_> {
        LayerTensor::ALL.into_iter().filter(|t| t.present(c))
    }

    /// The tensor's slot in [`LayerWeights`]: its place in the declaration, which `ALL` follows
    /// (tested), so slots run in order.
    fn index(self) -> usize {
        self as usize
    }
}

/// One decoder layer's tensors, each present where the config's layer has it
/// ([`LayerTensor::present`]); `layer[t]` is a tensor the layer has, [`LayerWeights::get`] one
/// it may lack.
#[derive(Clone, Debug)]
pub struct LayerWeights<T> {
    tensors: [Option<T>; LayerTensor::ALL.len()],
}

impl<T> std::ops::Index<LayerTensor> for LayerWeights<T> {
    type Output = T;
    fn index(&self, t: LayerTensor) -> &T {
        self.get(t)
            .unwrap_or_else(|| panic!("the layer has no {}", t.name()))
    }
}

impl<T> std::ops::IndexMut<LayerTensor> for LayerWeights<T> {
    fn index_mut(&mut self, t: LayerTensor) -> &mut T {
        self.get_mut(t)
            .unwrap_or_else(|| panic!("the layer has no {}", t.name()))
    }
}

impl<T> LayerWeights<T> {
    /// The layer's tensor `t`, if it has one.
    pub fn get(&self, t: LayerTensor) -> Option<&T> {
        self.tensors[t.index()].as_ref()
    }

    /// The layer's tensor `t`, mutably, if it has one.
    pub fn get_mut(&mut self, t: LayerTensor) -> Option<&mut T> {
        self.tensors[t.index()].as_mut()
    }

    /// A layer of `make` of each tensor of `present` (the tensors one config's layer has),
    /// called in order.
    fn try_build(
        present: impl Fn(LayerTensor) -> bool,
        mut make: impl FnMut(LayerTensor) -> Result<T>,
    ) -> Result<LayerWeights<T>> {
        let mut tensors = std::array::from_fn(|_| None);
        for t in LayerTensor::ALL.into_iter().filter(|&t| present(t)) {
            tensors[t.index()] = Some(make(t)?);
        }
        Ok(LayerWeights { tensors })
    }

    /// Whether the layer has `t`.
    fn has(&self, t: LayerTensor) -> bool {
        self.tensors[t.index()].is_some()
    }

    /// Every tensor, in order.
    pub fn tensors(&self) -> Vec<&T> {
        self.tensors.iter().flatten().collect()
    }

    /// Every tensor, mutably, in order.
    pub fn tensors_mut(&mut self) -> Vec<&mut T> {
        self.tensors.iter_mut().flatten().collect()
    }

    /// A layer of `tensors` in order ([`LayerWeights::into_tensors`] undone), with the tensors
    /// `like` has (a layer of the same config).
    pub fn from_tensors<U>(tensors: Vec<T>, like: &LayerWeights<U>) -> LayerWeights<T> {
        let mut it = tensors.into_iter();
        LayerWeights::try_build(
            |t| like.has(t),
            |t| {
                it.next()
                    .with_context(|| format!("no tensor given for {}", t.name()))
            },
        )
        .expect("a tensor for each part of the layer")
    }

    /// Every tensor by value, in order.
    pub fn into_tensors(self) -> Vec<T> {
        self.tensors.into_iter().flatten().collect()
    }

    /// A layer of `f` of each tensor's name and value, in order.
    pub fn try_map<U>(
        &self,
        mut f: impl FnMut(LayerTensor, &T) -> Result<U>,
    ) -> Result<LayerWeights<U>> {
        LayerWeights::try_build(|t| self.has(t), |t| f(t, &self[t]))
    }

    /// A layer of `f` of each tensor and its companion in `other` (a shard and its whole
    /// length, say), in order. Both have the tensors of one config.
    pub fn try_map_with<V, U>(
        &self,
        other: &LayerWeights<V>,
        mut f: impl FnMut(&T, &V) -> Result<U>,
    ) -> Result<LayerWeights<U>> {
        if LayerTensor::ALL
            .iter()
            .any(|&t| self.has(t) != other.has(t))
        {
            bail!("two layers of one config differ in their tensors");
        }
        LayerWeights::try_build(|t| self.has(t), |t| f(&self[t], &other[t]))
    }
}

/// Every parameter of the model; `lm_head` is `None` when tied to `embed`.
#[derive(Clone, Debug)]
pub struct Weights<T> {
    pub embed: T,
    pub layers: Vec<LayerWeights<T>>,
    pub norm: T,
    pub lm_head: Option<T>,
}

/// The model's parameter count: the sum of every tensor's elements.
pub fn parameters(c: &Config) -> usize {
    specs(c).iter().map(Spec::elements).sum()
}

/// A parameter's Hugging Face name and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Which of a layer's tensors it is; `None` outside the layers.
    pub layer: Option<LayerTensor>,
}

impl Spec {
    /// Elements of the tensor.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether weight decay applies: matrices yes, norm gains and biases (vectors) no.
    pub fn decays(&self) -> bool {
        self.shape.len() > 1
    }

    /// Whether this is a layer's projection weight ([`LayerTensor::is_projection`]).
    pub fn is_projection(&self) -> bool {
        self.layer.is_some_and(LayerTensor::is_projection)
    }

    /// Whether this is a projection's bias (initialized to zero, as Hugging Face does).
    pub fn is_bias(&self) -> bool {
        self.name.ends_with(".bias")
    }
}

/// Every parameter's name and shape, in the order `Weights::tensors` lists them.
pub fn specs(c: &Config) -> Vec<Spec> {
    let spec = |name: String, shape: &[usize]| Spec {
        name,
        shape: shape.to_vec(),
        layer: None,
    };
    let d = c.hidden_size;
    let mut out = vec![spec("model.embed_tokens.weight".into(), &[c.vocab_size, d])];
    for l in 0..c.num_hidden_layers {
        out.extend(LayerTensor::of(c).map(|t| Spec {
            name: format!("model.layers.{l}.{}", t.name()),
            shape: t.shape(c),
            layer: Some(t),
        }));
    }
    out.push(spec("model.norm.weight".into(), &[d]));
    if !c.tie_word_embeddings {
        out.push(spec("lm_head.weight".into(), &[c.vocab_size, d]));
    }
    out
}

impl<T> Weights<T> {
    /// Builds the weights from pieces: `make` gets each tensor's index (`specs` order), spec and
    /// piece of `spans` (one per tensor), as a worker makes the pieces of the model it keeps.
    pub fn build_pieces(
        c: &Config,
        spans: &[Span],
        mut make: impl FnMut(usize, &Spec, Span) -> Result<T>,
    ) -> Result<Weights<T>> {
        let mut pieces = spans.iter().enumerate();
        Weights::build(c, |s| {
            let (k, span) = pieces
                .next()
                .with_context(|| format!("no piece given for '{}'", s.name))?;
            make(k, s, *span)
        })
    }

    /// Builds the weights tensor by tensor, in `specs` order.
    pub fn build(c: &Config, mut make: impl FnMut(&Spec) -> Result<T>) -> Result<Weights<T>> {
        let specs = specs(c);
        let mut it = specs.iter();
        let mut next = || make(it.next().expect("specs cover every tensor"));
        let embed = next()?;
        let layers = (0..c.num_hidden_layers)
            .map(|_| LayerWeights::try_build(|t| t.present(c), |_| next()))
            .collect::<Result<_>>()?;
        let norm = next()?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(next()?)
        };
        Ok(Weights {
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// Every tensor, in `specs` order.
    pub fn tensors(&self) -> Vec<&T> {
        let mut out = vec![&self.embed];
        for l in &self.layers {
            out.extend(l.tensors());
        }
        out.push(&self.norm);
        out.extend(&self.lm_head);
        out
    }

    /// Every tensor, mutably, in `specs` order.
    pub fn tensors_mut(&mut self) -> Vec<&mut T> {
        let mut out = vec![&mut self.embed];
        for l in &mut self.layers {
            out.extend(l.tensors_mut());
        }
        out.push(&mut self.norm);
        out.extend(&mut self.lm_head);
        out
    }

    /// Every tensor by value, in `specs` order (gradients handed to the optimizer without a
    /// copy).
    pub fn into_tensors(self) -> Vec<T> {
        let mut out = vec![self.embed];
        for l in self.layers {
            out.extend(l.into_tensors());
        }
        out.push(self.norm);
        out.extend(self.lm_head);
        out
    }

    /// The output projection: `lm_head`, or the embedding when tied.
    pub fn output(&self) -> &T {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// Zero tensors of the model's shape (gradients, optimizer moments).
pub fn zeros<O: Ops>(ops: &O, c: &Config) -> Result<Weights<O::T>> {
    Weights::build(c, |s| ops.zeros(s.elements()))
}

/// Every tensor whole, as spans (`specs` order): the pieces of an unsharded model.
pub fn whole_spans(c: &Config) -> Vec<Span> {
    specs(c)
        .iter()
        .map(|s| Span {
            start: 0,
            len: s.elements(),
        })
        .collect()
}

/// Random weights from a seed: norm gains 1, biases 0, matrices uniform with standard deviation
/// [`init::INIT_STD`] (Hugging Face's `initializer_range`).
pub fn random<O: Ops>(ops: &O, c: &Config, seed: u64) -> Result<Weights<O::T>> {
    random_pieces(ops, c, seed, &whole_spans(c))
}

/// The pieces `spans` (one per tensor, `specs` order) of [`random`]'s weights, drawn on `ops`'s
/// device: the counter-based generator gives every piece the numbers the whole model has there,
/// whichever worker draws it and on whatever device.
pub fn random_pieces<O: Ops>(
    ops: &O,
    c: &Config,
    seed: u64,
    spans: &[Span],
) -> Result<Weights<O::T>> {
    Weights::build_pieces(c, spans, |k, s, span| {
        if s.decays() {
            let key = init::tensor_key(seed, k);
            ops.random_uniform(span.len, key, span.start as u64, init::init_amp())
        } else if s.is_bias() {
            ops.upload(&vec![0.0; span.len])
        } else {
            ops.upload(&vec![1.0; span.len])
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::Cpu;

    #[test]
    fn random_pieces_are_the_whole_models_values_for_any_cut() {
        let c = Config::preset("tiny").unwrap();
        let ops = Cpu::<f32>::new();
        let whole = random(&ops, &c, 9).unwrap();
        assert_ne!(whole.tensors(), random(&ops, &c, 10).unwrap().tensors());
        for pieces in 1..=4usize {
            // Piece p of a tensor of n elements: [p·n/P, (p+1)·n/P), any cut works.
            let cut = |p: usize| -> Vec<Span> {
                specs(&c)
                    .iter()
                    .map(|s| {
                        let n = s.elements();
                        let start = p * n / pieces;
                        Span {
                            start,
                            len: (p + 1) * n / pieces - start,
                        }
                    })
                    .collect()
            };
            let drawn: Vec<Weights<Vec<f32>>> = (0..pieces)
                .map(|p| random_pieces(&ops, &c, 9, &cut(p)).unwrap())
                .collect();
            for (k, want) in whole.tensors().into_iter().enumerate() {
                let joined: Vec<f32> = drawn.iter().flat_map(|w| w.tensors()[k].clone()).collect();
                assert_eq!(&joined, want, "tensor {k} cut in {pieces}");
            }
        }
    }

    #[test]
    fn every_layer_tensor_sits_in_its_own_slot_in_order() {
        for (i, t) in LayerTensor::ALL.into_iter().enumerate() {
            assert_eq!(t.index(), i, "{t:?}");
        }
    }

    #[test]
    fn biases_sit_after_their_projections_start_at_zero_and_do_not_decay() {
        let c = Config {
            model_type: crate::model::family::ModelType::Qwen2,
            ..Config::preset("tiny").unwrap()
        };
        let s = specs(&c);
        let names: Vec<&str> = s[1..6].iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.q_proj.bias",
                "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.self_attn.k_proj.bias",
            ]
        );
        assert_eq!(s[3].shape, [c.q_width()]);
        assert!(!s[3].decays() && s[3].is_bias());
        assert_eq!(
            parameters(&c),
            parameters(&Config::preset("tiny").unwrap()) + 2 * 128
        );
        let ops = Cpu::<f32>::new();
        let w = random(&ops, &c, 0).unwrap();
        assert_eq!(w.tensors().len(), s.len());
        let bv = w.layers[1].get(LayerTensor::Bv).unwrap();
        assert!(bv.iter().all(|&b| b == 0.0));
        assert!(w.layers[1].get(LayerTensor::Bo).is_none());
    }
}
