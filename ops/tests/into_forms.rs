//! The `_into` forms (issue 11 item 6): each writes what its allocating wrapper returns, and
//! refuses an `out` of the wrong dtype or shape (and, with a GPU, on the wrong device) with the
//! matching `OpError`, leaving `out` untouched. Also: a cast to the same dtype, `RopeTable` from
//! inverse frequencies with an attention scaling ≠ 1, and the sampling generator against the
//! published SplitMix64 test vectors.

use crate::common::*;
use ruda_ops::api::{self, OpError, RopeTable, SamplingParams};
use ruda_runtime::{DType, Device, Stream, Tensor};

/// Poison written to every `out` first, so an op that writes nothing shows.
const POISON: f32 = -77.0;

fn poisoned(dev: &Device, dtype: DType, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    match dtype {
        DType::U32 => Tensor::from_slice(dev, &vec![u32::MAX; n], shape).unwrap(),
        _ => tensor(dev, dtype, &vec![POISON; n], shape),
    }
}

/// A launch of an `_into` form over any `out`.
type IntoLaunch<'a> = Box<dyn Fn(&Stream, &Tensor) -> api::Result<()> + 'a>;

/// One `_into` form under test: its name, what the allocating wrapper returns, and its launch.
struct IntoCase<'a> {
    name: &'static str,
    want: Tensor,
    run: IntoLaunch<'a>,
}

/// Right `out`: the wrapper's bytes. Wrong dtype, wrong shape: `DType` / `Shape` errors, with
/// `out` untouched.
fn check(dev: &Device, c: &IntoCase<'_>) {
    let stream = dev.default_stream();
    let dtype = c.want.dtype();
    let out = poisoned(dev, dtype, c.want.shape());
    (c.run)(&stream, &out).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    assert_eq!(out.to_bytes().unwrap(), c.want.to_bytes().unwrap(), "{}: `_into` differs from the wrapper", c.name);

    // A float out where tokens go, tokens where floats go (`cast` takes any float out).
    let wrong_dtype = poisoned(dev, if dtype == DType::U32 { DType::F32 } else { DType::U32 }, c.want.shape());
    let before = wrong_dtype.to_bytes().unwrap();
    match (c.run)(&stream, &wrong_dtype) {
        Err(OpError::DType { .. }) => {}
        other => panic!("{}: an out of the wrong dtype gave {other:?}, not a dtype error", c.name),
    }
    assert_eq!(wrong_dtype.to_bytes().unwrap(), before, "{}: a refused out was written", c.name);

    let mut shape = c.want.shape().to_vec();
    *shape.last_mut().unwrap() += 1;
    let wrong_shape = poisoned(dev, dtype, &shape);
    let before = wrong_shape.to_bytes().unwrap();
    match (c.run)(&stream, &wrong_shape) {
        Err(OpError::Shape { .. }) => {}
        other => panic!("{}: an out of shape {shape:?} gave {other:?}, not a shape error", c.name),
    }
    assert_eq!(wrong_shape.to_bytes().unwrap(), before, "{}: a refused out was written", c.name);

    // An `out` on another device than the stream's: only a machine with a GPU has two devices.
    if dev.is_cuda() {
        let cpu_out = poisoned(&Device::cpu(), dtype, c.want.shape());
        match (c.run)(&stream, &cpu_out) {
            Err(OpError::Device { .. }) => {}
            other => panic!("{}: an out on the CPU gave {other:?}, not a device error", c.name),
        }
    }
}

#[test]
fn into_forms_match_their_wrappers_and_check_out() {
    let dev = device();
    let mut rng = Rng::new(61);
    let (rows, cols) = (3, 37);
    for dtype in FLOAT_DTYPES {
        let a = tensor(&dev, dtype, &rng.vec(rows * cols, -2.0, 2.0), &[rows, cols]);
        let b = tensor(&dev, dtype, &rng.vec(rows * cols, -2.0, 2.0), &[rows, cols]);
        // The norms' affine parameters are f32 whatever the input dtype.
        let gamma = tensor(&dev, DType::F32, &rng.vec(cols, 0.5, 1.5), &[cols]);
        let beta = tensor(&dev, DType::F32, &rng.vec(cols, -0.5, 0.5), &[cols]);
        let gate_up = tensor(&dev, dtype, &rng.vec(rows * 2 * cols, -2.0, 2.0), &[rows, 2 * cols]);
        let k = 19;
        let mat_a = tensor(&dev, dtype, &rng.vec(rows * k, -1.0, 1.0), &[rows, k]);
        let mat_b = tensor(&dev, dtype, &rng.vec(k * cols, -1.0, 1.0), &[k, cols]);
        let table = tensor(&dev, dtype, &rng.vec(11 * cols, -1.0, 1.0), &[11, cols]);
        let ids = Tensor::from_slice(&dev, &[3u32, 0, 10, 3], &[4]).unwrap();
        let cast_to = if dtype == DType::BF16 { DType::F16 } else { DType::BF16 };
        let eps = 1e-5;
        let cases = [
            IntoCase {
                name: "add",
                want: api::add(&a, &b).unwrap(),
                run: Box::new(|s, o| api::add_into(s, &a, &b, o)),
            },
            IntoCase {
                name: "mul",
                want: api::mul(&a, &b).unwrap(),
                run: Box::new(|s, o| api::mul_into(s, &a, &b, o)),
            },
            IntoCase { name: "silu", want: api::silu(&a).unwrap(), run: Box::new(|s, o| api::silu_into(s, &a, o)) },
            IntoCase {
                name: "cast",
                want: api::cast(&a, cast_to).unwrap(),
                run: Box::new(|s, o| api::cast_into(s, &a, o)),
            },
            IntoCase {
                name: "matmul",
                want: api::matmul(&mat_a, &mat_b).unwrap(),
                run: Box::new(|s, o| api::matmul_into(s, &mat_a, &mat_b, o)),
            },
            IntoCase {
                name: "layer_norm",
                want: api::layer_norm(&a, &gamma, Some(&beta), eps).unwrap(),
                run: Box::new(|s, o| api::layer_norm_into(s, &a, &gamma, Some(&beta), eps, o)),
            },
            IntoCase {
                name: "rms_norm",
                want: api::rms_norm(&a, &gamma, eps).unwrap(),
                run: Box::new(|s, o| api::rms_norm_into(s, &a, &gamma, eps, o)),
            },
            IntoCase {
                name: "rms_norm_hf",
                want: api::rms_norm_hf(&a, &gamma, eps).unwrap(),
                run: Box::new(|s, o| api::rms_norm_hf_into(s, &a, &gamma, eps, o)),
            },
            IntoCase {
                name: "reduce_sum",
                want: api::reduce_sum(&a).unwrap(),
                run: Box::new(|s, o| api::reduce_sum_into(s, &a, o)),
            },
            IntoCase {
                name: "reduce_max",
                want: api::reduce_max(&a).unwrap(),
                run: Box::new(|s, o| api::reduce_max_into(s, &a, o)),
            },
            IntoCase {
                name: "softmax",
                want: api::softmax_last_axis(&a).unwrap(),
                run: Box::new(|s, o| api::softmax_last_axis_into(s, &a, o)),
            },
            IntoCase {
                name: "swiglu",
                want: api::swiglu(&gate_up).unwrap(),
                run: Box::new(|s, o| api::swiglu_into(s, &gate_up, o)),
            },
            IntoCase {
                name: "embedding",
                want: api::embedding(&ids, &table).unwrap(),
                run: Box::new(|s, o| api::embedding_into(s, &ids, &table, o)),
            },
        ];
        for c in &cases {
            check(&dev, c);
        }
        // Sampling writes u32 tokens.
        let params = SamplingParams { temperature: 0.8, top_k: 5, top_p: 0.9, seed: 7, min_p: 0.05 };
        let offsets = Tensor::from_slice(&dev, &[0u64, 1, 2], &[rows]).unwrap();
        let want = api::sample(&a, &params, &offsets).unwrap();
        check(
            &dev,
            &IntoCase { name: "sample", want, run: Box::new(|s, o| api::sample_into(s, &a, &params, &offsets, o)) },
        );
    }
}

#[test]
fn a_cast_to_the_same_dtype_copies() {
    let dev = device();
    let mut rng = Rng::new(62);
    for dtype in FLOAT_DTYPES {
        let mut xs = rng.vec(101, -3.0, 3.0);
        xs[5] = f32::INFINITY;
        xs[9] = -0.0;
        let x = tensor(&dev, dtype, &xs, &[101]);
        let y = api::cast(&x, dtype).unwrap();
        assert_eq!(y.dtype(), dtype);
        assert_eq!(y.to_bytes().unwrap(), x.to_bytes().unwrap(), "cast {dtype} → {dtype}");
        let out = poisoned(&dev, dtype, &[101]);
        api::cast_into(&dev.default_stream(), &x, &out).unwrap();
        assert_eq!(out.to_bytes().unwrap(), x.to_bytes().unwrap(), "cast_into {dtype} → {dtype}");
    }
}

#[test]
fn rope_table_from_inv_freq_applies_the_attention_scaling() {
    let dev = device();
    // Frequencies as a scaled variant (YaRN-like) would compute them, and a scaling of 1.25:
    // cos and sin are multiplied by it, so a rotation also scales the vector's length.
    let inv_freq = [1.0f32, 0.3, 0.05, 0.0007];
    let (scaling, positions) = (1.25f32, 9);
    let table = RopeTable::from_inv_freq(&dev, &inv_freq, scaling, positions).unwrap();
    let (cos, sin) = (table.cos().to_f32_vec().unwrap(), table.sin().to_f32_vec().unwrap());
    for p in 0..positions {
        for (i, f) in inv_freq.iter().enumerate() {
            let angle = p as f64 * *f as f64;
            let (c, s) = (cos[p * inv_freq.len() + i] as f64, sin[p * inv_freq.len() + i] as f64);
            assert!((c - scaling as f64 * angle.cos()).abs() < 1e-6, "cos[{p}, {i}] = {c}");
            assert!((s - scaling as f64 * angle.sin()).abs() < 1e-6, "sin[{p}, {i}] = {s}");
        }
    }
    // Applied to one head of dim 8 (rotate-half pairs i and i + 4) at positions 0 and 7.
    let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.5).collect();
    let xt = Tensor::from_slice(&dev, &x, &[2, 1, 8]).unwrap();
    let pos = Tensor::from_slice(&dev, &[0u32, 7], &[2]).unwrap();
    let got = api::rope(&xt, &pos, &table).unwrap().to_f32_vec().unwrap();
    for (t, p) in [0usize, 7].into_iter().enumerate() {
        for i in 0..4 {
            let angle = p as f64 * inv_freq[i] as f64;
            let (c, s) = (scaling as f64 * angle.cos(), scaling as f64 * angle.sin());
            let (a, b) = (x[t * 8 + i] as f64, x[t * 8 + i + 4] as f64);
            let want = [a * c - b * s, b * c + a * s];
            for (j, w) in [i, i + 4].into_iter().zip(want) {
                let g = got[t * 8 + j] as f64;
                assert!((g - w).abs() < 1e-5, "rope position {p} dim {j}: {g} vs {w}");
            }
        }
    }
}

/// The published SplitMix64 test vectors: from state 1234567, the first five outputs of
/// Vigna's reference `splitmix64.c` (`state += 0x9e3779b97f4a7c15`, then the finaliser).
const SPLITMIX64_FROM_1234567: [u64; 5] =
    [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821];

#[test]
fn the_sampling_draw_is_splitmix64() {
    use ruda_ops::kernels::sampling::{mix64, SEED_SALT};
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
    // `draw(seed, offset) = mix64(mix64(seed ^ SALT) ^ offset) >> 40`, and SplitMix64's i-th
    // output from state s is `mix64(s + i·GAMMA)`: pick the seed and offsets that make each
    // draw one of the published outputs.
    let state = 1234567u64;
    for (i, want) in SPLITMIX64_FROM_1234567.iter().enumerate() {
        assert_eq!(mix64(state.wrapping_add((i as u64 + 1).wrapping_mul(GAMMA))), *want, "mix64, output {i}");
    }
    // Seed 0 with the documented salt (the golden gamma): `mix64(0 ^ GAMMA)` is SplitMix64's
    // first output from state 0, 0xe220a8397b1dcdaf, and the second is 0x6e789e6aa1b965f4
    // (Vigna's reference). Written out without `SEED_SALT`, so a changed salt shows.
    assert_eq!(
        api::sampling_draw(0, 0xe220_a839_7b1d_cdaf ^ GAMMA.wrapping_mul(2)),
        (0x6e78_9e6a_a1b9_65f4u64 >> 40) as u32
    );
    let seed = state.wrapping_add(GAMMA) ^ SEED_SALT;
    let first = SPLITMIX64_FROM_1234567[0];
    for (i, want) in SPLITMIX64_FROM_1234567.iter().enumerate().skip(1) {
        let offset = first ^ state.wrapping_add((i as u64 + 1).wrapping_mul(GAMMA));
        assert_eq!(api::sampling_draw(seed, offset), (want >> 40) as u32, "draw for output {i}");
    }
}
