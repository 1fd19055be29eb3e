//! RUDA's OpenAI-compatible HTTP server over [`ruda_llm::Engine`]: the [`router`] of every
//! endpoint on an [`AppState`], and [`serve`], which runs it on a listener until a shutdown
//! signal and then drains the requests in flight (bounded) and stops the engine.
//!
//! The engine's calls block, so each request's events are read on a blocking thread and
//! forwarded to the connection through a channel; when the client goes away the channel closes,
//! the thread drops the request's handle, and the engine cancels it at its next step.

mod error;
mod handlers;
pub mod metrics;
pub mod reply;
pub mod request;
pub mod tools;
pub mod web;

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ruda_llm::{Engine, EngineInfo, Shutdown};

pub use error::ApiError;

/// How the server presents the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeOptions {
    /// The `model` clients name (`/v1/models`' id).
    pub served_model_name: String,
    /// With a key, `/v1/*`, `/tokenize` and `/detokenize` require `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
}

/// One MiB, the default body limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// The server's state: the engine and the options (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` once shut down.
    engine: RwLock<Option<Engine>>,
    info: EngineInfo,
    options: ServeOptions,
    /// Unix seconds of the start (`/v1/models`' `created`).
    created: u64,
    draining: AtomicBool,
    next_id: AtomicU64,
    id_prefix: u64,
}

/// The request id a response's `x-request-id` carries (a request extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

impl AppState {
    pub fn new(engine: Engine, options: ServeOptions) -> AppState {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        AppState {
            inner: Arc::new(Inner {
                info: engine.info().clone(),
                engine: RwLock::new(Some(engine)),
                options,
                created: now.as_secs(),
                draining: AtomicBool::new(false),
                next_id: AtomicU64::new(0),
                id_prefix: (now.as_nanos() as u64) & 0xffff_ffff_ffff,
            }),
        }
    }

    pub fn options(&self) -> &ServeOptions {
        &self.inner.options
    }

    /// What the engine serves.
    pub fn info(&self) -> &EngineInfo {
        &self.inner.info
    }

    /// Run `f` on the engine; 503 once it was shut down.
    pub fn with_engine<R>(&self, f: impl FnOnce(&Engine) -> Result<R, ApiError>) -> Result<R, ApiError> {
        let guard = self.inner.engine.read().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(engine) => f(engine),
            None => Err(ApiError::unavailable("The server is shutting down")),
        }
    }

    /// Whether `/ready` says 200: the engine serves and no shutdown began.
    pub fn is_ready(&self) -> bool {
        !self.inner.draining.load(Ordering::SeqCst) && self.with_engine(|e| Ok(e.is_serving())).unwrap_or(false)
    }

    /// Stop saying ready (the first step of a shutdown).
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// A fresh id, unique in this process.
    pub fn new_id(&self) -> String {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{:012x}{:08x}", self.inner.id_prefix, n)
    }

    fn created(&self) -> u64 {
        self.inner.created
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.inner.options.api_key else { return true };
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| given.trim() == key)
    }

    /// Take the engine and stop it, finishing what is in flight, for at most `grace`.
    /// Returns whether it stopped in time.
    pub async fn shutdown_engine(&self, grace: Duration) -> bool {
        self.begin_drain();
        let inner = self.inner.clone();
        let stop = tokio::task::spawn_blocking(move || {
            let engine = inner.engine.write().unwrap_or_else(|e| e.into_inner()).take();
            match engine {
                Some(engine) => engine.shutdown(Shutdown::Finish).is_ok(),
                None => true,
            }
        });
        matches!(tokio::time::timeout(grace, stop).await, Ok(Ok(true)))
    }
}

/// Every endpoint on `state`, with the request-id, authentication and panic layer.
pub fn router(state: AppState) -> Router {
    web::routes(Router::new())
        .route("/health", get(handlers::health))
        .route("/ready", get(handlers::ready))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/models", get(handlers::models))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .fallback(handlers::not_found)
        .layer(middleware::from_fn_with_state(state.clone(), outer_layer))
        .with_state(state)
}

/// Whether `path` needs the API key (when there is one).
fn needs_key(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/v1" || path == "/tokenize" || path == "/detokenize"
}

/// Aborts its task when dropped (a client that went away while the handler ran).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `x-request-id` on every response (the client's when it sent one), the API key check, and a
/// 500 envelope rather than a dropped connection should a handler panic.
async fn outer_layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .map(str::to_string)
        .unwrap_or_else(|| state.new_id());
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut response = if needs_key(req.uri().path()) && !state.authorized(req.headers()) {
        ApiError::unauthorized().into_response()
    } else {
        let mut task = AbortOnDrop(tokio::spawn(next.run(req)));
        match (&mut task.0).await {
            Ok(r) => r,
            Err(_) => ApiError::internal("The request failed inside the server").into_response(),
        }
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// How long a shutdown waits for requests in flight, and then for the engine.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(60);

/// Serve `state` on `listener` until `shutdown` resolves; then stop taking connections, let
/// the requests in flight finish (at most `grace`), and stop the engine (at most `grace` more).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let drain = state.clone();
    let server = axum::serve(listener, router(state.clone())).with_graceful_shutdown(async move {
        shutdown.await;
        drain.begin_drain();
        let _ = signalled.send(());
    });
    let mut task = tokio::spawn(server.into_future());
    let served = tokio::select! {
        r = &mut task => r,
        _ = on_signal => match tokio::time::timeout(grace, &mut task).await {
            Ok(r) => r,
            Err(_) => {
                task.abort();
                Ok(Ok(()))
            }
        },
    };
    state.shutdown_engine(grace).await;
    match served {
        Ok(r) => r,
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
