//! `ruda-codegen-nvrtc`: RUDA's second, independent backend. Verified IR becomes readable CUDA
//! C++ ([`emit_cuda`]), which NVRTC compiles to PTX ([`compile_to_ptx`]). Selected at run time
//! by `RUDA_CUDA_COMPILER=nvrtc`.
//!
//! # The C++
//!
//! One `extern "C" __global__` function per kernel, named after it, with `__launch_bounds__`
//! from the kernel's launch bounds. Parameters and locals have plain C++ types (`float*`,
//! `unsigned`, `bool` for predicates; f16/bf16 are their raw bits as `unsigned short`). Each SSA
//! value is a local named after it (`v17`), parameters keep their names. `if` and `for` are C++
//! `if` and `for`: results and loop-carried values are variables assigned at the end of each
//! branch or iteration (a parallel copy where a yield is another carried value). Static shared
//! arrays are `__shared__ __align__(A) T name[len]`, dynamic shared memory is
//! `extern __shared__ __align__(16) unsigned char dyn_smem[]`. No header is included; the few
//! helpers a module needs are defined at its top. Output is deterministic.
//!
//! # Exact semantics
//!
//! The interpreter defines what each op means; the C++ is written so that NVVM can neither
//! change nor constant-fold it into something else:
//!
//! - float add/sub/mul/div/fma/sqrt/rcp: `__fadd_rn`, `__dmul_rn`, `__fmaf_rn`, `__fsqrt_rn`,
//!   `__frcp_rn`, ... (correctly rounded, never contracted), compiled with `--fmad=false
//!   -ftz=false -prec-div=true -prec-sqrt=true`;
//! - float min/max: inline `min.f32`/`max.f64`... (NVVM folds `fminf(+0, -0)` to `+0`, while
//!   PTX's `min` gives `-0`); neg/abs: `-x`/`fabsf` (sign bit only, as PTX);
//! - comparisons: C++'s ordered operators, `ne` as `a < b || a > b` (ordered), `neu` as `!=`,
//!   `nan` as `a != a || b != b`;
//! - the approximate functions: inline `ex2.approx.f32`, `lg2.approx.f32`, `rsqrt.approx.f32`,
//!   `tanh.approx.f32`, `sin.approx.f32`, `cos.approx.f32`, the instructions the PTX backend
//!   emits;
//! - integer add/sub/mul/fma/neg/abs wrap: computed in the unsigned type of the promoted width
//!   (C++ makes signed overflow, and `unsigned short` products promoted to `int`, undefined);
//!   `mulhi` is `__mulhi`/`__umul64hi`/...; `div`/`rem` helpers define `MIN / -1 = MIN`,
//!   `MIN % -1 = 0` (and give -1 / the dividend for a zero divisor, an IR error, instead of
//!   undefined behaviour); shifts clamp the amount as PTX does;
//! - conversions: see `cvt.rs` — integer to integer in C++, everything with a float as the
//!   PTX backend's `cvt` instruction in inline `asm` (rounding, saturation, NaN rules);
//! - shared-memory pointers are 32-bit shared-window addresses (`ruda_shared_ptr<T>`, an
//!   `unsigned`) whose arithmetic wraps at 32 bits, as in the IR; accesses go through
//!   `__cvta_shared_to_generic`, which NVVM turns into `ld.shared`/`st.shared`;
//! - shuffles: `__shfl_sync`, `__shfl_up_sync`, `__shfl_down_sync`, `__shfl_xor_sync` with the
//!   full mask and width 32 (PTX clamp 0x1f, and 0 for `up`, as the PTX backend); votes:
//!   `__all_sync`/`__any_sync`/`__ballot_sync`; atomics: `atomicAdd/Min/Max/Exch/CAS` (through
//!   `unsigned long long`/`unsigned` bits where CUDA has no signed-64 or float overload);
//!   `__syncthreads()`; `%laneid` through inline `asm`.
//!
//! Operations that need a newer architecture (`cvt.rm/rp` to bf16, f64 and 32/64-bit integers
//! to bf16: sm_90) are an [`NvrtcError::Unsupported`] naming the kernel, op, location and
//! target when compiling for an older one.
//!
//! # NVRTC
//!
//! See [`find_nvrtc`] for where the library is looked for. NVRTC compiles for the target's
//! virtual architecture (`compute_80`, ..., `compute_90a`); the PTX's `.version` is NVRTC's own
//! unless the [`Target`] forces one, which then replaces it.

use std::path::PathBuf;

use ruda_ir::target::{Arch, PtxVersion, Target};
use ruda_ir::{Kernel, VerifyError};

mod cache;
mod cvt;
mod cxx;
mod helpers;
mod literal;
mod nvrtc;

pub use cache::CACHE_VAR;
pub use nvrtc::{find_nvrtc, nvrtc_or_skip, nvrtc_version, pinned_nvrtc_path, Nvrtc, NVRTC_VAR, REQUIRE_VAR};

/// Why C++ or PTX could not be produced.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NvrtcError {
    /// The kernel does not verify.
    #[error("cannot emit CUDA C++: {0}")]
    Verify(#[from] VerifyError),
    /// An operation the target cannot run, or a name C++ cannot take.
    #[error("{0}")]
    Unsupported(String),
    /// A forced PTX ISA version that is unknown or too old for the target.
    #[error("{0}")]
    Version(String),
    /// No NVRTC library could be opened; `searched` says where and why.
    #[error(
        "libnvrtc not found (set RUDA_NVRTC to its path or run scripts/install-cuda-tools.sh); looked at:\n  {}",
        .searched.join("\n  ")
    )]
    NotFound { searched: Vec<String> },
    /// NVRTC is missing and `RUDA_REQUIRE_NVRTC=1` (tests).
    #[error("RUDA_REQUIRE_NVRTC=1 requires NVRTC: {0}")]
    Required(String),
    /// A library was found but is not a usable NVRTC.
    #[error("{location} could not be loaded as NVRTC: {message}")]
    Load { location: String, message: String },
    /// An NVRTC call failed for another reason than the source.
    #[error("{call} failed: {message}")]
    Api { call: &'static str, message: String },
    /// NVRTC rejected the C++: its log, and the source with line numbers.
    #[error("{}", compile_message(.kernels, .arch, .log, .cxx, .source_path.as_ref()))]
    Compile { kernels: String, arch: String, log: String, cxx: String, source_path: Option<PathBuf> },
    /// A bug in this backend (an invariant the verifier should have guaranteed).
    #[error("internal error in the CUDA C++ backend: {0}")]
    Internal(String),
}

fn compile_message(kernels: &str, arch: &str, log: &str, source: &str, path: Option<&PathBuf>) -> String {
    let kept = path.map(|p| format!(" (kept at {})", p.display())).unwrap_or_default();
    format!(
        "NVRTC could not compile {kernels} for {arch}:\n{}\n--- CUDA C++ source{kept} ---\n{}",
        log.trim_end(),
        numbered(source)
    )
}

/// `source` with right-aligned line numbers, as compile errors show it.
pub fn numbered(source: &str) -> String {
    let width = source.lines().count().max(1).to_string().len();
    let mut out = String::new();
    for (i, line) in source.lines().enumerate() {
        out.push_str(&format!("{:>width$} | {line}\n", i + 1));
    }
    out
}

/// The CUDA C++ translation unit of one kernel.
pub fn emit_cuda(kernel: &Kernel) -> Result<String, NvrtcError> {
    emit_cuda_module(&[kernel])
}

/// One translation unit holding several kernels (distinct names), sharing one prelude: NVRTC
/// compiles it in one call.
pub fn emit_cuda_module(kernels: &[&Kernel]) -> Result<String, NvrtcError> {
    Ok(cxx::module(kernels)?.source)
}

/// The NVRTC options for `target`: its virtual architecture and exact float semantics.
pub fn nvrtc_options(target: &Target) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", virtual_arch(target.arch)),
        "--fmad=false".into(),
        "-ftz=false".into(),
        "-prec-div=true".into(),
        "-prec-sqrt=true".into(),
        "-default-device".into(),
        "--std=c++17".into(),
    ]
}

/// `compute_80`, ..., `compute_90a`.
pub fn virtual_arch(arch: Arch) -> String {
    arch.name().replace("sm_", "compute_")
}

/// Compile one kernel to PTX with the NVRTC [`find_nvrtc`] finds. This and the other
/// functions that find NVRTC themselves reuse the PTX kept in `RUDA_NVRTC_CACHE` when it is
/// set ([`CACHE_VAR`]); those given a library ([`compile_module_with`], [`compile_cuda`])
/// always call it.
pub fn compile_to_ptx(kernel: &Kernel, target: &Target) -> Result<String, NvrtcError> {
    compile_module_to_ptx(&[kernel], target)
}

/// Compile one kernel with the NVRTC [`find_nvrtc`] finds, returning its CUDA C++ and the PTX
/// (for callers that keep the C++, such as `RUDA_DUMP_IR`).
pub fn compile_with_source(kernel: &Kernel, target: &Target) -> Result<(String, String), NvrtcError> {
    let module = prepare(&[kernel], target)?;
    let ptx = compile_found(&[kernel], target, &module.source)?;
    Ok((module.source, ptx))
}

/// Compile several kernels (distinct names) as one module with the NVRTC [`find_nvrtc`] finds.
pub fn compile_module_to_ptx(kernels: &[&Kernel], target: &Target) -> Result<String, NvrtcError> {
    let module = prepare(kernels, target)?;
    compile_found(kernels, target, &module.source)
}

/// Compile prepared C++ with the NVRTC [`find_nvrtc`] finds, through the cache when one is set.
fn compile_found(kernels: &[&Kernel], target: &Target, source: &str) -> Result<String, NvrtcError> {
    let nvrtc = find_nvrtc()?;
    let compile = || compile_prepared(&nvrtc, kernels, target, source);
    match cache::PtxCache::from_env() {
        None => compile(),
        Some(cache) => {
            let forced = target.ptx_version.map_or_else(|| "auto".to_string(), |v| v.to_string());
            let options = nvrtc_options(target);
            cache.get_or_compile(&nvrtc, program_name(kernels), &options, &forced, source, compile)
        }
    }
}

/// Compile several kernels as one module with a given NVRTC.
pub fn compile_module_with(nvrtc: &Nvrtc, kernels: &[&Kernel], target: &Target) -> Result<String, NvrtcError> {
    let module = prepare(kernels, target)?;
    compile_prepared(nvrtc, kernels, target, &module.source)
}

/// Whether `kernel` can be compiled for `target` (verifies, emits the C++, checks the
/// architecture its instructions need and the forced PTX version) without calling NVRTC.
pub fn check_target(kernel: &Kernel, target: &Target) -> Result<(), NvrtcError> {
    prepare(&[kernel], target).map(|_| ())
}

/// Emit the C++ and check the target's architecture and forced version against it.
fn prepare(kernels: &[&Kernel], target: &Target) -> Result<cxx::Module, NvrtcError> {
    let module = cxx::module(kernels)?;
    if let Some(r) = module.requirements.iter().find(|r| target.arch < r.arch) {
        return Err(NvrtcError::Unsupported(format!(
            "{}, which needs {} or newer; the target is {}",
            r.what, r.arch, target.arch
        )));
    }
    if let Some(v) = target.ptx_version {
        check_version(target.arch, v)?;
    }
    Ok(module)
}

/// A forced PTX ISA version must exist, be known to RUDA and know the architecture.
fn check_version(arch: Arch, v: PtxVersion) -> Result<(), NvrtcError> {
    v.check_for(arch).map_err(|e| NvrtcError::Version(e.0))
}

fn compile_prepared(nvrtc: &Nvrtc, kernels: &[&Kernel], target: &Target, source: &str) -> Result<String, NvrtcError> {
    let what = match kernels {
        [one] => format!("kernel `{}`", one.name),
        many => format!("kernels {}", many.iter().map(|k| format!("`{}`", k.name)).collect::<Vec<_>>().join(", ")),
    };
    compile_cuda(nvrtc, source, program_name(kernels), &what, target)
}

/// The translation unit's name: its first kernel's.
fn program_name<'k>(kernels: &[&'k Kernel]) -> &'k str {
    kernels.first().map_or("module", |k| k.name.as_str())
}

/// Compile CUDA C++ text (such as [`emit_cuda`]'s) for `target` with `nvrtc`: `program` names
/// the translation unit (`<program>.cu`), `what` names it in errors ("kernel `k`"). The PTX's
/// `.version` becomes the target's forced version, if any.
pub fn compile_cuda(
    nvrtc: &Nvrtc,
    source: &str,
    program: &str,
    what: &str,
    target: &Target,
) -> Result<String, NvrtcError> {
    if let Some(v) = target.ptx_version {
        check_version(target.arch, v)?;
    }
    let file = format!("{program}.cu");
    match nvrtc.compile(source, &file, &nvrtc_options(target))? {
        nvrtc::Compiled::Ptx(ptx) => match target.ptx_version {
            Some(v) => rewrite_ptx_version(&ptx, v),
            None => Ok(ptx),
        },
        nvrtc::Compiled::Failed(log) => Err(NvrtcError::Compile {
            kernels: what.to_string(),
            arch: virtual_arch(target.arch),
            log,
            cxx: source.to_string(),
            source_path: keep_failed(program, source),
        }),
    }
}

/// Keep failing C++ at `<tmp>/ruda-nvrtc-fail/<name>-<hash>.cu` (best effort).
fn keep_failed(program: &str, source: &str) -> Option<PathBuf> {
    let dir = std::env::temp_dir().join("ruda-nvrtc-fail");
    let path = dir.join(format!("{program}-{:016x}.cu", ruda_ir::fnv1a64(source.as_bytes())));
    std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, source)).ok().map(|()| path)
}

/// Replace the `.version` directive of `ptx` with `version`.
pub fn rewrite_ptx_version(ptx: &str, version: PtxVersion) -> Result<String, NvrtcError> {
    let mut out = String::with_capacity(ptx.len());
    let mut found = false;
    for line in ptx.split_inclusive('\n') {
        if !found && line.trim_start().starts_with(".version") {
            found = true;
            let end = if line.ends_with('\n') { "\n" } else { "" };
            out.push_str(&format!(".version {version}{end}"));
        } else {
            out.push_str(line);
        }
    }
    if !found {
        return Err(NvrtcError::Internal("NVRTC's PTX has no .version directive".into()));
    }
    Ok(out)
}
