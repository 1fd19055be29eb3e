//! Causal depthwise conv1d with optional SiLU: prefill over `[T, C]` (one sequence, or packed
//! sequences over a pool of states) and the decode step (one sequence, or a batch over a pool).

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{
    causal_conv1d as prefill_kernel, causal_conv1d_update as update_kernel, causal_conv1d_update_slots as slots_kernel,
    causal_conv1d_varlen as varlen_kernel, causal_conv1d_varlen_state as varlen_state_kernel, Conv1dConfig,
    Conv1dParams, Conv1dSlotsParams, Conv1dUpdateParams, Conv1dVarlenParams, Conv1dVarlenStateParams, CONV_CHUNK,
    CONV_MAX_CHUNK_BLOCKS, CONV_THREADS, CONV_WIDTHS,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// The channel count and width of `weight`, `[C, W]` or Hugging Face's `[C, 1, W]`, for `x`'s
/// `C` channels; `x` must be `[T, C]` and `weight` of `x`'s dtype.
fn check_weight(op: &'static str, x: &Tensor, weight: &Tensor) -> Result<(usize, u32)> {
    contiguous_nonempty(op, "x", x)?;
    contiguous_nonempty(op, "weight", weight)?;
    if x.rank() != 2 {
        return Err(OpError::Shape { op, message: format!("`x` is {:?}, expected [tokens, channels]", x.shape()) });
    }
    let channels = x.shape()[1];
    let width = match weight.shape() {
        [c, w] | [c, 1, w] if *c == channels => *w,
        other => {
            return Err(OpError::Shape {
                op,
                message: format!(
                "`weight` is {other:?}, expected [{channels}, W] or [{channels}, 1, W] for `x`'s {channels} channels"
            ),
            })
        }
    };
    let width = to_u32(op, "kernel width", width)?;
    if !CONV_WIDTHS.contains(&width) {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("kernel width W = {width} is not supported (W must be 2, 3 or 4)"),
        });
    }
    expect_dtype(op, "weight", weight, x.dtype())?;
    Ok((channels, width))
}

/// `[C, W - 1]` of `x`'s dtype.
fn check_state(op: &'static str, name: &str, state: &Tensor, x: &Tensor, channels: usize, width: u32) -> Result<()> {
    contiguous_nonempty(op, name, state)?;
    expect_shape(op, name, state, &[channels, width as usize - 1])?;
    expect_dtype(op, name, state, x.dtype())
}

/// Causal depthwise conv1d over tokens: `y[t, c] = act(Σ_k weight[c, k] · u[t - (W - 1) + k, c])`,
/// where `u` is `x` preceded by `initial_state` (the previous segment's last W - 1 inputs,
/// oldest first; zeros when `None`) and `act` is SiLU when `silu`, else the identity.
/// `final_state[c, i]` receives `u[T - (W - 1) + i, c]`, the state to pass as the next segment's
/// `initial_state` (or to [`causal_conv1d_update_into`]). Shapes: `x` and `y` `[T, C]`, `weight`
/// `[C, W]` or `[C, 1, W]` with W in 2..=4, the states `[C, W - 1]`, all of one float dtype;
/// math in `f32`, `y` rounded once. On CUDA `final_state` may be `initial_state` (updated in
/// place); the CPU device rejects aliasing.
pub fn causal_conv1d_into(
    stream: &Stream,
    x: &Tensor,
    weight: &Tensor,
    initial_state: Option<&Tensor>,
    silu: bool,
    y: &Tensor,
    final_state: &Tensor,
) -> Result<()> {
    let op = "causal_conv1d";
    let dtype = float_dtype(op, x)?;
    let (channels, width) = check_weight(op, x, weight)?;
    if let Some(s) = initial_state {
        check_state(op, "initial_state", s, x, channels, width)?;
        same_device(op, stream, &[("initial_state", s)])?;
    }
    check_state(op, "final_state", final_state, x, channels, width)?;
    expect_tensor(op, "y", y, x.dtype(), x.shape())?;
    same_device(op, stream, &[("x", x), ("weight", weight), ("y", y), ("final_state", final_state)])?;
    let tokens = to_u32(op, "tokens", x.shape()[0])?;
    let channels = to_u32(op, "channels", channels)?;
    let cfg = Conv1dConfig { dtype, width, silu, initial_state: initial_state.is_some() };
    let k = kernel(cfg.prefill_id(), || prefill_kernel(&cfg))?;
    let launch = LaunchConfig {
        grid: [channels.div_ceil(CONV_THREADS), tokens.div_ceil(CONV_CHUNK).min(CONV_MAX_CHUNK_BLOCKS), 1],
        block: [CONV_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let args = Conv1dParams { x, weight, initial_state, y, final_state, tokens, channels };
    params::launch(stream, &k, launch, &args.args())
}

/// `(y, final_state)` of [`causal_conv1d_into`], on `x`'s default stream.
pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    initial_state: Option<&Tensor>,
    silu: bool,
) -> Result<(Tensor, Tensor)> {
    let op = "causal_conv1d";
    float_dtype(op, x)?;
    let (channels, width) = check_weight(op, x, weight)?;
    let y = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    let final_state = Tensor::empty(x.device(), x.dtype(), &[channels, width as usize - 1])?;
    causal_conv1d_into(&x.device().default_stream(), x, weight, initial_state, silu, &y, &final_state)?;
    Ok((y, final_state))
}

/// One decode step of [`causal_conv1d_into`]: `x` `[1, C]` is the newest input, `state`
/// `[C, W - 1]` the W - 1 before it (oldest first); `y` `[1, C]` receives the output and
/// `state` is rolled in place to end with `x`. Same dtypes and weights as the prefill; never
/// allocates or waits for the device.
pub fn causal_conv1d_update_into(
    stream: &Stream,
    x: &Tensor,
    weight: &Tensor,
    state: &Tensor,
    silu: bool,
    y: &Tensor,
) -> Result<()> {
    let op = "causal_conv1d_update";
    let dtype = float_dtype(op, x)?;
    let (channels, width) = check_weight(op, x, weight)?;
    if x.shape()[0] != 1 {
        return Err(OpError::Shape {
            op,
            message: format!("`x` is {:?}, expected one token [1, {channels}] (use causal_conv1d for more)", x.shape()),
        });
    }
    check_state(op, "state", state, x, channels, width)?;
    expect_tensor(op, "y", y, x.dtype(), x.shape())?;
    same_device(op, stream, &[("x", x), ("weight", weight), ("state", state), ("y", y)])?;
    let channels = to_u32(op, "channels", channels)?;
    let cfg = Conv1dConfig { dtype, width, silu, initial_state: true };
    let k = kernel(cfg.update_id(), || update_kernel(&cfg))?;
    let launch = LaunchConfig::linear(channels.div_ceil(CONV_THREADS), CONV_THREADS);
    params::launch(stream, &k, launch, &Conv1dUpdateParams { x, weight, state, y, channels }.args())
}

/// [`causal_conv1d_update_into`] into a new `y`, on `x`'s default stream; `state` is updated in
/// place.
pub fn causal_conv1d_update(x: &Tensor, weight: &Tensor, state: &mut Tensor, silu: bool) -> Result<Tensor> {
    let y = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    causal_conv1d_update_into(&x.device().default_stream(), x, weight, state, silu, &y)?;
    Ok(y)
}

/// Most sequences of one batched decode step (the grid's second dimension).
pub const CONV_MAX_SEQUENCES: usize = 65535;

/// The decode step of [`causal_conv1d_update_into`] for `N` sequences at once, each with its own
/// state in a pool: `x` and `y` `[N, C]` (row `n` is sequence `n`'s newest input and output),
/// `states` `[slots, C, W - 1]` of `x`'s dtype, and `state_slots` `U32 [N]` naming the state of
/// each sequence, rolled in place. Never allocates or waits for the device, so the slots are
/// not checked on the host: a slot out of range touches no state and makes its row of `y` NaN,
/// and two sequences must not share a slot (their updates would race).
pub fn causal_conv1d_update_slots_into(
    stream: &Stream,
    x: &Tensor,
    weight: &Tensor,
    states: &Tensor,
    state_slots: &Tensor,
    silu: bool,
    y: &Tensor,
) -> Result<()> {
    let op = "causal_conv1d_update_slots";
    let dtype = float_dtype(op, x)?;
    let (channels, width) = check_weight(op, x, weight)?;
    let n = x.shape()[0];
    if n > CONV_MAX_SEQUENCES {
        return Err(OpError::Shape {
            op,
            message: format!("`x` holds {n} sequences, more than one launch takes ({CONV_MAX_SEQUENCES})"),
        });
    }
    contiguous_nonempty(op, "states", states)?;
    let slots = states.shape()[0];
    expect_shape(op, "states", states, &[slots, channels, width as usize - 1])?;
    expect_dtype(op, "states", states, x.dtype())?;
    expect_tensor(op, "state_slots", state_slots, DType::U32, &[n])?;
    expect_tensor(op, "y", y, x.dtype(), x.shape())?;
    let tensors = [("x", x), ("weight", weight), ("states", states), ("state_slots", state_slots), ("y", y)];
    same_device(op, stream, &tensors)?;
    let (channels, slots) = (to_u32(op, "channels", channels)?, to_u32(op, "slots", slots)?);
    let cfg = Conv1dConfig { dtype, width, silu, initial_state: true };
    let k = kernel(cfg.slots_id(), || slots_kernel(&cfg))?;
    let launch = LaunchConfig {
        grid: [channels.div_ceil(CONV_THREADS), n as u32, 1],
        block: [CONV_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let args = Conv1dSlotsParams { x, weight, states, state_slots, y, channels, slots };
    params::launch(stream, &k, launch, &args.args())
}

/// [`causal_conv1d_update_slots_into`] into a new `y`, on `x`'s default stream; the states are
/// updated in place.
pub fn causal_conv1d_update_slots(
    x: &Tensor,
    weight: &Tensor,
    states: &mut Tensor,
    state_slots: &Tensor,
    silu: bool,
) -> Result<Tensor> {
    let y = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    causal_conv1d_update_slots_into(&x.device().default_stream(), x, weight, states, state_slots, silu, &y)?;
    Ok(y)
}

/// [`causal_conv1d_into`] over packed sequences: `x` and `y` `[total_tokens, C]` hold sequence
/// `n` in rows `cu_seqlens[n]..cu_seqlens[n + 1]` (`U32 [N + 1]`, from 0 to `total_tokens`,
/// non-decreasing; empty sequences allowed), and each sequence continues from its state
/// `states[state_slots[n]]` (`[slots, C, W - 1]`, `U32 [N]`; a fresh sequence's slot holds
/// zeros), which is then overwritten with its final state. Two launches on `stream` (the
/// outputs, then the states), never allocating or waiting for the device, so neither
/// `cu_seqlens` nor the slots are checked on the host: a slot out of range reads as zeros and is
/// not written, malformed offsets give wrong values but no access out of bounds, and two
/// sequences must not share a slot.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_varlen_into(
    stream: &Stream,
    x: &Tensor,
    weight: &Tensor,
    cu_seqlens: &Tensor,
    states: &Tensor,
    state_slots: &Tensor,
    silu: bool,
    y: &Tensor,
) -> Result<()> {
    let op = "causal_conv1d_varlen";
    let dtype = float_dtype(op, x)?;
    let (channels, width) = check_weight(op, x, weight)?;
    contiguous_nonempty(op, "state_slots", state_slots)?;
    expect_dtype(op, "state_slots", state_slots, DType::U32)?;
    if state_slots.rank() != 1 {
        return Err(OpError::Shape {
            op,
            message: format!("`state_slots` is {:?}, expected [N]", state_slots.shape()),
        });
    }
    let n = state_slots.shape()[0];
    if n > CONV_MAX_SEQUENCES {
        return Err(OpError::Shape {
            op,
            message: format!("{n} sequences, more than one launch takes ({CONV_MAX_SEQUENCES})"),
        });
    }
    expect_tensor(op, "cu_seqlens", cu_seqlens, DType::U32, &[n + 1])?;
    contiguous_nonempty(op, "states", states)?;
    let slots = states.shape()[0];
    expect_shape(op, "states", states, &[slots, channels, width as usize - 1])?;
    expect_dtype(op, "states", states, x.dtype())?;
    expect_tensor(op, "y", y, x.dtype(), x.shape())?;
    let tensors = [
        ("x", x),
        ("weight", weight),
        ("cu_seqlens", cu_seqlens),
        ("states", states),
        ("state_slots", state_slots),
        ("y", y),
    ];
    same_device(op, stream, &tensors)?;
    let tokens = to_u32(op, "tokens", x.shape()[0])?;
    let (channels, slots) = (to_u32(op, "channels", channels)?, to_u32(op, "slots", slots)?);
    let sequences = n as u32;
    let cfg = Conv1dConfig { dtype, width, silu, initial_state: true };
    let k = kernel(cfg.varlen_id(), || varlen_kernel(&cfg))?;
    let blocks = channels.div_ceil(CONV_THREADS);
    let launch = LaunchConfig {
        grid: [blocks, tokens.div_ceil(CONV_CHUNK).min(CONV_MAX_CHUNK_BLOCKS), 1],
        block: [CONV_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let args = Conv1dVarlenParams { x, weight, cu_seqlens, states, state_slots, y, tokens, channels, sequences, slots };
    params::launch(stream, &k, launch, &args.args())?;
    // The state does not depend on SiLU: one kernel for both.
    let cfg = Conv1dConfig { silu: false, ..cfg };
    let k = kernel(cfg.varlen_state_id(), || varlen_state_kernel(&cfg))?;
    let launch = LaunchConfig { grid: [blocks, sequences, 1], block: [CONV_THREADS, 1, 1], dynamic_shared_bytes: 0 };
    let args = Conv1dVarlenStateParams { x, cu_seqlens, states, state_slots, tokens, channels, slots };
    params::launch(stream, &k, launch, &args.args())
}

/// [`causal_conv1d_varlen_into`] into a new `y`, on `x`'s default stream; the states are
/// updated in place.
pub fn causal_conv1d_varlen(
    x: &Tensor,
    weight: &Tensor,
    cu_seqlens: &Tensor,
    states: &mut Tensor,
    state_slots: &Tensor,
    silu: bool,
) -> Result<Tensor> {
    let y = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    causal_conv1d_varlen_into(&x.device().default_stream(), x, weight, cu_seqlens, states, state_slots, silu, &y)?;
    Ok(y)
}
