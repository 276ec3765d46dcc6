//! Saving and resuming training: weights, AdamW moments, step and data position in one
//! safetensors file, written to a temporary file and renamed, so a crash mid-write leaves the
//! previous checkpoint whole. A checksum over the tensor bytes and the run's settings in the
//! metadata make a corrupt, truncated or mismatched file refused with a sentence.

use crate::model::config::Config;
use crate::model::hf_weights::to_f32;
use crate::model::weights::{specs, whole_spans};
use crate::shape::Span;
use crate::tensor_file::{self, Named};
use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::fs::File;
use std::ops::Range;
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

/// FNV-1a over every byte of the tensors (their f32 values little-endian, in file order), the
/// integrity check stored with the file.
fn checksum(bytes: impl Iterator<Item = u8>) -> String {
    let h = bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("{h:016x}")
}

/// The file a checkpoint directory holds.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join("state.safetensors")
}

/// Writes `state` to `path` atomically (`tensor_file::write`).
pub fn save(path: &Path, key: &RunKey, state: &State) -> Result<()> {
    let specs = specs(&key.config);
    let mut names = Vec::new();
    let mut data: Vec<&[f32]> = Vec::new();
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
    let named: Vec<Named<'_>> = names
        .iter()
        .zip(&data)
        .map(|((name, shape), data)| Named {
            name,
            shape: shape.clone(),
            data,
        })
        .collect();
    let meta = [
        ("format", FORMAT.to_string()),
        ("step", state.step.to_string()),
        ("samples", state.samples.to_string()),
        ("config", key.config.to_json().to_string()),
        ("data", key.data.clone()),
        ("seq_len", key.seq_len.to_string()),
        ("batch", key.batch.to_string()),
        (
            "checksum",
            checksum(
                data.iter()
                    .flat_map(|t| t.iter().flat_map(|x| x.to_le_bytes())),
            ),
        ),
    ];
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
    tensor_file::write(path, &named, &meta)
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

/// A checkpoint opened to resume from: its run, every tensor's shape and its checksum checked,
/// the file memory-mapped so that each worker reads only its pieces of the tensors (a 7B run's
/// checkpoint is 80 GB of f32 weights and moments).
pub struct Saved {
    /// Optimizer steps taken.
    pub step: u64,
    /// Sequences consumed: the data position.
    pub samples: u64,
    path: PathBuf,
    map: Mmap,
    config: Config,
    /// Where each tensor's bytes lie in the map: the weights', then each moment's, `specs`
    /// order (read from the header once, on load).
    bytes: Vec<Range<usize>>,
}

/// Which tensors of a checkpoint: the weights or one of AdamW's moments.
#[derive(Clone, Copy, Debug)]
pub enum Part {
    Weights,
    FirstMoment,
    SecondMoment,
}

impl Part {
    /// Every part, in declaration order (so `part as usize` indexes it) and file order.
    const ALL: [Part; 3] = [Part::Weights, Part::FirstMoment, Part::SecondMoment];

    fn prefix(self) -> &'static str {
        match self {
            Part::Weights => "",
            Part::FirstMoment => "adamw.m.",
            Part::SecondMoment => "adamw.v.",
        }
    }
}

impl Saved {
    /// Elements `span` of tensor `k` (`specs` order) of `part`, as f32: one tensor's piece at a
    /// time, so the host never holds more than one.
    pub fn piece(&self, part: Part, k: usize, span: Span) -> Result<Vec<f32>> {
        let tensors = self.bytes.len() / Part::ALL.len();
        let bytes = &self.map[self.bytes[part as usize * tensors + k].clone()];
        if 4 * span.end() > bytes.len() {
            bail!(
                "tensor {k} of {}{} has no elements {span:?}",
                self.path.display(),
                part.prefix()
            );
        }
        Ok(to_f32(Dtype::F32, bytes, span))
    }

    /// Every tensor of `part` whole (`specs` order).
    pub fn whole(&self, part: Part) -> Result<Vec<Vec<f32>>> {
        whole_spans(&self.config)
            .into_iter()
            .enumerate()
            .map(|(k, span)| self.piece(part, k, span))
            .collect()
    }
}

/// The checkpoint file `path` names: the file itself, or the one a save directory holds.
pub fn file_at(path: &Path) -> PathBuf {
    if path.is_dir() {
        path_in(path)
    } else {
        path.to_path_buf()
    }
}

/// A checkpoint file memory-mapped, with its header and its metadata (the run's settings).
struct Mapped {
    map: Mmap,
    header_len: usize,
    header: safetensors::tensor::Metadata,
    meta: std::collections::HashMap<String, String>,
}

impl Mapped {
    fn open(path: &Path) -> Result<Mapped> {
        let shown = path.display();
        let file = File::open(path).with_context(|| format!("cannot read checkpoint {shown}"))?;
        // SAFETY: the map is read-only, and a run replaces its checkpoint by renaming a new
        // file over it, which leaves this mapping's file as it was.
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map checkpoint {shown}"))?;
        let (header_len, header) = SafeTensors::read_metadata(&map).with_context(|| {
            format!("{shown} is not a readable checkpoint (truncated or corrupt)")
        })?;
        let meta = header.metadata().clone().unwrap_or_default();
        let mapped = Mapped {
            map,
            header_len,
            header,
            meta,
        };
        if mapped.get("format", path)? != FORMAT {
            bail!("{shown} is not a distflash training checkpoint of format {FORMAT}");
        }
        Ok(mapped)
    }

    fn get(&self, k: &str, path: &Path) -> Result<String> {
        self.meta.get(k).cloned().with_context(|| {
            format!(
                "{} is not a distflash training checkpoint (no '{k}')",
                path.display()
            )
        })
    }

    /// The model the checkpoint was saved with.
    fn config(&self, path: &Path) -> Result<Config> {
        Config::from_json(&serde_json::from_str(&self.get("config", path)?)?)
            .with_context(|| format!("the model config in {} is unreadable", path.display()))
    }
}

/// The model a checkpoint was saved with, from its header alone: a resumed run that names no
/// model (`--preset`, `--config`) continues with this one.
pub fn saved_config(path: &Path) -> Result<Config> {
    Mapped::open(path)?.config(path)
}

/// Opens a checkpoint for a run with `key`, refusing one that is damaged or from another run.
pub fn load(path: &Path, key: &RunKey) -> Result<Saved> {
    let shown = path.display();
    let mapped = Mapped::open(path)?;
    // Deserializing checks the header against the file (offsets, lengths).
    SafeTensors::deserialize(&mapped.map)
        .with_context(|| format!("{shown} is not a readable checkpoint (truncated or corrupt)"))?;
    let get = |k: &str| mapped.get(k, path);
    let saved_config = mapped.config(path)?;
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
    // Every tensor present, f32, of its shape; the checksum over them in file order. The data
    // follow the header's 8-byte length and the header itself.
    let data = size_of::<u64>() + mapped.header_len;
    let infos = mapped.header.tensors();
    let mut bytes = Vec::new();
    for part in Part::ALL {
        for s in specs(&key.config) {
            let name = format!("{}{}", part.prefix(), s.name);
            let info = infos
                .get(&name)
                .with_context(|| format!("{shown} lacks tensor '{name}'"))?;
            if info.dtype != Dtype::F32 {
                bail!("tensor '{name}' in {shown} is not F32");
            }
            if info.shape != s.shape {
                bail!(
                    "tensor '{name}' in {shown} has shape {:?}, expected {:?}",
                    info.shape,
                    s.shape
                );
            }
            let (start, end) = info.data_offsets;
            bytes.push(data + start..data + end);
        }
    }
    let in_order = bytes
        .iter()
        .flat_map(|r| mapped.map[r.clone()].iter().copied());
    if checksum(in_order) != get("checksum")? {
        bail!("{shown} is corrupt: its tensors do not match the checksum saved with them");
    }
    let (step, samples) = (number("step")?, number("samples")?);
    Ok(Saved {
        step,
        samples,
        path: path.to_path_buf(),
        map: mapped.map,
        config: key.config.clone(),
        bytes,
    })
}
