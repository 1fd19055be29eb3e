//! Sampling one token per row of logits with temperature, top-k, top-p and min-p, reproducibly: every
//! step below is integer arithmetic or a correctly rounded float operation except one `ex2`
//! (PTX's `ex2.approx`), so a host reference given the same `ex2` results picks the same token.
//!
//! For a row `z` (NaN read as `-inf`), `scale = log2(e) / temperature` (computed on the host):
//!
//! 1. `m = max(z)`. Weight `e_i = 1` where `z_i == m` (so `+inf` and all-`-inf` rows work), else
//!    `ex2((z_i - m) · scale)`; then the fixed-point weight `w_i = trunc(e_i · 2^40)` (`u64`).
//! 2. `key_i` = the bits of `z_i` as an order-preserving `u32` (`-0` as `+0`).
//! 3. top-k (`0 < k < cols`): `t_k` = the largest key with `#{i : key_i ≥ t_k} ≥ k` (the k-th
//!    largest key; ties with it are all kept). Otherwise `t_k = 0`.
//! 4. top-p (`p < 1`): with `W = Σ_{key_i ≥ t_k} w_i` and `P = min(ceil(f64(W) · f64(p)), W)`
//!    (`f64` product of the rounded conversions, rounded up), `t_p` = the largest key with
//!    `Σ_{key_i ≥ t_p, key_i ≥ t_k} w_i ≥ P`: a token is kept when the mass of strictly larger
//!    keys is below `p` of the top-k mass (Hugging Face's rule, ties kept together). Else `t_p =
//!    t_k`.
//! 5. min-p (vLLM's, after top-p): `e_i` is exactly token `i`'s probability over the largest
//!    one's, so `e_i < min_p` (f32 compare) drops a token below `min_p` × the largest
//!    probability; the maximum (`e = 1`) always stays, and `min_p = 0` drops nothing. Kept:
//!    `key_i ≥ t_p` and `e_i ≥ min_p`; `S = Σ_kept w_i`. The draw `u` (24 bits, [`draw`]) gives `target =
//!    floor(S · u / 2^24)`; the token is the first index (in index order) whose inclusive prefix
//!    sum of kept weights exceeds `target`.
//!
//! The thresholds come from a radix select over the keys, 8 bits per pass, with per-block
//! histograms in shared memory built by integer atomics (exact, so the order of atomics does not
//! matter); weights are integers so every sum is exact in any order. One block per row: passes
//! over the row (max, 4 for top-k, 4 for top-p, one for the chunk sums) plus one chunk rescan.

use ruda_ir::{
    AtomicOp, CmpOp, Constant, Cvt, Kernel, KernelBuilder, Rounding, ScalarType, SharedId, ShflMode, Value,
    VerifyError, VoteMode,
};

use crate::blocks::{block_reduce, load_f32, order_key, row_ptr, shfl_u64, Combine};

/// Threads per sampling block; also the histogram's bin count and the number of chunks the
/// final pass splits a row into.
pub const SAMPLING_THREADS: u32 = 256;

/// `2^40`: the fixed-point scale of the weights.
pub const WEIGHT_SCALE: f32 = 1_099_511_627_776.0;

/// Constant the seed is mixed with before the offset.
pub const SEED_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SamplingConfig {
    pub dtype: ScalarType,
}

impl SamplingConfig {
    /// `sampling.bf16`.
    pub fn id(&self) -> String {
        format!("sampling.{}", self.dtype)
    }
}

/// SplitMix64's finaliser, a bijection on `u64`.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 24-bit uniform draw for `seed` and a row's `offset`: `mix64(mix64(seed ^ SEED_SALT) ^
/// offset) >> 40`, i.e. `u = draw / 2^24 ∈ [0, 1)`.
pub fn draw(seed: u64, offset: u64) -> u32 {
    (mix64(mix64(seed ^ SEED_SALT) ^ offset) >> 40) as u32
}

#[track_caller]
fn mix64_ir(b: &mut KernelBuilder, z: Value) -> Value {
    let steps: [(u32, u64); 2] = [(30, 0xbf58_476d_1ce4_e5b9), (27, 0x94d0_49bb_1331_11eb)];
    let mut z = z;
    for (shift, mul) in steps {
        let s = b.const_u32(shift);
        let t = b.shr(z, s);
        let x = b.xor(z, t);
        let m = b.constant(Constant::u64(mul));
        z = b.mul(x, m);
    }
    let s = b.const_u32(31);
    let t = b.shr(z, s);
    b.xor(z, t)
}

/// Everything the passes over a row share.
struct Row {
    row: Value,
    cols: Value,
    m: Value,
    scale: Value,
}

impl Row {
    /// `(key, weight)` of element `j`.
    #[track_caller]
    fn element(&self, b: &mut KernelBuilder, j: Value) -> (Value, Value) {
        let (key, _, w) = self.element_ratio(b, j);
        (key, w)
    }

    /// `(key, e, weight)` of element `j`: `e` is its probability over the largest one's.
    #[track_caller]
    fn element_ratio(&self, b: &mut KernelBuilder, j: Value) -> (Value, Value, Value) {
        let z = load_f32(b, self.row, j);
        let nan = b.cmp(CmpOp::Nan, z, z);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        let z = b.select(nan, ninf, z);
        let key = order_key(b, z);
        let d = b.sub(z, self.m);
        let t = b.mul(d, self.scale);
        let e = b.ex2(t);
        let at_max = b.eq(z, self.m);
        let one = b.const_f32(1.0);
        let e = b.select(at_max, one, e);
        let scale = b.const_f32(WEIGHT_SCALE);
        let fixed = b.mul(e, scale);
        (key, e, b.cvt(fixed, ScalarType::U64))
    }
}

/// The bin of a 256-bin `u64` histogram where the running sum from the top bin down first
/// reaches `need(total)`, given `above` already counted from higher bins of earlier passes.
/// Every warp computes it (from the same shared data) so all threads agree without a broadcast.
/// Returns `(bin, mass strictly above the bin including `above`, total of the histogram, need)`.
#[track_caller]
fn find_bin(
    b: &mut KernelBuilder,
    hist: Value,
    above: Value,
    need: impl FnOnce(&mut KernelBuilder, Value) -> Value,
) -> (Value, Value, Value, Value) {
    let lane = b.lane_id();
    let eight = b.const_u32(8);
    let base = b.mul(lane, eight);
    // Lane l sums bins 8l..8l+7, starting at bin 8l + l/2 (mod 8): read in plain order, the
    // 8-byte bins of a half-warp would sit in two banks (an 8-way conflict, found by `rudac
    // profile`); the rotation spreads them over all 32. Integer sums do not depend on the order.
    let one = b.const_u32(1);
    let skew = b.shr(lane, one);
    let seven = b.const_u32(7);
    let mut lane_sum = b.constant(Constant::u64(0));
    for j in 0..8 {
        let j = b.const_u32(j);
        let off = b.add(skew, j);
        let off = b.and(off, seven);
        let i = b.add(base, off);
        let p = b.ptr_add(hist, i);
        let v = b.load(p);
        lane_sum = b.add(lane_sum, v);
    }
    // Inclusive suffix sums over lanes: s_l = Σ_{l' ≥ l} lane_sum.
    let mut s = lane_sum;
    let thirty_two = b.const_u32(32);
    for d in [1, 2, 4, 8, 16] {
        let dv = b.const_u32(d);
        let other = shfl_u64(b, ShflMode::Down, s, dv);
        let src = b.add(lane, dv);
        let valid = b.lt(src, thirty_two);
        let sum = b.add(s, other);
        s = b.select(valid, sum, s);
    }
    let zero = b.const_u32(0);
    let total = shfl_u64(b, ShflMode::Idx, s, zero);
    let need = need(b, total);
    let reach = b.add(above, s);
    let ok = b.ge(reach, need);
    let ballot = b.vote(VoteMode::Ballot, ok);
    let lead = b.unary(ruda_ir::UnaryOp::Clz, ballot);
    let thirty_one = b.const_u32(31);
    let top_lane = b.sub(thirty_one, lead);
    let next_lane = b.add(top_lane, one);
    let next = shfl_u64(b, ShflMode::Idx, s, next_lane);
    let last = b.eq(top_lane, thirty_one);
    let zero64 = b.constant(Constant::u64(0));
    let next = b.select(last, zero64, next);
    // Walk the chosen lane's eight bins from the top.
    let mut acc = b.add(above, next);
    let mut bin = b.const_u32(0);
    let mut bin_above = acc;
    let mut found = b.const_pred(false);
    let top_base = b.mul(top_lane, eight);
    for j in (0..8).rev() {
        let off = b.const_u32(j);
        let i = b.add(top_base, off);
        let p = b.ptr_add(hist, i);
        let v = b.load(p);
        let next_acc = b.add(acc, v);
        let hit = b.ge(next_acc, need);
        let not_found = b.not(found);
        let first_hit = b.and(hit, not_found);
        bin = b.select(first_hit, i, bin);
        bin_above = b.select(first_hit, acc, bin_above);
        found = b.or(found, hit);
        acc = next_acc;
    }
    (bin, bin_above, total, need)
}

/// Radix-select the largest key `t` with `Σ_{key ≥ t} weight ≥ need` over the row. `weight`
/// maps `(key, w)` to the element's contribution (0 to leave it out). Four passes of 8 bits.
/// Returns `(t, need)` (`need` as computed from the first pass's total).
#[track_caller]
fn radix_select(
    b: &mut KernelBuilder,
    row: &Row,
    hist_id: SharedId,
    weight: impl Fn(&mut KernelBuilder, Value, Value) -> Value,
    need: impl FnOnce(&mut KernelBuilder, Value) -> Value,
) -> (Value, Value) {
    let tid = b.thread_id_x();
    let step = b.const_u32(SAMPLING_THREADS);
    let hist = b.shared_ptr(hist_id);
    let mut prefix = b.const_u32(0);
    let mut above = b.constant(Constant::u64(0));
    let mut need = Some(need);
    let mut need_value = above;
    for pass in 0..4u32 {
        let shift = 24 - 8 * pass;
        let hi_mask = if pass == 0 { 0 } else { !((1u32 << (shift + 8)) - 1) };
        let p = b.ptr_add(hist, tid);
        let zero64 = b.constant(Constant::u64(0));
        b.store(p, zero64);
        b.barrier();
        let mask = b.const_u32(hi_mask);
        let shift_v = b.const_u32(shift);
        let digit_mask = b.const_u32(0xff);
        b.for_each(tid, row.cols, step, |b, j| {
            let (key, w) = row.element(b, j);
            let contribution = weight(b, key, w);
            let high = b.and(key, mask);
            let in_prefix = b.eq(high, prefix);
            let zero64 = b.constant(Constant::u64(0));
            let nonzero = b.ne(contribution, zero64);
            let counts = b.and(in_prefix, nonzero);
            b.if_then(counts, |b| {
                let d = b.shr(key, shift_v);
                let d = b.and(d, digit_mask);
                let q = b.ptr_add(hist, d);
                b.atomic(AtomicOp::Add, q, contribution);
            });
        });
        b.barrier();
        let (bin, bin_above, _, n) = match need.take() {
            Some(f) => find_bin(b, hist, above, f),
            None => find_bin(b, hist, above, |_, _| need_value),
        };
        need_value = n;
        let digit = b.shl(bin, shift_v);
        prefix = b.or(prefix, digit);
        above = bin_above;
        // The histogram is zeroed next pass only after every warp has read it.
        b.barrier();
    }
    (prefix, need_value)
}

crate::kernel_params! {
    /// The parameters of [`sampling`] (the kernel), in order.
    pub struct SamplingKernelParams, SamplingValues for SamplingConfig as cfg {
        logits: tensor(cfg.dtype),
        out: tensor(ScalarType::U32),
        offsets: tensor(ScalarType::U64),
        cols: scalar(u32),
        scale: scalar(f32),
        top_k: scalar(u32),
        top_p: scalar(f32),
        seed: scalar(u64),
        min_p: scalar(f32),
    }
}

/// Parameters: logits `[rows, cols]`, out (`u32 [rows]`), offsets (`u64 [rows]`), cols (`u32`),
/// scale (`f32`, `log2(e) / temperature`), top_k (`u32`, 0 = off), top_p (`f32`, ≥ 1 = off),
/// seed (`u64`), min_p (`f32`, 0 = off). Grid: `rows` blocks of [`SAMPLING_THREADS`].
pub fn sampling(cfg: &SamplingConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let SamplingValues { logits, out, offsets, cols, scale, top_k, top_p, seed, min_p } =
        SamplingKernelParams::declare(&mut b, cfg);
    b.launch_bounds(SAMPLING_THREADS, None);
    let max_scratch = b.shared_array("max_partials", ScalarType::F32, SAMPLING_THREADS / 32);
    let count_hist = b.shared_array("count_hist", ScalarType::U64, SAMPLING_THREADS);
    let mass_hist = b.shared_array("mass_hist", ScalarType::U64, SAMPLING_THREADS);
    let scan_a = b.shared_array("scan_a", ScalarType::U64, SAMPLING_THREADS);
    let scan_b = b.shared_array("scan_b", ScalarType::U64, SAMPLING_THREADS);

    let row_id = b.block_id_x();
    let row = row_ptr(&mut b, logits, row_id, cols);
    let tid = b.thread_id_x();
    let step = b.const_u32(SAMPLING_THREADS);

    // 1. The row maximum (NaN read as -inf).
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let partial = b.for_range(tid, cols, step, &[ninf], |b, j, acc| {
        let z = load_f32(b, row, j);
        let nan = b.cmp(CmpOp::Nan, z, z);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        let z = b.select(nan, ninf, z);
        vec![b.max(acc[0], z)]
    })[0];
    let m = block_reduce(&mut b, Combine::MaxNan, partial, SAMPLING_THREADS, max_scratch);
    let r = Row { row, cols, m, scale };

    // 3. top-k threshold.
    let zero = b.const_u32(0);
    let k_on_low = b.gt(top_k, zero);
    let k_on_high = b.lt(top_k, cols);
    let k_on = b.and(k_on_low, k_on_high);
    let t_k = b.if_else(
        k_on,
        |b| {
            let need = b.cvt(top_k, ScalarType::U64);
            let one = b.constant(Constant::u64(1));
            let (t, _) = radix_select(b, &r, count_hist, |_, _, _| one, |_, _| need);
            vec![t]
        },
        |b| vec![b.const_u32(0)],
    )[0];

    // 4. top-p threshold over the top-k mass.
    let one_f = b.const_f32(1.0);
    let p_on = b.lt(top_p, one_f);
    let t = b.if_else(
        p_on,
        |b| {
            let weight = |b: &mut KernelBuilder, key: Value, w: Value| {
                let kept = b.ge(key, t_k);
                let zero64 = b.constant(Constant::u64(0));
                b.select(kept, w, zero64)
            };
            let need = |b: &mut KernelBuilder, total: Value| {
                let w = b.cvt(total, ScalarType::F64);
                let p = b.cvt(top_p, ScalarType::F64);
                let prod = b.mul(w, p);
                let need = b.cvt_with(prod, Cvt { to: ScalarType::U64, rounding: Some(Rounding::Rp), sat: false });
                // f64(W) may round above W; the threshold must stay reachable.
                b.min(need, total)
            };
            let (t, _) = radix_select(b, &r, mass_hist, weight, need);
            vec![t]
        },
        |_| vec![t_k],
    )[0];

    // 5. (min-p needs no pass: a threshold on `e`, which is relative to the row maximum.)
    // Chunk sums of kept weights, their block scan, the draw, and the chosen chunk's rescan.
    let chunk_size = {
        let last = b.const_u32(SAMPLING_THREADS - 1);
        let c = b.add(cols, last);
        b.div(c, step)
    };
    let begin = b.mul(tid, chunk_size);
    let begin = b.min(begin, cols);
    let end = b.add(begin, chunk_size);
    let end = b.min(end, cols);
    let kept_weight = |b: &mut KernelBuilder, j: Value| {
        let (key, e, w) = r.element_ratio(b, j);
        let kept = b.ge(key, t);
        let above_min = b.ge(e, min_p);
        let kept = b.and(kept, above_min);
        let zero64 = b.constant(Constant::u64(0));
        b.select(kept, w, zero64)
    };
    let zero64 = b.constant(Constant::u64(0));
    let one = b.const_u32(1);
    let mine = b.for_range(begin, end, one, &[zero64], |b, j, acc| {
        let w = kept_weight(b, j);
        vec![b.add(acc[0], w)]
    })[0];
    let (a_ptr, b_ptr) = (b.shared_ptr(scan_a), b.shared_ptr(scan_b));
    let p = b.ptr_add(a_ptr, tid);
    b.store(p, mine);
    b.barrier();
    let (mut cur, mut other) = (a_ptr, b_ptr);
    let mut d = 1;
    while d < SAMPLING_THREADS {
        let dv = b.const_u32(d);
        let p = b.ptr_add(cur, tid);
        let v = b.load(p);
        let has = b.ge(tid, dv);
        let add = b.if_else(
            has,
            |b| {
                let i = b.sub(tid, dv);
                let q = b.ptr_add(cur, i);
                vec![b.load(q)]
            },
            |b| vec![b.constant(Constant::u64(0))],
        )[0];
        let v = b.add(v, add);
        let q = b.ptr_add(other, tid);
        b.store(q, v);
        b.barrier();
        std::mem::swap(&mut cur, &mut other);
        d *= 2;
    }
    let p = b.ptr_add(cur, tid);
    let inclusive = b.load(p);
    let last = b.const_u32(SAMPLING_THREADS - 1);
    let p = b.ptr_add(cur, last);
    let total = b.load(p);
    let exclusive = b.sub(inclusive, mine);

    let salt = b.constant(Constant::u64(SEED_SALT));
    let s = b.xor(seed, salt);
    let s = mix64_ir(&mut b, s);
    let p = b.ptr_add(offsets, row_id);
    let offset = b.load(p);
    let s = b.xor(s, offset);
    let h = mix64_ir(&mut b, s);
    let forty = b.const_u32(40);
    let u24 = b.shr(h, forty);
    let u_scaled = b.shl(u24, forty);
    let target = b.mul_hi(total, u_scaled);
    let starts_below = b.le(exclusive, target);
    let ends_above = b.gt(inclusive, target);
    let chosen = b.and(starts_below, ends_above);
    b.if_then(chosen, |b| {
        let none = b.const_u32(u32::MAX);
        let found = b.for_range(begin, end, one, &[exclusive, none], |b, j, acc| {
            let w = kept_weight(b, j);
            let cum = b.add(acc[0], w);
            let crossed = b.gt(cum, target);
            let unset = b.eq(acc[1], none);
            let first = b.and(crossed, unset);
            vec![cum, b.select(first, j, acc[1])]
        })[1];
        let p = b.ptr_add(out, row_id);
        b.store(p, found);
    });
    b.finish()
}
