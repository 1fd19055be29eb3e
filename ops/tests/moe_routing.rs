//! MoE routing against plain f64 references: softmax top-k (Hugging Face Qwen3-MoE: softmax
//! over all experts, top-k, optional `norm_topk_prob`) and grouped sigmoid top-k (DeepSeek-V3's
//! `noaux_tc`), awkward shapes, exact ties, NaN / `+inf` / all `-inf` rows, every dtype, and
//! every bad argument.
//!
//! Logits are drawn on a grid of sixteenths in `[-4, 4)` (exact in every dtype): equal logits
//! are exact ties (the lower id must win) and distinct ones differ by at least `1/16`, a clear
//! margin, so indices are compared exactly. Weights: within `4 ε` of the dtype relative (one
//! rounding to the dtype after `f32` arithmetic with an approximate `exp`), plus `1e-6`.

use crate::common::*;
use ruda_ops::api::{self, GroupRoutingOptions, OpError, RoutingOptions};
use ruda_runtime::{DType, Tensor};

/// Logits on the grid of sixteenths in `[-4, 4)`.
fn grid(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (rng.uniform(-4.0, 4.0) * 16.0).floor() / 16.0).collect()
}

/// A row the contract calls unusable: NaN or `+inf` anywhere, or only `-inf`.
fn bad_row(z: &[f32]) -> bool {
    z.iter().any(|v| v.is_nan() || *v == f32::INFINITY) || z.iter().all(|v| *v == f32::NEG_INFINITY)
}

/// The first `k` ids by `key` descending, ties to the lower id.
fn top(key: &[f64], k: usize, allowed: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..key.len()).filter(|&i| allowed(i)).collect();
    ids.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    ids.truncate(k);
    ids
}

/// One row of softmax routing: indices and weights.
fn route_reference(z: &[f32], k: usize, renormalize: bool) -> (Vec<u32>, Vec<f64>) {
    if bad_row(z) {
        return ((0..k as u32).collect(), vec![f64::NAN; k]);
    }
    let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let e: Vec<f64> = z.iter().map(|&v| (v as f64 - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|v| v / sum).collect();
    let ids = top(&p, k, |_| true);
    let kept: f64 = ids.iter().map(|&i| p[i]).sum();
    let w = ids.iter().map(|&i| if renormalize { p[i] / kept } else { p[i] }).collect();
    (ids.iter().map(|&i| i as u32).collect(), w)
}

/// One row of grouped sigmoid routing: indices and weights.
fn grouped_reference(z: &[f32], bias: Option<&[f32]>, o: &GroupRoutingOptions) -> (Vec<u32>, Vec<f64>) {
    let k = o.top_k;
    if bad_row(z) {
        return ((0..k as u32).collect(), vec![f64::NAN; k]);
    }
    let s: Vec<f64> = z.iter().map(|&v| 1.0 / (1.0 + (-(v as f64)).exp())).collect();
    let c: Vec<f64> = s.iter().enumerate().map(|(i, v)| v + bias.map_or(0.0, |b| b[i] as f64)).collect();
    let n = z.len() / o.groups;
    let group_score: Vec<f64> = c
        .chunks(n)
        .map(|g| {
            let mut sorted = g.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if o.group_top_two {
                sorted[0] + sorted[1]
            } else {
                sorted[0]
            }
        })
        .collect();
    let groups = top(&group_score, o.selected_groups, |_| true);
    let ids = top(&c, k, |i| groups.contains(&(i / n)));
    let kept: f64 = ids.iter().map(|&i| s[i]).sum();
    let w = ids.iter().map(|&i| if o.renormalize { s[i] / (kept + 1e-20) } else { s[i] } * o.scale as f64).collect();
    (ids.iter().map(|&i| i as u32).collect(), w)
}

fn weight_tolerance(dtype: DType) -> f64 {
    4.0 * epsilon(dtype).max(f32::EPSILON as f64 * 4.0)
}

/// Compare a plan with the per-row reference.
fn check(what: &str, plan: &api::RoutingPlan, dtype: DType, want: &[(Vec<u32>, Vec<f64>)]) {
    let k = plan.top_k();
    assert_eq!(plan.indices().shape(), &[want.len(), k], "{what}: indices shape");
    assert_eq!(plan.weights().shape(), &[want.len(), k], "{what}: weights shape");
    assert_eq!(plan.weights().dtype(), dtype, "{what}: weights dtype");
    let idx = plan.indices().to_vec::<u32>().unwrap();
    let w = plan.weights().to_f32_vec().unwrap();
    let want_idx: Vec<u32> = want.iter().flat_map(|r| r.0.clone()).collect();
    let want_w: Vec<f64> = want.iter().flat_map(|r| r.1.clone()).collect();
    assert_eq!(idx, want_idx, "{what}: indices");
    assert_close(&format!("{what}: weights"), &w, &want_w, 1e-6, weight_tolerance(dtype));
}

#[test]
fn softmax_routing_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(7);
    // (T, E, top_k): a single expert, two, Qwen1.5-MoE's 60, 64, Qwen3's 128, a 257 that
    // spills past a block's warps, top-1, top-E and top-8.
    let shapes = [(1, 1, 1), (7, 2, 1), (7, 2, 2), (33, 60, 8), (7, 64, 64), (33, 128, 8), (7, 257, 8), (1, 257, 257)];
    for dtype in FLOAT_DTYPES {
        for (t, e, k) in shapes {
            let z = grid(&mut rng, t * e);
            let logits = tensor(&dev, dtype, &z, &[t, e]);
            for renormalize in [false, true] {
                let what = format!("route {dtype} T={t} E={e} k={k} renormalize={renormalize}");
                let plan = api::route(&logits, RoutingOptions { top_k: k, renormalize }).unwrap();
                assert_eq!((plan.tokens(), plan.experts()), (t, e), "{what}");
                let want: Vec<_> = z.chunks(e).map(|row| route_reference(row, k, renormalize)).collect();
                check(&what, &plan, dtype, &want);
            }
        }
    }
}

#[test]
fn softmax_routing_of_continuous_logits() {
    // Off the grid: distinct f32 logits a hair apart still order as their f64 softmax.
    let dev = device();
    let (t, e, k) = (5, 96, 6);
    let z = Rng::new(8).vec(t * e, -3.0, 3.0);
    let plan =
        api::route(&tensor(&dev, DType::F32, &z, &[t, e]), RoutingOptions { top_k: k, renormalize: true }).unwrap();
    let want: Vec<_> = z.chunks(e).map(|row| route_reference(row, k, true)).collect();
    check("route f32 continuous", &plan, DType::F32, &want);
}

#[test]
fn routing_ties_favour_lower_ids() {
    let dev = device();
    let e = 40;
    let mut rows = vec![vec![0.5f32; e]]; // all equal: 0..k
    let mut r = vec![-1.0f32; e]; // a tie for the top between 3 and 39, then 5 and 17
    (r[39], r[3], r[17], r[5]) = (2.0, 2.0, 1.0, 1.0);
    rows.push(r);
    let flat: Vec<f32> = rows.concat();
    for dtype in FLOAT_DTYPES {
        let logits = tensor(&dev, dtype, &flat, &[2, e]);
        let plan = api::route(&logits, RoutingOptions { top_k: 5, renormalize: false }).unwrap();
        let idx = plan.indices().to_vec::<u32>().unwrap();
        assert_eq!(idx, [0, 1, 2, 3, 4, 3, 39, 5, 17, 0], "{dtype}");
        let w = plan.weights().to_f32_vec().unwrap();
        assert!(w[..5].iter().all(|&v| v == w[0]), "{dtype}: equal logits, equal weights {w:?}");
        let plan = api::route(&logits, RoutingOptions { top_k: 4, renormalize: true }).unwrap();
        let w = plan.weights().to_f32_vec().unwrap();
        assert_close(&format!("{dtype} renormalised ties"), &w[..4], &[0.25; 4], 0.0, weight_tolerance(dtype));
        // Grouped: equal scores everywhere pick group 0's experts, in id order.
        let o = GroupRoutingOptions {
            top_k: 3,
            groups: 4,
            selected_groups: 2,
            group_top_two: true,
            renormalize: false,
            scale: 1.0,
        };
        let plan = api::route_sigmoid_grouped(&logits, None, o).unwrap();
        let idx = plan.indices().to_vec::<u32>().unwrap();
        // Row 1: groups 0 (experts 3 and 5) and 3 (expert 39) score highest; 3 and 39 tie (3
        // first), then 5; 17's group 1 is not kept.
        assert_eq!(idx, [0, 1, 2, 3, 39, 5], "{dtype} grouped");
    }
}

#[test]
fn nan_infinite_and_all_negative_infinity_rows() {
    let dev = device();
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let e = 8;
    let mut flat = grid(&mut Rng::new(9), 6 * e);
    flat[e + 3] = nan; // row 1: a NaN
    flat[2 * e + 6] = inf; // row 2: +inf
    for v in &mut flat[3 * e..4 * e] {
        *v = -inf; // row 3: only -inf
    }
    flat[4 * e + 1] = -inf; // row 4: some -inf, a valid row
    flat[5 * e] = -inf; // row 5: the same, plus NaN and +inf together
    flat[5 * e + 2] = nan;
    flat[5 * e + 4] = inf;
    for dtype in FLOAT_DTYPES {
        let logits = tensor(&dev, dtype, &flat, &[6, e]);
        for renormalize in [false, true] {
            let plan = api::route(&logits, RoutingOptions { top_k: 3, renormalize }).unwrap();
            let want: Vec<_> = flat.chunks(e).map(|row| route_reference(row, 3, renormalize)).collect();
            check(&format!("route {dtype} specials renormalize={renormalize}"), &plan, dtype, &want);
        }
        let o = GroupRoutingOptions {
            top_k: 3,
            groups: 2,
            selected_groups: 1,
            group_top_two: false,
            renormalize: true,
            scale: 1.5,
        };
        let plan = api::route_sigmoid_grouped(&logits, None, o).unwrap();
        let want: Vec<_> = flat.chunks(e).map(|row| grouped_reference(row, None, &o)).collect();
        check(&format!("grouped {dtype} specials"), &plan, dtype, &want);
    }
    // A NaN bias spoils the rows' selection: NaN weights, indices 0..k.
    let mut bias = vec![0.0f32; e];
    bias[5] = nan;
    let bias = Tensor::from_slice(&dev, &bias, &[e]).unwrap();
    let o = GroupRoutingOptions {
        top_k: 2,
        groups: 1,
        selected_groups: 1,
        group_top_two: false,
        renormalize: false,
        scale: 1.0,
    };
    let logits = tensor(&dev, DType::F32, &flat[..e], &[1, e]);
    let plan = api::route_sigmoid_grouped(&logits, Some(&bias), o).unwrap();
    assert_eq!(plan.indices().to_vec::<u32>().unwrap(), [0, 1]);
    assert!(plan.weights().to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn grouped_sigmoid_routing_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(11);
    let base = GroupRoutingOptions {
        top_k: 8,
        groups: 8,
        selected_groups: 4,
        group_top_two: true,
        renormalize: true,
        scale: 2.5,
    };
    // (T, E, options): DeepSeek-V3's rules on 64 experts; one group; a group per expert;
    // every group kept; one group kept with top-k = its size; 60 experts in 5 groups of 12
    // (not warp multiples); 256 experts as DeepSeek-V3; 257 experts in one group; the maximum
    // top-k of 64.
    let cases: Vec<(usize, usize, GroupRoutingOptions)> = vec![
        (7, 64, base),
        (7, 64, GroupRoutingOptions { groups: 1, selected_groups: 1, ..base }),
        (7, 64, GroupRoutingOptions { groups: 64, selected_groups: 5, group_top_two: false, top_k: 5, ..base }),
        (7, 64, GroupRoutingOptions { selected_groups: 8, group_top_two: false, renormalize: false, ..base }),
        (33, 64, GroupRoutingOptions { selected_groups: 1, top_k: 8, scale: 1.0, ..base }),
        (7, 60, GroupRoutingOptions { groups: 5, selected_groups: 2, top_k: 7, ..base }),
        (1, 256, base),
        (1, 257, GroupRoutingOptions { groups: 1, selected_groups: 1, top_k: 64, ..base }),
        (1, 2, GroupRoutingOptions { groups: 1, selected_groups: 1, top_k: 1, ..base }),
    ];
    for dtype in FLOAT_DTYPES {
        for (t, e, o) in &cases {
            let (t, e) = (*t, *e);
            let z = grid(&mut rng, t * e);
            let logits = tensor(&dev, dtype, &z, &[t, e]);
            // A bias on the grid of 1/32 in [-0.5, 0.5): large enough to change selections.
            let b: Vec<f32> = (0..e).map(|_| (rng.uniform(-0.5, 0.5) * 32.0).floor() / 32.0).collect();
            let bias = Tensor::from_slice(&dev, &b, &[e]).unwrap();
            for with_bias in [false, true] {
                let what = format!("grouped {dtype} T={t} E={e} {o:?} bias={with_bias}");
                let bias_t = with_bias.then_some(&bias);
                let plan = api::route_sigmoid_grouped(&logits, bias_t, *o).unwrap();
                let want: Vec<_> =
                    z.chunks(e).map(|row| grouped_reference(row, with_bias.then_some(&b[..]), o)).collect();
                check(&what, &plan, dtype, &want);
            }
        }
    }
}

#[test]
fn into_forms_write_preallocated_outputs() {
    let dev = device();
    let stream = dev.default_stream();
    let (t, e, k) = (7, 33, 4);
    let z = grid(&mut Rng::new(12), t * e);
    for dtype in FLOAT_DTYPES {
        let logits = tensor(&dev, dtype, &z, &[t, e]);
        let indices = Tensor::empty(&dev, DType::U32, &[t, k]).unwrap();
        let weights = Tensor::empty(&dev, dtype, &[t, k]).unwrap();
        let o = RoutingOptions { top_k: k, renormalize: true };
        api::route_into(&stream, &logits, &o, &indices, &weights).unwrap();
        let plan = api::route(&logits, o).unwrap();
        assert_eq!(indices.to_vec::<u32>().unwrap(), plan.indices().to_vec::<u32>().unwrap(), "{dtype}");
        assert_eq!(weights.to_bytes().unwrap(), plan.weights().to_bytes().unwrap(), "{dtype}");
        let g = GroupRoutingOptions {
            top_k: k,
            groups: 3,
            selected_groups: 2,
            group_top_two: true,
            renormalize: false,
            scale: 1.0,
        };
        api::route_sigmoid_grouped_into(&stream, &logits, None, &g, &indices, &weights).unwrap();
        let (gi, gw) = api::route_sigmoid_grouped(&logits, None, g).unwrap().into_tensors();
        assert_eq!(indices.to_vec::<u32>().unwrap(), gi.to_vec::<u32>().unwrap(), "{dtype} grouped");
        assert_eq!(weights.to_bytes().unwrap(), gw.to_bytes().unwrap(), "{dtype} grouped");
    }
}

fn invalid(r: Result<api::RoutingPlan, OpError>, field: &str) {
    match r {
        Err(e) => assert!(e.to_string().contains(field), "error `{e}` does not name `{field}`"),
        Ok(_) => panic!("accepted; expected an error naming `{field}`"),
    }
}

#[test]
fn bad_arguments_are_errors() {
    let dev = device();
    let stream = dev.default_stream();
    let z = grid(&mut Rng::new(13), 2 * 16);
    let logits = tensor(&dev, DType::F32, &z, &[2, 16]);
    let o = RoutingOptions { top_k: 2, renormalize: false };
    // dtype, rank, emptiness, the expert limit.
    invalid(api::route(&Tensor::from_slice(&dev, &[1u32; 4], &[2, 2]).unwrap(), o), "u32");
    invalid(api::route(&tensor(&dev, DType::F32, &z, &[2, 4, 4]), o), "logits");
    invalid(api::route(&Tensor::empty(&dev, DType::F32, &[0, 16]).unwrap(), o), "logits");
    invalid(api::route(&Tensor::empty(&dev, DType::F32, &[1, 1025]).unwrap(), o), "1024");
    // top_k 0 and > E.
    invalid(api::route(&logits, RoutingOptions { top_k: 0, renormalize: false }), "top_k");
    invalid(api::route(&logits, RoutingOptions { top_k: 17, renormalize: true }), "top_k");
    // Outputs of the wrong shape or dtype.
    let idx = Tensor::empty(&dev, DType::U32, &[2, 2]).unwrap();
    let w = Tensor::empty(&dev, DType::F32, &[2, 2]).unwrap();
    let bad_idx = Tensor::empty(&dev, DType::F32, &[2, 2]).unwrap();
    let bad_w = Tensor::empty(&dev, DType::BF16, &[2, 2]).unwrap();
    let short = Tensor::empty(&dev, DType::U32, &[2, 3]).unwrap();
    assert!(api::route_into(&stream, &logits, &o, &idx, &w).is_ok());
    for (i, wt, field) in [(&bad_idx, &w, "indices"), (&idx, &bad_w, "weights"), (&short, &w, "indices")] {
        let e = api::route_into(&stream, &logits, &o, i, wt).unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }

    let g = GroupRoutingOptions {
        top_k: 4,
        groups: 4,
        selected_groups: 2,
        group_top_two: true,
        renormalize: true,
        scale: 1.0,
    };
    assert!(api::route_sigmoid_grouped(&logits, None, g).is_ok());
    let bad = [
        (GroupRoutingOptions { top_k: 0, ..g }, "top_k"),
        (GroupRoutingOptions { top_k: 9, ..g }, "top_k"), // more than 2 groups of 4
        (GroupRoutingOptions { groups: 0, ..g }, "groups"),
        (GroupRoutingOptions { groups: 3, ..g }, "groups"), // does not divide 16
        (GroupRoutingOptions { groups: 256, ..g }, "groups"),
        (GroupRoutingOptions { selected_groups: 0, ..g }, "selected_groups"),
        (GroupRoutingOptions { selected_groups: 5, ..g }, "selected_groups"),
        (GroupRoutingOptions { groups: 16, selected_groups: 4, ..g }, "group_top_two"), // 1 per group
        (GroupRoutingOptions { scale: f32::NAN, ..g }, "scale"),
        (GroupRoutingOptions { scale: 0.0, ..g }, "scale"),
        (GroupRoutingOptions { scale: -1.0, ..g }, "scale"),
        (GroupRoutingOptions { scale: f32::INFINITY, ..g }, "scale"),
    ];
    for (o, field) in bad {
        invalid(api::route_sigmoid_grouped(&logits, None, o), field);
    }
    // top_k above 64 even when the groups hold more experts.
    let wide = tensor(&dev, DType::F32, &grid(&mut Rng::new(14), 128), &[1, 128]);
    invalid(
        api::route_sigmoid_grouped(&wide, None, GroupRoutingOptions { top_k: 65, groups: 1, selected_groups: 1, ..g }),
        "top_k",
    );
    // The bias: wrong shape, wrong dtype.
    let short_bias = Tensor::from_slice(&dev, &[0.0f32; 15], &[15]).unwrap();
    let half_bias = tensor(&dev, DType::BF16, &[0.0; 16], &[16]);
    invalid(api::route_sigmoid_grouped(&logits, Some(&short_bias), g), "bias");
    invalid(api::route_sigmoid_grouped(&logits, Some(&half_bias), g), "bias");
    invalid(api::route_sigmoid_grouped(&Tensor::empty(&dev, DType::F16, &[1, 2048]).unwrap(), None, g), "1024");
}
