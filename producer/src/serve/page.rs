//! The operator page at `/`: the pool's jobs, one job's mini-batches in flight, the queue,
//! refreshed live, as Flower is for Celery.
//!
//! The page is three files built into the binary (no framework, no font, nothing fetched
//! from elsewhere), open to anyone: they hold no secret. The figures come from the API
//! (`/v1/…`), which the page reads with the bearer token when one is set, asked of the
//! operator once and kept in the tab's session storage. Every string from a job is put in
//! the page as text, never as markup, and the content security policy allows no inline
//! script besides.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::Served;

const INDEX: &str = include_str!("page/index.html");
const STYLE: &str = include_str!("page/page.css");
const SCRIPT: &str = include_str!("page/page.js");

/// Scripts, styles and requests from this origin only; no inline script, no frame.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page's routes, open to anyone (the API they read is guarded).
pub(super) fn routes() -> Router<Served> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/page.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/page.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
