//! Devices: a CUDA GPU, or the CPU running kernels in the IR interpreter.

use std::fmt;
use std::sync::{Arc, Once};

use ruda_codegen_ptx::{PtxVersion, Target};

use crate::alloc::{MemoryStats, PoolId, SHARED_POOL};
use crate::cache::CacheStats;
use crate::context::{Counters, CpuCore, RuntimeCounters, StreamCore};
use crate::cuda::{self, CudaCore, CudaDeviceInfo};
use crate::env::{self, check_env, parse_ptx_version, Compiler, DeviceSpec};
use crate::error::{Result, RuntimeError};
use crate::probe::probe_driver;
use crate::target::{select_arch, select_target};

/// Where tensors live and kernels run. Cheap to clone; clones are the same device, with one
/// default stream and one caching allocator. Every handle on one GPU shares them (and the
/// module cache); each [`Device::cpu`] call makes a CPU device of its own.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

enum DeviceInner {
    Cpu(CpuCore),
    Cuda(CudaDevice),
}

struct CudaDevice {
    core: Arc<CudaCore>,
    compiler: Compiler,
    ptx_version: Option<PtxVersion>,
}

/// Which kind of device, and which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The CPU: kernels run in the IR interpreter.
    Cpu,
    Cuda {
        ordinal: usize,
    },
}

impl Device {
    /// A CPU device (the IR interpreter), with its own default stream and memory cache.
    pub fn cpu() -> Device {
        Device { inner: Arc::new(DeviceInner::Cpu(CpuCore::new())) }
    }

    /// CUDA device `ordinal`, compiling as `RUDA_CUDA_COMPILER` and `RUDA_PTX_VERSION` say. An
    /// error (never a panic) when there is no driver, no such device, or the GPU is too old.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let compiler = Compiler::from_env()?;
        let ptx_version = parse_ptx_version(env::var(env::RUDA_PTX_VERSION).as_deref())?;
        Device::cuda_with(ordinal, compiler, ptx_version)
    }

    /// CUDA device `ordinal` with an explicit compiler and forced PTX ISA version (`None`: the
    /// lowest the target and kernel need). Reads no environment.
    pub fn cuda_with(ordinal: usize, compiler: Compiler, ptx_version: Option<PtxVersion>) -> Result<Device> {
        let core = cuda::core(ordinal).map_err(|e| RuntimeError::CudaUnavailable {
            request: format!("CUDA device {ordinal} is not available"),
            source: Box::new(e),
        })?;
        let info = &core.info;
        let (major, minor) = info.compute_capability;
        // Check a forced PTX version against this GPU and driver now rather than at a launch.
        select_target(select_arch(&info.name, major, minor, false)?, ptx_version, info.driver_version)?;
        Ok(Device { inner: Arc::new(DeviceInner::Cuda(CudaDevice { core, compiler, ptx_version })) })
    }

    /// The device `RUDA_DEVICE` names (see [`DeviceSpec`]); `auto` says on stderr, once per
    /// process, which device it chose and why. Every variable of [`check_env`] is validated
    /// first, on every device: a bad `RUDA_CUDA_COMPILER` is an error on the CPU as well.
    pub fn from_env() -> Result<Device> {
        check_env()?;
        Device::from_spec(DeviceSpec::from_env()?)
    }

    /// The device a [`DeviceSpec`] names.
    pub fn from_spec(spec: DeviceSpec) -> Result<Device> {
        match spec {
            DeviceSpec::Cpu => Ok(Device::cpu()),
            DeviceSpec::Cuda(n) => Device::cuda(n).map_err(|e| match e {
                RuntimeError::CudaUnavailable { source, .. } => {
                    RuntimeError::CudaUnavailable { request: format!("RUDA_DEVICE={spec} cannot be used"), source }
                }
                other => other,
            }),
            DeviceSpec::Auto => {
                let (device, said) = match auto_cuda() {
                    Ok(d) => {
                        let said = d.description();
                        (d, said)
                    }
                    Err(reason) => (Device::cpu(), format!("cpu (the IR interpreter): {reason}")),
                };
                static ANNOUNCE: Once = Once::new();
                ANNOUNCE.call_once(|| eprintln!("ruda: RUDA_DEVICE=auto chose {said}"));
                Ok(device)
            }
        }
    }

    /// `cpu (the IR interpreter)`, or `cuda:N (name, compute capability, driver version)`.
    pub fn description(&self) -> String {
        match &*self.inner {
            DeviceInner::Cpu(_) => "cpu (the IR interpreter)".into(),
            DeviceInner::Cuda(c) => {
                let i = &c.core.info;
                format!(
                    "cuda:{} ({}, compute capability {}.{}, driver CUDA {}, compiler {})",
                    i.ordinal, i.name, i.compute_capability.0, i.compute_capability.1, i.driver_version, c.compiler
                )
            }
        }
    }

    pub fn kind(&self) -> DeviceKind {
        match &*self.inner {
            DeviceInner::Cpu(_) => DeviceKind::Cpu,
            DeviceInner::Cuda(c) => DeviceKind::Cuda { ordinal: c.core.info.ordinal },
        }
    }

    pub fn is_cpu(&self) -> bool {
        matches!(&*self.inner, DeviceInner::Cpu(_))
    }

    pub fn is_cuda(&self) -> bool {
        !self.is_cpu()
    }

    /// Whether two handles address the same memory (CPU and CPU, or the same GPU).
    pub fn same_device(&self, other: &Device) -> bool {
        self.kind() == other.kind()
    }

    /// Name, compute capability, driver and memory of a GPU; `None` on the CPU.
    pub fn cuda_info(&self) -> Option<&CudaDeviceInfo> {
        self.cuda_core().map(|c| &c.info)
    }

    /// The compiler kernels go through on a GPU; `None` on the CPU.
    pub fn compiler(&self) -> Option<Compiler> {
        match &*self.inner {
            DeviceInner::Cpu(_) => None,
            DeviceInner::Cuda(c) => Some(c.compiler),
        }
    }

    /// What a kernel is compiled for on this GPU. `needs_sm90a`: the kernel uses Hopper-only
    /// instructions (no kernel does yet). An error on the CPU device.
    pub fn target(&self, needs_sm90a: bool) -> Result<Target> {
        match &*self.inner {
            DeviceInner::Cpu(_) => Err(RuntimeError::DeviceMismatch {
                op: "Device::target".into(),
                message: "the CPU device runs the IR interpreter and has no PTX target".into(),
            }),
            DeviceInner::Cuda(c) => {
                let info = &c.core.info;
                let (major, minor) = info.compute_capability;
                select_target(select_arch(&info.name, major, minor, needs_sm90a)?, c.ptx_version, info.driver_version)
            }
        }
    }

    /// Wait until all work queued on the device, on every stream, has finished (a no-op on
    /// the CPU).
    pub fn synchronize(&self) -> Result<()> {
        self.forbid_in_capture(|| format!("synchronising {self}"))?;
        self.counters_core().host_sync();
        match self.cuda_core() {
            None => Ok(()),
            Some(core) => core.ctx.synchronize().map_err(|e| {
                RuntimeError::driver(
                    format!("synchronising {self} (an earlier kernel may have failed)"),
                    cuda::describe(e),
                )
            }),
        }
    }

    /// Allocations, host synchronisations and launches on this device so far, over every
    /// stream and every handle of it.
    pub fn counters(&self) -> RuntimeCounters {
        self.counters_core().read()
    }

    pub(crate) fn counters_core(&self) -> &Counters {
        match &*self.inner {
            DeviceInner::Cpu(c) => &c.counters,
            DeviceInner::Cuda(c) => &c.core.counters,
        }
    }

    /// The caching allocator's counters over all its pools: reserved and used bytes, driver
    /// allocations and frees, reuses.
    pub fn memory_stats(&self) -> MemoryStats {
        match &*self.inner {
            DeviceInner::Cpu(c) => c.memory.stats(),
            DeviceInner::Cuda(c) => c.core.memory.stats(),
        }
    }

    /// Give the memory cached by freed buffers (and by dropped [`MemoryPool`]s) back to the
    /// driver, after waiting for the device; the bytes returned. Live buffers keep theirs.
    pub fn release_cached_memory(&self) -> Result<u64> {
        self.synchronize()?;
        Ok(match &*self.inner {
            DeviceInner::Cpu(c) => c.memory.release_cached(),
            DeviceInner::Cuda(c) => c.core.memory.release_cached(),
        })
    }

    /// A private memory pool: buffers allocated in it use segments of their own, which no
    /// other pool's buffers reuse (graph capture needs addresses nobody else will take).
    pub fn create_memory_pool(&self) -> MemoryPool {
        let id = match &*self.inner {
            DeviceInner::Cpu(c) => c.memory.create_pool(),
            DeviceInner::Cuda(c) => c.core.memory.create_pool(),
        };
        MemoryPool { inner: Arc::new(PoolHandle { device: self.clone(), id }) }
    }

    pub(crate) fn pool_stats(&self, pool: PoolId) -> MemoryStats {
        match &*self.inner {
            DeviceInner::Cpu(c) => c.memory.pool_stats(pool),
            DeviceInner::Cuda(c) => c.core.memory.pool_stats(pool),
        }
    }

    /// The stream [`Device::default_stream`] hands out.
    pub(crate) fn default_stream_core(&self) -> &Arc<StreamCore> {
        match &*self.inner {
            DeviceInner::Cpu(c) => &c.default_stream,
            DeviceInner::Cuda(c) => &c.core.default_stream,
        }
    }

    /// Whether two handles allocate from one caching allocator (one GPU, or clones of one
    /// [`Device::cpu`]).
    pub(crate) fn shares_allocator(&self, other: &Device) -> bool {
        match (&*self.inner, &*other.inner) {
            (DeviceInner::Cpu(a), DeviceInner::Cpu(b)) => Arc::ptr_eq(&a.memory, &b.memory),
            (DeviceInner::Cuda(a), DeviceInner::Cuda(b)) => Arc::ptr_eq(&a.core, &b.core),
            _ => false,
        }
    }

    pub(crate) fn cpu_core(&self) -> Option<&CpuCore> {
        match &*self.inner {
            DeviceInner::Cpu(c) => Some(c),
            DeviceInner::Cuda(_) => None,
        }
    }

    /// Hits and misses of the GPU's module cache (all zero on the CPU).
    pub fn module_cache_stats(&self) -> CacheStats {
        self.cuda_core().map(|c| c.modules.stats()).unwrap_or_default()
    }

    pub(crate) fn cuda_core(&self) -> Option<&Arc<CudaCore>> {
        match &*self.inner {
            DeviceInner::Cpu(_) => None,
            DeviceInner::Cuda(c) => Some(&c.core),
        }
    }
}

/// CUDA device 0 if a driver and a usable device are present; else why not, in a few words.
fn auto_cuda() -> Result<Device, String> {
    let probe = probe_driver().map_err(|e| match e {
        RuntimeError::NoCudaDriver { reason } => format!("no CUDA driver ({reason})"),
        other => other.to_string(),
    })?;
    if probe.device_count == 0 {
        return Err(format!("the CUDA driver ({}, CUDA {}) reports no device", probe.library, probe.driver_version));
    }
    Device::cuda(0).map_err(|e| match e {
        RuntimeError::CudaUnavailable { source, .. } => format!("CUDA device 0 is not usable: {source}"),
        other => other.to_string(),
    })
}

/// A private memory pool of one device ([`Device::create_memory_pool`]). Cheap to clone; when
/// the last handle drops, the pool takes no new allocations, and its memory goes back to the
/// driver at the next [`Device::release_cached_memory`] once its buffers have dropped.
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<PoolHandle>,
}

struct PoolHandle {
    device: Device,
    id: PoolId,
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        match &*self.device.inner {
            DeviceInner::Cpu(c) => c.memory.retire_pool(self.id),
            DeviceInner::Cuda(c) => c.core.memory.retire_pool(self.id),
        }
    }
}

impl MemoryPool {
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// This pool's counters.
    pub fn stats(&self) -> MemoryStats {
        self.inner.device.pool_stats(self.inner.id)
    }

    pub(crate) fn id(&self) -> PoolId {
        self.inner.id
    }
}

/// The pool an allocation goes to: the given private one, else the shared one.
pub(crate) fn pool_id(pool: Option<&MemoryPool>) -> PoolId {
    pool.map_or(SHARED_POOL, MemoryPool::id)
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryPool({:?} on {})", self.inner.id, self.inner.device)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.same_device(other)
    }
}

impl Eq for Device {}

impl fmt::Display for Device {
    /// `cpu` or `cuda:N`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
