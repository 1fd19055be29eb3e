//! The gated delta rule's entry points: [`chunk_gated_delta_rule`] for prefill and
//! [`gated_delta_rule`] token by token (the math in the [module](super) documentation).

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{GatedDeltaConfig, GatedDeltaParams, STATIC_SHARED_LIMIT, V_TILE};
use crate::error::OpError;
use crate::host::*;
use crate::params;

/// Why a gated delta entry point refused its inputs or failed to run (the error of every op).
pub type GatedDeltaError = OpError;

/// The inputs of [`chunk_gated_delta_rule`] and [`gated_delta_rule`]. All tensors contiguous,
/// non-empty and on one device; `query`/`key` already normalised (the caller's job).
#[derive(Clone, Copy, Debug)]
pub struct GatedDeltaInput<'a> {
    /// `[B, Hk, T, K]`, `f32`, `f16` or `bf16`.
    pub query: &'a Tensor,
    /// `[B, Hk, T, K]`, the query's dtype.
    pub key: &'a Tensor,
    /// `[B, Hv, T, V]`, the query's dtype; `Hk` divides `Hv`.
    pub value: &'a Tensor,
    /// `[B, Hv, T]`, the query's dtype or `f32` (the same as `log_decay`).
    pub beta: &'a Tensor,
    /// `g` per position, `[B, Hv, T]`, the query's dtype or `f32` (the same as `beta`).
    pub log_decay: &'a Tensor,
    /// `f32 [B, Hv, K, V]`; zeros when `None`. Never written.
    pub initial_state: Option<&'a Tensor>,
    /// Multiplier of the query (`K^-½` in the model); finite.
    pub query_scale: f32,
}

/// The result of [`chunk_gated_delta_rule`] and [`gated_delta_rule`].
#[derive(Debug)]
pub struct GatedDeltaOutput {
    /// `[B, Hv, T, V]`, the query's dtype.
    pub output: Tensor,
    /// `f32 [B, Hv, K, V]`: the state after the last position; the next segment's
    /// `initial_state`.
    pub final_state: Tensor,
}

/// A checked problem.
struct Problem {
    cfg: GatedDeltaConfig,
    batch: u32,
    key_heads: u32,
    value_heads: u32,
    seq_len: u32,
}

fn shape_error(op: &'static str, message: String) -> OpError {
    OpError::Shape { op, message }
}

/// `t` as `[d0, d1, ...]` of `rank` axes, or an error naming it.
fn expect_rank<'s>(
    op: &'static str,
    what: &str,
    t: &'s Tensor,
    rank: usize,
    axes: &str,
) -> Result<&'s [usize], OpError> {
    contiguous_nonempty(op, what, t)?;
    if t.rank() != rank {
        return Err(shape_error(op, format!("`{what}` must be {axes}, is {:?}", t.shape())));
    }
    Ok(t.shape())
}

fn check(op: &'static str, stream: &Stream, input: &GatedDeltaInput<'_>) -> Result<Problem, OpError> {
    let GatedDeltaInput { query, key, value, beta, log_decay, initial_state, query_scale } = *input;
    let dtype = float_dtype(op, query)?;
    let q = expect_rank(op, "query", query, 4, "[batch, key_heads, tokens, key_dim]")?;
    let (batch, key_heads, seq_len, k_dim) = (q[0], q[1], q[2], q[3]);
    let k = expect_rank(op, "key", key, 4, "[batch, key_heads, tokens, key_dim]")?;
    if k != q {
        return Err(shape_error(op, format!("`key` is {k:?}, expected the query's {q:?}")));
    }
    let v = expect_rank(op, "value", value, 4, "[batch, value_heads, tokens, value_dim]")?;
    let (value_heads, v_dim) = (v[1], v[3]);
    if v[0] != batch || v[2] != seq_len {
        return Err(shape_error(
            op,
            format!("`value` is {v:?}, expected [{batch}, value_heads, {seq_len}, value_dim] (the query's batch and tokens)"),
        ));
    }
    if value_heads % key_heads != 0 {
        return Err(shape_error(
            op,
            format!("the key heads ({key_heads}) must divide the value heads ({value_heads})"),
        ));
    }
    for (what, t) in [("key", key), ("value", value)] {
        expect_dtype(op, what, t, query.dtype())?;
    }
    let gate_shape = [batch, value_heads, seq_len];
    for (what, t) in [("beta", beta), ("log_decay", log_decay)] {
        expect_rank(op, what, t, 3, "[batch, value_heads, tokens]")?;
        expect_shape(op, what, t, &gate_shape)?;
        if t.dtype() != query.dtype() && t.dtype() != DType::F32 {
            return Err(OpError::DType {
                op,
                message: format!("`{what}` is {}, expected the query's {} or f32", t.dtype(), query.dtype()),
            });
        }
    }
    if beta.dtype() != log_decay.dtype() {
        return Err(OpError::DType {
            op,
            message: format!(
                "`beta` is {} but `log_decay` {}: they must share a dtype",
                beta.dtype(),
                log_decay.dtype()
            ),
        });
    }
    if let Some(s) = initial_state {
        expect_rank(op, "initial_state", s, 4, "[batch, value_heads, key_dim, value_dim]")?;
        expect_dtype(op, "initial_state", s, DType::F32)?;
        expect_shape(op, "initial_state", s, &[batch, value_heads, k_dim, v_dim])?;
    }
    if !query_scale.is_finite() {
        return Err(OpError::InvalidArgument { op, message: format!("query_scale must be finite, got {query_scale}") });
    }
    let mut tensors = vec![("query", query), ("key", key), ("value", value), ("beta", beta), ("log_decay", log_decay)];
    tensors.extend(initial_state.map(|s| ("initial_state", s)));
    same_device(op, stream, &tensors)?;
    // Offsets within a head are u32; the grid's y and z axes hold at most 65535.
    to_u32(op, "tokens × key_dim", seq_len * k_dim)?;
    to_u32(op, "tokens × value_dim", seq_len * v_dim)?;
    to_u32(op, "key_dim × value_dim", k_dim * v_dim)?;
    for (what, n) in [("value_heads", value_heads), ("batch", batch)] {
        if n > 65535 {
            return Err(OpError::InvalidArgument { op, message: format!("{what} = {n} exceeds the grid's 65535") });
        }
    }
    let gate_dtype = beta.dtype().scalar_type();
    let cfg = GatedDeltaConfig { dtype, gate_dtype, k_dim: k_dim as u32, v_dim: v_dim as u32 };
    Ok(Problem {
        cfg,
        batch: batch as u32,
        key_heads: key_heads as u32,
        value_heads: value_heads as u32,
        seq_len: seq_len as u32,
    })
}

/// The shared memory a block may use on `stream`'s device: the static window (these kernels
/// use no dynamic shared memory), or less where the device allows less.
fn shared_limit(stream: &Stream) -> u64 {
    let device = stream.device().cuda_info().map_or(u32::MAX, |i| i.max_shared_memory_per_block_optin);
    STATIC_SHARED_LIMIT.min(device) as u64
}

/// Allocate the results and launch `k`.
fn run(
    stream: &Stream,
    input: &GatedDeltaInput<'_>,
    p: &Problem,
    k: &ruda_runtime::HashedKernel,
) -> Result<GatedDeltaOutput, OpError> {
    let query = input.query;
    let (b, hv, t) = (p.batch as usize, p.value_heads as usize, p.seq_len as usize);
    let (kd, vd) = (p.cfg.k_dim as usize, p.cfg.v_dim as usize);
    let output = Tensor::empty_on(stream, query.dtype(), &[b, hv, t, vd])?;
    let final_state = Tensor::empty_on(stream, DType::F32, &[b, hv, kd, vd])?;
    let zeros;
    let initial_state = match input.initial_state {
        Some(s) => s,
        None => {
            zeros = Tensor::zeros_on(stream, DType::F32, &[b, hv, kd, vd])?;
            &zeros
        }
    };
    let args = GatedDeltaParams {
        query,
        key: input.key,
        value: input.value,
        beta: input.beta,
        log_decay: input.log_decay,
        initial_state,
        output: &output,
        final_state: &final_state,
        key_heads: p.key_heads,
        value_heads: p.value_heads,
        seq_len: p.seq_len,
        query_scale: input.query_scale,
    };
    let launch = LaunchConfig {
        grid: [p.cfg.v_tiles(), p.value_heads, p.batch],
        block: [V_TILE, 1, 1],
        dynamic_shared_bytes: 0,
    };
    params::launch(stream, k, launch, &args.args())?;
    Ok(GatedDeltaOutput { output, final_state })
}

/// The gated delta rule over whole sequences by chunks of `chunk_size` positions (prefill): the
/// same result as [`gated_delta_rule`] up to rounding. The final chunk is padded and the padding
/// excluded. `chunk_size` must be positive, and its triangular workspace of `4 · (C² + C)`
/// bytes, with the block's state tile (`4 · K · 32`) and corrected values (`4 · C · 32`), must
/// fit the shared memory a block may use (48 KiB: C = 64 fits K = 128).
pub fn chunk_gated_delta_rule(
    input: GatedDeltaInput<'_>,
    chunk_size: usize,
) -> Result<GatedDeltaOutput, GatedDeltaError> {
    let op = "chunk_gated_delta_rule";
    let stream = input.query.device().default_stream();
    let p = check(op, &stream, &input)?;
    if chunk_size == 0 {
        return Err(OpError::InvalidArgument { op, message: "chunk_size must be positive, got 0".into() });
    }
    let limit = shared_limit(&stream);
    let c = chunk_size as u64;
    // Past 2¹⁶ the workspace alone is 16 GiB: no device has it, and C² stays in u32 below.
    if chunk_size > 1 << 16 || p.cfg.chunk_shared_bytes(chunk_size as u32) > limit {
        return Err(OpError::InvalidArgument {
            op,
            message: format!(
                "chunk_size {chunk_size} needs a workspace of 4 · (C² + C) = {} bytes plus {} of state and values \
                 (key_dim {}), more than the {limit} bytes of shared memory a block may use",
                4u64.saturating_mul(c.saturating_mul(c).saturating_add(c)),
                (4 * V_TILE as u64).saturating_mul((p.cfg.k_dim as u64).saturating_add(c)),
                p.cfg.k_dim
            ),
        });
    }
    let chunk = chunk_size as u32;
    let cfg = p.cfg;
    let k = kernel(cfg.chunk_id(chunk), || crate::kernels::gated_delta::gated_delta_chunk(&cfg, chunk))?;
    run(&stream, &input, &p, &k)
}

/// The gated delta rule token by token (decode, or short sequences).
pub fn gated_delta_rule(input: GatedDeltaInput<'_>) -> Result<GatedDeltaOutput, GatedDeltaError> {
    let op = "gated_delta_rule";
    let stream = input.query.device().default_stream();
    let p = check(op, &stream, &input)?;
    let cfg = p.cfg;
    let (shared, limit) = (cfg.shared_bytes(), shared_limit(&stream));
    if shared > limit {
        return Err(OpError::InvalidArgument {
            op,
            message: format!(
                "key_dim {} needs {shared} bytes of shared memory per block for its state tile, more than the {limit} a \
                 block may use",
                cfg.k_dim
            ),
        });
    }
    let k = kernel(cfg.id(), || crate::kernels::gated_delta::gated_delta(&cfg))?;
    run(&stream, &input, &p, &k)
}
