//! The gates of the gated delta rule from the `in_proj_b` / `in_proj_a` outputs, per token and
//! value head, in `f32` (as Qwen3.5's gated DeltaNet):
//!
//! ```text
//! beta = sigmoid(b)
//! g    = -exp(A_log[h]) · softplus(a + dt_bias[h])     softplus(v) = v when v > 20 (torch's threshold)
//! ```
//!
//! `softplus(v) = max(v, 0) + log1p(exp(-|v|))`, the same function without overflow;
//! `log1p(u)` is a series for `u < 1/32` (where `lg2(1 + u)` loses relative accuracy) and
//! `lg2(1 + u) · ln 2` above. One thread per element.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::load_f32;

/// Threads per block.
pub const GATES_THREADS: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GatesConfig {
    /// The dtype of `a` and `b`.
    pub dtype: ScalarType,
    /// The dtype of `A_log` and `dt_bias`: `f32` or `dtype`.
    pub params: ScalarType,
}

impl GatesConfig {
    /// `gated_delta_gates.bf16.f32` (inputs bf16, `A_log` and `dt_bias` f32).
    pub fn id(&self) -> String {
        format!("gated_delta_gates.{}.{}", self.dtype, self.params)
    }
}

crate::kernel_params! {
    /// The parameters of [`gated_delta_gates`], in order.
    pub struct GatesParams, GatesValues for GatesConfig as cfg {
        a: tensor(cfg.dtype),
        b: tensor(cfg.dtype),
        a_log: tensor(cfg.params),
        dt_bias: tensor(cfg.params),
        beta: tensor(ScalarType::F32),
        g: tensor(ScalarType::F32),
        n: scalar(u32),
        heads: scalar(u32),
    }
}

/// `e^v` as `2^(v · log2 e)`.
fn exp(b: &mut KernelBuilder, v: Value) -> Value {
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let t = b.mul(v, log2e);
    b.ex2(t)
}

/// `1 / (1 + e^-v)`.
fn sigmoid(b: &mut KernelBuilder, v: Value) -> Value {
    let nv = b.neg(v);
    let e = exp(b, nv);
    let one = b.const_f32(1.0);
    let d = b.add(one, e);
    b.div(one, d)
}

/// `log(1 + e^v)`, or `v` above 20.
fn softplus(b: &mut KernelBuilder, v: Value) -> Value {
    let av = b.abs(v);
    let nav = b.neg(av);
    let u = exp(b, nav);
    // u ∈ (0, 1]: below 1/32 the series u - u²/2 + u³/3 - u⁴/4 is within 2^-20 relative.
    let small = b.const_f32(1.0 / 32.0);
    let is_small = b.lt(u, small);
    let series = {
        let c4 = b.const_f32(-0.25);
        let c3 = b.const_f32(1.0 / 3.0);
        let c2 = b.const_f32(-0.5);
        let one = b.const_f32(1.0);
        let p = b.fma(c4, u, c3);
        let p = b.fma(p, u, c2);
        let p = b.fma(p, u, one);
        b.mul(p, u)
    };
    let direct = {
        let one = b.const_f32(1.0);
        let w = b.add(one, u);
        let l = b.lg2(w);
        let ln2 = b.const_f32(std::f32::consts::LN_2);
        b.mul(l, ln2)
    };
    let log1p = b.select(is_small, series, direct);
    let zero = b.const_f32(0.0);
    let pos = b.max(v, zero);
    let sp = b.add(pos, log1p);
    let threshold = b.const_f32(20.0);
    let above = b.gt(v, threshold);
    b.select(above, v, sp)
}

/// Parameters: a, b `[T, Hv]`, a_log, dt_bias `[Hv]`, beta, g (`f32 [T, Hv]`), n (`T · Hv`),
/// heads (`Hv`). Grid: `ceil(n / 256)` blocks of [`GATES_THREADS`].
pub fn gated_delta_gates(cfg: &GatesConfig) -> Result<Kernel, VerifyError> {
    let mut kb = KernelBuilder::new(cfg.id().replace('.', "_"));
    let b = &mut kb;
    let GatesValues { a, b: b_in, a_log, dt_bias, beta, g, n, heads } = GatesParams::declare(b, cfg);
    b.launch_bounds(GATES_THREADS, None);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let h = b.rem(i, heads);
        let bv = load_f32(b, b_in, i);
        let s = sigmoid(b, bv);
        let p = b.ptr_add(beta, i);
        b.store(p, s);
        let av = load_f32(b, a, i);
        let bias = load_f32(b, dt_bias, h);
        let v = b.add(av, bias);
        let sp = softplus(b, v);
        let al = load_f32(b, a_log, h);
        let decay = exp(b, al);
        let gv = b.mul(decay, sp);
        let gv = b.neg(gv);
        let p = b.ptr_add(g, i);
        b.store(p, gv);
    });
    kb.finish()
}
