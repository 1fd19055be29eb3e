//! The module-cache key and the cache's hit logic, without a GPU.

use std::cell::Cell;

use ruda_runtime::{Arch, CacheStats, Compiler, CudaVersion, ModuleCache, ModuleKey, PtxVersion, Target};

fn base() -> ModuleKey {
    ModuleKey {
        device_name: "NVIDIA H200".into(),
        compute_capability: (9, 0),
        driver_version: CudaVersion::new(12, 9),
        compiler: Compiler::Ptx,
        compiler_version: Compiler::Ptx.version().into(),
        ir_hash: 0x1234_5678_9abc_def0,
        target: Target { arch: Arch::Sm90, ptx_version: None },
    }
}

/// One edit of one key component.
type Change = fn(&mut ModuleKey);

#[test]
fn every_component_changes_the_key() {
    let variants: Vec<(&str, Change)> = vec![
        ("device name", |k| k.device_name = "NVIDIA H100 80GB HBM3".into()),
        ("compute capability", |k| k.compute_capability = (8, 9)),
        ("driver version", |k| k.driver_version = CudaVersion::new(13, 0)),
        ("compiler", |k| k.compiler = Compiler::Nvrtc),
        ("compiler version", |k| k.compiler_version = "ruda-codegen-ptx 0.2.0".into()),
        ("ir hash", |k| k.ir_hash ^= 1),
        ("arch", |k| k.target.arch = Arch::Sm90a),
        ("ptx version", |k| k.target.ptx_version = Some(PtxVersion::new(8, 0))),
    ];
    let b = base();
    assert_eq!(b, base());
    assert_eq!(b.fingerprint(), base().fingerprint());
    let mut fingerprints = vec![b.fingerprint()];
    for (what, change) in &variants {
        let mut k = base();
        change(&mut k);
        assert_ne!(k, b, "changing the {what} must change the key");
        assert_ne!(k.fingerprint(), b.fingerprint(), "changing the {what} must change the fingerprint");
        fingerprints.push(k.fingerprint());
    }
    fingerprints.sort();
    fingerprints.dedup();
    assert_eq!(fingerprints.len(), variants.len() + 1);
}

#[test]
fn hits_skip_the_build_and_failures_are_not_cached() {
    let cache: ModuleCache<String> = ModuleCache::new();
    let builds = Cell::new(0);
    let build = || {
        builds.set(builds.get() + 1);
        Ok::<_, String>(format!("module #{}", builds.get()))
    };
    let a = cache.get_or_try_insert(&base(), build).unwrap();
    let b = cache.get_or_try_insert(&base(), build).unwrap();
    assert_eq!(builds.get(), 1);
    assert_eq!((a.as_str(), b.as_str()), ("module #1", "module #1"));

    let mut other = base();
    other.ir_hash ^= 1;
    let c = cache.get_or_try_insert(&other, build).unwrap();
    assert_eq!(c.as_str(), "module #2");

    let mut failing = base();
    failing.compiler = Compiler::Nvrtc;
    assert!(cache.get_or_try_insert(&failing, || Err::<String, _>("no nvrtc")).is_err());
    let d = cache.get_or_try_insert(&failing, build).unwrap();
    assert_eq!(d.as_str(), "module #3", "a failed build is retried");
    assert_eq!(cache.stats(), CacheStats { hits: 1, misses: 4, entries: 3 });
}
