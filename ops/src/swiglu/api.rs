//! SwiGLU on a fused gate/up projection.

use ruda_runtime::{LaunchConfig, Stream, Tensor};

use super::kernel::{SwigluConfig, SwigluParams, SWIGLU_MAX_ROW_BLOCKS, SWIGLU_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// `out[..., I] = silu(gate) · up` for `gate_up[..., 2I]` holding gate in its first `I` columns
/// and up in the last `I` (the output of a fused `gate_up_proj`), computed in `f32` and rounded
/// once to the dtype.
pub fn swiglu_into(stream: &Stream, gate_up: &Tensor, out: &Tensor) -> Result<()> {
    let name = "swiglu";
    let dtype = float_dtype(name, gate_up)?;
    contiguous_nonempty(name, "gate_up", gate_up)?;
    contiguous_nonempty(name, "out", out)?;
    let (rows, width) = rows_cols(name, gate_up)?;
    if width % 2 == 1 {
        return Err(OpError::Shape {
            op: name,
            message: format!("`gate_up`'s last axis ({width}) must be even: [gate | up]"),
        });
    }
    let mut shape = gate_up.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = width as usize / 2;
    expect_shape(name, "out", out, &shape)?;
    expect_dtype(name, "out", out, gate_up.dtype())?;
    same_device(name, stream, &[("gate_up", gate_up), ("out", out)])?;
    let inter = width / 2;
    let cfg = SwigluConfig { dtype };
    let k = kernel(cfg.id(), || crate::kernels::swiglu::swiglu(&cfg))?;
    let launch = LaunchConfig {
        grid: [inter.div_ceil(SWIGLU_THREADS), rows.min(SWIGLU_MAX_ROW_BLOCKS), 1],
        block: [SWIGLU_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    params::launch(stream, &k, launch, &SwigluParams { gate_up, out, inter, rows }.args())?;
    Ok(())
}

/// SwiGLU of `gate_up[..., 2I]` (see [`swiglu_into`]).
pub fn swiglu(gate_up: &Tensor) -> Result<Tensor> {
    let mut shape = gate_up.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last /= 2;
    }
    let out = Tensor::empty(gate_up.device(), gate_up.dtype(), &shape)?;
    swiglu_into(&gate_up.device().default_stream(), gate_up, &out)?;
    Ok(out)
}
