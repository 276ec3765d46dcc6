//! The model's kernels (`kernels/model.cu`): compiled through the backend's NVRTC path and disk
//! cache for the backend's 16-bit format, loaded into its context, launched on its stream.

use crate::backend::cuda::{InputDtype, compile_cached};
use anyhow::{Result, anyhow};
use cudarc::driver::{CudaFunction, CudaStream, LaunchArgs, LaunchConfig};
use std::sync::Arc;

const HALF: &str = include_str!("../../../kernels/half.cuh");
const SOURCE: &str = include_str!("../../../kernels/model.cu");

/// Every entry point of `kernels/model.cu` this crate launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    CastToHalf,
    AddAssign,
    SumSquares,
    Swiglu,
    SwigluBackward,
    Adamw,
    MasterJoin,
    Embed,
    EmbedBackward,
    Rmsnorm,
    RmsnormBackward,
    BiasAdd,
    BiasDw,
    Rope,
    XentRows,
    Uniform,
}

impl Kernel {
    /// Every kernel, in declaration order (so `k as usize` indexes this array).
    pub(crate) const ALL: [Kernel; 16] = [
        Kernel::CastToHalf,
        Kernel::AddAssign,
        Kernel::SumSquares,
        Kernel::Swiglu,
        Kernel::SwigluBackward,
        Kernel::Adamw,
        Kernel::MasterJoin,
        Kernel::Embed,
        Kernel::EmbedBackward,
        Kernel::Rmsnorm,
        Kernel::RmsnormBackward,
        Kernel::BiasAdd,
        Kernel::BiasDw,
        Kernel::Rope,
        Kernel::XentRows,
        Kernel::Uniform,
    ];

    /// The `extern "C"` name in the source.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::CastToHalf => "cast_to_half",
            Kernel::AddAssign => "add_assign",
            Kernel::SumSquares => "sum_squares",
            Kernel::Swiglu => "swiglu",
            Kernel::SwigluBackward => "swiglu_backward",
            Kernel::Adamw => "adamw",
            Kernel::MasterJoin => "master_join",
            Kernel::Embed => "embed",
            Kernel::EmbedBackward => "embed_backward",
            Kernel::Rmsnorm => "rmsnorm",
            Kernel::RmsnormBackward => "rmsnorm_backward",
            Kernel::BiasAdd => "bias_add",
            Kernel::BiasDw => "bias_dw",
            Kernel::Rope => "rope",
            Kernel::XentRows => "xent_rows",
            Kernel::Uniform => "uniform",
        }
    }
}

/// The translation unit for one 16-bit format: the selecting `#define`, the 16-bit conversions
/// shared with the attention kernels, then the source.
pub(crate) fn source(dtype: InputDtype) -> String {
    let define = match dtype {
        InputDtype::Bf16 => "DTYPE_BF16",
        InputDtype::F16 => "DTYPE_F16",
    };
    format!("#define {define}\n{HALF}\n{SOURCE}")
}

/// The loaded kernels, indexed like [`Kernel::ALL`], and the stream they run on.
pub(crate) struct Kernels {
    functions: Vec<CudaFunction>,
    stream: Arc<CudaStream>,
}

impl Kernels {
    /// Compiles (or reads from the cache) and loads every kernel into `stream`'s context.
    pub(crate) fn load(stream: Arc<CudaStream>, dtype: InputDtype) -> Result<Kernels> {
        let ctx = stream.context().clone();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| anyhow!("could not query the CUDA device: {e:?}"))?;
        let ptx = compile_cached(&source(dtype), major, minor)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| anyhow!("the CUDA driver rejected the model kernels: {e:?}"))?;
        let functions = Kernel::ALL
            .iter()
            .map(|k| {
                module
                    .load_function(k.name())
                    .map_err(|e| anyhow!("kernel {} missing from the module: {e:?}", k.name()))
            })
            .collect::<Result<_>>()?;
        Ok(Kernels { functions, stream })
    }

    /// A launch of `k` on the stream, to push the kernel's arguments into.
    pub(crate) fn builder(&self, k: Kernel) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.functions[k as usize])
    }

    /// Launches what `args` holds.
    pub(crate) fn run(&self, k: Kernel, mut args: LaunchArgs<'_>, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: every call site pushes exactly the arguments of the kernel's C signature in
        // order: device pointers of `CudaSlice`s whose lengths were checked against the shape
        // the kernel indexes (each followed by its 16-bit flag where the C side takes
        // `const void*, int`), then `long` lengths as i64, `int` sizes as i32, f32 scalars and
        // `unsigned long long` counters as u64.
        // `cfg` comes from `shapes`, whose block sizes are the multiples of 32 the row kernels
        // assume; no kernel uses dynamic shared memory.
        unsafe { args.launch(cfg) }
            .map(|_| ())
            .map_err(|e| anyhow!("launching {} failed: {e:?}", k.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_defines_every_launched_kernel_and_no_other() {
        for k in Kernel::ALL {
            let signature = format!("extern \"C\" __global__ void {}(", k.name());
            assert!(SOURCE.contains(&signature), "{} missing", k.name());
        }
        let defined = SOURCE.matches("extern \"C\" __global__ void ").count();
        assert_eq!(
            defined,
            Kernel::ALL.len(),
            "a kernel is defined but never launched"
        );
    }

    #[test]
    fn all_is_in_declaration_order() {
        // `Kernels::builder` indexes the loaded functions by discriminant.
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
    }

    #[test]
    fn source_selects_the_format() {
        assert!(source(InputDtype::Bf16).starts_with("#define DTYPE_BF16\n"));
        assert!(source(InputDtype::F16).starts_with("#define DTYPE_F16\n"));
    }

    /// Where NVRTC is installed (no GPU needed), the model kernels compile for sm_90 and sm_80 in
    /// both formats. Skipped where it is absent (CI).
    #[test]
    fn kernels_compile_where_nvrtc_exists() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return;
        }
        for dtype in [InputDtype::Bf16, InputDtype::F16] {
            for (major, minor) in [(9, 0), (8, 0)] {
                let ptx = compile_cached(&source(dtype), major, minor)
                    .unwrap_or_else(|e| panic!("{dtype:?} sm{major}{minor}: {e}"));
                for k in Kernel::ALL {
                    assert!(ptx.to_src().contains(&format!(".entry {}(", k.name())));
                }
            }
        }
    }
}
