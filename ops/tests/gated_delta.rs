//! The gated delta rule on the device under test: the chunked and the token-by-token kernels
//! against each other and against a plain f64 reference written straight from the recurrence
//! (`S ← e^g S; d = β (v − Sᵀk); S ← S + k dᵀ; o = Sᵀ(q · scale)`), over lengths around the
//! chunk sizes, with and without an initial state, every float dtype, grouped key heads and
//! head dims that are neither equal nor powers of two; segments; and every error.

use crate::common::*;
use ruda_ops::api::{chunk_gated_delta_rule, gated_delta_rule, GatedDeltaError, GatedDeltaInput, GatedDeltaOutput};
use ruda_runtime::{DType, Device, Tensor};

/// One problem's host data, already rounded to the dtypes the device sees.
struct Data {
    b: usize,
    hk: usize,
    hv: usize,
    t: usize,
    k: usize,
    v: usize,
    dtype: DType,
    gate_dtype: DType,
    q: Vec<f32>,
    key: Vec<f32>,
    value: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
    init: Option<Vec<f32>>,
    scale: f32,
}

/// Rows of `n` values scaled to unit L2 norm (the caller's normalisation of q and k).
fn unit_rows(rng: &mut Rng, rows: usize, n: usize) -> Vec<f32> {
    let mut x = rng.vec(rows * n, -1.0, 1.0);
    for r in x.chunks_mut(n) {
        let norm = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-3);
        r.iter_mut().for_each(|v| *v /= norm);
    }
    x
}

impl Data {
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        dtype: DType,
        gate_dtype: DType,
        (b, hk, hv): (usize, usize, usize),
        t: usize,
        (k, v): (usize, usize),
        init: bool,
    ) -> Data {
        let mut rng = Rng::new(seed);
        let q = quantize(dtype, &unit_rows(&mut rng, b * hk * t, k));
        let key = quantize(dtype, &unit_rows(&mut rng, b * hk * t, k));
        let value = quantize(dtype, &rng.vec(b * hv * t * v, -1.0, 1.0));
        // β = sigmoid(·) ∈ (0, 1) and g = −A·softplus(·) < 0 in the model.
        let beta = quantize(gate_dtype, &rng.vec(b * hv * t, 0.05, 0.95));
        let g = quantize(gate_dtype, &rng.vec(b * hv * t, -1.0, -0.005));
        let init = init.then(|| rng.vec(b * hv * k * v, -0.5, 0.5));
        Data { b, hk, hv, t, k, v, dtype, gate_dtype, q, key, value, beta, g, init, scale: 1.0 / (k as f32).sqrt() }
    }

    /// `o [B, Hv, T, V]` and the final state `[B, Hv, K, V]`, in f64, token by token.
    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let (t_len, kd, vd) = (self.t, self.k, self.v);
        let mut out = vec![0f64; self.b * self.hv * t_len * vd];
        let mut fin = vec![0f64; self.b * self.hv * kd * vd];
        for bi in 0..self.b {
            for h in 0..self.hv {
                let kh = bi * self.hk + h / (self.hv / self.hk);
                let vh = bi * self.hv + h;
                let mut s: Vec<f64> = match &self.init {
                    Some(init) => init[vh * kd * vd..][..kd * vd].iter().map(|&x| x as f64).collect(),
                    None => vec![0.0; kd * vd],
                };
                for t in 0..t_len {
                    let q = &self.q[(kh * t_len + t) * kd..][..kd];
                    let k = &self.key[(kh * t_len + t) * kd..][..kd];
                    let v = &self.value[(vh * t_len + t) * vd..][..vd];
                    let decay = (self.g[vh * t_len + t] as f64).exp();
                    let beta = self.beta[vh * t_len + t] as f64;
                    s.iter_mut().for_each(|x| *x *= decay);
                    for j in 0..vd {
                        let sk: f64 = (0..kd).map(|a| s[a * vd + j] * k[a] as f64).sum();
                        let d = beta * (v[j] as f64 - sk);
                        for a in 0..kd {
                            s[a * vd + j] += k[a] as f64 * d;
                        }
                        let o: f64 = (0..kd).map(|a| s[a * vd + j] * q[a] as f64 * self.scale as f64).sum();
                        out[(vh * t_len + t) * vd + j] = o;
                    }
                }
                fin[vh * kd * vd..][..kd * vd].copy_from_slice(&s);
            }
        }
        (out, fin)
    }

    fn upload(&self, d: &Device) -> Tensors {
        let (b, hk, hv, t, k, v) = (self.b, self.hk, self.hv, self.t, self.k, self.v);
        Tensors {
            q: tensor(d, self.dtype, &self.q, &[b, hk, t, k]),
            key: tensor(d, self.dtype, &self.key, &[b, hk, t, k]),
            value: tensor(d, self.dtype, &self.value, &[b, hv, t, v]),
            beta: tensor(d, self.gate_dtype, &self.beta, &[b, hv, t]),
            g: tensor(d, self.gate_dtype, &self.g, &[b, hv, t]),
            init: self.init.as_ref().map(|s| tensor(d, DType::F32, s, &[b, hv, k, v])),
            scale: self.scale,
        }
    }
}

struct Tensors {
    q: Tensor,
    key: Tensor,
    value: Tensor,
    beta: Tensor,
    g: Tensor,
    init: Option<Tensor>,
    scale: f32,
}

impl Tensors {
    fn input(&self) -> GatedDeltaInput<'_> {
        GatedDeltaInput {
            query: &self.q,
            key: &self.key,
            value: &self.value,
            beta: &self.beta,
            log_decay: &self.g,
            initial_state: self.init.as_ref(),
            query_scale: self.scale,
        }
    }
}

/// `chunk_size` `None`: the token-by-token kernel.
fn run(input: GatedDeltaInput<'_>, chunk_size: Option<usize>) -> Result<GatedDeltaOutput, GatedDeltaError> {
    match chunk_size {
        Some(c) => chunk_gated_delta_rule(input, c),
        None => gated_delta_rule(input),
    }
}

fn results(out: &GatedDeltaOutput) -> (Vec<f32>, Vec<f32>) {
    (out.output.to_f32_vec().expect("output"), out.final_state.to_vec::<f32>().expect("final state"))
}

/// Tolerances. The state stays O(1) (unit keys, β < 1, decays ≤ 1) and each step adds a few
/// f32 roundings per element over K terms, so after T steps the f32 error is a few
/// `T · K · 2⁻²⁴` at most; the `ex2.approx` decays add 2⁻²² relative each; the chunked form
/// reorders the same sums (its triangular solve is well conditioned for β < 1 and unit keys).
/// `2e-4` absolute covers both with room for T = 200. The output is then rounded once to the
/// dtype: half an ulp of it relative, taken as one.
fn check(what: &str, d: &Data, out: &GatedDeltaOutput, want: &(Vec<f64>, Vec<f64>)) {
    let (o, s) = results(out);
    assert_close(&format!("{what}: output"), &o, &want.0, 2e-4, epsilon(d.dtype));
    assert_close(&format!("{what}: final state"), &s, &want.1, 2e-4, 1e-5);
}

#[test]
fn chunked_and_recurrent_match_the_reference() {
    let dev = device();
    for (i, dtype) in FLOAT_DTYPES.into_iter().enumerate() {
        for t in [1, 63, 64, 65, 200] {
            for init in [false, true] {
                let d = Data::new(10 * t as u64 + i as u64, dtype, dtype, (1, 1, 2), t, (24, 40), init);
                let want = d.reference();
                let ts = d.upload(&dev);
                let rec = run(ts.input(), None).expect("recurrent");
                check(&format!("{dtype} T={t} init={init} recurrent"), &d, &rec, &want);
                let (ro, rs) = results(&rec);
                for c in [16, 32, 64] {
                    let what = format!("{dtype} T={t} init={init} chunk={c}");
                    let chunked = run(ts.input(), Some(c)).expect("chunked");
                    check(&what, &d, &chunked, &want);
                    // Against the recurrent kernel: the same f32 state, two orders of summation.
                    let (co, cs) = results(&chunked);
                    let ro64: Vec<f64> = ro.iter().map(|&x| x as f64).collect();
                    let rs64: Vec<f64> = rs.iter().map(|&x| x as f64).collect();
                    assert_close(&format!("{what} vs recurrent: output"), &co, &ro64, 2e-4, 2.0 * epsilon(dtype));
                    assert_close(&format!("{what} vs recurrent: state"), &cs, &rs64, 2e-4, 1e-5);
                }
            }
        }
    }
}
