//! The full-attention output gate of Qwen3.5: `q_proj`'s output, viewed as `[T, H, 2·D]`, holds
//! per head the query (first half) and the gate (second half); [`split_heads_halves`] splits
//! it, and [`sigmoid_gate`] computes `attn · sigmoid(gate)` in `f32`, rounded once. One thread
//! per output element.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{load_f32, store_from_f32};

/// Threads per block.
pub const ATTN_GATE_THREADS: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnGateConfig {
    pub dtype: ScalarType,
}

impl AttnGateConfig {
    /// `sigmoid_gate.bf16`.
    pub fn gate_id(&self) -> String {
        format!("sigmoid_gate.{}", self.dtype)
    }

    /// `split_heads_halves.bf16`.
    pub fn split_id(&self) -> String {
        format!("split_heads_halves.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`sigmoid_gate`], in order.
    pub struct SigmoidGateParams, SigmoidGateValues for AttnGateConfig as cfg {
        x: tensor(cfg.dtype),
        gate: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        n: scalar(u32),
        cols: scalar(u32),
        gate_stride: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`split_heads_halves`], in order.
    pub struct SplitHalvesParams, SplitHalvesValues for AttnGateConfig as cfg {
        x: tensor(cfg.dtype),
        first: tensor(cfg.dtype),
        second: tensor(cfg.dtype),
        n: scalar(u32),
        half: scalar(u32),
    }
}

/// Parameters: x, gate, out (one shape `[rows, cols]`, `n` elements), n, cols, gate_stride
/// (elements from one row of `gate` to the next: the gate may be the second halves of `q_proj`'s
/// output, read in place). Grid: `ceil(n / 256)` blocks of [`ATTN_GATE_THREADS`].
pub fn sigmoid_gate(cfg: &AttnGateConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.gate_id().replace('.', "_"));
    let SigmoidGateValues { x, gate, out, n, cols, gate_stride } = SigmoidGateParams::declare(&mut b, cfg);
    b.launch_bounds(ATTN_GATE_THREADS, None);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let xv = load_f32(b, x, i);
        let row = b.div(i, cols);
        let col = b.rem(i, cols);
        let row64 = b.cvt(row, ScalarType::U64);
        let stride64 = b.cvt(gate_stride, ScalarType::U64);
        let col64 = b.cvt(col, ScalarType::U64);
        let at = b.fma(row64, stride64, col64);
        let gv = load_f32(b, gate, at);
        // x / (1 + e^-g), e^-g as 2^(-g · log2 e).
        let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
        let t = b.mul(gv, neg_log2e);
        let e = b.ex2(t);
        let one = b.const_f32(1.0);
        let d = b.add(one, e);
        let y = b.div(xv, d);
        store_from_f32(b, out, i, y);
    });
    b.finish()
}

/// Parameters: x `[rows, 2·half]`, first and second `[rows, half]` (`n = rows · half`
/// elements each), n, half. Grid: `ceil(n / 256)` blocks of [`ATTN_GATE_THREADS`]; thread `i`
/// copies element `i` of both halves (exact: no conversion).
pub fn split_heads_halves(cfg: &AttnGateConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.split_id().replace('.', "_"));
    let SplitHalvesValues { x, first, second, n, half } = SplitHalvesParams::declare(&mut b, cfg);
    b.launch_bounds(ATTN_GATE_THREADS, None);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let row = b.div(i, half);
        let col = b.rem(i, half);
        let row64 = b.cvt(row, ScalarType::U64);
        let half64 = b.cvt(half, ScalarType::U64);
        let two = b.const_u64(2);
        let width = b.mul(half64, two);
        let col64 = b.cvt(col, ScalarType::U64);
        let src = b.fma(row64, width, col64);
        let p = b.ptr_add(x, src);
        let q = b.load(p);
        let p = b.ptr_add(first, i);
        b.store(p, q);
        let src2 = b.add(src, half64);
        let p = b.ptr_add(x, src2);
        let k = b.load(p);
        let p = b.ptr_add(second, i);
        b.store(p, k);
    });
    b.finish()
}
