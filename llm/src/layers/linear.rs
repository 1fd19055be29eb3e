//! Linear projections `y = x·Wᵀ (+ b)`, and the per-chunk plan of which GEMV / GEMM variant each
//! weight shape runs.

use std::collections::HashMap;

use ruda_ops::api::{self, Epilogue, GemmTile, LinearProblem, OpError, Strategy, GEMV_MAX_M};
use ruda_ops::tune;
use ruda_runtime::{DType, Device, Stream, Tensor};

use super::plan::{launch, prefix, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Loader};
use crate::error::LlmError;

/// A projection as a config declares it: its weight (or several stacked along the output
/// dimension and run as one product, such as gate and up) and maybe a bias.
#[derive(Clone, Debug)]
pub struct LinearSpec {
    /// What the shape is called in tuning output (`q_proj`, `gate_up_proj`, ...).
    pub name: &'static str,
    /// `[out_i, in]` each, stacked in order.
    pub weights: Vec<ExpectedTensor>,
    pub bias: Option<ExpectedTensor>,
}

impl LinearSpec {
    /// `{prefix}.weight [out, in]`, and `{prefix}.bias [out]` with `bias`.
    pub fn new(name: &'static str, prefix: &str, out: usize, input: usize, bias: bool) -> LinearSpec {
        LinearSpec {
            name,
            weights: vec![ExpectedTensor::compute(format!("{prefix}.weight"), vec![out, input])],
            bias: bias.then(|| ExpectedTensor::compute(format!("{prefix}.bias"), vec![out])),
        }
    }

    /// The weights `{prefix}.weight [out, in]` of each prefix, stacked into one projection
    /// without a bias.
    pub fn stacked(name: &'static str, prefixes: &[&str], out: usize, input: usize) -> LinearSpec {
        LinearSpec {
            name,
            weights: prefixes
                .iter()
                .map(|p| ExpectedTensor::compute(format!("{p}.weight"), vec![out, input]))
                .collect(),
            bias: None,
        }
    }

    /// `(N, K)`: output and input features of the (stacked) product.
    pub fn shape(&self) -> (usize, usize) {
        let n = self.weights.iter().map(|w| w.shape[0]).sum();
        (n, self.weights.first().map_or(0, |w| w.shape[1]))
    }

    /// The product over `m` rows.
    pub fn linear_shape(&self, m: usize) -> LinearShape {
        let (n, k) = self.shape();
        LinearShape { name: self.name, m, n, k }
    }

    /// `model.layers.0.self_attn.q_proj`, `model.layers.0.mlp.gate_up_proj`, `lm_head`.
    pub fn label(&self) -> String {
        let first = self.weights.first().map_or("", |w| prefix(&w.name));
        match first.rsplit_once('.') {
            Some((parent, _)) => format!("{parent}.{}", self.name),
            None => self.name.to_string(),
        }
    }

    /// The launches of this projection in a decode step (one row), as [`Linear::forward`] makes
    /// them: the GEMV with the bias in its epilogue, or with `K` split (the step's choice for
    /// this weight) partials and a reduction that adds the bias.
    pub fn decode_launches(&self, step: &DecodeStep, out: &mut Vec<PlannedLaunch>) {
        let (n, k) = self.shape();
        let (e, dt) = (step.elem(), step.dt());
        let bias = self.bias.is_some();
        // The GEMV's own rules (`ruda_ops::api::linear_with_into`): 16-byte loads when every row
        // starts 16-byte aligned (weights and decode rows start at an allocation), and whole
        // warps' worth of chunks per split, which may leave fewer splits than asked.
        let chunk = 16 / e as usize;
        let vector = k.is_multiple_of(chunk);
        let chunks = if vector { k / chunk } else { k };
        let asked = step.choices.gemv_splits.get(&(n, k)).copied().unwrap_or(1).max(1);
        let per_split = chunks.div_ceil(asked).next_multiple_of(32).max(32);
        let splits = chunks.div_ceil(per_split).max(1);
        let loads = if vector { "" } else { ".scalar" };
        let (nk, n64) = ((n * k) as u64, n as u64);
        let weights = nk * e + if bias { n64 * e } else { 0 };
        let shape = format!("x[1, {k}] · w[{n}, {k}]ᵀ{}", if bias { " + b" } else { "" });
        let label = self.label();
        if splits == 1 {
            let kernel = format!("gemv.{dt}.m1{loads}{}", if bias { ".bias" } else { "" });
            let flops = 2 * nk + if bias { n64 } else { 0 };
            out.push(PlannedLaunch {
                weight_bytes: weights,
                ..launch(label, kernel, shape, weights + k as u64 * e, n64 * e, flops)
            });
            return;
        }
        let partials = (splits * n) as u64 * 4;
        out.push(PlannedLaunch {
            weight_bytes: nk * e,
            ..launch(
                label.clone(),
                format!("gemv.{dt}.m1{loads}.splitk"),
                shape,
                nk * e + k as u64 * e,
                partials,
                2 * nk,
            )
        });
        let bias_bytes = if bias { n64 * e } else { 0 };
        out.push(PlannedLaunch {
            weight_bytes: bias_bytes,
            ..launch(
                format!("{label} (split-K sum)"),
                format!("gemv.{dt}.splitk_reduce{}", if bias { ".bias" } else { "" }),
                format!("{splits} × [{n}] f32"),
                partials + bias_bytes,
                n64 * e,
                (splits * n) as u64,
            )
        });
    }

    pub fn load(&self, ld: &Loader) -> Result<Linear, LlmError> {
        let weight = match self.weights.as_slice() {
            [one] => ld.tensor(one)?,
            parts => ld.stacked(parts)?,
        };
        Ok(Linear::Dense { weight, bias: self.bias.as_ref().map(|b| ld.tensor(b)).transpose()? })
    }
}

/// One product a forward pass runs: `[m, k] · [n, k]ᵀ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub name: &'static str,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// A loaded projection. One variant today; quantized weights (with their scales) become more.
pub enum Linear {
    /// `weight [out, in]` and maybe `bias [out]`, in the compute dtype.
    Dense { weight: Tensor, bias: Option<Tensor> },
}

impl Linear {
    /// `(N, K)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Linear::Dense { weight, .. } => (weight.shape()[0], weight.shape()[1]),
        }
    }

    /// `out = x·Wᵀ (+ bias)` through `api::linear_with_into`, the bias always in the product's
    /// epilogue, so `x·Wᵀ + b` is rounded once, as transformers' addmm does (the product and
    /// then `add_bias` would round twice; where a model's residual stream nearly cancels, the
    /// norm after it amplified that one extra rounding fivefold: seen in the model sweep): a
    /// decode step's GEMV with its tuned split count, a prefill chunk's tensor-core GEMM with its
    /// tuned tile, a prefill chunk of at most `GEMV_MAX_M` rows the GEMV, else by shape (the
    /// tensor-core GEMM, or the SIMT GEMM where it does not apply).
    pub fn forward(&self, s: &Stream, plan: &LinearPlan, x: &Tensor, out: &Tensor) -> Result<(), OpError> {
        let Linear::Dense { weight: w, bias } = self;
        let shape = self.shape();
        // Every product goes through the linear family's one entry point; the plan picks the
        // strategy: the prefill's tuned tile, the decode GEMV's tuned split count, or by shape.
        let bias_only = Epilogue { bias: bias.as_ref(), residual: None };
        if let (Some(&tile), true) = (plan.gemm_tiles.get(&shape), x.shape()[0] == plan.tokens) {
            return api::linear_with_into(s, LinearProblem::new(x, w, out), bias_only, Strategy::Tile(tile));
        }
        let decode = plan
            .gemv
            .as_ref()
            .filter(|_| x.shape()[0] == 1)
            .map(|g| (g.splits.get(&shape).copied().unwrap_or(1), &g.workspace));
        let gemv = |splits: usize, workspace: &Tensor| {
            let problem = LinearProblem { x, w, out, workspace: Some(workspace) };
            api::linear_with_into(s, problem, bias_only, Strategy::Gemv { splits: Some(splits) })
        };
        match (decode, bias) {
            (Some((splits, workspace)), Some(_)) => gemv(splits, workspace),
            (Some((splits, workspace)), None) if splits > 1 => gemv(splits, workspace),
            // `Auto` would put a bias on the tensor cores however few the rows.
            (None, Some(_)) if x.shape()[0] <= GEMV_MAX_M => {
                api::linear_with_into(s, LinearProblem::new(x, w, out), bias_only, Strategy::Gemv { splits: Some(1) })
            }
            _ => api::linear_with_into(s, LinearProblem::new(x, w, out), bias_only, Strategy::Auto),
        }
    }

    /// The weight a tuning measurement runs with.
    fn tuning_weight(&self) -> &Tensor {
        match self {
            Linear::Dense { weight, .. } => weight,
        }
    }
}

/// How the projections of a `tokens`-row chunk run, measured once per chunk size: decode (one
/// row) tunes each weight shape's GEMV split count and keeps one workspace for the largest;
/// prefill in f16/bf16 over more than `GEMV_MAX_M` rows tunes each shape's tensor-core tile.
/// On the CPU, or with `RUDA_AUTOTUNE=off`, the heuristics' choices.
pub struct LinearPlan {
    tokens: usize,
    gemv: Option<GemvPlan>,
    /// The tile of each `(N, K)` run at `tokens` rows (none where the tensor cores do not apply:
    /// f32, `K % 8 != 0`).
    gemm_tiles: HashMap<(usize, usize), GemmTile>,
}

struct GemvPlan {
    splits: HashMap<(usize, usize), usize>,
    workspace: Tensor,
}

impl LinearPlan {
    /// The plan for `shapes` (the model's products over `tokens` rows), measured with the
    /// weights `linears` offers for each shape.
    pub fn new<'a>(
        device: &Device,
        dtype: DType,
        tokens: usize,
        shapes: &[LinearShape],
        linears: impl Iterator<Item = &'a Linear> + Clone,
    ) -> Result<LinearPlan, LlmError> {
        let stream = &device.default_stream();
        let weight = |n: usize, k: usize| {
            linears
                .clone()
                .find(|l| l.shape() == (n, k))
                .map(Linear::tuning_weight)
                .ok_or_else(|| LlmError::InvalidArgument(format!("no [{n}, {k}] weight")))
        };
        let mut gemv = None;
        if tokens == 1 {
            let (mut splits, mut longest) = (HashMap::new(), 1);
            for s in shapes {
                if splits.contains_key(&(s.n, s.k)) {
                    continue;
                }
                let x = Tensor::zeros(device, dtype, &[1, s.k])?;
                let w = weight(s.n, s.k)?;
                let count =
                    tune::tuned_gemv_splits(stream, &x, w).map_err(|e| LlmError::op("tuning the decode GEMV", e))?;
                if count > 1 {
                    longest = longest.max(count * s.n);
                }
                splits.insert((s.n, s.k), count);
            }
            gemv = Some(GemvPlan { splits, workspace: Tensor::empty(device, DType::F32, &[longest])? });
        }
        let mut gemm_tiles = HashMap::new();
        if tokens > GEMV_MAX_M && matches!(dtype, DType::F16 | DType::BF16) {
            // Only the products that run at `tokens` rows (the last-row logits are a GEMV).
            for s in shapes.iter().filter(|s| s.m == tokens) {
                if gemm_tiles.contains_key(&(s.n, s.k)) || !s.k.is_multiple_of(8) {
                    continue;
                }
                let x = Tensor::zeros(device, dtype, &[tokens, s.k])?;
                let tile = tune::tuned_gemm_tile(stream, &x, weight(s.n, s.k)?)
                    .map_err(|e| LlmError::op("tuning the prefill GEMM", e))?;
                gemm_tiles.insert((s.n, s.k), tile);
            }
        }
        Ok(LinearPlan { tokens, gemv, gemm_tiles })
    }
}
