//! Saving and resuming training: weights, AdamW moments, step and data position in one
//! safetensors file, written to a temporary file and renamed, so a crash mid-write leaves the
//! previous checkpoint whole. A checksum over the tensor bytes and the run's settings in the
//! metadata make a corrupt, truncated or mismatched file refused with a sentence.

use crate::model::config::Config;
use crate::model::weights::specs;
use anyhow::{Context, Result, bail};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const FORMAT: &str = "distflash-train-state/1";

/// What must match for a resumed run to continue the same trajectory.
#[derive(Clone, Debug, PartialEq)]
pub struct RunKey {
    pub config: Config,
    pub data: String,
    pub seq_len: usize,
    pub batch: usize,
}

/// Training state on the host: weights and moments as f32 lists in `specs` order.
pub struct State {
    /// Optimizer steps taken.
    pub step: u64,
    /// Sequences consumed: the data position.
    pub samples: u64,
    pub weights: Vec<Vec<f32>>,
    pub m: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

/// FNV-1a over every byte, the integrity check stored with the file.
fn checksum<'a>(parts: impl Iterator<Item = &'a [f32]>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for x in p {
            for b in x.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    format!("{h:016x}")
}

/// The file a checkpoint directory holds.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join("state.safetensors")
}

/// Writes `state` to `path` atomically.
pub fn save(path: &Path, key: &RunKey, state: &State) -> Result<()> {
    let specs = specs(&key.config);
    let mut names = Vec::new();
    let mut data: Vec<&Vec<f32>> = Vec::new();
    for (prefix, list) in [
        ("", &state.weights),
        ("adamw.m.", &state.m),
        ("adamw.v.", &state.v),
    ] {
        for (s, t) in specs.iter().zip(list) {
            names.push((format!("{prefix}{}", s.name), s.shape.clone()));
            data.push(t);
        }
    }
    let bytes: Vec<Vec<u8>> = data
        .iter()
        .map(|t| t.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = names
        .iter()
        .zip(&bytes)
        .map(|((n, shape), b)| Ok((n.as_str(), TensorView::new(Dtype::F32, shape.clone(), b)?)))
        .collect::<Result<Vec<_>>>()?;
    let meta: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("step", state.step.to_string()),
        ("samples", state.samples.to_string()),
        ("config", key.config.to_json().to_string()),
        ("data", key.data.clone()),
        ("seq_len", key.seq_len.to_string()),
        ("batch", key.batch.to_string()),
        ("checksum", checksum(data.iter().map(|t| t.as_slice()))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let buffer = safetensors::serialize(views, Some(meta))?;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&buffer)?;
        f.sync_all()
    };
    write().with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}

/// "hidden_size 64 saved, 128 now; ...": the config fields two models differ in, for the
/// message that refuses resuming one as the other.
fn config_differences(saved: &Config, now: &Config) -> String {
    let (saved, now) = (saved.to_json(), now.to_json());
    let (Some(saved), Some(now)) = (saved.as_object(), now.as_object()) else {
        return "their configs differ".into();
    };
    let differences = saved
        .iter()
        .filter(|&(k, v)| now.get(k) != Some(v))
        .map(|(k, v)| {
            format!(
                "{k} {v} saved, {} now",
                now.get(k).unwrap_or(&serde_json::Value::Null)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if differences.is_empty() {
        return "their configs differ".into();
    }
    differences
}

/// Reads a checkpoint for a run with `key`, refusing one that is damaged or from another run.
pub fn load(path: &Path, key: &RunKey) -> Result<State> {
    let shown = path.display();
    let bytes = std::fs::read(path).with_context(|| format!("cannot read checkpoint {shown}"))?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .with_context(|| format!("{shown} is not a readable checkpoint (truncated or corrupt)"))?;
    let file = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{shown} is not a readable checkpoint (truncated or corrupt)"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let get = |k: &str| {
        meta.get(k)
            .cloned()
            .with_context(|| format!("{shown} is not a distflash training checkpoint (no '{k}')"))
    };
    if get("format")? != FORMAT {
        bail!("{shown} is not a distflash training checkpoint of format {FORMAT}");
    }
    let saved_config = Config::from_json(&serde_json::from_str(&get("config")?)?)
        .with_context(|| format!("the model config in {shown} is unreadable"))?;
    if saved_config != key.config {
        bail!(
            "{shown} holds a different model than this run's ({}): resume with the model it was saved with (the same --preset, --config or --init-from), or give a new --save-dir to start afresh",
            config_differences(&saved_config, &key.config)
        );
    }
    for (what, saved, now) in [
        ("data", get("data")?, key.data.clone()),
        ("--seq-len", get("seq_len")?, key.seq_len.to_string()),
        ("--batch", get("batch")?, key.batch.to_string()),
    ] {
        if saved != now {
            bail!(
                "{shown} was saved with {what} '{saved}', but this run uses '{now}': resuming would not continue the same run"
            );
        }
    }
    let number = |k: &str| -> Result<u64> {
        get(k)?
            .parse()
            .with_context(|| format!("{shown} has an unreadable '{k}'"))
    };
    let mut host: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for (name, view) in file.tensors() {
        if view.dtype() != Dtype::F32 {
            bail!("tensor '{name}' in {shown} is not F32");
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        host.insert(name, (view.shape().to_vec(), data));
    }
    let specs = specs(&key.config);
    let mut take = |prefix: &str| -> Result<Vec<Vec<f32>>> {
        specs
            .iter()
            .map(|s| {
                let name = format!("{prefix}{}", s.name);
                let (shape, data) = host
                    .remove(&name)
                    .with_context(|| format!("{shown} lacks tensor '{name}'"))?;
                if shape != s.shape {
                    bail!(
                        "tensor '{name}' in {shown} has shape {shape:?}, expected {:?}",
                        s.shape
                    );
                }
                Ok(data)
            })
            .collect()
    };
    let state = State {
        step: number("step")?,
        samples: number("samples")?,
        weights: take("")?,
        m: take("adamw.m.")?,
        v: take("adamw.v.")?,
    };
    let all = state.weights.iter().chain(&state.m).chain(&state.v);
    if checksum(all.map(|t| t.as_slice())) != get("checksum")? {
        bail!("{shown} is corrupt: its tensors do not match the checksum saved with them");
    }
    Ok(state)
}
