//! The `qwen2_generate` / `qwen3_generate` / `qwen35_generate` examples: `MODEL_DIR PROMPT
//! [MAX_NEW_TOKENS=32, 8 for Qwen3.5] [RUNS=1]`, or no arguments for the bundled tiny model. Standard output is JSON lines only: one
//! `load` event, then one `generation` event per run; notices go to standard error.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::config::ModelType;
use crate::error::LlmError;
use crate::generate::{GreedyGenerationConfig, StreamControl};
use crate::pipeline::{Pipeline, PipelineOptions};

/// The bundled tiny model of `model_type` (random weights, a small byte-level BPE tokenizer):
/// what the examples run without arguments. In the source tree the binary was built from, or
/// else `llm/models/` under the working directory (a binary copied to another checkout).
pub fn bundled_model(model_type: ModelType) -> PathBuf {
    let name = format!("tiny-{}", model_type.short_name());
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(&name);
    if built.exists() {
        built
    } else {
        PathBuf::from("llm/models").join(name)
    }
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq)]
pub struct ExampleArgs {
    pub model_dir: PathBuf,
    pub prompt: String,
    pub max_new_tokens: usize,
    pub runs: usize,
}

impl ExampleArgs {
    /// Parse `MODEL_DIR PROMPT [MAX_NEW_TOKENS] [RUNS]` (without the program name), as the OS
    /// gives them: `MODEL_DIR` may be any path (Linux paths need not be UTF-8); the prompt and
    /// the numbers must be text.
    pub fn parse(model_type: ModelType, args: &[impl AsRef<OsStr>]) -> Result<ExampleArgs, LlmError> {
        let default_new = model_type.default_max_new_tokens();
        let usage = || {
            format!(
                "usage: {}_generate [MODEL_DIR PROMPT [MAX_NEW_TOKENS={default_new}] [RUNS=1]] (no arguments: the bundled tiny model)",
                model_type.short_name()
            )
        };
        let positive = |what: &str, s: &OsStr| -> Result<usize, LlmError> {
            match s.to_str().map(str::parse::<usize>) {
                Some(Ok(n)) if n > 0 => Ok(n),
                _ => Err(LlmError::InvalidArgument(format!(
                    "{what} must be a positive integer, got \"{}\"\n{}",
                    s.to_string_lossy(),
                    usage()
                ))),
            }
        };
        let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
        match args[..] {
            [] => Ok(ExampleArgs {
                model_dir: bundled_model(model_type),
                prompt: "Hello".into(),
                max_new_tokens: default_new,
                runs: 1,
            }),
            [dir, prompt, ref rest @ ..] if rest.len() <= 2 => Ok(ExampleArgs {
                model_dir: PathBuf::from(dir),
                prompt: prompt_text(prompt)?,
                max_new_tokens: rest.first().map(|s| positive("MAX_NEW_TOKENS", s)).transpose()?.unwrap_or(default_new),
                runs: rest.get(1).map(|s| positive("RUNS", s)).transpose()?.unwrap_or(1),
            }),
            _ => Err(LlmError::InvalidArgument(usage())),
        }
    }
}

/// A prompt argument as text: the examples and `ruda-llm generate` refuse one that is not
/// UTF-8 with this error (tokenizers take text; a lossy conversion would change the prompt).
pub fn prompt_text(prompt: &OsStr) -> Result<String, LlmError> {
    prompt.to_str().map(str::to_string).ok_or_else(|| {
        LlmError::InvalidArgument(format!("the prompt is not valid UTF-8 text: \"{}\"", prompt.to_string_lossy()))
    })
}

/// One JSON object with its keys in the given order.
fn json_line(fields: &[(&str, Value)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{}:{v}", Value::from(*k))).collect();
    format!("{{{}}}", body.join(","))
}

/// Run the example for `model_type` with `args` (see [`ExampleArgs::parse`]), writing JSON
/// lines to `out` and notices to `notices`.
pub fn run(
    model_type: ModelType,
    args: &[impl AsRef<OsStr>],
    out: &mut dyn Write,
    notices: &mut dyn Write,
) -> Result<(), LlmError> {
    run_parsed(model_type, &ExampleArgs::parse(model_type, args)?, out, notices)
}

/// [`run`] with the arguments already parsed (`ruda-llm generate` parses its own).
pub fn run_parsed(
    model_type: ModelType,
    args: &ExampleArgs,
    out: &mut dyn Write,
    notices: &mut dyn Write,
) -> Result<(), LlmError> {
    if args.prompt.is_empty() {
        return Err(LlmError::InvalidArgument("the prompt is empty".into()));
    }
    let pipeline = Pipeline::load_expecting_type(&args.model_dir, model_type, &PipelineOptions::default())?;
    let device = pipeline.device();
    let compiler = device.compiler().map_or("interpreter".to_string(), |c| c.to_string());
    if device.is_cpu() {
        // A notice, not an error: the interpreter is exact but slow.
        let _ = writeln!(
            notices,
            "note: running on the CPU through RUDA's IR interpreter (no GPU in use; RUDA_DEVICE=cuda requires one)"
        );
    }
    let io = |e: std::io::Error| LlmError::InvalidArgument(format!("writing output: {e}"));
    let loaded = &pipeline.loaded;
    let line = json_line(&[
        ("event", json!("load")),
        ("model_type", json!(loaded.config.model_type.name())),
        ("load_seconds", json!(loaded.load_seconds)),
        ("device", json!(device.description())),
        ("dtype", json!(loaded.dtype.name())),
        ("compiler", json!(compiler)),
        ("parameters", json!(loaded.parameters)),
    ]);
    writeln!(out, "{line}").map_err(io)?;
    for run in 1..=args.runs {
        let config = GreedyGenerationConfig {
            max_new_tokens: args.max_new_tokens,
            eos_token_ids: loaded.default_eos_token_ids.clone(),
        };
        let g = pipeline.generate(&args.prompt, &config.into(), true, true, |_, _| StreamControl::Continue)?;
        let line = json_line(&[
            ("event", json!("generation")),
            ("run", json!(run)),
            ("text", json!(g.text)),
            ("generated_text", json!(g.generated_text)),
            ("generated_token_ids", json!(g.generated_token_ids)),
            ("stopped_on_eos", json!(g.stopped_on_eos)),
            ("stop_reason", json!(g.stop_reason.as_str())),
            ("prompt_tokens", json!(g.prompt_token_ids.len())),
            ("prefill_ms", json!(g.prefill_ms)),
            ("decode_tokens_per_second", json!(g.decode_tokens_per_second)),
        ]);
        writeln!(out, "{line}").map_err(io)?;
        out.flush().map_err(io)?;
    }
    Ok(())
}

/// `main` of an example: run, and on error print it to standard error and exit with status 1.
pub fn main(model_type: ModelType) {
    // `args_os`: `std::env::args` panics on an argument that is not UTF-8, a legal Linux path.
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if let Err(e) = run(model_type, &args, &mut std::io::stdout().lock(), &mut std::io::stderr()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
