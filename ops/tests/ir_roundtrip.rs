//! Every registered kernel survives print → parse → print unchanged (with and without
//! locations), and the parsed kernel is the same kernel: it verifies, has the same IR hash and
//! gives byte-identical PTX.

use ruda_codegen_ptx::{emit_ptx, Target};
use ruda_ir::{parse_kernel, print_kernel, print_kernel_with_locs, verify};

#[test]
fn every_registered_kernel_round_trips_through_text() {
    let registry = ruda_ops::registry::registry();
    assert!(!registry.is_empty());
    for r in &registry {
        let k = r.build().unwrap_or_else(|e| panic!("{}: {e}", r.id));
        for (form, text) in [("plain", print_kernel(&k)), ("with locs", print_kernel_with_locs(&k))] {
            let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("{} ({form}): {e}", r.id));
            let again = if form == "plain" { print_kernel(&parsed) } else { print_kernel_with_locs(&parsed) };
            assert_eq!(again, text, "{} ({form}): print(parse(print(k))) differs", r.id);
            verify(&parsed).unwrap_or_else(|e| panic!("{} ({form}): parsed kernel does not verify: {e}", r.id));
        }
        let parsed = parse_kernel(&print_kernel_with_locs(&k)).expect("parsed above");
        assert_eq!(parsed.ir_hash(), k.ir_hash(), "{}", r.id);
        let target = Target::new(r.targets[0]);
        assert_eq!(
            emit_ptx(&parsed, &target).unwrap_or_else(|e| panic!("{}: {e}", r.id)),
            emit_ptx(&k, &target).unwrap_or_else(|e| panic!("{}: {e}", r.id)),
            "{}: PTX of the parsed kernel differs",
            r.id
        );
    }
}
