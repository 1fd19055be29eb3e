//! Kernel launches: arguments, the launch checks every engine shares, compilation on a
//! module-cache miss (GPU) and the interpreter run (CPU). On top of tensors and streams.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ruda_codegen_nvrtc::{compile_with_source, rewrite_ptx_version};
use ruda_codegen_ptx::{emit_ptx, PtxVersion};
use ruda_ir::interp::{self, KernelArg, LaunchConfig};
use ruda_ir::{AddrSpace, Constant, Kernel, Type};

use crate::cache::ModuleKey;
use crate::context::{Capture, LaunchRecord, Replay};
use crate::cuda::{load_module, CudaCore, LoadedModule, DEFAULT_DYNAMIC_SHARED_LIMIT};
use crate::device::Device;
use crate::dtype::Element;
use crate::env::{self, Compiler};
use crate::error::{ModuleLoadError, Result, RuntimeError};
use crate::stream::Stream;
use crate::target::ptx_text_version;
use crate::tensor::Tensor;

/// One kernel argument. A tensor passes the address of its first element (buffer base plus
/// offset); a scalar is passed by value and must have exactly the parameter's type.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    Tensor(&'a Tensor),
    Scalar(Constant),
}

impl Arg<'_> {
    /// A scalar argument of the element's own type (`Arg::scalar(2.0f32)` for an `f32` param).
    pub fn scalar<T: Element>(v: T) -> Arg<'static> {
        Arg::Scalar(v.to_constant())
    }
}

impl<'a> From<&'a Tensor> for Arg<'a> {
    fn from(t: &'a Tensor) -> Arg<'a> {
        Arg::Tensor(t)
    }
}

impl From<Constant> for Arg<'_> {
    fn from(c: Constant) -> Self {
        Arg::Scalar(c)
    }
}

/// Something launchable: a kernel and its IR hash (the module-cache key part).
/// [`Kernel`] computes the hash at each CUDA launch (it prints the kernel);
/// [`HashedKernel`] computes it once, for kernels launched many times.
pub trait Launchable {
    fn kernel(&self) -> &Kernel;
    fn ir_hash(&self) -> u64;
}

impl Launchable for Kernel {
    fn kernel(&self) -> &Kernel {
        self
    }
    fn ir_hash(&self) -> u64 {
        Kernel::ir_hash(self)
    }
}

/// A kernel with its IR hash computed once.
#[derive(Clone, Debug)]
pub struct HashedKernel {
    kernel: Arc<Kernel>,
    ir_hash: u64,
}

impl HashedKernel {
    pub fn new(kernel: Kernel) -> HashedKernel {
        let ir_hash = kernel.ir_hash();
        HashedKernel { kernel: Arc::new(kernel), ir_hash }
    }
}

impl Launchable for HashedKernel {
    fn kernel(&self) -> &Kernel {
        &self.kernel
    }
    fn ir_hash(&self) -> u64 {
        self.ir_hash
    }
}

impl Stream {
    /// Launch `kernel` over `cfg` with `args`, one per kernel parameter in order.
    ///
    /// CPU: runs the interpreter now. Each buffer argument gets exclusive access to its bytes
    /// from its first element to the next argument's start in the same buffer (or the end);
    /// arguments whose elements overlap (the same tensor twice, in-place use) are an error,
    /// because the interpreter takes one `&mut [u8]` per argument.
    ///
    /// CUDA: compiles on a module-cache miss, then queues the launch and returns. Arguments may
    /// alias. More than 48 KiB of dynamic shared memory raises the kernel's limit first.
    pub fn launch<K: Launchable + ?Sized>(&self, kernel: &K, cfg: LaunchConfig, args: &[Arg<'_>]) -> Result<()> {
        let k = kernel.kernel();
        validate_launch(k, &cfg)?;
        check_args(k, self.device(), args)?;
        let capturing = match &*self.core().capture() {
            Capture::Idle => false,
            Capture::Active(_) => true,
            Capture::Invalidated(reason) => {
                return Err(RuntimeError::GraphCapture {
                    op: format!("launching kernel `{}` on {self:?}", k.name),
                    message: format!(
                        "the stream's graph capture was ended by {reason}; call end_capture before launching again"
                    ),
                })
            }
        };
        match (self.device().cuda_core(), capturing) {
            (None, false) => launch_cpu(k, &cfg, args)?,
            (None, true) => self.capture_cpu(k, cfg, args)?,
            (Some(core), _) => self.launch_cuda(core, kernel, &cfg, args)?,
        }
        if capturing {
            self.keep_for_graph(args);
        } else {
            self.device().counters_core().launched(1);
        }
        self.note_launch(|| LaunchRecord {
            kernel: k.name.clone(),
            grid: cfg.grid,
            block: cfg.block,
            dynamic_shared_bytes: cfg.dynamic_shared_bytes,
        });
        Ok(())
    }

    /// Record a CPU launch into the stream's capture: the kernel, its configuration and its
    /// arguments (tensors by handle), run over the buffers' contents at each replay.
    /// Arguments the interpreter would refuse are refused now, as a launch would be.
    fn capture_cpu(&self, kernel: &Kernel, cfg: LaunchConfig, args: &[Arg<'_>]) -> Result<()> {
        cpu_buffer_groups(kernel, args)?;
        let kernel = kernel.clone();
        let owned: Vec<OwnedArg> = args
            .iter()
            .map(|a| match a {
                Arg::Tensor(t) => OwnedArg::Tensor((*t).clone()),
                Arg::Scalar(c) => OwnedArg::Scalar(*c),
            })
            .collect();
        let replay: Replay = Box::new(move || {
            let args: Vec<Arg<'_>> = owned
                .iter()
                .map(|a| match a {
                    OwnedArg::Tensor(t) => Arg::Tensor(t),
                    OwnedArg::Scalar(c) => Arg::Scalar(*c),
                })
                .collect();
            launch_cpu(&kernel, &cfg, &args)
        });
        if let Capture::Active(a) = &mut *self.core().capture() {
            a.replays.push(replay);
        }
        Ok(())
    }

    /// Count a captured kernel and keep its buffers alive for the graph (its addresses are
    /// baked into the graph on a GPU).
    fn keep_for_graph(&self, args: &[Arg<'_>]) {
        if let Capture::Active(a) = &mut *self.core().capture() {
            a.kernels += 1;
            for arg in args {
                if let Arg::Tensor(t) = arg {
                    a.buffers.push(Box::new(t.buffer().clone()));
                }
            }
        }
    }

    fn launch_cuda<K: Launchable + ?Sized>(
        &self,
        core: &Arc<CudaCore>,
        kernel: &K,
        cfg: &LaunchConfig,
        args: &[Arg<'_>],
    ) -> Result<()> {
        let k = kernel.kernel();
        let invalid = |message: String| RuntimeError::InvalidLaunch { kernel: k.name.clone(), message };
        let info = &core.info;
        let shared = k.static_shared_bytes() as u64 + cfg.dynamic_shared_bytes as u64;
        if shared > info.max_shared_memory_per_block_optin as u64 {
            return Err(invalid(format!(
                "{} bytes of static plus {} of dynamic shared memory exceed the {} bytes a block may use on {}",
                k.static_shared_bytes(),
                cfg.dynamic_shared_bytes,
                info.max_shared_memory_per_block_optin,
                self.device()
            )));
        }
        let compiler = self.device().compiler().unwrap_or(Compiler::Ptx);
        // Hook for Hopper-only kernels: no IR operation needs sm_90a yet.
        let target = self.device().target(false)?;
        let key = ModuleKey {
            device_name: info.name.clone(),
            compute_capability: info.compute_capability,
            driver_version: info.driver_version,
            compiler,
            compiler_version: compiler.identity()?,
            ir_hash: kernel.ir_hash(),
            target,
        };
        let module = core.modules.get_or_try_insert(&key, || build_module(core, k, &key))?;
        if cfg.dynamic_shared_bytes > DEFAULT_DYNAMIC_SHARED_LIMIT {
            module.ensure_dynamic_shared(cfg.dynamic_shared_bytes).map_err(invalid)?;
        }
        let mut words = Vec::with_capacity(args.len());
        for arg in args {
            words.push(match arg {
                Arg::Scalar(c) => c.bits,
                Arg::Tensor(t) => {
                    t.buffer().note_use(self);
                    t.buffer().address() + (t.offset() * t.dtype().size()) as u64
                }
            });
        }
        let stream = self.cuda().ok_or_else(|| RuntimeError::DeviceMismatch {
            op: format!("kernel `{}`", k.name),
            message: "a CPU stream for a GPU launch".into(),
        })?;
        // SAFETY: `check_args` matched every word to its parameter (pointers to global memory
        // of the tensor's GPU, scalars of the parameter's type), and a freed buffer's block is
        // reused only after a fence recorded on every stream it was used on (this one is
        // noted above).
        unsafe { module.launch(stream, cfg.grid, cfg.block, cfg.dynamic_shared_bytes, &mut words) }
            .map_err(|message| RuntimeError::Launch { kernel: k.name.clone(), message })
    }
}

/// Compile one kernel for `key` and load it. Writes the PTX (and the CUDA C++ with NVRTC) to
/// `RUDA_DUMP_IR` when set, and the PTX to a temporary file when the driver rejects it, so that
/// the error can point at it.
fn build_module(core: &CudaCore, kernel: &Kernel, key: &ModuleKey) -> Result<LoadedModule> {
    let codegen = |message: String| RuntimeError::Codegen {
        kernel: kernel.name.clone(),
        target: key.target.arch.to_string(),
        message,
    };
    let max = core.info.max_ptx_version;
    let (ptx, cuda) = match key.compiler {
        Compiler::Ptx => (emit_ptx(kernel, &key.target).map_err(|e| codegen(e.to_string()))?, None),
        Compiler::Nvrtc => {
            let (cuda, ptx) = compile_with_source(kernel, &key.target).map_err(|e| codegen(e.to_string()))?;
            (nvrtc_ptx_for_driver(ptx, &key.target, max).map_err(codegen)?, Some(cuda))
        }
    };
    let stem = format!("{}-{:016x}", sanitize(&kernel.name), key.fingerprint());
    let file_name = format!("{stem}.ptx");
    let dumped = match env::var(env::RUDA_DUMP_IR) {
        Some(dir) => {
            if let Some(cuda) = &cuda {
                write_file(Path::new(&dir), &format!("{stem}.cu"), cuda)?;
            }
            Some(write_file(Path::new(&dir), &file_name, &ptx)?)
        }
        None => None,
    };
    if let Some(v) = ptx_text_version(&ptx) {
        if v > max {
            return Err(RuntimeError::PtxVersionTooHigh {
                requested: v.to_string(),
                driver: core.info.driver_version.to_string(),
                max: max.to_string(),
                hint: format!(" (kernel `{}` for {} needs it; a newer driver is needed)", kernel.name, key.target.arch),
            });
        }
    }
    load_module(&core.ctx, &ptx, &kernel.name).map_err(|f| {
        RuntimeError::from(ModuleLoadError {
            kernel: kernel.name.clone(),
            target: key.target.arch.to_string(),
            message: f.message,
            log: f.log,
            ptx_path: dumped.or_else(|| write_file(&std::env::temp_dir().join("ruda-ptx"), &file_name, &ptx).ok()),
        })
    })
}

/// NVRTC labels its PTX with its own ISA version (8.8 for NVRTC 12.9), which may be newer than
/// the driver accepts although the C++ backend uses nothing that new. Unless a version was
/// forced, such PTX is labelled with the driver's newest version instead (when that one knows
/// the architecture); a PTX feature the driver lacks still fails to load, with the JIT's log.
fn nvrtc_ptx_for_driver(
    ptx: String,
    target: &ruda_codegen_ptx::Target,
    max: PtxVersion,
) -> std::result::Result<String, String> {
    match ptx_text_version(&ptx) {
        Some(v) if target.ptx_version.is_none() && v > max && max >= target.arch.min_ptx_version() => {
            rewrite_ptx_version(&ptx, max).map_err(|e| e.to_string())
        }
        _ => Ok(ptx),
    }
}

fn write_file(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| RuntimeError::Io { path: path.clone(), source })?;
    Ok(path)
}

/// A kernel name as a file-name part.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

/// Launch-shape rules every engine enforces, so that the CPU device rejects what a GPU would.
fn validate_launch(kernel: &Kernel, cfg: &LaunchConfig) -> Result<()> {
    let invalid = |message: String| Err(RuntimeError::InvalidLaunch { kernel: kernel.name.clone(), message });
    let (grid, block) = (cfg.grid, cfg.block);
    if grid.contains(&0) || block.contains(&0) {
        return invalid(format!("grid {grid:?} and block {block:?} must be non-zero in every dimension"));
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if threads > 1024 {
        return invalid(format!("block {block:?} has {threads} threads; at most 1024"));
    }
    if block[2] > 64 {
        return invalid(format!("block {block:?}: z is at most 64"));
    }
    if grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 {
        return invalid(format!("grid {grid:?}: x is at most 2^31-1, y and z at most 65535"));
    }
    if let Some(lb) = kernel.launch_bounds {
        if threads > lb.max_threads as u64 {
            return invalid(format!(
                "block {block:?} has {threads} threads but the kernel's launch bounds allow {}",
                lb.max_threads
            ));
        }
    }
    Ok(())
}

/// Each argument against its parameter: count, kind, dtype, device.
fn check_args(kernel: &Kernel, device: &Device, args: &[Arg<'_>]) -> Result<()> {
    if args.len() != kernel.params.len() {
        return Err(RuntimeError::InvalidLaunch {
            kernel: kernel.name.clone(),
            message: format!("the kernel takes {} arguments, {} were given", kernel.params.len(), args.len()),
        });
    }
    for (index, (arg, param)) in args.iter().zip(&kernel.params).enumerate() {
        let bad = |message: String| {
            Err(RuntimeError::InvalidArg { kernel: kernel.name.clone(), index, param: param.name.clone(), message })
        };
        let Some(ty) = kernel.values.get(param.value.index()).map(|d| d.ty) else {
            return bad("the parameter has no value in the kernel (malformed IR)".into());
        };
        match arg {
            Arg::Tensor(t) => match ty {
                Type::Ptr(AddrSpace::Global, elem) if elem == t.dtype().scalar_type() => {
                    if !t.device().same_device(device) {
                        return bad(format!("the tensor is on {}, the launch on {device}", t.device()));
                    }
                }
                Type::Ptr(AddrSpace::Global, elem) => {
                    return bad(format!("a {} tensor for a pointer to {elem}", t.dtype()));
                }
                other => return bad(format!("a tensor for a parameter of type {other}")),
            },
            Arg::Scalar(c) => {
                if ty != Type::Scalar(c.ty) {
                    return bad(format!("a {} scalar for a parameter of type {ty}", c.ty));
                }
            }
        }
    }
    Ok(())
}

/// An argument a captured CPU launch keeps until its replays.
enum OwnedArg {
    Tensor(Tensor),
    Scalar(Constant),
}

/// One buffer argument's byte range in its buffer.
struct Slot {
    arg: usize,
    start: usize,
    len: usize,
}

/// The buffer arguments grouped by buffer, each group's slots sorted by start: an error when two
/// arguments' elements overlap, since the interpreter gives each one exclusive access. The
/// groups' order (by buffer) is the lock order, so concurrent launches cannot deadlock.
fn cpu_buffer_groups<'t>(kernel: &Kernel, args: &[Arg<'t>]) -> Result<Vec<(&'t Tensor, Vec<Slot>)>> {
    let mut groups: BTreeMap<usize, (&Tensor, Vec<Slot>)> = BTreeMap::new();
    for (arg, a) in args.iter().enumerate() {
        if let Arg::Tensor(t) = a {
            let slot = Slot { arg, start: t.offset() * t.dtype().size(), len: t.span_bytes() };
            groups.entry(t.buffer().id()).or_insert_with(|| (t, Vec::new())).1.push(slot);
        }
    }
    let mut sorted = Vec::with_capacity(groups.len());
    for (t, mut slots) in groups.into_values() {
        slots.sort_by_key(|s| (s.start, s.len));
        let mut covered: Option<(usize, usize)> = None; // (end, arg) of the furthest-reaching slot
        for s in slots.iter().filter(|s| s.len > 0) {
            if let Some((end, other)) = covered {
                if s.start < end {
                    return Err(RuntimeError::InvalidArg {
                        kernel: kernel.name.clone(),
                        index: s.arg,
                        param: kernel.params[s.arg].name.clone(),
                        message: format!(
                            "its elements overlap those of argument {other} (`{}`); the CPU device gives each buffer argument exclusive access, so pass distinct memory",
                            kernel.params[other].name
                        ),
                    });
                }
            }
            match covered {
                Some((end, _)) if s.start + s.len <= end => {}
                _ => covered = Some((s.start + s.len, s.arg)),
            }
        }
        sorted.push((t, slots));
    }
    Ok(sorted)
}

fn launch_cpu(kernel: &Kernel, cfg: &LaunchConfig, args: &[Arg<'_>]) -> Result<()> {
    let groups = cpu_buffer_groups(kernel, args)?;
    let mut locked = Vec::with_capacity(groups.len());
    for (t, slots) in groups {
        let host = t.buffer().try_host_lock().ok_or_else(|| RuntimeError::DeviceMismatch {
            op: format!("kernel `{}`", kernel.name),
            message: "a CUDA buffer in a CPU launch".into(),
        })?;
        locked.push((host, slots));
    }
    let mut parts: Vec<Option<&mut [u8]>> = args.iter().map(|_| None).collect();
    for (guard, slots) in locked.iter_mut() {
        let mut rest: &mut [u8] = &mut guard[..];
        let mut base = 0;
        for (i, s) in slots.iter().enumerate() {
            let end = slots.get(i + 1).map_or(base + rest.len(), |next| next.start);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(s.start - base);
            let (mine, tail) = tail.split_at_mut(end - s.start);
            parts[s.arg] = Some(mine);
            rest = tail;
            base = end;
        }
    }
    let mut kargs: Vec<KernelArg<'_>> = args
        .iter()
        .zip(parts)
        .map(|(a, part)| match a {
            Arg::Scalar(c) => KernelArg::Scalar(*c),
            // Every tensor argument got its part above.
            Arg::Tensor(_) => KernelArg::Buffer(part.unwrap_or_default()),
        })
        .collect();
    interp::run_with_threads(kernel, cfg, &mut kargs, env::interp_threads_from_env()?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruda_codegen_ptx::{Arch, Target};

    #[test]
    fn nvrtc_ptx_is_relabelled_for_an_older_driver_unless_a_version_is_forced() {
        let ptx = "// NVVM\n.version 8.8\n.target sm_80\n".to_string();
        let relabel = |target: Target, max| nvrtc_ptx_for_driver(ptx.clone(), &target, max).expect("has a .version");
        // A CUDA 12.4 driver: 8.4 at most.
        assert_eq!(relabel(Target::new(Arch::Sm80), PtxVersion::new(8, 4)), ptx.replace("8.8", "8.4"));
        // New enough already.
        assert_eq!(relabel(Target::new(Arch::Sm80), PtxVersion::new(9, 0)), ptx);
        // A forced version stands (the launch then fails with its own error).
        let forced = Target { arch: Arch::Sm80, ptx_version: Some(PtxVersion::new(8, 8)) };
        assert_eq!(relabel(forced, PtxVersion::new(8, 4)), ptx);
        // A driver too old for the architecture: left for the version check to report.
        assert_eq!(relabel(Target::new(Arch::Sm90a), PtxVersion::new(7, 8)), ptx);
    }
}
