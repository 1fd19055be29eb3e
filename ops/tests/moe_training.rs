//! First-order router training against f64: the selection's weights against a plain f64
//! computation, and the logits' gradient against central finite differences of the f64 loss
//! `Σ_k g_k w_k(z)`, for softmax and sigmoid scoring, with and without renormalisation, every
//! float and index dtype, repeated indices, awkward expert counts, invalid indices and every bad
//! argument.

use crate::common::*;
use ruda_ops::api::{self, OpError, RouterScoring, RouterWeightOptions, RoutingOptions};
use ruda_runtime::{DType, Device, Tensor};

/// The f64 weights of row `z` for the selection `ids` (NaN for an id outside `0..E`).
fn weights_reference(z: &[f64], ids: &[i64], o: &RouterWeightOptions) -> Vec<f64> {
    let e = z.len() as i64;
    if ids.iter().any(|&i| i < 0 || i >= e) {
        return vec![f64::NAN; ids.len()];
    }
    let scores: Vec<f64> = match o.scoring {
        RouterScoring::Softmax => {
            let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            let ex: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
            let sum: f64 = ex.iter().sum();
            ex.iter().map(|v| v / sum).collect()
        }
        RouterScoring::Sigmoid => z.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
    };
    let picked: Vec<f64> = ids.iter().map(|&i| scores[i as usize]).collect();
    let total: f64 = picked.iter().sum();
    picked.iter().map(|s| o.scale as f64 * if o.renormalize { s / total } else { *s }).collect()
}

/// `∂/∂z Σ_k g_k w_k(z)` by central differences in f64.
fn gradient_reference(z: &[f64], ids: &[i64], g: &[f64], o: &RouterWeightOptions) -> Vec<f64> {
    let loss = |z: &[f64]| weights_reference(z, ids, o).iter().zip(g).map(|(w, g)| w * g).sum::<f64>();
    let h = 1e-6;
    (0..z.len())
        .map(|e| {
            let (mut up, mut down) = (z.to_vec(), z.to_vec());
            up[e] += h;
            down[e] -= h;
            (loss(&up) - loss(&down)) / (2.0 * h)
        })
        .collect()
}

/// An index tensor of `dtype` holding `ids`.
fn index_tensor(dev: &Device, dtype: DType, ids: &[i64], shape: &[usize]) -> Tensor {
    let t = match dtype {
        DType::U32 => Tensor::from_slice(dev, &ids.iter().map(|&i| i as u32).collect::<Vec<_>>(), shape),
        DType::I32 => Tensor::from_slice(dev, &ids.iter().map(|&i| i as i32).collect::<Vec<_>>(), shape),
        DType::I64 => Tensor::from_slice(dev, ids, shape),
        other => panic!("not an index dtype: {other}"),
    };
    t.expect("index upload")
}

const INDEX_DTYPES: [DType; 3] = [DType::U32, DType::I32, DType::I64];

fn options() -> Vec<RouterWeightOptions> {
    let mut out = Vec::new();
    for scoring in [RouterScoring::Softmax, RouterScoring::Sigmoid] {
        for renormalize in [false, true] {
            for scale in [1.0, 2.5] {
                out.push(RouterWeightOptions { scoring, renormalize, scale });
            }
        }
    }
    out
}

/// Run both ops on one problem and compare with f64.
fn check(dev: &Device, what: &str, dtype: DType, index: DType, (t, e, k): (usize, usize, usize), ids: &[i64]) {
    let mut rng = Rng::new((t * 1000 + e * 10 + k) as u64);
    let z = quantize(dtype, &rng.vec(t * e, -3.0, 3.0));
    let g: Vec<f32> = rng.vec(t * k, -1.0, 1.0);
    let logits = tensor(dev, dtype, &z, &[t, e]);
    let indices = index_tensor(dev, index, ids, &[t, k]);
    let grad_weights = Tensor::from_slice(dev, &g, &[t, k]).unwrap();
    for o in options() {
        let label = format!("{what} {dtype} {index} T={t} E={e} k={k} {o:?}");
        let (mut want_w, mut want_d) = (Vec::new(), Vec::new());
        for r in 0..t {
            let zr: Vec<f64> = z[r * e..(r + 1) * e].iter().map(|&v| v as f64).collect();
            let ir = &ids[r * k..(r + 1) * k];
            let gr: Vec<f64> = g[r * k..(r + 1) * k].iter().map(|&v| v as f64).collect();
            want_w.extend(weights_reference(&zr, ir, &o));
            if ir.iter().any(|&i| i < 0 || i >= e as i64) {
                want_d.extend(vec![f64::NAN; e]);
            } else {
                want_d.extend(gradient_reference(&zr, ir, &gr, &o));
            }
        }
        let w = api::selected_router_weights(&logits, &indices, o).unwrap();
        assert_eq!((w.dtype(), w.shape()), (DType::F32, &[t, k][..]), "{label}");
        // f32 arithmetic with an approximate exp, against f64.
        assert_close(&format!("{label}: weights"), &w.to_vec::<f32>().unwrap(), &want_w, 1e-6, 1e-5);
        let d = api::selected_router_backward(&logits, &indices, &grad_weights, o).unwrap();
        assert_eq!((d.dtype(), d.shape()), (dtype, &[t, e][..]), "{label}");
        let got = d.to_f32_vec().unwrap();
        // One rounding to the dtype after f32 arithmetic; cancellation in the centred sums
        // leaves an absolute error of a few f32 ulps of the row's largest term.
        let largest = want_d.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
        let abs = 1e-6 + 1e-5 * largest * o.scale as f64;
        assert_close(&format!("{label}: gradient"), &got, &want_d, abs, 2.0 * epsilon(dtype) + 1e-5);
    }
}

#[test]
fn router_weights_and_gradients_match_f64_finite_differences() {
    let dev = device();
    let mut rng = Rng::new(7);
    // (T, E, top_k): a warp-ragged router, one expert, every expert selected, the most slots
    // (64) of a wide router, and a tiny one.
    for (t, e, k) in [(3, 60, 8), (2, 1, 1), (2, 33, 33), (1, 100, 64), (4, 7, 3)] {
        for dtype in FLOAT_DTYPES {
            for index in INDEX_DTYPES {
                // Draws with replacement: ids repeat within rows (gather semantics).
                let ids: Vec<i64> = (0..t * k).map(|_| (rng.next_u64() % e as u64) as i64).collect();
                check(&dev, "random", dtype, index, (t, e, k), &ids);
            }
        }
    }
    // Distinct ids in reverse order, and one id taken every time.
    let distinct: Vec<i64> = (0..2).flat_map(|_| (0..8).rev().map(|i| i * 7)).collect();
    check(&dev, "distinct", DType::F32, DType::U32, (2, 60, 8), &distinct);
    check(&dev, "repeated", DType::BF16, DType::I64, (1, 60, 5), &[9; 5]);
}

#[test]
fn an_invalid_index_makes_its_row_nan_and_only_its_row() {
    let dev = device();
    let (t, e, k) = (4, 40, 3);
    // Rows 1 and 3 hold an id past E and a negative one (i32/i64) or a huge one (u32).
    for index in INDEX_DTYPES {
        let negative = if index == DType::U32 { u32::MAX as i64 } else { -1 };
        let huge = if index == DType::I64 { 1 << 40 } else { e as i64 };
        let ids = [0, 5, 39, 1, huge, 2, 7, 7, 7, 3, negative, 4];
        check(&dev, "invalid", DType::F16, index, (t, e, k), &ids);
        let logits = tensor(&dev, DType::F32, &vec![0.5; t * e], &[t, e]);
        let w = api::selected_router_weights(&logits, &index_tensor(&dev, index, &ids, &[t, k]), Default::default())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let nan_rows: Vec<bool> = w.chunks(k).map(|r| r.iter().all(|v| v.is_nan())).collect();
        assert_eq!(nan_rows, [false, true, false, true], "{index}: {w:?}");
    }
}

#[test]
fn a_routing_plan_trains_with_its_selection() {
    let dev = device();
    let (t, e, k) = (5, 24, 4);
    let mut rng = Rng::new(11);
    for dtype in FLOAT_DTYPES {
        let z = quantize(dtype, &rng.vec(t * e, -2.0, 2.0));
        let logits = tensor(&dev, dtype, &z, &[t, e]);
        let plan = api::route(&logits, RoutingOptions { top_k: k, renormalize: true }).unwrap();
        let routed = plan.weights().to_f32_vec().unwrap();
        let indices = plan.indices().to_vec::<u32>().unwrap();
        let o = RouterWeightOptions { scoring: RouterScoring::Softmax, renormalize: true, scale: 1.0 };
        let training = plan.into_training(&logits, o).unwrap();
        assert_eq!(training.routing().indices().to_vec::<u32>().unwrap(), indices, "{dtype}: the selection is kept");
        // The recomputed weights are the routing's (the same math, rounded to the dtype).
        let recomputed = training.routing().weights().to_f32_vec().unwrap();
        let want: Vec<f64> = routed.iter().map(|&v| v as f64).collect();
        assert_close(&format!("{dtype}: recomputed"), &recomputed, &want, 1e-6, 2.0 * epsilon(dtype));
        assert_eq!(training.weights().dtype(), DType::F32);
        let g = Tensor::from_slice(&dev, &rng.vec(t * k, -1.0, 1.0), &[t, k]).unwrap();
        let ids = Tensor::from_slice(&dev, &indices, &[t, k]).unwrap();
        let direct = api::selected_router_backward(&logits, &ids, &g, o).unwrap().to_f32_vec().unwrap();
        assert_eq!(training.backward(&g).unwrap().to_f32_vec().unwrap(), direct, "{dtype}");
    }
}

#[test]
fn bad_router_training_arguments_are_errors() {
    let dev = device();
    let logits = tensor(&dev, DType::F32, &[0.0; 3 * 100], &[3, 100]);
    let ids = |k: usize| Tensor::from_slice(&dev, &vec![0u32; 3 * k], &[3, k]).unwrap();
    let o = RouterWeightOptions::default();
    let weights_err = |logits: &Tensor, indices: &Tensor, o: RouterWeightOptions| {
        api::selected_router_weights(logits, indices, o).unwrap_err()
    };
    assert!(matches!(weights_err(&logits, &ids(65), o), OpError::InvalidArgument { .. }), "top_k above 64");
    let small = tensor(&dev, DType::F32, &[0.0; 3 * 4], &[3, 4]);
    assert!(matches!(weights_err(&small, &ids(5), o), OpError::InvalidArgument { .. }), "top_k above E");
    let float_ids = Tensor::from_slice(&dev, &[0f32; 6], &[3, 2]).unwrap();
    assert!(matches!(weights_err(&logits, &float_ids, o), OpError::DType { .. }), "float indices");
    let wrong_rows = Tensor::from_slice(&dev, &[0u32; 4], &[2, 2]).unwrap();
    assert!(matches!(weights_err(&logits, &wrong_rows, o), OpError::Shape { .. }), "indices rows");
    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let bad = RouterWeightOptions { scale, ..o };
        assert!(matches!(weights_err(&logits, &ids(2), bad), OpError::InvalidArgument { .. }), "scale {scale}");
    }
    let flat = tensor(&dev, DType::F32, &[0.0; 10], &[10]);
    assert!(matches!(weights_err(&flat, &ids(2), o), OpError::Shape { .. }), "1-D logits");
    let wide = tensor(&dev, DType::F32, &vec![0.0; 3 * 1025], &[3, 1025]);
    assert!(matches!(weights_err(&wide, &ids(2), o), OpError::Shape { .. }), "1025 experts");
    let int_logits = Tensor::from_slice(&dev, &[0u32; 300], &[3, 100]).unwrap();
    assert!(matches!(weights_err(&int_logits, &ids(2), o), OpError::DType { .. }), "integer logits");

    let g_f16 = tensor(&dev, DType::F16, &[0.0; 6], &[3, 2]);
    let e = api::selected_router_backward(&logits, &ids(2), &g_f16, o).unwrap_err();
    assert!(matches!(e, OpError::DType { .. }), "f16 grad_weights: {e}");
    let g_shape = Tensor::from_slice(&dev, &[0f32; 9], &[3, 3]).unwrap();
    let e = api::selected_router_backward(&logits, &ids(2), &g_shape, o).unwrap_err();
    assert!(matches!(e, OpError::Shape { .. }), "grad_weights shape: {e}");
    let stream = dev.default_stream();
    let g = Tensor::from_slice(&dev, &[0f32; 6], &[3, 2]).unwrap();
    let out_bf16 = tensor(&dev, DType::BF16, &[0.0; 300], &[3, 100]);
    let e = api::selected_router_backward_into(&stream, &logits, &ids(2), &g, &o, &out_bf16).unwrap_err();
    assert!(matches!(e, OpError::DType { .. }), "grad_logits dtype: {e}");
    let out_f16 = tensor(&dev, DType::F16, &[0.0; 6], &[3, 2]);
    let e = api::selected_router_weights_into(&stream, &logits, &ids(2), &o, &out_f16).unwrap_err();
    assert!(matches!(e, OpError::DType { .. }), "weights dtype: {e}");
    let plan = api::route(&logits, RoutingOptions { top_k: 2, renormalize: false }).unwrap();
    let e = plan.into_training(&small, o).unwrap_err();
    assert!(matches!(e, OpError::Shape { .. }), "other logits: {e}");
}
