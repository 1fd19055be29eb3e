//! Random expression DAGs over two loaded values and constants chosen to trigger the rewrite
//! rules (zeros, ones, all-ones, powers of two and their negations, float edge values), run on
//! every pair of edge inputs before and after each pass: the rules in combination, with the
//! errors of division by zero included.

use crate::passes_support;

use passes_support::*;
use ruda_ir::*;

use ScalarType::*;

/// SplitMix64: a small deterministic source of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Constants that rules look for.
fn interesting(t: ScalarType, rng: &mut Rng) -> Constant {
    if t.is_float() {
        let e = edges(t);
        return Constant::new(t, rng.pick(&e));
    }
    let k = rng.below(t.bits() as usize);
    let v: u64 = match rng.below(6) {
        0 => 1u64 << k,
        1 => (1u64 << k).wrapping_neg(),
        2 => (1u64 << k).wrapping_sub(1),
        3 => rng.pick(&[0, 1, u64::MAX]),
        _ => rng.pick(&edges(t)),
    };
    Constant::new(t, v)
}

fn build(t: ScalarType, seed: u64) -> (Kernel, usize) {
    let mut rng = Rng(seed);
    multi_map(t, |b, x, y| {
        let mut pool = vec![x, y];
        for _ in 0..3 {
            let c = interesting(t, &mut rng);
            pool.push(b.constant(c));
        }
        let mut preds = vec![];
        for _ in 0..24 {
            let a = rng.pick(&pool);
            let c = rng.pick(&pool);
            let d = rng.pick(&pool);
            let v = match rng.below(9) {
                0..=3 => {
                    let ops: &[BinaryOp] = if t.is_float() {
                        &[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Min, BinaryOp::Max]
                    } else {
                        BinaryOp::ALL
                    };
                    let op = rng.pick(ops);
                    if matches!(op, BinaryOp::Shl | BinaryOp::Shr) {
                        let amount = b.const_u32(rng.below(t.bits() as usize + 3) as u32);
                        b.binary(op, a, amount)
                    } else if matches!(op, BinaryOp::Div | BinaryOp::Rem) && t.is_int() {
                        // Never zero (that error would end the whole run): a non-zero constant
                        // or `c | 1`.
                        let divisor = match rng.below(4) {
                            0 => {
                                let one = b.constant(Constant::new(t, 1));
                                b.or(c, one)
                            }
                            _ => {
                                let k = interesting(t, &mut rng);
                                b.constant(if k.bits == 0 { Constant::new(t, 3) } else { k })
                            }
                        };
                        b.binary(op, a, divisor)
                    } else {
                        b.binary(op, a, c)
                    }
                }
                4 => {
                    let ops: &[UnaryOp] = if t.is_float() {
                        &[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt, UnaryOp::Rcp]
                    } else if t.is_signed_int() {
                        &[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Not]
                    } else {
                        &[UnaryOp::Not]
                    };
                    b.unary(rng.pick(ops), a)
                }
                5 => b.fma(a, c, d),
                6 => {
                    let ops: &[CmpOp] = if t.is_float() { CmpOp::ALL } else { &CmpOp::ALL[..6] };
                    let p = b.cmp(rng.pick(ops), a, c);
                    preds.push(p);
                    b.select(p, c, d)
                }
                7 if !preds.is_empty() => {
                    let p = rng.pick(&preds);
                    let q = b.not(p);
                    b.select(q, a, c)
                }
                _ => {
                    let k = interesting(t, &mut rng);
                    let k = b.constant(k);
                    b.binary(rng.pick(&[BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub]), a, k)
                }
            };
            pool.push(v);
        }
        pool.split_off(pool.len() - 8)
    })
}

#[test]
fn random_expressions_keep_their_values_through_every_pass() {
    let pipelines = ["fold", "simplify", "cse", "dce", "simplify,dce", "fold,simplify,cse,dce", "default"];
    for t in [I16, U16, I32, U32, I64, U64, F32, F64] {
        for seed in 0..40 {
            let (k, slots) = build(t, seed * 31 + t.bits() as u64);
            let (launch, args) = multi_args(t, slots);
            for p in pipelines {
                let after = optimized(&k, p);
                assert_same(&k, &after, launch, &args);
            }
        }
    }
}
