//! `ruda-serve MODEL_DIR [flags]`: load the model, start the engine, then bind and serve the
//! OpenAI-compatible API until Ctrl-C or SIGTERM (docs/serving.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ruda_llm::{load_pipeline, BatchOptions, Engine, EngineConfig, PipelineOptions, PrefixCacheBounds};
use ruda_serve::{AppState, ServeOptions, DEFAULT_MAX_BODY_BYTES, DEFAULT_SHUTDOWN_GRACE};

#[derive(Parser, Debug)]
#[command(name = "ruda-serve", about = "Serve a model over an OpenAI-compatible HTTP API")]
struct Cli {
    /// The model folder (config.json, safetensors, tokenizer.json).
    #[arg(value_name = "MODEL_DIR", conflicts_with = "model")]
    model_dir: Option<PathBuf>,
    /// The model folder (instead of the positional argument).
    #[arg(long, value_name = "MODEL_DIR")]
    model: Option<PathBuf>,
    /// The name clients pass as `model` [default: the folder's name].
    #[arg(long)]
    served_model_name: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    bind: SocketAddr,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize.
    #[arg(long)]
    api_key: Option<String>,
    /// Requests running at once.
    #[arg(long, default_value_t = 16)]
    max_active: usize,
    /// Requests waiting beyond those running; more get 429.
    #[arg(long, default_value_t = 64)]
    max_pending: usize,
    /// Tokens one batch carries at most.
    #[arg(long, default_value_t = 512)]
    max_batch_tokens: usize,
    /// The longest request (prompt plus new tokens) [default: the model's max_position_embeddings].
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Positions per KV page.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV pages in the pool [default: max-active times the pages of max-model-len].
    #[arg(long)]
    num_pages: Option<usize>,
    /// Share the KV pages of common prompt prefixes.
    #[arg(long)]
    prefix_cache: bool,
    /// Bytes the prefix cache may hold, in MiB (implies --prefix-cache).
    #[arg(long, value_name = "N")]
    prefix_cache_max_mib: Option<u64>,
    /// Entries the prefix cache may hold (implies --prefix-cache).
    #[arg(long, value_name = "N")]
    prefix_cache_max_entries: Option<usize>,
    /// Larger request bodies get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ruda-serve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let Some(dir) = cli.model_dir.or(cli.model) else {
        return Err("a model folder is required: ruda-serve MODEL_DIR (or --model MODEL_DIR)".into());
    };
    let name = cli.served_model_name.unwrap_or_else(|| {
        dir.canonicalize()
            .ok()
            .as_deref()
            .unwrap_or(&dir)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let prefix_cache = (cli.prefix_cache
        || cli.prefix_cache_max_mib.is_some()
        || cli.prefix_cache_max_entries.is_some())
    .then_some(PrefixCacheBounds {
        max_bytes: cli.prefix_cache_max_mib.map(|m| m.saturating_mul(1 << 20)),
        max_entries: cli.prefix_cache_max_entries,
    });
    let batch = BatchOptions {
        max_active: cli.max_active,
        max_batch_tokens: cli.max_batch_tokens,
        block_size: cli.block_size,
        num_pages: cli.num_pages,
        prefix_cache,
        ..BatchOptions::default()
    };
    eprintln!("ruda-serve: loading {}", dir.display());
    let pipeline =
        load_pipeline(&dir, &PipelineOptions::default()).map_err(|e| format!("loading {}: {e}", dir.display()))?;
    let engine =
        Engine::start(pipeline, EngineConfig { batch, max_model_len: cli.max_model_len, max_pending: cli.max_pending })
            .map_err(|e| format!("starting the engine: {e}"))?;
    let state = AppState::new(
        engine,
        ServeOptions { served_model_name: name.clone(), api_key: cli.api_key, max_body_bytes: cli.max_body_bytes },
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    runtime.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(cli.bind).await.map_err(|e| format!("binding {}: {e}", cli.bind))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("ruda-serve: serving {name} on http://{addr} (max_model_len {})", state.info().max_model_len);
        ruda_serve::serve(listener, state, ruda_serve::shutdown_signal(), DEFAULT_SHUTDOWN_GRACE)
            .await
            .map_err(|e| format!("serving: {e}"))?;
        eprintln!("ruda-serve: stopped");
        Ok(())
    })
}
