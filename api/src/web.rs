//! The web page at `/`, embedded in the binary from `web/`.
//!
//! A single static page (no build step, no CDN) that lists jobs through the
//! same REST API users call, refreshing every few seconds.

use crate::AppState;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("../../web/index.html");

/// `/` and `/index.html`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
}

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
}
