//! The composable GQA and MLA pieces against f64 references: GQA ratios, dtypes, MLA ranks and
//! positional dims, and their shape errors.

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_runtime::{DType, Tensor};

/// `out[h, t, s] = scale · Σ_d a[t, h, d] · b[s, h / g, d]` over token-major `a [T, H, D]`, `b [S, Hb, D]`.
fn scores_ref(a: &[f32], b: &[f32], t: usize, h: usize, s: usize, hb: usize, d: usize) -> Vec<f64> {
    let g = h / hb;
    let mut out = vec![0.0; h * t * s];
    for hh in 0..h {
        for tt in 0..t {
            for ss in 0..s {
                let qa = &a[(tt * h + hh) * d..][..d];
                let kb = &b[(ss * hb + hh / g) * d..][..d];
                out[(hh * t + tt) * s + ss] = qa.iter().zip(kb).map(|(x, y)| *x as f64 * *y as f64).sum();
            }
        }
    }
    out
}

/// `out[t, h, e] = Σ_s p[h, t, s] · v[s, h / g, e]`.
fn value_ref(p: &[f32], v: &[f32], t: usize, h: usize, s: usize, hv: usize, e: usize) -> Vec<f64> {
    let g = h / hv;
    let mut out = vec![0.0; t * h * e];
    for hh in 0..h {
        for tt in 0..t {
            for ee in 0..e {
                out[(tt * h + hh) * e + ee] =
                    (0..s).map(|ss| p[(hh * t + tt) * s + ss] as f64 * v[(ss * hv + hh / g) * e + ee] as f64).sum();
            }
        }
    }
    out
}

fn close(what: &str, dtype: DType, got: &Tensor, want: &[f64], terms: usize) {
    let tol = terms as f64 * 4.0 * f32::EPSILON as f64;
    assert_close(what, &got.to_f32_vec().unwrap(), want, tol, 2.0 * epsilon(dtype) + tol);
}

#[test]
fn gqa_pieces_match_references_without_repeating_kv_heads() {
    let dev = device();
    let mut rng = Rng::new(14);
    for dtype in FLOAT_DTYPES {
        for (hq, hkv) in [(1, 1), (3, 1), (3, 3), (16, 4)] {
            let (t, s, d, dv) = (3, 7, 20, 12);
            let q = quantize(dtype, &rng.vec(t * hq * d, -1.0, 1.0));
            let k = quantize(dtype, &rng.vec(s * hkv * d, -1.0, 1.0));
            let v = quantize(dtype, &rng.vec(s * hkv * dv, -1.0, 1.0));
            let scores =
                api::gqa_scores(&tensor(&dev, dtype, &q, &[t, hq, d]), &tensor(&dev, dtype, &k, &[s, hkv, d])).unwrap();
            assert_eq!(scores.dtype(), DType::F32);
            close(
                &format!("gqa_scores {dtype} {hq}/{hkv}"),
                DType::F32,
                &scores,
                &scores_ref(&q, &k, t, hq, s, hkv, d),
                d,
            );
            let p = rng.vec(hq * t * s, 0.0, 1.0);
            let out = api::gqa_value_product(
                &tensor(&dev, DType::F32, &p, &[hq, t, s]),
                &tensor(&dev, dtype, &v, &[s, hkv, dv]),
            )
            .unwrap();
            assert_eq!(out.dtype(), dtype);
            close(
                &format!("gqa_value_product {dtype} {hq}/{hkv}"),
                dtype,
                &out,
                &value_ref(&p, &v, t, hq, s, hkv, dv),
                s,
            );
        }
    }
}

#[test]
fn mla_pieces_match_references() {
    let dev = device();
    let mut rng = Rng::new(15);
    for dtype in FLOAT_DTYPES {
        for (h, r, pdim, dn) in [(1, 64, 16, 8), (3, 64, 64, 16), (16, 512, 16, 4)] {
            let (t, s) = (2, 5);
            let q_nope = quantize(dtype, &rng.vec(t * h * dn, -1.0, 1.0));
            let w_uk = quantize(dtype, &rng.vec(h * dn * r, -0.5, 0.5));
            let q_abs = api::mla_absorb_query(
                &tensor(&dev, dtype, &q_nope, &[t, h, dn]),
                &tensor(&dev, dtype, &w_uk, &[h, dn, r]),
            )
            .unwrap();
            let mut want = vec![0.0; t * h * r];
            for tt in 0..t {
                for hh in 0..h {
                    for rr in 0..r {
                        want[(tt * h + hh) * r + rr] = (0..dn)
                            .map(|i| q_nope[(tt * h + hh) * dn + i] as f64 * w_uk[(hh * dn + i) * r + rr] as f64)
                            .sum();
                    }
                }
            }
            close(&format!("mla_absorb_query {dtype} h={h} r={r}"), dtype, &q_abs, &want, dn);

            let q_abs = quantize(dtype, &rng.vec(t * h * r, -1.0, 1.0));
            let qp = quantize(dtype, &rng.vec(t * h * pdim, -1.0, 1.0));
            let latent = quantize(dtype, &rng.vec(s * r, -1.0, 1.0));
            let kp = quantize(dtype, &rng.vec(s * pdim, -1.0, 1.0));
            let scale = 0.07;
            let got = api::mla_scores(
                &tensor(&dev, dtype, &q_abs, &[t, h, r]),
                &tensor(&dev, dtype, &qp, &[t, h, pdim]),
                &tensor(&dev, dtype, &latent, &[s, r]),
                &tensor(&dev, dtype, &kp, &[s, pdim]),
                scale,
            )
            .unwrap();
            let a = scores_ref(&q_abs, &latent, t, h, s, 1, r);
            let b = scores_ref(&qp, &kp, t, h, s, 1, pdim);
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| scale as f64 * (x + y)).collect();
            close(&format!("mla_scores {dtype} h={h} r={r} p={pdim}"), DType::F32, &got, &want, r + pdim);

            let p = rng.vec(h * t * s, 0.0, 1.0);
            let got = api::mla_value_product(
                &tensor(&dev, DType::F32, &p, &[h, t, s]),
                &tensor(&dev, dtype, &latent, &[s, r]),
            )
            .unwrap();
            close(
                &format!("mla_value_product {dtype} h={h} r={r}"),
                dtype,
                &got,
                &value_ref(&p, &latent, t, h, s, 1, r),
                s,
            );
        }
    }
}

#[test]
fn pieces_reject_mismatched_shapes() {
    let dev = device();
    let f = |shape: &[usize]| Tensor::zeros(&dev, DType::F32, shape).unwrap();
    let err = api::gqa_scores(&f(&[2, 3, 8]), &f(&[4, 2, 8])).unwrap_err();
    assert!(matches!(err, OpError::Shape { op: "gqa_scores", .. }), "{err}");
    assert!(err.to_string().contains("multiple of KV heads"), "{err}");
    let err = api::gqa_value_product(&f(&[2, 3, 5]), &f(&[4, 1, 8])).unwrap_err();
    assert!(err.to_string().contains("key counts"), "{err}");
    let err = api::mla_scores(&f(&[2, 3, 8]), &f(&[2, 3, 4]), &f(&[5, 8]), &f(&[5, 2]), 0.1).unwrap_err();
    assert!(err.to_string().contains("positional dims"), "{err}");
    let err = api::mla_scores(&f(&[2, 3, 8]), &f(&[2, 3, 4]), &f(&[5, 8]), &f(&[5, 4]), f32::NAN).unwrap_err();
    assert!(matches!(err, OpError::InvalidArgument { op: "mla_scores", .. }), "{err}");
    let err = api::mla_value_product(&f(&[3, 2, 5]), &f(&[5, 8, 1])).unwrap_err();
    assert!(err.to_string().contains("2-D"), "{err}");
    let err = api::mla_absorb_query(&f(&[2, 3, 8]), &f(&[3, 4, 16])).unwrap_err();
    assert!(err.to_string().contains("head dims"), "{err}");
}
