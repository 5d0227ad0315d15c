//! The routes of `fleetrun serve`, their types and their errors.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/jobs` | 201 `{"job_id", "attached": false}`, or 200 with `attached: true` for an id known with the same job; 400 a body that is not `{"job_id"?, "job": {…}}`, 409 an id known with another job, 422 a job that does not validate |
//! | `GET /v1/jobs` | the serving pool's jobs |
//! | `GET /v1/jobs/{id}` | the job's summary, 404 unknown |
//! | `GET /v1/jobs/{id}/in-flight` | the job's mini-batches in flight, 404 unknown |
//! | `POST /v1/jobs/{id}/cancel` | the job's summary after, 404 unknown |
//! | `GET /v1/queue` | the serving pool's queue: ready, unacknowledged, dead-lettered |
//! | `GET /healthz` | 200 when the ledger and the broker answer, 503 otherwise |
//! | `GET /openapi.json` | this API, generated from its types |

use std::path::Path;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fleetrun_common::ledger::LedgerError;
use fleetrun_common::report::one_line;
use fleetrun_worker::job::Publication;
use serde::{Deserialize, Serialize};
use utoipa::{OpenApi, ToSchema};

use super::Served;
use crate::fleet::{self as fleet_cmd, EmptyInput, FleetError};
use crate::partition::Produced;
use crate::summary::{InFlightBatch, JobSummary, QueueSummary, StorageFaults, TimeSplit};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fleetrun",
        description = "Submit, follow and cancel jobs on a fleet."
    ),
    paths(submit, list, status, in_flight, cancel, queue, health),
    components(schemas(
        SubmitRequest,
        Submitted,
        ErrorBody,
        JobSummary,
        InFlightBatch,
        QueueSummary,
        StorageFaults,
        TimeSplit
    ))
)]
pub struct ApiDoc;

/// The routes behind the bearer token, when one is set.
pub(super) fn routes() -> Router<Served> {
    Router::new()
        .route("/v1/jobs", post(submit).get(list))
        .route("/v1/jobs/{id}", get(status))
        .route("/v1/jobs/{id}/in-flight", get(in_flight))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/queue", get(queue))
}

/// The routes open to anyone: health for probes, the API's description.
pub(super) fn open_routes() -> Router<Served> {
    Router::new()
        .route("/healthz", get(health))
        .route("/openapi.json", get(|| async { Json(ApiDoc::openapi()) }))
}

/// `POST /v1/jobs`: a job to submit.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The job's id; submitting again with the same id and job attaches to it. Default:
    /// made from its name and the time.
    pub job_id: Option<String>,
    /// The job, with the fields of a job file (`name`, `entry_script`, `input`, `output`,
    /// …). Local paths must be absolute; the code may be in storage
    /// (`source_directory = "s3://…"`).
    #[schema(value_type = Object)]
    pub job: serde_json::Value,
}

/// The answer to a submission.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct Submitted {
    pub job_id: String,
    /// The id was known with this same job: nothing new was submitted.
    pub attached: bool,
}

/// Every error's body: the one line `fleetrun` would print.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

impl ErrorBody {
    pub fn new(error: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: error.into(),
        }
    }
}

/// An error as an HTTP answer.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody::new(self.1))).into_response()
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> ApiError {
        let status = match &e {
            FleetError::Conflict { .. } => StatusCode::CONFLICT,
            FleetError::Ledger(LedgerError::UnknownJob(_)) => StatusCode::NOT_FOUND,
            e if e.is_refusal() => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError(status, one_line(&e))
    }
}

/// What was found of job `id` as the answer, or 404.
fn found<T>(id: &str, what: Option<T>) -> Result<Json<T>, ApiError> {
    what.map(Json)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no job {id}")))
}

/// Submit a job; idempotent on `job_id`, as `fleetrun submit --job-id`.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    request_body = SubmitRequest,
    responses(
        (status = 201, description = "Submitted", body = Submitted),
        (status = 200, description = "Known with this same job: attached", body = Submitted),
        (status = 400, description = "Not a submission", body = ErrorBody),
        (status = 409, description = "The id names another job", body = ErrorBody),
        (status = 422, description = "The job does not validate", body = ErrorBody),
    )
)]
async fn submit(State(served): State<Served>, body: Bytes) -> Result<Response, ApiError> {
    let bad = |e: String| ApiError(StatusCode::BAD_REQUEST, e);
    let request: SubmitRequest = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "the body is not {{\"job_id\"?, \"job\": {{…}}}}: {e}"
        ))
    })?;
    let job_id = match request.job_id.as_deref() {
        Some(id) => Some(crate::job_id::parse(id).map_err(|e| bad(format!("job_id: {e}")))?),
        None => None,
    };
    let spec = fleetrun_config::load_json(&request.job.to_string(), "job", Path::new("/"))
        .map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
    let fleet = &served.fleet;
    fleet_cmd::check_input(&spec, &fleet.s3, EmptyInput::Refuse).await?;
    let registered = fleet_cmd::register(
        spec,
        fleet,
        job_id.as_deref(),
        fleet_cmd::OutputHold::Fleet,
        Publication::Input,
    )
    .await?;
    let submitted = Submitted {
        job_id: registered.job.clone(),
        attached: registered.attached,
    };
    // Published while the answer goes out; if this instance dies first, any instance finishes
    // it once the publication's lease runs out (`publications`), as a repeated POST would.
    let fleet = fleet.clone();
    tokio::spawn(async move {
        let produced = Arc::new(Produced::default());
        if let Err(e) = fleet_cmd::publish(&fleet, &registered, &produced).await {
            tracing::warn!(job = %registered.job, error = %one_line(&e), "Publishing stopped.");
        }
    });
    let status = if submitted.attached {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(submitted)).into_response())
}

/// The jobs of the pool this instance serves.
#[utoipa::path(get, path = "/v1/jobs", responses((status = 200, body = [JobSummary])))]
async fn list(State(served): State<Served>) -> Result<Json<Vec<JobSummary>>, ApiError> {
    Ok(Json(fleet_cmd::summaries(&served.fleet).await?))
}

/// One job: its state, counts, rate, ETA, output and cause.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, body = JobSummary),
        (status = 404, description = "No such job", body = ErrorBody),
    )
)]
async fn status(
    State(served): State<Served>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<JobSummary>, ApiError> {
    found(&id, fleet_cmd::summary(&served.fleet, &id).await?)
}

/// One job's mini-batches in flight, longest running first: who runs each, since when,
/// which attempt, its first item.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/in-flight",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, body = [InFlightBatch]),
        (status = 404, description = "No such job", body = ErrorBody),
    )
)]
async fn in_flight(
    State(served): State<Served>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Vec<InFlightBatch>>, ApiError> {
    found(&id, fleet_cmd::in_flight(&served.fleet, &id).await?)
}

/// The queue of the pool this instance serves: mini-batches ready, unacknowledged
/// (`null` without the broker's management API) and dead-lettered.
#[utoipa::path(
    get,
    path = "/v1/queue",
    responses(
        (status = 200, body = QueueSummary),
        (status = 503, description = "The broker does not answer", body = ErrorBody),
    )
)]
async fn queue(State(served): State<Served>) -> Result<Json<QueueSummary>, ApiError> {
    let fleet = &served.fleet;
    match fleet_cmd::pool_depth(fleet).await {
        Ok(depth) => Ok(Json(QueueSummary::of(&fleet.pool, depth))),
        Err(e) => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, one_line(&e))),
    }
}

/// Cancel a job: workers drop its remaining mini-batches.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, body = JobSummary),
        (status = 404, description = "No such job", body = ErrorBody),
    )
)]
async fn cancel(
    State(served): State<Served>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<JobSummary>, ApiError> {
    fleet_cmd::cancel(&served.fleet, &id, "canceled through the API").await?;
    found(&id, fleet_cmd::summary(&served.fleet, &id).await?)
}

/// 200 when the ledger and the broker answer, 503 (naming which does not) otherwise.
#[utoipa::path(
    get,
    path = "/healthz",
    responses((status = 200, body = ErrorBody), (status = 503, body = ErrorBody))
)]
async fn health(State(served): State<Served>) -> Response {
    let fleet = &served.fleet;
    let ledger = fleet.ledger.status("fleetrun-health-probe").await.err();
    let broker = fleet.queue.depth(&[]).await.err();
    let mut faults = Vec::new();
    if let Some(e) = ledger {
        faults.push(format!("ledger: {}", one_line(&e)));
    }
    if let Some(e) = broker {
        faults.push(format!("broker: {}", one_line(&e)));
    }
    if faults.is_empty() {
        (StatusCode::OK, Json(ErrorBody::new("ok"))).into_response()
    } else {
        let body = ErrorBody::new(faults.join("; "));
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    }
}
