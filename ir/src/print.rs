//! The text form of the IR: stable, human-readable, and designed to be parsed back.
//!
//! ```text
//! kernel @scale(%0 x: ptr<global,f32>, %1 n: u32) {
//!   .launch_bounds 256
//!   .shared @tile: f32[256] align 16
//!   %2: u32 = special tid.x
//!   %3: pred = cmp.lt %2, %1
//!   if %3 {
//!     %4: ptr<global,f32> = ptradd %0, %2
//!     %5: f32 = load %4
//!     store %4, %5
//!   } else {
//!   }
//! }
//! ```
//!
//! Every defined value carries its type at its definition; operations that convert (`cvt`,
//! `bitcast`, `ptrcast`, `load`) take their target type from it. Float constants are written as
//! hex bit patterns so printing and parsing round-trip exactly. With locations, each line ends
//! in `!loc "file":line:col`.

use std::fmt::Write;

use crate::kernel::{Inst, Kernel, Op, RegionId};

/// The kernel's text form without source locations (what snapshots and humans read).
pub fn print_kernel(k: &Kernel) -> String {
    Printer { k, locs: false, out: String::new() }.kernel()
}

/// The kernel's text form with the Rust source location of each instruction.
pub fn print_kernel_with_locs(k: &Kernel) -> String {
    Printer { k, locs: true, out: String::new() }.kernel()
}

/// One instruction in text form (without nested regions), for error messages.
pub fn print_inst(k: &Kernel, inst: &Inst) -> String {
    let mut p = Printer { k, locs: false, out: String::new() };
    p.inst_head(inst);
    p.out
}

struct Printer<'a> {
    k: &'a Kernel,
    locs: bool,
    out: String,
}

impl Printer<'_> {
    fn kernel(mut self) -> String {
        let k = self.k;
        let params: Vec<String> =
            k.params.iter().map(|p| format!("{} {}: {}", p.value, p.name, k.ty(p.value))).collect();
        let _ = writeln!(self.out, "kernel @{}({}) {{", k.name, params.join(", "));
        if let Some(lb) = k.launch_bounds {
            let _ = write!(self.out, "  .launch_bounds {}", lb.max_threads);
            if let Some(m) = lb.min_blocks {
                let _ = write!(self.out, ", {m}");
            }
            self.out.push('\n');
        }
        for s in &k.shared {
            let _ = writeln!(self.out, "  .shared @{}: {}[{}] align {}", s.name, s.elem, s.len, s.align);
        }
        self.region_body(k.body, 1);
        self.out.push_str("}\n");
        self.out
    }

    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn region_body(&mut self, r: RegionId, depth: usize) {
        let region = self.k.region(r);
        for &id in &region.insts {
            self.indent(depth);
            let inst = self.k.inst(id);
            self.inst_head(inst);
            match &inst.op {
                Op::If { then_region, else_region, .. } => {
                    self.out.push_str(" {\n");
                    self.region_body(*then_region, depth + 1);
                    self.yields(*then_region, depth + 1);
                    self.indent(depth);
                    self.out.push_str("} else {\n");
                    self.region_body(*else_region, depth + 1);
                    self.yields(*else_region, depth + 1);
                    self.indent(depth);
                    self.out.push('}');
                }
                Op::For { body, .. } => {
                    self.out.push_str(" {\n");
                    self.region_body(*body, depth + 1);
                    self.yields(*body, depth + 1);
                    self.indent(depth);
                    self.out.push('}');
                }
                _ => {}
            }
            if self.locs {
                if let Some(loc) = &inst.loc {
                    let _ = write!(self.out, " !loc {:?}:{}:{}", &*loc.file, loc.line, loc.col);
                }
            }
            self.out.push('\n');
        }
    }

    fn yields(&mut self, r: RegionId, depth: usize) {
        let ys = &self.k.region(r).yields;
        if !ys.is_empty() {
            self.indent(depth);
            let _ = writeln!(self.out, "yield {}", list(ys));
        }
    }

    fn inst_head(&mut self, inst: &Inst) {
        let k = self.k;
        if !inst.results.is_empty() {
            let defs: Vec<String> = inst.results.iter().map(|v| format!("{v}: {}", k.ty(*v))).collect();
            let _ = write!(self.out, "{} = ", defs.join(", "));
        }
        let text = match &inst.op {
            Op::Const(c) => format!("const {c}"),
            Op::Special(s) => format!("special {}", s.name()),
            Op::Unary(op, a) => format!("{op} {a}"),
            Op::Binary(op, a, b) => format!("{op} {a}, {b}"),
            Op::Fma(a, b, c) => format!("fma {a}, {b}, {c}"),
            Op::Cmp(op, a, b) => format!("cmp.{op} {a}, {b}"),
            Op::Select(c, a, b) => format!("select {c}, {a}, {b}"),
            Op::Cvt(a, cvt) => {
                let mut s = String::from("cvt");
                if let Some(r) = cvt.rounding {
                    let _ = write!(s, ".{r}");
                }
                if cvt.sat {
                    s.push_str(".sat");
                }
                format!("{s} {a}")
            }
            Op::Bitcast(a, _) => format!("bitcast {a}"),
            Op::PtrAdd(p, i) => format!("ptradd {p}, {i}"),
            Op::PtrCast(p, _) => format!("ptrcast {p}"),
            Op::SharedBase(id) => format!("shared_base @{}", k.shared[id.index()].name),
            Op::DynSharedBase(_) => "dyn_shared_base".to_string(),
            Op::Load { ptr, .. } => format!("load {ptr}"),
            Op::Store { ptr, value } => format!("store {ptr}, {value}"),
            Op::Atomic { op, ptr, value, compare } => match compare {
                Some(c) => format!("atomic.{op} {ptr}, {c}, {value}"),
                None => format!("atomic.{op} {ptr}, {value}"),
            },
            Op::Barrier => "barrier".to_string(),
            Op::Shfl { mode, value, lane } => format!("shfl.{mode} {value}, {lane}"),
            Op::Vote { mode, pred } => format!("vote.{mode} {pred}"),
            Op::Mma { a, b, c, .. } => format!("{} {a}, {b}, {c}", inst.op.mnemonic()),
            Op::LdMatrix { ptr, .. } => format!("{} {ptr}", inst.op.mnemonic()),
            Op::CpAsync { dst, src, src_size, .. } => match src_size {
                Some(n) => format!("{} {dst}, {src}, {n}", inst.op.mnemonic()),
                None => format!("{} {dst}, {src}", inst.op.mnemonic()),
            },
            Op::CpAsyncCommit => inst.op.mnemonic(),
            Op::CpAsyncWait(n) => format!("{} {n}", inst.op.mnemonic()),
            Op::Extract(v, i) => format!("extract {v}, {i}"),
            Op::MakeVector(vals) => format!("vector {}", list(vals)),
            Op::If { cond, .. } => format!("if {cond}"),
            Op::For { start, end, step, init, body } => {
                let params = &k.region(*body).params;
                let mut s = match params.first() {
                    Some(iv) => format!("for {iv}: {} = {start} to {end} step {step}", k.ty(*iv)),
                    None => format!("for <missing iv> = {start} to {end} step {step}"),
                };
                if !init.is_empty() {
                    let carried: Vec<String> =
                        params.iter().skip(1).zip(init).map(|(p, i)| format!("{p}: {} = {i}", k.ty(*p))).collect();
                    let _ = write!(s, " iter({})", carried.join(", "));
                }
                s
            }
        };
        self.out.push_str(&text);
    }
}

fn list(vals: &[crate::kernel::Value]) -> String {
    vals.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
}
