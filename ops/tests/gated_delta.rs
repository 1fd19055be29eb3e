//! The gated delta rule on the device under test: the chunked and the token-by-token kernels
//! against each other and against a plain f64 reference written straight from the recurrence
//! (`S ← e^g S; d = β (v − Sᵀk); S ← S + k dᵀ; o = Sᵀ(q · scale)`), over lengths around the
//! chunk sizes, with and without an initial state, every float dtype, grouped key heads and
//! head dims that are neither equal nor powers of two; segments; and every error.

use crate::common::*;
use ruda_ops::api::{
    chunk_gated_delta_rule, chunk_gated_delta_rule_varlen, chunk_gated_delta_rule_varlen_slots_into, gated_delta_rule,
    gated_delta_rule_slots_into, gated_delta_rule_varlen, GatedDeltaError, GatedDeltaInput, GatedDeltaOutput,
};
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

/// Tolerances. The state stays O(1) (unit keys, β < 1, decays ≤ 1: at most 0.5 here) and each
/// step rounds each state element a few times in f32, so after T ≤ 200 steps its error is at
/// most about `200 · 4 · 2⁻²⁴ · 0.5 ≈ 2.4e-5` if every rounding added up, and a fraction of that
/// as they do not (decays forget old errors, signs cancel); the `ex2.approx` decays add 2⁻²²
/// relative each; the chunked form reorders the same sums (its triangular solve is well
/// conditioned for β < 1 and unit keys). `1e-5` absolute is that bound with the cancellation
/// it always shows (runs here stay under 1e-6). The output is then rounded once to the dtype:
/// half an ulp relative, taken as one (two between two kernels).
const ABS: f64 = 1e-5;

fn check(what: &str, d: &Data, out: &GatedDeltaOutput, want: &(Vec<f64>, Vec<f64>)) {
    let (o, s) = results(out);
    assert_close(&format!("{what}: output"), &o, &want.0, ABS, epsilon(d.dtype));
    assert_close(&format!("{what}: final state"), &s, &want.1, ABS, 1e-5);
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
                    assert_close(&format!("{what} vs recurrent: output"), &co, &ro64, ABS, 2.0 * epsilon(dtype));
                    assert_close(&format!("{what} vs recurrent: state"), &cs, &rs64, ABS, 1e-5);
                }
            }
        }
    }
}

impl Data {
    /// Positions `t0..t1` of every sequence, starting from `init`.
    fn segment(&self, t0: usize, t1: usize, init: Option<Vec<f32>>) -> Data {
        let cut = |x: &[f32], heads: usize, width: usize| -> Vec<f32> {
            x.chunks(self.t * width).take(self.b * heads).flat_map(|h| h[t0 * width..t1 * width].to_vec()).collect()
        };
        Data {
            t: t1 - t0,
            q: cut(&self.q, self.hk, self.k),
            key: cut(&self.key, self.hk, self.k),
            value: cut(&self.value, self.hv, self.v),
            beta: cut(&self.beta, self.hv, 1),
            g: cut(&self.g, self.hv, 1),
            init,
            ..*self
        }
    }
}

#[test]
fn grouped_heads_batches_and_f32_gates() {
    let dev = device();
    // Two sequences, two key heads each read by two value heads; gates in f32 beside f16/bf16
    // tensors (the model computes them in f32).
    for (dtype, gate_dtype) in [(DType::F32, DType::F32), (DType::F16, DType::F32), (DType::BF16, DType::F32)] {
        let d = Data::new(7, dtype, gate_dtype, (2, 2, 4), 65, (24, 40), true);
        let want = d.reference();
        let ts = d.upload(&dev);
        check(&format!("{dtype}/{gate_dtype} recurrent"), &d, &run(ts.input(), None).expect("recurrent"), &want);
        // 24: a chunk size that is not a power of two (three chunks, the last padded).
        for c in [32, 24] {
            check(&format!("{dtype}/{gate_dtype} chunk {c}"), &d, &run(ts.input(), Some(c)).expect("chunked"), &want);
        }
    }
}

#[test]
fn head_dims_of_qwen35() {
    let dev = device();
    for dtype in [DType::F32, DType::BF16] {
        for init in [false, true] {
            let d = Data::new(11, dtype, dtype, (1, 1, 1), 5, (128, 128), init);
            let want = d.reference();
            let ts = d.upload(&dev);
            check(&format!("{dtype} K=V=128 recurrent"), &d, &run(ts.input(), None).expect("recurrent"), &want);
            for c in [4, 64] {
                check(&format!("{dtype} K=V=128 chunk {c}"), &d, &run(ts.input(), Some(c)).expect("chunked"), &want);
            }
        }
    }
}

#[test]
fn a_sequence_split_in_two_equals_the_whole() {
    let dev = device();
    let d = Data::new(3, DType::F32, DType::F32, (1, 1, 2), 100, (24, 40), true);
    let whole = run(d.upload(&dev).input(), Some(32)).expect("whole");
    let (wo, ws) = results(&whole);
    for (cut, first, second) in [(37, Some(32), None), (64, None, Some(16)), (1, Some(16), Some(32))] {
        let a = d.segment(0, cut, d.init.clone());
        let out_a = run(a.upload(&dev).input(), first).expect("first segment");
        let (oa, sa) = results(&out_a);
        let b = d.segment(cut, d.t, Some(sa));
        let out_b = run(b.upload(&dev).input(), second).expect("second segment");
        let (ob, sb) = results(&out_b);
        // The output per head: the first segment's rows, then the second's.
        let v = d.v;
        let joined: Vec<f64> = (0..d.hv)
            .flat_map(|h| {
                let first = oa[h * cut * v..(h + 1) * cut * v].iter();
                let second = ob[h * (d.t - cut) * v..(h + 1) * (d.t - cut) * v].iter();
                first.chain(second).map(|&x| x as f64).collect::<Vec<_>>()
            })
            .collect();
        let what = format!("split at {cut} ({first:?} then {second:?})");
        assert_close(&format!("{what}: output"), &wo, &joined, ABS, 1e-5);
        let sb64: Vec<f64> = sb.iter().map(|&x| x as f64).collect();
        assert_close(&format!("{what}: final state"), &ws, &sb64, ABS, 1e-5);
    }
}

#[test]
fn the_initial_state_is_never_written() {
    let dev = device();
    let d = Data::new(5, DType::BF16, DType::BF16, (1, 1, 2), 40, (24, 40), true);
    let ts = d.upload(&dev);
    let before = ts.init.as_ref().expect("an initial state").to_vec::<f32>().expect("read");
    for chunk in [None, Some(16)] {
        let out = run(ts.input(), chunk).expect("runs");
        let after = ts.init.as_ref().expect("an initial state").to_vec::<f32>().expect("read");
        assert_bits(&format!("initial state after {chunk:?}"), &after, &before);
        // The state did move, so an aliased write would have shown.
        let (_, fin) = results(&out);
        assert!(fin.iter().zip(&before).any(|(a, b)| a != b), "the final state equals the initial one");
    }
}

/// `f` must fail with a message containing `needle`, through both entry points.
fn expect_error(what: &str, input: GatedDeltaInput<'_>, chunk: usize, needle: &str) {
    for (form, r) in [("chunked", chunk_gated_delta_rule(input, chunk)), ("recurrent", gated_delta_rule(input))] {
        let message = match r {
            Ok(_) => panic!("{what} ({form}): accepted"),
            Err(e) => e.to_string(),
        };
        assert!(message.contains(needle), "{what} ({form}): `{message}` does not mention `{needle}`");
    }
}

#[test]
fn every_invalid_argument_is_an_error() {
    let dev = device();
    let d = Data::new(1, DType::BF16, DType::BF16, (1, 2, 4), 10, (8, 12), true);
    let ts = d.upload(&dev);
    let ok = ts.input();
    let t = |dtype: DType, shape: &[usize]| Tensor::zeros(&dev, dtype, shape).expect("alloc");
    let bf = DType::BF16;
    let u32_q = t(DType::U32, &[1, 2, 10, 8]);
    expect_error("a u32 query", GatedDeltaInput { query: &u32_q, ..ok }, 16, "u32");
    let f16_k = t(DType::F16, &[1, 2, 10, 8]);
    expect_error("an f16 key", GatedDeltaInput { key: &f16_k, ..ok }, 16, "`key` is f16");
    let f32_v = t(DType::F32, &[1, 4, 10, 12]);
    expect_error("an f32 value", GatedDeltaInput { value: &f32_v, ..ok }, 16, "`value` is f32");
    let rank3 = t(bf, &[2, 10, 8]);
    expect_error("a rank-3 query", GatedDeltaInput { query: &rank3, ..ok }, 16, "`query` must be");
    let short_k = t(bf, &[1, 2, 9, 8]);
    expect_error("a key of other tokens", GatedDeltaInput { key: &short_k, ..ok }, 16, "`key` is [1, 2, 9, 8]");
    let short_v = t(bf, &[1, 4, 9, 12]);
    expect_error("a value of other tokens", GatedDeltaInput { value: &short_v, ..ok }, 16, "`value` is [1, 4, 9, 12]");
    let three_heads = t(bf, &[1, 3, 10, 12]);
    expect_error("3 value heads on 2 key heads", GatedDeltaInput { value: &three_heads, ..ok }, 16, "must divide");
    let beta_shape = t(bf, &[1, 4, 9]);
    expect_error("a short beta", GatedDeltaInput { beta: &beta_shape, ..ok }, 16, "`beta` is [1, 4, 9]");
    let g_rank = t(bf, &[4, 10]);
    expect_error("a rank-2 log_decay", GatedDeltaInput { log_decay: &g_rank, ..ok }, 16, "`log_decay` must be");
    let f16_beta = t(DType::F16, &[1, 4, 10]);
    expect_error("an f16 beta", GatedDeltaInput { beta: &f16_beta, ..ok }, 16, "the query's bf16 or f32");
    let f32_g = t(DType::F32, &[1, 4, 10]);
    expect_error("gates of two dtypes", GatedDeltaInput { log_decay: &f32_g, ..ok }, 16, "must share a dtype");
    let bf_state = t(bf, &[1, 4, 8, 12]);
    expect_error(
        "a bf16 state",
        GatedDeltaInput { initial_state: Some(&bf_state), ..ok },
        16,
        "`initial_state` is bf16",
    );
    let small_state = t(DType::F32, &[1, 4, 12, 8]);
    expect_error(
        "a transposed state",
        GatedDeltaInput { initial_state: Some(&small_state), ..ok },
        16,
        "expected [1, 4, 8, 12]",
    );
    for scale in [f32::NAN, f32::INFINITY] {
        expect_error(
            "a non-finite scale",
            GatedDeltaInput { query_scale: scale, ..ok },
            16,
            "query_scale must be finite",
        );
    }
    let empty = t(bf, &[1, 2, 0, 8]);
    expect_error("no tokens", GatedDeltaInput { query: &empty, ..ok }, 16, "empty");
    let wide = t(bf, &[1, 2, 10, 16]);
    let strided = wide.narrow(3, 0, 8).expect("narrow");
    expect_error("a strided query", GatedDeltaInput { query: &strided, ..ok }, 16, "contiguous");
    // A K past the shared memory of a state tile: 4 · 512 · 32 = 64 KiB.
    let (big_q, big_v) = (t(bf, &[1, 1, 2, 512]), t(bf, &[1, 1, 2, 8]));
    let (big_b, big_g) = (t(bf, &[1, 1, 2]), t(bf, &[1, 1, 2]));
    let big = GatedDeltaInput {
        query: &big_q,
        key: &big_q,
        value: &big_v,
        beta: &big_b,
        log_decay: &big_g,
        initial_state: None,
        query_scale: 1.0,
    };
    expect_error("key_dim 512", big, 16, "shared memory");
    // The chunk size: positive, and its workspace within a block's shared memory.
    let chunked = |c: usize| chunk_gated_delta_rule(ok, c).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(chunked(0).contains("chunk_size must be positive"), "{}", chunked(0));
    for c in [128, 1 << 20, usize::MAX] {
        assert!(chunked(c).contains("4 · (C² + C)"), "chunk {c}: {}", chunked(c));
    }
    // Tensors on another device (only a GPU run has two).
    if dev.is_cuda() {
        let host_beta = Tensor::zeros(&Device::cpu(), bf, &[1, 4, 10]).expect("alloc");
        expect_error("a beta on the host", GatedDeltaInput { beta: &host_beta, ..ok }, 16, "different devices");
    }
    // The valid input still runs.
    run(ok, Some(16)).expect("the valid input");
}

/// `[H, T, D]` rows of one sequence as `[T, H, D]` (the packed layout).
fn to_token_major(x: &[f32], heads: usize, t: usize, d: usize) -> Vec<f32> {
    (0..t).flat_map(|ti| (0..heads).flat_map(move |h| x[(h * t + ti) * d..][..d].to_vec())).collect()
}

#[test]
fn packed_sequences_match_each_sequence_alone() {
    let dev = device();
    let lengths = [5, 0, 65, 1, 40];
    for (dtype, gate_dtype) in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        for init in [false, true] {
            let seqs: Vec<Data> = lengths
                .iter()
                .enumerate()
                .map(|(i, &t)| Data::new(100 + i as u64, dtype, gate_dtype, (1, 1, 2), t, (24, 40), init))
                .collect();
            let (hk, hv, k, v) = (1, 2, 24, 40);
            let total: usize = lengths.iter().sum();
            let pack = |f: &dyn Fn(&Data) -> Vec<f32>| seqs.iter().flat_map(f).collect::<Vec<f32>>();
            let q = pack(&|d| to_token_major(&d.q, hk, d.t, k));
            let key = pack(&|d| to_token_major(&d.key, hk, d.t, k));
            let value = pack(&|d| to_token_major(&d.value, hv, d.t, v));
            let beta = pack(&|d| to_token_major(&d.beta, hv, d.t, 1));
            let g = pack(&|d| to_token_major(&d.g, hv, d.t, 1));
            let state = init.then(|| pack(&|d| d.init.clone().unwrap_or_default()));
            let n = lengths.len();
            let mut cu = vec![0u32];
            lengths.iter().for_each(|&t| cu.push(cu.last().copied().unwrap_or(0) + t as u32));
            let (qt, kt) = (tensor(&dev, dtype, &q, &[total, hk, k]), tensor(&dev, dtype, &key, &[total, hk, k]));
            let vt = tensor(&dev, dtype, &value, &[total, hv, v]);
            let (bt, gt) = (tensor(&dev, gate_dtype, &beta, &[total, hv]), tensor(&dev, gate_dtype, &g, &[total, hv]));
            let st = state.as_ref().map(|s| tensor(&dev, DType::F32, s, &[n, hv, k, v]));
            let cut = Tensor::from_slice(&dev, &cu, &[n + 1]).expect("cu_seqlens");
            let input = GatedDeltaInput {
                query: &qt,
                key: &kt,
                value: &vt,
                beta: &bt,
                log_decay: &gt,
                initial_state: st.as_ref(),
                query_scale: seqs[0].scale,
            };
            // Each sequence's reference, packed the same way.
            let refs: Vec<(Vec<f64>, Vec<f64>)> = seqs.iter().map(Data::reference).collect();
            let want_out: Vec<f64> = seqs
                .iter()
                .zip(&refs)
                .flat_map(|(d, r)| {
                    (0..d.t).flat_map(move |ti| (0..hv).flat_map(move |h| r.0[(h * d.t + ti) * v..][..v].to_vec()))
                })
                .collect();
            let want_state: Vec<f64> = refs.iter().flat_map(|r| r.1.clone()).collect();
            for chunk in [None, Some(16), Some(64)] {
                let out = match chunk {
                    Some(c) => chunk_gated_delta_rule_varlen(input, &cut, c),
                    None => gated_delta_rule_varlen(input, &cut),
                }
                .expect("packed");
                assert_eq!(out.output.shape(), &[total, hv, v]);
                let (o, s) = results(&out);
                let what = format!("{dtype}/{gate_dtype} init={init} packed {chunk:?}");
                assert_close(&format!("{what}: output"), &o, &want_out, ABS, epsilon(dtype));
                assert_close(&format!("{what}: final state"), &s, &want_state, ABS, 1e-5);
            }
        }
    }
}

#[test]
fn invalid_cu_seqlens_are_errors() {
    let dev = device();
    let (total, hv, k, v) = (6, 2, 8, 12);
    let t = |dtype: DType, shape: &[usize]| Tensor::zeros(&dev, dtype, shape).expect("alloc");
    let (q, key, val) = (t(DType::F32, &[total, 1, k]), t(DType::F32, &[total, 1, k]), t(DType::F32, &[total, hv, v]));
    let (beta, g) = (t(DType::F32, &[total, hv]), t(DType::F32, &[total, hv]));
    let state = t(DType::F32, &[3, hv, k, v]);
    let input = GatedDeltaInput {
        query: &q,
        key: &key,
        value: &val,
        beta: &beta,
        log_decay: &g,
        initial_state: None,
        query_scale: 1.0,
    };
    let cu = |xs: &[u32]| Tensor::from_slice(&dev, xs, &[xs.len()]).expect("cu_seqlens");
    let cases: [(&str, Tensor, &str); 5] = [
        ("starting at 1", cu(&[1, 6]), "must start at 0"),
        ("decreasing", cu(&[0, 4, 3, 6]), "decreases at entry 2"),
        ("ending short", cu(&[0, 5]), "ends at 5"),
        ("one entry", cu(&[0]), "sequences + 1 >= 2"),
        ("f32", Tensor::from_slice(&dev, &[0f32, 6.0], &[2]).expect("f32"), "`cu_seqlens` is f32"),
    ];
    for (what, c, needle) in cases {
        for r in [chunk_gated_delta_rule_varlen(input, &c, 16), gated_delta_rule_varlen(input, &c)] {
            let message = r.err().map(|e| e.to_string()).unwrap_or_else(|| panic!("cu_seqlens {what}: accepted"));
            assert!(message.contains(needle), "cu_seqlens {what}: `{message}` does not mention `{needle}`");
        }
    }
    // One state per sequence: three states for two sequences is an error.
    let two = cu(&[0, 2, 6]);
    let three_states = GatedDeltaInput { initial_state: Some(&state), ..input };
    let message = gated_delta_rule_varlen(three_states, &two).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("expected [2, 2, 8, 12]"), "{message}");
    // The dense layout's rank is an error here.
    let dense_q = t(DType::F32, &[1, 1, total, k]);
    let message = gated_delta_rule_varlen(GatedDeltaInput { query: &dense_q, ..input }, &two)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(message.contains("[tokens, key_heads, key_dim]"), "{message}");
    gated_delta_rule_varlen(input, &two).expect("the valid input");
}

/// A pool of `slots` states `[slots, hv, k, v]`: random where a sequence starts from it, and a
/// sentinel elsewhere (the unused slots, checked untouched).
fn pool_with(rng: &mut Rng, slots: usize, per_slot: usize) -> Vec<f32> {
    let mut pool = rng.vec(slots * per_slot, -0.5, 0.5);
    pool.iter_mut().step_by(7).for_each(|x| *x = 7.25);
    pool
}

/// Packed prefill over a pool: ragged lengths around the chunk (1, 63, 64, 65, and an empty
/// sequence), slots out of order, every float dtype; the output and the slots used equal each
/// sequence's f64 reference and the unpooled packed form, the other slots stay as they were.
#[test]
fn chunked_prefill_over_a_pool_matches_the_reference() {
    let dev = device();
    let lengths = [63, 1, 0, 65, 64];
    let slot_of: [u32; 5] = [5, 0, 3, 6, 2];
    let (slots, hk, hv, k, v) = (8, 1, 2, 24, 40);
    let per_slot = hv * k * v;
    for (i, dtype) in FLOAT_DTYPES.into_iter().enumerate() {
        let mut rng = Rng::new(700 + i as u64);
        let pool0 = pool_with(&mut rng, slots, per_slot);
        let seqs: Vec<Data> = lengths
            .iter()
            .enumerate()
            .map(|(n, &t)| {
                let mut d = Data::new(300 + n as u64, dtype, DType::F32, (1, hk, hv), t, (k, v), false);
                let s = slot_of[n] as usize;
                d.init = Some(pool0[s * per_slot..][..per_slot].to_vec());
                d
            })
            .collect();
        let total: usize = lengths.iter().sum();
        let pack = |f: &dyn Fn(&Data) -> Vec<f32>| seqs.iter().flat_map(f).collect::<Vec<f32>>();
        let q = tensor(&dev, dtype, &pack(&|d| to_token_major(&d.q, hk, d.t, k)), &[total, hk, k]);
        let key = tensor(&dev, dtype, &pack(&|d| to_token_major(&d.key, hk, d.t, k)), &[total, hk, k]);
        let value = tensor(&dev, dtype, &pack(&|d| to_token_major(&d.value, hv, d.t, v)), &[total, hv, v]);
        let beta = tensor(&dev, DType::F32, &pack(&|d| to_token_major(&d.beta, hv, d.t, 1)), &[total, hv]);
        let g = tensor(&dev, DType::F32, &pack(&|d| to_token_major(&d.g, hv, d.t, 1)), &[total, hv]);
        let mut cu = vec![0u32];
        lengths.iter().for_each(|&t| cu.push(cu.last().copied().unwrap_or(0) + t as u32));
        let cut = Tensor::from_slice(&dev, &cu, &[cu.len()]).expect("cu_seqlens");
        let slot_t = Tensor::from_slice(&dev, &slot_of, &[slot_of.len()]).expect("state_slots");
        let input = GatedDeltaInput {
            query: &q,
            key: &key,
            value: &value,
            beta: &beta,
            log_decay: &g,
            initial_state: None,
            query_scale: seqs[0].scale,
        };
        let refs: Vec<(Vec<f64>, Vec<f64>)> = seqs.iter().map(Data::reference).collect();
        let want_out: Vec<f64> = seqs
            .iter()
            .zip(&refs)
            .flat_map(|(d, r)| {
                (0..d.t).flat_map(move |ti| (0..hv).flat_map(move |h| r.0[(h * d.t + ti) * v..][..v].to_vec()))
            })
            .collect();
        let mut want_pool: Vec<f64> = pool0.iter().map(|&x| x as f64).collect();
        for (n, r) in refs.iter().enumerate() {
            want_pool[slot_of[n] as usize * per_slot..][..per_slot].copy_from_slice(&r.1);
        }
        // The unpooled form from the same states.
        let gathered = pack(&|d| d.init.clone().unwrap_or_default());
        let init = tensor(&dev, DType::F32, &gathered, &[lengths.len(), hv, k, v]);
        let unpooled = chunk_gated_delta_rule_varlen(GatedDeltaInput { initial_state: Some(&init), ..input }, &cut, 64)
            .expect("unpooled");
        for chunk in [16, 64] {
            let pool = tensor(&dev, DType::F32, &pool0, &[slots, hv, k, v]);
            let out = Tensor::zeros(&dev, dtype, &[total, hv, v]).expect("output");
            let stream = dev.default_stream();
            chunk_gated_delta_rule_varlen_slots_into(&stream, input, &cut, &cu, chunk, &pool, &slot_t, &out)
                .expect("pooled prefill");
            let what = format!("{dtype} pooled prefill, chunks of {chunk}");
            let o = out.to_f32_vec().expect("output");
            assert_close(&format!("{what}: output"), &o, &want_out, ABS, epsilon(dtype));
            let u = unpooled.output.to_f32_vec().expect("unpooled output");
            let u64: Vec<f64> = u.iter().map(|&x| x as f64).collect();
            assert_close(&format!("{what}: output against the unpooled form"), &o, &u64, ABS, 2.0 * epsilon(dtype));
            let got_pool = pool.to_vec::<f32>().expect("pool");
            for s in 0..slots {
                let range = s * per_slot..(s + 1) * per_slot;
                if slot_of.contains(&(s as u32)) {
                    assert_close(&format!("{what}: slot {s}"), &got_pool[range.clone()], &want_pool[range], ABS, 1e-5);
                } else {
                    assert_eq!(&got_pool[range.clone()], &pool0[range], "{what}: unused slot {s} was written");
                }
            }
        }
    }
}

/// Decode over a pool, three steps in a row: each step's outputs and the slots after the last
/// equal each sequence's f64 reference over three tokens (the pool carries the state between
/// steps in place); unused slots untouched.
#[test]
fn decode_over_a_pool_matches_the_reference() {
    let dev = device();
    let slot_of: [u32; 3] = [4, 1, 2];
    let (slots, hk, hv, k, v, steps) = (6, 2, 4, 24, 40, 3);
    let per_slot = hv * k * v;
    for (i, dtype) in FLOAT_DTYPES.into_iter().enumerate() {
        let mut rng = Rng::new(800 + i as u64);
        let pool0 = pool_with(&mut rng, slots, per_slot);
        let seqs: Vec<Data> = (0..slot_of.len())
            .map(|n| {
                let mut d = Data::new(400 + n as u64, dtype, DType::F32, (1, hk, hv), steps, (k, v), false);
                d.init = Some(pool0[slot_of[n] as usize * per_slot..][..per_slot].to_vec());
                d
            })
            .collect();
        let refs: Vec<(Vec<f64>, Vec<f64>)> = seqs.iter().map(Data::reference).collect();
        let pool = tensor(&dev, DType::F32, &pool0, &[slots, hv, k, v]);
        let slot_t = Tensor::from_slice(&dev, &slot_of, &[slot_of.len()]).expect("state_slots");
        let n = seqs.len();
        let out = Tensor::zeros(&dev, dtype, &[n, hv, v]).expect("output");
        let stream = dev.default_stream();
        for t in 0..steps {
            // Token t of every sequence: `[N, H, D]`.
            let at = |x: &dyn Fn(&Data) -> &Vec<f32>, heads: usize, width: usize| -> Vec<f32> {
                seqs.iter()
                    .flat_map(|d| (0..heads).flat_map(move |h| x(d)[(h * steps + t) * width..][..width].to_vec()))
                    .collect()
            };
            let q = tensor(&dev, dtype, &at(&|d| &d.q, hk, k), &[n, hk, k]);
            let key = tensor(&dev, dtype, &at(&|d| &d.key, hk, k), &[n, hk, k]);
            let value = tensor(&dev, dtype, &at(&|d| &d.value, hv, v), &[n, hv, v]);
            let beta = tensor(&dev, DType::F32, &at(&|d| &d.beta, hv, 1), &[n, hv]);
            let g = tensor(&dev, DType::F32, &at(&|d| &d.g, hv, 1), &[n, hv]);
            let input = GatedDeltaInput {
                query: &q,
                key: &key,
                value: &value,
                beta: &beta,
                log_decay: &g,
                initial_state: None,
                query_scale: seqs[0].scale,
            };
            gated_delta_rule_slots_into(&stream, input, &pool, &slot_t, &out).expect("pooled decode");
            let want: Vec<f64> =
                refs.iter().flat_map(|r| (0..hv).flat_map(move |h| r.0[(h * steps + t) * v..][..v].to_vec())).collect();
            let o = out.to_f32_vec().expect("output");
            assert_close(&format!("{dtype} pooled decode step {t}: output"), &o, &want, ABS, epsilon(dtype));
        }
        let got_pool = pool.to_vec::<f32>().expect("pool");
        for s in 0..slots {
            let range = s * per_slot..(s + 1) * per_slot;
            match slot_of.iter().position(|&x| x as usize == s) {
                Some(n) => assert_close(&format!("{dtype} decode: slot {s}"), &got_pool[range], &refs[n].1, ABS, 1e-5),
                None => {
                    assert_eq!(&got_pool[range.clone()], &pool0[range], "{dtype} decode: unused slot {s} was written")
                }
            }
        }
    }
}

#[test]
fn invalid_pool_arguments_are_errors() {
    let dev = device();
    let (n, hv, k, v) = (2, 2, 8, 12);
    let t = |dtype: DType, shape: &[usize]| Tensor::zeros(&dev, dtype, shape).expect("alloc");
    let (q, key, val) = (t(DType::F32, &[n, 1, k]), t(DType::F32, &[n, 1, k]), t(DType::F32, &[n, hv, v]));
    let (beta, g) = (t(DType::F32, &[n, hv]), t(DType::F32, &[n, hv]));
    let state = t(DType::F32, &[n, hv, k, v]);
    let input = GatedDeltaInput {
        query: &q,
        key: &key,
        value: &val,
        beta: &beta,
        log_decay: &g,
        initial_state: None,
        query_scale: 1.0,
    };
    let stream = dev.default_stream();
    let pool = t(DType::F32, &[3, hv, k, v]);
    let slots = Tensor::from_slice(&dev, &[2u32, 0], &[2]).expect("slots");
    let out = t(DType::F32, &[n, hv, v]);
    let expect = |r: Result<(), GatedDeltaError>, needle: &str| {
        let message = r.err().map(|e| e.to_string()).unwrap_or_else(|| panic!("accepted; expected `{needle}`"));
        assert!(message.contains(needle), "`{message}` does not mention `{needle}`");
    };
    let with_state = GatedDeltaInput { initial_state: Some(&state), ..input };
    expect(gated_delta_rule_slots_into(&stream, with_state, &pool, &slots, &out), "`initial_state` must be None");
    let bad_pool = t(DType::F32, &[3, hv, k + 1, v]);
    expect(gated_delta_rule_slots_into(&stream, input, &bad_pool, &slots, &out), "`state_pool` is [3, 2, 9, 12]");
    let half_pool = t(DType::F16, &[3, hv, k, v]);
    expect(gated_delta_rule_slots_into(&stream, input, &half_pool, &slots, &out), "`state_pool` is f16");
    let f32_slots = t(DType::F32, &[2]);
    expect(gated_delta_rule_slots_into(&stream, input, &pool, &f32_slots, &out), "`state_slots` is f32");
    let three = Tensor::from_slice(&dev, &[2u32, 0, 1], &[3]).expect("slots");
    expect(gated_delta_rule_slots_into(&stream, input, &pool, &three, &out), "state_slots");
    let bad_out = t(DType::F32, &[n, hv, v + 1]);
    expect(gated_delta_rule_slots_into(&stream, input, &pool, &slots, &bad_out), "output");
    let dense_q = t(DType::F32, &[n, 1, 1, k]);
    let dense = GatedDeltaInput { query: &dense_q, ..input };
    expect(gated_delta_rule_slots_into(&stream, dense, &pool, &slots, &out), "[sequences, key_heads, key_dim]");
    gated_delta_rule_slots_into(&stream, input, &pool, &slots, &out).expect("the valid decode");
    // Prefill: the host copy of cu_seqlens must match the device one in length.
    let cu = Tensor::from_slice(&dev, &[0u32, 1, 2], &[3]).expect("cu");
    expect(
        chunk_gated_delta_rule_varlen_slots_into(&stream, input, &cu, &[0, 2], 16, &pool, &slots, &out),
        "`cu_seqlens_host` has 2 entries",
    );
    expect(
        chunk_gated_delta_rule_varlen_slots_into(&stream, input, &cu, &[0, 1, 3], 16, &pool, &slots, &out),
        "ends at 3",
    );
    expect(
        chunk_gated_delta_rule_varlen_slots_into(&stream, input, &cu, &[0, 1, 2], 0, &pool, &slots, &out),
        "chunk_size",
    );
    chunk_gated_delta_rule_varlen_slots_into(&stream, input, &cu, &[0, 1, 2], 16, &pool, &slots, &out)
        .expect("the valid prefill");
}
