//! The CUDA side: one context per GPU with its default stream, module cache and caching
//! allocator; device memory for the allocator; module loading with the JIT's error log; raw
//! launches. Nothing here runs before [`crate::probe::probe_driver`] has succeeded.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use ruda_codegen_ptx::PtxVersion;

use crate::alloc::{Allocator, Memory};
use crate::cache::ModuleCache;
use crate::context::{Counters, StreamCore};
use crate::error::{Result, RuntimeError};
use crate::probe::probe_driver;
use crate::target::{max_ptx_for_driver, select_arch, CudaVersion};

#[cfg(target_endian = "big")]
compile_error!("kernel parameters are passed as little-endian words; big-endian hosts are not supported");

/// What the runtime knows about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (u32, u32),
    /// The CUDA version the driver supports.
    pub driver_version: CudaVersion,
    /// The newest PTX ISA that driver JIT-compiles.
    pub max_ptx_version: PtxVersion,
    pub total_memory: u64,
    pub multiprocessor_count: u32,
    /// The most shared memory (static + dynamic) one block may opt in to.
    pub max_shared_memory_per_block_optin: u32,
}

/// Dynamic shared memory a kernel may use without opting in (CUDA's fixed 48 KiB).
pub(crate) const DEFAULT_DYNAMIC_SHARED_LIMIT: u32 = 48 * 1024;

/// One GPU as the process sees it: shared by every [`crate::Device`] handle on that ordinal, so
/// that they share one context, default stream, module cache and allocator.
pub(crate) struct CudaCore {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) default_stream: Arc<StreamCore>,
    pub(crate) info: CudaDeviceInfo,
    pub(crate) modules: ModuleCache<LoadedModule>,
    pub(crate) memory: Arc<Allocator<DeviceMemory>>,
    pub(crate) counters: Counters,
}

/// Segments for the caching allocator: `cuMemAlloc` (at least 256-byte aligned) and
/// `cuMemFree`; fences are CUDA events (without timing), kept for reuse once the allocator is
/// done with them, so that freeing a buffer records an event but creates none.
pub(crate) struct DeviceMemory {
    ctx: Arc<CudaContext>,
    spare_events: Mutex<Vec<CudaEvent>>,
}

/// At most this many spare events are kept.
const SPARE_EVENTS: usize = 1024;

impl DeviceMemory {
    /// An event recorded after the work queued on `stream` so far.
    pub(crate) fn fence(&self, stream: &CudaStream) -> std::result::Result<CudaEvent, DriverError> {
        let spare = self.spare_events.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let event = match spare {
            Some(e) => e,
            None => self.ctx.new_event(None)?,
        };
        event.record(stream)?;
        Ok(event)
    }
}

impl Memory for DeviceMemory {
    type Fence = CudaEvent;

    fn allocate(&self, bytes: usize) -> std::result::Result<u64, String> {
        self.ctx.bind_to_thread().map_err(describe)?;
        // SAFETY: a plain allocation in the bound context.
        unsafe { result::malloc_sync(bytes) }.map_err(|e| format!("cuMemAlloc of {bytes} bytes: {}", describe(e)))
    }

    unsafe fn release(&self, address: u64, _bytes: usize) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `address` came from `allocate` and is no longer used (the caller's contract).
        self.ctx.record_err(unsafe { result::free_sync(address) });
    }

    fn is_complete(&self, fence: &CudaEvent) -> bool {
        // An error (a failed kernel) keeps the block out of use, which is the safe side.
        fence.try_is_complete().unwrap_or(false)
    }

    fn recycle(&self, fence: CudaEvent) {
        let mut spare = self.spare_events.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_EVENTS {
            spare.push(fence);
        }
    }
}

/// `SomeName (CUresult code): description` for a driver error.
pub(crate) fn describe(e: DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?}: {}", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

fn driver_err(context: &str) -> impl Fn(DriverError) -> RuntimeError + '_ {
    move |e| RuntimeError::driver(context, describe(e))
}

/// The core for `ordinal`, opened on first use. Probes the driver first.
pub(crate) fn core(ordinal: usize) -> Result<Arc<CudaCore>> {
    static CORES: OnceLock<Mutex<HashMap<usize, Arc<CudaCore>>>> = OnceLock::new();
    let probe = probe_driver()?;
    if ordinal >= probe.device_count {
        return Err(RuntimeError::NoSuchDevice { ordinal, count: probe.device_count });
    }
    let mut cores = CORES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = cores.get(&ordinal) {
        return Ok(Arc::clone(c));
    }
    let c = Arc::new(open(ordinal, probe.driver_version)?);
    cores.insert(ordinal, Arc::clone(&c));
    Ok(c)
}

fn open(ordinal: usize, driver_version: CudaVersion) -> Result<CudaCore> {
    let ctx = CudaContext::new(ordinal).map_err(driver_err("creating the CUDA context"))?;
    // SAFETY: cudarc's event tracking guards its own `CudaSlice`s, which the runtime does not
    // use: device memory comes from the caching allocator, which orders reuse across streams
    // with its own events. Without it, cudarc records no events behind our back (which also
    // keeps launches capturable into CUDA graphs).
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(driver_err("creating the CUDA stream"))?;
    let name = ctx.name().map_err(driver_err("reading the device name"))?;
    let (major, minor) = ctx.compute_capability().map_err(driver_err("reading the compute capability"))?;
    let (major, minor) = (major.max(0) as u32, minor.max(0) as u32);
    // Fail here, not at the first launch, on a GPU no kernel can run on.
    select_arch(&name, major, minor, false)?;
    let max_ptx_version = max_ptx_for_driver(driver_version)
        .ok_or_else(|| RuntimeError::UnsupportedDriver { version: driver_version.to_string() })?;
    let attr = |a: sys::CUdevice_attribute, what: &str| -> Result<u32> {
        ctx.attribute(a).map(|v| v.max(0) as u32).map_err(driver_err(what))
    };
    let info = CudaDeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        driver_version,
        max_ptx_version,
        total_memory: ctx.total_mem().map_err(driver_err("reading the memory size"))? as u64,
        multiprocessor_count: attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "reading the multiprocessor count",
        )?,
        max_shared_memory_per_block_optin: attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "reading the shared-memory limit",
        )?,
    };
    let memory = Arc::new(Allocator::new(DeviceMemory { ctx: Arc::clone(&ctx), spare_events: Mutex::new(Vec::new()) }));
    Ok(CudaCore {
        ctx,
        default_stream: StreamCore::new(Some(stream)),
        info,
        modules: ModuleCache::new(),
        memory,
        counters: Counters::default(),
    })
}

/// A module loaded into a context, and the kernel's function in it.
pub(crate) struct LoadedModule {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    /// The `MAX_DYNAMIC_SHARED_SIZE_BYTES` attribute as last set (starts at CUDA's default).
    dynamic_shared_limit: AtomicU32,
}

// SAFETY: CUDA module and function handles may be used from any thread of the process; every
// use binds the owning context first.
unsafe impl Send for LoadedModule {}
unsafe impl Sync for LoadedModule {}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: the module was loaded by us and is unloaded once, here.
        self.ctx.record_err(unsafe { result::module::unload(self.module) });
    }
}

/// Why the driver would not load a module: the error and the JIT's log.
pub(crate) struct LoadFailure {
    pub message: String,
    pub log: String,
}

/// Load PTX text into `ctx` with the JIT error log captured, and find `function` in it.
pub(crate) fn load_module(ctx: &Arc<CudaContext>, ptx: &str, function: &str) -> Result<LoadedModule, LoadFailure> {
    let fail = |message: String| LoadFailure { message, log: String::new() };
    let src = CString::new(ptx).map_err(|_| fail("the PTX text contains a NUL byte".into()))?;
    let name = CString::new(function).map_err(|_| fail(format!("the kernel name {function:?} contains a NUL byte")))?;
    ctx.bind_to_thread().map_err(|e| fail(describe(e)))?;

    const LOG_BYTES: usize = 64 * 1024;
    let mut log = vec![0u8; LOG_BYTES];
    let mut options =
        [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    // The driver takes option values as pointer-sized words: the buffer, then its size.
    let mut values = [log.as_mut_ptr() as *mut c_void, LOG_BYTES as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `src` is NUL-terminated PTX; the option arrays have the stated length and the
    // log buffer outlives the call.
    let rc = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            src.as_ptr() as *const c_void,
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if let Err(e) = rc.result() {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        return Err(LoadFailure {
            message: describe(e),
            log: String::from_utf8_lossy(&log[..end]).trim_end().to_string(),
        });
    }
    // SAFETY: `module` was just loaded.
    match unsafe { result::module::get_function(module, name) } {
        Ok(function) => Ok(LoadedModule {
            ctx: Arc::clone(ctx),
            module,
            function,
            dynamic_shared_limit: AtomicU32::new(DEFAULT_DYNAMIC_SHARED_LIMIT),
        }),
        Err(e) => {
            // SAFETY: loaded above and not used elsewhere.
            ctx.record_err(unsafe { result::module::unload(module) });
            Err(fail(format!("the PTX has no entry `{function}`: {}", describe(e))))
        }
    }
}

impl LoadedModule {
    /// Raise the function's dynamic shared-memory limit to at least `bytes` (needed above 48 KiB).
    pub(crate) fn ensure_dynamic_shared(&self, bytes: u32) -> Result<(), String> {
        if bytes <= self.dynamic_shared_limit.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(describe)?;
        // SAFETY: a live function handle of this module.
        unsafe {
            result::function::set_function_attribute(
                self.function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(|e| format!("setting MAX_DYNAMIC_SHARED_SIZE_BYTES to {bytes}: {}", describe(e)))?;
        self.dynamic_shared_limit.fetch_max(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Launch on `stream`. `params` holds one little-endian word per kernel parameter (device
    /// addresses and scalars); the driver reads each parameter's own width from its word.
    ///
    /// # Safety
    /// The words must match the kernel's parameter list, and every address must point to live
    /// device memory of this context large enough for what the kernel touches.
    pub(crate) unsafe fn launch(
        &self,
        stream: &CudaStream,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared_bytes: u32,
        params: &mut [u64],
    ) -> Result<(), String> {
        self.ctx.bind_to_thread().map_err(describe)?;
        let mut ptrs: Vec<*mut c_void> = params.iter_mut().map(|w| w as *mut u64 as *mut c_void).collect();
        result::launch_kernel(
            self.function,
            (grid[0], grid[1], grid[2]),
            (block[0], block[1], block[2]),
            dynamic_shared_bytes,
            stream.cu_stream(),
            &mut ptrs,
        )
        .map_err(describe)
    }
}
