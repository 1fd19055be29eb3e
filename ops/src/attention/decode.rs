//! Split-KV decode over a contiguous KV cache: the partial kernel (one split of the keys per
//! block) and the combine kernel that merges the splits.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use super::flash::*;
use super::geometry::*;

/// A split-KV decode configuration (the partial kernel). Parameters: `q` (`[B, Hq, D]`),
/// `k_cache` (`[B, Hkv, S_max, D]`), `v_cache` (`[B, Hkv, S_max, Dv]`), `seq_lens` (u32 `[B]`, clamped to `S_max`),
/// `workspace` (f32, see [`decode_workspace_len`]), `scale: f32`, `s_max, kv_heads, group,
/// split_len: u32`. Launch: grid `(splits, Hkv · ceil(group / rows), B)`, [`THREADS`] threads;
/// split `s` covers keys `[s · split_len, (s + 1) · split_len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionDecodeConfig {
    pub dtype: ScalarType,
    pub head_dim: u32,
    /// `Dv`, the head dim of the V cache and of the output.
    pub v_head_dim: u32,
}

impl AttentionDecodeConfig {
    pub fn id(&self) -> String {
        format!("attention_decode.{}.{}", self.dtype, dims_id(self.head_dim, self.v_head_dim))
    }
    pub fn combine_id(&self) -> String {
        format!("attention_decode_combine.{}.{}", self.dtype, dims_id(self.head_dim, self.v_head_dim))
    }
    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.head_dim, self.v_head_dim)
    }
}

/// Elements of the decode workspace: per (sequence, query head, split) an `f32` accumulator of
/// `Dv` elements (first region), and a `(max, sum)` pair (second region).
pub fn decode_workspace_len(batch: usize, q_heads: usize, v_head_dim: usize, splits: usize) -> usize {
    batch * q_heads * splits * (v_head_dim + 2)
}

crate::kernel_params! {
    /// The parameters of [`attention_decode`] (see [`AttentionDecodeConfig`]).
    pub struct AttentionDecodeParams, AttentionDecodeValues for AttentionDecodeConfig as cfg {
        q: tensor(cfg.dtype),
        k_cache: tensor(cfg.dtype),
        v_cache: tensor(cfg.dtype),
        seq_lens: tensor(ScalarType::U32),
        workspace: tensor(ScalarType::F32),
        scale: scalar(f32),
        s_max: scalar(u32),
        kv_heads: scalar(u32),
        group: scalar(u32),
        split_len: scalar(u32),
    }
}

/// Build the split-KV decode kernel (see [`AttentionDecodeConfig`]).
pub fn attention_decode(cfg: &AttentionDecodeConfig) -> Result<Kernel, VerifyError> {
    let geo = cfg.geometry();
    let (d, dv) = (geo.head_dim, geo.v_head_dim);
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let AttentionDecodeValues {
        q,
        k_cache: k,
        v_cache: v,
        seq_lens,
        workspace: ws,
        scale,
        s_max,
        kv_heads,
        group,
        split_len,
    } = AttentionDecodeParams::declare(&mut b, cfg);
    b.launch_bounds(THREADS, geo.min_blocks());
    let tiles = tiles(&mut b, &geo);

    let split = b.block_id_x();
    let gy = b.block_id_y();
    let seq = b.special(SpecialReg::CtaidZ);
    let splits = b.special(SpecialReg::NctaidX);
    let batch = b.special(SpecialReg::NctaidZ);
    let br = u32c(&mut b, geo.rows);
    let brm1 = u32c(&mut b, geo.rows - 1);
    let chunks = b.add(group, brm1);
    let chunks = b.div(chunks, br);
    let kv_head = b.div(gy, chunks);
    let chunk = b.rem(gy, chunks);
    let lp = b.ptr_add(seq_lens, seq);
    let len = b.load(lp);
    let len = clamp_to(&mut b, len, s_max);
    let begin = b.mul(split, split_len);
    let stop = b.add(begin, split_len);
    let end = b.min(stop, len);

    // The block's rows are query heads `chunk · BR ..` of the GQA group of `kv_head`.
    let r0 = b.mul(chunk, br);
    let lane = lane(&mut b, &geo, r0, group);
    let head_base = b.mul(kv_head, group);
    let q_heads = b.mul(kv_heads, group);
    let dd = u32c_64(&mut b, d as u64);
    let z64 = b.const_u64(0);
    let s2 = log2_scale(&mut b, scale);
    let mut rows = Vec::with_capacity(lane.rows.len());
    for &lr in &lane.rows {
        let r = b.add(r0, lr);
        let ok = b.lt(r, group);
        let head = b.add(head_base, r);
        // q[seq, head, :]
        let qrow = b.fma(seq, q_heads, head);
        let at = mad64(&mut b, qrow, dd, z64);
        let qv = load_q(&mut b, &geo, &lane, q, at, ok, s2);
        rows.push((ok, head, qv));
    }
    // cache[seq, kv_head, j, :] = ((seq · Hkv + kv_head) · S_max + j) · D
    let sh = b.fma(seq, kv_heads, kv_head);
    let base = mad64(&mut b, sh, s_max, z64);
    let k_base = b.mul(base, dd);
    // The V cache's rows have `Dv` elements.
    let (v_base, ddv) = if dv == d {
        (k_base, dd)
    } else {
        let ddv = u32c_64(&mut b, dv as u64);
        (b.mul(base, ddv), ddv)
    };
    let src = KeySource { k, v, base: k_base, stride: dd, v_base, v_stride: ddv };
    let mask_score = |b: &mut KernelBuilder, i: usize, key: Value, _j: Value, s: Value| {
        let in_split = b.lt(key, end);
        let valid = b.and(rows[i].0, in_split);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        b.select(valid, s, ninf)
    };
    let qs: Vec<Vec<Value>> = rows.iter().map(|r| r.2.clone()).collect();
    let states = flash_core(&mut b, &geo, &lane, tiles, &src, &qs, begin, end, &mask_score, None);
    // Workspace row (seq, head, split): accumulator, then (max, sum) in the stats region after
    // all accumulators (batch · Hq · splits rows).
    let bh = b.mul(batch, q_heads);
    let total_rows = b.mul(bh, splits);
    let acc_len = mad64(&mut b, total_rows, ddv, z64);
    for (st, (ok, head, _)) in states.iter().zip(&rows) {
        b.if_then(*ok, |b| {
            let sq = b.fma(seq, q_heads, *head);
            let wrow = b.fma(sq, splits, split);
            let z = b.const_u64(0);
            let acc_off = mad64(b, wrow, ddv, z);
            store_row(b, &geo, &lane, ws, acc_off, &st.acc);
            let zero = u32c(b, 0);
            let first = b.eq(lane.dim0, zero);
            b.if_then(first, |b| {
                let two = b.const_u64(2);
                let st_off = mad64(b, wrow, two, acc_len);
                let pm = b.ptr_add(ws, st_off);
                b.store(pm, st.m);
                let one64 = b.const_u64(1);
                let st_off1 = b.add(st_off, one64);
                let pl = b.ptr_add(ws, st_off1);
                b.store(pl, st.l);
            });
        });
    }
    b.finish()
}

crate::kernel_params! {
    /// The parameters of [`attention_decode_combine`]: the partial kernel's `workspace` (f32),
    /// `out` (`[B, Hq, Dv]`, the dtype) and the split count.
    pub struct AttentionDecodeCombineParams, AttentionDecodeCombineValues for AttentionDecodeConfig as cfg {
        workspace: tensor(ScalarType::F32),
        out: tensor(cfg.dtype),
        splits: scalar(u32),
    }
}

/// Build the decode combine kernel: merges the splits' `(max, sum, acc)` of each (sequence,
/// head) into `out` (see [`AttentionDecodeCombineParams`]). Launch: grid `(B · Hq)`, `Dv`
/// threads.
pub fn attention_decode_combine(cfg: &AttentionDecodeConfig) -> Result<Kernel, VerifyError> {
    let d = cfg.v_head_dim;
    let mut b = KernelBuilder::new(cfg.combine_id().replace('.', "_"));
    let AttentionDecodeCombineValues { workspace: ws, out, splits } =
        AttentionDecodeCombineParams::declare(&mut b, cfg);
    b.launch_bounds(d, None);

    let row = b.block_id_x();
    let rows = b.grid_dim_x();
    let dim = b.thread_id_x();
    let dd = b.const_u64(d as u64);
    let z64 = b.const_u64(0);
    let first = b.mul(row, splits);
    let total = b.mul(rows, splits);
    let stats = mad64(&mut b, total, dd, z64);
    let two = b.const_u64(2);
    let stat = |b: &mut KernelBuilder, s: Value, which: u64| {
        let w = b.add(first, s);
        let off = mad64(b, w, two, stats);
        let c = b.const_u64(which);
        let off = b.add(off, c);
        let p = b.ptr_add(ws, off);
        b.load(p)
    };
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let m = b.for_range(zero, splits, one, &[ninf], |b, s, acc| {
        let ms = stat(b, s, 0);
        vec![b.max(acc[0], ms)]
    })[0];
    let none = b.eq(m, ninf);
    let zf = b.const_f32(0.0);
    let m_use = b.select(none, zf, m);
    let sums = b.for_range(zero, splits, one, &[zf, zf], |b, s, acc| {
        let ms = stat(b, s, 0);
        let ls = stat(b, s, 1);
        let dm = b.sub(ms, m_use);
        let w = b.ex2(dm);
        let den = b.fma(w, ls, acc[0]);
        let w_row = b.add(first, s);
        let off = mad64(b, w_row, dd, dim);
        let p = b.ptr_add(ws, off);
        let a = b.load(p);
        let num = b.fma(w, a, acc[1]);
        vec![den, num]
    });
    let any = b.gt(sums[0], zf);
    let q = b.div(sums[1], sums[0]);
    let y = b.select(any, q, zf);
    let o = mad64(&mut b, row, dd, dim);
    let elem = cfg.dtype;
    let y = if elem == ScalarType::F32 { y } else { b.cvt(y, elem) };
    let p = b.ptr_add(out, o);
    b.store(p, y);
    b.finish()
}
