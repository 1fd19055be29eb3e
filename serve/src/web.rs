//! The web chat (`serve/web/`, docs/web-chat.md), embedded in the binary so it works offline:
//! the page at `/` and its three assets, each with its content type, `nosniff`, `no-cache`,
//! and the page's content security policy (plus `frame-ancestors 'none'`, which a `<meta>` tag
//! cannot carry).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::AppState;

/// `(path, content type, file)`.
pub const ASSETS: [(&str, &str, &str); 4] = [
    ("/", "text/html; charset=utf-8", include_str!("../web/index.html")),
    ("/app.js", "text/javascript; charset=utf-8", include_str!("../web/app.js")),
    ("/chat.js", "text/javascript; charset=utf-8", include_str!("../web/chat.js")),
    ("/style.css", "text/css; charset=utf-8", include_str!("../web/style.css")),
];

/// The page's own policy (its `<meta>` tag's) and no framing.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
        ],
        body,
    )
        .into_response()
}

/// The page's routes.
pub fn routes(router: Router<AppState>) -> Router<AppState> {
    ASSETS.iter().fold(router, |r, &(path, content_type, body)| {
        r.route(path, get(move || async move { asset(content_type, body) }))
    })
}
