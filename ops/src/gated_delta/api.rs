//! The gated delta rule's entry points: [`chunk_gated_delta_rule`] for prefill and
//! [`gated_delta_rule`] token by token (the math in the [module](super) documentation), over
//! `[B, H, T, ·]` tensors or, in the `_varlen` forms, packed sequences `[total, H, ·]` cut by
//! `cu_seqlens`.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{GatedDeltaConfig, GatedDeltaParams, STATIC_SHARED_LIMIT, V_TILE};
use crate::error::OpError;
use crate::host::*;
use crate::params;

/// Why a gated delta entry point refused its inputs or failed to run (the error of every op).
pub type GatedDeltaError = OpError;

/// The inputs of [`chunk_gated_delta_rule`] and [`gated_delta_rule`]. All tensors contiguous,
/// non-empty and on one device; `query`/`key` already normalised (the caller's job). The shapes
/// below are the dense ones; the `_varlen` forms take `[total, H, ·]` (see
/// [`chunk_gated_delta_rule_varlen`]). On the CPU device every tensor must be its own memory
/// (the interpreter gives each buffer argument exclusive access), so `query` and `key` may not
/// be one tensor there.
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
    /// Sequences (`B`, or `N` packed).
    batch: u32,
    key_heads: u32,
    value_heads: u32,
    /// Tokens per sequence (`T`); packed, the total.
    tokens: u32,
}

/// Where the tokens are.
#[derive(Clone, Copy)]
enum Layout<'a> {
    /// `[B, H, T, ·]`.
    Dense,
    /// `[total, H, ·]`, sequence `s` owning tokens `cu[s]..cu[s + 1]` (checked on the host).
    Packed(&'a Tensor, &'a [u32]),
    /// `[N, H, ·]`, one token per sequence (decode): the dense kernel with `T = 1`.
    Decode,
}

fn shape_error(op: &'static str, message: String) -> OpError {
    OpError::Shape { op, message }
}

/// `t`'s shape if it has `rank` axes (named `axes` in the error) and is contiguous and non-empty.
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

fn check(
    op: &'static str,
    stream: &Stream,
    input: &GatedDeltaInput<'_>,
    layout: Layout<'_>,
) -> Result<Problem, OpError> {
    let GatedDeltaInput { query, key, value, beta, log_decay, initial_state, query_scale } = *input;
    let dtype = float_dtype(op, query)?;
    let packed = matches!(layout, Layout::Packed(..));
    let decode = matches!(layout, Layout::Decode);
    // Shapes as [B, H, T, D] (packed: B = 1 and T the total, heads and tokens swapped; decode:
    // T = 1).
    let (rank, qk_axes, v_axes, gate_axes) = if decode {
        (3, "[sequences, key_heads, key_dim]", "[sequences, value_heads, value_dim]", "[sequences, value_heads]")
    } else if packed {
        (3, "[tokens, key_heads, key_dim]", "[tokens, value_heads, value_dim]", "[tokens, value_heads]")
    } else {
        (
            4,
            "[batch, key_heads, tokens, key_dim]",
            "[batch, value_heads, tokens, value_dim]",
            "[batch, value_heads, tokens]",
        )
    };
    let as_dense = |s: &[usize]| {
        if decode {
            [s[0], s[1], 1, s[2]]
        } else if packed {
            [1, s[1], s[0], s[2]]
        } else {
            [s[0], s[1], s[2], s[3]]
        }
    };
    let q = expect_rank(op, "query", query, rank, qk_axes)?;
    let [batch, key_heads, tokens, k_dim] = as_dense(q);
    let k = expect_rank(op, "key", key, rank, qk_axes)?;
    if k != q {
        return Err(shape_error(op, format!("`key` is {k:?}, expected the query's {q:?}")));
    }
    let v = expect_rank(op, "value", value, rank, v_axes)?;
    let [v_batch, value_heads, v_tokens, v_dim] = as_dense(v);
    if v_batch != batch || v_tokens != tokens {
        return Err(shape_error(op, format!("`value` is {v:?}, expected {v_axes} with the query's batch and tokens")));
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
    let gate_shape: Vec<usize> = if decode {
        vec![batch, value_heads]
    } else if packed {
        vec![tokens, value_heads]
    } else {
        vec![batch, value_heads, tokens]
    };
    for (what, t) in [("beta", beta), ("log_decay", log_decay)] {
        expect_rank(op, what, t, rank - 1, gate_axes)?;
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
    let sequences = match layout {
        Layout::Dense | Layout::Decode => batch,
        Layout::Packed(_, cu) => cu.len() - 1,
    };
    if let Some(s) = initial_state {
        expect_rank(op, "initial_state", s, 4, "[sequences, value_heads, key_dim, value_dim]")?;
        expect_dtype(op, "initial_state", s, DType::F32)?;
        expect_shape(op, "initial_state", s, &[sequences, value_heads, k_dim, v_dim])?;
    }
    if !query_scale.is_finite() {
        return Err(OpError::InvalidArgument { op, message: format!("query_scale must be finite, got {query_scale}") });
    }
    let mut tensors = vec![("query", query), ("key", key), ("value", value), ("beta", beta), ("log_decay", log_decay)];
    tensors.extend(initial_state.map(|s| ("initial_state", s)));
    if let Layout::Packed(cu, values) = layout {
        tensors.push(("cu_seqlens", cu));
        check_cu(op, values, tokens)?;
    }
    same_device(op, stream, &tensors)?;
    // Offsets within a head (packed: within the tensor) are u32; the grid's y and z axes hold
    // at most 65535.
    let heads = |h: usize| if packed || decode { h } else { 1 };
    to_u32(op, "tokens × key_dim", tokens * heads(key_heads) * k_dim)?;
    to_u32(op, "tokens × value_dim", tokens * heads(value_heads) * v_dim)?;
    to_u32(op, "key_dim × value_dim", k_dim * v_dim)?;
    for (what, n) in [("value_heads", value_heads), ("sequences", sequences)] {
        if n > 65535 {
            return Err(OpError::InvalidArgument { op, message: format!("{what} = {n} exceeds the grid's 65535") });
        }
    }
    let gate_dtype = beta.dtype().scalar_type();
    let cfg = GatedDeltaConfig { dtype, gate_dtype, k_dim: k_dim as u32, v_dim: v_dim as u32, packed, slots: false };
    Ok(Problem {
        cfg,
        batch: sequences as u32,
        key_heads: key_heads as u32,
        value_heads: value_heads as u32,
        tokens: tokens as u32,
    })
}

/// `cu_seqlens` as a `u32 [N + 1]` tensor on the host: from 0, non-decreasing, to `total`.
fn read_cu(op: &'static str, cu: &Tensor) -> Result<Vec<u32>, OpError> {
    expect_rank(op, "cu_seqlens", cu, 1, "[sequences + 1]")?;
    expect_dtype(op, "cu_seqlens", cu, DType::U32)?;
    if cu.numel() < 2 {
        return Err(shape_error(op, format!("`cu_seqlens` needs sequences + 1 >= 2 entries, has {}", cu.numel())));
    }
    Ok(cu.to_vec::<u32>()?)
}

fn check_cu(op: &'static str, cu: &[u32], total: usize) -> Result<(), OpError> {
    let bad = |message: String| Err(OpError::InvalidArgument { op, message: format!("`cu_seqlens` {message}") });
    if cu[0] != 0 {
        return bad(format!("must start at 0, starts at {}", cu[0]));
    }
    if let Some(w) = cu.windows(2).position(|w| w[1] < w[0]) {
        return bad(format!("decreases at entry {}: {} then {}", w + 1, cu[w], cu[w + 1]));
    }
    let last = cu[cu.len() - 1] as usize;
    if last != total {
        return bad(format!("ends at {last}, but the tensors hold {total} tokens"));
    }
    Ok(())
}

/// The shared memory a block may use on `stream`'s device: the static window (these kernels
/// use no dynamic shared memory), or less where the device allows less.
fn shared_limit(stream: &Stream) -> u64 {
    let device = stream.device().cuda_info().map_or(u32::MAX, |i| i.max_shared_memory_per_block_optin);
    STATIC_SHARED_LIMIT.min(device) as u64
}

/// Where the states are read and written.
#[derive(Clone, Copy)]
enum States<'a> {
    /// `initial_state` and `final_state` `[N, Hv, K, V]`.
    Separate { initial: &'a Tensor, final_state: &'a Tensor },
    /// `pool [slots, Hv, K, V]`, sequence `s` at `pool[slots[s]]`, in place.
    Pool { pool: &'a Tensor, slots: &'a Tensor },
}

/// Launch `k` writing `output` and the states: no allocation, no read-back.
fn launch(
    stream: &Stream,
    input: &GatedDeltaInput<'_>,
    layout: Layout<'_>,
    p: &Problem,
    k: &ruda_runtime::HashedKernel,
    output: &Tensor,
    states: States<'_>,
) -> Result<(), OpError> {
    let (cu_seqlens, seq_len) = match layout {
        Layout::Dense => (None, Some(p.tokens)),
        Layout::Decode => (None, Some(1)),
        Layout::Packed(cu, _) => (Some(cu), None),
    };
    let (initial_state, final_state, state_pool, state_slots, pool_slots) = match states {
        States::Separate { initial, final_state } => (Some(initial), Some(final_state), None, None, None),
        States::Pool { pool, slots } => (None, None, Some(pool), Some(slots), Some(pool.shape()[0] as u32)),
    };
    let args = GatedDeltaParams {
        query: input.query,
        key: input.key,
        value: input.value,
        beta: input.beta,
        log_decay: input.log_decay,
        initial_state,
        output,
        final_state,
        state_pool,
        state_slots,
        cu_seqlens,
        key_heads: p.key_heads,
        value_heads: p.value_heads,
        seq_len,
        query_scale: input.query_scale,
        pool_slots,
    };
    let launch = LaunchConfig {
        grid: [p.cfg.v_tiles(), p.value_heads, p.batch],
        block: [V_TILE, 1, 1],
        dynamic_shared_bytes: 0,
    };
    params::launch(stream, k, launch, &args.args())
}

/// Allocate the results and launch `k`.
fn run(
    stream: &Stream,
    input: &GatedDeltaInput<'_>,
    layout: Layout<'_>,
    p: &Problem,
    k: &ruda_runtime::HashedKernel,
) -> Result<GatedDeltaOutput, OpError> {
    let query = input.query;
    let (n, hv, t) = (p.batch as usize, p.value_heads as usize, p.tokens as usize);
    let (kd, vd) = (p.cfg.k_dim as usize, p.cfg.v_dim as usize);
    let out_shape = match layout {
        Layout::Dense => vec![n, hv, t, vd],
        Layout::Packed(..) => vec![t, hv, vd],
        Layout::Decode => vec![n, hv, vd],
    };
    let output = Tensor::empty_on(stream, query.dtype(), &out_shape)?;
    let final_state = Tensor::empty_on(stream, DType::F32, &[n, hv, kd, vd])?;
    let zeros;
    let initial = match input.initial_state {
        Some(s) => s,
        None => {
            zeros = Tensor::zeros_on(stream, DType::F32, &[n, hv, kd, vd])?;
            &zeros
        }
    };
    launch(stream, input, layout, p, k, &output, States::Separate { initial, final_state: &final_state })?;
    Ok(GatedDeltaOutput { output, final_state })
}

/// The chunked kernel of `p` for chunks of `chunk_size`, if its workspace fits.
fn chunk_kernel(
    stream: &Stream,
    p: &Problem,
    chunk_size: usize,
    op: &'static str,
) -> Result<std::sync::Arc<ruda_runtime::HashedKernel>, OpError> {
    if chunk_size == 0 {
        return Err(OpError::InvalidArgument { op, message: "chunk_size must be positive, got 0".into() });
    }
    let limit = shared_limit(stream);
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
    kernel(cfg.chunk_id(chunk), || crate::kernels::gated_delta::gated_delta_chunk(&cfg, chunk))
}

/// The token-by-token kernel of `p`, if its state tile fits.
fn recurrent_kernel(
    stream: &Stream,
    p: &Problem,
    op: &'static str,
) -> Result<std::sync::Arc<ruda_runtime::HashedKernel>, OpError> {
    let cfg = p.cfg;
    let (shared, limit) = (cfg.shared_bytes(), shared_limit(stream));
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
    kernel(cfg.id(), || crate::kernels::gated_delta::gated_delta(&cfg))
}

fn chunked(
    input: GatedDeltaInput<'_>,
    layout: Layout<'_>,
    chunk_size: usize,
    op: &'static str,
) -> Result<GatedDeltaOutput, OpError> {
    let stream = input.query.device().default_stream();
    let p = check(op, &stream, &input, layout)?;
    let k = chunk_kernel(&stream, &p, chunk_size, op)?;
    run(&stream, &input, layout, &p, &k)
}

fn recurrent(input: GatedDeltaInput<'_>, layout: Layout<'_>, op: &'static str) -> Result<GatedDeltaOutput, OpError> {
    let stream = input.query.device().default_stream();
    let p = check(op, &stream, &input, layout)?;
    let k = recurrent_kernel(&stream, &p, op)?;
    run(&stream, &input, layout, &p, &k)
}

/// Checks of the pool forms beyond [`check`]: no `initial_state`; `state_pool` `f32 [slots, Hv,
/// K, V]` with at least one slot (and at most 2³² − 1); `state_slots` `u32 [N]`; `output` of
/// `output_shape` in the query's dtype; all on the stream's device. Returns `p` switched to its
/// pool configuration.
#[allow(clippy::too_many_arguments)]
fn check_pool(
    op: &'static str,
    stream: &Stream,
    input: &GatedDeltaInput<'_>,
    mut p: Problem,
    state_pool: &Tensor,
    state_slots: &Tensor,
    output: &Tensor,
    output_shape: &[usize],
) -> Result<Problem, OpError> {
    if input.initial_state.is_some() {
        return Err(OpError::InvalidArgument {
            op,
            message: "`initial_state` must be None: the states are read from `state_pool`".into(),
        });
    }
    let (hv, kd, vd) = (p.value_heads as usize, p.cfg.k_dim as usize, p.cfg.v_dim as usize);
    let pool = expect_rank(op, "state_pool", state_pool, 4, "[slots, value_heads, key_dim, value_dim]")?;
    expect_dtype(op, "state_pool", state_pool, DType::F32)?;
    if pool[1..] != [hv, kd, vd] {
        return Err(shape_error(
            op,
            format!("`state_pool` is {pool:?}, expected [slots, {hv}, {kd}, {vd}] (value_heads, key_dim, value_dim)"),
        ));
    }
    to_u32(op, "state_pool slots", pool[0])?;
    expect_rank(op, "state_slots", state_slots, 1, "[sequences]")?;
    expect_dtype(op, "state_slots", state_slots, DType::U32)?;
    expect_shape(op, "state_slots", state_slots, &[p.batch as usize])?;
    expect_tensor(op, "output", output, input.query.dtype(), output_shape)?;
    same_device(op, stream, &[("state_pool", state_pool), ("state_slots", state_slots), ("output", output)])?;
    p.cfg.slots = true;
    Ok(p)
}

/// [`gated_delta_rule`] for one token per sequence (decode) with the states in a pool, on
/// `stream`, without allocating or synchronising (so it can be captured in a graph):
/// `query`/`key` `[N, Hk, K]`, `value` `[N, Hv, V]`, `beta`/`log_decay` `[N, Hv]`,
/// `initial_state` `None`; sequence `n` reads and updates `state_pool[state_slots[n]]` (`f32
/// [slots, Hv, K, V]`, `u32 [N]`) in place and writes `output [N, Hv, V]`. The slots of one call
/// must be distinct (two sequences on one slot race). A slot past the pool is skipped (its
/// output left as it was): its value is on the device, where the host cannot check it without
/// a read. A sequence starting fresh needs its slot zeroed first (a device fill).
pub fn gated_delta_rule_slots_into(
    stream: &Stream,
    input: GatedDeltaInput<'_>,
    state_pool: &Tensor,
    state_slots: &Tensor,
    output: &Tensor,
) -> Result<(), GatedDeltaError> {
    let op = "gated_delta_rule_slots_into";
    let p = check(op, stream, &input, Layout::Decode)?;
    let shape = [p.batch as usize, p.value_heads as usize, p.cfg.v_dim as usize];
    let p = check_pool(op, stream, &input, p, state_pool, state_slots, output, &shape)?;
    let k = recurrent_kernel(stream, &p, op)?;
    launch(stream, &input, Layout::Decode, &p, &k, output, States::Pool { pool: state_pool, slots: state_slots })
}

/// [`chunk_gated_delta_rule_varlen`] with the states in a pool (the rules of
/// [`gated_delta_rule_slots_into`]), on `stream`, without allocating or synchronising:
/// `cu_seqlens_host` is the host copy of `cu_seqlens` (`u32 [N + 1]`), checked in its place (the
/// device copy is not read back: the caller keeps the two equal), and `output` is `[total, Hv,
/// V]`. Sequence `n` continues from `state_pool[state_slots[n]]` and leaves its final state
/// there.
#[allow(clippy::too_many_arguments)]
pub fn chunk_gated_delta_rule_varlen_slots_into(
    stream: &Stream,
    input: GatedDeltaInput<'_>,
    cu_seqlens: &Tensor,
    cu_seqlens_host: &[u32],
    chunk_size: usize,
    state_pool: &Tensor,
    state_slots: &Tensor,
    output: &Tensor,
) -> Result<(), GatedDeltaError> {
    let op = "chunk_gated_delta_rule_varlen_slots_into";
    expect_rank(op, "cu_seqlens", cu_seqlens, 1, "[sequences + 1]")?;
    expect_dtype(op, "cu_seqlens", cu_seqlens, DType::U32)?;
    if cu_seqlens_host.len() < 2 || cu_seqlens.numel() != cu_seqlens_host.len() {
        return Err(shape_error(
            op,
            format!(
                "`cu_seqlens_host` has {} entries and `cu_seqlens` {}: they must be the same sequences + 1 >= 2",
                cu_seqlens_host.len(),
                cu_seqlens.numel()
            ),
        ));
    }
    let layout = Layout::Packed(cu_seqlens, cu_seqlens_host);
    let p = check(op, stream, &input, layout)?;
    let shape = [p.tokens as usize, p.value_heads as usize, p.cfg.v_dim as usize];
    let p = check_pool(op, stream, &input, p, state_pool, state_slots, output, &shape)?;
    let k = chunk_kernel(stream, &p, chunk_size, op)?;
    launch(stream, &input, layout, &p, &k, output, States::Pool { pool: state_pool, slots: state_slots })
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
    chunked(input, Layout::Dense, chunk_size, "chunk_gated_delta_rule")
}

/// The gated delta rule token by token (decode, or short sequences).
pub fn gated_delta_rule(input: GatedDeltaInput<'_>) -> Result<GatedDeltaOutput, GatedDeltaError> {
    recurrent(input, Layout::Dense, "gated_delta_rule")
}

/// [`chunk_gated_delta_rule`] over packed sequences: `query`/`key` `[total, Hk, K]`, `value`
/// `[total, Hv, V]`, `beta`/`log_decay` `[total, Hv]`, sequence `s` owning tokens
/// `cu_seqlens[s]..cu_seqlens[s + 1]` (`u32 [N + 1]`: from 0, non-decreasing, to `total`;
/// empty sequences allowed), one state per sequence (`initial_state` and `final_state`
/// `[N, Hv, K, V]`); the output `[total, Hv, V]`. Reads `cu_seqlens` back to check it (so it
/// synchronises).
pub fn chunk_gated_delta_rule_varlen(
    input: GatedDeltaInput<'_>,
    cu_seqlens: &Tensor,
    chunk_size: usize,
) -> Result<GatedDeltaOutput, GatedDeltaError> {
    let op = "chunk_gated_delta_rule_varlen";
    let cu = read_cu(op, cu_seqlens)?;
    chunked(input, Layout::Packed(cu_seqlens, &cu), chunk_size, op)
}

/// [`gated_delta_rule`] over packed sequences (the layout of [`chunk_gated_delta_rule_varlen`]).
pub fn gated_delta_rule_varlen(
    input: GatedDeltaInput<'_>,
    cu_seqlens: &Tensor,
) -> Result<GatedDeltaOutput, GatedDeltaError> {
    let op = "gated_delta_rule_varlen";
    let cu = read_cu(op, cu_seqlens)?;
    recurrent(input, Layout::Packed(cu_seqlens, &cu), op)
}
