//! The experts' first-order training kernels (ruDNN section 12): the combine's gradients
//! ([`moe_combine_grad_rows`], [`moe_combine_grad_weights`]), the SwiGLU experts' data gradients
//! ([`moe_expert_grad_act`], [`moe_expert_grad_input`]) and their weight gradients
//! ([`moe_expert_grad_weight`]); between the tensor-core backward's GEMMs
//! ([`super::expert_training_tc`]), the SwiGLU's ([`moe_expert_grad_swiglu`]). The dispatch's
//! backward is the combine kernel with unit weights (see `DispatchedTokens::dispatch_backward`).
//!
//! Every sum is `f32` fused multiply-adds in a fixed order (rows, `h` or `i` ascending), rounded
//! once, so the results depend only on the inputs. A dispatched row's expert is found by a
//! pass over `offsets` (the same address for every thread of a block: a broadcast). The host
//! bounds every element index of every buffer by `u32`.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use crate::blocks::{load_f32, row_ptr, store_from_f32, warp_reduce, Combine};

/// Threads per block of every kernel here.
pub const GRAD_THREADS: u32 = 256;
/// Most blocks along `y` (rows); more rows loop.
pub const GRAD_MAX_ROW_BLOCKS: u32 = 65535;
/// Warps per block of the plane-parallel weight gradient (one entry each).
pub const PLANE_WARPS: u32 = GRAD_THREADS / 32;

/// A kernel over rows of one float dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertGradConfig {
    pub dtype: ScalarType,
}

impl ExpertGradConfig {
    /// `moe_combine_grad_rows.bf16`.
    pub fn rows_id(&self) -> String {
        format!("moe_combine_grad_rows.{}", self.dtype)
    }

    /// `moe_expert_grad_act.bf16`.
    pub fn act_id(&self) -> String {
        format!("moe_expert_grad_act.{}", self.dtype)
    }

    /// `moe_expert_grad_swiglu.bf16`.
    pub fn swiglu_id(&self) -> String {
        format!("moe_expert_grad_swiglu.{}", self.dtype)
    }
}

/// The rows' gradient kernel: the dtype, and whether gate and up are one fused `[E, 2I, H]`
/// tensor (else two `[E, I, H]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertGradInputConfig {
    pub dtype: ScalarType,
    pub fused: bool,
}

impl ExpertGradInputConfig {
    /// `moe_expert_grad_input.bf16.fused` or `.split`.
    pub fn id(&self) -> String {
        format!("moe_expert_grad_input.{}.{}", self.dtype, if self.fused { "fused" } else { "split" })
    }
}

/// The routing weights' gradient kernel: the rows' dtype, and whether a warp (plane) reduces
/// each dot product (else one thread sums it in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CombineGradWeightsConfig {
    pub dtype: ScalarType,
    pub plane: bool,
}

impl CombineGradWeightsConfig {
    /// `moe_combine_grad_weights.bf16.plane` or `.serial`.
    pub fn id(&self) -> String {
        format!("moe_combine_grad_weights.{}.{}", self.dtype, if self.plane { "plane" } else { "serial" })
    }
}

/// The per-expert weight gradient `Σ_rows aᵀ b`: the dtypes of `a` and `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertGradWeightConfig {
    pub a: ScalarType,
    pub b: ScalarType,
}

impl ExpertGradWeightConfig {
    /// `moe_expert_grad_weight.f32.bf16`.
    pub fn id(&self) -> String {
        format!("moe_expert_grad_weight.{}.{}", self.a, self.b)
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_combine_grad_rows`], in order.
    pub struct CombineGradRowsParams, CombineGradRowsValues for ExpertGradConfig as cfg {
        grad_output: tensor(cfg.dtype),
        slot_rows: tensor(ScalarType::U32),
        slot_weights: tensor(ScalarType::F32),
        grad_rows: tensor(cfg.dtype),
        entries: scalar(u32),
        top_k: scalar(u32),
        hidden: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_combine_grad_weights`], in order.
    pub struct CombineGradWeightsParams, CombineGradWeightsValues for CombineGradWeightsConfig as cfg {
        expert_out: tensor(cfg.dtype),
        grad_output: tensor(cfg.dtype),
        slot_rows: tensor(ScalarType::U32),
        grad_weights: tensor(ScalarType::F32),
        entries: scalar(u32),
        top_k: scalar(u32),
        hidden: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_expert_grad_act`], in order.
    pub struct ExpertGradActParams, ExpertGradActValues for ExpertGradConfig as cfg {
        grad_out: tensor(cfg.dtype),
        gate_up: tensor(cfg.dtype),
        down: tensor(cfg.dtype),
        offsets: tensor(ScalarType::U32),
        grad_gate_up: tensor(ScalarType::F32),
        rows: scalar(u32),
        experts: scalar(u32),
        hidden: scalar(u32),
        inter: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_expert_grad_swiglu`], in order.
    pub struct ExpertGradSwiGluParams, ExpertGradSwiGluValues for ExpertGradConfig as cfg {
        grad_act: tensor(ScalarType::F32),
        gate_up: tensor(cfg.dtype),
        grad_gate_up: tensor(cfg.dtype),
        rows: scalar(u32),
        inter: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_expert_grad_input`] for split gate and up, in order.
    pub struct ExpertGradInputParams, ExpertGradInputValues for ExpertGradInputConfig as cfg {
        grad_gate_up: tensor(ScalarType::F32),
        gate: tensor(cfg.dtype),
        up: tensor(cfg.dtype),
        offsets: tensor(ScalarType::U32),
        grad_input: tensor(cfg.dtype),
        rows: scalar(u32),
        experts: scalar(u32),
        hidden: scalar(u32),
        inter: scalar(u32),
        w_stride: scalar(u32),
        up_offset: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_expert_grad_input`] for a fused gate_up, in order.
    pub struct ExpertGradInputFusedParams, ExpertGradInputFusedValues for ExpertGradInputConfig as cfg {
        grad_gate_up: tensor(ScalarType::F32),
        gate_up: tensor(cfg.dtype),
        offsets: tensor(ScalarType::U32),
        grad_input: tensor(cfg.dtype),
        rows: scalar(u32),
        experts: scalar(u32),
        hidden: scalar(u32),
        inter: scalar(u32),
        w_stride: scalar(u32),
        up_offset: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_expert_grad_weight`], in order.
    pub struct ExpertGradWeightParams, ExpertGradWeightValues for ExpertGradWeightConfig as cfg {
        a: tensor(cfg.a),
        b: tensor(cfg.b),
        offsets: tensor(ScalarType::U32),
        out: tensor(ScalarType::F32),
        p: scalar(u32),
        q: scalar(u32),
        lda: scalar(u32),
        ldb: scalar(u32),
        a_offset: scalar(u32),
        b_offset: scalar(u32),
    }
}

/// The expert of dispatched row `r`: the number of experts whose rows end at or before it.
#[track_caller]
fn row_expert(b: &mut KernelBuilder, offsets: Value, experts: Value, r: Value) -> Value {
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    b.for_range(zero, experts, one, &[zero], |b, e, acc| {
        let one = b.const_u32(1);
        let next = b.add(e, one);
        let p = b.ptr_add(offsets, next);
        let end = b.load(p);
        let before = b.le(end, r);
        let zero = b.const_u32(0);
        let add = b.select(before, one, zero);
        vec![b.add(acc[0], add)]
    })[0]
}

/// Block rows `y, y + gridDim.y, ...` below `rows`, for the threads whose column `j < cols`.
#[track_caller]
fn for_rows(b: &mut KernelBuilder, rows: Value, cols: Value, body: impl FnOnce(&mut KernelBuilder, Value, Value)) {
    let j = b.global_thread_id_x();
    let in_range = b.lt(j, cols);
    b.if_then(in_range, |b| {
        let first = b.block_id_y();
        let step = b.special(SpecialReg::NctaidY);
        let mut body = Some(body);
        b.for_each(first, rows, step, |b, r| {
            if let Some(f) = body.take() {
                f(b, r, j)
            }
        });
    });
}

/// The expert rows' gradient from the combine's output gradient. Parameters: grad_output
/// (`[T, H]`), slot_rows (`u32 [T · top_k]`), slot_weights (`f32 [T · top_k]`), grad_rows (`[T ·
/// top_k, H]`, dispatched order), entries (`T · top_k`), top_k, hidden. Grid: `(ceil(H / 256),
/// min(T · top_k, 65535))`, block [`GRAD_THREADS`]; block row `y` takes entries `y, y +
/// gridDim.y, ...`. `grad_rows[slot_rows[i], j] = w[i] · grad_output[i / top_k, j]`, one rounding.
pub fn moe_combine_grad_rows(cfg: &ExpertGradConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.rows_id().replace('.', "_"));
    let CombineGradRowsValues { grad_output, slot_rows, slot_weights, grad_rows, entries, top_k, hidden } =
        CombineGradRowsParams::declare(&mut b, cfg);
    b.launch_bounds(GRAD_THREADS, None);
    for_rows(&mut b, entries, hidden, |b, i, j| {
        let p = b.ptr_add(slot_rows, i);
        let r = b.load(p);
        let w = load_f32(b, slot_weights, i);
        let t = b.div(i, top_k);
        let src = row_ptr(b, grad_output, t, hidden);
        let g = load_f32(b, src, j);
        let v = b.mul(w, g);
        let dst = row_ptr(b, grad_rows, r, hidden);
        store_from_f32(b, dst, j, v);
    });
    b.finish()
}

/// The routing weights' gradient: `grad_weights[i] = ⟨expert_out[slot_rows[i]], grad_output[i /
/// top_k]⟩` in `f32`. Parameters: expert_out (`[T · top_k, H]`), grad_output (`[T, H]`),
/// slot_rows, grad_weights (`f32 [T · top_k]`), entries, top_k, hidden.
///
/// Serial: a thread per entry (grid `ceil(N / 256)` blocks of [`GRAD_THREADS`]) sums `h =
/// 0, 1, ...` in order. Plane: a warp per entry (grid `ceil(N / 8)` blocks), lane `l` sums `h
/// ≡ l (mod 32)` in order, then a butterfly reduction across the warp.
pub fn moe_combine_grad_weights(cfg: &CombineGradWeightsConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let CombineGradWeightsValues { expert_out, grad_output, slot_rows, grad_weights, entries, top_k, hidden } =
        CombineGradWeightsParams::declare(&mut b, cfg);
    b.launch_bounds(GRAD_THREADS, None);
    let zero = b.const_u32(0);
    let (i, start, step) = if cfg.plane {
        let warp = b.thread_id_x();
        let five = b.const_u32(5);
        let warp = b.shr(warp, five);
        let block = b.block_id_x();
        let per = b.const_u32(PLANE_WARPS);
        let i = b.fma(block, per, warp);
        (i, b.lane_id(), b.const_u32(32))
    } else {
        (b.global_thread_id_x(), zero, b.const_u32(1))
    };
    let valid = b.lt(i, entries);
    // Entries past the end read nothing (an empty loop) but join the warp's reduction.
    let rt = b.if_else(
        valid,
        |b| {
            let p = b.ptr_add(slot_rows, i);
            let r = b.load(p);
            vec![r, b.div(i, top_k)]
        },
        |b| vec![b.const_u32(0), b.const_u32(0)],
    );
    let (r, t) = (rt[0], rt[1]);
    let end = b.select(valid, hidden, zero);
    let x_row = row_ptr(&mut b, expert_out, r, hidden);
    let g_row = row_ptr(&mut b, grad_output, t, hidden);
    let zero_f = b.const_f32(0.0);
    let mut sum = b.for_range(start, end, step, &[zero_f], |b, h, acc| {
        let x = load_f32(b, x_row, h);
        let g = load_f32(b, g_row, h);
        vec![b.fma(x, g, acc[0])]
    })[0];
    let mut writes = valid;
    if cfg.plane {
        sum = warp_reduce(&mut b, Combine::Sum, sum);
        let lane = b.lane_id();
        let first = b.eq(lane, zero);
        writes = b.and(valid, first);
    }
    b.if_then(writes, |b| {
        let p = b.ptr_add(grad_weights, i);
        b.store(p, sum);
    });
    b.finish()
}

/// The gate and up pre-activations' gradient of each dispatched row. Parameters: grad_out
/// (`[N, H]`, the experts' output gradient), gate_up (`[N, 2I]`, the forward's `g | u`), down
/// (`[E, H, I]`), offsets (`u32 [E + 1]`), grad_gate_up (`f32 [N, 2I]`), rows (`N`), experts,
/// hidden, inter. Grid: `(ceil(I / 256), min(N, 65535))`, block [`GRAD_THREADS`].
///
/// Row `r` of expert `e`: `a_i = Σ_h dy[r, h] · down[e, h, i]`, then with `σ = σ(g_i)`:
/// `dg_i = a_i · u_i · σ (1 + g_i (1 − σ))` and `du_i = a_i · g_i σ`, in `f32`.
pub fn moe_expert_grad_act(cfg: &ExpertGradConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.act_id().replace('.', "_"));
    let ExpertGradActValues { grad_out, gate_up, down, offsets, grad_gate_up, rows, experts, hidden, inter } =
        ExpertGradActParams::declare(&mut b, cfg);
    b.launch_bounds(GRAD_THREADS, None);
    for_rows(&mut b, rows, inter, |b, r, i| {
        let e = row_expert(b, offsets, experts, r);
        let hi = b.mul(hidden, inter);
        let base = b.mul(e, hi);
        let w = b.ptr_add(down, base);
        let dy = row_ptr(b, grad_out, r, hidden);
        let (zero, one) = (b.const_u32(0), b.const_u32(1));
        let zero_f = b.const_f32(0.0);
        let a = b.for_range(zero, hidden, one, &[zero_f], |b, h, acc| {
            let d = load_f32(b, dy, h);
            let at = b.fma(h, inter, i);
            let wv = load_f32(b, w, at);
            vec![b.fma(d, wv, acc[0])]
        })[0];
        let (dg, du) = swiglu_grads(b, a, gate_up, r, i, inter);
        let two_i = b.add(inter, inter);
        let out = row_ptr(b, grad_gate_up, r, two_i);
        let p = b.ptr_add(out, i);
        b.store(p, dg);
        let ui = b.add(inter, i);
        let p = b.ptr_add(out, ui);
        b.store(p, du);
    });
    b.finish()
}

/// The gate and up pre-activations' gradient `(dg, du)` at column `i` of row `r` from the
/// activation's gradient `a` there: with `σ = σ(g)`, `dg = a · u · σ (1 + g (1 − σ))` and `du =
/// a · g σ`, in `f32`, `g | u` read from `gate_up` (`[N, 2I]`).
#[track_caller]
fn swiglu_grads(b: &mut KernelBuilder, a: Value, gate_up: Value, r: Value, i: Value, inter: Value) -> (Value, Value) {
    let two_i = b.add(inter, inter);
    let gu = row_ptr(b, gate_up, r, two_i);
    let g = load_f32(b, gu, i);
    let ui = b.add(inter, i);
    let u = load_f32(b, gu, ui);
    let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
    let t = b.mul(g, neg_log2e);
    let ex = b.ex2(t);
    let one_f = b.const_f32(1.0);
    let denom = b.add(one_f, ex);
    let s = b.rcp(denom);
    let silu = b.mul(g, s);
    let rest = b.sub(one_f, s);
    let slope = b.fma(g, rest, one_f);
    let dsilu = b.mul(s, slope);
    let au = b.mul(a, u);
    (b.mul(au, dsilu), b.mul(a, silu))
}

/// The tensor-core backward's gate and up pre-activations' gradient: [`moe_expert_grad_act`]
/// after its dot product, which the grouped GEMM `moe_grouped_tc_nn` computed into `grad_act`
/// (`f32 [N, I]`). Parameters: grad_act, gate_up (`[N, 2I]`), grad_gate_up (`[N, 2I]`, rounded
/// to the dtype once: the next GEMMs' operand), rows (`N`), inter. Grid: `(ceil(I / 256), min(N,
/// 65535))`, block [`GRAD_THREADS`].
pub fn moe_expert_grad_swiglu(cfg: &ExpertGradConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.swiglu_id().replace('.', "_"));
    let ExpertGradSwiGluValues { grad_act, gate_up, grad_gate_up, rows, inter } =
        ExpertGradSwiGluParams::declare(&mut b, cfg);
    b.launch_bounds(GRAD_THREADS, None);
    for_rows(&mut b, rows, inter, |b, r, i| {
        let a_row = row_ptr(b, grad_act, r, inter);
        let a = load_f32(b, a_row, i);
        let (dg, du) = swiglu_grads(b, a, gate_up, r, i, inter);
        let two_i = b.add(inter, inter);
        let out = row_ptr(b, grad_gate_up, r, two_i);
        store_from_f32(b, out, i, dg);
        let ui = b.add(inter, i);
        store_from_f32(b, out, ui, du);
    });
    b.finish()
}

/// The dispatched rows' gradient. Parameters: grad_gate_up (`f32 [N, 2I]`), gate and up (expert
/// `e`'s gate at `e · w_stride`, its up at `e · w_stride + up_offset`, each `[I, H]`), offsets,
/// grad_input (`[N, H]`), rows, experts, hidden, inter, w_stride, up_offset; a fused kernel
/// takes one `gate_up` for both. Grid: `(ceil(H /
/// 256), min(N, 65535))`, block [`GRAD_THREADS`].
/// `dx[r, h] = Σ_i dg[r, i] · gate[e, i, h] + du[r, i] · up[e, i, h]`, `i` ascending.
pub fn moe_expert_grad_input(cfg: &ExpertGradInputConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let (grad_gate_up, gate, up, offsets, grad_input, [rows, experts, hidden, inter, w_stride, up_offset]) =
        if cfg.fused {
            let v = ExpertGradInputFusedParams::declare(&mut b, cfg);
            let scalars = [v.rows, v.experts, v.hidden, v.inter, v.w_stride, v.up_offset];
            (v.grad_gate_up, v.gate_up, v.gate_up, v.offsets, v.grad_input, scalars)
        } else {
            let v = ExpertGradInputParams::declare(&mut b, cfg);
            let scalars = [v.rows, v.experts, v.hidden, v.inter, v.w_stride, v.up_offset];
            (v.grad_gate_up, v.gate, v.up, v.offsets, v.grad_input, scalars)
        };
    b.launch_bounds(GRAD_THREADS, None);
    for_rows(&mut b, rows, hidden, |b, r, h| {
        let e = row_expert(b, offsets, experts, r);
        let base = b.mul(e, w_stride);
        let wg = b.ptr_add(gate, base);
        let up_base = b.add(base, up_offset);
        let wu = b.ptr_add(up, up_base);
        let two_i = b.add(inter, inter);
        let d = row_ptr(b, grad_gate_up, r, two_i);
        let (zero, one) = (b.const_u32(0), b.const_u32(1));
        let zero_f = b.const_f32(0.0);
        let acc = b.for_range(zero, inter, one, &[zero_f], |b, i, acc| {
            let dg = load_f32(b, d, i);
            let ui = b.add(inter, i);
            let du = load_f32(b, d, ui);
            let at = b.fma(i, hidden, h);
            let g = load_f32(b, wg, at);
            let u = load_f32(b, wu, at);
            let acc = b.fma(dg, g, acc[0]);
            vec![b.fma(du, u, acc)]
        })[0];
        let out = row_ptr(b, grad_input, r, hidden);
        store_from_f32(b, out, h, acc);
    });
    b.finish()
}

/// A weight gradient per expert: `out[e, p, q] = Σ_{r ∈ rows of e} a[r · lda + a_offset + p] ·
/// b[r · ldb + b_offset + q]`, rows ascending, `f32`. Parameters: a, b, offsets (`u32 [E + 1]`),
/// out (`f32 [E, P, Q]`), p (`P`), q (`Q`), lda, ldb, a_offset, b_offset. Grid: `(ceil(Q / 256),
/// min(P, 65535), E)`, block [`GRAD_THREADS`]; block row `y` takes `p = y, y + gridDim.y, ...`.
/// An expert without rows gets zeros.
pub fn moe_expert_grad_weight(cfg: &ExpertGradWeightConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let ExpertGradWeightValues { a, b: bm, offsets, out, p, q, lda, ldb, a_offset, b_offset } =
        ExpertGradWeightParams::declare(&mut b, cfg);
    b.launch_bounds(GRAD_THREADS, None);
    let e = b.special(SpecialReg::CtaidZ);
    let po = b.ptr_add(offsets, e);
    let start = b.load(po);
    let one = b.const_u32(1);
    let next = b.add(e, one);
    let po = b.ptr_add(offsets, next);
    let end = b.load(po);
    let a = b.ptr_add(a, a_offset);
    let bm = b.ptr_add(bm, b_offset);
    for_rows(&mut b, p, q, |b, pi, qi| {
        let one = b.const_u32(1);
        let zero_f = b.const_f32(0.0);
        let sum = b.for_range(start, end, one, &[zero_f], |b, r, acc| {
            let at = b.fma(r, lda, pi);
            let x = load_f32(b, a, at);
            let bt = b.fma(r, ldb, qi);
            let y = load_f32(b, bm, bt);
            vec![b.fma(x, y, acc[0])]
        })[0];
        let pq = b.mul(p, q);
        let base = b.mul(e, pq);
        let row = b.fma(pi, q, qi);
        let at = b.add(base, row);
        let ptr = b.ptr_add(out, at);
        b.store(ptr, sum);
    });
    b.finish()
}
