//! A worker's HTTP endpoints for its operators (`fleetrun-worker --metrics-addr`):
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /metrics` | the worker's [`Metrics`], as OpenMetrics text for Prometheus |
//! | `GET /healthz` | 200 when the ledger and the broker answer, 503 naming which does not |
//!
//! A worker that cannot reach its ledger or its broker settles nothing: `/healthz` lets an
//! orchestrator see it, where the worker's own process stays up and retries.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fleetrun_common::ledger::Ledger;
use fleetrun_common::queue::Queue;
use fleetrun_common::report::one_line;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::{CONTENT_TYPE, Metrics};

/// A job id no job has: `/healthz` asks the ledger for its status, which any ledger that
/// answers answers.
pub const HEALTH_PROBE_JOB: &str = "fleetrun-health-probe";

/// How long `/healthz` waits for each service: one that does not answer by then is down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the endpoints read.
#[derive(Clone)]
pub struct Observed {
    pub metrics: Arc<Metrics>,
    pub ledger: Arc<dyn Ledger>,
    pub queue: Arc<dyn Queue>,
}

/// Serves the endpoints on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    observed: Observed,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(observed))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

fn router(observed: Observed) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(health))
        .with_state(observed)
}

async fn metrics(State(observed): State<Observed>) -> Response {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        observed.metrics.encode(),
    )
        .into_response()
}

async fn health(State(observed): State<Observed>) -> Response {
    let ledger = async {
        match tokio::time::timeout(PROBE_TIMEOUT, observed.ledger.status(HEALTH_PROBE_JOB)).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("ledger: {}", one_line(&e))),
            Err(_) => Some(format!(
                "ledger: no answer within {}s",
                PROBE_TIMEOUT.as_secs()
            )),
        }
    };
    let broker = async {
        match tokio::time::timeout(PROBE_TIMEOUT, observed.queue.depth(&[])).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("broker: {}", one_line(&e))),
            Err(_) => Some(format!(
                "broker: no answer within {}s",
                PROBE_TIMEOUT.as_secs()
            )),
        }
    };
    let (ledger, broker) = tokio::join!(ledger, broker);
    let faults: Vec<String> = ledger.into_iter().chain(broker).collect();
    if faults.is_empty() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let body = faults.join("\n") + "\n";
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use fleetrun_common::ledger::MemoryLedger;
    use fleetrun_common::queue::{MemoryQueue, QueueOptions};

    use super::*;

    async fn get(observed: Observed, path: &str) -> (StatusCode, String, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, observed, shutdown.clone()));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        shutdown.cancel();
        server.await.unwrap().unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse::<u16>().unwrap();
        let content_type = head
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or_default()
            .to_owned();
        (
            StatusCode::from_u16(status).unwrap(),
            content_type,
            body.to_owned(),
        )
    }

    fn observed() -> Observed {
        Observed {
            metrics: Arc::new(Metrics::new()),
            ledger: Arc::new(MemoryLedger::new()),
            queue: Arc::new(MemoryQueue::new(QueueOptions::default())),
        }
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let observed = observed();
        observed.metrics.mini_batch("succeeded");
        let (status, content_type, body) = get(observed, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, CONTENT_TYPE);
        assert!(
            body.contains("fleetrun_mini_batches_total{result=\"succeeded\"} 1\n"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn health_is_ok_when_ledger_and_broker_answer() {
        let (status, _, body) = get(observed(), "/healthz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    }
}
