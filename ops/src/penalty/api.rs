//! Repetition penalty over logits, in place.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{PenaltyConfig, RepetitionPenaltyParams, PENALTY_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Hugging Face's `RepetitionPenaltyLogitsProcessor`, in place on `logits` (`[rows, V]`, f32,
/// f16 or bf16): for each row `r` and each distinct id `t` in `token_ids[r, ..]` (`u32 [rows,
/// n]`), `logits[r, t]` becomes `logit · penalty` where `logit < 0`, else `logit / penalty`
/// (one `f32` operation rounded once to the dtype; PyTorch on CUDA divides by multiplying with
/// `1 / penalty`, which can differ by one unit in the last place of `f32` before that
/// rounding). An id that occurs several times is penalised once; ids `≥ V` are skipped (pad
/// short rows with `u32::MAX`); `n = 0` changes nothing. `penalty` must be finite and `> 0` (`1` changes nothing).
pub fn repetition_penalty_into(stream: &Stream, logits: &Tensor, token_ids: &Tensor, penalty: f32) -> Result<()> {
    let name = "repetition_penalty";
    let dtype = float_dtype(name, logits)?;
    contiguous_nonempty(name, "logits", logits)?;
    if logits.rank() != 2 {
        return Err(OpError::Shape {
            op: name,
            message: format!("`logits` must be [rows, vocab], is {:?}", logits.shape()),
        });
    }
    let (rows, vocab) = (logits.shape()[0], logits.shape()[1]);
    expect_dtype(name, "token_ids", token_ids, DType::U32)?;
    if token_ids.rank() != 2 || token_ids.shape()[0] != rows {
        return Err(OpError::Shape {
            op: name,
            message: format!("`token_ids` must be [{rows}, n] (one list per logits row), is {:?}", token_ids.shape()),
        });
    }
    same_device(name, stream, &[("logits", logits), ("token_ids", token_ids)])?;
    check_penalty(penalty)?;
    let n = token_ids.shape()[1];
    if n == 0 {
        return Ok(());
    }
    contiguous_nonempty(name, "token_ids", token_ids)?;
    let cfg = PenaltyConfig { dtype };
    let k = kernel(cfg.id(), || crate::kernels::penalty::repetition_penalty(&cfg))?;
    let args = RepetitionPenaltyParams {
        logits,
        token_ids,
        vocab: to_u32(name, "vocab", vocab)?,
        n: to_u32(name, "ids per row", n)?,
        penalty,
    };
    params::launch(stream, &k, LaunchConfig::linear(to_u32(name, "rows", rows)?, PENALTY_THREADS), &args.args())?;
    Ok(())
}

/// [`repetition_penalty_into`] on the default stream for `logits` of one row (`[1, V]`) or a
/// vector (`[V]`) and host-side `ids` (uploaded here); an empty `ids` changes nothing.
pub fn apply_repetition_penalty(logits: &Tensor, ids: &[u32], penalty: f32) -> Result<()> {
    let name = "repetition_penalty";
    let vocab = match logits.shape() {
        [v] | [1, v] => *v,
        other => {
            return Err(OpError::Shape {
                op: name,
                message: format!("`logits` must be one row ([V] or [1, V]), is {other:?}"),
            })
        }
    };
    float_dtype(name, logits)?;
    check_penalty(penalty)?;
    if ids.is_empty() {
        return Ok(());
    }
    let row = logits.reshape(&[1, vocab])?;
    let ids = Tensor::from_slice(logits.device(), ids, &[1, ids.len()])?;
    repetition_penalty_into(&logits.device().default_stream(), &row, &ids, penalty)
}

fn check_penalty(penalty: f32) -> Result<()> {
    if penalty.is_finite() && penalty > 0.0 {
        return Ok(());
    }
    Err(OpError::InvalidArgument {
        op: "repetition_penalty",
        message: format!("penalty must be finite and > 0, got {penalty}"),
    })
}
