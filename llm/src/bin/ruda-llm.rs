//! `ruda-llm`: the model layer's command line.
//!
//! - `ruda-llm generate MODEL_DIR PROMPT [MAX_NEW_TOKENS=32 (8 for Qwen3.5)] [RUNS=1]`: greedy generation with any
//!   supported architecture (dispatched on `config.json`'s `model_type`), printing exactly the
//!   `qwen2_generate` / `qwen3_generate` examples' JSON lines; exit status 1 on any error.
//! - `ruda-llm tune MODEL_DIR [--context N] [--prefill-tokens N] [--dtype f32|f16|bf16]`:
//!   autotune the op shapes of a model folder on the `RUDA_DEVICE` GPU ahead of generation (see
//!   `ruda_llm::tune`); exit status 1 when a shape failed, 2 on any other error.
//! - `ruda-llm profile MODEL_DIR [--context N] [--dtype f32|f16|bf16] [--gpu NAME] [--json]`: one
//!   decode step on paper (`ruda_llm::profile`): each launch's bytes, flops and roofline bound on
//!   the GPU, their sum against the ideal; runs nothing and reads only `config.json`; exit
//!   status 2 on any error.
//! - `ruda-llm batch MODEL_DIR --prompts FILE [--max-new-tokens N] [--max-active N]
//!   [--max-batch-tokens N] [--block-size N] [--num-pages N] [--prefix-cache] [--ignore-eos]`:
//!   continuous batching over the requests of a JSONL file (`ruda_llm::Pipeline::generate_batch`),
//!   one JSON line per finished request, in finish order, then a summary line; progress on
//!   standard error; exit status 1 on any error.
//! - `ruda-llm bench-serve --url URL [--concurrency 1,8,32] [--requests N] [--input-len N]
//!   [--output-len N] [--model NAME] [--api-key KEY] [--timeout-s N]`: the serving benchmark
//!   (`ruda_llm::bench_serve`), one JSON line per concurrency level; exit status 1 on any error.
//! - `ruda-llm serve ARGS`: the OpenAI-compatible server, `ruda-serve ARGS` (crate `ruda-serve`,
//!   so this library does not pull in an HTTP stack), found beside this executable or on `PATH`.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use ruda_llm::example::{self, ExampleArgs};
use ruda_llm::profile::{profile_decode, DEFAULT_PROFILE_CONTEXT};
use ruda_llm::tune::{tune_model, Progress};
use ruda_llm::LlmError;
use ruda_ops::perf::gpu::{gpu, Gpu};
use ruda_runtime::{DType, Device};

#[derive(Parser)]
#[command(name = "ruda-llm", about = "Run and tune Hugging Face Qwen models on RUDA's kernels")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Greedy generation after PROMPT (encoded as is, no chat template), printing JSON lines: one
    /// `load` event, then one `generation` event per run
    Generate(GenerateArgs),
    /// Autotune the op shapes of a model's prefill and decode on the RUDA_DEVICE GPU (on the CPU,
    /// or with RUDA_AUTOTUNE=off, list them)
    Tune(TuneArgs),
    /// ESTIMATE one decode step on paper: each kernel launch's bytes, flops and roofline bound on
    /// a GPU, their sum, the ideal (weights and KV cache at peak DRAM bandwidth) and the launches
    /// furthest short. Runs no kernel and reads only config.json
    Profile(ProfileArgs),
    /// Generate for every prompt of a JSONL file at once through continuous batching, printing
    /// one JSON line per finished request (in finish order), then a summary line
    Batch(BatchArgs),
    /// Benchmark a running server as `vllm bench serve` does: streaming completions at each
    /// concurrency, request throughput, output tokens/s, TTFT, TPOT and ITL (mean, p50, p99)
    BenchServe(BenchServeArgs),
    /// Serve a model over an OpenAI-compatible HTTP API: runs `ruda-serve` with these arguments
    /// (see `ruda-serve --help` and docs/serving.md)
    #[command(disable_help_flag = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

#[derive(Args)]
struct BenchServeArgs {
    /// The server, http://HOST:PORT
    #[arg(long, value_name = "URL")]
    url: String,
    /// Concurrent clients, one level after another
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "1,8,32")]
    concurrency: Vec<usize>,
    /// Requests per level
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 64)]
    requests: usize,
    /// Prompt length in words (about one token each)
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 128)]
    input_len: usize,
    /// Tokens per reply (EOS ignored)
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 64)]
    output_len: usize,
    /// The served model [default: the first of /v1/models]
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Seconds one request may take
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 600)]
    timeout_s: usize,
}

fn bench_serve(args: BenchServeArgs) -> Result<(), LlmError> {
    use ruda_llm::bench_serve::{bench_serve, BenchServeConfig};
    let cfg = BenchServeConfig {
        url: args.url,
        concurrency: args.concurrency,
        requests: args.requests,
        input_len: args.input_len,
        output_len: args.output_len,
        model: args.model,
        api_key: args.api_key,
        timeout: std::time::Duration::from_secs(args.timeout_s as u64),
    };
    eprintln!(
        "bench-serve: {} requests per level at concurrency {:?} against {}",
        cfg.requests, cfg.concurrency, cfg.url
    );
    bench_serve(&cfg, |r| {
        let mut line = r.to_json();
        line["event"] = "bench_serve".into();
        println!("{line}");
        eprintln!(
            "bench-serve: concurrency {:>3}: {} done, {} failed, {:.2} req/s, {:.1} output tok/s, TTFT {:.1} ms (p99 {:.1}), TPOT {:.1} ms, ITL {:.1} ms (p99 {:.1})",
            r.concurrency,
            r.completed,
            r.failed,
            r.request_throughput,
            r.output_tokens_per_second,
            r.ttft.mean * 1e3,
            r.ttft.p99 * 1e3,
            r.tpot.mean * 1e3,
            r.itl.mean * 1e3,
            r.itl.p99 * 1e3
        );
    })?;
    Ok(())
}

/// `ruda-serve` beside this executable (cargo builds both into one folder), else on `PATH`.
fn serve(args: Vec<OsString>) -> ExitCode {
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join("ruda-serve")));
    let program = match beside.filter(|p| p.is_file()) {
        Some(p) => p.into_os_string(),
        None => OsString::from("ruda-serve"),
    };
    match std::process::Command::new(&program).args(&args).status() {
        Ok(status) => ExitCode::from(status.code().map_or(1, |c| c.clamp(0, 255) as u8)),
        Err(e) => {
            eprintln!(
                "error: cannot run {} ({e}): the server is the ruda-serve crate's binary; build it with `cargo build --release -p ruda-serve`",
                program.to_string_lossy()
            );
            ExitCode::from(1)
        }
    }
}

#[derive(Args)]
struct BatchArgs {
    /// A Hugging Face model folder (config.json, safetensors, tokenizer.json)
    model_dir: PathBuf,
    /// One JSON object per line: {"prompt": "..."}, optionally with its own max_new_tokens,
    /// temperature, top_k, top_p, min_p, seed, repetition_penalty and stop (a list of strings); greedy
    /// unless it sets a temperature
    #[arg(long, value_name = "FILE")]
    prompts: PathBuf,
    /// Tokens to generate per request, unless its line says otherwise
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 32)]
    max_new_tokens: usize,
    /// Requests running at once
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 16)]
    max_active: usize,
    /// Tokens one batch carries at most (longer prompts are prefilled in chunks)
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 512)]
    max_batch_tokens: usize,
    /// Positions per KV page
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true, default_value_t = 16)]
    block_size: usize,
    /// KV pages in the pool [default: enough for --max-active of the longest request]
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true)]
    num_pages: Option<usize>,
    /// Share the KV pages of common prompt prefixes (not implemented yet: an error)
    #[arg(long)]
    prefix_cache: bool,
    /// Keep generating past EOS tokens (every request runs to its max_new_tokens or a stop
    /// sequence)
    #[arg(long)]
    ignore_eos: bool,
}

#[derive(Args)]
struct ProfileArgs {
    /// A Hugging Face model folder
    model_dir: PathBuf,
    /// Keys the step's attention reads (the cached positions and the new one) [default: 4096, at
    /// most max_position_embeddings]
    #[arg(long, value_name = "N", value_parser = positive(), allow_negative_numbers = true)]
    context: Option<usize>,
    /// The compute dtype
    #[arg(long, value_name = "f32|f16|bf16", value_parser = compute_dtype, default_value = "bf16")]
    dtype: DType,
    /// The GPU whose peaks bound each launch (a100, h100-sxm, h200)
    #[arg(long, value_name = "NAME", value_parser = gpu, default_value = "h200")]
    gpu: &'static Gpu,
    /// One JSON object instead of the table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct GenerateArgs {
    /// A Hugging Face model folder (config.json, safetensors, tokenizer.json)
    model_dir: PathBuf,
    /// The prompt (UTF-8); one that starts with `-` is a prompt too, as in the examples
    #[arg(allow_hyphen_values = true)]
    prompt: OsString,
    /// Tokens to generate at most [default: 32; 8 for Qwen3.5, as its example]
    #[arg(value_parser = positive(), allow_negative_numbers = true)]
    max_new_tokens: Option<usize>,
    /// Generations to run (timings of later runs exclude first-use costs) [default: 1]
    #[arg(value_parser = positive(), allow_negative_numbers = true)]
    runs: Option<usize>,
}

#[derive(Args)]
struct TuneArgs {
    /// A Hugging Face model folder
    model_dir: PathBuf,
    /// The KV cache capacity to tune decode attention for [default: 4096, as a pipeline's, at
    /// most max_position_embeddings]
    #[arg(long, value_name = "N")]
    context: Option<usize>,
    /// Rows of a prefill chunk
    #[arg(long, value_name = "N", default_value_t = 512)]
    prefill_tokens: usize,
    /// The compute dtype [default: bf16 on CUDA, f32 on the CPU]
    #[arg(long, value_name = "f32|f16|bf16", value_parser = compute_dtype)]
    dtype: Option<DType>,
}

/// A positive count. Parsed from the OS string, so that a non-UTF-8 value is named with its
/// argument like any other bad value (and a negative one is a value, not an unknown flag).
fn positive() -> impl TypedValueParser<Value = usize> {
    OsStringValueParser::new().try_map(|s| {
        s.to_str().and_then(|s| s.parse::<usize>().ok()).filter(|&n| n > 0).ok_or("must be a positive integer")
    })
}

fn compute_dtype(s: &str) -> Result<DType, String> {
    DType::from_name(s)
        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
        .ok_or_else(|| "expected f32, f16 or bf16".to_string())
}

fn generate(args: GenerateArgs) -> Result<(), LlmError> {
    let prompt = example::prompt_text(&args.prompt)?;
    let model_type = ruda_llm::architecture_of(&args.model_dir)?.model_type();
    let max_new_tokens = args.max_new_tokens.unwrap_or(model_type.default_max_new_tokens());
    let parsed = ExampleArgs { model_dir: args.model_dir, prompt, max_new_tokens, runs: args.runs.unwrap_or(1) };
    example::run_parsed(model_type, &parsed, &mut std::io::stdout().lock(), &mut std::io::stderr())
}

fn tune(args: TuneArgs) -> Result<bool, LlmError> {
    let device = Device::from_env()?;
    let dtype = args.dtype.unwrap_or(if device.is_cuda() { DType::BF16 } else { DType::F32 });
    let max = ruda_llm::load_config(&args.model_dir)?.max_position_embeddings;
    let context = args.context.unwrap_or(ruda_llm::DEFAULT_CONTEXT.min(max));
    tune_model(
        &args.model_dir,
        &device,
        dtype,
        context,
        args.prefill_tokens,
        &mut std::io::stdout(),
        Progress::stderr(),
    )
}

fn batch(args: BatchArgs) -> Result<(), LlmError> {
    use std::io::Write;
    use std::time::{Duration, Instant};

    use ruda_llm::{BatchEvent, BatchOptions};

    let source = args.prompts.display().to_string();
    let text = std::fs::read_to_string(&args.prompts)
        .map_err(|e| LlmError::InvalidArgument(format!("{source}: cannot read the prompts: {e}")))?;
    let pipeline = ruda_llm::load_pipeline(&args.model_dir, &ruda_llm::PipelineOptions::default())?;
    let mut defaults = ruda_llm::GenerateParams {
        max_new_tokens: args.max_new_tokens,
        eos_token_ids: pipeline.default_generate_params().eos_token_ids,
        ..Default::default()
    };
    if args.ignore_eos {
        defaults.eos_token_ids.clear();
    }
    let requests = ruda_llm::batch::parse_prompt_lines(&text, &source, &defaults)?;
    let options = BatchOptions {
        max_active: args.max_active,
        max_batch_tokens: args.max_batch_tokens,
        block_size: args.block_size,
        num_pages: args.num_pages,
        prefix_cache: args.prefix_cache.then(ruda_llm::PrefixCacheBounds::default),
        skip_special_tokens: true,
    };
    eprintln!(
        "batch: {} requests from {source}, at most {} at once and {} tokens a batch",
        requests.len(),
        options.max_active,
        options.max_batch_tokens
    );
    let mut out = std::io::stdout().lock();
    let (mut write_error, mut last_progress) = (None, Instant::now());
    let summary = pipeline.generate_batch(&requests, &options, |event| match event {
        BatchEvent::Finished(o) => {
            let line = serde_json::json!({
                "event": "request",
                "index": o.index,
                "prompt_tokens": o.prompt_tokens,
                "generated_token_ids": o.generated_token_ids,
                "generated_text": o.generated_text,
                "stop_reason": o.stop_reason.as_str(),
            });
            if let Err(e) = writeln!(out, "{line}").and_then(|_| out.flush()) {
                write_error.get_or_insert(e);
            }
        }
        BatchEvent::Step { stats, finished, requests } => {
            if last_progress.elapsed() >= Duration::from_millis(500) || finished == requests {
                last_progress = Instant::now();
                eprintln!(
                    "batch: {finished}/{requests} done, {} running, {} waiting, {} tokens generated, KV pages {:.0}% used, {} preemptions",
                    stats.running,
                    stats.waiting,
                    stats.generation_tokens,
                    100.0 * stats.kv_usage,
                    stats.preemptions
                );
            }
        }
    })?;
    if let Some(e) = write_error {
        return Err(LlmError::InvalidArgument(format!("writing to standard output: {e}")));
    }
    let line = serde_json::json!({
        "event": "summary",
        "requests": summary.requests,
        "generated_tokens": summary.generated_tokens,
        "seconds": summary.seconds,
        "tokens_per_second": summary.tokens_per_second,
        "batches": summary.batches,
        "preemptions": summary.preemptions,
        "prefix_hits": summary.prefix_hits,
    });
    writeln!(out, "{line}").map_err(|e| LlmError::InvalidArgument(format!("writing to standard output: {e}")))?;
    Ok(())
}

// `--context`'s help states the default.
const _: () = assert!(DEFAULT_PROFILE_CONTEXT == 4096);

fn profile(args: ProfileArgs) -> Result<(), LlmError> {
    let p = profile_decode(&args.model_dir, args.context, args.dtype, args.gpu)?;
    if args.json {
        println!("{}", p.to_json());
    } else {
        print!("{}", p.table());
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` prints to standard output with status 0; usage errors exit 1 under
            // `generate` (as the examples) and `batch`, 2 elsewhere (as `tune` always has).
            let _ = e.print();
            return match e.exit_code() {
                0 => ExitCode::SUCCESS,
                _ if ["generate", "batch"]
                    .map(OsStr::new)
                    .iter()
                    .any(|c| argv.get(1).map(OsString::as_os_str) == Some(c)) =>
                {
                    ExitCode::from(1)
                }
                _ => ExitCode::from(2),
            };
        }
    };
    match cli.command {
        Command::Generate(args) => match generate(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Profile(args) => match profile(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Serve { args } => serve(args),
        Command::BenchServe(args) => match bench_serve(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Batch(args) => match batch(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Tune(args) => match tune(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
    }
}
