//! `simplify`: exact identities on every pair of edge values, strength reduction with the
//! signed rounding fix-up, and the float identities that NaN payloads forbid.

use crate::passes_support;

use passes_support::*;
use ruda_ir::*;

use ScalarType::*;

fn binaries(k: &Kernel, op: BinaryOp) -> usize {
    count(k, |o| matches!(o, Op::Binary(b, ..) if *b == op))
}

#[test]
fn integer_identities_disappear() {
    for t in [I16, U16, I32, U32, I64, U64] {
        let (before, after) = check_multi(t, "simplify,dce", |b, x, y| {
            let zero = b.constant(Constant::new(t, 0));
            let one = b.constant(Constant::new(t, 1));
            let ones = b.constant(Constant::new(t, u64::MAX));
            let sh0 = b.const_u32(0);
            let amount = if t == U32 { y } else { b.cvt(y, U32) };
            let mut v = vec![
                b.add(x, zero),
                b.add(zero, x),
                b.sub(x, zero),
                b.sub(x, x),
                b.mul(x, zero),
                b.mul(one, x),
                b.div(x, one),
                b.rem(x, one),
                b.and(x, x),
                b.and(x, zero),
                b.and(x, ones),
                b.or(x, x),
                b.or(x, zero),
                b.or(ones, x),
                b.xor(x, x),
                b.xor(x, zero),
                b.shl(x, sh0),
                b.shr(x, sh0),
                b.shl(zero, amount),
                b.min(x, x),
                b.max(y, y),
                b.eq(x, x),
                b.ne(y, y),
                b.lt(x, x),
                b.ge(x, x),
            ];
            let nx = b.not(x);
            v.push(b.not(nx));
            if t.is_signed_int() {
                let n = b.neg(x);
                v.push(b.neg(n));
                let a = b.abs(y);
                v.push(b.abs(a));
            } else {
                v.push(b.lt(x, zero));
                v.push(b.ge(y, zero));
            }
            v
        });
        let arith = |k: &Kernel| count(k, |o| matches!(o, Op::Binary(..) | Op::Unary(..) | Op::Cmp(..)));
        // What stays: the address arithmetic, the range check and one abs.
        assert!(arith(&after) <= 4, "{t}: {} -> {}\n{}", arith(&before), arith(&after), print_kernel(&after));
    }
}

#[test]
fn constants_move_right_and_combine() {
    for t in [I32, U32, U64] {
        let (_, after) = check_multi(t, "simplify,dce", |b, x, y| {
            let c3 = b.constant(Constant::new(t, 3));
            let c4 = b.constant(Constant::new(t, 4));
            let c5 = b.constant(Constant::new(t, 5));
            let m = b.constant(Constant::new(t, 0xf0f));
            let m2 = b.constant(Constant::new(t, 0x0ff));
            let s = b.add(c3, x);
            let s = b.add(s, c4);
            let d = b.sub(y, c5);
            let d = b.add(d, c5);
            let a = b.and(x, m);
            let a = b.and(m2, a);
            let two = b.const_u32(2);
            let three = b.const_u32(3);
            let sh = b.shl(y, two);
            let sh = b.shl(sh, three);
            let sr = b.shr(x, three);
            let sr = b.shr(sr, two);
            vec![s, d, a, sh, sr]
        });
        let text = print_kernel(&after);
        assert!(!text.contains("sub"), "{t}:\n{text}");
        // `(y - 5) + 5` is `y`; the rest keeps one op each.
        assert_eq!(binaries(&after, BinaryOp::Add), 1, "{t}:\n{text}");
        assert_eq!(binaries(&after, BinaryOp::And), 1, "{t}:\n{text}");
        assert_eq!(binaries(&after, BinaryOp::Shl), 1, "{t}:\n{text}");
        assert_eq!(binaries(&after, BinaryOp::Shr), 1, "{t}:\n{text}");
    }
}

#[test]
fn multiplies_and_unsigned_divisions_by_powers_of_two_become_shifts_and_masks() {
    for t in [U16, U32, U64, I32, I64] {
        let (_, after) = check_multi(t, "simplify,dce", |b, x, _| {
            let c8 = b.constant(Constant::new(t, 8));
            let c16 = b.constant(Constant::new(t, 16));
            let top = b.constant(Constant::new(t, 1 << (t.bits() - 1)));
            let mut v = vec![b.mul(x, c8), b.mul(x, top)];
            if !t.is_signed_int() {
                v.push(b.div(x, c16));
                v.push(b.rem(x, c16));
                v.push(b.div(x, top));
            }
            v
        });
        assert_eq!(binaries(&after, BinaryOp::Div) + binaries(&after, BinaryOp::Rem), 0, "{}", print_kernel(&after));
        // Both multiplies of `x` are shifts (the output address, from the thread id %7, may be one too).
        let shifts_of_x = count(&after, |o| matches!(o, Op::Binary(BinaryOp::Shl, a, _) if *a != Value(7)));
        assert_eq!(shifts_of_x, 2, "{}", print_kernel(&after));
    }
}

#[test]
fn signed_divisions_by_powers_of_two_round_toward_zero() {
    for t in [I16, I32, I64] {
        for k in [1u32, 2, 5, t.bits() - 2] {
            let (_, after) = check_multi(t, "simplify,dce", |b, x, y| {
                let c = b.constant(Constant::new(t, 1 << k));
                vec![b.div(x, c), b.rem(x, c), b.div(y, c), b.rem(y, c)]
            });
            assert_eq!(
                binaries(&after, BinaryOp::Div) + binaries(&after, BinaryOp::Rem),
                0,
                "{t} 2^{k}:\n{}",
                print_kernel(&after)
            );
        }
    }
}

#[test]
fn signed_division_by_minus_one_or_the_minimum_is_exact() {
    for t in [I16, I32, I64] {
        let (_, after) = check_multi(t, "simplify,dce", |b, x, _| {
            let m1 = b.constant(Constant::new(t, u64::MAX));
            let min = b.constant(Constant::new(t, 1 << (t.bits() - 1)));
            vec![b.div(x, m1), b.rem(x, m1), b.div(x, min), b.rem(x, min), b.mul(x, m1)]
        });
        // Division by the minimum has no shift form; it stays.
        assert_eq!(binaries(&after, BinaryOp::Div) + binaries(&after, BinaryOp::Rem), 2, "{}", print_kernel(&after));
    }
}

#[test]
fn float_identities_hold_only_for_canonical_operands() {
    for t in [F32, F64] {
        let one = if t == F32 { 1.0f32.to_bits() as u64 } else { 1.0f64.to_bits() };
        let sign = 1u64 << (t.bits() - 1);
        let (before, after) = check_multi(t, "simplify,dce", |b, x, y| {
            let c1 = b.constant(Constant::new(t, one));
            let nz = b.constant(Constant::new(t, sign));
            let pz = b.constant(Constant::new(t, 0));
            // `x` is loaded and may be a NaN of any payload: none of these may change.
            let raw = vec![b.mul(x, c1), b.div(x, c1), b.add(x, nz), b.sub(x, pz), b.min(x, x)];
            // `s` is an arithmetic result, so its NaNs are canonical.
            let s = b.add(x, y);
            let exact = vec![b.mul(s, c1), b.div(s, c1), b.add(s, nz), b.sub(s, pz), b.max(s, s), b.mul(c1, s)];
            // Never identities on floats.
            let mut never = vec![b.sub(x, x), b.mul(x, pz), b.add(x, pz), b.sub(x, nz)];
            // The negation of a canonical NaN is another NaN: `-s * 1` canonicalises it.
            let ns = b.neg(s);
            never.push(b.mul(ns, c1));
            let nn = b.neg(x);
            let mut v = raw;
            v.extend(exact);
            v.extend(never);
            v.push(b.neg(nn));
            v
        });
        let fl = |k: &Kernel| count(k, |o| matches!(o, Op::Binary(..) | Op::Unary(..)));
        // Six exact identities and the double negation go; nothing else.
        assert_eq!(fl(&before) - fl(&after), 6 + 2, "{t}:\n{}", print_kernel(&after));
    }
}

/// Binary operations with a float result (a kept `x / 1` is `x * 1` after `simplify`).
fn float_binaries(k: &Kernel) -> usize {
    let mut n = 0;
    k.walk(|_, i| n += (matches!(i.op, Op::Binary(..)) && k.ty(i.results[0]).elem().is_float()) as usize);
    n
}

/// Builds `op(x, ...)` on a float `x`, an identity `simplify` may turn into `x` only when `x`
/// cannot be a NaN of another payload than the canonical one.
type Identity = fn(&mut KernelBuilder, Value) -> Value;

fn float_constant(b: &mut KernelBuilder, like: Value, v: f64) -> Value {
    match b.ty(like).elem() {
        F64 => b.constant(Constant::f64(v)),
        _ => b.constant(Constant::f32(v as f32)),
    }
}

/// `identity` on `x` converted from each source: the interpreter's results stay on every edge
/// value (NaN payloads included), and the identity applies exactly where the conversion
/// canonicalises NaNs. bf16 widened to f32 (a shift) and a float converted to its own type
/// without rounding (a move) keep payloads; the fuzzer found `max(x, x) -> x` on a widened bf16.
fn follows_the_conversion(identity: Identity) {
    let cases = [
        (BF16, F32, None, true),
        (F32, F32, None, true),
        (F64, F64, None, true),
        (F16, F32, None, false),
        (F32, F32, Some(Rounding::Rn), false),
        (F64, F32, Some(Rounding::Rn), false),
        (BF16, F64, None, false),
    ];
    for (from, to, rounding, keeps_payload) in cases {
        let (_, after) = check_multi(from, "simplify,dce", |b, x, _| {
            let c = b.cvt_with(x, Cvt { to, rounding, sat: false });
            vec![identity(b, c)]
        });
        let what = format!("{from} -> {to} ({rounding:?})");
        assert_eq!(float_binaries(&after), keeps_payload as usize, "{what}:\n{}", print_kernel(&after));
    }
}

#[test]
fn add_minus_zero_follows_the_conversion() {
    follows_the_conversion(|b, x| {
        let c = float_constant(b, x, -0.0);
        b.add(x, c)
    });
}

#[test]
fn sub_plus_zero_follows_the_conversion() {
    follows_the_conversion(|b, x| {
        let c = float_constant(b, x, 0.0);
        b.sub(x, c)
    });
}

#[test]
fn mul_one_follows_the_conversion() {
    follows_the_conversion(|b, x| {
        let c = float_constant(b, x, 1.0);
        b.mul(c, x)
    });
}

#[test]
fn div_one_follows_the_conversion() {
    follows_the_conversion(|b, x| {
        let c = float_constant(b, x, 1.0);
        b.div(x, c)
    });
}

#[test]
fn min_self_follows_the_conversion() {
    follows_the_conversion(|b, x| b.min(x, x));
}

#[test]
fn max_self_follows_the_conversion() {
    follows_the_conversion(|b, x| b.max(x, x));
}

#[test]
fn moves_selects_and_abs_pass_their_operands_nan_rule_on() {
    for (from, keeps_payload) in [(BF16, true), (F16, false)] {
        let (_, after) = check_multi(from, "simplify,dce", |b, x, y| {
            let (wx, wy) = (b.cvt(x, F32), b.cvt(y, F32));
            let c = b.lt(wx, wy);
            let s = b.select(c, wx, wy);
            let a = b.abs(s);
            let m = b.cvt(a, F32);
            vec![b.max(m, m)]
        });
        assert_eq!(float_binaries(&after), keeps_payload as usize, "{from}:\n{}", print_kernel(&after));
    }
}

#[test]
fn fma_with_minus_zero_addend_or_unit_factor_becomes_mul_or_add() {
    for t in [F32, F64, I32, U64] {
        let (one, sign) = match t {
            F32 => (1.0f32.to_bits() as u64, 1u64 << 31),
            F64 => (1.0f64.to_bits(), 1u64 << 63),
            _ => (1, 0),
        };
        let (_, after) = check_multi(t, "simplify,dce", |b, x, y| {
            let c1 = b.constant(Constant::new(t, one));
            let z = b.constant(Constant::new(t, sign));
            vec![b.fma(x, y, z), b.fma(x, c1, y), b.fma(c1, y, x)]
        });
        assert_eq!(count(&after, |o| matches!(o, Op::Fma(..))), 1, "{t}:\n{}", print_kernel(&after));
    }
}

#[test]
fn fma_with_plus_zero_addend_stays() {
    let (_, after) = check_multi(F32, "simplify,dce", |b, x, y| {
        let z = b.const_f32(0.0);
        vec![b.fma(x, y, z)]
    });
    assert_eq!(count(&after, |o| matches!(o, Op::Fma(..))), 2);
}

#[test]
fn selects_vectors_casts_and_pointers_simplify() {
    let (_, after) = check_multi(U32, "simplify,dce", |b, x, y| {
        let c = b.lt(x, y);
        let same = b.select(c, x, x);
        let nc = b.not(c);
        let swapped = b.select(nc, x, y);
        let (t, f) = (b.const_pred(true), b.const_pred(false));
        let p1 = b.select(c, t, f);
        let p2 = b.select(c, f, t);
        let v = b.make_vector(&[x, y]);
        let e = b.extract(v, 1);
        let bc = b.bitcast(x, F32);
        let back = b.bitcast(bc, U32);
        let wide = b.cvt(y, U64);
        let narrow = b.cvt(wide, U32);
        vec![same, swapped, p1, p2, e, back, narrow]
    });
    let text = print_kernel(&after);
    for gone in ["vector", "extract", "bitcast", "cvt"] {
        assert!(!text.contains(gone), "{gone}:\n{text}");
    }
    // The swapped select, and the two that store the predicates.
    assert_eq!(count(&after, |o| matches!(o, Op::Select(..))), 3, "{text}");
    assert_eq!(count(&after, |o| matches!(o, Op::Unary(..))), 0, "{text}");
}

#[test]
fn ptradd_of_zero_and_pointer_cast_chains_fold() {
    let mut b = KernelBuilder::new("ptrs");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let zero = b.const_u32(0);
    let p = b.ptr_add(x, zero);
    let q = b.ptr_cast(p, F32);
    let q = b.ptr_cast(q, I32);
    let q = b.ptr_cast(q, U32);
    let v = b.load(q);
    b.store(out, v);
    let k = b.finish().unwrap();
    let after = check(
        &k,
        "simplify,dce",
        ruda_ir::interp::LaunchConfig::linear(1, 1),
        &[Arg::Buffer(bytes_of(&[42], 4)), Arg::Buffer(vec![0; 4])],
    );
    let text = print_kernel(&after);
    assert!(!text.contains("ptradd") && !text.contains("ptrcast"), "{text}");
}

#[test]
fn predicate_logic_simplifies() {
    let (_, after) = check_multi(I32, "simplify,dce", |b, x, y| {
        let c = b.lt(x, y);
        let (t, f) = (b.const_pred(true), b.const_pred(false));
        vec![b.and(c, t), b.and(c, f), b.or(c, t), b.or(c, f), b.xor(c, f), b.xor(c, t), b.xor(c, c), b.and(c, c)]
    });
    // The range check's and the bound check's compares remain, plus `not` for `c ^ true`.
    assert_eq!(count(&after, |o| matches!(o, Op::Binary(..))), 1, "{}", print_kernel(&after));
}

#[test]
fn float_division_by_a_power_of_two_becomes_a_multiplication() {
    for t in [F32, F64] {
        let c = |v: f64| if t == F32 { Constant::f32(v as f32) } else { Constant::f64(v) };
        let (_, after) = check_multi(t, "simplify,dce", |b, x, _| {
            // Powers of two (one with a subnormal reciprocal), and divisors that must stay.
            let exact = [4096.0, 0.5, -8.0, 2f64.powi(if t == F32 { 127 } else { 1023 })];
            let inexact = [3.0, 0.1, 0.0, f64::INFINITY, 2f64.powi(if t == F32 { -140 } else { -1060 })];
            exact
                .iter()
                .chain(&inexact)
                .map(|&v| {
                    let k = b.constant(c(v));
                    b.div(x, k)
                })
                .collect()
        });
        let divs = count(&after, |o| matches!(o, Op::Binary(BinaryOp::Div, ..)));
        assert_eq!(divs, 5, "{t}:\n{}", print_kernel(&after));
    }
}
