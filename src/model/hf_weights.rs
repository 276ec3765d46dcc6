//! A Hugging Face model folder's weights (`model.safetensors`, or the shards its
//! `model.safetensors.index.json` lists), memory-mapped. Opening checks every tensor's name,
//! shape and format against the config without reading any data; loading then converts one
//! tensor's piece at a time for the device, so a 7B model starts without a whole-model host copy
//! and a sharded worker reads only its shard.

use super::config::Config;
use super::ops::Ops;
use super::weights::{Weights, specs, whole_spans};
use crate::shape::Span;
use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The mapped files of a model folder and, per tensor the model uses, where its bytes lie.
pub struct HfWeights {
    /// The folder, for messages.
    source: String,
    maps: Vec<Mmap>,
    home: HashMap<String, Located>,
}

/// A tensor's bytes in a mapped file: which file, their format and their range (read from the
/// header once, on open).
#[derive(Clone, Debug)]
struct Located {
    file: usize,
    dtype: Dtype,
    bytes: Range<usize>,
    shape: Vec<usize>,
}

impl HfWeights {
    /// Maps `dir`'s weight files and checks them against `c`: every parameter present with its
    /// shape in F32, BF16 or F16, and no tensor the model would not read (a checkpoint of another
    /// architecture is refused, not silently trimmed).
    pub fn open(dir: &Path, c: &Config) -> Result<HfWeights> {
        let source = dir.display().to_string();
        let files = weight_files(dir)?
            .into_iter()
            .map(|path| {
                let file =
                    File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
                // SAFETY: the map is read-only; a checkpoint rewritten while a run reads it is
                // outside what any loader can guard against (transformers maps alike).
                let map = unsafe { Mmap::map(&file) }
                    .with_context(|| format!("cannot map {}", path.display()))?;
                Ok((path, map))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut found: HashMap<String, Located> = HashMap::new();
        for (i, (path, map)) in files.iter().enumerate() {
            let invalid = || format!("{} is not a valid safetensors file", path.display());
            // Deserializing checks the header against the file (offsets, lengths).
            SafeTensors::deserialize(map).with_context(invalid)?;
            let (header, meta) = SafeTensors::read_metadata(map).with_context(invalid)?;
            // The data follow the header's 8-byte length and the header itself.
            let data = size_of::<u64>() + header;
            for (name, info) in meta.tensors() {
                if !matches!(info.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
                    bail!(
                        "tensor '{name}' in {} is {:?}; only F32, BF16 and F16 weights load",
                        path.display(),
                        info.dtype
                    );
                }
                let (start, end) = info.data_offsets;
                let at = Located {
                    file: i,
                    dtype: info.dtype,
                    bytes: data + start..data + end,
                    shape: info.shape.clone(),
                };
                found.insert(name, at);
            }
        }
        let specs = specs(c);
        // Rotary tables some converters save are derived from the config and carry nothing else.
        let mut unused: Vec<&String> = found
            .keys()
            .filter(|name| {
                !specs.iter().any(|s| &s.name == *name) && !name.ends_with("rotary_emb.inv_freq")
            })
            .collect();
        unused.sort();
        if let Some(first) = unused.first() {
            bail!(
                "{source} holds {} tensor(s) a {} model of this config does not use, first '{first}': the checkpoint is of another architecture (or its config.json does not describe it); refusing rather than dropping them",
                unused.len(),
                c.model_type.name()
            );
        }
        let mut home = HashMap::new();
        for s in &specs {
            let at = found.get(&s.name).with_context(|| {
                format!(
                    "{source} has no tensor '{}', which a model of this config needs",
                    s.name
                )
            })?;
            if at.shape != s.shape {
                bail!(
                    "tensor '{}' in {source} has shape {:?}, but the config needs {:?}",
                    s.name,
                    at.shape,
                    s.shape
                );
            }
            home.insert(s.name.clone(), at.clone());
        }
        Ok(HfWeights {
            source,
            maps: files.into_iter().map(|(_, map)| map).collect(),
            home,
        })
    }

    /// The pieces `spans` (one per tensor, `specs` order) of every parameter on `ops`'s device,
    /// converted to f32 a piece at a time. A NaN or infinite weight is refused here, naming its
    /// tensor: trained from, it would surface steps later as a diverged loss.
    pub fn pieces<O: Ops>(&self, ops: &O, c: &Config, spans: &[Span]) -> Result<Weights<O::T>> {
        Weights::build_pieces(c, spans, |_, s, span| {
            let at = &self.home[&s.name];
            let values = to_f32(at.dtype, &self.maps[at.file][at.bytes.clone()], span);
            if let Some(i) = values.iter().position(|x| !x.is_finite()) {
                bail!(
                    "tensor '{}' in {} holds {} at element {}: the weights are damaged (perhaps saved from a diverged run); start from a model whose weights are all finite",
                    s.name,
                    self.source,
                    values[i],
                    span.start + i
                );
            }
            ops.upload(&values)
        })
    }
}

/// The folder's weight files: `model.safetensors`, or every file of the sharded index.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if single.exists() {
        return Ok(vec![single]);
    }
    if !index.exists() {
        bail!(
            "{} has no model.safetensors (nor a sharded index): there are no weights to load",
            dir.display()
        );
    }
    let text = std::fs::read_to_string(&index)
        .with_context(|| format!("cannot read {}", index.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", index.display()))?;
    let mut files: Vec<&str> = v["weight_map"]
        .as_object()
        .with_context(|| format!("{} has no weight_map", index.display()))?
        .values()
        .filter_map(|f| f.as_str())
        .collect();
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Elements `span` of little-endian `bytes` of format `dtype` (checked on open), as f32, on all
/// cores (reading the mapped pages is most of a 7B model's start-up).
pub fn to_f32(dtype: Dtype, bytes: &[u8], span: Span) -> Vec<f32> {
    let width = if dtype == Dtype::F32 { 4 } else { 2 };
    let piece = &bytes[span.start * width..span.end() * width];
    let values = piece.par_chunks_exact(width);
    match dtype {
        Dtype::F32 => values
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect(),
        Dtype::BF16 => values
            .map(|x| half::bf16::from_le_bytes([x[0], x[1]]).to_f32())
            .collect(),
        _ => values
            .map(|x| half::f16::from_le_bytes([x[0], x[1]]).to_f32())
            .collect(),
    }
}

/// Loads a Hugging Face model directory's weights whole ([`HfWeights`] maps and checks them).
pub fn load_hf<O: Ops>(ops: &O, c: &Config, dir: &Path) -> Result<Weights<O::T>> {
    HfWeights::open(dir, c)?.pieces(ops, c, &whole_spans(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::Cpu;
    use crate::model::weights::{random, whole_spans};
    use safetensors::tensor::TensorView;

    /// Writes `tensors` (name, shape, f32 data) as `dir/model.safetensors` in `dtype`.
    fn write(dir: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, _, data)| match dtype {
                Dtype::BF16 => data
                    .iter()
                    .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                    .collect(),
                _ => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            })
            .collect();
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .zip(&bytes)
            .map(|((name, shape, _), b)| {
                (
                    name.clone(),
                    TensorView::new(dtype, shape.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("distflash-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn model_tensors(c: &Config) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let w = random(&Cpu::<f32>::new(), c, 0).unwrap();
        specs(c)
            .into_iter()
            .zip(w.tensors())
            .map(|(s, t)| (s.name, s.shape, t.clone()))
            .collect()
    }

    #[test]
    fn pieces_are_the_file_values_of_each_span_in_any_format() {
        let c = Config::preset("tiny").unwrap();
        let ops = Cpu::<f32>::new();
        let tensors = model_tensors(&c);
        for dtype in [Dtype::F32, Dtype::BF16] {
            let dir = scratch(&format!("pieces-{dtype:?}"));
            write(&dir, &tensors, dtype);
            let hf = HfWeights::open(&dir, &c).unwrap();
            let whole = hf.pieces(&ops, &c, &whole_spans(&c)).unwrap();
            let halves: Vec<Span> = tensors
                .iter()
                .map(|(_, _, d)| Span {
                    start: d.len() / 3,
                    len: d.len() / 2,
                })
                .collect();
            let part = hf.pieces(&ops, &c, &halves).unwrap();
            for (((_, _, want), got), (piece, span)) in tensors
                .iter()
                .zip(whole.tensors())
                .zip(part.tensors().into_iter().zip(&halves))
            {
                let want: Vec<f32> = match dtype {
                    Dtype::BF16 => want
                        .iter()
                        .map(|x| half::bf16::from_f32(*x).to_f32())
                        .collect(),
                    _ => want.clone(),
                };
                assert_eq!(got, &want);
                assert_eq!(piece[..], want[span.start..span.end()]);
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn opening_names_a_missing_misshapen_or_unused_tensor() {
        let c = Config::preset("tiny").unwrap();
        let dir = scratch("refusals");
        let err = |tensors: &[(String, Vec<usize>, Vec<f32>)]| {
            write(&dir, tensors, Dtype::F32);
            HfWeights::open(&dir, &c).err().map(|e| e.to_string())
        };
        let mut tensors = model_tensors(&c);
        assert_eq!(err(&tensors), None);
        let norm = tensors
            .iter()
            .position(|t| t.0 == "model.norm.weight")
            .unwrap();
        tensors[norm].1 = vec![2, 32];
        let e = err(&tensors).unwrap();
        assert!(e.contains("has shape [2, 32]"), "{e}");
        tensors[norm].1 = vec![64];
        let bias = |name: &str| (name.to_string(), vec![64], vec![0.0; 64]);
        tensors.push(bias("model.layers.0.self_attn.q_proj.bias"));
        let e = err(&tensors).unwrap();
        assert!(
            e.contains("first 'model.layers.0.self_attn.q_proj.bias'"),
            "{e}"
        );
        tensors.pop();
        tensors.push(bias("model.layers.0.self_attn.rotary_emb.inv_freq"));
        assert_eq!(err(&tensors), None);
        // The same tensors read as a Qwen2 lack its q/k/v biases.
        let qwen = Config {
            model_type: crate::model::family::ModelType::Qwen2,
            ..c.clone()
        };
        let e = HfWeights::open(&dir, &qwen).err().unwrap().to_string();
        assert!(
            e.contains("has no tensor 'model.layers.0.self_attn.q_proj.bias'"),
            "{e}"
        );
        tensors.retain(|t| t.0 != "lm_head.weight");
        let e = err(&tensors).unwrap();
        assert!(e.contains("has no tensor 'lm_head.weight'"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
