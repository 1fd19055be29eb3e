//! Every registered configuration builds, verifies, and has a unique id.

use std::collections::HashSet;

#[test]
fn every_registered_kernel_verifies_and_ids_are_unique() {
    let mut ids = HashSet::new();
    let reg = ruda_ops::registry::registry();
    assert!(reg.len() > 40, "registry unexpectedly small: {}", reg.len());
    for r in &reg {
        assert!(ids.insert(r.id.clone()), "duplicate id {}", r.id);
        assert!(!r.id.contains(char::is_whitespace), "id {:?} has whitespace", r.id);
        let k = r.build().unwrap_or_else(|e| panic!("{} does not verify: {e}", r.id));
        assert_eq!(k.name, r.id.replace('.', "_"));
    }
}

/// Every recorded source location is a workspace-relative path: a location inside the standard
/// library (a `#[track_caller]` builder passed as a fn item through `Fn::call`) would put a
/// toolchain path into the PTX `.file` lines, which then change with the Rust version.
#[test]
fn source_locations_point_into_the_workspace() {
    for r in ruda_ops::registry::registry() {
        let k = r.build().unwrap_or_else(|e| panic!("{}: {e}", r.id));
        k.walk(|_, inst| {
            if let Some(loc) = &inst.loc {
                assert!(!loc.file.starts_with('/') && !loc.file.contains("rustc"), "{}: location {loc}", r.id);
            }
        });
    }
}

/// The README's count of registered configurations is the registry's (it said 638 when there were 798).
#[test]
fn the_readme_counts_every_registered_configuration() {
    let readme = include_str!("../../README.md");
    let count = ruda_ops::registry::registry().len();
    let claim = format!("(`rudac list`, {count})");
    assert!(readme.contains(&claim), "README.md should say {claim:?}: update its op library's count");
}
