//! The CPU backend: f32 host vectors and the block math (`block_math`) on all cores. It is the
//! oracle-checked reference for every algorithm and what CI runs.

use super::{Backend, ModelEdge, Order};
use crate::block_math::{self, Block, GradsMut, Partial, QuerySide, RunningState};
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};

/// Runs blocks on the CPU in f32 with rayon.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Tensor = Vec<f32>;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn upload(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn download(&self, tensor: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(tensor.clone())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(()) // CPU work is done when its call returns
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn add_assign(&self, dst: &mut Vec<f32>, src: &Vec<f32>) -> Result<()> {
        dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn new_state(&self, dims: &Dims, rows: usize) -> Result<RunningState<Vec<f32>>> {
        Ok(RunningState {
            m: vec![f32::NEG_INFINITY; dims.stat_len(rows)],
            l: vec![0.0; dims.stat_len(rows)],
            acc: vec![0.0; dims.q_len(rows)],
        })
    }

    fn forward_block(
        &self,
        dims: &Dims,
        block: Block,
        mask: &Mask,
        q: &Vec<f32>,
        (k, v): (&Vec<f32>, &Vec<f32>),
        state: &mut RunningState<Vec<f32>>,
    ) -> Result<()> {
        block_math::forward_block(dims, block, mask, q, k, v, state);
        Ok(())
    }

    fn finalize(
        &self,
        dims: &Dims,
        _rows: usize,
        state: RunningState<Vec<f32>>,
    ) -> Result<Partial<Vec<f32>>> {
        Ok(block_math::finalize(dims.head_dim, state))
    }

    fn merge(
        &self,
        dims: &Dims,
        _rows: usize,
        into: &mut Partial<Vec<f32>>,
        other: &Partial<Vec<f32>>,
    ) -> Result<()> {
        block_math::merge(dims.head_dim, into, other);
        Ok(())
    }

    fn delta(
        &self,
        dims: &Dims,
        _rows: usize,
        out: &Vec<f32>,
        dout: &Vec<f32>,
    ) -> Result<Vec<f32>> {
        Ok(block_math::delta(dims.head_dim, out, dout))
    }

    fn backward_block(
        &self,
        dims: &Dims,
        block: Block,
        mask: &Mask,
        query: QuerySide<'_, Vec<f32>>,
        (k, v): (&Vec<f32>, &Vec<f32>),
        grads: GradsMut<'_, Vec<f32>>,
    ) -> Result<()> {
        block_math::backward_block(dims, block, mask, query, k, v, grads);
        Ok(())
    }
}

impl ModelEdge for CpuBackend {
    fn relayout(
        &self,
        t: &Vec<f32>,
        rows: usize,
        heads: usize,
        d: usize,
        to: Order,
        _: &str,
    ) -> Result<Vec<f32>> {
        Ok(match to {
            Order::ToHeadMajor => block_math::layout::to_head_major(t, 1, rows, heads, d),
            Order::ToSeqMajor => block_math::layout::to_seq_major(t, 1, rows, heads, d),
        })
    }

    fn split(&self, t: &Vec<f32>, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
        if lens.iter().sum::<usize>() != t.len() {
            bail!(
                "cannot cut a tensor of {} elements into parts of {lens:?}",
                t.len()
            );
        }
        let mut rest = t.as_slice();
        Ok(lens
            .iter()
            .map(|&len| {
                let (part, tail) = rest.split_at(len);
                rest = tail;
                part.to_vec()
            })
            .collect())
    }

    fn join(&self, parts: &[Vec<f32>]) -> Result<Vec<f32>> {
        Ok(parts.concat())
    }
}
