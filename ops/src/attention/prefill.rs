//! The flash prefill kernel: packed variable-length batches or a KV cache, GQA, causal or not,
//! optional mask and bias.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use super::flash::*;
use super::geometry::*;

/// A flash prefill configuration. Parameters, in order:
/// `q, k, v, out` (dtype), `cu_q, cu_k` (u32, `batch + 1` cumulative lengths), then with
/// `masked` `mask` (u8, nonzero = may attend) and `bias` (f32, added to the scaled scores),
/// then `scale: f32`, `total_q, total_k, group: u32` (rows of `q`, rows of `k`, `Hq / Hkv`), the
/// element strides `q_token, q_head, q_batch, k_token, k_head, k_batch: u64` (with `Dv = D`
/// `out` has `q`'s and `v` has `k`'s; with `Dv ≠ D` the strides `v_token, v_head, v_batch,
/// o_token, o_head, o_batch: u64` follow), then with `masked` the strides `(batch, head, query,
/// key)` of mask and bias (u64; 0 broadcasts). `q`, `k` rows have `D` elements, `v`, `out` rows
/// `Dv`. Element `(seq b, position t, head h, dim d)` of `q` lives at
/// `(cu_q[b] + t) · q_token + h · q_head + b · q_batch + d`, so a packed `[T, H, D]` tensor has
/// strides `(H·D, D, 0)` and a batched `[B, H, T, D]` one `(D, T·D, (H-1)·T·D)` with
/// `cu_q = [0, T, 2T, ...]`. With [`KvSource::Cache`], `cu_k` is `seq_lens` (u32 `[batch]`)
/// and sequence `b`'s keys are positions `0..seq_lens[b]` (clamped to `total_k`) of its cache
/// rows: a `[B, Hkv, S_max, D]` cache has strides `(D, S_max·D, Hkv·S_max·D)`.
/// Launch: grid `(ceil(max_q / rows), Hq, batch)`, [`THREADS`] threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionPrefillConfig {
    pub dtype: ScalarType,
    pub head_dim: u32,
    /// `Dv`, the head dim of `v` and of the output.
    pub v_head_dim: u32,
    pub causal: bool,
    pub masked: bool,
    pub kv: KvSource,
}

/// Where the prefill kernel finds each sequence's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvSource {
    /// Packed rows `cu_k[b]..cu_k[b + 1]` (flash-attn's varlen layout).
    Packed,
    /// The first `seq_lens[b]` positions of sequence `b`'s rows of a KV cache.
    Cache,
}

impl AttentionPrefillConfig {
    pub fn id(&self) -> String {
        let causal = if self.causal { ".causal" } else { "" };
        let masked = if self.masked { ".masked" } else { "" };
        let cache = if self.kv == KvSource::Cache { ".cache" } else { "" };
        let dims = dims_id(self.head_dim, self.v_head_dim);
        format!("attention_prefill.{}.{dims}{causal}{masked}{cache}", self.dtype)
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.head_dim, self.v_head_dim)
    }

    /// Whether `v` and `out` have strides of their own (`Dv ≠ D`).
    fn own_v_strides(&self) -> bool {
        self.head_dim != self.v_head_dim
    }
}

crate::kernel_params! {
    /// The parameters of [`attention_prefill`] (see [`AttentionPrefillConfig`]): `cu_k` over
    /// packed keys, `seq_lens` in its place over a KV cache; the `v_*` and `o_*` strides with
    /// `Dv ≠ D`; `mask`, `bias` and their strides when masked.
    pub struct AttentionPrefillParams, AttentionPrefillValues for AttentionPrefillConfig as cfg {
        q: tensor(cfg.dtype),
        k: tensor(cfg.dtype),
        v: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        cu_q: tensor(ScalarType::U32),
        cu_k: opt_tensor(ScalarType::U32, cfg.kv == KvSource::Packed),
        seq_lens: opt_tensor(ScalarType::U32, cfg.kv == KvSource::Cache),
        mask: opt_tensor(ScalarType::U8, cfg.masked),
        bias: opt_tensor(ScalarType::F32, cfg.masked),
        scale: scalar(f32),
        total_q: scalar(u32),
        total_k: scalar(u32),
        group: scalar(u32),
        q_token: scalar(u64),
        q_head: scalar(u64),
        q_batch: scalar(u64),
        k_token: scalar(u64),
        k_head: scalar(u64),
        k_batch: scalar(u64),
        v_token: opt_scalar(u64, cfg.own_v_strides()),
        v_head: opt_scalar(u64, cfg.own_v_strides()),
        v_batch: opt_scalar(u64, cfg.own_v_strides()),
        o_token: opt_scalar(u64, cfg.own_v_strides()),
        o_head: opt_scalar(u64, cfg.own_v_strides()),
        o_batch: opt_scalar(u64, cfg.own_v_strides()),
        mask_batch: opt_scalar(u64, cfg.masked),
        mask_head: opt_scalar(u64, cfg.masked),
        mask_query: opt_scalar(u64, cfg.masked),
        mask_key: opt_scalar(u64, cfg.masked),
        bias_batch: opt_scalar(u64, cfg.masked),
        bias_head: opt_scalar(u64, cfg.masked),
        bias_query: opt_scalar(u64, cfg.masked),
        bias_key: opt_scalar(u64, cfg.masked),
    }
}

/// Build the prefill kernel (see [`AttentionPrefillConfig`] for parameters and launch).
pub fn attention_prefill(cfg: &AttentionPrefillConfig) -> Result<Kernel, VerifyError> {
    let geo = cfg.geometry();
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let p = AttentionPrefillParams::declare(&mut b, cfg);
    let AttentionPrefillValues { q, k, v, out, cu_q, scale, total_q, total_k, group, .. } = p;
    let cu_k = p.cu_k.or(p.seq_lens).expect("one of cu_k and seq_lens is declared");
    let q_strides = [p.q_token, p.q_head, p.q_batch];
    let k_strides = [p.k_token, p.k_head, p.k_batch];
    let vo_strides = declared([p.v_token, p.v_head, p.v_batch]).zip(declared([p.o_token, p.o_head, p.o_batch]));
    let (v_strides, o_strides) = vo_strides.unwrap_or((k_strides, q_strides));
    let mb = mask_bias(
        p.mask.zip(p.bias),
        [p.mask_batch, p.mask_head, p.mask_query, p.mask_key],
        [p.bias_batch, p.bias_head, p.bias_query, p.bias_key],
    );
    b.launch_bounds(THREADS, geo.min_blocks());
    let tiles = tiles(&mut b, &geo);
    let bias_tile = cfg.masked.then(|| b.shared_array("bias_tile", ScalarType::F32, geo.rows * bias_stride(&geo)));

    let tile = b.block_id_x();
    let head = b.block_id_y();
    let seq = b.special(SpecialReg::CtaidZ);
    // Sequence bounds, clamped so that bad cumulative lengths cannot address outside q or k.
    let bounds = |b: &mut KernelBuilder, cu: Value, total: Value| {
        let p0 = b.ptr_add(cu, seq);
        let start = b.load(p0);
        let next = offset(b, seq, 1);
        let p1 = b.ptr_add(cu, next);
        let stop = b.load(p1);
        let start = clamp_to(b, start, total);
        let stop = clamp_to(b, stop, total);
        let stop = b.max(stop, start);
        let len = b.sub(stop, start);
        (start, len)
    };
    let (q_start, q_len) = bounds(&mut b, cu_q, total_q);
    let (k_start, kv_len) = match cfg.kv {
        KvSource::Packed => bounds(&mut b, cu_k, total_k),
        KvSource::Cache => {
            let p = b.ptr_add(cu_k, seq);
            let len = b.load(p);
            (u32c(&mut b, 0), clamp_to(&mut b, len, total_k))
        }
    };
    let br = u32c(&mut b, geo.rows);
    let q0 = b.mul(tile, br);
    let live = b.lt(q0, q_len);
    b.if_then(live, |b| {
        let lane = lane(b, &geo, q0, q_len);
        let kv_head = b.div(head, group);
        // Row offsets: (start + t) · token + head · head_stride + seq · batch.
        let seq_head_base = |b: &mut KernelBuilder, strides: &[Value; 3], h: Value| {
            let z = u32c_64(b, 0);
            let a = mad64(b, h, strides[1], z);
            mad64(b, seq, strides[2], a)
        };
        let q_base = seq_head_base(b, &q_strides, head);
        let s2 = log2_scale(b, scale);
        // Per row of the lane: its index, whether it exists, its q offset, its q.
        let o_base = vo_strides.map(|_| seq_head_base(b, &o_strides, head));
        let mut rows = Vec::with_capacity(lane.rows.len());
        for &r in &lane.rows {
            let qi = b.add(q0, r);
            let ok = b.lt(qi, q_len);
            let pos = b.add(q_start, qi);
            let at = mad64(b, pos, q_strides[0], q_base);
            let qv = load_q(b, &geo, &lane, q, at, ok, s2);
            // The output row: `q`'s offset, or its own with `Dv ≠ D`.
            let at = match o_base {
                Some(o_base) => mad64(b, pos, o_strides[0], o_base),
                None => at,
            };
            let qi_plus_kv = b.add(qi, kv_len);
            // The row's first element in the staged bias tile.
            let bias_row = bias_tile.map(|_| {
                let stride = u32c(b, bias_stride(&geo));
                b.mul(r, stride)
            });
            rows.push((ok, at, qv, qi_plus_kv, bias_row));
        }
        let k_base = seq_head_base(b, &k_strides, kv_head);
        let k_base = mad64(b, k_start, k_strides[0], k_base);
        let (v_base, v_stride) = match vo_strides {
            Some(_) => {
                let v_base = seq_head_base(b, &v_strides, kv_head);
                (mad64(b, k_start, v_strides[0], v_base), v_strides[0])
            }
            None => (k_base, k_strides[0]),
        };
        let src = KeySource { k, v, base: k_base, stride: k_strides[0], v_base, v_stride };
        // Causal (aligned to the end): row i attends keys j with j + q_len <= i + kv_len.
        let end = if cfg.causal {
            let last = b.add(q0, br);
            let lim = b.add(last, kv_len);
            let over = b.gt(lim, q_len);
            let lim = b.sub(lim, q_len);
            let zero = u32c(b, 0);
            let lim = b.select(over, lim, zero);
            b.min(lim, kv_len)
        } else {
            kv_len
        };
        let mask_score = |b: &mut KernelBuilder, i: usize, key: Value, j: Value, s: Value| {
            let (row_ok, _, _, qi_plus_kv, bias_row) = &rows[i];
            let in_seq = b.lt(key, kv_len);
            let mut valid = b.and(*row_ok, in_seq);
            if cfg.causal {
                let kq = b.add(key, q_len);
                let c = b.le(kq, *qi_plus_kv);
                valid = b.and(valid, c);
            }
            // Staged `bias · log2 e`, or -inf where the mask forbids the pair.
            let s = match (bias_tile, bias_row) {
                (Some(t), Some(row)) => {
                    let base = b.shared_ptr(t);
                    let p = b.ptr_add(base, *row);
                    let p = b.ptr_add(p, j);
                    let x = b.load(p);
                    b.add(s, x)
                }
                _ => s,
            };
            let ninf = b.const_f32(f32::NEG_INFINITY);
            b.select(valid, s, ninf)
        };
        let stage = |b: &mut KernelBuilder, k0: Value| {
            if let (Some(mb), Some(t)) = (&mb, bias_tile) {
                stage_mask_bias(b, &geo, mb, t, (seq, head), (q0, q_len), (k0, kv_len));
            }
        };
        let qs: Vec<Vec<Value>> = rows.iter().map(|r| r.2.clone()).collect();
        let zero = u32c(b, 0);
        let extra: StageExtra<'_> = if cfg.masked { Some(&stage) } else { None };
        let states = flash_core(b, &geo, &lane, tiles, &src, &qs, zero, end, &mask_score, extra);
        for (st, (ok, at, ..)) in states.iter().zip(&rows) {
            let o = normalize(b, st);
            b.if_then(*ok, |b| store_row(b, &geo, &lane, out, *at, &o));
        }
    });
    b.finish()
}
