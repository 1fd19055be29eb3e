//! Sampling a token per row: temperature, top-k, top-p, min-p, reproducible per seed. The exact
//! algorithm is documented in [`crate::kernels::sampling`].

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{SamplingConfig, SamplingKernelParams, SAMPLING_THREADS};
use crate::argmax::api::argmax_into;
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

pub use super::kernel::draw as sampling_draw;

/// How to pick each row's token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// `0` is greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (ties with the last one kept too); `0` keeps all, `1` is
    /// greedy.
    pub top_k: u32,
    /// Keep the smallest set of largest probabilities whose mass reaches `top_p` (in `(0, 1]`;
    /// `1` keeps all).
    pub top_p: f32,
    /// The random stream; each row's draw is [`sampling_draw`]`(seed, offsets[row])`.
    pub seed: u64,
    /// After top-p, drop tokens whose probability is below `min_p` × the largest one's (in
    /// `[0, 1]`; `0` keeps all).
    pub min_p: f32,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.0 }
    }
}

impl SamplingParams {
    /// Whether these parameters pick the argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// One token per row of `logits [rows, V]` (f32/f16/bf16) into `out` (`u32 [rows]`). Greedy
/// parameters ([`SamplingParams::is_greedy`]) run [`argmax_into`] (first NaN wins, as
/// `torch.argmax`); otherwise NaN logits count as `-inf` and the token is drawn as
/// [`crate::kernels::sampling`] documents, with row `r`'s uniform draw
/// [`sampling_draw`]`(params.seed, offsets[r])` (`offsets`: `u64 [rows]`, e.g. a per-request
/// counter, so results do not depend on a request's place in the batch). For a given seed and
/// offsets the tokens are the same on every run of one backend; across backends they can differ
/// only where `ex2.approx` rounds differently right at a boundary.
pub fn sample_into(
    stream: &Stream,
    logits: &Tensor,
    params: &SamplingParams,
    offsets: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let name = "sample";
    let dtype = float_dtype(name, logits)?;
    contiguous_nonempty(name, "logits", logits)?;
    if logits.rank() != 2 {
        return Err(OpError::Shape {
            op: name,
            message: format!("`logits` must be [rows, vocab], is {:?}", logits.shape()),
        });
    }
    let (rows, cols) = (logits.shape()[0], logits.shape()[1]);
    expect_tensor(name, "offsets", offsets, DType::U64, &[rows])?;
    expect_tensor(name, "out", out, DType::U32, &[rows])?;
    same_device(name, stream, &[("logits", logits), ("offsets", offsets), ("out", out)])?;
    let SamplingParams { temperature, top_k, top_p, seed, min_p } = *params;
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(OpError::InvalidArgument {
            op: name,
            message: format!("temperature must be finite and >= 0, got {temperature}"),
        });
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(OpError::InvalidArgument { op: name, message: format!("top_p must be in (0, 1], got {top_p}") });
    }
    if !(0.0..=1.0).contains(&min_p) {
        return Err(OpError::InvalidArgument { op: name, message: format!("min_p must be in [0, 1], got {min_p}") });
    }
    if cols > i32::MAX as usize {
        return Err(OpError::Shape { op: name, message: format!("vocabulary of {cols} exceeds 2^31 - 1") });
    }
    if params.is_greedy() {
        return argmax_into(stream, logits, out, None);
    }
    let scale = (std::f64::consts::LOG2_E / temperature as f64) as f32;
    let cfg = SamplingConfig { dtype };
    let k = kernel(cfg.id(), || crate::kernels::sampling::sampling(&cfg))?;
    let args = SamplingKernelParams { logits, out, offsets, cols: cols as u32, scale, top_k, top_p, seed, min_p };
    params::launch(stream, &k, LaunchConfig::linear(to_u32(name, "rows", rows)?, SAMPLING_THREADS), &args.args())?;
    Ok(())
}

/// One token per row (see [`sample_into`]).
pub fn sample(logits: &Tensor, params: &SamplingParams, offsets: &Tensor) -> Result<Tensor> {
    let rows = logits.shape().first().copied().unwrap_or(0);
    let out = Tensor::empty(logits.device(), DType::U32, &[rows])?;
    sample_into(&logits.device().default_stream(), logits, params, offsets, &out)?;
    Ok(out)
}
