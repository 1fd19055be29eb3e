//! Log-probabilities of chosen and top tokens (the algorithm and the NaN rule are documented in
//! [`crate::logprobs::kernel`]).

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{LogprobsConfig, LogprobsKernelParams, LOGPROBS_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

pub use super::kernel::LOGPROBS_MAX_TOP;

/// `log_softmax` of each row of `logits` (`[rows, V]`, f32/f16/bf16) at the row's `chosen` token
/// (`u32 [rows]`) and at its `top` largest logits (ties to the lower id, NaN first), into `ids`
/// and `values` (`u32` and `f32`, both `[rows, 1 + top]`): column 0 is the chosen token, then
/// the top tokens, largest first. `top` is at most [`LOGPROBS_MAX_TOP`] and `V`.
pub fn logprobs_into(
    stream: &Stream,
    logits: &Tensor,
    chosen: &Tensor,
    top: usize,
    ids: &Tensor,
    values: &Tensor,
) -> Result<()> {
    let name = "logprobs";
    let dtype = float_dtype(name, logits)?;
    contiguous_nonempty(name, "logits", logits)?;
    if logits.rank() != 2 {
        return Err(OpError::Shape {
            op: name,
            message: format!("`logits` must be [rows, vocab], is {:?}", logits.shape()),
        });
    }
    let (rows, cols) = (logits.shape()[0], logits.shape()[1]);
    if top > LOGPROBS_MAX_TOP || top > cols {
        return Err(OpError::InvalidArgument {
            op: name,
            message: format!("top must be at most {LOGPROBS_MAX_TOP} and the vocabulary ({cols}), got {top}"),
        });
    }
    for (what, t, dt, shape) in [
        ("chosen", chosen, DType::U32, vec![rows]),
        ("ids", ids, DType::U32, vec![rows, 1 + top]),
        ("values", values, DType::F32, vec![rows, 1 + top]),
    ] {
        contiguous_nonempty(name, what, t)?;
        expect_dtype(name, what, t, dt)?;
        expect_shape(name, what, t, &shape)?;
    }
    same_device(name, stream, &[("logits", logits), ("chosen", chosen), ("ids", ids), ("values", values)])?;
    let cfg = LogprobsConfig { dtype };
    let k = kernel(cfg.id(), || crate::kernels::logprobs::logprobs(&cfg))?;
    let args =
        LogprobsKernelParams { logits, chosen, ids, values, cols: to_u32(name, "vocabulary", cols)?, top: top as u32 };
    params::launch(stream, &k, LaunchConfig::linear(to_u32(name, "rows", rows)?, LOGPROBS_THREADS), &args.args())?;
    Ok(())
}

/// [`logprobs_into`] into new tensors `(ids, values)`, on the default stream.
pub fn logprobs(logits: &Tensor, chosen: &Tensor, top: usize) -> Result<(Tensor, Tensor)> {
    let rows = logits.shape().first().copied().unwrap_or(0);
    let ids = Tensor::empty(logits.device(), DType::U32, &[rows, 1 + top])?;
    let values = Tensor::empty(logits.device(), DType::F32, &[rows, 1 + top])?;
    logprobs_into(&logits.device().default_stream(), logits, chosen, top, &ids, &values)?;
    Ok((ids, values))
}
