//! Helpers shared by the PTX backend's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};
use ruda_ir::{AddrSpace, Kernel, KernelBuilder, ScalarType, Type, Value};

/// Every scalar type that may live in memory (all but `pred`).
pub const DATA_TYPES: [ScalarType; 12] = [
    ScalarType::I8,
    ScalarType::I16,
    ScalarType::I32,
    ScalarType::I64,
    ScalarType::U8,
    ScalarType::U16,
    ScalarType::U32,
    ScalarType::U64,
    ScalarType::F16,
    ScalarType::BF16,
    ScalarType::F32,
    ScalarType::F64,
];

/// The types the IR does arithmetic on.
pub const ARITH_TYPES: [ScalarType; 8] = [
    ScalarType::I16,
    ScalarType::U16,
    ScalarType::I32,
    ScalarType::U32,
    ScalarType::I64,
    ScalarType::U64,
    ScalarType::F32,
    ScalarType::F64,
];

pub fn global(t: ScalarType) -> Type {
    Type::Ptr(AddrSpace::Global, t)
}

/// The text with every run of spaces and tabs made one space (alignment-independent checks).
pub fn squash(text: &str) -> String {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n")
}

/// Emit `k` for `arch` with the default PTX version, panicking with the error.
pub fn emit(k: &Kernel, arch: Arch) -> String {
    emit_ptx(k, &Target::new(arch)).unwrap_or_else(|e| panic!("emitting `{}` for {arch}: {e}", k.name))
}

/// Emit `k` for each of `arches` and assemble the PTX with ptxas, checking that it does not
/// spill. Returns false (after a loud SKIPPED line) when there is no ptxas and
/// `RUDA_REQUIRE_PTXAS` is not `1`.
pub fn assemble_for(k: &Kernel, arches: &[Arch]) -> bool {
    let tool = match ptxas::ptxas_or_skip(&format!("assembling `{}`", k.name)) {
        Ok(Some(tool)) => tool,
        Ok(None) => return false,
        Err(e) => panic!("{e}"),
    };
    for &arch in arches {
        let ptx = emit(k, arch);
        let report = ptxas::assemble_with(&tool, &ptx, arch).unwrap_or_else(|e| panic!("`{}`: {e}", k.name));
        let entry =
            report.entry(&k.name).unwrap_or_else(|| panic!("no report for `{}` on {arch}:\n{}", k.name, report.log));
        assert!(entry.registers > 0, "`{}` on {arch}: {}", k.name, report.log);
        assert_eq!(entry.spill_store_bytes + entry.spill_load_bytes, 0, "`{}` spills on {arch}: {entry}", k.name);
        assert!(!report.log.contains("warning"), "`{}` on {arch}: ptxas warned:\n{}", k.name, report.log);
    }
    true
}

/// A kernel that stores values of any type into one byte buffer, each at its own slot, so
/// that every tested operation has a visible effect.
pub struct Sink {
    pub out: Value,
    next: u32,
}

impl Sink {
    /// Declares the `out` parameter; call before other parameters or after, as convenient.
    pub fn new(b: &mut KernelBuilder) -> Sink {
        Sink { out: b.param("out", global(ScalarType::U8)), next: 0 }
    }

    /// Store `v` (scalar, vector or predicate) into the next slot.
    #[track_caller]
    pub fn put(&mut self, b: &mut KernelBuilder, v: Value) {
        let ty = b.ty(v);
        let v = if ty == Type::PRED {
            let one = b.const_u32(1);
            let zero = b.const_u32(0);
            b.select(v, one, zero)
        } else {
            v
        };
        let elem = b.ty(v).elem();
        let p = b.ptr_cast(self.out, elem);
        let i = b.const_u32(self.next);
        self.next += 4;
        let p = b.ptr_add(p, i);
        b.store(p, v);
    }
}
