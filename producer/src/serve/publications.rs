//! Publications their publisher left unfinished: every instance looks for them and finishes
//! them, so that a job answered 201 is published whole even when the instance that took it
//! dies mid-publication.
//!
//! The ledger's publication claim keeps one publisher per job: an instance finishes a job
//! only once the claim of the one that published it ran out (it died), and only a job it can
//! publish from its record alone ([`fleet_cmd::abandoned`]).

use fleetrun_common::report::one_line;
use fleetrun_worker::job::Fleet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::fleet as fleet_cmd;

/// How often an instance looks for publications left unfinished: at start, then every half
/// publication lease, so one is finished within 15 s of its publisher's death.
pub const SWEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Looks for the pool's publications left unfinished every [`SWEEP`], until `shutdown`, and
/// finishes each it claims in a task of its own.
pub(super) async fn finish_left(fleet: Fleet, shutdown: CancellationToken) {
    let mut sweep = tokio::time::interval(SWEEP);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = sweep.tick() => {}
        }
        let jobs = match fleet.registry.unfinished(&fleet.pool).await {
            Ok(jobs) => jobs,
            Err(e) => {
                warn!(pool = %fleet.pool, error = %one_line(&e), "Cannot list the pool's unfinished jobs.");
                continue;
            }
        };
        for job in jobs {
            match fleet_cmd::abandoned(&fleet, &job).await {
                Ok(Some(abandoned)) => {
                    // Its publisher died: worth an operator's notice.
                    warn!(job = %job, "Finishing a publication its publisher left unfinished.");
                    tokio::spawn(finish(fleet.clone(), abandoned));
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(job = %job, error = %one_line(&e), "Cannot tell whether the job's publication was left unfinished.");
                }
            }
        }
    }
}

async fn finish(fleet: Fleet, abandoned: fleet_cmd::Abandoned) {
    let job = abandoned.job().to_owned();
    match abandoned.finish(&fleet).await {
        Ok(()) => info!(job = %job, "Finished the publication."),
        Err(e) => warn!(job = %job, error = %one_line(&e), "Publishing stopped."),
    }
}
