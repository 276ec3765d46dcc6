//! The [`Backend`] block API on the GPU, which `exec` drives for distributed schedules: a block's
//! forward folded into an f32 running state in place, finalize and merge of partial results, D,
//! and a block's backward accumulating f32 gradients; with the launch arguments every attention
//! kernel shares (block geometry, tensor maps).

use super::launch::Masking;
use super::mask::MaskArgs;
use super::strides::{CallStrides, Strides};
use super::tensor::{f32_mut, f32_ref, half, half_mut};
use super::{CudaBackend, InputDtype, Kernels, Tensor, Tuning, launch, tma};
use crate::backend::Backend;
use crate::block_math::{Block, GradsMut, Partial, QuerySide, RunningState};
use crate::shape::{Dims, Mask};
use anyhow::{Result, bail};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchArgs, PushKernelArg};
use rayon::prelude::*;

impl CudaBackend {
    /// Q, K and V of `block` as the kernels read them under `strides`, each checked for dtype
    /// and size.
    fn block_qkv<'t>(
        &self,
        dims: &Dims,
        block: Block,
        strides: &CallStrides,
        q: &'t Tensor,
        k: &'t Tensor,
        v: &'t Tensor,
    ) -> Result<[&'t CudaSlice<u16>; 3]> {
        let dt = self.dtype;
        let (ql, kvl) = strides.extents(dims, block.q.len, block.kv.len);
        Ok([
            half(q, dt, ql, "Q")?,
            half(k, dt, kvl, "K")?,
            half(v, dt, kvl, "V")?,
        ])
    }

    /// The tensor maps the wgmma forward loads Q, K and V of `block` through (`tma`); none for
    /// the mma.sync kernel, which loads with cp.async.
    fn forward_maps(
        &self,
        dims: &Dims,
        block: Block,
        strides: &CallStrides,
        [q, k, v]: [&CudaSlice<u16>; 3],
        tuning: &Tuning,
    ) -> Result<Option<[tma::TensorMap; 3]>> {
        if !tuning.fwd_wgmma {
            return Ok(None);
        }
        let (b, d) = (dims.batch, dims.head_dim);
        let element = self.map_element();
        let q_shape = tma::TileMapShape::new(
            &strides.q,
            [b, dims.heads, block.q.len, d],
            launch::WGMMA_FWD_ROWS,
            element,
        )?;
        let kv_shape = tma::TileMapShape::new(
            &strides.kv,
            [b, dims.kv_heads, block.kv.len, d],
            launch::wgmma_keys(d),
            element,
        )?;
        let ptr = |t: &CudaSlice<u16>| t.device_ptr(&self.stream).0;
        Ok(Some([
            q_shape.encode(ptr(q))?,
            kv_shape.encode(ptr(k))?,
            kv_shape.encode(ptr(v))?,
        ]))
    }

    /// The tensor-map element of the inputs' 16-bit type.
    fn map_element(&self) -> tma::MapElement {
        match self.dtype {
            InputDtype::Bf16 => tma::MapElement::Bf16,
            InputDtype::F16 => tma::MapElement::F16,
        }
    }

    /// The tensor maps the wgmma backward loads Q and dO and adds its dQ tiles (f32) through,
    /// all under the query side's strides; none for the mma.sync kernel.
    fn backward_maps(
        &self,
        dims: &Dims,
        q_len: usize,
        strides: &CallStrides,
        [q, dout]: [&CudaSlice<u16>; 2],
        dq: &CudaSlice<f32>,
        tuning: &Tuning,
    ) -> Result<Option<[tma::TensorMap; 3]>> {
        if !tuning.bwd_wgmma {
            return Ok(None);
        }
        let shape = [dims.batch, dims.heads, q_len, dims.head_dim];
        let rows = launch::WGMMA_BWD_QUERY_ROWS;
        let half = tma::TileMapShape::new(&strides.q, shape, rows, self.map_element())?;
        let f32 = tma::TileMapShape::new(&strides.q, shape, rows, tma::MapElement::F32)?;
        Ok(Some([
            half.encode(q.device_ptr(&self.stream).0)?,
            half.encode(dout.device_ptr(&self.stream).0)?,
            f32.encode(dq.device_ptr(&self.stream).0)?,
        ]))
    }

    fn fill(&self, k: &Kernels, x: &mut CudaSlice<f32>, value: f32) -> Result<()> {
        let n = x.len() as i64;
        let mut b = self.stream.launch_builder(&k.fill_f32);
        b.arg(x).arg(&value).arg(&n);
        self.launch("fill_f32", b, launch::elementwise_config(n as usize))
    }

    /// Forward of `call`'s block under its mask writing a finished (O in the input dtype under
    /// Q's strides, LSE f32) result directly: the running state never leaves registers.
    pub(super) fn forward_final(
        &self,
        call: &BlockCall<'_>,
        [q, k, v]: [&Tensor; 3],
        out: &mut Partial<Tensor>,
    ) -> Result<()> {
        let BlockCall {
            dims,
            block,
            mask,
            strides,
        } = *call;
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::of(mask))?;
        let (dt, qn) = (self.dtype, block.q.len);
        let [q, k, v] = self.block_qkv(dims, block, strides, q, k, v)?;
        let o = half_mut(&mut out.out, dt, strides.extents(dims, qn, 0).0, "O")?;
        let lse = f32_mut(&mut out.lse, dims.stat_len(qn), "LSE")?;
        let tuning = self.tuning(dims.head_dim);
        let cfg = launch::forward_config(dims, qn, &tuning)?;
        let geometry = ForwardGeometry::new(dims, block, *strides, self.mask_args(mask, block)?)?;
        let maps = self.forward_maps(dims, block, strides, [q, k, v], &tuning)?;
        let mut b = self.stream.launch_builder(&kern.fwd_final);
        b.arg(q).arg(k).arg(v).arg(o).arg(lse);
        geometry.push(&mut b);
        push_maps(&mut b, &maps);
        self.launch("the attention forward", b, cfg)
    }
}

/// One block's call as the kernels see it besides its tensors: the problem's dims, the block,
/// the mask over the whole sequence and the strides the tensors lie under.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockCall<'a> {
    pub dims: &'a Dims,
    pub block: Block,
    pub mask: &'a Mask,
    pub strides: &'a CallStrides,
}

/// What both forward kernels take after their tensors: the block's geometry and strides, the
/// mask and the softmax scale in base 2 (the kernels use exp2).
struct ForwardGeometry {
    ints: [i32; 6],
    strides: CallStrides,
    mask: MaskArgs,
    scale_log2: f32,
}

impl ForwardGeometry {
    fn new(dims: &Dims, block: Block, strides: CallStrides, mask: MaskArgs) -> Result<Self> {
        Ok(ForwardGeometry {
            ints: block_ints(dims, block)?,
            strides,
            mask,
            scale_log2: dims.scale() * std::f32::consts::LOG2_E,
        })
    }

    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        for i in &self.ints {
            b.arg(i);
        }
        b.arg(&self.strides.q).arg(&self.strides.kv);
        self.mask.push_forward(b);
        b.arg(&self.scale_log2);
    }
}

/// The wgmma kernels' last arguments: their tensor maps, when they are the kernels in use.
fn push_maps<'a>(b: &mut LaunchArgs<'a>, maps: &'a Option<[tma::TensorMap; 3]>) {
    for map in maps.iter().flatten() {
        b.arg(map);
    }
}

/// The kernels' integer arguments for a block: heads, kv_heads, q_len, kv_len, q_start, kv_start.
fn block_ints(dims: &Dims, block: Block) -> Result<[i32; 6]> {
    let vals = [
        dims.heads,
        dims.kv_heads,
        block.q.len,
        block.kv.len,
        block.q.start,
        block.kv.start,
    ];
    let mut out = [0i32; 6];
    for (o, v) in out.iter_mut().zip(vals) {
        *o = i32::try_from(v)
            .map_err(|_| anyhow::anyhow!("{v} does not fit the kernels' 32-bit row indices"))?;
    }
    // Positions are compared as i32 inside the kernels.
    if block.q.end() > i32::MAX as usize || block.kv.end() > i32::MAX as usize {
        bail!("sequence positions beyond 2^31 are not supported by the CUDA kernels");
    }
    Ok(out)
}

impl Backend for CudaBackend {
    type Tensor = Tensor;

    fn synchronize(&self) -> Result<()> {
        CudaBackend::synchronize(self)
    }

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn upload(&self, host: &[f32]) -> Result<Tensor> {
        let dtype = self.dtype;
        self.upload_bits(host, |x| dtype.encode(x))
    }

    fn download(&self, tensor: &Tensor) -> Result<Vec<f32>> {
        let err = |e| anyhow::anyhow!("copy from the GPU failed: {e:?}");
        match tensor {
            Tensor::Half { dtype, data } => {
                let bits = self.stream.clone_dtoh(data).map_err(err)?;
                Ok(bits.par_iter().map(|&b| dtype.decode(b)).collect())
            }
            Tensor::F32(data) => self.stream.clone_dtoh(data).map_err(err),
        }
    }

    fn zeros(&self, len: usize) -> Result<Tensor> {
        Ok(Tensor::F32(self.alloc_f32(len)?))
    }

    fn add_assign(&self, dst: &mut Tensor, src: &Tensor) -> Result<()> {
        let n = src.len();
        let src = f32_ref(src, n, "the added tensor")?;
        let dst = f32_mut(dst, n, "the accumulator")?;
        // Any compiled variant carries the elementwise kernels; take (or build) the common one.
        let kern = self.any_kernels()?;
        let len = n as i64;
        let mut b = self.stream.launch_builder(&kern.add_f32);
        b.arg(dst).arg(src).arg(&len);
        self.launch("add_f32", b, launch::elementwise_config(n))
    }

    fn new_state(&self, dims: &Dims, rows: usize) -> Result<RunningState<Tensor>> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::Causal)?;
        let mut m = self.alloc_f32(dims.stat_len(rows))?;
        self.fill(&kern, &mut m, f32::NEG_INFINITY)?;
        Ok(RunningState {
            m: Tensor::F32(m),
            l: Tensor::F32(self.alloc_f32(dims.stat_len(rows))?),
            acc: Tensor::F32(self.alloc_f32(dims.q_len(rows))?),
        })
    }

    fn forward_block(
        &self,
        dims: &Dims,
        block: Block,
        mask: &Mask,
        q: &Tensor,
        (k, v): (&Tensor, &Tensor),
        state: &mut RunningState<Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::of(mask))?;
        let (qn, kvn) = (block.q.len, block.kv.len);
        if qn == 0 || kvn == 0 {
            return Ok(());
        }
        let strides = CallStrides::head_major(dims, qn, kvn);
        let [q, k, v] = self.block_qkv(dims, block, &strides, q, k, v)?;
        let m = f32_mut(&mut state.m, dims.stat_len(qn), "the running max")?;
        let l = f32_mut(&mut state.l, dims.stat_len(qn), "the running sum")?;
        let acc = f32_mut(&mut state.acc, dims.q_len(qn), "the accumulator")?;
        let tuning = self.tuning(dims.head_dim);
        let cfg = launch::forward_config(dims, qn, &tuning)?;
        let geometry = ForwardGeometry::new(dims, block, strides, self.mask_args(mask, block)?)?;
        let maps = self.forward_maps(dims, block, &strides, [q, k, v], &tuning)?;
        let mut b = self.stream.launch_builder(&kern.fwd_state);
        b.arg(q).arg(k).arg(v).arg(m).arg(l).arg(acc);
        geometry.push(&mut b);
        push_maps(&mut b, &maps);
        self.launch("the attention block forward", b, cfg)
    }

    fn finalize(
        &self,
        dims: &Dims,
        rows: usize,
        state: RunningState<Tensor>,
    ) -> Result<Partial<Tensor>> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::Causal)?;
        let m = f32_ref(&state.m, dims.stat_len(rows), "the running max")?;
        let l = f32_ref(&state.l, dims.stat_len(rows), "the running sum")?;
        let acc = f32_ref(&state.acc, dims.q_len(rows), "the accumulator")?;
        let mut out = self.alloc_f32(dims.q_len(rows))?;
        let mut lse = self.alloc_f32(dims.stat_len(rows))?;
        let n = dims.stat_len(rows) as i64;
        let mut b = self.stream.launch_builder(&kern.finalize_rows);
        b.arg(m).arg(l).arg(acc).arg(&mut out).arg(&mut lse).arg(&n);
        self.launch("finalize_rows", b, launch::rows_config(n as usize)?)?;
        Ok(Partial {
            out: Tensor::F32(out),
            lse: Tensor::F32(lse),
        })
    }

    fn merge(
        &self,
        dims: &Dims,
        rows: usize,
        into: &mut Partial<Tensor>,
        other: &Partial<Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::Causal)?;
        let ob = f32_ref(&other.out, dims.q_len(rows), "the merged partial's O")?;
        let lb = f32_ref(&other.lse, dims.stat_len(rows), "the merged partial's LSE")?;
        let oa = f32_mut(&mut into.out, dims.q_len(rows), "the partial's O")?;
        let la = f32_mut(&mut into.lse, dims.stat_len(rows), "the partial's LSE")?;
        let n = dims.stat_len(rows) as i64;
        let mut b = self.stream.launch_builder(&kern.merge_rows);
        b.arg(oa).arg(la).arg(ob).arg(lb).arg(&n);
        self.launch("merge_rows", b, launch::rows_config(n as usize)?)
    }

    fn delta(&self, dims: &Dims, rows: usize, out: &Tensor, dout: &Tensor) -> Result<Tensor> {
        let strides = Strides::head_major(dims.heads, rows, dims.head_dim);
        self.delta_in(dims, rows, (out, strides), (dout, strides))
    }

    fn backward_block(
        &self,
        dims: &Dims,
        block: Block,
        mask: &Mask,
        query: QuerySide<'_, Tensor>,
        (k, v): (&Tensor, &Tensor),
        grads: GradsMut<'_, Tensor>,
    ) -> Result<()> {
        let strides = CallStrides::head_major(dims, block.q.len, block.kv.len);
        let call = BlockCall {
            dims,
            block,
            mask,
            strides: &strides,
        };
        self.backward_in(&call, query, (k, v), grads)
    }
}

impl CudaBackend {
    /// D = rowsum(dO∘O) of `rows` query rows, O (f32 or the input dtype) and dO (the input
    /// dtype) each under its strides: one f32 per row in the statistics' order.
    pub(super) fn delta_in(
        &self,
        dims: &Dims,
        rows: usize,
        (out, out_strides): (&Tensor, Strides),
        (dout, dout_strides): (&Tensor, Strides),
    ) -> Result<Tensor> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::Causal)?;
        let extent = |s: Strides| s.extent(dims.batch, dims.heads, rows, dims.head_dim);
        let dout = half(dout, self.dtype, extent(dout_strides), "dO")?;
        let len = extent(out_strides);
        let mut delta = self.alloc_f32(dims.stat_len(rows))?;
        let n = dims.stat_len(rows) as i64;
        let (q_len, heads) = (rows as i64, dims.heads as i32);
        let cfg = launch::rows_config(n as usize)?;
        let (name, function) = match out {
            Tensor::F32(o) if o.len() == len => ("delta_f32", &kern.delta_f32),
            Tensor::Half { dtype, data } if *dtype == self.dtype && data.len() == len => {
                ("delta_half", &kern.delta_half)
            }
            other => bail!(
                "O must be an f32 or {} tensor of {len} elements, got {}",
                self.dtype.name(),
                other.describe()
            ),
        };
        let mut b = self.stream.launch_builder(function);
        match out {
            Tensor::F32(o) => b.arg(o),
            Tensor::Half { data, .. } => b.arg(data),
        };
        b.arg(&out_strides).arg(dout).arg(&dout_strides);
        b.arg(&mut delta).arg(&n).arg(&q_len).arg(&heads);
        self.launch(name, b, cfg)?;
        Ok(Tensor::F32(delta))
    }

    /// The backward of `call`'s block under its mask and strides: dQ accumulates in f32; dK
    /// and dV accumulate in f32 too, or are written once in the input dtype when `grads` holds
    /// them so ([`writes_kv_grads`]: one query head per KV head, the block the whole sequence).
    pub(super) fn backward_in(
        &self,
        call: &BlockCall<'_>,
        query: QuerySide<'_, Tensor>,
        (k, v): (&Tensor, &Tensor),
        grads: GradsMut<'_, Tensor>,
    ) -> Result<()> {
        let BlockCall {
            dims,
            block,
            mask,
            strides,
        } = *call;
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim, Masking::of(mask))?;
        let (dt, qn, kvn) = (self.dtype, block.q.len, block.kv.len);
        if qn == 0 || kvn == 0 {
            return Ok(());
        }
        let (ql, kvl) = strides.extents(dims, qn, kvn);
        let q = half(query.q, dt, ql, "Q")?;
        let dout = half(query.dout, dt, ql, "dO")?;
        let lse = f32_ref(query.lse, dims.stat_len(qn), "LSE")?;
        let delta = f32_ref(query.delta, dims.stat_len(qn), "D")?;
        let k = half(k, dt, kvl, "K")?;
        let v = half(v, dt, kvl, "V")?;
        let dq = f32_mut(grads.dq, ql, "dQ")?;
        let tuning = self.tuning(dims.head_dim);
        let maps = self.backward_maps(dims, qn, strides, [q, dout], dq, &tuning)?;
        let direct = matches!(grads.dk, Tensor::Half { .. });
        if direct && !writes_kv_grads(dims, block) {
            bail!(
                "16-bit dK and dV are written only by a whole-sequence backward with one query head per KV head; pass f32 accumulators"
            );
        }
        let kv_direct = i32::from(direct);
        let cfg = launch::backward_config(dims, block.kv.len, &tuning)?;
        let shared_kv = dims.heads != dims.kv_heads && !direct;
        let turns = if tuning.deterministic {
            let n = launch::backward_turns(dims, qn, kvn, shared_kv, &tuning);
            Some(self.stream.alloc_zeros::<i32>(n).map_err(|e| {
                anyhow::anyhow!(
                    "could not allocate the deterministic backward's {n} turn counters: {e:?}"
                )
            })?)
        } else {
            None
        };
        let ints = block_ints(dims, block)?;
        let mask = self.mask_args(mask, block)?;
        let scale = dims.scale();
        let mut b = self.stream.launch_builder(&kern.bwd_block);
        b.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(delta);
        b.arg(dq);
        if direct {
            b.arg(half_mut(grads.dk, dt, kvl, "dK")?);
            b.arg(half_mut(grads.dv, dt, kvl, "dV")?);
        } else {
            b.arg(f32_mut(grads.dk, kvl, "dK")?);
            b.arg(f32_mut(grads.dv, kvl, "dV")?);
        }
        b.arg(&kv_direct);
        for i in &ints {
            b.arg(i);
        }
        b.arg(&strides.q).arg(&strides.kv);
        mask.push_backward(&mut b);
        b.arg(&scale);
        let no_turns: u64 = 0;
        match &turns {
            Some(t) => b.arg(t),
            None => b.arg(&no_turns),
        };
        push_maps(&mut b, &maps);
        self.launch("the attention block backward", b, cfg)
    }
}

/// Whether the backward of `block` may write 16-bit dK and dV itself instead of accumulating
/// f32 ones: when each of its CTAs computes every term of its keys' gradients, i.e. one query
/// head per KV head (no GQA group summing into a KV head) and the block the whole sequence
/// from its start (no other block adding to the same keys). The model's attention and the
/// binding then need neither the f32 buffers (8 bytes an element of K and V) nor the rounding
/// pass after.
pub(super) fn writes_kv_grads(dims: &Dims, block: Block) -> bool {
    dims.heads == dims.kv_heads && block.q == block.kv && block.q.start == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::shape::Span;

    #[test]
    fn block_ints_order_and_range() {
        let dims = Dims {
            batch: 1,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
        };
        let block = Block {
            q: Span {
                start: 100,
                len: 50,
            },
            kv: Span { start: 20, len: 30 },
        };
        assert_eq!(block_ints(&dims, block).unwrap(), [8, 2, 50, 30, 100, 20]);
        let huge = Block {
            q: Span {
                start: i32::MAX as usize,
                len: 2,
            },
            kv: block.kv,
        };
        assert!(block_ints(&dims, huge).is_err());
    }
}
