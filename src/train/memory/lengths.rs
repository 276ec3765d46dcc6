//! The memory estimate as a device: [`Lengths`] implements `Ops` with tensors that hold only
//! their length and element size, computes nothing and allocates nothing; wrapped in
//! `count::Metered` ([`Lengths::metered`]) it runs the real forward and backward (and AdamW)
//! and the counter's peak is what that step holds on the device it models. Nothing is written
//! twice: the tensors are the ones the model's code makes, at the precision the modelled
//! device gives them, plus the scratch buffers a device allocates inside an op, each listed at
//! the op ([`Precision::Cuda`]: the CUDA backend's casts, loss chunks, rotary table and the
//! attention's moments, `model::cuda::whole_sequence::moments`). The step it runs, and
//! the estimate, are `train::memory::estimate`'s.

use super::count::{Counter, Kind, Metered, check_len};
use crate::model::attention_api::Attention;
use crate::model::cost::loss_chunk_rows;
use crate::model::cuda::whole_sequence::{Call, moments};
use crate::model::ops::{
    AdamState, AdamStep, AdamW, LinearBackward, LossInput, LossOut, NormBackward, Ops, RopeCall,
    Rows, check_positions, check_rows,
};
use crate::shape::Dims;
use anyhow::{Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The device whose memory is modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Every tensor `n` bytes an element and no scratch counted: the CPU backend (`Cpu<f32>`:
    /// 4), whose own peak (`Metered<Cpu>`) this must equal.
    Uniform(usize),
    /// The CUDA backend (`model::cuda`): 16-bit weights and activations, f32 `zeros`, norm
    /// statistics, LSE and the loss's dh, the buffers its ops allocate inside, and AdamW's
    /// masters of `master_bytes` an element (its 16-bit format's, `InputDtype::master_bytes`:
    /// 2 for bf16, whose master is the f32's low half; 4 for fp16).
    Cuda { master_bytes: usize },
}

/// A tensor of the counting device: its length and bytes per element, nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub len: usize,
    pub elem: usize,
}

/// Bytes of a 16-bit and an f32 element on the CUDA backend.
const HALF: usize = 2;
const F32: usize = 4;

/// `Ops` on lengths: each op checks its operands' lengths and returns tensors of the lengths
/// and precisions the modelled device's op returns; scratch goes to `counter` as a spike.
pub struct Lengths {
    precision: Precision,
    counter: Arc<Counter>,
    /// Whether the rotary table (CUDA: `head_dim / 2` f32, uploaded once and kept) is counted.
    rope_table: AtomicBool,
}

impl Lengths {
    /// A counting device modelling `precision`'s device.
    pub fn new(precision: Precision) -> Lengths {
        Lengths {
            precision,
            counter: Arc::new(Counter::default()),
            rope_table: AtomicBool::new(false),
        }
    }

    /// This device with every tensor counted, in the counter its scratch goes to.
    pub fn metered(&self) -> Metered<'_, Lengths> {
        Metered {
            inner: self,
            instrument: self.counter.clone(),
        }
    }

    /// The counter every tensor of this device (and its scratch) is counted in.
    pub fn counter(&self) -> &Arc<Counter> {
        &self.counter
    }

    fn cuda(&self) -> bool {
        matches!(self.precision, Precision::Cuda { .. })
    }

    /// A tensor of `len` elements as this device makes it: f32 when `wide` (statistics,
    /// accumulators), in the modelled device's precision of activations otherwise.
    pub fn shape_of(&self, len: usize, wide: bool) -> Shape {
        let elem = match self.precision {
            Precision::Uniform(n) => n,
            Precision::Cuda { .. } if wide => F32,
            Precision::Cuda { .. } => HALF,
        };
        Shape { len, elem }
    }

    /// A 16-bit tensor on the CUDA backend.
    fn half(&self, len: usize) -> Shape {
        self.shape_of(len, false)
    }

    /// An f32 tensor on the CUDA backend.
    fn wide(&self, len: usize) -> Shape {
        self.shape_of(len, true)
    }

    /// AdamW's master of `len` 16-bit weights, as the device keeps it (`Ops::master_of`).
    fn master(&self, len: usize) -> Shape {
        match self.precision {
            Precision::Uniform(n) => Shape { len, elem: n },
            Precision::Cuda { master_bytes } => Shape {
                len,
                elem: master_bytes,
            },
        }
    }

    /// The CUDA backend's 16-bit copy of an f32 GEMM operand (`CudaOps::operand`).
    fn cast(&self, t: &Shape) -> usize {
        self.cast_part(t, t.len)
    }

    /// [`Lengths::cast`] of `len` of `t`'s elements (the rows a product reads).
    fn cast_part(&self, t: &Shape, len: usize) -> usize {
        match self.cuda() && t.elem == F32 {
            true => len * HALF,
            false => 0,
        }
    }

    /// Notes a moment with the op `what`'s `scratch` bytes beside the live tensors and `out`,
    /// the op's results.
    fn spike(&self, what: &'static str, scratch: usize, out: &[&Shape]) {
        if scratch > 0 {
            let out: usize = out.iter().map(|t| t.len * t.elem).sum();
            self.counter.spike(scratch + out, what);
        }
    }
}

impl Ops for Lengths {
    type T = Shape;

    fn upload(&self, host: &[f32]) -> Result<Shape> {
        Ok(self.half(host.len()))
    }

    fn upload_state(&self, host: &[f32]) -> Result<Shape> {
        Ok(self.wide(host.len()))
    }

    fn master_of(&self, param: &Shape) -> Result<Shape> {
        Ok(self.master(param.len))
    }

    fn upload_master(&self, exact: &[f32]) -> Result<Shape> {
        Ok(self.master(exact.len()))
    }

    fn exact_of(&self, param: &Shape, master: &Shape) -> Result<Option<Shape>> {
        Ok((master.elem < F32).then(|| self.wide(param.len)))
    }

    /// Zeros: nothing was computed.
    fn download(&self, t: &Shape) -> Result<Vec<f32>> {
        Ok(vec![0.0; t.len])
    }

    type Host = Shape;

    fn stash(&self, t: &Shape) -> Result<Shape> {
        Ok(*t)
    }

    fn stash_into(&self, t: &Shape, h: &mut Shape) -> Result<()> {
        check_len("a stashed tensor", t.len, h.len)?;
        *h = *t;
        Ok(())
    }

    fn fetch(&self, h: &Shape) -> Result<Shape> {
        Ok(*h)
    }

    fn await_fetches(&self) -> Result<()> {
        Ok(())
    }

    fn zeros(&self, len: usize) -> Result<Shape> {
        Ok(self.wide(len))
    }

    fn scratch(&self, len: usize) -> Result<Shape> {
        Ok(self.wide(len))
    }

    fn activation_zeros(&self, len: usize) -> Result<Shape> {
        Ok(self.half(len))
    }

    fn random_uniform(&self, len: usize, _: u64, _: u64, _: f32) -> Result<Shape> {
        Ok(self.half(len))
    }

    fn len(&self, t: &Shape) -> usize {
        t.len
    }

    fn elem_bytes(&self) -> usize {
        match self.precision {
            Precision::Uniform(n) => n,
            Precision::Cuda { .. } => HALF,
        }
    }

    fn bytes(&self, t: &Shape) -> usize {
        t.len * t.elem
    }

    fn rows(&self, t: &Shape, width: usize, start: usize, len: usize) -> Result<Shape> {
        check_rows(t.len, width, start, len)?;
        Ok(Shape {
            len: len * width,
            elem: t.elem,
        })
    }

    fn set_rows(&self, dst: &mut Shape, width: usize, start: usize, src: &Shape) -> Result<()> {
        check_rows(dst.len, width, start, src.len / width.max(1))
    }

    fn join(&self, parts: &[Shape]) -> Result<Shape> {
        let Some(first) = parts.first() else {
            bail!("no parts to join");
        };
        Ok(Shape {
            len: parts.iter().map(|p| p.len).sum(),
            elem: first.elem,
        })
    }

    fn add_assign(&self, dst: &mut Shape, src: &Shape) -> Result<()> {
        check_len("an added tensor", src.len, dst.len)
    }

    fn sum_squares(&self, _: &[&Shape]) -> Result<f64> {
        Ok(0.0)
    }

    fn embed(&self, table: &Shape, tokens: &[u32], dim: usize) -> Result<Shape> {
        if dim == 0 || !table.len.is_multiple_of(dim) {
            bail!(
                "the embedding table of {} elements is not a table of rows of width {dim}",
                table.len
            );
        }
        Ok(self.half(tokens.len() * dim))
    }

    fn embed_backward(
        &self,
        dtable: &mut Shape,
        tokens: &[u32],
        dy: &Shape,
        dim: usize,
    ) -> Result<()> {
        check_len(
            "the embedding's output gradient",
            dy.len,
            tokens.len() * dim,
        )?;
        check_rows(dtable.len, dim, 0, 0)
    }

    fn linear(
        &self,
        x: Rows<&Shape>,
        w: &Shape,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Shape> {
        let xs = x.range(x.t.len, rows, inp, "a linear layer's input")?;
        check_len("a linear layer's weight", w.len, out * inp)?;
        let y = self.half(rows * out);
        let scratch = self.cast_part(x.t, xs.len()) + self.cast(w);
        self.spike("linear scratch", scratch, &[&y]);
        Ok(y)
    }

    fn linear_add(
        &self,
        x: &Shape,
        w: &Shape,
        y: Rows<&mut Shape>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<()> {
        check_len("a linear layer's input", x.len, rows * inp)?;
        check_len("a linear layer's weight", w.len, out * inp)?;
        y.range(y.t.len, rows, out, "a residual stream")?;
        self.spike("linear_add scratch", self.cast(x) + self.cast(w), &[]);
        Ok(())
    }

    fn linear_backward(
        &self,
        operands: LinearBackward<'_, Shape>,
        dx: Rows<&mut Shape>,
        dw: &mut Shape,
    ) -> Result<()> {
        let LinearBackward {
            dy,
            x,
            w,
            rows,
            inp,
            out,
            dx_empty: _,
            dw_empty: _,
        } = operands;
        let dys = dy.range(dy.t.len, rows, out, "a linear layer's output gradient")?;
        let xs = x.range(x.t.len, rows, inp, "a linear layer's input")?;
        check_len("a linear layer's weight", w.len, out * inp)?;
        dx.range(dx.t.len, rows, inp, "a linear layer's input gradient")?;
        check_len("a linear layer's weight gradient", dw.len, out * inp)?;
        self.spike(
            "linear_backward scratch",
            self.cast_part(dy.t, dys.len()) + self.cast_part(x.t, xs.len()) + self.cast(w),
            &[],
        );
        Ok(())
    }

    fn bias_add(&self, y: &mut Shape, b: &Shape, rows: usize, width: usize) -> Result<()> {
        check_len("a biased projection", y.len, rows * width)?;
        check_len("a bias", b.len, width)
    }

    fn bias_backward(&self, dy: &Shape, rows: usize, width: usize, db: &mut Shape) -> Result<()> {
        check_len("a bias's output gradient", dy.len, rows * width)?;
        check_len("a bias's gradient", db.len, width)
    }

    fn rmsnorm(
        &self,
        x: &Shape,
        w: &Shape,
        rows: usize,
        dim: usize,
        _: f64,
    ) -> Result<(Shape, Shape)> {
        check_len("a norm's input", x.len, rows * dim)?;
        check_len("a norm's gain", w.len, dim)?;
        Ok((self.half(rows * dim), self.wide(rows)))
    }

    fn rmsnorm_backward(
        &self,
        operands: NormBackward<'_, Shape>,
        dx: &mut Shape,
        dw: &mut Shape,
    ) -> Result<()> {
        let NormBackward {
            x,
            w,
            rstd,
            dy,
            rows,
            dim,
        } = operands;
        check_len("a norm's input", x.len, rows * dim)?;
        check_len("a norm's gain", w.len, dim)?;
        check_len("a norm's statistics", rstd.len, rows)?;
        check_len("a norm's output gradient", dy.len, rows * dim)?;
        check_len("a norm's input gradient", dx.len, rows * dim)?;
        check_len("a norm's gain gradient", dw.len, dim)
    }

    fn rope(&self, x: &mut Shape, call: RopeCall<'_>) -> Result<()> {
        let RopeCall {
            rows,
            heads,
            head_dim,
            positions,
            ..
        } = call;
        check_len("a rotary input", x.len, rows * heads * head_dim)?;
        check_positions(positions, rows)?;
        if self.cuda() && !self.rope_table.swap(true, Ordering::Relaxed) {
            // `CudaOps::rope_table`: uploaded on first use and kept for the run.
            self.counter.keep(Kind::Step, F32 * (head_dim / 2));
        }
        Ok(())
    }

    fn swiglu(&self, g: &Shape, u: &Shape) -> Result<Shape> {
        check_len("the up projection", u.len, g.len)?;
        Ok(self.half(g.len))
    }

    fn swiglu_backward(&self, g: &Shape, u: &Shape, dm: &Shape) -> Result<(Shape, Shape)> {
        check_len("the up projection", u.len, g.len)?;
        check_len("the MLP gradient", dm.len, g.len)?;
        Ok((self.half(g.len), self.half(g.len)))
    }

    fn cross_entropy(&self, input: LossInput<'_, Shape>, dw: &mut Shape) -> Result<LossOut<Shape>> {
        let LossInput {
            h,
            w,
            targets,
            dim,
            vocab,
            ..
        } = input;
        let rows = targets.len();
        check_len("the final hidden states", h.len, rows * dim)?;
        check_len("the output projection", w.len, vocab * dim)?;
        check_len("the output projection's gradient", dw.len, vocab * dim)?;
        let dh = self.wide(rows * dim);
        if self.cuda() {
            // `CudaOps::cross_entropy`: the target ids, per-row loss and argmax (4 bytes each),
            // one chunk's f32 logits and 16-bit dlogits, and any 16-bit copies of f32 operands.
            let most = loss_chunk_rows(vocab).min(rows);
            let scratch = 3 * 4 * rows + most * vocab * (F32 + HALF);
            self.spike(
                "cross_entropy scratch",
                scratch + self.cast(h) + self.cast(w),
                &[&dh],
            );
        }
        Ok(LossOut {
            loss_sum: 0.0,
            argmax: vec![0; rows],
            dh,
        })
    }

    fn adamw(
        &self,
        param: &mut Shape,
        grad: &Shape,
        state: AdamState<&mut Shape>,
        _: &AdamW,
        _: AdamStep,
        _: bool,
    ) -> Result<()> {
        check_len("a gradient", grad.len, param.len)?;
        check_len("AdamW's first moment", state.m.len, param.len)?;
        check_len("AdamW's second moment", state.v.len, param.len)?;
        match state.master {
            Some(master) => check_len("the master copy", master.len, param.len),
            None => Ok(()),
        }
    }
}

/// The attention of the counting device: O and LSE, and dQ, dK, dV, of the lengths the model's
/// attention returns (O and the gradients 16-bit, LSE f32, one a row and head), with the CUDA
/// attention's workspace as a spike under [`Precision::Cuda`].
pub struct CountingAttention<'d> {
    pub device: &'d Lengths,
    pub dims: Dims,
    pub rows: usize,
}

impl CountingAttention<'_> {
    fn check(&self, q: &Shape, k: &Shape, v: &Shape) -> Result<()> {
        let d = self.dims;
        check_len("the attention's Q", q.len, self.rows * d.heads * d.head_dim)?;
        check_len(
            "the attention's K",
            k.len,
            self.rows * d.kv_heads * d.head_dim,
        )?;
        check_len("the attention's V", v.len, k.len)
    }

    /// Each of the call's moments on the GPU (`moments`): its own buffers, with the returned
    /// tensors that exist by then (its `held` of `returned`) on top.
    fn spike_moments(&self, call: Call, returned: &[&Shape]) {
        if !self.device.cuda() {
            return;
        }
        let what = match call {
            Call::Forward => "attention workspace",
            Call::Backward { .. } => "attention_backward workspace",
        };
        for m in moments(&self.dims, self.rows, call) {
            let held: Vec<&Shape> = m.held.iter().map(|&i| returned[i]).collect();
            self.device.spike(what, m.bytes, &held);
        }
    }
}

impl Attention<Shape> for CountingAttention<'_> {
    fn forward(&mut self, q: &Shape, k: &Shape, v: &Shape) -> Result<(Shape, Shape)> {
        self.check(q, k, v)?;
        let o = self.device.half(q.len);
        let lse = self.device.wide(self.rows * self.dims.heads);
        self.spike_moments(Call::Forward, &[&o, &lse]);
        Ok((o, lse))
    }

    fn backward(
        &mut self,
        q: &Shape,
        k: &Shape,
        v: &Shape,
        o: &Shape,
        lse: &Shape,
        dout: &Shape,
    ) -> Result<(Shape, Shape, Shape)> {
        self.check(q, k, v)?;
        check_len("the attention's O", o.len, q.len)?;
        check_len("the attention's dO", dout.len, q.len)?;
        check_len("the attention's LSE", lse.len, self.rows * self.dims.heads)?;
        let (dq, dk, dv) = (
            self.device.half(q.len),
            self.device.half(k.len),
            self.device.half(v.len),
        );
        let call = Call::Backward {
            dout_f32: dout.elem == 4,
        };
        self.spike_moments(call, &[&dq, &dk, &dv]);
        Ok((dq, dk, dv))
    }
}
