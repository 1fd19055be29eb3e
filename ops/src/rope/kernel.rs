//! Rotary position embedding in the rotate-half form of Hugging Face's `apply_rotary_pos_emb`,
//! reading `cos`/`sin` from a host-computed table `[positions, rotary_dim / 2]` (`f32`).
//!
//! For a head `x` of `head_dim` values and `h = rotary_dim / 2`, with `c = cos[pos, i]`,
//! `s = sin[pos, i]` and `i < h`:
//!
//! ```text
//! out[i]     = x[i]     · c - x[i + h] · s
//! out[i + h] = x[i + h] · c + x[i]     · s
//! out[j]     = x[j]            for rotary_dim ≤ j < head_dim (partial rotary)
//! ```
//!
//! rounded exactly as Hugging Face does in the model dtype: `c` and `s` are first rounded to the
//! dtype (its `cos.to(x.dtype)`), each product is rounded to the dtype, and so is their sum (for
//! `f32` every rounding is the identity). One block per token.

use ruda_ir::{Constant, Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{load_f32, round_to, store_from_f32};

/// Threads per RoPE block.
pub const ROPE_THREADS: u32 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RopeConfig {
    pub dtype: ScalarType,
    pub head_dim: u32,
    /// Leading dimensions of each head that rotate (even, at most `head_dim`).
    pub rotary_dim: u32,
}

impl RopeConfig {
    fn suffix(&self) -> String {
        let partial = if self.rotary_dim == self.head_dim { String::new() } else { format!(".r{}", self.rotary_dim) };
        format!("{}.d{}{partial}", self.dtype, self.head_dim)
    }

    /// `rope.bf16.d128`, `rope.bf16.d256.r64` (partial rotary).
    pub fn id(&self) -> String {
        format!("rope.{}", self.suffix())
    }

    /// `rope_kv_cache.bf16.d128`: the variant that appends to a KV cache.
    pub fn kv_cache_id(&self) -> String {
        format!("rope_kv_cache.{}", self.suffix())
    }
}

/// The table entries `(cos, sin)` for pair `i` at table row `pos`, rounded to the dtype; NaN
/// when `pos` is outside the table (it cannot be checked on the host without a sync).
#[track_caller]
fn cos_sin(
    b: &mut KernelBuilder,
    cfg: &RopeConfig,
    cos: Value,
    sin: Value,
    pos: Value,
    n_positions: Value,
    i: Value,
) -> (Value, Value) {
    let ok = b.lt(pos, n_positions);
    let zero = b.const_u32(0);
    let row = b.select(ok, pos, zero);
    let half = b.const_u32(cfg.rotary_dim / 2);
    let idx = b.fma(row, half, i);
    let c = load_f32(b, cos, idx);
    let s = load_f32(b, sin, idx);
    let nan = b.const_f32(f32::NAN);
    let c = b.select(ok, c, nan);
    let s = b.select(ok, s, nan);
    (round_to(b, cfg.dtype, c), round_to(b, cfg.dtype, s))
}

/// Rotate head `src` into `dst` (both pointing at the head's first element): pair slots
/// `slot < head_dim / 2` are spread over the block's threads.
#[track_caller]
#[allow(clippy::too_many_arguments)]
fn rotate_head(
    b: &mut KernelBuilder,
    cfg: &RopeConfig,
    src: Value,
    dst: Value,
    slot: Value,
    cos: Value,
    sin: Value,
    pos: Value,
    n_positions: Value,
) {
    let half = b.const_u32(cfg.rotary_dim / 2);
    let rotates = b.lt(slot, half);
    b.if_else(
        rotates,
        |b| {
            let (c, s) = cos_sin(b, cfg, cos, sin, pos, n_positions, slot);
            let j = b.add(slot, half);
            let x1 = load_f32(b, src, slot);
            let x2 = load_f32(b, src, j);
            let neg_x2 = b.neg(x2);
            let a = b.mul(x1, c);
            let a = round_to(b, cfg.dtype, a);
            let bb = b.mul(neg_x2, s);
            let bb = round_to(b, cfg.dtype, bb);
            let o1 = b.add(a, bb);
            let a = b.mul(x2, c);
            let a = round_to(b, cfg.dtype, a);
            let bb = b.mul(x1, s);
            let bb = round_to(b, cfg.dtype, bb);
            let o2 = b.add(a, bb);
            store_from_f32(b, dst, slot, o1);
            store_from_f32(b, dst, j, o2);
            vec![]
        },
        |b| {
            // Slot h + q passes through elements rotary_dim + 2q and + 2q + 1.
            let two = b.const_u32(2);
            let q = b.sub(slot, half);
            let base = b.const_u32(cfg.rotary_dim);
            let j = b.fma(q, two, base);
            copy(b, src, dst, j);
            let one = b.const_u32(1);
            let j1 = b.add(j, one);
            copy(b, src, dst, j1);
            vec![]
        },
    );
}

/// `dst[j] = src[j]`, bits unchanged.
#[track_caller]
fn copy(b: &mut KernelBuilder, src: Value, dst: Value, j: Value) {
    let p = b.ptr_add(src, j);
    let v = b.load(p);
    let q = b.ptr_add(dst, j);
    b.store(q, v);
}

crate::kernel_params! {
    /// The parameters of [`rope`], in order.
    pub struct RopeParams, RopeValues for RopeConfig as cfg {
        x: tensor(cfg.dtype),
        cos: tensor(ScalarType::F32),
        sin: tensor(ScalarType::F32),
        positions: tensor(ScalarType::U32),
        out: tensor(cfg.dtype),
        heads: scalar(u32),
        n_positions: scalar(u32),
    }
}

/// RoPE of `x [T, H, head_dim]` into `out` (same shape). Parameters: x, cos, sin (`f32`
/// `[P, rotary_dim / 2]`), positions (`u32 [T]`), out, heads, n_positions (`u32`). Grid: `T`
/// blocks of [`ROPE_THREADS`]. A position `≥ P` gives NaN in that token's rotated dimensions.
pub fn rope(cfg: &RopeConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let RopeValues { x, cos, sin, positions, out, heads, n_positions } = RopeParams::declare(&mut b, cfg);
    b.launch_bounds(ROPE_THREADS, None);

    let token = b.block_id_x();
    let p = b.ptr_add(positions, token);
    let pos = b.load(p);
    let d = b.const_u32(cfg.head_dim);
    let row_len = b.mul(heads, d);
    let token64 = b.cvt(token, ScalarType::U64);
    let row_len64 = b.cvt(row_len, ScalarType::U64);
    let row = b.mul(token64, row_len64);
    let x_row = b.ptr_add(x, row);
    let out_row = b.ptr_add(out, row);
    let slots = b.const_u32(cfg.head_dim / 2);
    let items = b.mul(heads, slots);
    let tid = b.thread_id_x();
    let step = b.const_u32(ROPE_THREADS);
    b.for_each(tid, items, step, |b, e| {
        let h = b.div(e, slots);
        let slot = b.rem(e, slots);
        let head = b.mul(h, d);
        let src = b.ptr_add(x_row, head);
        let dst = b.ptr_add(out_row, head);
        rotate_head(b, cfg, src, dst, slot, cos, sin, pos, n_positions);
    });
    b.finish()
}

crate::kernel_params! {
    /// The parameters of [`rope_kv_cache`], in order.
    pub struct RopeKvCacheParams, RopeKvCacheValues for RopeConfig as cfg {
        k: tensor(cfg.dtype),
        v: tensor(cfg.dtype),
        cos: tensor(ScalarType::F32),
        sin: tensor(ScalarType::F32),
        positions: tensor(ScalarType::U32),
        slots: tensor(ScalarType::U32),
        k_cache: tensor(cfg.dtype),
        v_cache: tensor(cfg.dtype),
        heads: scalar(u32),
        batch: scalar(u32),
        max_seq: scalar(u32),
    }
}

/// RoPE of `k [T, Hkv, head_dim]` written into `k_cache [B, Hkv, S, head_dim]` at
/// `[slots[t], h, positions[t]]`, and `v [T, Hkv, head_dim]` copied into `v_cache` at the same
/// place. Parameters: k, v, cos, sin, positions (`u32 [T]`), slots (`u32 [T]`), k_cache,
/// v_cache, heads, batch (`B`), max_seq (`S`) (`u32`). The table must cover `S` positions. A
/// token whose slot is `≥ B` or position `≥ S` writes nothing. Grid: `T` blocks of
/// [`ROPE_THREADS`].
pub fn rope_kv_cache(cfg: &RopeConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.kv_cache_id().replace('.', "_"));
    let RopeKvCacheValues { k, v, cos, sin, positions, slots: slots_in, k_cache, v_cache, heads, batch, max_seq } =
        RopeKvCacheParams::declare(&mut b, cfg);
    b.launch_bounds(ROPE_THREADS, None);

    let token = b.block_id_x();
    let p = b.ptr_add(positions, token);
    let pos = b.load(p);
    let p = b.ptr_add(slots_in, token);
    let seq = b.load(p);
    let pos_ok = b.lt(pos, max_seq);
    let seq_ok = b.lt(seq, batch);
    let ok = b.and(pos_ok, seq_ok);
    b.if_then(ok, |b| {
        let d = b.const_u32(cfg.head_dim);
        let row_len = b.mul(heads, d);
        let token64 = b.cvt(token, ScalarType::U64);
        let row_len64 = b.cvt(row_len, ScalarType::U64);
        let row = b.mul(token64, row_len64);
        let k_row = b.ptr_add(k, row);
        let v_row = b.ptr_add(v, row);
        // Element offset of [seq, h, pos, 0] in the cache: ((seq * H + h) * S + pos) * D.
        let cache_head = |b: &mut KernelBuilder, h: Value| {
            let sh = b.fma(seq, heads, h);
            let sh = b.cvt(sh, ScalarType::U64);
            let s64 = b.cvt(max_seq, ScalarType::U64);
            let p64 = b.cvt(pos, ScalarType::U64);
            let e = b.fma(sh, s64, p64);
            let d64 = b.constant(Constant::u64(cfg.head_dim as u64));
            b.mul(e, d64)
        };
        let slots = b.const_u32(cfg.head_dim / 2);
        let items = b.mul(heads, slots);
        let tid = b.thread_id_x();
        let step = b.const_u32(ROPE_THREADS);
        let n_positions = max_seq;
        b.for_each(tid, items, step, |b, e| {
            let h = b.div(e, slots);
            let slot = b.rem(e, slots);
            let head = b.mul(h, d);
            let src = b.ptr_add(k_row, head);
            let at = cache_head(b, h);
            let dst = b.ptr_add(k_cache, at);
            rotate_head(b, cfg, src, dst, slot, cos, sin, pos, n_positions);
        });
        b.for_each(tid, row_len, step, |b, e| {
            let h = b.div(e, d);
            let j = b.rem(e, d);
            let at = cache_head(b, h);
            let dst = b.ptr_add(v_cache, at);
            let src = b.ptr_add(v_row, e);
            let val = b.load(src);
            let q = b.ptr_add(dst, j);
            b.store(q, val);
        });
    });
    b.finish()
}
