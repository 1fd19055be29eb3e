//! Attention: the general entry point ([`attention`]: batched or unbatched, optional mask and
//! bias, a choice of strategy), packed variable-length prefill, prefill over a KV cache and
//! split-KV decode.
//!
//! The semantics they share are the contract of the [module](super).

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernels::{
    self as kern, decode_workspace_len, AttentionDecodeCombineParams, AttentionDecodeConfig, AttentionDecodeParams,
    AttentionPrefillConfig, AttentionPrefillParams, AttentionSoftmaxConfig, AttentionSoftmaxParams, Geometry, KvSource,
    FLASH_HEAD_DIM_RANGE, SOFTMAX_THREADS, THREADS,
};
use crate::api::*;
use crate::params;

/// Options of [`attention`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// Causal mask aligned to the end (see the module documentation).
    pub causal: bool,
    /// Multiplier of `q · kᵀ`; `None` means `1 / sqrt(D)`. Must be finite.
    pub scale: Option<f32>,
}

/// Another name for [`AttentionOptions`], kept for callers that use it.
pub type AttentionModuleOptions = AttentionOptions;

/// How [`attention`] computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionStrategy {
    /// One fused flash kernel (online softmax, no score matrix in memory). Head dims (of
    /// `query`/`key` and of `value`) 1 to 1024; where both are multiples of 4, tensors starting
    /// at a multiple of 4 elements.
    FlashUnit,
    /// Several kernels on the same device: in `f32`, per (sequence, head) the scores through the
    /// GEMM, a masked softmax, then the GEMM with `v`. Any head dim; memory for one `[T, S]`
    /// score matrix (twice).
    Fallback,
    /// Chooses per call. RUDA has no attention autotuning yet, so this is `FlashUnit` where it
    /// applies and `Fallback` elsewhere (head dims past 1024, misaligned tensors). The default
    /// (autotuning is always compiled in).
    #[default]
    Autotune,
}

/// Why [`attention`] refused its inputs or failed to run.
#[derive(Debug, thiserror::Error)]
pub enum AttentionSetupError {
    #[error("attention: shape mismatch: {0}")]
    Shape(String),
    #[error("attention: unsupported or mismatched dtype: {0}")]
    DType(String),
    #[error("attention: tensors are on different devices: {0}")]
    Device(String),
    #[error("attention: the scale must be finite, got {0}")]
    Scale(f32),
    #[error("attention: head dims {head_dim} (query/key) and {v_head_dim} (value) are not supported by {strategy:?} (it takes 1 to 1024 each; Fallback takes any)")]
    UnsupportedHeadDim { head_dim: usize, v_head_dim: usize, strategy: AttentionStrategy },
    #[error("attention: `{name}` of shape {shape:?} does not broadcast to the scores' [batch, heads, queries, keys] = {scores:?}")]
    MaskShape { name: &'static str, shape: Vec<usize>, scores: [usize; 4] },
    #[error("attention: {0}")]
    Unsupported(String),
    /// An error of an underlying op or of the runtime (launch, memory).
    #[error(transparent)]
    Op(OpError),
}

impl From<OpError> for AttentionSetupError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Shape { op, message } => AttentionSetupError::Shape(format!("{op}: {message}")),
            OpError::DType { op, message } => AttentionSetupError::DType(format!("{op}: {message}")),
            OpError::Device { op, message } => AttentionSetupError::Device(format!("{op}: {message}")),
            other => AttentionSetupError::Op(other),
        }
    }
}

impl From<ruda_runtime::RuntimeError> for AttentionSetupError {
    fn from(e: ruda_runtime::RuntimeError) -> Self {
        AttentionSetupError::Op(OpError::from(e))
    }
}

// ---- shared validation -----------------------------------------------------------------------

fn resolve_scale(op: &'static str, scale: Option<f32>, head_dim: usize) -> Result<f32> {
    let s = scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !s.is_finite() {
        return Err(OpError::InvalidArgument { op, message: format!("the scale must be finite, got {s}") });
    }
    Ok(s)
}

/// Whether the flash kernels take a head dim (of `q`/`k`, or of `v`).
fn flash_takes(d: usize) -> bool {
    u32::try_from(d).is_ok_and(|d| FLASH_HEAD_DIM_RANGE.contains(&d))
}

/// `(D, Dv)` as u32 when the flash kernels take them.
fn flash_head_dims(op: &'static str, d: usize, dv: usize) -> Result<(u32, u32)> {
    let (lo, hi) = (FLASH_HEAD_DIM_RANGE.start(), FLASH_HEAD_DIM_RANGE.end());
    for (what, x) in [("head dim", d), ("value head dim", dv)] {
        if !flash_takes(x) {
            return Err(OpError::InvalidArgument {
                op,
                message: format!("{what} {x} is not supported by the flash kernels (they take {lo} to {hi})"),
            });
        }
    }
    Ok((d as u32, dv as u32))
}

/// Whether the attention kernels can serve a model's shapes: `dtype` a float type, `q_heads`
/// a multiple of `kv_heads` (both nonzero), `head_dim` (of queries and keys) and `v_head_dim`
/// (of values) each 1 to 1024. For the model layer to refuse a model at load rather than at
/// its first forward; the error names the shape.
pub fn attention_supports(
    dtype: DType,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    v_head_dim: usize,
) -> Result<()> {
    let op = "attention";
    let shape = format!(
        "{dtype}, {q_heads} query heads, {kv_heads} key/value heads, head dim {head_dim}, value head dim {v_head_dim}"
    );
    let named = |e: OpError| match e {
        OpError::Shape { op, message } => OpError::Shape { op, message: format!("{message} (shapes: {shape})") },
        OpError::InvalidArgument { op, message } => {
            OpError::InvalidArgument { op, message: format!("{message} (shapes: {shape})") }
        }
        other => other,
    };
    if !dtype.is_float() {
        return Err(OpError::DType { op, message: format!("{dtype} (expected f32, f16 or bf16)") });
    }
    if q_heads == 0 {
        return Err(named(OpError::Shape { op, message: "no query heads".into() }));
    }
    gqa_group(op, q_heads, kv_heads).map_err(named)?;
    flash_head_dims(op, head_dim, v_head_dim).map_err(named)?;
    Ok(())
}

/// The flash kernels read and write 4 elements at a time where both head dims are multiples
/// of 4 (else one at a time, from any offset).
fn vector_aligned(t: &Tensor) -> bool {
    t.offset().is_multiple_of(4)
}

/// The flash kernels' checks of `tensors`: contiguous and non-empty, `q`'s dtype, `rank`
/// dimensions (`layout` names them in the error).
fn expect_flash_operands(
    op: &'static str,
    q: &Tensor,
    tensors: &[(&str, &Tensor)],
    rank: usize,
    layout: &str,
) -> Result<()> {
    for &(name, t) in tensors {
        contiguous_nonempty(op, name, t)?;
        expect_dtype(op, name, t, q.dtype())?;
        expect_rank(op, name, t, rank, layout)?;
    }
    Ok(())
}

/// 4-element alignment of `tensors` where the geometry of `(D, Dv)` reads 4 at a time.
fn expect_flash_aligned(op: &'static str, (d, dv): (u32, u32), tensors: &[(&str, &Tensor)]) -> Result<()> {
    if Geometry::new(d, dv).vector() {
        for &(name, t) in tensors {
            expect_aligned(op, name, t)?;
        }
    }
    Ok(())
}

fn expect_aligned(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    if !vector_aligned(t) {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("`{name}` starts at element {} of its buffer; it must be a multiple of 4", t.offset()),
        });
    }
    Ok(())
}

fn expect_rank(op: &'static str, name: &str, t: &Tensor, rank: usize, layout: &str) -> Result<()> {
    if t.rank() != rank {
        return Err(OpError::Shape { op, message: format!("`{name}` must be {layout}, is {:?}", t.shape()) });
    }
    Ok(())
}

fn gqa_group(op: &'static str, q_heads: usize, kv_heads: usize) -> Result<u32> {
    if kv_heads == 0 || !q_heads.is_multiple_of(kv_heads) {
        return Err(OpError::Shape {
            op,
            message: format!("query heads ({q_heads}) must be a multiple of key/value heads ({kv_heads})"),
        });
    }
    to_u32(op, "query heads per key/value head", q_heads / kv_heads)
}

fn grid_limit(op: &'static str, what: &str, n: usize, max: usize) -> Result<u32> {
    if n > max {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("{what} = {n} exceeds the launch grid's limit of {max}"),
        });
    }
    to_u32(op, what, n)
}

fn u64s<const N: usize>(xs: [usize; N]) -> [u64; N] {
    xs.map(|x| x as u64)
}

// ---- prefill ---------------------------------------------------------------------------------

/// Mask (u8) and bias (f32) of the masked flash / softmax kernels, with (batch, head, query,
/// key) strides.
struct MaskBias<'a> {
    mask: &'a Tensor,
    mask_strides: [u64; 4],
    bias: &'a Tensor,
    bias_strides: [u64; 4],
}

/// Stride `i` of optional strides (a parameter declared only with them).
fn nth<const N: usize>(strides: Option<[u64; N]>, i: usize) -> Option<u64> {
    strides.map(|s| s[i])
}

/// Everything one flash prefill launch needs, validated.
struct PrefillLaunch<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    out: &'a Tensor,
    cu_q: &'a Tensor,
    cu_k: &'a Tensor,
    batch: u32,
    q_heads: u32,
    group: u32,
    head_dim: u32,
    v_head_dim: u32,
    max_q: usize,
    total_q: u32,
    total_k: u32,
    q_strides: [u64; 3],
    k_strides: [u64; 3],
    /// Strides of `v` and `out`, which with `Dv = D` are `k`'s and `q`'s.
    v_strides: [u64; 3],
    o_strides: [u64; 3],
    scale: f32,
    causal: bool,
    mask_bias: Option<MaskBias<'a>>,
    /// With [`KvSource::Cache`], `cu_k` holds the sequences' key counts.
    kv: KvSource,
}

fn launch_prefill(op: &'static str, stream: &Stream, p: &PrefillLaunch<'_>) -> Result<()> {
    let dtype = p.q.dtype().scalar_type();
    let masked = p.mask_bias.is_some();
    let cfg = AttentionPrefillConfig {
        dtype,
        head_dim: p.head_dim,
        v_head_dim: p.v_head_dim,
        causal: p.causal,
        masked,
        kv: p.kv,
    };
    let geo = cfg.geometry();
    let tiles = grid_limit(op, "query tiles", p.max_q.div_ceil(geo.rows as usize), i32::MAX as usize)?;
    let heads = grid_limit(op, "query heads", p.q_heads as usize, 65535)?;
    let batch = grid_limit(op, "batch", p.batch as usize, 65535)?;
    let k = kernel(cfg.id(), || kern::attention_prefill(&cfg))?;
    let cache = p.kv == KvSource::Cache;
    let (v_strides, o_strides) = (p.v_head_dim != p.head_dim).then_some((p.v_strides, p.o_strides)).unzip();
    let mb = p.mask_bias.as_ref();
    let (ms, bs) = (mb.map(|m| m.mask_strides), mb.map(|m| m.bias_strides));
    let args = AttentionPrefillParams {
        q: p.q,
        k: p.k,
        v: p.v,
        out: p.out,
        cu_q: p.cu_q,
        cu_k: (!cache).then_some(p.cu_k),
        seq_lens: cache.then_some(p.cu_k),
        mask: mb.map(|m| m.mask),
        bias: mb.map(|m| m.bias),
        scale: p.scale,
        total_q: p.total_q,
        total_k: p.total_k,
        group: p.group,
        q_token: p.q_strides[0],
        q_head: p.q_strides[1],
        q_batch: p.q_strides[2],
        k_token: p.k_strides[0],
        k_head: p.k_strides[1],
        k_batch: p.k_strides[2],
        v_token: nth(v_strides, 0),
        v_head: nth(v_strides, 1),
        v_batch: nth(v_strides, 2),
        o_token: nth(o_strides, 0),
        o_head: nth(o_strides, 1),
        o_batch: nth(o_strides, 2),
        mask_batch: nth(ms, 0),
        mask_head: nth(ms, 1),
        mask_query: nth(ms, 2),
        mask_key: nth(ms, 3),
        bias_batch: nth(bs, 0),
        bias_head: nth(bs, 1),
        bias_query: nth(bs, 2),
        bias_key: nth(bs, 3),
    };
    let launch = LaunchConfig { grid: [tiles, heads, batch], block: [THREADS, 1, 1], dynamic_shared_bytes: 0 };
    params::launch(stream, &k, launch, &args.args())
}

/// What prefill over a cache and decode ask of a KV cache `[batch, kv_heads, s_max, D]` / `[…, Dv]`
/// and its lengths `seq_lens` u32 `[batch]`, for `batch` sequences of head dim `d`; its
/// `(kv_heads, s_max, Dv)`.
fn check_kv_cache(
    op: &'static str,
    (k_cache, v_cache, seq_lens): (&Tensor, &Tensor, &Tensor),
    batch: usize,
    d: usize,
) -> Result<(usize, usize, usize)> {
    let (kv_heads, s_max, dv) = (k_cache.shape()[1], k_cache.shape()[2], v_cache.shape()[3]);
    expect_shape(op, "k_cache", k_cache, &[batch, kv_heads, s_max, d])?;
    expect_shape(op, "v_cache", v_cache, &[batch, kv_heads, s_max, dv])?;
    expect_tensor(op, "seq_lens", seq_lens, DType::U32, &[batch])?;
    Ok((kv_heads, s_max, dv))
}

/// Checks of the query side shared by the prefill entry points: `q` `[T, Hq, D]`, `out`
/// `[T, Hq, Dv]` (its shape is checked once `Dv` is known), `cu_seqlens_q` u32 `[batch + 1]`,
/// `max_seqlen_q >= 1`. Returns `(T, Hq, D, batch)`.
fn check_queries(
    op: &'static str,
    q: &Tensor,
    cu_q: &Tensor,
    max_q: usize,
    out: &Tensor,
) -> Result<(usize, usize, usize, usize)> {
    float_dtype(op, q)?;
    expect_flash_operands(op, q, &[("q", q), ("out", out)], 3, "[tokens, heads, head_dim]")?;
    check_cu_tensor(op, "cu_seqlens_q", cu_q)?;
    if max_q == 0 {
        return Err(OpError::InvalidArgument { op, message: "max_seqlen_q must be at least 1".into() });
    }
    Ok((q.shape()[0], q.shape()[1], q.shape()[2], cu_q.numel() - 1))
}

fn check_cu_tensor(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    contiguous_nonempty(op, name, t)?;
    expect_dtype(op, name, t, DType::U32)?;
    expect_rank(op, name, t, 1, "[batch + 1]")?;
    if t.numel() < 2 {
        return Err(OpError::Shape {
            op,
            message: format!("`{name}` needs batch + 1 >= 2 entries, has {}", t.numel()),
        });
    }
    Ok(())
}

/// Checks of the varlen entry point that need no device data; returns the launch.
#[allow(clippy::too_many_arguments)]
fn check_varlen<'a>(
    op: &'static str,
    stream: &Stream,
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    cu_q: &'a Tensor,
    cu_k: &'a Tensor,
    max_q: usize,
    scale: Option<f32>,
    causal: bool,
    out: &'a Tensor,
) -> Result<PrefillLaunch<'a>> {
    let (total_q, q_heads, d, batch) = check_queries(op, q, cu_q, max_q, out)?;
    expect_flash_operands(op, q, &[("k", k), ("v", v)], 3, "[tokens, kv_heads, head_dim]")?;
    let (total_k, kv_heads, dv) = (k.shape()[0], k.shape()[1], v.shape()[2]);
    expect_shape(op, "k", k, &[total_k, kv_heads, d])?;
    expect_shape(op, "v", v, &[total_k, kv_heads, dv])?;
    expect_shape(op, "out", out, &[total_q, q_heads, dv])?;
    let group = gqa_group(op, q_heads, kv_heads)?;
    let (head_dim, v_head_dim) = flash_head_dims(op, d, dv)?;
    expect_flash_aligned(op, (head_dim, v_head_dim), &[("q", q), ("out", out), ("k", k), ("v", v)])?;
    check_cu_tensor(op, "cu_seqlens_k", cu_k)?;
    if cu_k.numel() != batch + 1 {
        return Err(OpError::Shape {
            op,
            message: format!("cu_seqlens_q has {} entries, cu_seqlens_k {}", batch + 1, cu_k.numel()),
        });
    }
    same_device(
        op,
        stream,
        &[("q", q), ("k", k), ("v", v), ("out", out), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)],
    )?;
    let scale = resolve_scale(op, scale, d)?;
    let (hq, hkv) = (q_heads * d, kv_heads * d);
    let (hq_v, hkv_v) = (q_heads * dv, kv_heads * dv);
    Ok(PrefillLaunch {
        q,
        k,
        v,
        out,
        cu_q,
        cu_k,
        batch: to_u32(op, "batch", batch)?,
        q_heads: to_u32(op, "query heads", q_heads)?,
        group,
        head_dim,
        v_head_dim,
        max_q,
        total_q: to_u32(op, "query tokens", total_q)?,
        total_k: to_u32(op, "key tokens", total_k)?,
        q_strides: u64s([hq, d, 0]),
        k_strides: u64s([hkv, d, 0]),
        v_strides: u64s([hkv_v, dv, 0]),
        o_strides: u64s([hq_v, dv, 0]),
        scale,
        causal,
        mask_bias: None,
        kv: KvSource::Packed,
    })
}

/// Flash attention over a packed variable-length batch (flash-attn's varlen layout): `q`
/// `[T, Hq, D]`, `k` `[S, Hkv, D]`, `v` `[S, Hkv, Dv]`, sequence `b` owning query rows
/// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and key rows `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`
/// (u32 tensors of `batch + 1` entries, on the device). `max_seqlen_q` must be at least every
/// sequence's query count (rows past it are not computed). Head dims `D` and `Dv` 1 to 1024;
/// `Hq` a multiple of `Hkv`; `scale` `None` means `1 / sqrt(D)`; `out` `[T, Hq, Dv]` in the
/// input dtype. Where `D` and `Dv` are multiples of 4, tensors must start at a multiple of 4
/// elements.
///
/// Neither allocates nor synchronises, so it can be captured; the cumulative lengths are not
/// read on the host (the kernel clamps them to `T` and `S`, so bad values give wrong rows but
/// no out-of-bounds access). The allocating [`attention_prefill_varlen`] checks them.
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_varlen_into(
    stream: &Stream,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    max_seqlen_q: usize,
    scale: Option<f32>,
    causal: bool,
    out: &Tensor,
) -> Result<()> {
    let op = "attention_prefill_varlen";
    let launch = check_varlen(op, stream, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale, causal, out)?;
    launch_prefill(op, stream, &launch)
}

/// Check cumulative lengths read back from the device: start at 0, never decrease, end at
/// `total`; returns the longest sequence.
fn check_cu(op: &'static str, name: &str, cu: &[u32], total: usize) -> Result<usize> {
    let bad = |message: String| Err(OpError::InvalidArgument { op, message: format!("`{name}` {message}") });
    if cu[0] != 0 {
        return bad(format!("must start at 0, starts at {}", cu[0]));
    }
    if let Some(w) = cu.windows(2).position(|w| w[1] < w[0]) {
        return bad(format!("decreases at entry {}: {} then {}", w + 1, cu[w], cu[w + 1]));
    }
    let last = cu[cu.len() - 1] as usize;
    if last != total {
        return bad(format!("ends at {last}, but the tensor has {total} rows"));
    }
    Ok(cu.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0))
}

/// [`attention_prefill_varlen_into`] into a new tensor, on the inputs' default stream. Reads
/// the cumulative lengths back to check them (so it synchronises) and uses `max_seqlen_q`
/// `None` as the longest query sequence.
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    max_seqlen_q: Option<usize>,
    scale: Option<f32>,
    causal: bool,
) -> Result<Tensor> {
    let op = "attention_prefill_varlen";
    let out = Tensor::empty(q.device(), q.dtype(), &out_shape(q, v))?;
    let stream = q.device().default_stream();
    // Shapes and dtypes first, so that reading the lengths back cannot fail obscurely.
    check_varlen(op, &stream, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q.unwrap_or(1), scale, causal, &out)?;
    let longest_q = check_cu(op, "cu_seqlens_q", &cu_seqlens_q.to_vec::<u32>()?, q.shape()[0])?;
    check_cu(op, "cu_seqlens_k", &cu_seqlens_k.to_vec::<u32>()?, k.shape()[0])?;
    let max_q = resolve_max_q(op, max_seqlen_q, longest_q)?;
    attention_prefill_varlen_into(&stream, q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, scale, causal, &out)?;
    Ok(out)
}

/// The output shape `[.., Dv]` of queries `q` `[.., D]` and values `v` `[.., Dv]` (`q`'s
/// shape when either is a scalar: the checks then report the ranks).
fn out_shape(q: &Tensor, v: &Tensor) -> Vec<usize> {
    let mut shape = q.shape().to_vec();
    if let (Some(last), Some(&dv)) = (shape.last_mut(), v.shape().last()) {
        *last = dv;
    }
    shape
}

/// Checks of the cache prefill entry point that need no device data; returns the launch.
#[allow(clippy::too_many_arguments)]
fn check_prefill_cache<'a>(
    op: &'static str,
    stream: &Stream,
    q: &'a Tensor,
    cu_q: &'a Tensor,
    max_q: usize,
    k_cache: &'a Tensor,
    v_cache: &'a Tensor,
    seq_lens: &'a Tensor,
    scale: Option<f32>,
    causal: bool,
    out: &'a Tensor,
) -> Result<PrefillLaunch<'a>> {
    let (total_q, q_heads, d, batch) = check_queries(op, q, cu_q, max_q, out)?;
    expect_flash_operands(
        op,
        q,
        &[("k_cache", k_cache), ("v_cache", v_cache)],
        4,
        "[batch, kv_heads, max_seq_len, head_dim]",
    )?;
    let (kv_heads, s_max, dv) = check_kv_cache(op, (k_cache, v_cache, seq_lens), batch, d)?;
    expect_shape(op, "out", out, &[total_q, q_heads, dv])?;
    let group = gqa_group(op, q_heads, kv_heads)?;
    let (head_dim, v_head_dim) = flash_head_dims(op, d, dv)?;
    let operands = [("q", q), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache)];
    expect_flash_aligned(op, (head_dim, v_head_dim), &operands)?;
    same_device(op, stream, &[("q", q), ("out", out), ("cu_seqlens_q", cu_q)])?;
    same_device(op, stream, &[("k_cache", k_cache), ("v_cache", v_cache), ("seq_lens", seq_lens)])?;
    let scale = resolve_scale(op, scale, d)?;
    Ok(PrefillLaunch {
        q,
        k: k_cache,
        v: v_cache,
        out,
        cu_q,
        cu_k: seq_lens,
        batch: to_u32(op, "batch", batch)?,
        q_heads: to_u32(op, "query heads", q_heads)?,
        group,
        head_dim,
        v_head_dim,
        max_q,
        total_q: to_u32(op, "query tokens", total_q)?,
        total_k: to_u32(op, "max_seq_len", s_max)?,
        q_strides: u64s([q_heads * d, d, 0]),
        k_strides: u64s([d, s_max * d, kv_heads * s_max * d]),
        v_strides: u64s([dv, s_max * dv, kv_heads * s_max * dv]),
        o_strides: u64s([q_heads * dv, dv, 0]),
        scale,
        causal,
        mask_bias: None,
        kv: KvSource::Cache,
    })
}

/// Flash attention of packed new queries against a KV cache: `q` `[T, Hq, D]` with sequence
/// `b` owning rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]`, attending keys `0..seq_lens[b]` of
/// `k_cache` `[B, Hkv, S_max, D]` and `v_cache` `[B, Hkv, S_max, Dv]` (the layout `rope_kv_cache_into` appends to;
/// `seq_lens` u32 `[B]` counts the cached keys including the new ones, clamped to `S_max`).
/// With `causal`, the queries are the last `q_len` positions (aligned to the end), so this is
/// both a first prefill and a chunked prefill continuing a cache. Other rules as
/// [`attention_prefill_varlen_into`]; neither allocates nor synchronises.
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_cache_into(
    stream: &Stream,
    q: &Tensor,
    cu_seqlens_q: &Tensor,
    max_seqlen_q: usize,
    k_cache: &Tensor,
    v_cache: &Tensor,
    seq_lens: &Tensor,
    scale: Option<f32>,
    causal: bool,
    out: &Tensor,
) -> Result<()> {
    let op = "attention_prefill_cache";
    let launch =
        check_prefill_cache(op, stream, q, cu_seqlens_q, max_seqlen_q, k_cache, v_cache, seq_lens, scale, causal, out)?;
    launch_prefill(op, stream, &launch)
}

/// [`attention_prefill_cache_into`] into a new tensor, on the inputs' default stream. Reads
/// `cu_seqlens_q` and `seq_lens` back to check them (`seq_lens[b] <= S_max`), so it
/// synchronises; `max_seqlen_q` `None` is the longest query sequence.
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_cache(
    q: &Tensor,
    cu_seqlens_q: &Tensor,
    max_seqlen_q: Option<usize>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    seq_lens: &Tensor,
    scale: Option<f32>,
    causal: bool,
) -> Result<Tensor> {
    let op = "attention_prefill_cache";
    let out = Tensor::empty(q.device(), q.dtype(), &out_shape(q, v_cache))?;
    let stream = q.device().default_stream();
    let launch = check_prefill_cache(
        op,
        &stream,
        q,
        cu_seqlens_q,
        max_seqlen_q.unwrap_or(1),
        k_cache,
        v_cache,
        seq_lens,
        scale,
        causal,
        &out,
    )?;
    let longest_q = check_cu(op, "cu_seqlens_q", &cu_seqlens_q.to_vec::<u32>()?, q.shape()[0])?;
    let s_max = launch.total_k;
    if let Some((b, len)) = seq_lens.to_vec::<u32>()?.into_iter().enumerate().find(|(_, l)| *l > s_max) {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("seq_lens[{b}] = {len} exceeds the cache's {s_max} positions"),
        });
    }
    let max_q = resolve_max_q(op, max_seqlen_q, longest_q)?;
    attention_prefill_cache_into(&stream, q, cu_seqlens_q, max_q, k_cache, v_cache, seq_lens, scale, causal, &out)?;
    Ok(out)
}

/// `max_seqlen_q` as given (at least the longest query sequence), or that longest.
fn resolve_max_q(op: &'static str, given: Option<usize>, longest_q: usize) -> Result<usize> {
    match given {
        Some(m) if m < longest_q => Err(OpError::InvalidArgument {
            op,
            message: format!("max_seqlen_q = {m} but a sequence has {longest_q} queries"),
        }),
        Some(m) => Ok(m),
        None => Ok(longest_q.max(1)),
    }
}

// ---- decode ----------------------------------------------------------------------------------

/// Most splits a decode workspace may have.
pub const MAX_DECODE_SPLITS: usize = 128;

/// Scratch of split-KV decode: per (sequence, query head, split) an `f32` partial accumulator
/// and its `(max, sum)`. Sized for one query shape `[B, Hq, D]`, a value head dim and a number
/// of splits; reuse it for every decode step of that shape (contents are overwritten each time).
#[derive(Clone)]
pub struct DecodeWorkspace {
    tensor: Tensor,
    batch: usize,
    q_heads: usize,
    head_dim: usize,
    v_head_dim: usize,
    splits: usize,
}

impl DecodeWorkspace {
    /// A workspace for queries shaped like `q` (`[B, Hq, D]`, on `q`'s device) and a V cache
    /// of `q`'s head dim, with `splits` key splits (1 to [`MAX_DECODE_SPLITS`]; see
    /// [`crate::tune::tuned_decode_splits`]).
    pub fn new(q: &Tensor, splits: usize) -> Result<DecodeWorkspace> {
        let d = q.shape().last().copied().unwrap_or(0);
        Self::with_value_head_dim(q, d, splits)
    }

    /// A workspace as [`DecodeWorkspace::new`] for a V cache of head dim `v_head_dim`.
    pub fn with_value_head_dim(q: &Tensor, v_head_dim: usize, splits: usize) -> Result<DecodeWorkspace> {
        let op = "DecodeWorkspace::new";
        expect_rank(op, "q", q, 3, "[batch, heads, head_dim]")?;
        if !(1..=MAX_DECODE_SPLITS).contains(&splits) {
            return Err(OpError::InvalidArgument {
                op,
                message: format!("splits must be 1..={MAX_DECODE_SPLITS}, got {splits}"),
            });
        }
        let (batch, q_heads, head_dim) = (q.shape()[0], q.shape()[1], q.shape()[2]);
        let len = decode_workspace_len(batch, q_heads, v_head_dim, splits);
        if len == 0 || head_dim == 0 {
            return Err(OpError::Shape {
                op,
                message: format!("`q` (shape {:?}) or the value head dim ({v_head_dim}) is empty", q.shape()),
            });
        }
        let tensor = Tensor::empty(q.device(), DType::F32, &[len])?;
        Ok(DecodeWorkspace { tensor, batch, q_heads, head_dim, v_head_dim, splits })
    }

    pub fn splits(&self) -> usize {
        self.splits
    }

    /// The underlying `f32` buffer.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

/// A number of key splits for decode: enough blocks to fill a large GPU (about 256 in all),
/// without splits shorter than 256 keys of the cache capacity `s_max`.
pub fn decode_splits(batch: usize, q_heads: usize, kv_heads: usize, head_dim: usize, s_max: usize) -> usize {
    let d = head_dim.clamp(1, 1024) as u32;
    let rows = Geometry::new(d, d).rows as usize;
    let group = q_heads.checked_div(kv_heads).unwrap_or(1).max(1);
    let blocks = batch.max(1) * kv_heads.max(1) * group.div_ceil(rows);
    let wanted = 256usize.div_ceil(blocks);
    let longest = s_max.div_ceil(256).max(1);
    wanted.min(longest).clamp(1, 32)
}

/// Decode attention: one new query per sequence against a contiguous KV cache. `q` `[B, Hq,
/// D]`, `k_cache` `[B, Hkv, S_max, D]`, `v_cache` `[B, Hkv, S_max, Dv]` (head dims 1 to 1024),
/// `seq_lens` u32 `[B]` (keys `0..seq_lens[b]` of sequence `b`, clamped to `S_max`; a length of
/// 0 gives zeros), `out` `[B, Hq, Dv]`. Each
/// block reads a split of one (sequence, KV head)'s keys once for all query heads of that GQA
/// group; a combine kernel merges the splits' `f32` partials. The split count is the
/// workspace's; each split covers `ceil(S_max / splits)` keys rounded up to the tile. Neither
/// allocates nor synchronises (capturable): lengths stay on the device.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_into(
    stream: &Stream,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    seq_lens: &Tensor,
    scale: Option<f32>,
    workspace: &DecodeWorkspace,
    out: &Tensor,
) -> Result<()> {
    let op = "attention_decode";
    float_dtype(op, q)?;
    let operands = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)];
    for (name, t) in operands {
        contiguous_nonempty(op, name, t)?;
        expect_dtype(op, name, t, q.dtype())?;
    }
    expect_rank(op, "q", q, 3, "[batch, heads, head_dim]")?;
    expect_rank(op, "k_cache", k_cache, 4, "[batch, kv_heads, max_seq_len, head_dim]")?;
    expect_rank(op, "v_cache", v_cache, 4, "[batch, kv_heads, max_seq_len, v_head_dim]")?;
    let (batch, q_heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let (kv_heads, s_max, dv) = check_kv_cache(op, (k_cache, v_cache, seq_lens), batch, d)?;
    expect_shape(op, "out", out, &[batch, q_heads, dv])?;
    let group = gqa_group(op, q_heads, kv_heads)?;
    let (head_dim, v_head_dim) = flash_head_dims(op, d, dv)?;
    expect_flash_aligned(op, (head_dim, v_head_dim), &operands)?;
    let ws = workspace;
    if (ws.batch, ws.q_heads, ws.head_dim, ws.v_head_dim) != (batch, q_heads, d, dv) {
        return Err(OpError::Shape {
            op,
            message: format!(
                "the workspace was made for queries [{}, {}, {}] and a value head dim of {}, `q` is {:?} and `v_cache` {:?}",
                ws.batch,
                ws.q_heads,
                ws.head_dim,
                ws.v_head_dim,
                q.shape(),
                v_cache.shape()
            ),
        });
    }
    same_device(op, stream, &[("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("seq_lens", seq_lens)])?;
    same_device(op, stream, &[("out", out), ("workspace", &ws.tensor)])?;
    let scale = resolve_scale(op, scale, d)?;
    let cfg = AttentionDecodeConfig { dtype: q.dtype().scalar_type(), head_dim, v_head_dim };
    let geo = cfg.geometry();
    let keys = geo.keys as usize;
    let split_len = s_max.div_ceil(ws.splits).div_ceil(keys) * keys;
    let head_chunks = (group as usize).div_ceil(geo.rows as usize);
    let y = grid_limit(op, "key/value heads × head chunks", kv_heads * head_chunks, 65535)?;
    let z = grid_limit(op, "batch", batch, 65535)?;
    let splits = to_u32(op, "splits", ws.splits)?;
    let rows = grid_limit(op, "batch × query heads", batch * q_heads, i32::MAX as usize)?;
    let partial = kernel(cfg.id(), || kern::attention_decode(&cfg))?;
    let combine = kernel(cfg.combine_id(), || kern::attention_decode_combine(&cfg))?;
    let args = AttentionDecodeParams {
        q,
        k_cache,
        v_cache,
        seq_lens,
        workspace: &ws.tensor,
        scale,
        s_max: to_u32(op, "max_seq_len", s_max)?,
        kv_heads: to_u32(op, "kv heads", kv_heads)?,
        group,
        split_len: to_u32(op, "split length", split_len)?,
    };
    let launch = LaunchConfig { grid: [splits, y, z], block: [THREADS, 1, 1], dynamic_shared_bytes: 0 };
    params::launch(stream, &partial, launch, &args.args())?;
    let args = AttentionDecodeCombineParams { workspace: &ws.tensor, out, splits };
    params::launch(stream, &combine, LaunchConfig::linear(rows, v_head_dim), &args.args())
}

/// [`attention_decode_into`] into a new tensor with a new workspace, on `q`'s default stream:
/// [`decode_splits`] splits on the CPU and with `RUDA_AUTOTUNE=off`, else the split count
/// autotuned on the GPU ([`crate::tune::attention_decode_tuned`]).
pub fn attention_decode(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    seq_lens: &Tensor,
    scale: Option<f32>,
) -> Result<Tensor> {
    let op = "attention_decode";
    expect_rank(op, "q", q, 3, "[batch, heads, head_dim]")?;
    expect_rank(op, "k_cache", k_cache, 4, "[batch, kv_heads, max_seq_len, head_dim]")?;
    crate::tune::attention_decode_tuned(q, k_cache, v_cache, seq_lens, scale)
}

// ---- the general entry point ----------------------------------------------------------------

type SetupResult<T> = std::result::Result<T, AttentionSetupError>;

/// Strides (batch, head, query, key) of a mask or bias broadcast to `scores` = `[B, H, T, S]`
/// (numpy rules, aligned to the right: each dimension absent, 1, or equal).
fn broadcast_strides(name: &'static str, t: &Tensor, scores: [usize; 4]) -> SetupResult<[u64; 4]> {
    let bad = || AttentionSetupError::MaskShape { name, shape: t.shape().to_vec(), scores };
    if t.rank() > 4 || t.rank() == 0 {
        return Err(bad());
    }
    let mut strides = [0u64; 4];
    let lead = 4 - t.rank();
    for (i, (&dim, &stride)) in t.shape().iter().zip(t.strides()).enumerate() {
        let want = scores[lead + i];
        if dim == want && dim != 1 {
            strides[lead + i] = stride as u64;
        } else if dim != 1 {
            return Err(bad());
        }
    }
    Ok(strides)
}

/// Attention: `softmax(query · keyᵀ · scale + attn_bias, masked) ·
/// value`.
///
/// Layouts: `query` `[B, Hq, T, D]`, `key` `[B, Hkv, S, D]` and `value` `[B, Hkv, S, Dv]` (the
/// layout of SDPA and of Hugging Face's attention), or the same without the batch axis
/// (`[Hq, T, D]`, `[Hkv, S, D]`, `[Hkv, S, Dv]`); the result is `[B, Hq, T, Dv]` (or
/// `[Hq, T, Dv]`) in `query`'s dtype. F32, F16 or BF16, one dtype for
/// the three, contiguous and non-empty, on one device; `Hq` a multiple of `Hkv` (GQA).
///
/// `mask`: U8, nonzero where a query may attend a key (PyTorch's boolean mask), and `attn_bias`:
/// F32, F16 or BF16, added to the scaled scores; each broadcasts to `[B, Hq, T, S]` (numpy
/// rules). With `options.causal` as well, a key must pass both. A query that may attend no key
/// gives zeros.
pub fn attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: Option<&Tensor>,
    attn_bias: Option<&Tensor>,
    options: &AttentionOptions,
    strategy: AttentionStrategy,
) -> SetupResult<Tensor> {
    let op = "attention";
    float_dtype(op, query)?;
    for (name, t) in [("query", query), ("key", key), ("value", value)] {
        contiguous_nonempty(op, name, t)?;
        expect_dtype(op, name, t, query.dtype())?;
        if t.rank() != query.rank() || !(3..=4).contains(&t.rank()) {
            return Err(AttentionSetupError::Shape(format!(
                "query, key and value must all be [batch, heads, seq, head_dim] or [heads, seq, head_dim]; got {:?}, {:?}, {:?}",
                query.shape(),
                key.shape(),
                value.shape()
            )));
        }
    }
    // View everything as rank 4.
    let as4 = |t: &Tensor| -> SetupResult<Tensor> {
        if t.rank() == 4 {
            Ok(t.clone())
        } else {
            let mut s = vec![1];
            s.extend_from_slice(t.shape());
            Ok(t.reshape(&s)?)
        }
    };
    let (q, k, v) = (as4(query)?, as4(key)?, as4(value)?);
    let [b, hq, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let [hkv, s, dv] = [k.shape()[1], k.shape()[2], v.shape()[3]];
    expect_shape(op, "key", &k, &[b, hkv, s, d])?;
    expect_shape(op, "value", &v, &[b, hkv, s, dv])?;
    let group = gqa_group(op, hq, hkv)?;
    let stream = query.device().default_stream();
    same_device(op, &stream, &[("query", query), ("key", key), ("value", value)])?;
    let scale = options.scale.unwrap_or(1.0 / (d as f32).sqrt());
    if !scale.is_finite() {
        return Err(AttentionSetupError::Scale(scale));
    }
    let scores = [b, hq, t, s];

    // Mask and bias, broadcast by strides; a missing one is a single neutral element.
    let dev = query.device();
    let mask_t = match mask {
        Some(m) => {
            if m.dtype() != DType::U8 {
                return Err(AttentionSetupError::DType(format!(
                    "`mask` is {}, expected u8 (nonzero = attend)",
                    m.dtype()
                )));
            }
            contiguous_nonempty(op, "mask", m)?;
            same_device(op, &stream, &[("mask", m)])?;
            Some((m.clone(), broadcast_strides("mask", m, scores)?))
        }
        None => None,
    };
    let bias_t = match attn_bias {
        Some(x) => {
            float_dtype(op, x)?;
            contiguous_nonempty(op, "attn_bias", x)?;
            same_device(op, &stream, &[("attn_bias", x)])?;
            let strides = broadcast_strides("attn_bias", x, scores)?;
            let x = if x.dtype() == DType::F32 { x.clone() } else { crate::api::cast(x, DType::F32)? };
            Some((x, strides))
        }
        None => None,
    };
    let masked = mask_t.is_some() || bias_t.is_some();
    let (mask_t, bias_t) = if masked {
        let m = match mask_t {
            Some(m) => m,
            None => (Tensor::from_slice(dev, &[1u8], &[1])?, [0; 4]),
        };
        let x = match bias_t {
            Some(x) => x,
            None => (Tensor::from_slice(dev, &[0f32], &[1])?, [0; 4]),
        };
        (Some(m), Some(x))
    } else {
        (None, None)
    };
    let mask_bias = match (&mask_t, &bias_t) {
        (Some((m, ms)), Some((x, xs))) => Some(MaskBias { mask: m, mask_strides: *ms, bias: x, bias_strides: *xs }),
        _ => None,
    };

    let flash_ok = flash_takes(d) && flash_takes(dv);
    let aligned =
        !flash_ok || !Geometry::new(d as u32, dv as u32).vector() || [&q, &k, &v].iter().all(|t| vector_aligned(t));
    let use_flash = match strategy {
        AttentionStrategy::FlashUnit => {
            if !flash_ok {
                return Err(AttentionSetupError::UnsupportedHeadDim { head_dim: d, v_head_dim: dv, strategy });
            }
            if !aligned {
                return Err(AttentionSetupError::Unsupported(
                    "FlashUnit needs query, key and value to start at a multiple of 4 elements".into(),
                ));
            }
            true
        }
        AttentionStrategy::Fallback => false,
        AttentionStrategy::Autotune => flash_ok && aligned,
    };
    let out = Tensor::empty(dev, q.dtype(), &[b, hq, t, dv])?;
    let ctx = Dense { q: &q, k: &k, v: &v, out: &out, b, hq, hkv, t, s, d, dv, group, scale, causal: options.causal };
    if use_flash {
        flash_dense(&stream, &ctx, mask_bias)?;
    } else {
        fallback_dense(&stream, &ctx, mask_bias.as_ref())?;
    }
    Ok(if query.rank() == 3 { out.reshape(&[hq, t, dv])? } else { out })
}

/// A validated batched attention problem in the `[B, H, T, D]` layout.
struct Dense<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    out: &'a Tensor,
    b: usize,
    hq: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
    /// The head dim of `v` and `out`.
    dv: usize,
    group: u32,
    scale: f32,
    causal: bool,
}

/// The flash kernel over `[B, H, T, D]`: sequence `b` is rows `b·T..` of a packed index, with a
/// batch stride that makes up the difference (see [`AttentionPrefillConfig`]).
fn flash_dense(stream: &Stream, c: &Dense<'_>, mask_bias: Option<MaskBias<'_>>) -> SetupResult<()> {
    let op = "attention";
    let dev = c.q.device();
    let cu = |n: usize| -> SetupResult<Tensor> {
        let v: Vec<u32> = (0..=c.b).map(|i| to_u32(op, "batch × sequence", i * n)).collect::<Result<_>>()?;
        Ok(Tensor::from_slice(dev, &v, &[c.b + 1])?)
    };
    let (cu_q, cu_k) = (cu(c.t)?, cu(c.s)?);
    let launch = PrefillLaunch {
        q: c.q,
        k: c.k,
        v: c.v,
        out: c.out,
        cu_q: &cu_q,
        cu_k: &cu_k,
        batch: to_u32(op, "batch", c.b)?,
        q_heads: to_u32(op, "query heads", c.hq)?,
        group: c.group,
        head_dim: c.d as u32,
        v_head_dim: c.dv as u32,
        max_q: c.t,
        total_q: to_u32(op, "batch × queries", c.b * c.t)?,
        total_k: to_u32(op, "batch × keys", c.b * c.s)?,
        q_strides: u64s([c.d, c.t * c.d, (c.hq - 1) * c.t * c.d]),
        k_strides: u64s([c.d, c.s * c.d, (c.hkv - 1) * c.s * c.d]),
        v_strides: u64s([c.dv, c.s * c.dv, (c.hkv - 1) * c.s * c.dv]),
        o_strides: u64s([c.dv, c.t * c.dv, (c.hq - 1) * c.t * c.dv]),
        scale: c.scale,
        causal: c.causal,
        mask_bias,
        kv: KvSource::Packed,
    };
    launch_prefill(op, stream, &launch)?;
    Ok(())
}

/// The multi-kernel path, in f32: per (sequence, head) `scores = q · kᵀ` (GEMM), the masked
/// softmax, `out = probs · v` (GEMM); casts around it for f16/bf16.
fn fallback_dense(stream: &Stream, c: &Dense<'_>, mask_bias: Option<&MaskBias<'_>>) -> SetupResult<()> {
    let op = "attention";
    let dev = c.q.device();
    let f32_of = |x: &Tensor| -> SetupResult<Tensor> {
        Ok(if x.dtype() == DType::F32 { x.clone() } else { crate::api::cast(x, DType::F32)? })
    };
    let (q, k, v) = (f32_of(c.q)?, f32_of(c.k)?, f32_of(c.v)?);
    let out = if c.out.dtype() == DType::F32 { c.out.clone() } else { Tensor::empty(dev, DType::F32, c.out.shape())? };
    let scores = Tensor::empty(dev, DType::F32, &[c.t, c.s])?;
    let probs = Tensor::empty(dev, DType::F32, &[c.t, c.s])?;
    let q3 = q.reshape(&[c.b * c.hq, c.t, c.d])?;
    let k3 = k.reshape(&[c.b * c.hkv, c.s, c.d])?;
    let v3 = v.reshape(&[c.b * c.hkv, c.s, c.dv])?;
    let o3 = out.reshape(&[c.b * c.hq, c.t, c.dv])?;
    let slice = |x: &Tensor, i: usize, rows: usize| -> SetupResult<Tensor> {
        let cols = x.shape()[2];
        Ok(x.narrow(0, i, 1)?.reshape(&[rows, cols])?)
    };
    let cfg = AttentionSoftmaxConfig { causal: c.causal, masked: mask_bias.is_some() };
    let softmax = kernel(cfg.id(), || kern::attention_softmax(&cfg))?;
    let (q_len, kv_len) = (to_u32(op, "queries", c.t)?, to_u32(op, "keys", c.s)?);
    for bi in 0..c.b {
        for h in 0..c.hq {
            let kv = bi * c.hkv + h / c.group as usize;
            let qs = slice(&q3, bi * c.hq + h, c.t)?;
            crate::api::linear_into(stream, &qs, &slice(&k3, kv, c.s)?, &scores)?;
            let (ms, bs) = (mask_bias.map(|m| m.mask_strides), mask_bias.map(|m| m.bias_strides));
            let args = AttentionSoftmaxParams {
                scores: &scores,
                probs: &probs,
                mask: mask_bias.map(|m| m.mask),
                bias: mask_bias.map(|m| m.bias),
                scale: c.scale,
                q_len,
                kv_len,
                batch: mask_bias.map(|_| to_u32(op, "batch", bi)).transpose()?,
                head: mask_bias.map(|_| to_u32(op, "head", h)).transpose()?,
                mask_batch: nth(ms, 0),
                mask_head: nth(ms, 1),
                mask_query: nth(ms, 2),
                mask_key: nth(ms, 3),
                bias_batch: nth(bs, 0),
                bias_head: nth(bs, 1),
                bias_query: nth(bs, 2),
                bias_key: nth(bs, 3),
            };
            params::launch(stream, &softmax, LaunchConfig::linear(q_len, SOFTMAX_THREADS), &args.args())?;
            crate::api::matmul_into(stream, &probs, &slice(&v3, kv, c.s)?, &slice(&o3, bi * c.hq + h, c.t)?)?;
        }
    }
    if c.out.dtype() != DType::F32 {
        crate::api::cast_into(stream, &out, c.out)?;
    }
    Ok(())
}
