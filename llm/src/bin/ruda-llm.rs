//! `ruda-llm tune MODEL_DIR [--context N] [--prefill-tokens N] [--dtype f32|f16|bf16]`: autotune
//! the op shapes of a model folder on the `RUDA_DEVICE` GPU ahead of generation (see
//! `ruda_llm::tune`).

use std::path::PathBuf;
use std::process::ExitCode;

use ruda_llm::LlmError;
use ruda_runtime::{DType, Device};

const USAGE: &str = "usage: ruda-llm tune MODEL_DIR [--context N (the KV cache capacity; default 4096 as a pipeline's, at most max_position_embeddings)] \
[--prefill-tokens N (rows of a prefill chunk, default 512)] [--dtype f32|f16|bf16 (default bf16 on CUDA, f32 on the CPU)]";

fn run(args: &[String]) -> Result<bool, LlmError> {
    let bad = |m: String| LlmError::InvalidArgument(format!("{m}\n{USAGE}"));
    let [command, dir, rest @ ..] = args else { return Err(bad("missing arguments".into())) };
    if command != "tune" {
        return Err(bad(format!("unknown command `{command}`")));
    }
    let (mut context, mut prefill_tokens, mut dtype) = (None, 512, None);
    let mut options = rest.iter();
    while let Some(flag) = options.next() {
        let value = options.next().ok_or_else(|| bad(format!("`{flag}` needs a value")))?;
        match flag.as_str() {
            "--context" => {
                context = Some(value.parse::<usize>().map_err(|_| bad(format!("--context {value}: not a number")))?)
            }
            "--prefill-tokens" => {
                prefill_tokens =
                    value.parse::<usize>().map_err(|_| bad(format!("--prefill-tokens {value}: not a number")))?
            }
            "--dtype" => {
                dtype = Some(
                    DType::from_name(value)
                        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
                        .ok_or_else(|| bad(format!("--dtype {value}: expected f32, f16 or bf16")))?,
                )
            }
            other => return Err(bad(format!("unknown option `{other}`"))),
        }
    }
    let device = Device::from_env()?;
    let dtype = dtype.unwrap_or(if device.is_cuda() { DType::BF16 } else { DType::F32 });
    let dir = PathBuf::from(dir);
    let max = ruda_llm::load_config(&dir)?.max_position_embeddings;
    let context = context.unwrap_or(ruda_llm::DEFAULT_CONTEXT.min(max));
    ruda_llm::tune::tune_model(
        &dir,
        &device,
        dtype,
        context,
        prefill_tokens,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
