//! The in-memory module cache: one per CUDA device, keyed by everything that changes the
//! compiled code or whether it loads.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use ruda_codegen_ptx::Target;

use crate::env::Compiler;
use crate::target::CudaVersion;

/// Identity of one compiled module. Two launches share a module only when every field agrees.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey {
    pub device_name: String,
    pub compute_capability: (u32, u32),
    pub driver_version: CudaVersion,
    pub compiler: Compiler,
    pub compiler_version: String,
    /// [`ruda_ir::Kernel::ir_hash`]
    pub ir_hash: u64,
    /// Architecture and the forced PTX ISA version, if any.
    pub target: Target,
}

impl ModuleKey {
    /// A stable 64-bit digest of the key (FNV-1a of its canonical text): names dumped PTX
    /// files, and will name entries of the on-disk cache.
    pub fn fingerprint(&self) -> u64 {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = write!(
            text,
            "device={}\ncc={}.{}\ndriver={}\ncompiler={}\ncompiler_version={}\nir={:016x}\narch={}\nptx={}\n",
            self.device_name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.driver_version,
            self.compiler,
            self.compiler_version,
            self.ir_hash,
            self.target.arch,
            self.target.ptx_version.map(|v| v.to_string()).unwrap_or_else(|| "auto".into()),
        );
        ruda_ir::fnv1a64(text.as_bytes())
    }
}

/// Hit and miss counts of a module cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
}

/// A thread-safe map from [`ModuleKey`] to a loaded module. Generic so that the hit/miss logic
/// is testable without a GPU.
pub struct ModuleCache<M> {
    inner: Mutex<CacheInner<M>>,
}

struct CacheInner<M> {
    map: HashMap<ModuleKey, Arc<M>>,
    hits: u64,
    misses: u64,
}

impl<M> Default for ModuleCache<M> {
    fn default() -> Self {
        ModuleCache { inner: Mutex::new(CacheInner { map: HashMap::new(), hits: 0, misses: 0 }) }
    }
}

impl<M> ModuleCache<M> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The module for `key`, built by `build` on a miss. A failed build is not cached, so a
    /// later call retries it. The lock is held while building: concurrent first launches of
    /// one kernel compile it once.
    pub fn get_or_try_insert<E>(&self, key: &ModuleKey, build: impl FnOnce() -> Result<M, E>) -> Result<Arc<M>, E> {
        // The map stays consistent even if a builder panicked, so a poisoned lock is usable.
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = inner.map.get(key) {
            let m = Arc::clone(m);
            inner.hits += 1;
            return Ok(m);
        }
        inner.misses += 1;
        let m = Arc::new(build()?);
        inner.map.insert(key.clone(), Arc::clone(&m));
        Ok(m)
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        CacheStats { hits: inner.hits, misses: inner.misses, entries: inner.map.len() }
    }
}
