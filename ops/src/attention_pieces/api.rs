//! The composable GQA and MLA pieces: score and value products over contiguous token-major
//! tensors, for callers that apply their own masking, softmax, positional encoding and
//! scaling. GQA query heads read their group's key/value head directly (no repeated KV heads);
//! MLA products read the cached latents directly (no expansion of historical latents into
//! per-head keys and values). Scores are `f32`, accumulation is `f32`.

use ruda_ir::ScalarType;
use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{attention_pieces_dot, PiecesDotConfig, PiecesDotParams, PIECES_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Most rows (grid y) and batches (grid z) of one launch.
const MAX_GRID_YZ: usize = 65535;

/// An operand's three strides: per batch entry, per output row (or column) and per reduction step.
type Strides = [usize; 3];

/// One validated launch of the dot kernel.
struct Dot<'a> {
    op: &'static str,
    a: &'a Tensor,
    b: &'a Tensor,
    second: Option<(&'a Tensor, &'a Tensor, usize, Strides, Strides)>,
    out: &'a Tensor,
    batches: usize,
    rows: usize,
    cols: usize,
    k: usize,
    ga: usize,
    gb: usize,
    scale: f32,
    a_strides: Strides,
    b_strides: Strides,
    o_strides: Strides,
}

fn shape_error(op: &'static str, message: String) -> OpError {
    OpError::Shape { op, message }
}

/// Contiguous, non-empty, of rank `rank`, on the stream's device.
fn check(op: &'static str, stream: &Stream, named: &[(&str, &Tensor, usize)]) -> Result<()> {
    for &(name, t, rank) in named {
        contiguous_nonempty(op, name, t)?;
        if t.rank() != rank {
            return Err(shape_error(op, format!("`{name}` must be {rank}-D, is {:?}", t.shape())));
        }
        to_u32(op, &format!("elements of `{name}`"), t.numel())?;
    }
    let tensors: Vec<(&str, &Tensor)> = named.iter().map(|&(n, t, _)| (n, t)).collect();
    same_device(op, stream, &tensors)
}

fn dims_agree(op: &'static str, what: &str, x: usize, y: usize) -> Result<()> {
    if x != y {
        return Err(shape_error(op, format!("{what} differ ({x} and {y})")));
    }
    Ok(())
}

fn launch(stream: &Stream, d: &Dot<'_>) -> Result<()> {
    if d.rows > MAX_GRID_YZ || d.batches > MAX_GRID_YZ {
        return Err(OpError::InvalidArgument {
            op: d.op,
            message: format!("at most {MAX_GRID_YZ} tokens and heads (got {} and {})", d.rows, d.batches),
        });
    }
    let u = |what: &str, n: usize| to_u32(d.op, what, n);
    let cfg = PiecesDotConfig {
        a: d.a.dtype().scalar_type(),
        b: d.b.dtype().scalar_type(),
        out: d.out.dtype().scalar_type(),
        second: d.second.is_some(),
    };
    let kern = kernel(cfg.id(), || attention_pieces_dot(&cfg))?;
    let launch = LaunchConfig {
        grid: [u("columns", d.cols)?.div_ceil(PIECES_THREADS), d.rows as u32, d.batches as u32],
        block: [PIECES_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let [a_batch, a_row, a_k] = d.a_strides;
    let [b_batch, b_col, b_k] = d.b_strides;
    let [o_batch, o_row, o_col] = d.o_strides;
    let opt = |x: Option<usize>| x.map(|v| v as u32);
    let s2 = d.second.map(|(_, _, k2, a2, b2)| (k2, a2, b2));
    let params = PiecesDotParams {
        a: d.a,
        b: d.b,
        a2: d.second.map(|s| s.0),
        b2: d.second.map(|s| s.1),
        out: d.out,
        n: d.cols as u32,
        k: u("the reduction length", d.k)?,
        k2: opt(s2.map(|s| s.0)),
        ga: d.ga as u32,
        gb: d.gb as u32,
        scale: d.scale,
        a_batch: a_batch as u32,
        a_row: a_row as u32,
        a_k: a_k as u32,
        b_batch: b_batch as u32,
        b_col: b_col as u32,
        b_k: b_k as u32,
        a2_batch: opt(s2.map(|s| s.1[0])),
        a2_row: opt(s2.map(|s| s.1[1])),
        a2_k: opt(s2.map(|s| s.1[2])),
        b2_batch: opt(s2.map(|s| s.2[0])),
        b2_col: opt(s2.map(|s| s.2[1])),
        b2_k: opt(s2.map(|s| s.2[2])),
        o_batch: o_batch as u32,
        o_row: o_row as u32,
        o_col: o_col as u32,
    };
    params::launch(stream, &kern, launch, &params.args())
}

fn group_size(op: &'static str, q_heads: usize, kv_heads: usize) -> Result<usize> {
    if !q_heads.is_multiple_of(kv_heads) {
        return Err(shape_error(op, format!("query heads ({q_heads}) must be a multiple of KV heads ({kv_heads})")));
    }
    Ok(q_heads / kv_heads)
}

/// `out[h, t, s] = Σ_d q[t, h, d] · k[s, h / (Hq / Hkv), d]` (f32) for `q [T, Hq, D]` and
/// `k [S, Hkv, D]` of one float dtype: unscaled GQA scores, each query head reading its
/// group's key head.
pub fn gqa_scores_into(stream: &Stream, q: &Tensor, k: &Tensor, out: &Tensor) -> Result<()> {
    let op = "gqa_scores";
    float_dtype(op, q)?;
    check(op, stream, &[("q", q, 3), ("k", k, 3), ("out", out, 3)])?;
    expect_dtype(op, "k", k, q.dtype())?;
    expect_dtype(op, "out", out, DType::F32)?;
    let ([t, hq, d], [s, hkv, dk]) = (dims3(q), dims3(k));
    dims_agree(op, "head dims of `q` and `k`", d, dk)?;
    let g = group_size(op, hq, hkv)?;
    expect_shape(op, "out", out, &[hq, t, s])?;
    launch(
        stream,
        &Dot {
            op,
            a: q,
            b: k,
            second: None,
            out,
            batches: hq,
            rows: t,
            cols: s,
            k: d,
            ga: 1,
            gb: g,
            scale: 1.0,
            a_strides: [d, hq * d, 1],
            b_strides: [d, hkv * d, 1],
            o_strides: [t * s, s, 1],
        },
    )
}

/// GQA scores `[Hq, T, S]` (see [`gqa_scores_into`]).
pub fn gqa_scores(q: &Tensor, k: &Tensor) -> Result<Tensor> {
    let ([t, hq, _], [s, _, _]) = (dims3(q), dims3(k));
    let out = Tensor::empty(q.device(), DType::F32, &[hq, t, s])?;
    gqa_scores_into(&q.device().default_stream(), q, k, &out)?;
    Ok(out)
}

/// `out[t, h, e] = Σ_s p[h, t, s] · v[s, h / (Hq / Hkv), e]` for f32 probabilities
/// `p [Hq, T, S]` and `v [S, Hkv, Dv]`; `out [T, Hq, Dv]` has `v`'s dtype.
pub fn gqa_value_product_into(stream: &Stream, p: &Tensor, v: &Tensor, out: &Tensor) -> Result<()> {
    let op = "gqa_value_product";
    float_dtype(op, v)?;
    check(op, stream, &[("p", p, 3), ("v", v, 3), ("out", out, 3)])?;
    expect_dtype(op, "p", p, DType::F32)?;
    expect_dtype(op, "out", out, v.dtype())?;
    let ([hq, t, s], [sv, hkv, dv]) = (dims3(p), dims3(v));
    dims_agree(op, "key counts of `p` and `v`", s, sv)?;
    let g = group_size(op, hq, hkv)?;
    expect_shape(op, "out", out, &[t, hq, dv])?;
    launch(
        stream,
        &Dot {
            op,
            a: p,
            b: v,
            second: None,
            out,
            batches: hq,
            rows: t,
            cols: dv,
            k: s,
            ga: 1,
            gb: g,
            scale: 1.0,
            a_strides: [t * s, s, 1],
            b_strides: [dv, 1, hkv * dv],
            o_strides: [dv, hq * dv, 1],
        },
    )
}

/// `p · v` per query head, `[T, Hq, Dv]` (see [`gqa_value_product_into`]).
pub fn gqa_value_product(p: &Tensor, v: &Tensor) -> Result<Tensor> {
    let ([hq, t, _], [_, _, dv]) = (dims3(p), dims3(v));
    let out = Tensor::empty(v.device(), v.dtype(), &[t, hq, dv])?;
    gqa_value_product_into(&v.device().default_stream(), p, v, &out)?;
    Ok(out)
}

/// `out[t, h, r] = Σ_d q_nope[t, h, d] · w_uk[h, d, r]`: the non-positional query absorbed into
/// the latent space (`q_nope [T, H, Dn]`, the per-head key up-projection `w_uk [H, Dn, R]`),
/// `out [T, H, R]` in their dtype.
pub fn mla_absorb_query_into(stream: &Stream, q_nope: &Tensor, w_uk: &Tensor, out: &Tensor) -> Result<()> {
    let op = "mla_absorb_query";
    float_dtype(op, q_nope)?;
    check(op, stream, &[("q_nope", q_nope, 3), ("w_uk", w_uk, 3), ("out", out, 3)])?;
    expect_dtype(op, "w_uk", w_uk, q_nope.dtype())?;
    expect_dtype(op, "out", out, q_nope.dtype())?;
    let ([t, h, dn], [hw, dw, r]) = (dims3(q_nope), dims3(w_uk));
    dims_agree(op, "head counts of `q_nope` and `w_uk`", h, hw)?;
    dims_agree(op, "head dims of `q_nope` and `w_uk`", dn, dw)?;
    expect_shape(op, "out", out, &[t, h, r])?;
    launch(
        stream,
        &Dot {
            op,
            a: q_nope,
            b: w_uk,
            second: None,
            out,
            batches: h,
            rows: t,
            cols: r,
            k: dn,
            ga: 1,
            gb: 1,
            scale: 1.0,
            a_strides: [dn, h * dn, 1],
            b_strides: [dn * r, 1, r],
            o_strides: [r, h * r, 1],
        },
    )
}

/// The absorbed query `[T, H, R]` (see [`mla_absorb_query_into`]).
pub fn mla_absorb_query(q_nope: &Tensor, w_uk: &Tensor) -> Result<Tensor> {
    let ([t, h, _], [_, _, r]) = (dims3(q_nope), dims3(w_uk));
    let out = Tensor::empty(q_nope.device(), q_nope.dtype(), &[t, h, r])?;
    mla_absorb_query_into(&q_nope.device().default_stream(), q_nope, w_uk, &out)?;
    Ok(out)
}

/// `out[h, t, s] = scale · (Σ_r q_abs[t, h, r] · latent[s, r] + Σ_p qp[t, h, p] · kp[s, p])`
/// (f32) for absorbed queries `q_abs [T, H, R]`, positional queries `qp [T, H, P]`, cached
/// latents `latent [S, R]` and positional keys `kp [S, P]` of one float dtype; `scale` is the
/// model's original QK scale (finite).
pub fn mla_scores_into(
    stream: &Stream,
    q_abs: &Tensor,
    qp: &Tensor,
    latent: &Tensor,
    kp: &Tensor,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    let op = "mla_scores";
    float_dtype(op, q_abs)?;
    check(op, stream, &[("q_abs", q_abs, 3), ("qp", qp, 3), ("latent", latent, 2), ("kp", kp, 2), ("out", out, 3)])?;
    for (n, t) in [("qp", qp), ("latent", latent), ("kp", kp)] {
        expect_dtype(op, n, t, q_abs.dtype())?;
    }
    expect_dtype(op, "out", out, DType::F32)?;
    if !scale.is_finite() {
        return Err(OpError::InvalidArgument { op, message: format!("scale must be finite, is {scale}") });
    }
    let ([t, h, r], [tp, hp, p]) = (dims3(q_abs), dims3(qp));
    let (s, rl, sp, pk) = (latent.shape()[0], latent.shape()[1], kp.shape()[0], kp.shape()[1]);
    dims_agree(op, "token counts of `q_abs` and `qp`", t, tp)?;
    dims_agree(op, "head counts of `q_abs` and `qp`", h, hp)?;
    dims_agree(op, "latent ranks of `q_abs` and `latent`", r, rl)?;
    dims_agree(op, "positional dims of `qp` and `kp`", p, pk)?;
    dims_agree(op, "key counts of `latent` and `kp`", s, sp)?;
    expect_shape(op, "out", out, &[h, t, s])?;
    launch(
        stream,
        &Dot {
            op,
            a: q_abs,
            b: latent,
            second: Some((qp, kp, p, [p, h * p, 1], [0, p, 1])),
            out,
            batches: h,
            rows: t,
            cols: s,
            k: r,
            ga: 1,
            gb: 1,
            scale,
            a_strides: [r, h * r, 1],
            b_strides: [0, r, 1],
            o_strides: [t * s, s, 1],
        },
    )
}

/// MLA scores `[H, T, S]` (see [`mla_scores_into`]).
pub fn mla_scores(q_abs: &Tensor, qp: &Tensor, latent: &Tensor, kp: &Tensor, scale: f32) -> Result<Tensor> {
    let [t, h, _] = dims3(q_abs);
    let s = latent.shape().first().copied().unwrap_or(0);
    let out = Tensor::empty(q_abs.device(), DType::F32, &[h, t, s])?;
    mla_scores_into(&q_abs.device().default_stream(), q_abs, qp, latent, kp, scale, &out)?;
    Ok(out)
}

/// `out[t, h, r] = Σ_s p[h, t, s] · latent[s, r]`: the compressed context for f32
/// probabilities `p [H, T, S]` over cached latents `latent [S, R]`; `out [T, H, R]` has the
/// latents' dtype (the value up-projection is the caller's).
pub fn mla_value_product_into(stream: &Stream, p: &Tensor, latent: &Tensor, out: &Tensor) -> Result<()> {
    let op = "mla_value_product";
    float_dtype(op, latent)?;
    check(op, stream, &[("p", p, 3), ("latent", latent, 2), ("out", out, 3)])?;
    expect_dtype(op, "p", p, DType::F32)?;
    expect_dtype(op, "out", out, latent.dtype())?;
    let [h, t, s] = dims3(p);
    let (sl, r) = (latent.shape()[0], latent.shape()[1]);
    dims_agree(op, "key counts of `p` and `latent`", s, sl)?;
    expect_shape(op, "out", out, &[t, h, r])?;
    launch(
        stream,
        &Dot {
            op,
            a: p,
            b: latent,
            second: None,
            out,
            batches: h,
            rows: t,
            cols: r,
            k: s,
            ga: 1,
            gb: 1,
            scale: 1.0,
            a_strides: [t * s, s, 1],
            b_strides: [0, 1, r],
            o_strides: [r, h * r, 1],
        },
    )
}

/// The compressed context `[T, H, R]` (see [`mla_value_product_into`]).
pub fn mla_value_product(p: &Tensor, latent: &Tensor) -> Result<Tensor> {
    let [h, t, _] = dims3(p);
    let r = latent.shape().get(1).copied().unwrap_or(0);
    let out = Tensor::empty(latent.device(), latent.dtype(), &[t, h, r])?;
    mla_value_product_into(&latent.device().default_stream(), p, latent, &out)?;
    Ok(out)
}

/// The first three dimensions (zeros where missing; the entry points check the rank).
fn dims3(t: &Tensor) -> [usize; 3] {
    let s = t.shape();
    [0, 1, 2].map(|i| s.get(i).copied().unwrap_or(0))
}

/// The configurations the pieces launch, per float dtype (f32 ones coincide).
pub(crate) fn piece_configs(dtype: ScalarType) -> Vec<PiecesDotConfig> {
    let f32 = ScalarType::F32;
    let mut out = vec![
        PiecesDotConfig { a: dtype, b: dtype, out: f32, second: false },
        PiecesDotConfig { a: dtype, b: dtype, out: f32, second: true },
    ];
    if dtype != f32 {
        out.push(PiecesDotConfig { a: f32, b: dtype, out: dtype, second: false });
        out.push(PiecesDotConfig { a: dtype, b: dtype, out: dtype, second: false });
    }
    out
}
