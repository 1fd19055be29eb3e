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
