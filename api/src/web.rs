//! The web UI at `/`, embedded in the binary from `web/`.
//!
//! Three static files and no build step or CDN: `index.html` (the page and
//! its view templates), `app.css`, and `app.js`, which talks to the same
//! REST API as every other client — jobs with their curves, cluster map,
//! timeline and logs; executors; a JSON editor that submits specs and shows
//! the API's field errors beside the fields — and follows
//! `/v1/events/stream` to refetch what changed. They are served with
//! `no-cache`, so a new binary's page is picked up at the next load.

use crate::AppState;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("../../web/index.html");
const APP_JS: &str = include_str!("../../web/app.js");
const APP_CSS: &str = include_str!("../../web/app.css");

/// `/`, `/index.html` and the page's assets under `/assets/`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> impl IntoResponse {
    asset("text/css; charset=utf-8", APP_CSS)
}
