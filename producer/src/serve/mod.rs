//! `fleetrun serve`: the fleet's HTTP API, for the services that enqueue jobs, and the
//! operator page that reads it.
//!
//! Stateless: every request is answered from the fleet's ledger, registry and queue, so any
//! number of instances may stand behind a load balancer. A job submitted here is the job
//! `fleetrun submit` would submit (the same validation, the same idempotence on its id);
//! the instance that registers it publishes its mini-batches in the background, and if that
//! instance dies first, any instance (this one restarted, another) finishes the publication.
//!
//! # Layout
//!
//! - `api`: the routes, their request and response types, and the errors as HTTP answers.
//! - `page`: the operator page at `/` (its HTML, CSS and JavaScript in `page/`).
//! - `metrics`: the pool's jobs as Prometheus metrics, on a listener of their own
//!   (`--metrics-addr`), with the autoscaling signal (seconds of work left).
//! - `publications`: finishing the publications their publisher left unfinished.
//! - this file: the router, the optional bearer token, serving until shut down.

mod api;
mod metrics;
mod page;
mod publications;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use fleetrun_worker::job::Fleet;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use api::{ApiDoc, SubmitRequest, Submitted};
pub use metrics::Scraper;

/// What every request handler shares.
#[derive(Clone)]
struct Served {
    fleet: Fleet,
    /// Requests must carry `Authorization: Bearer <token>` when set.
    token: Option<Arc<str>>,
}

/// Serves the API on `listener`, and the metrics on `metrics` when given, until `shutdown`
/// is cancelled; requests in flight finish. Meanwhile finishes the pool's publications left
/// unfinished (`publications`).
pub async fn run(
    fleet: Fleet,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    token: Option<String>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let scraper = Arc::new(Scraper::new(fleet.clone()));
    let sweep = tokio::spawn(publications::finish_left(fleet.clone(), shutdown.clone()));
    let served = Served {
        fleet,
        token: token.filter(|t| !t.is_empty()).map(Arc::from),
    };
    let api = axum::serve(listener, router(served)).with_graceful_shutdown({
        let shutdown = shutdown.clone();
        async move { shutdown.cancelled().await }
    });
    let result = match metrics {
        Some(metrics) => {
            // Either one failing stops both.
            let stop = shutdown.child_token();
            let metrics = metrics::serve(metrics, scraper, stop.clone());
            let api = async {
                let served = api.await;
                stop.cancel();
                served
            };
            tokio::try_join!(api, metrics).map(|_| ())
        }
        None => api.await,
    };
    sweep.abort();
    result
}

fn router(served: Served) -> Router {
    let guarded = api::routes().route_layer(middleware::from_fn_with_state(served.clone(), bearer));
    Router::new()
        .merge(guarded)
        .merge(api::open_routes())
        .merge(page::routes())
        .with_state(served)
}

/// Refuses a request without the bearer token, when one is set.
async fn bearer(State(served): State<Served>, request: Request, next: Next) -> Response {
    let Some(token) = &served.token else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|given| same(given.as_bytes(), token.as_bytes())) {
        next.run(request).await
    } else {
        let body = api::ErrorBody::new("a bearer token is required (Authorization: Bearer …)");
        (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
    }
}

/// Compares two secrets in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        assert!(super::same(b"s3cret", b"s3cret"));
        assert!(!super::same(b"s3cret", b"s3creT"));
        assert!(!super::same(b"s3cret", b"s3cre"));
    }
}
