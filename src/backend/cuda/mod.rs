//! The CUDA backend: FlashAttention block kernels on one GPU.
//!
//! Kernels are the CUDA C sources in `kernels/`, compiled at run time by NVRTC for the device's
//! compute capability (see `compile`). Two families: FlashAttention-2 style kernels on per-warp
//! `mma.sync` for every GPU from compute capability 8.0, and on H100/H200 (9.0) kernels on
//! Hopper's warpgroup MMA (`wgmma`, 1.5× faster there at head dim 128), chosen by
//! [`Tuning::for_device`]. cudarc loads the driver and NVRTC dynamically, so the
//! crate builds and its tests run on machines without CUDA; [`CudaBackend::new`] checks for the
//! driver first and answers with a sentence instead of a panic.
//!
//! Precision: Q, K, V and dO live on the device in the *input dtype* (bf16 or fp16, chosen at
//! construction); the matrix products run on tensor cores with f32 accumulation. Running
//! statistics, accumulators, partial outputs of the block API and all gradients are f32, so
//! merging partials from several workers loses nothing. The whole-sequence fast path
//! ([`CudaBackend::causal_forward`]) writes O in the input dtype, as the next layer of a model
//! consumes it, and LSE in f32.
//!
//! Two ways in:
//! - the [`Backend`] block API (`forward_block` folds a block into an f32 running state in
//!   place, `backward_block` accumulates f32 gradients with atomics or bulk reductions), which
//!   `exec` drives for distributed schedules;
//! - [`CudaBackend::causal_forward`] / [`CudaBackend::causal_backward`]: a whole causal sequence
//!   in one forward launch (state in registers, O and LSE written once) and one backward launch
//!   (plus the D = rowsum(dO∘O) pre-pass), for single-GPU training and benchmarks.
//!
//! Shapes: head dim 64 or 128 (others are refused with a sentence), bf16 or fp16, any batch,
//! MHA/GQA/MQA, any lengths (tiles past the end are zero-filled and masked). Kernel tile shapes
//! are a [`Tuning`], by default the fastest measured on an H200 for the head dim; numbers and
//! history in `bench/kernel-notes.md`.

mod compile;
mod launch;
mod layout;
mod memory;
mod timing;
mod tma;

pub use timing::{AttentionTiming, median_ms, time_attention};

pub use launch::{HEAD_DIMS, Tuning};
pub use layout::Order;
pub use memory::DeviceMemory;

use super::Backend;
use crate::attn::{Block, Grads, GradsMut, Partial, QuerySide, RunningState};
use crate::shape::{Dims, Span};
use anyhow::{Result, bail};
use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchArgs, LaunchConfig,
    PushKernelArg,
};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// 16-bit floating-point format of the inputs (Q, K, V, dO) on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputDtype {
    Bf16,
    F16,
}

impl InputDtype {
    /// Converts f32 to this format's bit pattern (round to nearest even).
    fn encode(self, x: f32) -> u16 {
        match self {
            InputDtype::Bf16 => half::bf16::from_f32(x).to_bits(),
            InputDtype::F16 => half::f16::from_f32(x).to_bits(),
        }
    }

    fn decode(self, bits: u16) -> f32 {
        match self {
            InputDtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
            InputDtype::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// `x` as the device will see it after upload: rounded to this format and back.
    pub fn round(self, x: f32) -> f32 {
        self.decode(self.encode(x))
    }

    /// Name as written on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            InputDtype::Bf16 => "bf16",
            InputDtype::F16 => "fp16",
        }
    }
}

impl std::str::FromStr for InputDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bf16" | "bfloat16" => Ok(InputDtype::Bf16),
            "fp16" | "f16" | "float16" | "half" => Ok(InputDtype::F16),
            _ => bail!("unknown input dtype {s:?}: use bf16 or fp16"),
        }
    }
}

/// A tensor on the GPU: 16-bit inputs (raw bits, tagged with their format) or f32 statistics,
/// accumulators and gradients. Cloning copies the device buffer (the model's `Ops` needs it).
#[derive(Clone, Debug)]
pub enum Tensor {
    /// Q, K, V, dO, and O of the fast path: the kernels read the bits as bf16 or fp16.
    Half {
        dtype: InputDtype,
        data: CudaSlice<u16>,
    },
    /// Everything kept in full precision (m, l, acc, LSE, D, block-API O, gradients).
    F32(CudaSlice<f32>),
}

impl Tensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Tensor::Half { data, .. } => data.len(),
            Tensor::F32(data) => data.len(),
        }
    }

    /// True for a tensor of no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn kind(&self) -> Kind {
        match self {
            Tensor::Half { dtype, .. } => Kind::Half(*dtype),
            Tensor::F32(_) => Kind::F32,
        }
    }

    fn describe(&self) -> String {
        format!("{} tensor of {}", self.kind().a(), self.len())
    }
}

/// Element type of a [`Tensor`], so shape checks are plain data (and testable without a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Half(InputDtype),
    F32,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Half(d) => d.name(),
            Kind::F32 => "f32",
        }
    }

    /// "a bf16", "an f32": the name with its article.
    fn a(self) -> String {
        let article = if self == Kind::F32 { "an" } else { "a" };
        format!("{article} {}", self.name())
    }
}

/// One sentence when an argument has the wrong element type or length.
fn expect(found: (Kind, usize), want: (Kind, usize), what: &str) -> Result<()> {
    if found != want {
        bail!(
            "{what} must be {} tensor of {} elements, got {} tensor of {}",
            want.0.a(),
            want.1,
            found.0.a(),
            found.1
        );
    }
    Ok(())
}

// The model ops (`model::cuda`) compile their kernels through the same NVRTC cache and launch
// their elementwise and per-row kernels with the same shapes.
pub(crate) use compile::compile_cached;
pub(crate) use launch::{elementwise_config, rows_config};

/// Checks that `t` is a 16-bit tensor of the backend's dtype with `len` elements.
fn half<'a>(
    t: &'a Tensor,
    dtype: InputDtype,
    len: usize,
    what: &str,
) -> Result<&'a CudaSlice<u16>> {
    expect((t.kind(), t.len()), (Kind::Half(dtype), len), what)?;
    match t {
        Tensor::Half { data, .. } => Ok(data),
        Tensor::F32(_) => bail!("{what} must be a {} tensor", dtype.name()),
    }
}

fn f32_ref<'a>(t: &'a Tensor, len: usize, what: &str) -> Result<&'a CudaSlice<f32>> {
    expect((t.kind(), t.len()), (Kind::F32, len), what)?;
    match t {
        Tensor::F32(data) => Ok(data),
        Tensor::Half { .. } => bail!("{what} must be an f32 tensor"),
    }
}

fn f32_mut<'a>(t: &'a mut Tensor, len: usize, what: &str) -> Result<&'a mut CudaSlice<f32>> {
    f32_ref(t, len, what)?; // validates, with the sentence
    match t {
        Tensor::F32(data) => Ok(data),
        Tensor::Half { .. } => bail!("{what} must be an f32 tensor"),
    }
}

/// The error a machine without the CUDA driver gets, before cudarc could panic on it.
fn require_driver() -> Result<()> {
    // SAFETY: only probes whether the driver library can be opened; no CUDA call is made.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        bail!("no CUDA driver found; use --device cpu")
    }
}

/// The kernels of one (head dim, dtype, backward warps) variant, loaded into the context.
struct Kernels {
    fwd_final: CudaFunction,
    fwd_state: CudaFunction,
    bwd_block: CudaFunction,
    fill_f32: CudaFunction,
    add_f32: CudaFunction,
    finalize_rows: CudaFunction,
    merge_rows: CudaFunction,
    delta_f32: CudaFunction,
    delta_half: CudaFunction,
    relayout_half: CudaFunction,
    relayout_f32_half: CudaFunction,
}

/// One GPU running attention blocks; see the module docs for precision and entry points.
pub struct CudaBackend {
    ordinal: usize,
    dtype: InputDtype,
    /// `None`: the per-head-dim default ([`Tuning::for_head_dim`]).
    tuning: Option<Tuning>,
    capability: (i32, i32),
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Mutex<HashMap<usize, Arc<Kernels>>>,
}

impl CudaBackend {
    /// Opens GPU `ordinal` with inputs stored as `dtype`. Fails with a sentence when there is no
    /// driver, no such device, or a device older than compute capability 8.0 (the kernels use
    /// bf16 tensor cores and `cp.async`).
    pub fn new(ordinal: usize, dtype: InputDtype) -> Result<Self> {
        require_driver()?;
        let count = CudaContext::device_count()
            .map_err(|e| anyhow::anyhow!("could not count the CUDA devices: {e:?}"))?;
        if ordinal >= count.max(0) as usize {
            bail!(
                "GPU {ordinal} was asked for but this machine has {count}; start at most {count} GPU processes per node (one per GPU)"
            );
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| anyhow::anyhow!("could not open CUDA device {ordinal}: {e:?}"))?;
        let capability = ctx
            .compute_capability()
            .map_err(|e| anyhow::anyhow!("could not query CUDA device {ordinal}: {e:?}"))?;
        if capability.0 < 8 {
            bail!(
                "CUDA device {ordinal} has compute capability {}.{}; the attention kernels need 8.0 or newer",
                capability.0,
                capability.1
            );
        }
        let stream = ctx.default_stream();
        let backend = CudaBackend {
            ordinal,
            dtype,
            tuning: None,
            capability,
            ctx,
            stream,
            kernels: Mutex::new(HashMap::new()),
        };
        backend.keep_freed_memory()?;
        Ok(backend)
    }

    /// Selects another kernel shape variant for every head dim (see [`Tuning`]); for re-tuning
    /// on other GPUs.
    pub fn with_tuning(mut self, tuning: Tuning) -> Result<Self> {
        tuning.validate()?;
        self.tuning = Some(tuning);
        self.kernels
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel cache lock poisoned"))?
            .clear();
        Ok(self)
    }

    /// The kernel shape variant used for `head_dim` on this device.
    pub fn tuning(&self, head_dim: usize) -> Tuning {
        self.tuning
            .unwrap_or_else(|| Tuning::for_head_dim(head_dim))
            .for_device(head_dim, self.capability)
    }

    /// The input dtype chosen at construction.
    pub fn dtype(&self) -> InputDtype {
        self.dtype
    }

    /// The stream every kernel of this backend runs on (for events and timing).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies host f32 data to the device as an f32 tensor (statistics, accumulators), where
    /// [`Backend::upload`] would round to the input dtype.
    pub fn upload_f32(&self, host: &[f32]) -> Result<Tensor> {
        let data = self
            .stream
            .clone_htod(host)
            .map_err(|e| anyhow::anyhow!("copy to the GPU failed: {e:?}"))?;
        Ok(Tensor::F32(data))
    }

    /// Waits until all queued work is done; surfaces asynchronous kernel errors.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| anyhow::anyhow!("CUDA device {} failed: {e:?}", self.ordinal))
    }

    /// Compiles (or takes from the cache) and loads the kernels for `head_dim`.
    fn kernels(&self, head_dim: usize) -> Result<Arc<Kernels>> {
        let mut map = self
            .kernels
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel cache lock poisoned"))?;
        if let Some(k) = map.get(&head_dim) {
            return Ok(k.clone());
        }
        let tuning = self.tuning(head_dim);
        let source = compile::kernel_source(head_dim, self.dtype == InputDtype::Bf16, &tuning);
        let ptx = compile::compile_cached(&source, self.capability.0, self.capability.1)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| anyhow::anyhow!("the CUDA driver rejected the compiled kernels: {e:?}"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| anyhow::anyhow!("kernel {name} missing from the module: {e:?}"))
        };
        let kernels = Kernels {
            fwd_final: f("fwd_final")?,
            fwd_state: f("fwd_state")?,
            bwd_block: f("bwd_block")?,
            fill_f32: f("fill_f32")?,
            add_f32: f("add_f32")?,
            finalize_rows: f("finalize_rows")?,
            merge_rows: f("merge_rows")?,
            delta_f32: f("delta_f32")?,
            delta_half: f("delta_half")?,
            relayout_half: f("relayout_half")?,
            relayout_f32_half: f("relayout_f32_half")?,
        };
        let forward = launch::forward_smem(head_dim, &tuning);
        let smem = [
            (&kernels.fwd_final, forward),
            (&kernels.fwd_state, forward),
            (&kernels.bwd_block, launch::backward_smem(head_dim, &tuning)),
        ];
        for (func, bytes) in smem {
            func.set_attribute(
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| {
                anyhow::anyhow!("device refuses {bytes} bytes of shared memory per block: {e:?}")
            })?;
        }
        let kernels = Arc::new(kernels);
        map.insert(head_dim, kernels.clone());
        Ok(kernels)
    }

    fn launch(&self, what: &str, mut args: LaunchArgs<'_>, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: every launch site pushes exactly the arguments of the kernel's C signature
        // (device pointers from `CudaSlice`s whose lengths were validated against the shapes the
        // kernel indexes, then 32-bit ints, 64-bit lengths and f32 scalars in order), and `cfg`
        // comes from `launch`, whose shared-memory sizes match the kernels' tile layouts.
        unsafe { args.launch(cfg) }
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("launching {what} failed: {e:?}"))
    }

    /// Q, K and V of `block` as the kernels read them, each checked for dtype and size.
    fn block_qkv<'t>(
        &self,
        dims: &Dims,
        block: Block,
        q: &'t Tensor,
        k: &'t Tensor,
        v: &'t Tensor,
    ) -> Result<[&'t CudaSlice<u16>; 3]> {
        let (dt, qn, kvn) = (self.dtype, block.q.len, block.kv.len);
        Ok([
            half(q, dt, dims.q_len(qn), "Q")?,
            half(k, dt, dims.kv_len(kvn), "K")?,
            half(v, dt, dims.kv_len(kvn), "V")?,
        ])
    }

    /// The tensor maps the wgmma forward loads Q, K and V of `block` through (`tma`); none for
    /// the mma.sync kernel, which loads with cp.async.
    fn forward_maps(
        &self,
        dims: &Dims,
        block: Block,
        [q, k, v]: [&CudaSlice<u16>; 3],
        tuning: &Tuning,
    ) -> Result<Option<[tma::TensorMap; 3]>> {
        if !tuning.fwd_wgmma {
            return Ok(None);
        }
        let rows = launch::WGMMA_FWD_ROWS;
        let q_shape =
            tma::TileMapShape::new(dims.batch * dims.heads, block.q.len, dims.head_dim, rows)?;
        let kv_shape = tma::TileMapShape::new(
            dims.batch * dims.kv_heads,
            block.kv.len,
            dims.head_dim,
            rows,
        )?;
        let bf16 = self.dtype == InputDtype::Bf16;
        let ptr = |t: &CudaSlice<u16>| t.device_ptr(&self.stream).0;
        Ok(Some([
            q_shape.encode(ptr(q), bf16)?,
            kv_shape.encode(ptr(k), bf16)?,
            kv_shape.encode(ptr(v), bf16)?,
        ]))
    }

    fn alloc_f32(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.stream
            .alloc_zeros::<f32>(len)
            .map_err(|e| anyhow::anyhow!("could not allocate {len} f32 on the GPU: {e:?}"))
    }

    fn alloc_half(&self, len: usize) -> Result<Tensor> {
        let data = self.stream.alloc_zeros::<u16>(len).map_err(|e| {
            anyhow::anyhow!("could not allocate {len} 16-bit values on the GPU: {e:?}")
        })?;
        Ok(Tensor::Half {
            dtype: self.dtype,
            data,
        })
    }

    fn fill(&self, k: &Kernels, x: &mut CudaSlice<f32>, value: f32) -> Result<()> {
        let n = x.len() as i64;
        let mut b = self.stream.launch_builder(&k.fill_f32);
        b.arg(x).arg(&value).arg(&n);
        self.launch("fill_f32", b, launch::elementwise_config(n as usize))
    }

    /// Forward of `block` writing a finished (O in the input dtype, LSE f32) result directly:
    /// the running state never leaves registers.
    fn forward_final(
        &self,
        dims: &Dims,
        block: Block,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Partial<Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim)?;
        let (dt, qn) = (self.dtype, block.q.len);
        let [q, k, v] = self.block_qkv(dims, block, q, k, v)?;
        half(&out.out, dt, dims.q_len(qn), "O")?; // validates, with the sentence
        let Tensor::Half { data: o, .. } = &mut out.out else {
            bail!("O must be a {} tensor", dt.name());
        };
        let lse = f32_mut(&mut out.lse, dims.stat_len(qn), "LSE")?;
        let tuning = self.tuning(dims.head_dim);
        let cfg = launch::forward_config(dims, qn, &tuning)?;
        let geometry = ForwardGeometry::new(dims, block)?;
        let maps = self.forward_maps(dims, block, [q, k, v], &tuning)?;
        let mut b = self.stream.launch_builder(&kern.fwd_final);
        b.arg(q).arg(k).arg(v).arg(o).arg(lse);
        geometry.push(&mut b);
        push_maps(&mut b, &maps);
        self.launch("the attention forward", b, cfg)
    }

    /// Whole-sequence causal attention forward: Q `[b, h, seq, d]`, K and V `[b, kv_h, seq, d]`
    /// in the input dtype. Returns O (input dtype, head-major) and LSE (f32, natural log).
    pub fn causal_forward(
        &self,
        dims: &Dims,
        seq: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Partial<Tensor>> {
        let mut out = Partial {
            out: self.alloc_half(dims.q_len(seq))?,
            lse: Tensor::F32(self.alloc_f32(dims.stat_len(seq))?),
        };
        self.causal_forward_into(dims, seq, q, k, v, &mut out)?;
        Ok(out)
    }

    /// [`Self::causal_forward`] into caller-owned buffers (no allocation: for training loops
    /// and timing). Every element of `out` is overwritten.
    pub fn causal_forward_into(
        &self,
        dims: &Dims,
        seq: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &mut Partial<Tensor>,
    ) -> Result<()> {
        let whole = Span { start: 0, len: seq };
        self.forward_final(
            dims,
            Block {
                q: whole,
                kv: whole,
            },
            q,
            k,
            v,
            out,
        )
    }

    /// Whole-sequence causal attention backward from the forward's O and LSE. Returns dQ, dK,
    /// dV in f32 (head-major; dK, dV summed over each KV head's query group).
    #[allow(clippy::too_many_arguments)]
    pub fn causal_backward(
        &self,
        dims: &Dims,
        seq: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        fwd: &Partial<Tensor>,
        dout: &Tensor,
    ) -> Result<Grads<Tensor>> {
        let mut grads = Grads {
            dq: Tensor::F32(self.alloc_f32(dims.q_len(seq))?),
            dk: Tensor::F32(self.alloc_f32(dims.kv_len(seq))?),
            dv: Tensor::F32(self.alloc_f32(dims.kv_len(seq))?),
        };
        self.causal_backward_into(dims, seq, q, k, v, fwd, dout, &mut grads)?;
        Ok(grads)
    }

    /// [`Self::causal_backward`] into caller-owned f32 gradients, which are overwritten (zeroed,
    /// then accumulated). Allocates only D (one f32 per query row).
    #[allow(clippy::too_many_arguments)]
    pub fn causal_backward_into(
        &self,
        dims: &Dims,
        seq: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        fwd: &Partial<Tensor>,
        dout: &Tensor,
        grads: &mut Grads<Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        let delta = self.delta(dims, seq, &fwd.out, dout)?;
        for (t, len, what) in [
            (&mut grads.dq, dims.q_len(seq), "dQ"),
            (&mut grads.dk, dims.kv_len(seq), "dK"),
            (&mut grads.dv, dims.kv_len(seq), "dV"),
        ] {
            let t = f32_mut(t, len, what)?;
            self.stream
                .memset_zeros(t)
                .map_err(|e| anyhow::anyhow!("could not clear {what}: {e:?}"))?;
        }
        let whole = Span { start: 0, len: seq };
        let query = QuerySide {
            q,
            dout,
            lse: &fwd.lse,
            delta: &delta,
        };
        self.backward_block(
            dims,
            Block {
                q: whole,
                kv: whole,
            },
            query,
            k,
            v,
            GradsMut {
                dq: &mut grads.dq,
                dk: &mut grads.dk,
                dv: &mut grads.dv,
            },
        )
    }
}

/// What both forward kernels take after their tensors: the block's geometry and the softmax
/// scale in base 2 (the kernels use exp2).
struct ForwardGeometry {
    ints: [i32; 6],
    scale_log2: f32,
}

impl ForwardGeometry {
    fn new(dims: &Dims, block: Block) -> Result<Self> {
        Ok(ForwardGeometry {
            ints: block_ints(dims, block)?,
            scale_log2: dims.scale() * std::f32::consts::LOG2_E,
        })
    }

    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        for i in &self.ints {
            b.arg(i);
        }
        b.arg(&self.scale_log2);
    }
}

/// The wgmma forward's last arguments: its tensor maps, when it is the kernel in use.
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
        let bits: Vec<u16> = host.par_iter().map(|&x| dtype.encode(x)).collect();
        let data = self
            .stream
            .clone_htod(&bits)
            .map_err(|e| anyhow::anyhow!("copy to the GPU failed: {e:?}"))?;
        Ok(Tensor::Half { dtype, data })
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
        let kern = self.kernels(dims.head_dim)?;
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
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        state: &mut RunningState<Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim)?;
        let (qn, kvn) = (block.q.len, block.kv.len);
        if qn == 0 || kvn == 0 {
            return Ok(());
        }
        let [q, k, v] = self.block_qkv(dims, block, q, k, v)?;
        let m = f32_mut(&mut state.m, dims.stat_len(qn), "the running max")?;
        let l = f32_mut(&mut state.l, dims.stat_len(qn), "the running sum")?;
        let acc = f32_mut(&mut state.acc, dims.q_len(qn), "the accumulator")?;
        let tuning = self.tuning(dims.head_dim);
        let cfg = launch::forward_config(dims, qn, &tuning)?;
        let geometry = ForwardGeometry::new(dims, block)?;
        let maps = self.forward_maps(dims, block, [q, k, v], &tuning)?;
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
        let kern = self.kernels(dims.head_dim)?;
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
        let kern = self.kernels(dims.head_dim)?;
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
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim)?;
        let len = dims.q_len(rows);
        let dout = half(dout, self.dtype, len, "dO")?;
        let mut delta = self.alloc_f32(dims.stat_len(rows))?;
        let n = dims.stat_len(rows) as i64;
        let cfg = launch::rows_config(n as usize)?;
        match out {
            Tensor::F32(o) if o.len() == len => {
                let mut b = self.stream.launch_builder(&kern.delta_f32);
                b.arg(o).arg(dout).arg(&mut delta).arg(&n);
                self.launch("delta_f32", b, cfg)?;
            }
            Tensor::Half { dtype, data } if *dtype == self.dtype && data.len() == len => {
                let mut b = self.stream.launch_builder(&kern.delta_half);
                b.arg(data).arg(dout).arg(&mut delta).arg(&n);
                self.launch("delta_half", b, cfg)?;
            }
            other => bail!(
                "O must be an f32 or {} tensor of {len} elements, got {}",
                self.dtype.name(),
                other.describe()
            ),
        }
        Ok(Tensor::F32(delta))
    }

    fn backward_block(
        &self,
        dims: &Dims,
        block: Block,
        query: QuerySide<'_, Tensor>,
        k: &Tensor,
        v: &Tensor,
        grads: GradsMut<'_, Tensor>,
    ) -> Result<()> {
        launch::check_dims(dims)?;
        let kern = self.kernels(dims.head_dim)?;
        let (dt, qn, kvn) = (self.dtype, block.q.len, block.kv.len);
        if qn == 0 || kvn == 0 {
            return Ok(());
        }
        let q = half(query.q, dt, dims.q_len(qn), "Q")?;
        let dout = half(query.dout, dt, dims.q_len(qn), "dO")?;
        let lse = f32_ref(query.lse, dims.stat_len(qn), "LSE")?;
        let delta = f32_ref(query.delta, dims.stat_len(qn), "D")?;
        let k = half(k, dt, dims.kv_len(kvn), "K")?;
        let v = half(v, dt, dims.kv_len(kvn), "V")?;
        let dq = f32_mut(grads.dq, dims.q_len(qn), "dQ")?;
        let dk = f32_mut(grads.dk, dims.kv_len(kvn), "dK")?;
        let dv = f32_mut(grads.dv, dims.kv_len(kvn), "dV")?;
        let cfg = launch::backward_config(dims, kvn, &self.tuning(dims.head_dim))?;
        let ints = block_ints(dims, block)?;
        let scale = dims.scale();
        let mut b = self.stream.launch_builder(&kern.bwd_block);
        b.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(delta);
        b.arg(dq).arg(dk).arg(dv);
        for i in &ints {
            b.arg(i);
        }
        b.arg(&scale);
        self.launch("the attention block backward", b, cfg)
    }
}

impl CudaBackend {
    /// Kernels of any head dim already loaded, else the head-dim-128 variant: for the
    /// elementwise helpers, which do not depend on the head dim.
    fn any_kernels(&self) -> Result<Arc<Kernels>> {
        let loaded = self
            .kernels
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel cache lock poisoned"))?
            .values()
            .next()
            .cloned();
        match loaded {
            Some(k) => Ok(k),
            None => self.kernels(128),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_parsing_and_rounding() {
        assert_eq!("bf16".parse::<InputDtype>().unwrap(), InputDtype::Bf16);
        assert_eq!("fp16".parse::<InputDtype>().unwrap(), InputDtype::F16);
        let err = "fp8".parse::<InputDtype>().unwrap_err().to_string();
        assert!(err.contains("bf16 or fp16"), "{err}");
        for dt in [InputDtype::Bf16, InputDtype::F16] {
            assert_eq!(dt.decode(dt.encode(1.5)), 1.5);
            assert_eq!(dt.decode(dt.encode(f32::NEG_INFINITY)), f32::NEG_INFINITY);
        }
        // bf16 keeps 8 significant bits, fp16 11.
        assert_eq!(
            InputDtype::Bf16.decode(InputDtype::Bf16.encode(1.0 + 1.0 / 512.0)),
            1.0
        );
        assert!(InputDtype::F16.decode(InputDtype::F16.encode(1.0 + 1.0 / 512.0)) > 1.0);
    }

    #[test]
    fn argument_checks_are_sentences() {
        let bf = Kind::Half(InputDtype::Bf16);
        assert!(expect((bf, 10), (bf, 10), "Q").is_ok());
        let err = expect((Kind::Half(InputDtype::F16), 10), (bf, 10), "Q")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "Q must be a bf16 tensor of 10 elements, got a fp16 tensor of 10"
        );
        let err = expect((Kind::F32, 9), (Kind::F32, 12), "LSE")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "LSE must be an f32 tensor of 12 elements, got an f32 tensor of 9"
        );
        assert!(expect((bf, 12), (Kind::F32, 12), "dQ").is_err());
    }

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

    /// Only meaningful where no driver is installed (CI); on a GPU machine it checks nothing.
    #[test]
    fn no_driver_is_a_sentence_not_a_panic() {
        // SAFETY: probing only.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        let err = CudaBackend::new(0, InputDtype::Bf16)
            .err()
            .unwrap()
            .to_string();
        assert_eq!(err, "no CUDA driver found; use --device cpu");
    }
}
