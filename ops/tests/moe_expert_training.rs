//! The experts' first-order training chain against f64 central finite differences: the loss
//! `L = Σ grad_output ⊙ combine(experts(dispatch(x)))`, computed by a plain f64 forward, is
//! differentiated numerically with respect to the input, the routing weights and every expert
//! weight, and compared with `combine_backward` → `cache.backward` → `dispatch_backward`, at
//! awkward shapes (idle experts, an expert repeated within a token, one expert holding most
//! rows, more rows than a tile, sizes not multiples of anything), split and fused experts,
//! every float dtype and every strategy (the tensor-core backward across block tiles of both
//! sizes); plus every error.
//!
//! Tolerance: the device rounds the gate/up products, the activation and the expert output to
//! the dtype (each after `f32` sums) and the data gradients once more; the f64 reference rounds
//! nothing. Each gradient is compared with an absolute bound of a few units of the dtype's
//! epsilon times the tensor's largest gradient (plus `f32` accumulation), which a wrong row,
//! expert, slot or derivative term exceeds by orders of magnitude.

use crate::common::*;
use ruda_ops::api::{CombineGradientStrategy, GroupedStrategy, OpError, RoutingPlan, SwiGluExperts};
use ruda_runtime::{DType, Device, Tensor};

/// One problem on the host, every value already rounded to the dtype.
struct Problem {
    t: usize,
    e: usize,
    k: usize,
    h: usize,
    i: usize,
    ids: Vec<u32>,
    x: Vec<f32>,
    w: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    gout: Vec<f32>,
}

/// The parameters the loss depends on, in f64.
#[derive(Clone)]
struct Params {
    x: Vec<f64>,
    w: Vec<f64>,
    gate: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
}

/// Which parameter tensor a finite difference perturbs.
type Field = fn(&mut Params) -> &mut Vec<f64>;

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

impl Problem {
    fn new(dtype: DType, (t, e, k, h, i): (usize, usize, usize, usize, usize), ids: Vec<u32>, seed: u64) -> Problem {
        assert_eq!(ids.len(), t * k);
        let mut rng = Rng::new(seed);
        let mut q = |n: usize, lo: f32, hi: f32| quantize(dtype, &rng.vec(n, lo, hi));
        let sg = 2.0 / (h as f32).sqrt();
        let sd = 2.0 / (i as f32).sqrt();
        Problem {
            t,
            e,
            k,
            h,
            i,
            ids,
            x: q(t * h, -1.0, 1.0),
            w: q(t * k, 0.1, 1.0),
            gate: q(e * i * h, -sg, sg),
            up: q(e * i * h, -sg, sg),
            down: q(e * h * i, -sd, sd),
            gout: q(t * h, -1.0, 1.0),
        }
    }

    fn params(&self) -> Params {
        Params {
            x: f64s(&self.x),
            w: f64s(&self.w),
            gate: f64s(&self.gate),
            up: f64s(&self.up),
            down: f64s(&self.down),
        }
    }

    /// `Σ grad_output ⊙ combine(experts(dispatch(x)))` in f64.
    fn loss(&self, p: &Params) -> f64 {
        let (h, i) = (self.h, self.i);
        let mut total = 0.0;
        for tok in 0..self.t {
            let x = &p.x[tok * h..(tok + 1) * h];
            for s in 0..self.k {
                let e = self.ids[tok * self.k + s] as usize;
                let act: Vec<f64> = (0..i)
                    .map(|j| {
                        let row = (e * i + j) * h;
                        let g: f64 = (0..h).map(|c| p.gate[row + c] * x[c]).sum();
                        let u: f64 = (0..h).map(|c| p.up[row + c] * x[c]).sum();
                        g / (1.0 + (-g).exp()) * u
                    })
                    .collect();
                let ws = p.w[tok * self.k + s];
                for o in 0..h {
                    let y: f64 = (0..i).map(|j| p.down[(e * h + o) * i + j] * act[j]).sum();
                    total += self.gout[tok * h + o] as f64 * ws * y;
                }
            }
        }
        total
    }

    /// `∂L/∂field[j]` by central differences for the sampled `js`.
    fn numeric(&self, field: Field, js: &[usize]) -> Vec<f64> {
        let base = self.params();
        js.iter()
            .map(|&j| {
                let step = 1e-5;
                let (mut a, mut b) = (base.clone(), base.clone());
                field(&mut a)[j] += step;
                field(&mut b)[j] -= step;
                (self.loss(&a) - self.loss(&b)) / (2.0 * step)
            })
            .collect()
    }

    fn experts(&self, dev: &Device, dtype: DType, fused: bool) -> SwiGluExperts {
        let (e, h, i) = (self.e, self.h, self.i);
        let down = tensor(dev, dtype, &self.down, &[e, h, i]);
        if fused {
            let mut gu = Vec::with_capacity(2 * e * i * h);
            for x in 0..e {
                gu.extend_from_slice(&self.gate[x * i * h..(x + 1) * i * h]);
                gu.extend_from_slice(&self.up[x * i * h..(x + 1) * i * h]);
            }
            SwiGluExperts::from_fused(tensor(dev, dtype, &gu, &[e, 2 * i, h]), down).unwrap()
        } else {
            let gate = tensor(dev, dtype, &self.gate, &[e, i, h]);
            let up = tensor(dev, dtype, &self.up, &[e, i, h]);
            SwiGluExperts::new(gate, up, down).unwrap()
        }
    }

    fn plan(&self, dev: &Device, dtype: DType) -> RoutingPlan {
        let indices = Tensor::from_slice(dev, &self.ids, &[self.t, self.k]).unwrap();
        RoutingPlan::from_selection(indices, tensor(dev, dtype, &self.w, &[self.t, self.k]), self.e).unwrap()
    }
}

/// Up to `most` indices of `0..n`, spread evenly (all of them when `n <= most`).
fn sample(n: usize, most: usize) -> Vec<usize> {
    if n <= most {
        (0..n).collect()
    } else {
        (0..most).map(|j| j * (n - 1) / (most - 1)).collect()
    }
}

/// Compare `got` (the whole tensor) with finite differences at the sampled indices.
fn compare(label: &str, dtype: DType, got: &[f32], want: &[f64], js: &[usize]) {
    let largest = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let picked: Vec<f32> = js.iter().map(|&j| got[j]).collect();
    let units = 2.0 * epsilon(dtype) + 1e-5;
    assert_close(label, &picked, want, units * largest.max(1e-3), units);
}

#[allow(clippy::too_many_arguments)]
fn check(
    dev: &Device,
    what: &str,
    dtype: DType,
    p: &Problem,
    fused: bool,
    forward: GroupedStrategy,
    combine: CombineGradientStrategy,
    backward: GroupedStrategy,
) {
    let label = format!("{what} {dtype} fused={fused} {forward:?}/{combine:?}/{backward:?}");
    let experts = p.experts(dev, dtype, fused);
    let plan = p.plan(dev, dtype);
    let x = tensor(dev, dtype, &p.x, &[p.t, p.h]);
    let gout = tensor(dev, dtype, &p.gout, &[p.t, p.h]);
    let dispatched = plan.dispatch(&x).unwrap();
    let (y, cache) = experts.forward_dispatched_training(&dispatched, forward).unwrap();
    assert_eq!((y.dtype(), y.shape()), (dtype, &[p.t * p.k, p.h][..]), "{label}");
    let (dexpert, dweights) = dispatched.combine_backward_with_strategy(&y, &gout, combine).unwrap();
    assert_eq!((dexpert.dtype(), dexpert.shape()), (dtype, &[p.t * p.k, p.h][..]), "{label}");
    assert_eq!((dweights.dtype(), dweights.shape()), (DType::F32, &[p.t, p.k][..]), "{label}");
    let grads = cache.backward_with_strategy(&dexpert, backward).unwrap();
    assert_eq!((grads.input.dtype(), grads.input.shape()), (dtype, &[p.t * p.k, p.h][..]), "{label}");
    for (t, shape) in [(&grads.gate, [p.e, p.i, p.h]), (&grads.up, [p.e, p.i, p.h]), (&grads.down, [p.e, p.h, p.i])] {
        assert_eq!((t.dtype(), t.shape()), (DType::F32, &shape[..]), "{label}");
    }
    let dx = dispatched.dispatch_backward(&grads.input).unwrap();
    assert_eq!((dx.dtype(), dx.shape()), (dtype, &[p.t, p.h][..]), "{label}");

    let most = 48;
    let cases: [(&str, &Tensor, Field, usize); 5] = [
        ("input", &dx, |q| &mut q.x, p.x.len()),
        ("weights", &dweights, |q| &mut q.w, p.w.len()),
        ("gate", &grads.gate, |q| &mut q.gate, p.gate.len()),
        ("up", &grads.up, |q| &mut q.up, p.up.len()),
        ("down", &grads.down, |q| &mut q.down, p.down.len()),
    ];
    for (name, got, field, n) in cases {
        let js = sample(n, most);
        let want = p.numeric(field, &js);
        compare(&format!("{label}: d{name}"), dtype, &got.to_f32_vec().unwrap(), &want, &js);
    }
}

#[test]
fn expert_training_chain_matches_f64_finite_differences() {
    let dev = device();
    // 5 tokens, 4 experts, top-2, H = 6, I = 4: expert 3 idle, token 0 sends both slots to
    // expert 1, expert 0 takes most rows.
    let ids = vec![1, 1, 0, 2, 0, 1, 2, 0, 0, 1];
    for dtype in FLOAT_DTYPES {
        let p = Problem::new(dtype, (5, 4, 2, 6, 4), ids.clone(), 11);
        for fused in [false, true] {
            for combine in [CombineGradientStrategy::Serial, CombineGradientStrategy::Plane] {
                for backward in [GroupedStrategy::Scalar, GroupedStrategy::Auto] {
                    check(&dev, "small", dtype, &p, fused, GroupedStrategy::Scalar, combine, backward);
                }
            }
        }
    }
}

#[test]
fn expert_training_chain_at_tile_spanning_shapes() {
    let dev = device();
    // 70 tokens top-2 over 5 experts (140 rows: more than a 64-row tile, not a multiple of
    // one), expert 2 idle, H = 40 (past a warp: Plane lanes loop), I = 24 (multiples of 8 for
    // the tensor-core forward, not of 16).
    let ids: Vec<u32> = (0..140u32).map(|j| [0, 1, 3, 4][((7 * j + j / 5) % 4) as usize]).collect();
    for dtype in FLOAT_DTYPES {
        let p = Problem::new(dtype, (70, 5, 2, 40, 24), ids.clone(), 23);
        let forwards: &[GroupedStrategy] = if dtype == DType::F32 {
            &[GroupedStrategy::Scalar]
        } else {
            &[GroupedStrategy::Scalar, GroupedStrategy::TensorCore]
        };
        for &forward in forwards {
            check(&dev, "rows", dtype, &p, true, forward, CombineGradientStrategy::Plane, GroupedStrategy::Scalar);
        }
        if dtype != DType::F32 {
            for fused in [false, true] {
                let (forward, combine, backward) =
                    (GroupedStrategy::TensorCore, CombineGradientStrategy::Serial, GroupedStrategy::TensorCore);
                check(&dev, "rows", dtype, &p, fused, forward, combine, backward);
            }
        }
        check(
            &dev,
            "rows",
            dtype,
            &p,
            false,
            GroupedStrategy::Auto,
            CombineGradientStrategy::Serial,
            GroupedStrategy::Auto,
        );
    }
}

#[test]
fn tensor_core_backward_across_block_tiles() {
    let dev = device();
    // 48 tokens top-2 over 4 experts (96 rows): expert 0 takes 70 (two row tiles), expert 3 is
    // idle. H = 136, I = 72: two and three column blocks of the 64 × 64 tile, the last of 8;
    // the rows' gradient runs `k` = 2I = 144 with split gate and up meeting inside a k-tile.
    // Then 12 tokens on 3 experts at H = I = 136, where the weight gradients take the 128 × 128
    // tile.
    let many: Vec<u32> = (0..96u32).map(|j| if j % 4 == 3 || j < 35 { 0 } else { 1 + (j % 2) }).collect();
    let few: Vec<u32> = (0..24u32).map(|j| (j * 5 + j / 7) % 3).collect();
    for (shape, ids, seed) in [((48, 4, 2, 136, 72), many, 5), ((12, 3, 2, 136, 136), few, 9)] {
        for dtype in [DType::F16, DType::BF16] {
            let p = Problem::new(dtype, shape, ids.clone(), seed);
            for fused in [false, true] {
                let backward = GroupedStrategy::TensorCore;
                check(&dev, "tiles", dtype, &p, fused, backward, CombineGradientStrategy::Plane, backward);
            }
        }
    }
}

#[test]
fn expert_training_rejects_bad_arguments() {
    let dev = device();
    let ids = vec![1, 1, 0, 2, 0, 1, 2, 0, 0, 1];
    for dtype in FLOAT_DTYPES {
        let p = Problem::new(dtype, (5, 4, 2, 8, 8), ids.clone(), 3);
        let experts = p.experts(&dev, dtype, false);
        let plan = p.plan(&dev, dtype);
        let x = tensor(&dev, dtype, &p.x, &[p.t, p.h]);
        let gout = tensor(&dev, dtype, &p.gout, &[p.t, p.h]);
        let d = plan.dispatch(&x).unwrap();
        let (y, cache) = experts.forward_dispatched_training(&d, GroupedStrategy::Scalar).unwrap();
        let other = if dtype == DType::F32 { DType::F16 } else { DType::F32 };
        let wrong_dtype = Tensor::zeros(&dev, other, &[p.t, p.h]).unwrap();
        let short = Tensor::zeros(&dev, dtype, &[p.t - 1, p.h]).unwrap();
        let shape =
            |r: Result<_, OpError>| assert!(matches!(r, Err(OpError::Shape { .. })), "{dtype}: want a shape error");
        let kind =
            |r: Result<_, OpError>| assert!(matches!(r, Err(OpError::DType { .. })), "{dtype}: want a dtype error");
        shape(d.combine_backward(&y, &short).map(|_| ()));
        shape(d.combine_backward(&short, &gout).map(|_| ()));
        kind(d.combine_backward(&y, &wrong_dtype).map(|_| ()));
        shape(d.dispatch_backward(&short).map(|_| ()));
        let wrong_rows = Tensor::zeros(&dev, other, &[p.t * p.k, p.h]).unwrap();
        kind(d.dispatch_backward(&wrong_rows).map(|_| ()));
        shape(cache.backward(&short).map(|_| ()));
        kind(cache.backward(&wrong_rows).map(|_| ()));
        let (dexpert, _) = d.combine_backward(&y, &gout).unwrap();
        let scalar = cache.backward(&dexpert).unwrap();
        let tensor_cores = cache.backward_with_strategy(&dexpert, GroupedStrategy::TensorCore);
        if dtype == DType::F32 {
            assert!(matches!(tensor_cores, Err(OpError::DType { .. })), "{dtype}: {tensor_cores:?}");
        } else {
            // H = I = 8 fit the tensor cores: the same gradients (one more rounding of the
            // pre-activations' gradient to the dtype).
            let got = tensor_cores.unwrap();
            for (name, a, b) in [
                ("input", &got.input, &scalar.input),
                ("gate", &got.gate, &scalar.gate),
                ("up", &got.up, &scalar.up),
                ("down", &got.down, &scalar.down),
            ] {
                let want: Vec<f64> = b.to_f32_vec().unwrap().iter().map(|&v| v as f64).collect();
                let largest = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let units = 2.0 * epsilon(dtype);
                assert_close(&format!("{dtype} {name}"), &a.to_f32_vec().unwrap(), &want, units * largest, units);
            }
            // A `grad_out` starting 2 bytes into its buffer: TensorCore names it, Auto runs Scalar.
            let flat = dexpert.to_f32_vec().unwrap();
            let padded = tensor(&dev, dtype, &[vec![0.0], flat.clone()].concat(), &[flat.len() + 1]);
            let shifted = padded.narrow(0, 1, flat.len()).unwrap().reshape(&[p.t * p.k, p.h]).unwrap();
            match cache.backward_with_strategy(&shifted, GroupedStrategy::TensorCore) {
                Err(OpError::InvalidArgument { message, .. }) => assert!(message.contains("grad_out"), "{message}"),
                other => panic!("{dtype}: a misaligned grad_out gave {other:?}"),
            }
            let auto = cache.backward_with_strategy(&shifted, GroupedStrategy::Auto).unwrap();
            assert_eq!(auto.down.to_f32_vec().unwrap(), scalar.down.to_f32_vec().unwrap(), "{dtype}");
        }
        // Sizes that are not multiples of 8: TensorCore says so, Auto runs Scalar.
        let odd = Problem::new(dtype, (5, 4, 2, 6, 4), ids.clone(), 3);
        let d = odd.plan(&dev, dtype).dispatch(&tensor(&dev, dtype, &odd.x, &[odd.t, odd.h])).unwrap();
        let (y, cache) = odd.experts(&dev, dtype, true).forward_dispatched_training(&d, GroupedStrategy::Auto).unwrap();
        let (dexpert, _) = d.combine_backward(&y, &tensor(&dev, dtype, &odd.gout, &[odd.t, odd.h])).unwrap();
        match cache.backward_with_strategy(&dexpert, GroupedStrategy::TensorCore) {
            Err(OpError::DType { .. }) if dtype == DType::F32 => {}
            Err(OpError::InvalidArgument { message, .. }) if dtype != DType::F32 => {
                assert!(message.contains("multiples of 8"), "{message}")
            }
            other => panic!("{dtype}: TensorCore backward at H = 6 gave {other:?}"),
        }
        cache.backward_with_strategy(&dexpert, GroupedStrategy::Auto).unwrap();
        // A selection of the wrong shape or dtype is refused when the plan is made.
        let idx = Tensor::from_slice(&dev, &ids, &[5, 2]).unwrap();
        let w = tensor(&dev, dtype, &p.w, &[5, 2]);
        let w_short = tensor(&dev, dtype, &p.w[..8], &[4, 2]);
        shape(RoutingPlan::from_selection(idx.clone(), w_short, 4).map(|_| ()));
        assert!(matches!(RoutingPlan::from_selection(idx.clone(), w.clone(), 1), Err(OpError::InvalidArgument { .. })));
        kind(RoutingPlan::from_selection(w.clone(), w, 4).map(|_| ()));
    }
}
