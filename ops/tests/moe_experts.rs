//! MoE dispatch, SwiGLU experts and combine: dispatch against a host counting sort (exact:
//! rows, offsets, both maps), combine round trips in token order, the experts against an f64
//! reference for every strategy and dtype at awkward shapes (T not a multiple of a tile,
//! experts without tokens, one expert holding every token, top_k = E, H and I multiples of 8
//! but not 16, and for the SIMT path not even of 8), the staged chain against the one-call
//! forms, and every error. The decode path (no dispatch, GEMVs over the routing slots) against
//! the same reference at every token tile, vector and scalar loads, split and fused weights,
//! experts shared across tokens and repeated or out-of-range ids; the interpreter's load
//! counters show each selected expert read once per step. The tensor-core tiles: every tile
//! the tuner may pick gives the heuristic's bits, and the tuner picks with injected timings.
//!
//! Expert tolerance: the reference is exact (f64, no intermediate rounding); the device
//! rounds the gate/up products, the activation, the down product and the combine to the
//! dtype, each after `f32` accumulation. The bound propagates one rounding of each stage
//! through the chain by magnitudes (the sensitivity of `silu(g) · u` to `g` and `u`, then
//! `|W_down|` and `|w|`), three units of the dtype's epsilon, plus `f32` accumulation over
//! `H + I` terms. A wrong row, expert or weight is off by the size of the output itself.

use crate::common::*;
use ruda_ir::interp::{run_profiled, KernelArg, LaunchConfig};
use ruda_ir::Constant;
use ruda_ops::api::{
    self, DispatchedTokens, ExpertsDecodeWorkspace, ExpertsWorkspace, GroupRoutingOptions, GroupedStrategy, OpError,
    RoutingOptions, RoutingPlan, SwiGluExperts, EXPERTS_DECODE_MAX_TOKENS,
};
use ruda_ops::kernels::gemm_tc::TcTile;
use ruda_ops::kernels::gemv::GemvLoads;
use ruda_ops::moe::decode::{moe_decode, DecodeConfig, DecodeProjection};
use ruda_ops::moe::grouped::GROUPED_TC_TILES;
use ruda_ops::tune::flow::Candidates;
use ruda_ops::tune::{experts_key, tune_experts_shape, tune_experts_with, ExpertTileChoice};
use ruda_runtime::{AutotuneMode, Autotuner, DType, Device, Tensor};

/// Logits on the grid of sixteenths (exact in every dtype), with experts `cold` pushed far
/// down so no token picks them (given `top_k ≤ E - cold.len()`).
fn logits(rng: &mut Rng, t: usize, e: usize, cold: &[usize]) -> Vec<f32> {
    let mut z: Vec<f32> = (0..t * e).map(|_| (rng.uniform(-2.0, 2.0) * 16.0).floor() / 16.0).collect();
    for row in z.chunks_mut(e) {
        for &c in cold {
            row[c] = -30.0;
        }
    }
    z
}

/// Host weights of one shape: `[E, I, H]` gate and up, `[E, H, I]` down, scaled to keep
/// activations near 1.
struct Weights {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    e: usize,
    h: usize,
    i: usize,
}

impl Weights {
    fn new(rng: &mut Rng, dtype: DType, e: usize, h: usize, i: usize) -> Weights {
        let scaled = |rng: &mut Rng, n: usize, fan_in: usize| {
            let s = 2.0 / (fan_in as f32).sqrt();
            quantize(dtype, &rng.vec(n, -s, s))
        };
        Weights {
            gate: scaled(rng, e * i * h, h),
            up: scaled(rng, e * i * h, h),
            down: scaled(rng, e * h * i, i),
            e,
            h,
            i,
        }
    }

    fn experts(&self, dev: &Device, dtype: DType) -> SwiGluExperts {
        let (e, h, i) = (self.e, self.h, self.i);
        SwiGluExperts::new(
            tensor(dev, dtype, &self.gate, &[e, i, h]),
            tensor(dev, dtype, &self.up, &[e, i, h]),
            tensor(dev, dtype, &self.down, &[e, h, i]),
        )
        .unwrap()
    }

    /// The same experts from a fused `[E, 2I, H]` gate_up.
    fn fused(&self, dev: &Device, dtype: DType) -> SwiGluExperts {
        let (e, h, i) = (self.e, self.h, self.i);
        let mut gu = Vec::with_capacity(2 * e * i * h);
        for x in 0..e {
            gu.extend_from_slice(&self.gate[x * i * h..(x + 1) * i * h]);
            gu.extend_from_slice(&self.up[x * i * h..(x + 1) * i * h]);
        }
        SwiGluExperts::from_fused(tensor(dev, dtype, &gu, &[e, 2 * i, h]), tensor(dev, dtype, &self.down, &[e, h, i]))
            .unwrap()
    }

    /// Expert `x` on row `v`: the output and its error magnitude (see the module docs).
    fn expert(&self, x: usize, v: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (h, i) = (self.h, self.i);
        let dot = |w: &[f32], row: usize, len: usize, a: &dyn Fn(usize) -> f64| {
            let r = &w[row * len..(row + 1) * len];
            let s: f64 = (0..len).map(|p| r[p] as f64 * a(p)).sum();
            let m: f64 = (0..len).map(|p| (r[p] as f64 * a(p)).abs()).sum();
            (s, m)
        };
        let gate = &self.gate[x * i * h..(x + 1) * i * h];
        let up = &self.up[x * i * h..(x + 1) * i * h];
        let down = &self.down[x * h * i..(x + 1) * h * i];
        let xv = |p: usize| v[p] as f64;
        let mut act = vec![0f64; i];
        let mut sens = vec![0f64; i];
        for j in 0..i {
            let (g, gm) = dot(gate, j, h, &xv);
            let (u, um) = dot(up, j, h, &xv);
            let sg = g / (1.0 + (-g).exp());
            act[j] = sg * u;
            sens[j] = 1.1 * gm * u.abs() + sg.abs() * um + act[j].abs();
        }
        let mut y = vec![0f64; h];
        let mut mag = vec![0f64; h];
        for o in 0..h {
            y[o] = dot(down, o, i, &|j| act[j]).0;
            mag[o] = dot(down, o, i, &|j| sens[j]).1 + y[o].abs();
        }
        (y, mag)
    }
}

/// The host reference of the whole block for a plan read back from the device: `[T, H]`
/// outputs and magnitudes.
fn reference(w: &Weights, input: &[f32], idx: &[u32], weights: &[f32], k: usize) -> (Vec<f64>, Vec<f64>) {
    let h = w.h;
    let t = input.len() / h;
    let mut out = vec![0f64; t * h];
    let mut mag = vec![0f64; t * h];
    for tok in 0..t {
        for s in 0..k {
            let (y, m) = w.expert(idx[tok * k + s] as usize, &input[tok * h..(tok + 1) * h]);
            let ws = weights[tok * k + s] as f64;
            for o in 0..h {
                out[tok * h + o] += ws * y[o];
                mag[tok * h + o] += ws.abs() * m[o];
            }
        }
    }
    for (m, o) in mag.iter_mut().zip(&out) {
        *m += o.abs();
    }
    (out, mag)
}

/// One expert case: (T, E, top_k, H, I, experts without tokens, the expert every token picks).
type ExpertCase = (usize, usize, usize, usize, usize, &'static [usize], Option<usize>);

fn check_block(what: &str, dtype: DType, got: &[f32], want: &[f64], mag: &[f64], terms: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rel = 3.0 * epsilon(dtype) + terms as f64 * f32::EPSILON as f64;
    for (n, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        let tol = rel * m + 1e-6;
        let err = (*g as f64 - w).abs();
        assert!(err <= tol, "{what}[{n}]: got {g}, want {w} (error {err:.3e} > {tol:.3e})");
    }
}

/// The stable counting sort the dispatch must equal: per expert, entries in flat order.
fn host_dispatch(idx: &[u32], e: usize) -> (Vec<u32>, Vec<u32>) {
    let mut row_slots = Vec::with_capacity(idx.len());
    let mut offsets = vec![0u32];
    for x in 0..e as u32 {
        row_slots.extend((0..idx.len() as u32).filter(|&i| idx[i as usize] == x));
        offsets.push(row_slots.len() as u32);
    }
    (row_slots, offsets)
}

fn plan_of(dev: &Device, dtype: DType, z: &[f32], t: usize, e: usize, k: usize, renormalize: bool) -> RoutingPlan {
    api::route(&tensor(dev, dtype, z, &[t, e]), RoutingOptions { top_k: k, renormalize }).unwrap()
}

#[test]
fn dispatch_groups_rows_by_expert_in_token_order() {
    let dev = device();
    let mut rng = Rng::new(21);
    // (T, E, top_k, H, cold experts): four chunks with the last partial; top_k = E; one
    // token; a hidden size above the block; experts 2 and 5 without tokens.
    let cases: [(usize, usize, usize, usize, &[usize]); 4] =
        [(300, 7, 3, 40, &[]), (9, 4, 4, 17, &[]), (1, 3, 2, 300, &[]), (65, 8, 2, 24, &[2, 5])];
    for dtype in FLOAT_DTYPES {
        for (t, e, k, h, cold) in cases {
            let what = format!("{dtype} T={t} E={e} k={k} H={h}");
            let z = logits(&mut rng, t, e, cold);
            let plan = plan_of(&dev, dtype, &z, t, e, k, false);
            let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
            let d = plan.dispatch(&tensor(&dev, dtype, &x, &[t, h])).unwrap();
            assert_eq!((d.tokens(), d.top_k(), d.experts(), d.hidden(), d.len()), (t, k, e, h, t * k), "{what}");
            let idx = plan.indices().to_vec::<u32>().unwrap();
            let (row_slots, offsets) = host_dispatch(&idx, e);
            assert_eq!(d.offsets().to_vec::<u32>().unwrap(), offsets, "{what}: offsets");
            assert_eq!(d.row_slots().to_vec::<u32>().unwrap(), row_slots, "{what}: row_slots");
            for &c in cold {
                assert_eq!(offsets[c], offsets[c + 1], "{what}: cold expert {c} got tokens");
            }
            let slot_rows = d.slot_rows().to_vec::<u32>().unwrap();
            for (r, &s) in row_slots.iter().enumerate() {
                assert_eq!(slot_rows[s as usize], r as u32, "{what}: slot_rows inverts row_slots");
            }
            let rows = d.rows().to_f32_vec().unwrap();
            let want: Vec<f32> =
                row_slots.iter().flat_map(|&s| x[(s as usize / k) * h..(s as usize / k + 1) * h].to_vec()).collect();
            assert_bits(&format!("{what}: rows"), &rows, &want);
            let w = plan.weights().to_f32_vec().unwrap();
            assert_bits(&format!("{what}: f32 weights"), &d.weights().to_vec::<f32>().unwrap(), &w);
        }
    }
}

#[test]
fn combine_restores_token_order() {
    let dev = device();
    let mut rng = Rng::new(22);
    let (t, e, h) = (70, 5, 33);
    for dtype in FLOAT_DTYPES {
        let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
        let input = tensor(&dev, dtype, &x, &[t, h]);
        let z = logits(&mut rng, t, e, &[]);
        // top-1 renormalised: every weight is exactly 1, so combining the dispatched rows
        // themselves gives the input back bit for bit.
        let plan = plan_of(&dev, dtype, &z, t, e, 1, true);
        let d = plan.dispatch(&input).unwrap();
        let back = d.combine(d.rows()).unwrap();
        assert_bits(&format!("{dtype} top-1 round trip"), &back.to_f32_vec().unwrap(), &x);
        // top-3 renormalised: the weights sum to 1, so the input comes back up to rounding.
        let plan = plan_of(&dev, dtype, &z, t, e, 3, true);
        let d = plan.dispatch(&input).unwrap();
        let back = d.combine(d.rows()).unwrap().to_f32_vec().unwrap();
        let want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        assert_close(&format!("{dtype} top-3 round trip"), &back, &want, 1e-6, 4.0 * epsilon(dtype));
        // Rows scaled by their entry number: the combine must pick each token's own rows and
        // weights.
        let w = plan.weights().to_f32_vec().unwrap();
        let row_slots = d.row_slots().to_vec::<u32>().unwrap();
        let marked: Vec<f32> = row_slots.iter().flat_map(|&s| vec![s as f32; h]).collect();
        let out = d.combine(&tensor(&dev, dtype, &marked, &[t * 3, h])).unwrap().to_f32_vec().unwrap();
        let want: Vec<f64> = (0..t)
            .flat_map(|tok| {
                let v: f64 = (0..3).map(|s| w[tok * 3 + s] as f64 * round_to(dtype, (tok * 3 + s) as f32) as f64).sum();
                vec![v; h]
            })
            .collect();
        assert_close(&format!("{dtype} marked rows"), &out, &want, 1e-6, 4.0 * epsilon(dtype));
    }
}

#[test]
fn nan_routing_rows_give_nan_outputs() {
    let dev = device();
    let (t, e, h) = (3, 4, 8);
    let mut z = logits(&mut Rng::new(23), t, e, &[]);
    z[e + 1] = f32::NAN;
    let x = Rng::new(24).vec(t * h, -1.0, 1.0);
    let plan = plan_of(&dev, DType::F32, &z, t, e, 2, true);
    let d = plan.dispatch(&tensor(&dev, DType::F32, &x, &[t, h])).unwrap();
    let out = d.combine(d.rows()).unwrap().to_vec::<f32>().unwrap();
    assert!(out[h..2 * h].iter().all(|v| v.is_nan()), "token 1's row: {:?}", &out[h..2 * h]);
    assert!(out[..h].iter().chain(&out[2 * h..]).all(|v| v.is_finite()));
}

/// The strategies each dtype runs: Scalar everywhere, TensorCore and Auto on f16/bf16.
fn strategies(dtype: DType) -> Vec<GroupedStrategy> {
    if dtype == DType::F32 {
        vec![GroupedStrategy::Scalar, GroupedStrategy::Auto]
    } else {
        vec![GroupedStrategy::Scalar, GroupedStrategy::TensorCore, GroupedStrategy::Auto]
    }
}

#[test]
fn experts_match_reference_for_every_strategy() {
    let dev = device();
    let mut rng = Rng::new(25);
    // (T, E, top_k, H, I, cold experts, hot expert): T = 37 (not a tile multiple) with two
    // idle experts; top_k = E; one expert holding all 70 tokens (two row tiles); H and I
    // multiples of 8, not 16.
    let cases: [ExpertCase; 3] =
        [(37, 6, 2, 40, 24, &[1, 4], None), (5, 4, 4, 16, 8, &[], None), (70, 3, 1, 24, 40, &[], Some(1))];
    for dtype in FLOAT_DTYPES {
        for (t, e, k, h, i, cold, hot) in cases {
            let w = Weights::new(&mut rng, dtype, e, h, i);
            let experts = w.experts(&dev, dtype);
            let mut z = logits(&mut rng, t, e, cold);
            if let Some(hot) = hot {
                z.chunks_mut(e).for_each(|row| row[hot] = 30.0);
            }
            let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
            let input = tensor(&dev, dtype, &x, &[t, h]);
            let plan = plan_of(&dev, dtype, &z, t, e, k, true);
            let d = plan.dispatch(&input).unwrap();
            let offsets = d.offsets().to_vec::<u32>().unwrap();
            for &c in cold {
                assert_eq!(offsets[c], offsets[c + 1], "cold expert {c}");
            }
            if let Some(hot) = hot {
                assert_eq!(offsets[hot + 1] - offsets[hot], t as u32, "expert {hot} holds every token");
            }
            let idx = plan.indices().to_vec::<u32>().unwrap();
            let weights = plan.weights().to_f32_vec().unwrap();
            let (want, mag) = reference(&w, &x, &idx, &weights, k);
            for s in strategies(dtype) {
                let what = format!("{dtype} {s:?} T={t} E={e} k={k} H={h} I={i}");
                let y = experts.forward_dispatched_with_strategy(&d, s).unwrap();
                assert_eq!(y.shape(), &[t * k, h], "{what}");
                let out = d.combine(&y).unwrap().to_f32_vec().unwrap();
                check_block(&what, dtype, &out, &want, &mag, h + i);
            }
        }
    }
}

#[test]
fn strategies_and_forms_agree_bit_for_bit() {
    let dev = device();
    let mut rng = Rng::new(26);
    let (t, e, k, h, i) = (19, 5, 2, 32, 16);
    for dtype in FLOAT_DTYPES {
        let w = Weights::new(&mut rng, dtype, e, h, i);
        let (experts, fused) = (w.experts(&dev, dtype), w.fused(&dev, dtype));
        let z = logits(&mut rng, t, e, &[]);
        let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
        let input = tensor(&dev, dtype, &x, &[t, h]);
        let lg = tensor(&dev, dtype, &z, &[t, e]);
        let o = RoutingOptions { top_k: k, renormalize: false };
        let plan = api::route(&lg, o).unwrap();
        let d = plan.dispatch(&input).unwrap();
        let bits = |t: &Tensor| t.to_bytes().unwrap();
        let tc = if dtype == DType::F32 { GroupedStrategy::Scalar } else { GroupedStrategy::TensorCore };
        for s in [GroupedStrategy::Scalar, tc] {
            let y = experts.forward_dispatched_with_strategy(&d, s).unwrap();
            // The fused gate_up runs the same products per element.
            let yf = fused.forward_dispatched_with_strategy(&d, s).unwrap();
            assert_eq!(bits(&y), bits(&yf), "{dtype} {s:?}: fused gate_up");
            // The `_into` form with preallocated buffers.
            let ws = ExpertsWorkspace::new(&experts, d.len()).unwrap();
            let out = Tensor::empty(&dev, dtype, &[d.len(), h]).unwrap();
            experts.forward_dispatched_into(&dev.default_stream(), &d, s, &ws, &out).unwrap();
            assert_eq!(bits(&y), bits(&out), "{dtype} {s:?}: into form");
            let staged = d.combine(&y).unwrap();
            let one_call = experts.forward_with_strategy(&input, &lg, o, s).unwrap();
            assert_eq!(bits(&staged), bits(&one_call), "{dtype} {s:?}: forward_with_strategy");
        }
        // Auto is TensorCore where supported (f16/bf16 here), Scalar for f32.
        let auto = experts.forward_dispatched_with_strategy(&d, GroupedStrategy::Auto).unwrap();
        assert_eq!(bits(&auto), bits(&experts.forward_dispatched_with_strategy(&d, tc).unwrap()), "{dtype} Auto");
        // forward and forward_dispatched keep Scalar.
        let scalar = experts.forward_dispatched(&d).unwrap();
        assert_eq!(
            bits(&scalar),
            bits(&experts.forward_dispatched_with_strategy(&d, GroupedStrategy::Scalar).unwrap())
        );
        assert_eq!(
            bits(&experts.forward(&input, &lg, o).unwrap()),
            bits(&d.combine(&scalar).unwrap()),
            "{dtype} forward"
        );
        // dispatch_into with preallocated buffers equals dispatch.
        let pre = DispatchedTokens::new(&dev, dtype, t, k, e, h).unwrap();
        plan.dispatch_into(&dev.default_stream(), &input, &pre).unwrap();
        assert_eq!(bits(pre.rows()), bits(d.rows()), "{dtype} dispatch_into rows");
        assert_eq!(bits(pre.slot_rows()), bits(d.slot_rows()), "{dtype} dispatch_into slot_rows");
        // Grouped sigmoid routing through the one call and staged.
        let g = GroupRoutingOptions {
            top_k: 2,
            groups: 5,
            selected_groups: 2,
            group_top_two: false,
            renormalize: true,
            scale: 2.5,
        };
        let bias = Tensor::from_slice(&dev, &[0.1f32, -0.2, 0.0, 0.3, -0.1], &[e]).unwrap();
        let gp = api::route_sigmoid_grouped(&lg, Some(&bias), g).unwrap();
        let gd = gp.dispatch(&input).unwrap();
        let staged =
            gd.combine(&experts.forward_dispatched_with_strategy(&gd, GroupedStrategy::Auto).unwrap()).unwrap();
        let one_call = experts.forward_sigmoid_grouped(&input, &lg, Some(&bias), g, GroupedStrategy::Auto).unwrap();
        assert_eq!(bits(&staged), bits(&one_call), "{dtype} forward_sigmoid_grouped");
        let (want, mag) =
            reference(&w, &x, &gp.indices().to_vec::<u32>().unwrap(), &gp.weights().to_f32_vec().unwrap(), 2);
        check_block(&format!("{dtype} sigmoid grouped"), dtype, &one_call.to_f32_vec().unwrap(), &want, &mag, h + i);
    }
}

#[test]
fn sizes_tensor_cores_cannot_take_run_scalar() {
    // H = 20 and I = 12 are not multiples of 8: TensorCore is an error naming why, Auto runs
    // Scalar (bit for bit), and both match the reference.
    let dev = device();
    let mut rng = Rng::new(27);
    let (t, e, k, h, i) = (11, 3, 2, 20, 12);
    for dtype in [DType::F16, DType::BF16] {
        let w = Weights::new(&mut rng, dtype, e, h, i);
        let experts = w.experts(&dev, dtype);
        let z = logits(&mut rng, t, e, &[]);
        let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
        let plan = plan_of(&dev, dtype, &z, t, e, k, false);
        let d = plan.dispatch(&tensor(&dev, dtype, &x, &[t, h])).unwrap();
        let err = experts.forward_dispatched_with_strategy(&d, GroupedStrategy::TensorCore).unwrap_err().to_string();
        assert!(err.contains("multiples of 8"), "{err}");
        let auto = experts.forward_dispatched_with_strategy(&d, GroupedStrategy::Auto).unwrap();
        let scalar = experts.forward_dispatched(&d).unwrap();
        assert_eq!(auto.to_bytes().unwrap(), scalar.to_bytes().unwrap(), "{dtype}: Auto is Scalar here");
        let (want, mag) =
            reference(&w, &x, &plan.indices().to_vec::<u32>().unwrap(), &plan.weights().to_f32_vec().unwrap(), k);
        check_block(
            &format!("{dtype} H=20 I=12"),
            dtype,
            &d.combine(&auto).unwrap().to_f32_vec().unwrap(),
            &want,
            &mag,
            h + i,
        );
    }
}

fn fails<T: std::fmt::Debug>(r: Result<T, OpError>, needle: &str) {
    match r {
        Err(e) => assert!(e.to_string().contains(needle), "error `{e}` does not mention `{needle}`"),
        Ok(v) => panic!("accepted ({v:?}); expected an error mentioning `{needle}`"),
    }
}

#[test]
fn bad_arguments_are_errors() {
    let dev = device();
    let mut rng = Rng::new(28);
    let (t, e, k, h, i) = (4, 3, 2, 16, 8);
    let f32w = Weights::new(&mut rng, DType::F32, e, h, i);
    let t3 = |dtype: DType, shape: &[usize]| tensor(&dev, dtype, &vec![0.5; shape.iter().product()], shape);
    let (gate, up, down) = (t3(DType::F32, &[e, i, h]), t3(DType::F32, &[e, i, h]), t3(DType::F32, &[e, h, i]));
    // SwiGluExperts::new: shapes, ranks, dtypes.
    fails(SwiGluExperts::new(gate.clone(), t3(DType::F32, &[e, i + 1, h]), down.clone()), "up");
    fails(SwiGluExperts::new(gate.clone(), up.clone(), t3(DType::F32, &[e, i, h])), "down");
    fails(SwiGluExperts::new(gate.clone(), up.clone(), t3(DType::F32, &[e + 1, h, i])), "down");
    fails(SwiGluExperts::new(t3(DType::F32, &[i, h]), up.clone(), down.clone()), "gate");
    fails(SwiGluExperts::new(gate.clone(), t3(DType::BF16, &[e, i, h]), down.clone()), "up");
    fails(SwiGluExperts::new(gate.clone(), up.clone(), t3(DType::F16, &[e, h, i])), "down");
    let u32w = Tensor::from_slice(&dev, &vec![1u32; e * i * h], &[e, i, h]).unwrap();
    fails(SwiGluExperts::new(u32w, up.clone(), down.clone()), "u32");
    fails(
        SwiGluExperts::new(t3(DType::F32, &[1025, 1, 1]), t3(DType::F32, &[1025, 1, 1]), t3(DType::F32, &[1025, 1, 1])),
        "1024",
    );
    fails(SwiGluExperts::from_fused(t3(DType::F32, &[e, 2 * i + 1, h]), down.clone()), "even");
    fails(SwiGluExperts::from_fused(t3(DType::F32, &[e, 2 * i, h]), t3(DType::F32, &[e, h, i + 1])), "down");

    let experts = f32w.experts(&dev, DType::F32);
    let x = t3(DType::F32, &[t, h]);
    let z = logits(&mut rng, t, e, &[]);
    let lg = tensor(&dev, DType::F32, &z, &[t, e]);
    let o = RoutingOptions { top_k: k, renormalize: true };
    let plan = api::route(&lg, o).unwrap();
    // Dispatch: rank, tokens, dtype, buffers made for another problem.
    fails(plan.dispatch(&t3(DType::F32, &[t * h])), "input");
    fails(plan.dispatch(&t3(DType::F32, &[t + 1, h])), "tokens");
    fails(plan.dispatch(&Tensor::from_slice(&dev, &vec![0u32; t * h], &[t, h]).unwrap()), "u32");
    let other = DispatchedTokens::new(&dev, DType::F32, t, k, e, h + 1).unwrap();
    fails(plan.dispatch_into(&dev.default_stream(), &x, &other), "dispatch buffers");
    fails(DispatchedTokens::new(&dev, DType::U32, t, k, e, h), "u32");
    fails(DispatchedTokens::new(&dev, DType::F32, 0, k, e, h), "empty");
    fails(DispatchedTokens::new(&dev, DType::F32, t, e + 1, e, h), "top_k");
    fails(DispatchedTokens::new(&dev, DType::F32, t, 0, e, h), "top_k");
    fails(DispatchedTokens::new(&dev, DType::F32, t, 1, 1025, h), "1024");
    // Combine: shape and dtype of the expert output and of `out`.
    let d = plan.dispatch(&x).unwrap();
    fails(d.combine(&t3(DType::F32, &[t * k + 1, h])), "expert_out");
    fails(d.combine(&t3(DType::BF16, &[t * k, h])), "expert_out");
    fails(d.combine_into(&dev.default_stream(), d.rows(), &t3(DType::F32, &[t, h + 1])), "out");
    // Experts on a mismatched dispatch: hidden size, dtype.
    let wide = api::route(&lg, o).unwrap().dispatch(&t3(DType::F32, &[t, h + 8])).unwrap();
    fails(experts.forward_dispatched(&wide), "hidden");
    let half = plan.dispatch(&t3(DType::F16, &[t, h])).unwrap();
    fails(experts.forward_dispatched(&half), "dispatched rows");
    // TensorCore on f32 is an error; Auto runs Scalar.
    fails(experts.forward_dispatched_with_strategy(&d, GroupedStrategy::TensorCore), "f16 or bf16");
    assert!(experts.forward_dispatched_with_strategy(&d, GroupedStrategy::Auto).is_ok());
    // The `_into` form: workspace and output shapes.
    let ws = ExpertsWorkspace::new(&experts, d.len() + 1).unwrap();
    let out = Tensor::empty(&dev, DType::F32, &[d.len(), h]).unwrap();
    fails(experts.forward_dispatched_into(&dev.default_stream(), &d, GroupedStrategy::Scalar, &ws, &out), "workspace");
    let ws = ExpertsWorkspace::new(&experts, d.len()).unwrap();
    let short = Tensor::empty(&dev, DType::F32, &[d.len(), h - 1]).unwrap();
    fails(experts.forward_dispatched_into(&dev.default_stream(), &d, GroupedStrategy::Scalar, &ws, &short), "out");
    // forward: logits for another expert count or token count, input of another dtype or
    // width; routing options the router rejects.
    fails(experts.forward(&x, &tensor(&dev, DType::F32, &z[..t * 2], &[t, 2]), o), "logits");
    fails(experts.forward(&t3(DType::F32, &[t - 1, h]), &lg, o), "input");
    fails(experts.forward(&t3(DType::F16, &[t, h]), &lg, o), "input");
    fails(experts.forward(&t3(DType::F32, &[t, h + 1]), &lg, o), "hidden");
    fails(experts.forward(&x, &lg, RoutingOptions { top_k: e + 1, renormalize: false }), "top_k");
    let g = GroupRoutingOptions {
        top_k: 2,
        groups: 2,
        selected_groups: 1,
        group_top_two: false,
        renormalize: true,
        scale: 1.0,
    };
    fails(experts.forward_sigmoid_grouped(&x, &lg, None, g, GroupedStrategy::Scalar), "groups");
}

#[test]
fn decode_path_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(29);
    // (T, E, top_k, H, I, cold experts, hot expert): one token; three (a tile of 4 with a
    // padded token) with H and I odd (scalar loads); the full tile of 8 with top_k = E (every
    // expert shared by every token); five tokens all picking one expert.
    let cases: [ExpertCase; 4] = [
        (1, 8, 2, 40, 24, &[], None),
        (3, 5, 3, 17, 9, &[], None),
        (EXPERTS_DECODE_MAX_TOKENS, 4, 4, 24, 40, &[], None),
        (5, 6, 2, 64, 16, &[0], Some(2)),
    ];
    for dtype in FLOAT_DTYPES {
        for (t, e, k, h, i, cold, hot) in cases {
            let w = Weights::new(&mut rng, dtype, e, h, i);
            let mut z = logits(&mut rng, t, e, cold);
            if let Some(hot) = hot {
                z.chunks_mut(e).for_each(|row| row[hot] = 30.0);
            }
            let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
            let input = tensor(&dev, dtype, &x, &[t, h]);
            let plan = plan_of(&dev, dtype, &z, t, e, k, true);
            let idx = plan.indices().to_vec::<u32>().unwrap();
            let (want, mag) = reference(&w, &x, &idx, &plan.weights().to_f32_vec().unwrap(), k);
            for (form, experts) in [("split", w.experts(&dev, dtype)), ("fused", w.fused(&dev, dtype))] {
                let what = format!("{dtype} {form} decode T={t} E={e} k={k} H={h} I={i}");
                let out = experts.forward_decode(&input, &plan).unwrap();
                assert_eq!(out.shape(), &[t, h], "{what}");
                check_block(&what, dtype, &out.to_f32_vec().unwrap(), &want, &mag, h + i);
                // The `_into` form, with its buffers reused for a second step.
                let ws = ExpertsDecodeWorkspace::new(&experts, t, k).unwrap();
                let into = Tensor::empty(&dev, dtype, &[t, h]).unwrap();
                for _ in 0..2 {
                    experts.forward_decode_into(&dev.default_stream(), &input, &plan, &ws, &into).unwrap();
                    assert_eq!(into.to_bytes().unwrap(), out.to_bytes().unwrap(), "{what}: into form");
                }
            }
        }
    }
}

#[test]
fn decode_path_takes_repeated_and_out_of_range_ids() {
    // A selection made elsewhere: token 0 names expert 2 twice, token 1 names expert 9 of 4
    // (clamped to 3, as the dispatch clamps), token 2 shares expert 2 with token 0.
    let dev = device();
    let mut rng = Rng::new(30);
    let (t, e, k, h, i) = (3, 4, 2, 24, 16);
    for dtype in FLOAT_DTYPES {
        let w = Weights::new(&mut rng, dtype, e, h, i);
        let experts = w.experts(&dev, dtype);
        let ids = [2u32, 2, 0, 9, 1, 2];
        let weights = quantize(dtype, &[0.25, 0.5, 0.75, 1.0, -0.5, 0.125]);
        let plan = RoutingPlan::from_selection(
            Tensor::from_slice(&dev, &ids, &[t, k]).unwrap(),
            tensor(&dev, dtype, &weights, &[t, k]),
            e,
        )
        .unwrap();
        let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
        let input = tensor(&dev, dtype, &x, &[t, h]);
        let clamped: Vec<u32> = ids.iter().map(|&id| id.min(e as u32 - 1)).collect();
        let (want, mag) = reference(&w, &x, &clamped, &weights, k);
        let what = format!("{dtype} repeated ids");
        check_block(
            &what,
            dtype,
            &experts.forward_decode(&input, &plan).unwrap().to_f32_vec().unwrap(),
            &want,
            &mag,
            h + i,
        );
        // The dispatched path on the same selection agrees with the same reference.
        let d = plan.dispatch(&input).unwrap();
        let dispatched = d.combine(&experts.forward_dispatched(&d).unwrap()).unwrap();
        check_block(&format!("{what} (dispatched)"), dtype, &dispatched.to_f32_vec().unwrap(), &want, &mag, h + i);
    }
}

#[test]
fn decode_nan_routing_rows_give_nan_outputs() {
    let dev = device();
    let (t, e, h, i) = (3, 4, 8, 8);
    let w = Weights::new(&mut Rng::new(31), DType::F32, e, h, i);
    let mut z = logits(&mut Rng::new(32), t, e, &[]);
    z[e + 1] = f32::NAN;
    let x = Rng::new(33).vec(t * h, -1.0, 1.0);
    let plan = plan_of(&dev, DType::F32, &z, t, e, 2, true);
    let out = w.experts(&dev, DType::F32).forward_decode(&tensor(&dev, DType::F32, &x, &[t, h]), &plan).unwrap();
    let out = out.to_vec::<f32>().unwrap();
    assert!(out[h..2 * h].iter().all(|v| v.is_nan()), "token 1's row: {:?}", &out[h..2 * h]);
    assert!(out[..h].iter().chain(&out[2 * h..]).all(|v| v.is_finite()), "{out:?}");
}

/// Global load sectors of the decode gate/up kernel (f32, 4 tokens of top 2 over 8 experts, I
/// = 16, H = 64) on routing ids `ids`, in the interpreter.
fn decode_load_sectors(ids: &[u32]) -> u64 {
    let (t, k, e, n, kk) = (4u32, 2u32, 8u32, 16u32, 64u32);
    let cfg = DecodeConfig {
        dtype: ruda_ir::ScalarType::F32,
        projection: DecodeProjection::GateUp,
        m_tile: 4,
        loads: GemvLoads::Vector,
    };
    let mut kern = moe_decode(&cfg).unwrap();
    ruda_ir::passes::optimize(&mut kern).unwrap();
    let f32s = |len: u32| (0..len).flat_map(|v| ((v % 7) as f32 * 0.125).to_le_bytes()).collect::<Vec<u8>>();
    let mut x = f32s(t * kk);
    let mut indices: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (mut gate, mut up) = (f32s(e * n * kk), f32s(e * n * kk));
    let mut act = vec![0u8; (t * k * n * 4) as usize];
    let u = |v: u32| KernelArg::Scalar(Constant::u32(v));
    let mut args = vec![
        KernelArg::Buffer(&mut x),
        KernelArg::Buffer(&mut indices),
        KernelArg::Buffer(&mut gate),
        KernelArg::Buffer(&mut up),
        KernelArg::Buffer(&mut act),
        u(t),
        u(k),
        u(e),
        u(n),
        u(kk),
        u(n * kk),
    ];
    let launch = LaunchConfig { grid: DecodeConfig::grid(n, t * k), block: [128, 1, 1], dynamic_shared_bytes: 0 };
    run_profiled(&kern, &launch, &mut args, 1).unwrap().totals.global_load_sectors
}

#[test]
fn decode_reads_each_selected_expert_once() {
    // Eight slots over 8, 4 and 2 experts. The loads are a fixed part (the ids) plus a part per
    // selected expert, however many slots name it: affine in the distinct experts, at least
    // one expert's gate and up rows apiece. Reading an expert once per slot would load the
    // same for all three.
    let s8 = decode_load_sectors(&[0, 1, 2, 3, 4, 5, 6, 7]);
    let s4 = decode_load_sectors(&[0, 1, 2, 3, 3, 2, 1, 0]);
    let s2 = decode_load_sectors(&[5, 6, 6, 5, 5, 6, 6, 5]);
    assert_eq!(s8 - s4, 2 * (s4 - s2), "sectors for 8, 4, 2 experts: {s8}, {s4}, {s2}");
    let per_expert = (s4 - s2) / 2;
    let weight_sectors = 2 * 16 * 64 * 4 / 32;
    assert!(per_expert >= weight_sectors, "{per_expert} sectors per expert, its weights are {weight_sectors}");
}

#[test]
fn decode_bad_arguments_are_errors() {
    let dev = device();
    let (t, e, k, h, i) = (4, 3, 2, 16, 8);
    let experts = Weights::new(&mut Rng::new(34), DType::F32, e, h, i).experts(&dev, DType::F32);
    let t2 = |dtype: DType, shape: &[usize]| tensor(&dev, dtype, &vec![0.5; shape.iter().product()], shape);
    let z = logits(&mut Rng::new(35), 9, e, &[]);
    let plan = plan_of(&dev, DType::F32, &z[..t * e], t, e, k, true);
    let x = t2(DType::F32, &[t, h]);
    // More tokens than the path takes, for the workspace and for the call.
    fails(ExpertsDecodeWorkspace::new(&experts, EXPERTS_DECODE_MAX_TOKENS + 1, k), "decode path takes");
    fails(ExpertsDecodeWorkspace::new(&experts, t, e + 1), "top_k");
    let nine = plan_of(&dev, DType::F32, &z, 9, e, k, true);
    fails(experts.forward_decode(&t2(DType::F32, &[9, h]), &nine), "decode path takes");
    // Input of another width, token count or dtype; output of another shape.
    fails(experts.forward_decode(&t2(DType::F32, &[t, h + 1]), &plan), "input");
    fails(experts.forward_decode(&t2(DType::F32, &[t + 1, h]), &plan), "input");
    fails(experts.forward_decode(&t2(DType::BF16, &[t, h]), &plan), "input");
    let ws = ExpertsDecodeWorkspace::new(&experts, t, k).unwrap();
    let s = dev.default_stream();
    fails(experts.forward_decode_into(&s, &x, &plan, &ws, &t2(DType::F32, &[t, h - 1])), "out");
    // A workspace for another step, a plan over another expert count.
    let other = ExpertsDecodeWorkspace::new(&experts, t - 1, k).unwrap();
    fails(experts.forward_decode_into(&s, &x, &plan, &other, &t2(DType::F32, &[t, h])), "workspace");
    let z4 = logits(&mut Rng::new(36), t, e + 1, &[]);
    let plan4 = plan_of(&dev, DType::F32, &z4, t, e + 1, k, true);
    fails(experts.forward_decode(&x, &plan4), "experts");
}

#[test]
fn every_grouped_tile_gives_the_same_bits() {
    // The tile partitions the output, never the k order: every candidate the tuner may pick
    // gives the heuristic's bits (and so its agreement with the reference), on 70 rows of 3
    // experts, one of them idle, in f16 and bf16.
    let dev = device();
    let mut rng = Rng::new(37);
    let (t, e, k, h, i) = (35, 3, 2, 40, 24);
    for dtype in [DType::F16, DType::BF16] {
        let w = Weights::new(&mut rng, dtype, e, h, i);
        let experts = w.fused(&dev, dtype);
        let x = quantize(dtype, &rng.vec(t * h, -1.0, 1.0));
        let plan = plan_of(&dev, dtype, &logits(&mut rng, t, e, &[1]), t, e, k, true);
        let d = plan.dispatch(&tensor(&dev, dtype, &x, &[t, h])).unwrap();
        let heuristic = experts.forward_dispatched_with_strategy(&d, GroupedStrategy::TensorCore).unwrap();
        let (want, mag) =
            reference(&w, &x, &plan.indices().to_vec::<u32>().unwrap(), &plan.weights().to_f32_vec().unwrap(), k);
        check_block(
            &format!("{dtype} heuristic tiles"),
            dtype,
            &d.combine(&heuristic).unwrap().to_f32_vec().unwrap(),
            &want,
            &mag,
            h + i,
        );
        for (n, gate_up) in GROUPED_TC_TILES.into_iter().enumerate() {
            let down = GROUPED_TC_TILES[(n + 1) % GROUPED_TC_TILES.len()];
            let tiles = api::ExpertTiles { gate_up, down };
            let ws = ExpertsWorkspace::with_tiles(&experts, d.len(), Some(tiles)).unwrap();
            assert_eq!(ws.tiles(), Some(tiles));
            let out = Tensor::empty(&dev, dtype, &[d.len(), h]).unwrap();
            experts.forward_dispatched_into(&dev.default_stream(), &d, GroupedStrategy::TensorCore, &ws, &out).unwrap();
            assert_eq!(out.to_bytes().unwrap(), heuristic.to_bytes().unwrap(), "{dtype} {}", tiles.name());
        }
    }
}

#[test]
fn expert_tiles_tune_with_injected_timings_and_cache_the_choice() {
    let dev = Device::cpu();
    let (e, h, i) = (4, 24, 16);
    let experts = Weights::new(&mut Rng::new(38), DType::BF16, e, h, i).fused(&dev, DType::BF16);
    let dir = temp_dir("tune-moe-experts");
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    // 40 rows over 4 experts: 10 per expert, the small tile for both GEMMs.
    let heuristic = api::ExpertTiles::heuristic(40, e, h, i);
    assert_eq!(heuristic, api::ExpertTiles { gate_up: TcTile::T64x64, down: TcTile::T64x64 });
    assert_eq!(heuristic.name(), "tc64x64");
    let fastest = api::ExpertTiles { gate_up: TcTile::T128x64, down: TcTile::T128x64 };
    let broken = api::ExpertTiles { gate_up: TcTile::T128x128, down: TcTile::T128x128 };
    let mut measured = Vec::new();
    let choice = tune_experts_with(&tuner, &dev, &experts, 40, |t| {
        measured.push(t);
        match t {
            t if t == broken => Err("launch failed".to_string()),
            t if t == fastest => Ok(0.5),
            _ => Ok(1.0),
        }
    })
    .unwrap();
    // The heuristic's pair first, then each other tile for both GEMMs once.
    assert_eq!(measured[0], heuristic);
    assert_eq!(measured.len(), GROUPED_TC_TILES.len());
    assert!(GROUPED_TC_TILES.iter().all(|&t| measured.contains(&api::ExpertTiles { gate_up: t, down: t })));
    assert_eq!(choice.value, fastest);
    assert_eq!(choice.choice.candidate.name, "tc128x64");
    let again = tune_experts_with(&tuner, &dev, &experts, 40, |_| panic!("measured a cached key")).unwrap();
    assert!(again.choice.cached && again.value == fastest);
    // 33 rows share the bucket of 40 (64); the entry records the failure.
    let key = experts_key(&experts, 33);
    assert_eq!(key.to_string(), "moe_experts bf16 64x4x32x16 align16");
    let entry = tuner.snapshot().entries.remove(&key.to_string()).expect("entry");
    let failed = entry.results.iter().find(|r| r.candidate == broken.name()).expect("measured");
    assert_eq!(failed.error.as_deref(), Some("launch failed"));
    // 1024 rows of 4 experts: 256 each, the large tile where the output is that wide (gate/up's
    // 2I = 32 is not).
    assert_eq!(
        api::ExpertTiles::heuristic(1024, e, 256, i),
        api::ExpertTiles { gate_up: TcTile::T64x64, down: TcTile::T128x128W4 }
    );
    assert_eq!(api::ExpertTiles::heuristic(1024, e, 256, i).name(), "tc64x64+tc128x128w4");
    // Shapes of one key get one candidate set: H = 104 and 128 share a bucket though the exact
    // heuristic gives the down GEMM's 104 columns the small tile.
    let set = |h: usize| {
        let ex = Weights::new(&mut Rng::new(40), DType::BF16, e, h, i).fused(&dev, DType::BF16);
        let key = experts_key(&ex, 1024);
        (key.to_string(), Candidates::<ExpertTileChoice>::new(&dev, &key, [1024, e, h, i]).unwrap().set)
    };
    assert_ne!(api::ExpertTiles::heuristic(1024, e, 104, i), api::ExpertTiles::heuristic(1024, e, 128, i));
    assert_eq!(set(104), set(128));
    // Off: the heuristic, unmeasured.
    let off = Autotuner::open(&dir, fingerprint(), AutotuneMode::Off);
    assert_eq!(tune_experts_with(&off, &dev, &experts, 40, |_| panic!("measured")).unwrap().value, heuristic);
    // f32 experts have no tensor-core candidates.
    let f32_experts = Weights::new(&mut Rng::new(39), DType::F32, e, h, i).fused(&dev, DType::F32);
    let err = tune_experts_with(&tuner, &dev, &f32_experts, 40, |_| Ok(1.0)).unwrap_err().to_string();
    assert!(err.contains("f16 or bf16"), "{err}");
    // On the CPU device nothing is tuned: the workspace keeps the heuristic, the shape line
    // reports that tuning does not apply.
    let stream = dev.default_stream();
    assert_eq!(ExpertsWorkspace::tuned(&stream, &experts, 40).unwrap().tiles(), None);
    assert!(tune_experts_shape(&stream, DType::BF16, [20, e, 2, h, i]).unwrap().is_none());
}
