//! The parameters of a LLaMA-family model, named and shaped as Hugging Face names them, so weights load
//! from and save to `model.safetensors` files that `transformers` reads. The same struct holds
//! gradients and optimizer moments.

use super::config::Config;
use super::init;
use super::ops::Ops;
use crate::shape::Span;
use anyhow::{Context, Result, bail};

/// One decoder layer's weights (linear weights `[out, in]`); the projections' biases exist
/// where the config has them (`Config::qkv_bias`, `Config::o_bias`).
#[derive(Clone, Debug)]
pub struct LayerWeights<T> {
    pub attn_norm: T,
    pub wq: T,
    pub bq: Option<T>,
    pub wk: T,
    pub bk: Option<T>,
    pub wv: T,
    pub bv: Option<T>,
    pub wo: T,
    pub bo: Option<T>,
    pub mlp_norm: T,
    pub w_gate: T,
    pub w_up: T,
    pub w_down: T,
}

impl<T> LayerWeights<T> {
    /// Every tensor, in `specs` order.
    pub fn tensors(&self) -> Vec<&T> {
        let mut out = vec![&self.attn_norm, &self.wq];
        out.extend(&self.bq);
        out.push(&self.wk);
        out.extend(&self.bk);
        out.push(&self.wv);
        out.extend(&self.bv);
        out.push(&self.wo);
        out.extend(&self.bo);
        out.extend([&self.mlp_norm, &self.w_gate, &self.w_up, &self.w_down]);
        out
    }

    /// Every tensor, mutably, in `specs` order.
    pub fn tensors_mut(&mut self) -> Vec<&mut T> {
        let mut out = vec![&mut self.attn_norm, &mut self.wq];
        out.extend(&mut self.bq);
        out.push(&mut self.wk);
        out.extend(&mut self.bk);
        out.push(&mut self.wv);
        out.extend(&mut self.bv);
        out.push(&mut self.wo);
        out.extend(&mut self.bo);
        out.extend([
            &mut self.mlp_norm,
            &mut self.w_gate,
            &mut self.w_up,
            &mut self.w_down,
        ]);
        out
    }

    /// A layer of `tensors` in `specs` order ([`LayerWeights::into_tensors`] undone), with the
    /// biases `like` has (a layer of the same config).
    pub fn from_tensors<U>(tensors: Vec<T>, like: &LayerWeights<U>) -> LayerWeights<T> {
        let mut it = tensors.into_iter();
        let mut next = || it.next().expect("a tensor for each part of the layer");
        LayerWeights {
            attn_norm: next(),
            wq: next(),
            bq: like.bq.as_ref().map(|_| next()),
            wk: next(),
            bk: like.bk.as_ref().map(|_| next()),
            wv: next(),
            bv: like.bv.as_ref().map(|_| next()),
            wo: next(),
            bo: like.bo.as_ref().map(|_| next()),
            mlp_norm: next(),
            w_gate: next(),
            w_up: next(),
            w_down: next(),
        }
    }

    /// Every tensor by value, in `specs` order.
    pub fn into_tensors(self) -> Vec<T> {
        let mut out = vec![self.attn_norm, self.wq];
        out.extend(self.bq);
        out.push(self.wk);
        out.extend(self.bk);
        out.push(self.wv);
        out.extend(self.bv);
        out.push(self.wo);
        out.extend(self.bo);
        out.extend([self.mlp_norm, self.w_gate, self.w_up, self.w_down]);
        out
    }

    /// A layer of `f` of each tensor and its companion in `other` (a shard and its whole
    /// length, say), in `specs` order. Both have the biases of one config.
    pub fn try_map_with<V, U>(
        &self,
        other: &LayerWeights<V>,
        mut f: impl FnMut(&T, &V) -> Result<U>,
    ) -> Result<LayerWeights<U>> {
        let o = other;
        Ok(LayerWeights {
            attn_norm: f(&self.attn_norm, &o.attn_norm)?,
            wq: f(&self.wq, &o.wq)?,
            bq: bias(&mut f, &self.bq, &o.bq)?,
            wk: f(&self.wk, &o.wk)?,
            bk: bias(&mut f, &self.bk, &o.bk)?,
            wv: f(&self.wv, &o.wv)?,
            bv: bias(&mut f, &self.bv, &o.bv)?,
            wo: f(&self.wo, &o.wo)?,
            bo: bias(&mut f, &self.bo, &o.bo)?,
            mlp_norm: f(&self.mlp_norm, &o.mlp_norm)?,
            w_gate: f(&self.w_gate, &o.w_gate)?,
            w_up: f(&self.w_up, &o.w_up)?,
            w_down: f(&self.w_down, &o.w_down)?,
        })
    }
}

/// `f` of a bias and its companion, where the layer has it.
fn bias<T, V, U>(
    f: &mut impl FnMut(&T, &V) -> Result<U>,
    a: &Option<T>,
    b: &Option<V>,
) -> Result<Option<U>> {
    match (a, b) {
        (Some(a), Some(b)) => f(a, b).map(Some),
        (None, None) => Ok(None),
        _ => bail!("two layers of one config differ in their biases"),
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
    };
    let (d, i) = (c.hidden_size, c.intermediate_size);
    let mut out = vec![spec("model.embed_tokens.weight".into(), &[c.vocab_size, d])];
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        out.push(spec(format!("{p}.input_layernorm.weight"), &[d]));
        for (proj, width, inp, bias) in [
            ("q", c.q_width(), d, c.qkv_bias()),
            ("k", c.kv_width(), d, c.qkv_bias()),
            ("v", c.kv_width(), d, c.qkv_bias()),
            ("o", d, c.q_width(), c.o_bias()),
        ] {
            out.push(spec(
                format!("{p}.self_attn.{proj}_proj.weight"),
                &[width, inp],
            ));
            if bias {
                out.push(spec(format!("{p}.self_attn.{proj}_proj.bias"), &[width]));
            }
        }
        out.extend([
            spec(format!("{p}.post_attention_layernorm.weight"), &[d]),
            spec(format!("{p}.mlp.gate_proj.weight"), &[i, d]),
            spec(format!("{p}.mlp.up_proj.weight"), &[i, d]),
            spec(format!("{p}.mlp.down_proj.weight"), &[d, i]),
        ]);
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
        let (qkv, o) = (c.qkv_bias(), c.o_bias());
        let layers = (0..c.num_hidden_layers)
            .map(|_| {
                Ok(LayerWeights {
                    attn_norm: next()?,
                    wq: next()?,
                    bq: if qkv { Some(next()?) } else { None },
                    wk: next()?,
                    bk: if qkv { Some(next()?) } else { None },
                    wv: next()?,
                    bv: if qkv { Some(next()?) } else { None },
                    wo: next()?,
                    bo: if o { Some(next()?) } else { None },
                    mlp_norm: next()?,
                    w_gate: next()?,
                    w_up: next()?,
                    w_down: next()?,
                })
            })
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
        assert!(w.layers[1].bv.as_ref().unwrap().iter().all(|&b| b == 0.0));
        assert!(w.layers[1].bo.is_none());
    }
}
