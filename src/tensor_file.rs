//! Reading and writing named f32 tensors as safetensors, the format PyTorch, JAX and Hugging Face
//! tools read, so anyone can check our results with their own code.

use anyhow::{Context, Result, bail};
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

/// A named tensor to write: shape and row-major f32 data.
pub struct Named<'a> {
    pub name: &'a str,
    pub shape: Vec<usize>,
    pub data: &'a [f32],
}

/// Writes `tensors` and string `metadata` to `path` (through a temporary file, synced, and a
/// rename, so a reader or a crash never leaves a half-written file there). Each tensor becomes
/// bytes only as it is written: a 7B model's file needs no second copy of it in memory.
pub fn write(path: &Path, tensors: &[Named<'_>], metadata: &[(&str, &str)]) -> Result<()> {
    for t in tensors {
        if t.shape.iter().product::<usize>() != t.data.len() {
            bail!(
                "tensor '{}' has {} elements but shape {:?}",
                t.name,
                t.data.len(),
                t.shape
            );
        }
    }
    let views = tensors.iter().map(|t| (t.name, F32Bytes(t)));
    let meta: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let tmp = path.with_extension("tmp");
    safetensors::serialize_to_file(views, (!meta.is_empty()).then_some(meta), &tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("cannot write {} to disk", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}

/// A tensor as safetensors writes it: its f32 values made little-endian bytes when written.
struct F32Bytes<'a>(&'a Named<'a>);

impl View for F32Bytes<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.0.data.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    fn data_len(&self) -> usize {
        4 * self.0.data.len()
    }
}

/// Tensors read from a file: name → (shape, row-major data).
pub type Tensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every f32 tensor of a safetensors file.
pub fn read(path: &Path) -> Result<Tensors> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a valid safetensors file", path.display()))?;
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            if view.dtype() != Dtype::F32 {
                bail!(
                    "tensor '{name}' in {} is {:?}, expected F32",
                    path.display(),
                    view.dtype()
                );
            }
            let data = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Ok((name, (view.shape().to_vec(), data)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_bad_shapes() {
        let dir = std::env::temp_dir().join(format!("distflash-tf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
        let a = [1.0, -2.5, 3.25, 4.0, 5.0, 6.0];
        write(
            &path,
            &[Named {
                name: "a",
                shape: vec![2, 3],
                data: &a,
            }],
            &[("dtype", "f32")],
        )
        .unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back["a"], (vec![2, 3], a.to_vec()));
        assert!(
            write(
                &path,
                &[Named {
                    name: "a",
                    shape: vec![4],
                    data: &a
                }],
                &[]
            )
            .is_err()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
