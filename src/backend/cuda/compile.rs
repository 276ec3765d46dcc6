//! Run-time compilation of the kernels in `kernels/` with NVRTC, cached on disk.
//!
//! The kernels are compiled for the device's own compute capability at first use, so one binary
//! serves any GPU the NVRTC on the machine knows. Compiling takes seconds; the PTX is therefore
//! kept under the user's cache directory, keyed by everything that changes the output: the source
//! (including the `#define`s that select head dim and dtype), the options, the architecture and
//! the NVRTC version.

use super::launch::{Masking, Tuning, WideBackward, wgmma_cols, wgmma_wide};
use anyhow::{Context, Result, bail};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use std::path::{Path, PathBuf};

const HALF: &str = include_str!("../../../kernels/half.cuh");
const COMMON: &str = include_str!("../../../kernels/common.cuh");
const WGMMA: &str = include_str!("../../../kernels/wgmma.cuh");
const FORWARD: &str = include_str!("../../../kernels/forward.cu");
const FORWARD_WGMMA: &str = include_str!("../../../kernels/forward_wgmma.cu");
const BACKWARD: &str = include_str!("../../../kernels/backward.cu");
const BACKWARD_WGMMA_SHARED: &str = include_str!("../../../kernels/backward_wgmma.cuh");
const BACKWARD_WGMMA: &str = include_str!("../../../kernels/backward_wgmma.cu");
const BACKWARD_WGMMA_WIDE: &str = include_str!("../../../kernels/backward_wgmma_wide.cu");
const ROWS: &str = include_str!("../../../kernels/rows.cu");
const LAYOUT: &str = include_str!("../../../kernels/layout.cu");

/// The full translation unit for one kernel variant: the selecting `#define`s, then the sources.
/// `sms` is the device's SM count, which orders the CTAs of short heads (`cta_work` in
/// `kernels/common.cuh`).
pub(crate) fn kernel_source(
    head_dim: usize,
    bf16: bool,
    tuning: &Tuning,
    masking: Masking,
    sms: usize,
) -> String {
    let dtype = if bf16 { "DTYPE_BF16" } else { "DTYPE_F16" };
    let masked = masking as u8;
    let wg_dim = wgmma_cols(head_dim);
    let wide = if wgmma_wide(head_dim) {
        WideBackward::for_head_dim(head_dim).defines()
    } else {
        String::new()
    };
    format!(
        "#define HEAD_DIM {head_dim}\n#define WG_DIM {wg_dim}\n#define {dtype}\n#define MASKED {masked}\n#define NUM_SMS {sms}\n{}{wide}{HALF}\n{COMMON}\n{WGMMA}\n{FORWARD}\n{FORWARD_WGMMA}\n{BACKWARD}\n{BACKWARD_WGMMA_SHARED}\n{BACKWARD_WGMMA}\n{BACKWARD_WGMMA_WIDE}\n{ROWS}\n{LAYOUT}",
        tuning.defines()
    )
}

/// NVRTC options for compute capability `major.minor`; PTX for `compute_XY`, which the driver
/// turns into the device's machine code when the module loads. Compute capability 9.0 gets
/// `compute_90a`, the target with Hopper's own instructions (`wgmma`), which runs only on 9.0.
pub(crate) fn compile_options(major: i32, minor: i32) -> Vec<String> {
    let arch_specific = if (major, minor) == (9, 0) { "a" } else { "" };
    let arch = format!("--gpu-architecture=compute_{major}{minor}{arch_specific}");
    std::iter::once(arch)
        .chain(LANGUAGE_OPTIONS.map(String::from))
        .collect()
}

/// The options every compile of the kernels takes besides its target.
const LANGUAGE_OPTIONS: [&str; 2] = ["--use_fast_math", "--std=c++17"];

/// Cache key: FNV-1a (64-bit) over every input of the compilation, with lengths in between so
/// that moving text from one field to the next changes the key. FNV is fixed forever, unlike
/// `std`'s hasher, so the key is stable across Rust releases.
pub(crate) fn cache_key(source: &str, options: &[String], nvrtc_version: (i32, i32)) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(source.as_bytes());
    for o in options {
        eat(o.as_bytes());
    }
    eat(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    format!("{h:016x}")
}

/// Where compiled kernels are kept: `$DISTFLASH_CACHE_DIR`, else `$XDG_CACHE_HOME/distflash`,
/// else `~/.cache/distflash`; `None` when none of these can be formed (then nothing is cached).
pub(crate) fn cache_dir(
    explicit: Option<&str>,
    xdg: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    let nonempty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(PathBuf::from);
    nonempty(explicit)
        .or_else(|| nonempty(xdg).map(|p| p.join("distflash")))
        .or_else(|| nonempty(home).map(|p| p.join(".cache").join("distflash")))
}

fn default_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var(k).ok();
    cache_dir(
        var("DISTFLASH_CACHE_DIR").as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC's presence was checked by the caller; the two out-pointers are valid locals.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        bail!("NVRTC did not report its version ({status:?})");
    }
    Ok((major, minor))
}

fn nvrtc_present() -> bool {
    // SAFETY: only probes whether the shared library can be opened.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `source` to PTX for `major.minor`, or reads it from the disk cache. A compile error
/// carries NVRTC's log. Failing to write the cache is not an error (the PTX is still returned).
pub(crate) fn compile_cached(source: &str, major: i32, minor: i32) -> Result<Ptx> {
    if !nvrtc_present() {
        bail!(
            "the NVRTC library (libnvrtc) was not found: the CUDA backend compiles its kernels at run time and needs it"
        );
    }
    let options = compile_options(major, minor);
    let key = cache_key(source, &options, nvrtc_version()?);
    let path = default_cache_dir().map(|d| d.join(format!("attn-sm{major}{minor}-{key}.ptx")));
    if let Some(text) = path
        .as_deref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        return Ok(Ptx::from_src(text));
    }
    let ptx = compile(source, options)?;
    if let Some(path) = &path {
        // Best effort: a read-only home directory only costs a recompile next time.
        let _ = store(path, &ptx.to_src());
    }
    Ok(ptx)
}

fn compile(source: &str, options: Vec<String>) -> Result<Ptx> {
    let opts = CompileOptions {
        options,
        name: Some("distflash_attn.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
        CompileError::CompileError {
            nvrtc,
            options,
            log,
        } => anyhow::anyhow!(
            "NVRTC could not compile the CUDA kernels ({nvrtc:?}, options {options:?}):\n{}",
            log.to_string_lossy()
        ),
        other => anyhow::anyhow!("NVRTC failed: {other:?}"),
    })
}

/// Writes atomically (temporary file, then rename) so a concurrent reader never sees half a file.
fn store(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().context("cache path has no parent")?;
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SMs of the H200 the kernels are timed on, for the sources compiled here.
    const H200_SMS: usize = 132;

    #[test]
    fn key_changes_with_every_input() {
        let opts = compile_options(9, 0);
        let base = cache_key("src", &opts, (13, 0));
        assert_eq!(base, cache_key("src", &opts, (13, 0)), "deterministic");
        assert_ne!(base, cache_key("src2", &opts, (13, 0)));
        assert_ne!(base, cache_key("src", &compile_options(8, 0), (13, 0)));
        assert_ne!(base, cache_key("src", &opts, (13, 1)));
        // Field boundaries matter: "ab"+"c" differs from "a"+"bc".
        assert_ne!(
            cache_key("ab", &["c".into()], (1, 0)),
            cache_key("a", &["bc".into()], (1, 0))
        );
        assert_eq!(base.len(), 16);
    }

    #[test]
    fn cache_dir_precedence() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(cache_dir(Some("/x"), Some("/y"), Some("/h")), p("/x"));
        assert_eq!(cache_dir(None, Some("/y"), Some("/h")), p("/y/distflash"));
        assert_eq!(
            cache_dir(Some(""), Some(""), Some("/h")),
            p("/h/.cache/distflash")
        );
        assert_eq!(cache_dir(None, None, None), None);
    }

    /// Compiles every kernel variant for sm_90 and sm_80 where NVRTC is installed (no GPU
    /// needed), so a kernel syntax error shows before any device time is spent. Skipped where
    /// NVRTC is absent (CI).
    #[test]
    fn kernels_compile_where_nvrtc_exists() {
        if !nvrtc_present() {
            return;
        }
        for head_dim in crate::backend::cuda::HEAD_DIMS {
            for bf16 in [true, false] {
                for (major, minor) in [(9, 0), (8, 0)] {
                    let t = Tuning::for_head_dim(head_dim).for_device(head_dim, (major, minor));
                    for masking in Masking::BOTH {
                        let src = kernel_source(head_dim, bf16, &t, masking, H200_SMS);
                        let ptx =
                            compile(&src, compile_options(major, minor)).unwrap_or_else(|e| {
                                panic!("d{head_dim} sm{major}{minor} {masking:?}: {e}")
                            });
                        let ptx = ptx.to_src();
                        assert!(ptx.contains(".entry bwd_block"));
                        assert!(ptx.contains(".entry relayout_f32_half"));
                        assert_eq!(ptx.contains("wgmma"), t.fwd_wgmma || t.bwd_wgmma);
                    }
                }
            }
        }
    }

    /// `source` compiled by NVRTC to machine code for `arch` (`sm_90a`, `sm_80`) with the
    /// kernels' options and `extra`: the compile's log and the cubin. Panics, naming `arch`,
    /// where it fails.
    fn compile_to_cubin(source: &str, arch: &str, extra: &[&str]) -> (String, Vec<u8>) {
        use cudarc::nvrtc::{result, sys};
        let src = std::ffi::CString::new(source).unwrap();
        let prog = result::create_program(&src, None).unwrap();
        let target = format!("--gpu-architecture={arch}");
        let mut options = vec![target.as_str()];
        options.extend(LANGUAGE_OPTIONS);
        options.extend(extra);
        // SAFETY: `prog` was just created and is destroyed only after its last use below; the
        // cubin's buffer has the size NVRTC reports for it.
        let (compiled, log, cubin) = unsafe {
            let compiled = result::compile_program(prog, &options);
            let log = result::get_program_log(prog).unwrap();
            let mut cubin = vec![];
            if compiled.is_ok() {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size).result().unwrap();
                cubin.resize(size, 0u8);
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                    .result()
                    .unwrap();
            }
            result::destroy_program(prog).unwrap();
            (compiled, log, cubin)
        };
        compiled.unwrap_or_else(|e| panic!("{arch} compile failed: {e:?}"));
        let bytes: Vec<u8> = log.iter().map(|&c| c as u8).collect();
        (String::from_utf8_lossy(&bytes).into_owned(), cubin)
    }

    /// ptxas's report (`--ptxas-options=-v`) for `source` compiled to machine code for `arch`
    /// (`sm_90a`, `sm_80`).
    fn ptxas_report(source: &str, arch: &str) -> String {
        compile_to_cubin(source, arch, &["--ptxas-options=-v"]).0
    }

    /// Not a check but a tool (run with `--ignored`; `bench/peers/sass_dump.sh` does): writes
    /// every Hopper variant's machine code (head dims × dtypes × maskings × deterministic, for
    /// an H200's 132 SMs) as `DIR/d{head_dim}_{bf16|f16}_{causal|masked}[_det].cubin`, DIR
    /// from `DISTFLASH_CUBIN_DIR`. Disassembled, two trees' files say whether a change to the
    /// kernels' source changed what the GPU runs, without a GPU.
    #[test]
    #[ignore]
    fn write_every_variant_cubin() {
        use rayon::prelude::*;
        let dir = PathBuf::from(std::env::var("DISTFLASH_CUBIN_DIR").expect("DISTFLASH_CUBIN_DIR"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut variants = vec![];
        for deterministic in [false, true] {
            for head_dim in crate::backend::cuda::HEAD_DIMS {
                for bf16 in [true, false] {
                    for masking in Masking::BOTH {
                        variants.push((deterministic, head_dim, bf16, masking));
                    }
                }
            }
        }
        variants
            .par_iter()
            .for_each(|&(deterministic, head_dim, bf16, masking)| {
                let t = Tuning {
                    deterministic,
                    ..Tuning::for_head_dim(head_dim).for_device(head_dim, (9, 0))
                };
                let source = kernel_source(head_dim, bf16, &t, masking, H200_SMS);
                let (_, cubin) = compile_to_cubin(&source, "sm_90a", &[]);
                let name = format!(
                    "d{head_dim}_{}_{}{}.cubin",
                    if bf16 { "bf16" } else { "f16" },
                    if masking == Masking::Masked {
                        "masked"
                    } else {
                        "causal"
                    },
                    if deterministic { "_det" } else { "" }
                );
                std::fs::write(dir.join(name), cubin).unwrap();
            });
    }

    /// The attention kernels in ptxas's `report` that spilled registers, each with its line.
    fn spills(report: &str, what: &str) -> Vec<String> {
        let mut found = Vec::new();
        for kernel in ["fwd_final", "fwd_state", "bwd_block"] {
            let at = report
                .find(&format!("Function properties for {kernel}\n"))
                .unwrap_or_else(|| panic!("no ptxas report for {kernel}:\n{report}"));
            let line = report[at..].lines().nth(1).unwrap_or_default();
            if !line.contains(" 0 bytes spill stores") {
                found.push(format!("{kernel} ({what}): {}", line.trim()));
            }
        }
        found
    }

    /// The wgmma kernels' speed rests on two things ptxas decides and the PTX does not show:
    /// no register spills (a spilled accumulator of an in-flight wgmma) and no serialisation of
    /// the wgmma pipeline (ptxas's C7510-C7515 and C7520 notes, e.g. when a non-wgmma
    /// instruction touches an accumulator before its wait, or a wgmma is issued under a run-time
    /// condition). Checked where NVRTC is installed (CI installs it from PyPI), without a GPU.
    /// Known exception, asserted so that a change shows: the masked backward at head dim 128,
    /// whose computing warpgroups have 240 registers since a third loads and adds dQ. Since v31
    /// it spills 28 bytes and the causal module none (v26–v30: 4 and 40, the causal one's key
    /// tile reloaded once a query tile, as the GPU timed it in
    /// `bench/results/lse-scale-2026-12-04`, call 1; v24: none and 36, its descriptors in
    /// uniform registers; v23: 24 and 28; v21: 52 and 68, 3–9% faster than v20, spill-free
    /// causal at 255: `bench/results/bwd-producer-2026-12-03`, call 3).
    /// (ptxas's C7519 notes, a fence it adds before the first tile's dK and dV products because
    /// their accumulators' zeros are set just before them, are not serialisation.)
    #[test]
    fn wgmma_kernels_neither_spill_nor_serialize() {
        if !nvrtc_present() {
            return;
        }
        for (head_dim, bf16) in [
            (128, true),
            (128, false),
            (96, true),
            (80, true),
            (64, true),
            (192, true),
            (256, true),
            (256, false),
        ] {
            let t = Tuning::for_head_dim(head_dim).for_device(head_dim, (9, 0));
            assert!(t.fwd_wgmma && t.bwd_wgmma);
            for masking in Masking::BOTH {
                let what = format!("d{head_dim}, bf16={bf16}, {masking:?}");
                let report = ptxas_report(
                    &kernel_source(head_dim, bf16, &t, masking, H200_SMS),
                    "sm_90a",
                );
                assert!(!report.contains("serialized"), "{what}:\n{report}");
                let spilled = spills(&report, &what);
                if head_dim == 128 && masking == Masking::Masked {
                    assert!(
                        spilled.len() == 1 && spilled[0].starts_with("bwd_block"),
                        "{what}: the masked backward alone spills at 128, or no longer: update \
                         this test ({spilled:#?})"
                    );
                } else {
                    assert!(spilled.is_empty(), "{spilled:#?}");
                }
            }
        }
    }

    /// The mma.sync kernels keep their f32 accumulators (O, dK, dV: head dim wide) in
    /// registers at every head dim, as chosen for sm_80 (on sm_90 every head dim runs on the
    /// wgmma kernels): a spill would put them in local memory on every tile. Known exception,
    /// asserted to still spill so that a fix shows here: head dim 128 (72 bytes in the forward,
    /// 24 in the backward) with the shape measured best on the H200, kept as it was.
    #[test]
    fn mma_sync_kernels_do_not_spill() {
        if !nvrtc_present() {
            return;
        }
        let mut spilled = Vec::new();
        for head_dim in crate::backend::cuda::HEAD_DIMS {
            let t = Tuning::for_head_dim(head_dim).for_device(head_dim, (8, 0));
            assert!(!t.fwd_wgmma && !t.bwd_wgmma);
            for masking in Masking::BOTH {
                let source = kernel_source(head_dim, true, &t, masking, H200_SMS);
                let report = ptxas_report(&source, "sm_80");
                let found = spills(&report, &format!("d{head_dim}, sm_80, {masking:?}"));
                if head_dim == 128 {
                    assert!(
                        !found.is_empty(),
                        "d128 at sm_80 no longer spills: update this test"
                    );
                } else {
                    spilled.extend(found);
                }
            }
        }
        assert!(spilled.is_empty(), "{spilled:#?}");
    }

    /// The deterministic backward (`Tuning::deterministic`) compiles in both modules, on the
    /// wgmma kernels without serialisation, and on the mma.sync kernels for sm_80. Which wgmma
    /// modules spill is asserted, so that a change shows: since v31 both at 64 (4 bytes each)
    /// and the masked one at 128 (24 bytes in 240 registers); none at 80, 96, 192 or 256.
    /// (v24–v30: the masked ones at 64 and 128 and the causal one at 192; v23: both at 64
    /// and 128, the masked ones at 80, 96 and 192; these counts move by a few bytes with any
    /// change to the kernels.)
    #[test]
    fn deterministic_kernels_compile() {
        if !nvrtc_present() {
            return;
        }
        for (head_dim, capability, arch) in [
            (128, (9, 0), "sm_90a"),
            (64, (9, 0), "sm_90a"),
            (80, (9, 0), "sm_90a"),
            (96, (9, 0), "sm_90a"),
            (128, (8, 0), "sm_80"),
            (192, (9, 0), "sm_90a"),
            (256, (9, 0), "sm_90a"),
            (256, (8, 0), "sm_80"),
        ] {
            let t = Tuning {
                deterministic: true,
                ..Tuning::for_head_dim(head_dim).for_device(head_dim, capability)
            };
            for masking in Masking::BOTH {
                let what = format!("deterministic d{head_dim}, {arch}, {masking:?}");
                let source = kernel_source(head_dim, true, &t, masking, H200_SMS);
                assert!(source.contains("#define DETERMINISTIC 1\n"));
                let report = ptxas_report(&source, arch);
                if t.bwd_wgmma {
                    assert!(!report.contains("serialized"), "{what}:\n{report}");
                    let spilled = spills(&report, &what);
                    let expected = match head_dim {
                        64 => true,
                        128 => masking == Masking::Masked,
                        _ => false,
                    };
                    assert_eq!(
                        !spilled.is_empty(),
                        expected,
                        "{what}: update this test ({spilled:#?})"
                    );
                }
            }
        }
    }

    #[test]
    fn compile_error_carries_the_log() {
        if !nvrtc_present() {
            return;
        }
        let err = compile(
            "__global__ void k() { undeclared(); }",
            compile_options(9, 0),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("NVRTC could not compile"), "{err}");
        assert!(err.contains("undeclared"), "log missing: {err}");
    }

    #[test]
    fn source_selects_variant() {
        let t = Tuning::for_head_dim(128);
        let s = kernel_source(128, true, &t, Masking::Causal, H200_SMS);
        assert!(s.starts_with(
            "#define HEAD_DIM 128\n#define WG_DIM 128\n#define DTYPE_BF16\n#define MASKED 0\n#define NUM_SMS 132\n#define FWD_WARPS 8\n"
        ));
        assert!(
            kernel_source(96, true, &t, Masking::Causal, H200_SMS).contains("#define WG_DIM 128\n")
        );
        assert!(
            kernel_source(192, true, &t, Masking::Causal, H200_SMS)
                .contains("#define WG_DIM 192\n")
        );
        assert!(
            kernel_source(128, true, &t, Masking::Masked, H200_SMS).contains("#define MASKED 1\n")
        );
        // The wide backward's buffers, from the host's one decision (`WideBackward`).
        assert!(!s.contains("#define WW_Q_STAGES"));
        assert!(
            kernel_source(256, true, &t, Masking::Causal, H200_SMS).contains(
                "#define WW_Q_STAGES 2\n#define WW_DO_STAGES 1\n#define WW_DQ_BUFFERS 1\n#define WW_DQ_LATE 1\n#define WW_DS_TILES 2\n"
            )
        );
        assert!(
            kernel_source(192, true, &t, Masking::Causal, H200_SMS)
                .contains("#define WW_DQ_LATE 0\n#define WW_DS_TILES 1\n")
        );
        assert!(s.contains("#define FWD_WGMMA 1\n#define BWD_WARPS 8\n#define BWD_WGMMA 1\n"));
        assert!(
            kernel_source(64, false, &t, Masking::Causal, H200_SMS).contains("#define DTYPE_F16")
        );
        assert!(s.contains("fwd_final") && s.contains("bwd_block") && s.contains("merge_rows"));
        assert!(s.contains("relayout_half") && s.contains("relayout_f32_half"));
        assert!(compile_options(9, 0)[0].ends_with("compute_90a"));
        assert!(compile_options(8, 9)[0].ends_with("compute_89"));
    }
}
