//! Integer value ranges: an interval for each integer value, as its type reads it, from
//! constants, the limits of special registers (CUDA's, narrowed by the launch bounds), loop
//! bounds and arithmetic that provably does not wrap. Used to prove that an index addition
//! cannot overflow and that a loop ends.

use super::util::{int_range, int_value};
use crate::kernel::*;
use crate::types::ScalarType;

/// An inclusive interval.
pub(crate) type Range = (i128, i128);

pub(crate) struct Ranges {
    known: Vec<Option<Range>>,
}

impl Ranges {
    pub(crate) fn compute(k: &Kernel) -> Ranges {
        let mut r = Ranges { known: vec![None; k.values.len()] };
        r.region(k, k.body);
        r
    }

    /// The range of an integer value (its type's whole range when nothing better is known).
    pub(crate) fn get(&self, k: &Kernel, v: Value) -> Range {
        let t = k.ty(v).elem();
        self.known.get(v.index()).copied().flatten().unwrap_or_else(|| full(t))
    }

    fn set(&mut self, v: Value, r: Range) {
        if let Some(slot) = self.known.get_mut(v.index()) {
            *slot = Some(r);
        }
    }

    fn region(&mut self, k: &Kernel, r: RegionId) {
        for &id in &k.region(r).insts {
            let inst = k.inst(id);
            match &inst.op {
                Op::If { then_region, else_region, .. } => {
                    self.region(k, *then_region);
                    self.region(k, *else_region);
                    let (t, e) = (&k.region(*then_region).yields, &k.region(*else_region).yields);
                    for ((&res, &a), &b) in inst.results.iter().zip(t).zip(e) {
                        if k.ty(res).elem().is_int() {
                            self.set(res, union(self.get(k, a), self.get(k, b)));
                        }
                    }
                }
                Op::For { start, end, step, body, .. } => {
                    if let Some(&iv) = k.region(*body).params.first() {
                        let t = k.ty(iv).elem();
                        let (s, e, st) = (self.get(k, *start), self.get(k, *end), self.get(k, *step));
                        // The body runs while iv < end; iv only grows when the step is not
                        // negative and the last increment cannot wrap.
                        if st.0 >= 0 && e.1 - 1 + st.1 <= full(t).1 {
                            self.set(iv, (s.0, s.0.max(e.1 - 1)));
                        }
                    }
                    self.region(k, *body);
                }
                op => {
                    if let [res] = inst.results.as_slice() {
                        let t = k.ty(*res).elem();
                        if t.is_int() {
                            let r = self.op(k, op, t, &inst.op.operands());
                            self.set(*res, r);
                        }
                    }
                }
            }
        }
    }

    fn op(&self, k: &Kernel, op: &Op, t: ScalarType, args: &[Value]) -> Range {
        let f = full(t);
        let fit = |r: Range| if r.0 >= f.0 && r.1 <= f.1 { r } else { f };
        let g = |i: usize| self.get(k, args[i]);
        match op {
            Op::Const(c) => (int_value(*c), int_value(*c)),
            Op::Special(s) => special(k, *s),
            Op::Binary(b, _, _) => {
                let (a, c) = (g(0), g(1));
                let exact = |c: Range| (c.0 == c.1).then_some(c.0);
                match b {
                    BinaryOp::Add => fit((a.0 + c.0, a.1 + c.1)),
                    BinaryOp::Sub => fit((a.0 - c.1, a.1 - c.0)),
                    BinaryOp::Mul => fit(mul(a, c)),
                    BinaryOp::Div => match exact(c) {
                        Some(d) if d > 0 && a.0 >= 0 => (a.0 / d, a.1 / d),
                        _ => f,
                    },
                    BinaryOp::Rem => match exact(c) {
                        Some(d) if d > 0 && a.0 >= 0 => (0, a.1.min(d - 1)),
                        _ => f,
                    },
                    BinaryOp::And if a.0 >= 0 || c.0 >= 0 => {
                        let hi = if a.0 >= 0 && c.0 >= 0 {
                            a.1.min(c.1)
                        } else if a.0 >= 0 {
                            a.1
                        } else {
                            c.1
                        };
                        (0, hi)
                    }
                    BinaryOp::Or | BinaryOp::Xor if a.0 >= 0 && c.0 >= 0 => {
                        let m = a.1.max(c.1);
                        fit((0, ((m + 1) as u128).next_power_of_two() as i128 - 1))
                    }
                    BinaryOp::Shr => match exact(c) {
                        Some(s) if a.0 >= 0 => {
                            let s = s.min(127) as u32;
                            (a.0 >> s, a.1 >> s)
                        }
                        _ => f,
                    },
                    BinaryOp::Shl => match exact(c) {
                        Some(s) if a.0 >= 0 && s < t.bits() as i128 => fit((a.0 << s, a.1 << s)),
                        _ => f,
                    },
                    BinaryOp::Min => (a.0.min(c.0), a.1.min(c.1)),
                    BinaryOp::Max => (a.0.max(c.0), a.1.max(c.1)),
                    _ => f,
                }
            }
            Op::Fma(..) => {
                let p = fit(mul(g(0), g(1)));
                if p == f {
                    return f;
                }
                let c = g(2);
                fit((p.0 + c.0, p.1 + c.1))
            }
            Op::Unary(UnaryOp::Popc | UnaryOp::Clz, _) => (0, t.bits() as i128),
            Op::Select(..) => union(g(1), g(2)),
            Op::Cvt(a, cvt) if k.ty(*a).elem().is_int() => {
                let r = self.get(k, *a);
                if cvt.sat {
                    (r.0.clamp(f.0, f.1), r.1.clamp(f.0, f.1))
                } else {
                    fit(r)
                }
            }
            _ => f,
        }
    }
}

fn full(t: ScalarType) -> Range {
    if t.is_int() {
        int_range(t)
    } else {
        (0, 0)
    }
}

fn union(a: Range, b: Range) -> Range {
    (a.0.min(b.0), a.1.max(b.1))
}

fn mul(a: Range, b: Range) -> Range {
    let p = [a.0.saturating_mul(b.0), a.0.saturating_mul(b.1), a.1.saturating_mul(b.0), a.1.saturating_mul(b.1)];
    (p.iter().copied().min().unwrap_or(0), p.iter().copied().max().unwrap_or(0))
}

/// CUDA's limits on thread and block indices, narrowed by the kernel's launch bounds.
fn special(k: &Kernel, s: SpecialReg) -> Range {
    use SpecialReg::*;
    let threads = k.launch_bounds.map_or(1024, |lb| lb.max_threads.clamp(1, 1024)) as i128;
    match s {
        TidX | TidY => (0, threads.min(1024) - 1),
        TidZ => (0, threads.min(64) - 1),
        NtidX | NtidY => (1, threads),
        NtidZ => (1, threads.min(64)),
        CtaidX => (0, (1 << 31) - 2),
        CtaidY | CtaidZ => (0, 65534),
        NctaidX => (1, (1 << 31) - 1),
        NctaidY | NctaidZ => (1, 65535),
        LaneId => (0, 31),
    }
}
