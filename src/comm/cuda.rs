//! The CUDA tensor as a communicator buffer: its wire size, and the device copy and host-side sum
//! that let virtual workers sharing one GPU exchange tensors through the in-process
//! communicator. Here rather than in `backend::cuda` so that the backend knows nothing of
//! communication (DESIGN's map: `comm` sits above `backend`).

use super::{Buffer, Wire};
use crate::backend::cuda::Tensor;
use anyhow::{Result, anyhow, bail};

impl Wire for Tensor {
    fn wire_bytes(&self) -> usize {
        match self {
            Tensor::Half { data, .. } => 2 * data.len(),
            Tensor::F32(data) => 4 * data.len(),
        }
    }

    fn elements(&self) -> usize {
        self.len()
    }
}

/// Virtual workers on one GPU pass tensors through the in-process communicator as device copies.
impl Buffer for Tensor {
    fn duplicate(&self) -> Result<Self> {
        self.try_clone()
    }

    /// The in-process all-reduce of virtual workers' f32 gradients, through the host: a check
    /// path (exact, not fast); GPU ranks of a real job all-reduce through NCCL.
    fn sum_from(&mut self, other: &Self) -> Result<()> {
        let (Tensor::F32(mine), Tensor::F32(theirs)) = (&mut *self, other) else {
            bail!("the in-process all-reduce sums f32 tensors (gradients), not 16-bit ones");
        };
        if mine.len() != theirs.len() {
            bail!(
                "an all-reduce of {} elements met one of {}",
                mine.len(),
                theirs.len()
            );
        }
        let err = |e| anyhow!("could not sum device tensors through the host: {e:?}");
        let stream = mine.stream().clone();
        let mut sum = stream.clone_dtoh(&*mine).map_err(err)?;
        let add = stream.clone_dtoh(theirs).map_err(err)?;
        sum.iter_mut().zip(&add).for_each(|(a, b)| *a += b);
        stream.memcpy_htod(&sum, mine).map_err(err)
    }
}
