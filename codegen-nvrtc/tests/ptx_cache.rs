//! `RUDA_NVRTC_CACHE`: NVRTC's PTX is kept on disk and reused, an entry per library, options,
//! forced version and source; a library given explicitly (the compile benchmark's path) is
//! always called. Its own test binary, because it sets the process environment.

use std::path::{Path, PathBuf};

use ruda_codegen_nvrtc::{compile_module_with, compile_to_ptx, compile_with_source, nvrtc_or_skip, CACHE_VAR};
use ruda_codegen_ptx::{Arch, Target};
use ruda_ir::{AddrSpace, Kernel, KernelBuilder, ScalarType, Type};

fn store_kernel(name: &str, value: f32) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let p = b.param("p", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let v = b.const_f32(value);
    b.store(p, v);
    b.finish().expect("verifies")
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.expect("a readable entry").path()).collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

#[test]
fn nvrtc_ptx_is_kept_per_source_target_and_version_and_reused() {
    let Some(nvrtc) = nvrtc_or_skip("the NVRTC cache test").unwrap_or_else(|e| panic!("{e}")) else { return };
    let dir = std::env::temp_dir().join(format!("ruda-nvrtc-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The only test in this binary, so no other thread reads the environment meanwhile.
    std::env::set_var(CACHE_VAR, &dir);
    let sm80 = Target::new(Arch::Sm80);
    let one = store_kernel("k", 1.0);

    let first = compile_to_ptx(&one, &sm80).expect("compiles");
    let stored = entries(&dir);
    assert_eq!(stored.len(), 1, "one entry, no temporary left: {stored:?}");
    assert_eq!(std::fs::read_to_string(&stored[0]).unwrap(), first);

    // A hit reads the entry instead of calling NVRTC: a planted entry comes back as it is.
    let planted = format!("{first}// planted\n");
    std::fs::write(&stored[0], &planted).unwrap();
    assert_eq!(compile_to_ptx(&one, &sm80).unwrap(), planted);
    assert_eq!(compile_with_source(&one, &sm80).unwrap().1, planted, "the runtime's path reads it too");
    // An empty entry is a miss, and is written again.
    std::fs::write(&stored[0], "").unwrap();
    assert_eq!(compile_to_ptx(&one, &sm80).unwrap(), first);
    assert_eq!(std::fs::read_to_string(&stored[0]).unwrap(), first);

    // Another source, architecture or forced PTX version is another entry, with its own PTX.
    let other_value = compile_to_ptx(&store_kernel("k", 2.0), &sm80).unwrap();
    assert_ne!(other_value, first);
    let sm90 = compile_to_ptx(&one, &Target::new(Arch::Sm90)).unwrap();
    assert!(sm90.contains(".target sm_90"), "{sm90}");
    let forced = compile_to_ptx(&one, &Target::with_version_str(Arch::Sm80, Some("8.0")).unwrap()).unwrap();
    assert!(forced.contains(".version 8.0"), "{forced}");
    assert_eq!(entries(&dir).len(), 4);

    // A library given explicitly is always called: nothing read, nothing stored.
    std::fs::write(&stored[0], &planted).unwrap();
    let direct = compile_module_with(&nvrtc, &[&one], &sm80).unwrap();
    assert_eq!(direct, first);
    assert_eq!(entries(&dir).len(), 4);

    // A folder that cannot be made (a file is in the way) warns and compiles on.
    let blocked = dir.join("not-a-folder");
    std::fs::write(&blocked, "").unwrap();
    std::env::set_var(CACHE_VAR, blocked.join("cache"));
    assert_eq!(compile_to_ptx(&one, &sm80).unwrap(), first);

    // Empty means no cache.
    std::env::set_var(CACHE_VAR, "");
    assert_eq!(compile_to_ptx(&one, &sm80).unwrap(), first);
    std::env::remove_var(CACHE_VAR);
    let _ = std::fs::remove_dir_all(&dir);
}
