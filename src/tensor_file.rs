//! Reading and writing named f32 tensors as safetensors, the format PyTorch, JAX and Hugging Face
//! tools read, so anyone can check our results with their own code.

use anyhow::{Context, Result, bail};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::HashMap;
use std::path::Path;

/// A named tensor to write: shape and row-major f32 data.
pub struct Named<'a> {
    pub name: &'a str,
    pub shape: Vec<usize>,
    pub data: &'a [f32],
}

/// Writes `tensors` and string `metadata` to `path` (through a temporary file and a rename, so a
/// reader never sees a half-written file).
pub fn write(path: &Path, tensors: &[Named<'_>], metadata: &[(&str, &str)]) -> Result<()> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for (t, b) in tensors.iter().zip(&bytes) {
        if t.shape.iter().product::<usize>() != t.data.len() {
            bail!(
                "tensor '{}' has {} elements but shape {:?}",
                t.name,
                t.data.len(),
                t.shape
            );
        }
        views.push((t.name, TensorView::new(Dtype::F32, t.shape.clone(), b)?));
    }
    let meta: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let buffer = safetensors::serialize(views, (!meta.is_empty()).then_some(meta))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, buffer).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
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
