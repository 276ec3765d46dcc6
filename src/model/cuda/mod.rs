//! The model's `Ops` on one GPU: cuBLAS for the matrix products, the kernels of
//! `kernels/model.cu` for everything else, all on the attention backend's context and stream, so
//! attention and model ops are ordered on one stream without events.
//!
//! Mixed precision, as trainers run it:
//! - weights and activations are 16-bit (`Tensor::Half`, the backend's bf16 or fp16): `upload`,
//!   `embed`, `linear`, `rmsnorm`'s output, `swiglu` and `swiglu_backward` produce them;
//! - `zeros` and `scratch` give f32 (`Tensor::F32`): the model takes them for weight gradients,
//!   AdamW moments and activation gradients (dm, dh: `scratch`, which their first product
//!   writes), so gradients accumulate in f32; the rmsnorm rstd and the loss's dh are f32 too;
//! - every op reads either variant wherever it reads, and in-place ops (`add_assign`,
//!   `rope`, the dx and dW accumulators) keep the variant they find. Matrix products take 16-bit
//!   A and B (f32 compute, C in either variant): an f32 operand, such as a gradient arriving from
//!   an f32 accumulator, is rounded into a scratch 16-bit copy first, as autocast would.
//!   Atomically accumulated gradients (embedding, norm gains) and AdamW moments must be f32.
//! - AdamW updates f32 moments from the gradient and, for a 16-bit parameter, its f32 master,
//!   writing the parameter back as the master's rounding, so updates smaller than half a
//!   16-bit step accumulate (without a master it updates the parameter in place). A bf16
//!   weight's master is only the f32's low half, the weight being its upper half rounded
//!   (`backend::cuda::master_split`: 2 bytes an element instead of 4, the same f32 values);
//!   an fp16 weight's is an f32 copy.
//! - fp16 has bf16's precision ×8 but not its range: gradients scaled by 1/tokens underflow when
//!   rounded to fp16 for a GEMM, so fp16 training wants a larger `loss_scale` (scaled back before
//!   the update). The loss's own dlogits avoid this: the scale is the GEMMs' alpha.
//!
//! `elem_bytes` reports 2, the size of the activations that dominate the memory meter; f32
//! statistics are counted at that size too.

mod args;
mod gemm;
mod kernels;
mod offload;
pub(crate) mod shapes;
pub mod whole_sequence;

use super::cost::{loss_chunk_rows, loss_chunks};
use super::init;
use super::ops::{
    AdamState, AdamStep, AdamW, LinearBackward, LossInput, LossOut, NormBackward, Ops, RopeCall,
    Rows, check_positions, check_rows, f32_copy,
};
use crate::backend::Backend;
use crate::backend::cuda::{
    CudaBackend, InputDtype, Tensor, allocation_failed, elementwise_config, master_split,
};
use anyhow::{Result, anyhow, bail};
use args::{check, check_format, f32_mut, f32_ref, int, push, push_mut};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use gemm::{Blas, GemmShape};
use kernels::{Kernel, Kernels};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The model ops on the GPU of a [`CudaBackend`], sharing its context and stream.
pub struct CudaOps {
    backend: CudaBackend,
    blas: Blas,
    kernels: Kernels,
    /// Rotary inverse frequencies on the device by their bits: uploaded once, since a copy from
    /// pageable host memory would wait for the stream at every rotary call.
    rope_tables: Mutex<HashMap<Vec<u32>, RopeTable>>,
    /// Pinned host buffers of offloaded checkpoints and moments (`--offload`), reused by step.
    host: offload::HostPool,
    /// The streams the offload's copies run on beside the compute stream, made at the first
    /// stash (a second stream turns on cudarc's cross-stream event tracking, which runs without
    /// offload need not pay): the stashes and fetches, and the write-backs of offloaded moments
    /// ([`offload::Streams`]).
    copies: Mutex<Option<(Arc<CudaStream>, Arc<CudaStream>)>>,
}

/// One table of rotary inverse frequencies on the device.
type RopeTable = Arc<CudaSlice<f32>>;

/// A matrix-product operand in 16 bits: rows of the tensor's own buffer, or a rounded copy of an
/// f32 one's rows.
enum Operand<'a> {
    Borrowed(CudaView<'a, u16>),
    Owned(CudaSlice<u16>),
}

impl Operand<'_> {
    fn get(&self) -> CudaView<'_, u16> {
        match self {
            Operand::Borrowed(s) => s.slice(..),
            Operand::Owned(s) => s.slice(..),
        }
    }
}

impl CudaOps {
    /// Wraps `backend`: compiles (or reads from the kernel cache) the model kernels for its
    /// 16-bit format and opens a cuBLAS handle on its stream.
    pub fn new(backend: CudaBackend) -> Result<CudaOps> {
        let stream = backend.stream().clone();
        let blas = Blas::new(stream.clone(), backend.dtype())?;
        let kernels = Kernels::load(stream, backend.dtype())?;
        Ok(CudaOps {
            copies: Mutex::default(),
            backend,
            blas,
            kernels,
            rope_tables: Mutex::default(),
            host: offload::HostPool::default(),
        })
    }

    /// The attention backend these ops share a stream with (for the attention adapter).
    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.backend.stream()
    }

    fn dtype(&self) -> InputDtype {
        self.backend.dtype()
    }

    fn streams(&self) -> Result<offload::Streams<'_>> {
        let mut copies = self
            .copies
            .lock()
            .map_err(|_| anyhow!("copy stream lock poisoned"))?;
        let (copies, returns) = match &*copies {
            Some(streams) => streams.clone(),
            None => {
                let stream = || {
                    self.stream()
                        .context()
                        .new_stream()
                        .map_err(|e| anyhow!("could not create the offload's copy streams: {e:?}"))
                };
                copies.insert((stream()?, stream()?)).clone()
            }
        };
        Ok(offload::Streams {
            compute: self.stream(),
            copies,
            returns,
        })
    }

    /// `len` zeros: for accumulators, which the ops add into.
    fn zeroed<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream().alloc_zeros::<T>(len).map_err(|e| {
            allocation_failed(
                e,
                format_args!("{len} elements of {} bytes", size_of::<T>()),
            )
        })
    }

    /// `len` elements left as the allocator finds them, for an op's output that its kernel or
    /// product writes whole before anything reads it. Zeroing those was a memset of every
    /// activation the step makes, about 2% of a step at 32K tokens.
    fn output<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: the allocation is stream-ordered on the model's stream and lives as long as the
        // slice; its old contents are device bits no host reference points at. Each caller
        // writes every element before a read is queued behind it: the op's own kernel or beta-0
        // product (a thread per element, a block per row, or C the whole slice), or for
        // `scratch`, the product marked `dx_empty` (the layer's MLP and input gradients).
        unsafe { self.stream().alloc::<T>(len) }.map_err(|e| {
            allocation_failed(
                e,
                format_args!("{len} elements of {} bytes", size_of::<T>()),
            )
        })
    }

    fn half(&self, data: CudaSlice<u16>) -> Tensor {
        Tensor::Half {
            dtype: self.dtype(),
            data,
        }
    }

    /// `rows` rows of `width` of `t` (checked to be there) as a 16-bit GEMM operand.
    fn operand<'a>(
        &self,
        t: Rows<&'a Tensor>,
        rows: usize,
        width: usize,
        what: &str,
    ) -> Result<Operand<'a>> {
        check_format(t.t, self.dtype(), what)?;
        let range = t.range(t.t.len(), rows, width, what)?;
        match t.t {
            Tensor::Half { data, .. } => Ok(Operand::Borrowed(data.slice(range))),
            Tensor::F32(data) => {
                let len = range.len();
                let mut out = self.output::<u16>(len)?;
                let (src, n) = (data.slice(range), len as i64);
                let mut b = self.kernels.builder(Kernel::CastToHalf);
                b.arg(&src).arg(&0i32).arg(&mut out).arg(&n);
                self.kernels
                    .run(Kernel::CastToHalf, b, shapes::vector(len))?;
                Ok(Operand::Owned(out))
            }
        }
    }

    /// The inverse frequencies `inv_freq` on the device, uploaded once per distinct table.
    fn rope_table(&self, inv_freq: &[f32]) -> Result<RopeTable> {
        let key: Vec<u32> = inv_freq.iter().map(|f| f.to_bits()).collect();
        let mut tables = self
            .rope_tables
            .lock()
            .map_err(|_| anyhow!("rotary table cache lock poisoned"))?;
        if let Some(t) = tables.get(&key) {
            return Ok(t.clone());
        }
        let table = self
            .stream()
            .clone_htod(inv_freq)
            .map_err(|e| anyhow!("copy to the GPU failed: {e:?}"))?;
        let table = Arc::new(table);
        tables.insert(key, table.clone());
        Ok(table)
    }

    /// `tokens` on the device, each checked to be below `vocab`.
    fn tokens(&self, tokens: &[u32], vocab: usize, what: &str) -> Result<CudaSlice<u32>> {
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("{what} {t} is outside the vocabulary of {vocab}");
        }
        self.stream()
            .clone_htod(tokens)
            .map_err(|e| anyhow!("copy to the GPU failed: {e:?}"))
    }
}

/// Rows of a `[rows, dim]` table of `len` elements, or a sentence when `dim` does not divide it.
fn table_rows(len: usize, dim: usize, what: &str) -> Result<usize> {
    if dim == 0 || !len.is_multiple_of(dim) {
        bail!("{what} of {len} elements is not a table of rows of width {dim}");
    }
    Ok(len / dim)
}

impl Ops for CudaOps {
    type T = Tensor;

    fn upload(&self, host: &[f32]) -> Result<Tensor> {
        Backend::upload(&self.backend, host)
    }

    fn upload_state(&self, host: &[f32]) -> Result<Tensor> {
        self.backend.upload_f32(host)
    }

    fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        Backend::download(&self.backend, t)
    }

    fn master_of(&self, param: &Tensor) -> Result<Tensor> {
        if !self.dtype().master_is_low_half() {
            return f32_copy(self, param);
        }
        // The weights are exact: their low halves are zero.
        Ok(self.half(self.zeroed::<u16>(param.len())?))
    }

    fn upload_master(&self, exact: &[f32]) -> Result<Tensor> {
        if !self.dtype().master_is_low_half() {
            return self.upload_state(exact);
        }
        self.backend.upload_bits(exact, |x| master_split(x).1)
    }

    fn upload_exact(&self, exact: &[f32]) -> Result<Tensor> {
        if !self.dtype().master_is_low_half() {
            return self.upload(exact);
        }
        self.backend.upload_bits(exact, |x| master_split(x).0)
    }

    fn exact_of(&self, param: &Tensor, master: &Tensor) -> Result<Option<Tensor>> {
        let Tensor::Half { data: low, .. } = master else {
            return Ok(None);
        };
        let len = param.len();
        let Tensor::Half { data: hi, .. } = param else {
            bail!("a weight with a 16-bit master must be bf16, not f32");
        };
        check_low_half(low, len)?;
        let mut out = self.output::<f32>(len)?;
        let n = len as i64;
        let mut b = self.kernels.builder(Kernel::MasterJoin);
        b.arg(hi).arg(low).arg(&mut out).arg(&n);
        self.kernels
            .run(Kernel::MasterJoin, b, elementwise_config(len))?;
        Ok(Some(Tensor::F32(out)))
    }

    type Host = offload::HostTensor;

    fn stash(&self, t: &Tensor) -> Result<offload::HostTensor> {
        self.streams()?.stash(&self.host, t)
    }

    fn stash_into(&self, t: &Tensor, h: &mut offload::HostTensor) -> Result<()> {
        self.streams()?.stash_into(t, h)
    }

    fn fetch(&self, h: &offload::HostTensor) -> Result<Tensor> {
        self.streams()?.fetch(h)
    }

    fn await_fetches(&self) -> Result<()> {
        self.streams()?.landed()
    }

    fn zeros(&self, len: usize) -> Result<Tensor> {
        Ok(Tensor::F32(self.zeroed(len)?))
    }

    fn scratch(&self, len: usize) -> Result<Tensor> {
        Ok(Tensor::F32(self.output(len)?))
    }

    fn activation_zeros(&self, len: usize) -> Result<Tensor> {
        Ok(self.half(self.zeroed::<u16>(len)?))
    }

    fn random_uniform(&self, len: usize, key: u64, offset: u64, amp: f32) -> Result<Tensor> {
        let mut out = self.output::<u16>(len)?;
        let (n, step) = (len as i64, init::step(amp));
        let mut b = self.kernels.builder(Kernel::Uniform);
        b.arg(&mut out).arg(&n).arg(&key).arg(&offset).arg(&step);
        self.kernels
            .run(Kernel::Uniform, b, elementwise_config(len))?;
        Ok(self.half(out))
    }

    fn len(&self, t: &Tensor) -> usize {
        t.len()
    }

    fn elem_bytes(&self) -> usize {
        2
    }

    fn bytes(&self, t: &Tensor) -> usize {
        let elem = match t {
            Tensor::Half { .. } => 2,
            Tensor::F32(_) => 4,
        };
        t.len() * elem
    }

    fn rows(&self, t: &Tensor, width: usize, start: usize, len: usize) -> Result<Tensor> {
        check_rows(t.len(), width, start, len)?;
        self.backend
            .copy_range(t, start * width..(start + len) * width)
    }

    fn set_rows(&self, dst: &mut Tensor, width: usize, start: usize, src: &Tensor) -> Result<()> {
        check_rows(dst.len(), width, start, src.len() / width.max(1))?;
        self.backend.write_at(dst, start * width, src)
    }

    fn join(&self, parts: &[Tensor]) -> Result<Tensor> {
        self.backend.join(parts)
    }

    fn add_assign(&self, dst: &mut Tensor, src: &Tensor) -> Result<()> {
        let len = dst.len();
        check(dst, self.dtype(), len, "an accumulator")?;
        check(src, self.dtype(), len, "an added tensor")?;
        let n = len as i64;
        let mut b = self.kernels.builder(Kernel::AddAssign);
        push_mut(&mut b, dst);
        push(&mut b, src);
        b.arg(&n);
        self.kernels.run(Kernel::AddAssign, b, shapes::vector(len))
    }

    fn sum_squares(&self, ts: &[&Tensor]) -> Result<f64> {
        // Each tensor's blocks write their partial sums into its own stretch of one buffer,
        // which comes back in one copy: the step waits for the device once.
        let blocks = shapes::REDUCE_BLOCKS;
        let mut partial = self.zeroed::<f64>(ts.len().max(1) * blocks)?;
        for (k, t) in ts.iter().enumerate() {
            check(t, self.dtype(), t.len(), "a summed tensor")?;
            let n = t.len() as i64;
            let mut part = partial.slice_mut(k * blocks..(k + 1) * blocks);
            let mut b = self.kernels.builder(Kernel::SumSquares);
            push(&mut b, t);
            b.arg(&n).arg(&mut part);
            self.kernels
                .run(Kernel::SumSquares, b, shapes::reduce(t.len()))?;
        }
        let host = self
            .stream()
            .clone_dtoh(&partial)
            .map_err(|e| anyhow!("copy from the GPU failed: {e:?}"))?;
        Ok(host.iter().sum())
    }

    fn embed(&self, table: &Tensor, tokens: &[u32], dim: usize) -> Result<Tensor> {
        let vocab = table_rows(table.len(), dim, "the embedding table")?;
        check(table, self.dtype(), table.len(), "the embedding table")?;
        let ids = self.tokens(tokens, vocab, "token")?;
        let len = tokens.len() * dim;
        let mut out = self.output::<u16>(len)?;
        let (rows, d) = (tokens.len() as i64, int(dim, "a width")?);
        let mut b = self.kernels.builder(Kernel::Embed);
        push(&mut b, table);
        b.arg(&ids).arg(&mut out).arg(&rows).arg(&d);
        self.kernels
            .run(Kernel::Embed, b, elementwise_config(len))?;
        Ok(self.half(out))
    }

    fn embed_backward(
        &self,
        dtable: &mut Tensor,
        tokens: &[u32],
        dy: &Tensor,
        dim: usize,
    ) -> Result<()> {
        let vocab = table_rows(dtable.len(), dim, "the embedding gradient")?;
        let len = tokens.len() * dim;
        check(dy, self.dtype(), len, "the embedding's output gradient")?;
        let dtable = f32_mut(dtable, vocab * dim, "the embedding gradient")?;
        let ids = self.tokens(tokens, vocab, "token")?;
        let (rows, d) = (tokens.len() as i64, int(dim, "a width")?);
        let mut b = self.kernels.builder(Kernel::EmbedBackward);
        b.arg(dtable).arg(&ids);
        push(&mut b, dy);
        b.arg(&rows).arg(&d);
        self.kernels
            .run(Kernel::EmbedBackward, b, elementwise_config(len))
    }

    fn linear(
        &self,
        x: Rows<&Tensor>,
        w: &Tensor,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Tensor> {
        let x = self.operand(x, rows, inp, "a linear layer's input")?;
        let w = self.operand(Rows::whole(w), out, inp, "a linear layer's weight")?;
        let mut y = self.output::<u16>(rows * out)?;
        let shape = GemmShape::forward(rows, inp, out);
        self.blas
            .gemm(shape, &w.get(), &x.get(), &mut y, [1.0, 0.0])?;
        Ok(self.half(y))
    }

    fn linear_add(
        &self,
        x: &Tensor,
        w: &Tensor,
        y: Rows<&mut Tensor>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        check_format(y.t, self.dtype(), "a residual stream")?;
        let range = y.range(y.t.len(), rows, out, "a residual stream")?;
        let x = self.operand(Rows::whole(x), rows, inp, "a linear layer's input")?;
        let w = self.operand(Rows::whole(w), out, inp, "a linear layer's weight")?;
        let shape = GemmShape::forward(rows, inp, out);
        self.blas
            .gemm_into(shape, &w.get(), &x.get(), (y.t, range), [1.0, 1.0])
    }

    fn linear_backward(
        &self,
        operands: LinearBackward<'_, Tensor>,
        dx: Rows<&mut Tensor>,
        dw: &mut Tensor,
    ) -> Result<()> {
        let LinearBackward {
            dy,
            x,
            w,
            rows,
            inp,
            out,
            dx_empty,
            dw_empty,
        } = operands;
        let what = "a linear layer's input gradient";
        check_format(dx.t, self.dtype(), what)?;
        let dx_rows = dx.range(dx.t.len(), rows, inp, what)?;
        check(
            dw,
            self.dtype(),
            out * inp,
            "a linear layer's weight gradient",
        )?;
        let dy = self.operand(dy, rows, out, "a linear layer's output gradient")?;
        let x = self.operand(x, rows, inp, "a linear layer's input")?;
        let w = self.operand(Rows::whole(w), out, inp, "a linear layer's weight")?;
        let (w, dy, x) = (w.get(), dy.get(), x.get());
        let shape = GemmShape::input_grad(rows, inp, out);
        let beta = if dx_empty { 0.0 } else { 1.0 };
        self.blas
            .gemm_into(shape, &w, &dy, (dx.t, dx_rows), [1.0, beta])?;
        let shape = GemmShape::weight_grad(rows, inp, out);
        let whole = 0..dw.len();
        let beta = if dw_empty { 0.0 } else { 1.0 };
        self.blas
            .gemm_into(shape, &x, &dy, (dw, whole), [1.0, beta])
    }

    fn rmsnorm(
        &self,
        x: &Tensor,
        w: &Tensor,
        rows: usize,
        dim: usize,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        check(x, self.dtype(), rows * dim, "a norm's input")?;
        check(w, self.dtype(), dim, "a norm's gain")?;
        let mut y = self.output::<u16>(rows * dim)?;
        let mut rstd = self.output::<f32>(rows)?;
        let (n, d, eps) = (rows as i64, int(dim, "a width")?, eps as f32);
        let mut b = self.kernels.builder(Kernel::Rmsnorm);
        push(&mut b, x);
        push(&mut b, w);
        b.arg(&mut y).arg(&mut rstd).arg(&n).arg(&d).arg(&eps);
        self.kernels
            .run(Kernel::Rmsnorm, b, shapes::block_per_row(rows)?)?;
        Ok((self.half(y), Tensor::F32(rstd)))
    }

    fn rmsnorm_backward(
        &self,
        operands: NormBackward<'_, Tensor>,
        dx: &mut Tensor,
        dw: &mut Tensor,
    ) -> Result<()> {
        let NormBackward {
            x,
            w,
            rstd,
            dy,
            rows,
            dim,
        } = operands;
        check(x, self.dtype(), rows * dim, "a norm's input")?;
        check(w, self.dtype(), dim, "a norm's gain")?;
        check(dy, self.dtype(), rows * dim, "a norm's output gradient")?;
        check(dx, self.dtype(), rows * dim, "a norm's input gradient")?;
        let rstd = f32_ref(rstd, rows, "a norm's rstd")?;
        let dw = f32_mut(dw, dim, "a norm's gain gradient")?;
        let (n, d) = (rows as i64, int(dim, "a width")?);
        let mut b = self.kernels.builder(Kernel::RmsnormBackward);
        push(&mut b, x);
        push(&mut b, w);
        b.arg(rstd);
        push(&mut b, dy);
        push_mut(&mut b, dx);
        b.arg(dw).arg(&n).arg(&d);
        self.kernels.run(
            Kernel::RmsnormBackward,
            b,
            shapes::norm_backward(rows, dim)?,
        )
    }

    fn bias_add(&self, y: &mut Tensor, b: &Tensor, rows: usize, width: usize) -> Result<()> {
        let len = rows * width;
        check(y, self.dtype(), len, "a biased projection")?;
        check(b, self.dtype(), width, "a bias")?;
        let (n, w) = (rows as i64, int(width, "a width")?);
        let mut args = self.kernels.builder(Kernel::BiasAdd);
        push_mut(&mut args, y);
        push(&mut args, b);
        args.arg(&n).arg(&w);
        self.kernels
            .run(Kernel::BiasAdd, args, elementwise_config(len))
    }

    fn bias_backward(&self, dy: &Tensor, rows: usize, width: usize, db: &mut Tensor) -> Result<()> {
        check(
            dy,
            self.dtype(),
            rows * width,
            "a biased projection's gradient",
        )?;
        let db = f32_mut(db, width, "a bias gradient")?;
        let (n, w) = (rows as i64, int(width, "a width")?);
        let mut args = self.kernels.builder(Kernel::BiasDw);
        push(&mut args, dy);
        args.arg(db).arg(&n).arg(&w);
        self.kernels
            .run(Kernel::BiasDw, args, shapes::column_sums(width, rows)?)
    }

    fn rope(&self, x: &mut Tensor, call: RopeCall<'_>) -> Result<()> {
        let RopeCall {
            rows,
            heads,
            head_dim,
            positions,
            rotary,
            inverse,
        } = call;
        check(x, self.dtype(), rows * heads * head_dim, "a rotary input")?;
        check_positions(positions, rows)?;
        // The kernel takes at most two runs: rows before `split` sit at start0 + r, the rest at
        // start1 + (r - split).
        let (split, start0, start1) = match positions {
            [] => (0, 0, 0),
            [a] => (a.len, a.start, 0),
            [a, b] => (a.len, a.start, b.start),
            more => bail!(
                "the GPU's rotary embedding takes a worker's rows as at most two runs of positions, not {}",
                more.len()
            ),
        };
        let inv_freq = &rotary.inv_freq;
        if !head_dim.is_multiple_of(2) || inv_freq.len() != head_dim / 2 {
            bail!(
                "rotary embeddings need an even head dim and one frequency per pair, not head dim {head_dim} with {} frequencies",
                inv_freq.len()
            );
        }
        let inv_freq = self.rope_table(inv_freq)?;
        let (n, h, hd) = (
            rows as i64,
            int(heads, "a head count")?,
            int(head_dim, "a head dim")?,
        );
        let (split, start0, start1) = (split as i64, start0 as i64, start1 as i64);
        let (sign, scale) = (if inverse { -1.0f32 } else { 1.0 }, rotary.scale);
        let mut b = self.kernels.builder(Kernel::Rope);
        push_mut(&mut b, x);
        b.arg(inv_freq.as_ref())
            .arg(&n)
            .arg(&h)
            .arg(&hd)
            .arg(&split)
            .arg(&start0)
            .arg(&start1)
            .arg(&sign)
            .arg(&scale);
        self.kernels
            .run(Kernel::Rope, b, shapes::vector(rows * head_dim / 2))
    }

    fn swiglu(&self, g: &Tensor, u: &Tensor) -> Result<Tensor> {
        let len = g.len();
        check(g, self.dtype(), len, "the gate projection")?;
        check(u, self.dtype(), len, "the up projection")?;
        let mut m = self.output::<u16>(len)?;
        let n = len as i64;
        let mut b = self.kernels.builder(Kernel::Swiglu);
        push(&mut b, g);
        push(&mut b, u);
        b.arg(&mut m).arg(&n);
        self.kernels.run(Kernel::Swiglu, b, shapes::vector(len))?;
        Ok(self.half(m))
    }

    fn swiglu_backward(&self, g: &Tensor, u: &Tensor, dm: &Tensor) -> Result<(Tensor, Tensor)> {
        let len = g.len();
        check(g, self.dtype(), len, "the gate projection")?;
        check(u, self.dtype(), len, "the up projection")?;
        check(dm, self.dtype(), len, "the MLP gradient")?;
        let mut dg = self.output::<u16>(len)?;
        let mut du = self.output::<u16>(len)?;
        let n = len as i64;
        let mut b = self.kernels.builder(Kernel::SwigluBackward);
        push(&mut b, g);
        push(&mut b, u);
        push(&mut b, dm);
        b.arg(&mut dg).arg(&mut du).arg(&n);
        self.kernels
            .run(Kernel::SwigluBackward, b, shapes::vector(len))?;
        Ok((self.half(dg), self.half(du)))
    }

    fn cross_entropy(
        &self,
        input: LossInput<'_, Tensor>,
        dw: &mut Tensor,
    ) -> Result<LossOut<Tensor>> {
        let LossInput {
            h,
            w,
            targets,
            dim,
            vocab,
            scale,
        } = input;
        let rows = targets.len();
        check(
            dw,
            self.dtype(),
            vocab * dim,
            "the output projection's gradient",
        )?;
        let h = self.operand(Rows::whole(h), rows, dim, "the final hidden states")?;
        let w = self.operand(Rows::whole(w), vocab, dim, "the output projection")?;
        let (h, w) = (h.get(), w.get());
        let ids = self.tokens(targets, vocab, "target token")?;
        let mut dh = self.output::<f32>(rows * dim)?;
        let mut loss = self.output::<f32>(rows)?;
        let mut argmax = self.output::<u32>(rows)?;
        let most = loss_chunk_rows(vocab).min(rows);
        let mut logits = self.output::<f32>(most * vocab)?;
        let mut dlogits = self.output::<u16>(most * vocab)?;
        let (v, sc) = (int(vocab, "a vocabulary")?, scale as f32);
        for r in loss_chunks(rows, vocab) {
            let n = r.len();
            let hc = h.slice(r.start * dim..r.end * dim);
            let shape = GemmShape::forward(n, dim, vocab);
            self.blas.gemm(shape, &w, &hc, &mut logits, [1.0, 0.0])?;
            let t = ids.slice(r.clone());
            let mut l = loss.slice_mut(r.clone());
            let mut a = argmax.slice_mut(r.clone());
            let mut b = self.kernels.builder(Kernel::XentRows);
            b.arg(&logits)
                .arg(&t)
                .arg(&mut dlogits)
                .arg(&mut l)
                .arg(&mut a);
            b.arg(&v);
            self.kernels
                .run(Kernel::XentRows, b, shapes::block_per_row(n)?)?;
            // The scale enters as the GEMMs' alpha: the 16-bit dlogits stay O(1), far from
            // fp16's underflow (1/tokens would push most of them below it).
            let mut dhc = dh.slice_mut(r.start * dim..r.end * dim);
            let shape = GemmShape::input_grad(n, dim, vocab);
            self.blas.gemm(shape, &w, &dlogits, &mut dhc, [sc, 0.0])?;
            let shape = GemmShape::weight_grad(n, dim, vocab);
            let whole = 0..dw.len();
            self.blas
                .gemm_into(shape, &hc, &dlogits, (&mut *dw, whole), [sc, 1.0])?;
        }
        let err = |e| anyhow!("copy from the GPU failed: {e:?}");
        let loss = self.stream().clone_dtoh(&loss).map_err(err)?;
        let argmax = self.stream().clone_dtoh(&argmax).map_err(err)?;
        Ok(LossOut {
            loss_sum: loss.iter().map(|&l| l as f64).sum(),
            argmax,
            dh: Tensor::F32(dh),
        })
    }

    fn adamw(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        state: AdamState<&mut Tensor>,
        hp: &AdamW,
        at: AdamStep,
        decay: bool,
    ) -> Result<()> {
        let (len, step, dtype) = (param.len(), at.step, self.dtype());
        check(param, dtype, len, "a parameter")?;
        check(grad, dtype, len, "a gradient")?;
        let m = f32_mut(state.m, len, "AdamW's first moment")?;
        let v = f32_mut(state.v, len, "AdamW's second moment")?;
        // A 16-bit master is the low half of a bf16 weight's f32 (`Ops::master_of`).
        let master = match state.master {
            Some(Tensor::Half { data, .. }) => {
                if !dtype.master_is_low_half() || !matches!(param, Tensor::Half { .. }) {
                    bail!(
                        "a 16-bit master is the low half of a bf16 weight's f32, and this weight is not bf16"
                    );
                }
                check_low_half(data, len)?;
                Some(MasterArg::LowHalf(data))
            }
            Some(t) => Some(MasterArg::Copy(f32_mut(t, len, "the master copy")?)),
            None => None,
        };
        let c1 = 1.0 - hp.beta1.powi(step as i32);
        let c2 = 1.0 - hp.beta2.powi(step as i32);
        let wd = if decay { hp.weight_decay } else { 0.0 };
        let scalars =
            [hp.beta1, hp.beta2, c1, c2, hp.lr, hp.eps, wd, at.grad_scale].map(|x| x as f32);
        let n = len as i64;
        let mut b = self.kernels.builder(Kernel::Adamw);
        push_mut(&mut b, param);
        push(&mut b, grad);
        b.arg(m).arg(v);
        // The kernel reads a null master as none: the parameter is updated in place.
        let (null, low_half, copy) = (0u64, 1i32, 0i32);
        match master {
            Some(MasterArg::LowHalf(low)) => b.arg(low).arg(&low_half),
            Some(MasterArg::Copy(f32_copy)) => b.arg(f32_copy).arg(&copy),
            None => b.arg(&null).arg(&copy),
        };
        b.arg(&n);
        for s in &scalars {
            b.arg(s);
        }
        self.kernels.run(Kernel::Adamw, b, shapes::vector(len))
    }
}

/// A bf16 weight's master low halves (`Ops::master_of`) have one element per weight.
fn check_low_half(low: &CudaSlice<u16>, len: usize) -> Result<()> {
    if low.len() != len {
        bail!(
            "the master's low half has {} elements where {len} were expected",
            low.len()
        );
    }
    Ok(())
}

/// The master `adamw` updates, as the kernel takes it.
enum MasterArg<'a> {
    /// A bf16 weight's low halves (`backend::cuda::master_split`).
    LowHalf(&'a mut CudaSlice<u16>),
    /// An f32 copy.
    Copy(&'a mut CudaSlice<f32>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_must_divide_into_rows() {
        assert_eq!(table_rows(12, 4, "t").unwrap(), 3);
        let e = table_rows(12, 5, "the embedding table")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the embedding table of 12 elements is not a table of rows of width 5"
        );
        assert!(table_rows(12, 0, "t").is_err());
    }
}
