//! The gated shared expert's add (`out = routed + sigmoid(gate) · shared`, the gate one logit per
//! token) against an f64 reference at awkward shapes (1, 7 and 65 tokens; hidden sizes 37 and
//! 100, not multiples of a warp), in every float dtype, with the special values of the gate
//! (±inf, large logits, NaN); and every invalid argument is an error.
//!
//! Tolerance: the device computes in `f32` (the exponent's argument, `2^x`, the sum, the
//! division and the add: a few roundings of the magnitudes `|routed| + |shared · sigmoid|`)
//! and rounds once to the dtype (one unit of its epsilon times the result).

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_runtime::{DType, Tensor};

fn sigmoid64(g: f64) -> f64 {
    1.0 / (1.0 + (-g).exp())
}

#[test]
fn shared_expert_add_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(4107);
    for dtype in FLOAT_DTYPES {
        for t in [1, 7, 65] {
            for h in [37, 100] {
                let routed = quantize(dtype, &rng.vec(t * h, -3.0, 3.0));
                let shared = quantize(dtype, &rng.vec(t * h, -3.0, 3.0));
                let mut gate = quantize(dtype, &rng.vec(t, -6.0, 6.0));
                // Gates that saturate either way, a large negative one (e^60 in f32) and NaN.
                if t >= 7 {
                    gate[1] = f32::INFINITY;
                    gate[2] = f32::NEG_INFINITY;
                    gate[3] = round_to(dtype, -60.0);
                    gate[4] = f32::NAN;
                }
                let got = api::shared_expert_add(
                    &tensor(&dev, dtype, &routed, &[t, h]),
                    &tensor(&dev, dtype, &shared, &[t, h]),
                    &tensor(&dev, dtype, &gate, &[t, 1]),
                )
                .unwrap();
                assert_eq!((got.shape(), got.dtype()), (&[t, h][..], dtype));
                let got = got.to_f32_vec().unwrap();
                let what = format!("shared_expert_add {dtype} T={t} H={h}");
                for (i, &g) in got.iter().enumerate() {
                    let (r, s, z) = (routed[i] as f64, shared[i] as f64, gate[i / h] as f64);
                    let want = r + sigmoid64(z) * s;
                    if want.is_nan() {
                        assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN (gate {z})");
                        continue;
                    }
                    let magnitude = r.abs() + (sigmoid64(z) * s).abs();
                    let tol = 16.0 * f32::EPSILON as f64 * magnitude + epsilon(dtype) * want.abs() + 1e-30;
                    let err = (g as f64 - want).abs();
                    assert!(err <= tol, "{what}[{i}]: got {g}, want {want} (error {err:.3e} > {tol:.3e})");
                }
            }
        }
    }
}

/// The shared expert's rows scaled by a gate of `-inf` add nothing: the routed rows' bits.
#[test]
fn a_closed_gate_keeps_the_routed_rows_bits() {
    let dev = device();
    let mut rng = Rng::new(4108);
    for dtype in FLOAT_DTYPES {
        let routed = quantize(dtype, &rng.vec(3 * 40, -3.0, 3.0));
        let got = api::shared_expert_add(
            &tensor(&dev, dtype, &routed, &[3, 40]),
            &tensor(&dev, dtype, &rng.vec(3 * 40, -3.0, 3.0), &[3, 40]),
            &tensor(&dev, dtype, &[f32::NEG_INFINITY; 3], &[3, 1]),
        )
        .unwrap();
        assert_bits(&format!("closed gate {dtype}"), &got.to_f32_vec().unwrap(), &routed);
    }
}

fn fails<T: std::fmt::Debug>(r: Result<T, OpError>, needle: &str) {
    let err = r.expect_err("an invalid argument was accepted").to_string();
    assert!(err.contains(needle), "`{err}` does not mention `{needle}`");
}

#[test]
fn bad_arguments_are_errors() {
    let dev = device();
    let rows = |dtype, shape: &[usize]| Tensor::zeros(&dev, dtype, shape).unwrap();
    let (r, s, g) = (rows(DType::BF16, &[3, 8]), rows(DType::BF16, &[3, 8]), rows(DType::BF16, &[3, 1]));
    fails(api::shared_expert_add(&rows(DType::BF16, &[24]), &s, &g), "expected [tokens, hidden]");
    fails(api::shared_expert_add(&r, &rows(DType::BF16, &[3, 9]), &g), "shared");
    fails(api::shared_expert_add(&r, &s, &rows(DType::BF16, &[3, 8])), "gate");
    fails(api::shared_expert_add(&r, &s, &rows(DType::BF16, &[1, 1])), "gate");
    fails(api::shared_expert_add(&r, &rows(DType::F16, &[3, 8]), &g), "shared");
    fails(api::shared_expert_add(&r, &s, &rows(DType::F32, &[3, 1])), "gate");
    fails(api::shared_expert_add(&rows(DType::U32, &[3, 8]), &s, &g), "moe_shared_expert_add");
    let out = rows(DType::BF16, &[2, 8]);
    fails(api::shared_expert_add_into(&dev.default_stream(), &r, &s, &g, &out), "out");
}
