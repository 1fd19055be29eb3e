//! Every arithmetic, logic, comparison and selection op on every type it accepts, at edge
//! values, against independent Rust computations (integers through `i128` values, `f32`
//! through `f64`, where rounding twice is innocuous for + - * / sqrt).

use crate::interp_support;

use interp_support::*;
use ruda_ir::{BinaryOp, CmpOp, ScalarType, UnaryOp};
use ScalarType::*;

fn int_binary_expected(op: BinaryOp, t: ScalarType, a: u64, b: u64) -> u64 {
    let w = t.bits();
    let (x, y) = (ival(t, a), ival(t, b));
    let v = match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::MulHi => {
            if t.is_signed_int() {
                (x * y) >> w
            } else {
                ((x as u128 * y as u128) >> w) as i128
            }
        }
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        BinaryOp::And => x & y,
        BinaryOp::Or => x | y,
        BinaryOp::Xor => x ^ y,
        BinaryOp::Shl | BinaryOp::Shr => unreachable!("tested separately"),
    };
    ibits(t, v)
}

#[test]
fn integer_binary_ops() {
    use BinaryOp::*;
    for t in INT_TYPES {
        let edges = int_edges(t);
        for op in [Add, Sub, Mul, MulHi, Div, Rem, Min, Max, And, Or, Xor] {
            let nonzero: Vec<u64> = edges.iter().copied().filter(|&b| b != 0).collect();
            let ys = if matches!(op, Div | Rem) { &nonzero } else { &edges };
            let inputs = pairs(&edges, ys);
            let got = map(&[t, t], t, &inputs, |b, v| b.binary(op, v[0], v[1]));
            check(&format!("{op}.{t}"), &inputs, &got, |a| int_binary_expected(op, t, a[0], a[1]));
        }
    }
}

#[test]
fn signed_division_overflow_wraps_like_ptx() {
    for t in [I16, I32, I64] {
        let min = ibits(t, -(1i128 << (t.bits() - 1)));
        let minus_one = ibits(t, -1);
        let inputs = vec![vec![min], vec![minus_one]];
        assert_eq!(map(&[t, t], t, &inputs, |b, v| b.div(v[0], v[1])), vec![min], "{t} MIN / -1");
        assert_eq!(map(&[t, t], t, &inputs, |b, v| b.rem(v[0], v[1])), vec![0], "{t} MIN % -1");
    }
    // Truncation toward zero and the dividend's sign for the remainder.
    let inputs = vec![vec![ibits(I32, -7), 7], vec![2, ibits(I32, -2)]];
    assert_eq!(map(&[I32, I32], I32, &inputs, |b, v| b.div(v[0], v[1])), vec![ibits(I32, -3), ibits(I32, -3)]);
    assert_eq!(map(&[I32, I32], I32, &inputs, |b, v| b.rem(v[0], v[1])), vec![ibits(I32, -1), 1]);
}

#[test]
fn shifts_clamp_the_amount() {
    let amounts: Vec<u64> = vec![0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, u32::MAX as u64];
    for t in INT_TYPES {
        let w = t.bits() as u64;
        let inputs = pairs(&int_edges(t), &amounts);
        let got = map(&[t, U32], t, &inputs, |b, v| b.shl(v[0], v[1]));
        check(&format!("shl.{t}"), &inputs, &got, |a| if a[1] >= w { 0 } else { (a[0] << a[1]) & width_mask(t) });
        let got = map(&[t, U32], t, &inputs, |b, v| b.shr(v[0], v[1]));
        check(&format!("shr.{t}"), &inputs, &got, |a| {
            let x = ival(t, a[0]);
            if t.is_signed_int() {
                ibits(t, x >> a[1].min(w - 1))
            } else if a[1] >= w {
                0
            } else {
                a[0] >> a[1]
            }
        });
    }
}

#[test]
fn integer_unary_ops() {
    for t in INT_TYPES {
        let w = t.bits();
        let inputs = vec![int_edges(t)];
        let got = map(&[t], t, &inputs, |b, v| b.not(v[0]));
        check(&format!("not.{t}"), &inputs, &got, |a| !a[0] & width_mask(t));
        if t.is_signed_int() {
            let got = map(&[t], t, &inputs, |b, v| b.neg(v[0]));
            check(&format!("neg.{t}"), &inputs, &got, |a| ibits(t, -ival(t, a[0])));
            let got = map(&[t], t, &inputs, |b, v| b.abs(v[0]));
            check(&format!("abs.{t}"), &inputs, &got, |a| ibits(t, ival(t, a[0]).abs()));
        }
        if w >= 32 {
            let got = map(&[t], t, &inputs, |b, v| b.unary(UnaryOp::Popc, v[0]));
            check(&format!("popc.{t}"), &inputs, &got, |a| a[0].count_ones() as u64);
            let got = map(&[t], t, &inputs, |b, v| b.unary(UnaryOp::Clz, v[0]));
            check(&format!("clz.{t}"), &inputs, &got, |a| (a[0].leading_zeros() - (64 - w)) as u64);
        }
    }
}

#[test]
fn integer_fma_keeps_the_low_half() {
    for t in INT_TYPES {
        let e: Vec<u64> = int_edges(t).into_iter().step_by(2).collect();
        let mut inputs = vec![vec![], vec![], vec![]];
        for &x in &e {
            for &y in &e {
                for &z in &e[..4] {
                    inputs[0].push(x);
                    inputs[1].push(y);
                    inputs[2].push(z);
                }
            }
        }
        let got = map(&[t, t, t], t, &inputs, |b, v| b.fma(v[0], v[1], v[2]));
        check(&format!("fma.{t}"), &inputs, &got, |a| {
            ibits(t, ival(t, a[0]).wrapping_mul(ival(t, a[1])).wrapping_add(ival(t, a[2])))
        });
    }
}

#[test]
fn integer_comparisons_by_signedness() {
    use CmpOp::*;
    for t in INT_TYPES {
        let edges = int_edges(t);
        let inputs = pairs(&edges, &edges);
        for op in [Eq, Ne, Lt, Le, Gt, Ge] {
            let got = map(&[t, t], Pred, &inputs, |b, v| b.cmp(op, v[0], v[1]));
            check(&format!("cmp.{op}.{t}"), &inputs, &got, |a| {
                let (x, y) = (ival(t, a[0]), ival(t, a[1]));
                (match op {
                    Eq => x == y,
                    Ne => x != y,
                    Lt => x < y,
                    Le => x <= y,
                    Gt => x > y,
                    _ => x >= y,
                }) as u64
            });
        }
    }
}

#[test]
fn predicate_logic() {
    let inputs = pairs(&[0, 1], &[0, 1]);
    type Logic = fn(bool, bool) -> bool;
    let cases: [(&str, Logic, BinaryOp); 3] = [
        ("and", |a, b| a & b, BinaryOp::And),
        ("or", |a, b| a | b, BinaryOp::Or),
        ("xor", |a, b| a ^ b, BinaryOp::Xor),
    ];
    for (name, f, op) in cases {
        let got = map(&[Pred, Pred], Pred, &inputs, |b, v| b.binary(op, v[0], v[1]));
        check(name, &inputs, &got, |a| f(a[0] != 0, a[1] != 0) as u64);
    }
    let got = map(&[Pred, Pred], Pred, &inputs, |b, v| b.eq(v[0], v[1]));
    check("eq.pred", &inputs, &got, |a| (a[0] == a[1]) as u64);
    let got = map(&[Pred, Pred], Pred, &inputs, |b, v| b.ne(v[0], v[1]));
    check("ne.pred", &inputs, &got, |a| (a[0] != a[1]) as u64);
    let inputs = vec![vec![0, 1]];
    assert_eq!(map(&[Pred], Pred, &inputs, |b, v| b.not(v[0])), vec![1, 0]);
}

/// PTX min/max: the non-NaN operand wins, two NaNs give the canonical NaN, -0 < +0.
fn fminmax(max: bool, a: f64, b: f64, nan: u64, bits: impl Fn(f64) -> u64) -> u64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => nan,
        (true, false) => bits(b),
        (false, true) => bits(a),
        _ if a == b => {
            let pick_a = a.is_sign_negative() != max;
            bits(if pick_a { a } else { b })
        }
        _ => bits(if (a < b) != max { a } else { b }),
    }
}

fn f32_binary_expected(op: BinaryOp, a: u64, b: u64) -> u64 {
    let (x, y) = (f32::from_bits(a as u32) as f64, f32::from_bits(b as u32) as f64);
    let bits = |v: f64| (v as f32).to_bits() as u64;
    match op {
        BinaryOp::Add => canon32((x + y) as f32),
        BinaryOp::Sub => canon32((x - y) as f32),
        BinaryOp::Mul => canon32((x * y) as f32),
        BinaryOp::Div => canon32((x / y) as f32),
        BinaryOp::Min => fminmax(false, x, y, F32_NAN, bits),
        BinaryOp::Max => fminmax(true, x, y, F32_NAN, bits),
        _ => unreachable!(),
    }
}

fn f64_binary_expected(op: BinaryOp, a: u64, b: u64) -> u64 {
    let (x, y) = (f64::from_bits(a), f64::from_bits(b));
    match op {
        BinaryOp::Add => canon64(x + y),
        BinaryOp::Sub => canon64(x - y),
        BinaryOp::Mul => canon64(x * y),
        BinaryOp::Div => canon64(x / y),
        BinaryOp::Min => fminmax(false, x, y, F64_NAN, f64::to_bits),
        BinaryOp::Max => fminmax(true, x, y, F64_NAN, f64::to_bits),
        _ => unreachable!(),
    }
}

#[test]
fn float_binary_ops() {
    use BinaryOp::*;
    let e32 = f32_edges();
    let e64 = f64_edges();
    for op in [Add, Sub, Mul, Div, Min, Max] {
        let inputs = pairs(&e32, &e32);
        let got = map(&[F32, F32], F32, &inputs, |b, v| b.binary(op, v[0], v[1]));
        check(&format!("{op}.f32"), &inputs, &got, |a| f32_binary_expected(op, a[0], a[1]));
        let inputs = pairs(&e64, &e64);
        let got = map(&[F64, F64], F64, &inputs, |b, v| b.binary(op, v[0], v[1]));
        check(&format!("{op}.f64"), &inputs, &got, |a| f64_binary_expected(op, a[0], a[1]));
    }
}

#[test]
fn float_min_max_of_signed_zeros() {
    let (pz, nz) = (0.0f32.to_bits() as u64, (-0.0f32).to_bits() as u64);
    let inputs = vec![vec![pz, nz], vec![nz, pz]];
    assert_eq!(map(&[F32, F32], F32, &inputs, |b, v| b.min(v[0], v[1])), vec![nz, nz]);
    assert_eq!(map(&[F32, F32], F32, &inputs, |b, v| b.max(v[0], v[1])), vec![pz, pz]);
}

#[test]
fn float_unary_ops() {
    let e32 = vec![f32_edges()];
    let got = map(&[F32], F32, &e32, |b, v| b.neg(v[0]));
    check("neg.f32", &e32, &got, |a| a[0] ^ 0x8000_0000);
    let got = map(&[F32], F32, &e32, |b, v| b.abs(v[0]));
    check("abs.f32", &e32, &got, |a| a[0] & 0x7fff_ffff);
    let got = map(&[F32], F32, &e32, |b, v| b.sqrt(v[0]));
    check("sqrt.f32", &e32, &got, |a| canon32((f32::from_bits(a[0] as u32) as f64).sqrt() as f32));
    let got = map(&[F32], F32, &e32, |b, v| b.rcp(v[0]));
    check("rcp.f32", &e32, &got, |a| canon32((1.0 / f32::from_bits(a[0] as u32) as f64) as f32));

    let e64 = vec![f64_edges()];
    let sign = 1u64 << 63;
    let got = map(&[F64], F64, &e64, |b, v| b.neg(v[0]));
    check("neg.f64", &e64, &got, |a| a[0] ^ sign);
    let got = map(&[F64], F64, &e64, |b, v| b.abs(v[0]));
    check("abs.f64", &e64, &got, |a| a[0] & !sign);
    let got = map(&[F64], F64, &e64, |b, v| b.sqrt(v[0]));
    check("sqrt.f64", &e64, &got, |a| canon64(f64::from_bits(a[0]).sqrt()));
    let got = map(&[F64], F64, &e64, |b, v| b.rcp(v[0]));
    check("rcp.f64", &e64, &got, |a| canon64(1.0 / f64::from_bits(a[0])));
}

#[test]
fn float_fma_rounds_once() {
    // (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24 exactly; a separate multiply would round the product
    // to 1 + 2^-11 (a tie to even) and give 2^-11.
    let a = 1.0f32 + f32::powi(2.0, -12);
    let inputs = vec![vec![a.to_bits() as u64], vec![a.to_bits() as u64], vec![(-1.0f32).to_bits() as u64]];
    let got = map(&[F32, F32, F32], F32, &inputs, |b, v| b.fma(v[0], v[1], v[2]));
    assert_eq!(f32::from_bits(got[0] as u32), f32::powi(2.0, -11) + f32::powi(2.0, -24));
    let a = 1.0f64 + f64::powi(2.0, -27);
    let inputs = vec![vec![a.to_bits()], vec![a.to_bits()], vec![(-1.0f64).to_bits()]];
    let got = map(&[F64, F64, F64], F64, &inputs, |b, v| b.fma(v[0], v[1], v[2]));
    assert_eq!(f64::from_bits(got[0]), f64::powi(2.0, -26) + f64::powi(2.0, -54));

    // The edge grid against the standard library's fused multiply-add.
    let e: Vec<u64> = f32_edges().into_iter().step_by(2).collect();
    let mut inputs = vec![vec![], vec![], vec![]];
    for &x in &e {
        for &y in &e {
            for &z in &e[..6] {
                inputs[0].push(x);
                inputs[1].push(y);
                inputs[2].push(z);
            }
        }
    }
    let got = map(&[F32, F32, F32], F32, &inputs, |b, v| b.fma(v[0], v[1], v[2]));
    let f = |x: u64| f32::from_bits(x as u32);
    check("fma.f32", &inputs, &got, |a| canon32(f(a[0]).mul_add(f(a[1]), f(a[2]))));
    let inputs: Vec<Vec<u64>> = inputs
        .iter()
        .map(|col| col.iter().map(|&x| (f32::from_bits(x as u32) as f64 * 1.000_000_1).to_bits()).collect())
        .collect();
    let got = map(&[F64, F64, F64], F64, &inputs, |b, v| b.fma(v[0], v[1], v[2]));
    let f = f64::from_bits;
    check("fma.f64", &inputs, &got, |a| canon64(f(a[0]).mul_add(f(a[1]), f(a[2]))));
}

#[test]
fn float_comparisons_ordered_and_unordered() {
    use CmpOp::*;
    let e32 = f32_edges();
    let inputs32 = pairs(&e32, &e32);
    let e64 = f64_edges();
    let inputs64 = pairs(&e64, &e64);
    for op in [Eq, Ne, Lt, Le, Gt, Ge, Neu, Nan] {
        let expected = |x: f64, y: f64| -> u64 {
            let unordered = x.is_nan() || y.is_nan();
            (match op {
                Eq => !unordered && x == y,
                Ne => !unordered && x != y,
                Lt => !unordered && x < y,
                Le => !unordered && x <= y,
                Gt => !unordered && x > y,
                Ge => !unordered && x >= y,
                Neu => unordered || x != y,
                Nan => unordered,
            }) as u64
        };
        let got = map(&[F32, F32], Pred, &inputs32, |b, v| b.cmp(op, v[0], v[1]));
        let f = |x: u64| f32::from_bits(x as u32) as f64;
        check(&format!("cmp.{op}.f32"), &inputs32, &got, |a| expected(f(a[0]), f(a[1])));
        let got = map(&[F64, F64], Pred, &inputs64, |b, v| b.cmp(op, v[0], v[1]));
        check(&format!("cmp.{op}.f64"), &inputs64, &got, |a| expected(f64::from_bits(a[0]), f64::from_bits(a[1])));
    }
}

#[test]
fn approximate_functions_special_values() {
    let bits = |x: f32| x.to_bits() as u64;
    let inf = f32::INFINITY;
    let cases: [(UnaryOp, f32, u64); 16] = [
        (UnaryOp::Ex2, f32::NEG_INFINITY, bits(0.0)),
        (UnaryOp::Ex2, inf, bits(inf)),
        (UnaryOp::Ex2, 3.0, bits(8.0)),
        (UnaryOp::Lg2, 0.0, bits(-inf)),
        (UnaryOp::Lg2, -0.0, bits(-inf)),
        (UnaryOp::Lg2, -1.0, F32_NAN),
        (UnaryOp::Lg2, inf, bits(inf)),
        (UnaryOp::Lg2, 1024.0, bits(10.0)),
        (UnaryOp::Rsqrt, 0.0, bits(inf)),
        (UnaryOp::Rsqrt, -0.0, bits(-inf)),
        (UnaryOp::Rsqrt, -4.0, F32_NAN),
        (UnaryOp::Rsqrt, 4.0, bits(0.5)),
        (UnaryOp::Tanh, inf, bits(1.0)),
        (UnaryOp::Tanh, -inf, bits(-1.0)),
        (UnaryOp::Sin, inf, F32_NAN),
        (UnaryOp::Cos, -inf, F32_NAN),
    ];
    for (op, x, want) in cases {
        let got = map(&[F32], F32, &[vec![bits(x)]], |b, v| b.unary(op, v[0]));
        assert_eq!(got[0], want, "{op}({x})");
    }
    let nan = map(&[F32], F32, &[vec![0xffc0_0001]], |b, v| b.unary(UnaryOp::Sin, v[0]));
    assert_eq!(nan[0], F32_NAN, "NaN inputs give the canonical NaN");
}

#[test]
fn approximate_functions_are_within_two_ulp_of_std() {
    let xs: Vec<f32> = (-40..=40).map(|i| i as f32 * 0.37 + 0.01).collect();
    let inputs = vec![xs.iter().map(|x| x.to_bits() as u64).collect::<Vec<_>>()];
    type Reference = fn(f32) -> f32;
    let ops: [(UnaryOp, Reference); 6] = [
        (UnaryOp::Ex2, f32::exp2),
        (UnaryOp::Lg2, |x| x.abs().log2()),
        (UnaryOp::Rsqrt, |x| 1.0 / x.abs().sqrt()),
        (UnaryOp::Tanh, f32::tanh),
        (UnaryOp::Sin, f32::sin),
        (UnaryOp::Cos, f32::cos),
    ];
    for (op, f) in ops {
        let got = map(&[F32], F32, &inputs, |b, v| {
            // lg2 and rsqrt take |x| so that every input is in the domain.
            let x = if matches!(op, UnaryOp::Lg2 | UnaryOp::Rsqrt) { b.abs(v[0]) } else { v[0] };
            b.unary(op, x)
        });
        for (x, g) in xs.iter().zip(&got) {
            let (g, want) = (f32::from_bits(*g as u32), f(*x));
            let ulp = (want.abs().max(f32::MIN_POSITIVE) * f32::EPSILON).max(f32::from_bits(1));
            assert!((g - want).abs() <= 2.0 * ulp, "{op}({x}) = {g}, std says {want}");
        }
    }
}

#[test]
fn select_and_bitcast_keep_bits() {
    for t in [I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64] {
        let vals: Vec<u64> = vec![0, 1, width_mask(t), 0x1234 & width_mask(t), 0x8000 & width_mask(t)];
        let n = vals.len();
        let inputs = vec![(0..n as u64).map(|i| i % 2).collect(), vals.clone(), vals.iter().rev().copied().collect()];
        let got = map(&[Pred, t, t], t, &inputs, |b, v| b.select(v[0], v[1], v[2]));
        check(&format!("select.{t}"), &inputs, &got, |a| if a[0] != 0 { a[1] } else { a[2] });
    }
    let pairs_: [(ScalarType, ScalarType); 6] =
        [(F32, U32), (U32, F32), (F64, I64), (F16, U16), (BF16, I16), (I32, F32)];
    for (from, to) in pairs_ {
        let inputs = vec![vec![0, 1, width_mask(from), 0x7fc0_0001 & width_mask(from)]];
        let got = map(&[from], to, &inputs, |b, v| b.bitcast(v[0], to));
        assert_eq!(got, inputs[0], "bitcast {from} -> {to}");
    }
}

/// What `Op::nan_result` (which the passes trust) says against what the interpreter computes,
/// on NaNs of every payload and sign and on ordinary values: an op said to be canonical returns
/// no NaN but the canonical one, and one said to follow its operands returns another NaN only
/// when an operand is one.
#[test]
fn nan_results_are_what_the_interpreter_computes() {
    use ruda_ir::{NanResult, Op};
    for t in [F32, F64] {
        let canonical = (1u64 << (t.bits() - 1)) - 1;
        let (vals, is_nan): (Vec<u64>, fn(u64) -> bool) = match t {
            F32 => (
                [canonical as u32, 0x7fc0_0000, 0xffc0_0001, 0xffff_ffff, 0x3f80_0000, 0x8000_0000, 0x7f80_0000]
                    .map(u64::from)
                    .to_vec(),
                |x| f32::from_bits(x as u32).is_nan(),
            ),
            _ => (
                vec![
                    canonical,
                    0x7ff8_0000_0000_0000,
                    0xfff0_0000_0000_0001,
                    0x3ff0_0000_0000_0000,
                    0x8000_0000_0000_0000,
                ],
                |x| f64::from_bits(x).is_nan(),
            ),
        };
        let mut ops: Vec<(String, usize)> = vec![("fma".into(), 3)];
        ops.extend(
            [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Min, BinaryOp::Max]
                .map(|op| (op.name().into(), 2)),
        );
        let unary = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Sqrt,
            UnaryOp::Rcp,
            UnaryOp::Rsqrt,
            UnaryOp::Ex2,
            UnaryOp::Lg2,
            UnaryOp::Tanh,
            UnaryOp::Sin,
            UnaryOp::Cos,
        ];
        ops.extend(unary.iter().filter(|op| t == F32 || !op.is_approx()).map(|op| (op.name().into(), 1)));
        let mut kinds = [0usize; 3];
        for (name, arity) in ops {
            let ins = vec![t; arity];
            let k = map_kernel(&ins, t, |b, v| match arity {
                3 => b.fma(v[0], v[1], v[2]),
                2 => b.binary(BinaryOp::from_name(&name).unwrap(), v[0], v[1]),
                _ => b.unary(UnaryOp::from_name(&name).unwrap(), v[0]),
            });
            let mut rule = None;
            k.walk(|_, i| {
                if matches!(i.op, Op::Binary(..) | Op::Unary(..) | Op::Fma(..)) && k.ty(i.results[0]).elem() == t {
                    rule = Some(i.op.nan_result(|v| k.ty(v)));
                }
            });
            let rule = rule.expect("the op is in the kernel");
            kinds[match rule {
                NanResult::Canonical => 0,
                NanResult::Operands(_) => 1,
                NanResult::Any => 2,
            }] += 1;
            let mut inputs = vec![vec![]; arity];
            for n in 0..vals.len().pow(arity as u32) {
                for (j, input) in inputs.iter_mut().enumerate() {
                    input.push(vals[n / vals.len().pow(j as u32) % vals.len()]);
                }
            }
            let got = run_map(&k, &ins, t, &inputs);
            for (lane, &y) in got.iter().enumerate() {
                let payload_in = inputs.iter().any(|input| is_nan(input[lane]) && input[lane] != canonical);
                let ok = !is_nan(y)
                    || y == canonical
                    || matches!(rule, NanResult::Any)
                    || matches!(rule, NanResult::Operands(_)) && payload_in;
                let operands: Vec<String> = inputs.iter().map(|input| format!("{:#x}", input[lane])).collect();
                assert!(ok, "{name}.{t} of {operands:?} is {y:#x}, but nan_result says {rule:?}");
            }
        }
        // Arithmetic canonicalises, abs follows its operand, neg may make any NaN.
        assert_eq!(kinds, [if t == F32 { 15 } else { 9 }, 1, 1], "{t}");
    }
}
