//! Causal depthwise conv1d with optional SiLU: prefill over `[T, C]` and the decode step.

use ruda_runtime::{LaunchConfig, Stream, Tensor};

use super::kernel::{
    causal_conv1d as prefill_kernel, causal_conv1d_update as update_kernel, Conv1dConfig, Conv1dParams,
    Conv1dUpdateParams, CONV_CHUNK, CONV_MAX_CHUNK_BLOCKS, CONV_THREADS, CONV_WIDTHS,
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
    contiguous_nonempty(op, "y", y)?;
    expect_shape(op, "y", y, x.shape())?;
    expect_dtype(op, "y", y, x.dtype())?;
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
    contiguous_nonempty(op, "y", y)?;
    expect_shape(op, "y", y, x.shape())?;
    expect_dtype(op, "y", y, x.dtype())?;
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
