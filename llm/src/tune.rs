//! Tuning from a model folder: the op shapes a model's prefill and decode run, autotuned on the
//! GPU ahead of time (`ruda-llm tune MODEL_DIR`), so the first generation does not pay for it.

use std::io::{IsTerminal, Write};
use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ruda_ops::api::{EXPERTS_DECODE_MAX_TOKENS, GEMV_MAX_M};
use ruda_ops::tune::{tune_shape, DecodeShape, TuneShape};
use ruda_runtime::{AutotuneMode, DType, Device};

use crate::config::{load_config, ModelConfig};
use crate::error::LlmError;
use crate::models::architecture;

/// The tunable op shapes of `config` in `dtype` with a KV cache of `context` positions, as its
/// architecture declares them: each product's GEMV at one row (decode) and, in f16/bf16, the
/// tensor-core GEMM of each product that runs at `prefill_tokens` rows (prefill chunks; tuning
/// keys bucket rows to powers of two), then decode attention for each attention shape.
pub fn model_tune_shapes(config: &ModelConfig, dtype: DType, context: usize, prefill_tokens: usize) -> Vec<TuneShape> {
    let arch = architecture(config.model_type);
    let mut shapes: Vec<TuneShape> = Vec::new();
    let mut add = |shape: TuneShape| {
        if !shapes.contains(&shape) {
            shapes.push(shape);
        }
    };
    for s in arch.linear_shapes(config, 1) {
        add(TuneShape::Gemv { dtype, m: 1, n: s.n, k: s.k });
    }
    if matches!(dtype, DType::F16 | DType::BF16) && prefill_tokens > GEMV_MAX_M {
        for s in arch.linear_shapes(config, prefill_tokens).into_iter().filter(|s| s.m == prefill_tokens) {
            add(TuneShape::Gemm { dtype, m: prefill_tokens, n: s.n, k: s.k });
        }
    }
    // A prefill chunk's routed experts (a decode step's few rows take GEMVs, not tiles).
    if let Some(moe) = config.moe.as_ref().filter(|_| matches!(dtype, DType::F16 | DType::BF16)) {
        if prefill_tokens > EXPERTS_DECODE_MAX_TOKENS {
            add(TuneShape::MoeExperts {
                dtype,
                tokens: prefill_tokens,
                experts: moe.num_experts,
                top_k: moe.top_k,
                hidden: config.hidden_size,
                inter: moe.intermediate_size,
            });
        }
    }
    for a in arch.attention_shapes(config) {
        add(TuneShape::AttentionDecode(DecodeShape {
            dtype,
            batch: 1,
            q_heads: a.q_heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            s_max: context,
        }));
    }
    shapes
}

/// Where tuning reports each shape's result.
pub enum Progress<'a> {
    /// An indicatif bar; each result is printed above it.
    Bar(ProgressBar),
    /// One plain line per shape, `[n/N] shape: result` (logs, pipes, tests).
    Lines(Box<dyn Write + 'a>),
}

impl Progress<'static> {
    /// A bar on standard error when it is a terminal, else plain lines there (so logs of a GPU
    /// run keep every result).
    pub fn stderr() -> Progress<'static> {
        if std::io::stderr().is_terminal() {
            Progress::Bar(ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()))
        } else {
            Progress::Lines(Box::new(std::io::stderr()))
        }
    }
}

impl Progress<'_> {
    fn start(&mut self, total: usize) {
        if let Progress::Bar(bar) = self {
            bar.set_length(total as u64);
            if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
                bar.set_style(style);
            }
        }
    }

    fn tuning(&mut self, shape: &TuneShape) {
        if let Progress::Bar(bar) = self {
            bar.set_message(shape.to_string());
        }
    }

    fn done(&mut self, n: usize, total: usize, line: &str) -> std::io::Result<()> {
        match self {
            Progress::Bar(bar) => {
                bar.println(line);
                bar.inc(1);
                if n == total {
                    bar.finish_and_clear();
                }
                Ok(())
            }
            Progress::Lines(out) => writeln!(out, "[{n}/{total}] {line}"),
        }
    }
}

/// Tune every shape of the model in `dir` on `device` (see [`model_tune_shapes`]), each result
/// to `progress`, a summary to `out`. `Ok(false)` when some shape failed. On the CPU, or with
/// `RUDA_AUTOTUNE=off`, it lists the shapes and tunes nothing.
pub fn tune_model(
    dir: &Path,
    device: &Device,
    dtype: DType,
    context: usize,
    prefill_tokens: usize,
    out: &mut dyn Write,
    mut progress: Progress,
) -> Result<bool, LlmError> {
    let config = load_config(dir)?;
    if context == 0 || context > config.max_position_embeddings {
        return Err(LlmError::InvalidArgument(format!(
            "the context must be 1 to {} (max_position_embeddings), got {context}",
            config.max_position_embeddings
        )));
    }
    let shapes = model_tune_shapes(&config, dtype, context, prefill_tokens);
    let io = |e: std::io::Error| LlmError::InvalidArgument(format!("writing output: {e}"));
    let mode = AutotuneMode::from_env(device)?;
    if device.is_cpu() || mode == AutotuneMode::Off {
        let why = if device.is_cpu() { "autotuning is off on the CPU device" } else { "RUDA_AUTOTUNE=off" };
        writeln!(out, "{why}: the {} shapes of {} are listed, nothing is tuned", shapes.len(), dir.display())
            .map_err(io)?;
        for shape in &shapes {
            writeln!(out, "{shape}").map_err(io)?;
        }
        return Ok(true);
    }
    let stream = device.default_stream();
    let mut failed = 0;
    progress.start(shapes.len());
    for (n, shape) in shapes.iter().enumerate() {
        progress.tuning(shape);
        let result = match tune_shape(&stream, shape) {
            Ok(Some(choice)) => format!(
                "{}{}{}",
                choice.candidate.name,
                choice.median_ms.map_or(String::new(), |ms| format!(" ({ms:.4} ms)")),
                if choice.cached { ", cached" } else { "" }
            ),
            Ok(None) => "not tunable here".into(),
            Err(e) => {
                failed += 1;
                format!("FAILED: {e}")
            }
        };
        progress.done(n + 1, shapes.len(), &format!("{shape}: {result}")).map_err(io)?;
    }
    writeln!(
        out,
        "tuned {} of {} shapes of {} on {}",
        shapes.len() - failed,
        shapes.len(),
        dir.display(),
        device.description()
    )
    .map_err(io)?;
    Ok(failed == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_folder_gives_its_decode_shapes() {
        let dir = crate::example::bundled_model(crate::ModelType::Qwen3);
        let (mut out, mut progress) = (Vec::new(), Vec::new());
        let lines = Progress::Lines(Box::new(&mut progress));
        assert!(tune_model(&dir, &Device::cpu(), DType::F32, 200, 512, &mut out, lines).unwrap());
        assert!(progress.is_empty(), "nothing is tuned on the CPU");
        let out = String::from_utf8(out).unwrap();
        // hidden 64, 4 query / 2 KV heads of 64, intermediate 96, vocabulary 402: q, k/v, o,
        // gate+up, down, lm_head, then attention.
        let lines: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                "gemv f32 1x256x64",
                "gemv f32 1x128x64",
                "gemv f32 1x64x256",
                "gemv f32 1x192x64",
                "gemv f32 1x64x96",
                "gemv f32 1x402x64",
                "attention_decode f32 1x4x2x64x200"
            ]
        );
        assert!(out.starts_with("autotuning is off on the CPU device"));
        // bf16 adds each projection's prefill GEMM.
        let config = load_config(&dir).unwrap();
        let gemms: Vec<String> = model_tune_shapes(&config, DType::BF16, 200, 512)
            .iter()
            .map(ToString::to_string)
            .filter(|s| s.starts_with("gemm"))
            .collect();
        assert_eq!(
            gemms,
            [
                "gemm bf16 512x256x64",
                "gemm bf16 512x128x64",
                "gemm bf16 512x64x256",
                "gemm bf16 512x192x64",
                "gemm bf16 512x64x96"
            ]
        );
        let lines = Progress::Lines(Box::new(Vec::new()));
        let err = tune_model(&dir, &Device::cpu(), DType::F32, 0, 512, &mut Vec::new(), lines).unwrap_err();
        assert!(err.to_string().contains("context"), "{err}");
    }
}
