//! `cvt` in every direction and rounding mode, against a reference that brackets the exact
//! value between the two neighbouring representable numbers (found by stepping through the
//! destination's bit patterns) and picks per mode.

use crate::interp_support;

use std::cmp::Ordering;

use interp_support::*;
use ruda_ir::{Cvt, Rounding, ScalarType};
use ScalarType::*;

const MODES: [Rounding; 4] = [Rounding::Rn, Rounding::Rz, Rounding::Rm, Rounding::Rp];

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A float format of the tests, described by bit patterns.
#[derive(Clone, Copy)]
struct Format {
    ty: ScalarType,
    bits: u32,
    /// Exact value of a bit pattern.
    value: fn(u64) -> f64,
    /// Some nearby pattern (round-to-nearest from f64, possibly off by double rounding).
    near: fn(f64) -> u64,
    /// 2^(emax+1): where an overflowing value would sit, for ties at the top.
    overflow: f64,
}

const FORMATS: [Format; 4] = [
    Format {
        ty: F16,
        bits: 16,
        value: |b| half::f16::from_bits(b as u16).to_f64(),
        near: |x| half::f16::from_f64(x).to_bits() as u64,
        overflow: 65536.0,
    },
    Format {
        ty: BF16,
        bits: 16,
        value: |b| half::bf16::from_bits(b as u16).to_f64(),
        near: |x| half::bf16::from_f64(x).to_bits() as u64,
        overflow: 3.402_823_669_209_385e38,
    },
    Format {
        ty: F32,
        bits: 32,
        value: |b| f32::from_bits(b as u32) as f64,
        near: |x| (x as f32).to_bits() as u64,
        overflow: 3.402_823_669_209_385e38,
    },
    Format { ty: F64, bits: 64, value: f64::from_bits, near: f64::to_bits, overflow: f64::INFINITY },
];

impl Format {
    fn sign(&self) -> u64 {
        1 << (self.bits - 1)
    }
    fn nan(&self) -> u64 {
        self.sign() - 1
    }
    fn next_up(&self, b: u64) -> u64 {
        if (self.value)(b) == f64::INFINITY {
            b
        } else if b == 0 || b == self.sign() {
            1
        } else if b & self.sign() == 0 {
            b + 1
        } else {
            b - 1
        }
    }
    fn next_down(&self, b: u64) -> u64 {
        self.next_up(b ^ self.sign()) ^ self.sign()
    }
    /// Value for distance comparisons: infinities as the overflow threshold.
    fn magnitude(&self, b: u64) -> f64 {
        let v = (self.value)(b);
        if v.is_infinite() {
            self.overflow.copysign(v)
        } else {
            v
        }
    }
}

/// An exact source value.
#[derive(Clone, Copy, Debug)]
enum Exact {
    Int(i128),
    Float(f64),
}

impl Exact {
    fn approx(self) -> f64 {
        match self {
            Exact::Int(v) => v as f64,
            Exact::Float(x) => x,
        }
    }
    fn negative(self) -> bool {
        self.approx() < 0.0
    }
    /// Compare the exact value of pattern `b` of `fmt` with this value.
    fn cmp_with(self, fmt: &Format, b: u64) -> Ordering {
        let r = (fmt.value)(b);
        match self {
            Exact::Float(x) => r.partial_cmp(&x).unwrap(),
            Exact::Int(_) if r.is_infinite() => r.partial_cmp(&0.0).unwrap(),
            // Truncation decides unless it lands on `v` itself from a non-integer.
            Exact::Int(v) => match (r as i128).cmp(&v) {
                Ordering::Equal if r.fract() != 0.0 => r.partial_cmp(&0.0).unwrap(),
                o => o,
            },
        }
    }
    /// Compare this value with the midpoint of two patterns.
    fn cmp_mid(self, fmt: &Format, lo: u64, hi: u64) -> Ordering {
        let (a, b) = (fmt.magnitude(lo), fmt.magnitude(hi));
        match self {
            Exact::Float(x) => (2.0 * x).partial_cmp(&(a + b)).unwrap(),
            Exact::Int(v) => (2 * v).cmp(&(a as i128 + b as i128)),
        }
    }
}

/// The pattern of `fmt` that `v` (finite) converts to under `mode`.
fn reference(fmt: &Format, v: Exact, mode: Rounding) -> u64 {
    let mut down = (fmt.near)(v.approx());
    while v.cmp_with(fmt, down) == Ordering::Greater {
        down = fmt.next_down(down);
    }
    while fmt.next_up(down) != down && v.cmp_with(fmt, fmt.next_up(down)) != Ordering::Greater {
        down = fmt.next_up(down);
    }
    if v.cmp_with(fmt, down) == Ordering::Equal {
        // Exact: zero keeps the sign of a float source.
        return match v {
            Exact::Float(x) if x == 0.0 => x.to_bits() >> (64 - fmt.bits),
            _ => down,
        };
    }
    let up = fmt.next_up(down);
    match mode {
        Rounding::Rm => down,
        Rounding::Rp => up,
        Rounding::Rz => {
            if v.negative() {
                up
            } else {
                down
            }
        }
        Rounding::Rn => match v.cmp_mid(fmt, down, up) {
            Ordering::Less => down,
            Ordering::Greater => up,
            Ordering::Equal => {
                if down & 1 == 0 {
                    down
                } else {
                    up
                }
            }
        },
    }
}

fn cvt(to: ScalarType, rounding: Option<Rounding>, sat: bool) -> Cvt {
    Cvt { to, rounding, sat }
}

fn int_samples(t: ScalarType, rng: &mut Rng) -> Vec<u64> {
    let mut v = int_edges(t);
    v.extend(
        [1 << 24, (1 << 24) + 1, (1 << 24) + 3, 65504, 65519, 65520, 65535, (1 << 53) + 1, 0x7fff_ff40]
            .map(|x| x & width_mask(t)),
    );
    for _ in 0..200 {
        let shift = rng.next() % 64;
        v.push((rng.next() >> shift) & width_mask(t));
    }
    v
}

const ALL_INTS: [ScalarType; 8] = [I8, I16, I32, I64, U8, U16, U32, U64];

#[test]
fn integer_to_integer_extends_by_source_and_saturates() {
    for from in ALL_INTS {
        let inputs = vec![int_edges(from)];
        for to in ALL_INTS {
            for sat in [false, true] {
                let got = map(&[from], to, &inputs, |b, v| b.cvt_with(v[0], cvt(to, None, sat)));
                check(&format!("cvt{}.{to}.{from}", if sat { ".sat" } else { "" }), &inputs, &got, |a| {
                    let v = ival(from, a[0]);
                    if sat {
                        let hi = (width_mask(to) >> to.is_signed_int() as u32) as i128;
                        let lo = if to.is_signed_int() { -hi - 1 } else { 0 };
                        ibits(to, v.clamp(lo, hi))
                    } else {
                        ibits(to, v)
                    }
                });
            }
        }
    }
}

#[test]
fn integer_to_float_in_every_mode() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for from in ALL_INTS {
        let inputs = vec![int_samples(from, &mut rng)];
        for fmt in &FORMATS {
            for mode in MODES {
                let got = map(&[from], fmt.ty, &inputs, |b, v| b.cvt_with(v[0], cvt(fmt.ty, Some(mode), false)));
                check(&format!("cvt.{mode}.{}.{from}", fmt.ty), &inputs, &got, |a| {
                    reference(fmt, Exact::Int(ival(from, a[0])), mode)
                });
            }
        }
    }
}

#[test]
fn wide_integers_round_once_to_f32() {
    // 2^60 + 2^36 + 1 lies just above the midpoint between two f32 values; rounding to f64
    // first would land exactly on the midpoint and then round down to even.
    let v: u64 = (1 << 60) + (1 << 36) + 1;
    let got = map(&[U64], F32, &[vec![v]], |b, x| b.cvt_with(x[0], cvt(F32, Some(Rounding::Rn), false)));
    assert_eq!(got[0], (v as f32).to_bits() as u64);
    assert_eq!(f32::from_bits(got[0] as u32), (1u64 << 60) as f32 + (1u64 << 37) as f32);
    // u64::MAX to f16: infinity to nearest, the largest finite value toward zero.
    let rz = map(&[U64], F16, &[vec![u64::MAX]], |b, x| b.cvt_with(x[0], cvt(F16, Some(Rounding::Rz), false)));
    let rn = map(&[U64], F16, &[vec![u64::MAX]], |b, x| b.cvt_with(x[0], cvt(F16, Some(Rounding::Rn), false)));
    assert_eq!((rz[0], rn[0]), (0x7bff, 0x7c00));
}

fn float_samples(fmt: &Format, rng: &mut Rng, narrow_to: u32) -> Vec<u64> {
    let (mut v, exp_bits) = if fmt.ty == F64 { (f64_edges(), 11) } else { (f32_edges(), 8) };
    let frac_bits = fmt.bits - 1 - exp_bits;
    let bias = (1i64 << (exp_bits - 1)) - 1;
    // Random patterns whose exponents straddle the destination's range.
    for _ in 0..400 {
        let x = rng.next();
        let e = (bias + (x % (2 * narrow_to as u64 + 40)) as i64 - narrow_to as i64 - 20).clamp(0, 2 * bias + 1);
        let mant = rng.next() % (1 << frac_bits);
        let sign = (x >> 63) << (fmt.bits - 1);
        v.push(sign | ((e as u64) << frac_bits) | mant);
    }
    v
}

#[test]
fn float_narrowing_in_every_mode() {
    let mut rng = Rng(0xfeed_beef_0bad_cafe);
    let (f16, bf16, f32_, f64_) = (FORMATS[0], FORMATS[1], FORMATS[2], FORMATS[3]);
    let cases = [(f32_, f16, 24), (f32_, bf16, 130), (f64_, f32_, 150), (f64_, f16, 24), (f64_, bf16, 130)];
    for (from, to, range) in cases {
        let inputs = vec![float_samples(&from, &mut rng, range)];
        for mode in MODES {
            let got = map(&[from.ty], to.ty, &inputs, |b, v| b.cvt_with(v[0], cvt(to.ty, Some(mode), false)));
            check(&format!("cvt.{mode}.{}.{}", to.ty, from.ty), &inputs, &got, |a| {
                let x = (from.value)(a[0]);
                if x.is_nan() {
                    to.nan()
                } else if x.is_infinite() {
                    (to.near)(x)
                } else {
                    reference(&to, Exact::Float(x), mode)
                }
            });
        }
    }
}

#[test]
fn half_widening_is_exact_for_every_pattern() {
    let all: Vec<u64> = (0..=u16::MAX as u64).collect();
    let inputs = vec![all];
    for (from, value) in [(F16, FORMATS[0].value), (BF16, FORMATS[1].value)] {
        for to in [F32, F64] {
            let got = map(&[from], to, &inputs, |b, v| b.cvt_with(v[0], cvt(to, None, false)));
            check(&format!("cvt.{to}.{from}"), &inputs, &got, |a| {
                let x = value(a[0]);
                if from == BF16 && to == F32 {
                    // A shift, as in both backends: NaN payloads survive.
                    a[0] << 16
                } else if to == F32 {
                    canon32(x as f32)
                } else {
                    canon64(x)
                }
            });
        }
    }
    let inputs = vec![f32_edges()];
    let got = map(&[F32], F64, &inputs, |b, v| b.cvt_with(v[0], cvt(F64, None, false)));
    check("cvt.f64.f32", &inputs, &got, |a| canon64(f32::from_bits(a[0] as u32) as f64));
}

#[test]
fn float_to_integer_rounds_then_saturates() {
    let mut rng = Rng(0x0bad_f00d_dead_beef);
    let mut xs: Vec<f64> = vec![
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.49999997,
        127.5,
        128.0,
        -128.5,
        255.5,
        256.0,
        32767.5,
        65535.5,
        2147483520.0,
        2147483648.0,
        -2147483904.0,
        4294967296.0,
        9.3e18,
        1.9e19,
        -9.3e18,
        1e30,
        -1e30,
    ];
    xs.extend((0..100).map(|_| ((rng.next() % 2_000_000) as f64 - 1_000_000.0) / 7.0));
    xs.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-40]);
    for from in [F32, F64] {
        let bits: Vec<u64> =
            xs.iter().map(|&x| if from == F32 { (x as f32).to_bits() as u64 } else { x.to_bits() }).collect();
        let inputs = vec![bits];
        for to in ALL_INTS {
            for mode in MODES {
                let got = map(&[from], to, &inputs, |b, v| b.cvt_with(v[0], cvt(to, Some(mode), false)));
                check(&format!("cvt.{mode}i.{to}.{from}"), &inputs, &got, |a| {
                    let x = if from == F32 { f32::from_bits(a[0] as u32) as f64 } else { f64::from_bits(a[0]) };
                    if x.is_nan() {
                        // PTX: 0, except from f64 or into a 64-bit integer: 1 << (bits - 1).
                        return if from == F64 || to.bits() == 64 { 1 << (to.bits() - 1) } else { 0 };
                    }
                    let r = match mode {
                        Rounding::Rn => x.round_ties_even(),
                        Rounding::Rz => x.trunc(),
                        Rounding::Rm => x.floor(),
                        Rounding::Rp => x.ceil(),
                    };
                    // The range is [-2^(w-1), 2^(w-1)) or [0, 2^w): powers of two, exact in f64.
                    let w = to.bits() - to.is_signed_int() as u32;
                    let (lo, hi) = (if to.is_signed_int() { -(2f64.powi(w as i32)) } else { 0.0 }, 2f64.powi(w as i32));
                    if r >= hi {
                        width_mask(to) >> to.is_signed_int() as u32
                    } else if r < lo {
                        ibits(to, -(1i128 << w))
                    } else {
                        ibits(to, r as i128)
                    }
                });
            }
        }
    }
    // The integer-destination `.sat` flag changes nothing: float sources always saturate.
    let inputs = vec![vec![(-5.0f32).to_bits() as u64, 300.7f32.to_bits() as u64]];
    let got = map(&[F32], U8, &inputs, |b, v| b.cvt_with(v[0], cvt(U8, Some(Rounding::Rz), true)));
    assert_eq!(got, vec![0, 255]);
}

#[test]
fn float_rounds_to_integral_in_its_own_format() {
    let inputs32 = vec![f32_edges().into_iter().chain([0x3f00_0000u64, 0xbeff_ffff, 0x4b7f_ffff]).collect::<Vec<_>>()];
    let inputs64 = vec![f64_edges()];
    for mode in MODES {
        let round32: fn(f32) -> f32 = match mode {
            Rounding::Rn => f32::round_ties_even,
            Rounding::Rz => f32::trunc,
            Rounding::Rm => f32::floor,
            Rounding::Rp => f32::ceil,
        };
        let got = map(&[F32], F32, &inputs32, |b, v| b.cvt_with(v[0], cvt(F32, Some(mode), false)));
        check(&format!("cvt.{mode}i.f32.f32"), &inputs32, &got, |a| canon32(round32(f32::from_bits(a[0] as u32))));
        let round64: fn(f64) -> f64 = match mode {
            Rounding::Rn => f64::round_ties_even,
            Rounding::Rz => f64::trunc,
            Rounding::Rm => f64::floor,
            Rounding::Rp => f64::ceil,
        };
        let got = map(&[F64], F64, &inputs64, |b, v| b.cvt_with(v[0], cvt(F64, Some(mode), false)));
        check(&format!("cvt.{mode}i.f64.f64"), &inputs64, &got, |a| canon64(round64(f64::from_bits(a[0]))));
        let halves = vec![vec![0x3c00u64, 0x3e00, 0xbe00, 0x4100, 0x3800, 0xb800, 0x7bff, 0x7e00, 0x8000]];
        let got = map(&[F16], F16, &halves, |b, v| b.cvt_with(v[0], cvt(F16, Some(mode), false)));
        check(&format!("cvt.{mode}i.f16.f16"), &halves, &got, |a| {
            let x = half::f16::from_bits(a[0] as u16).to_f32();
            if x.is_nan() {
                0x7fff
            } else {
                half::f16::from_f32(round32(x)).to_bits() as u64
            }
        });
    }
    // Negative values that round to zero keep their sign, as in PTX.
    let got = map(&[F32], F32, &[vec![(-0.3f32).to_bits() as u64]], |b, v| {
        b.cvt_with(v[0], cvt(F32, Some(Rounding::Rn), false))
    });
    assert_eq!(got[0], (-0.0f32).to_bits() as u64);
}

/// NaNs of every float format (the canonical one, other payloads, negative ones): a conversion
/// that [`Cvt::keeps_nan_payload`] says canonicalises returns the destination's canonical NaN
/// for each; one that keeps payloads moves the bits (a move) or shifts them (bf16 to f32). The
/// passes rely on that method, so it must describe what the interpreter does.
#[test]
fn nan_payloads_survive_exactly_where_cvt_says() {
    let nans = |t: ScalarType| -> Vec<u64> {
        match t {
            F16 => vec![0x7fff, 0x7e00, 0x7c01, 0xfe00, 0xffff],
            BF16 => vec![0x7fff, 0x7fc0, 0x7f81, 0xffc0, 0xffff],
            F32 => vec![0x7fff_ffff, 0x7fc0_0000, 0x7f80_0001, 0xffc0_0000, 0xffff_ffff],
            _ => vec![0x7fff_ffff_ffff_ffff, 0x7ff8_0000_0000_0000, 0x7ff0_0000_0000_0001, 0xfff8_0000_0000_0000],
        }
    };
    let mut checked = [0usize; 2];
    for from in [F16, BF16, F32, F64] {
        for to in [F16, BF16, F32, F64] {
            let needs = ruda_ir::verify::cvt_needs_rounding(from, to);
            let mut roundings: Vec<Option<Rounding>> = if needs { vec![] } else { vec![None] };
            if needs || from == to {
                roundings.extend(MODES.map(Some));
            }
            for rounding in roundings {
                let c = cvt(to, rounding, false);
                let inputs = vec![nans(from)];
                let got = map(&[from], to, &inputs, |b, v| b.cvt_with(v[0], c));
                let canonical = (1u64 << (to.bits() - 1)) - 1;
                let keeps = c.keeps_nan_payload(from);
                checked[keeps as usize] += 1;
                for (&x, &y) in inputs[0].iter().zip(&got) {
                    let kept = if from == to { x } else { x << 16 };
                    let expected = if keeps { kept } else { canonical };
                    assert_eq!(
                        y, expected,
                        "cvt {from} -> {to} ({rounding:?}) of {x:#x}: {y:#x}, expected {expected:#x}"
                    );
                }
            }
        }
    }
    // bf16 -> f32 and the four moves keep payloads; every other pair and mode canonicalises.
    assert_eq!(checked[1], 5, "conversions that keep payloads");
    assert!(checked[0] > 30, "conversions that canonicalise: {}", checked[0]);
}
