//! A worker node's composition root: the agent, the dead-letter recorder, the adopter and
//! the beat for its pool, and what it does with the agent's events; until it drains.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetrun_common::ledger::JobState;
use fleetrun_common::storage::{Tally, faults};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::adopt::{adopt_orphans, recheck_given_up};
use super::dead_letters::record_dead_letters;
use super::finalize::{check_init_failures, conclude};
use super::leases::BEAT_TTL;
use super::load::FleetJobs;
use super::settings::Fleet;
use super::watch::{let_go, note_end};
use crate::agent::{self, Agent, AgentEvent, Jobs};
use crate::worker_config::WorkerConfig;

/// How long a node's note that it met storage faults of a kind lasts after the last one
/// (noted, at most every beat, when it met more).
pub(super) const FAULT_TTL: Duration = Duration::from_secs(60);

/// Serves every job of the fleet's pool until `drain` (finish what is in hand) or `abort`.
pub async fn serve(
    config: WorkerConfig,
    fleet: Fleet,
    drain: CancellationToken,
    abort: CancellationToken,
) {
    let (events, mut event_rx) = mpsc::unbounded_channel();
    let jobs = Arc::new(FleetJobs {
        fleet: fleet.clone(),
        config: config.clone(),
        contexts: Mutex::new(HashMap::new()),
        held: Arc::new(Mutex::new(HashMap::new())),
        unserved: Mutex::new(HashMap::new()),
        loading: tokio::sync::Mutex::new(()),
        stop: abort.clone(),
        changed: tokio::sync::Notify::new(),
    });
    let follower = tokio::spawn(follow_changes(fleet.clone(), jobs.clone()));
    let agent = tokio::spawn(agent::run(
        Agent {
            config: config.clone(),
            queue: fleet.queue.clone(),
            ledger: fleet.ledger.clone(),
            jobs: jobs.clone(),
            events,
        },
        drain.clone(),
        abort.clone(),
    ));
    let recorder = tokio::spawn(record_dead_letters(
        fleet.clone(),
        jobs.clone(),
        drain.clone(),
    ));
    let adopter = tokio::spawn(adopt_orphans(fleet.clone(), jobs.clone(), drain.clone()));
    let beater = tokio::spawn(beat(fleet.clone(), config.node_id.clone(), drain.clone()));
    let mut finisher = {
        let (fleet, jobs, node) = (fleet.clone(), jobs.clone(), config.node_id.clone());
        tokio::spawn(async move {
            while let Some(event) = event_rx.recv().await {
                handle_event(&fleet, &jobs, &node, event).await;
            }
        })
    };
    let _ = agent.await;
    follower.abort();
    recorder.abort();
    adopter.abort();
    beater.abort();
    // The agent is gone, and with it the events' sender: the finisher ends once it has
    // finalized a job this node saw complete (nobody else would), unless told to stop now.
    tokio::select! {
        _ = &mut finisher => {}
        _ = abort.cancelled() => finisher.abort(),
    }
    for ctx in jobs.all() {
        if ctx.node.has_place() && !config.sole_node {
            // Another node takes this one's place in the job now, not when it runs out.
            let _ = fleet
                .registry
                .release_place(ctx.job.id(), &config.node_id)
                .await;
        }
        let status = fleet.ledger.status(ctx.job.id()).await.ok().flatten();
        if let Some(status) = &status {
            note_end(&ctx, status);
        }
        let ended = status.is_some_and(|s| s.state.is_terminal());
        let_go(&fleet, &ctx, &config.node_id, ended).await;
    }
    // The runners are gone: the jobs' working folders and cache holds go with them.
    jobs.held.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Says, while the node serves its pool, that it does (until it drains): a job that waits for
/// a busy pool waits, one whose pool nobody serves fails on `first_task_creation_timeout`.
/// Each beat also notes the kinds of storage fault the node met since the last one, which
/// `fleetrun status` shows.
pub(super) async fn beat(fleet: Fleet, node: String, drain: CancellationToken) {
    let mut noted = Tally::default();
    loop {
        if let Err(e) = fleet.registry.beat(&fleet.pool, &node, BEAT_TTL).await {
            warn!(error = %e, "Cannot say this node serves its pool.");
        }
        noted = note_faults(&fleet, &node, noted).await;
        tokio::select! {
            _ = drain.cancelled() => return,
            _ = tokio::time::sleep(BEAT_TTL / 3) => {}
        }
    }
}

/// Notes each kind of storage fault this process met since `noted` (the tally of the last
/// note); returns the tally noted now, or `noted` again when a note failed (the next beat
/// notes them then).
async fn note_faults(fleet: &Fleet, node: &str, noted: Tally) -> Tally {
    let now = faults().tally();
    for fault in now.met_since(noted) {
        if let Err(e) = fleet
            .registry
            .note_fault(&fleet.pool, node, fault, FAULT_TTL)
            .await
        {
            warn!(error = %e, %fault, "Cannot note that this node meets storage faults.");
            return noted;
        }
    }
    now
}

/// Tells the node's share when a job of its pool starts or ends, as the job events say: a
/// job submitted to idle workers starts at once, not at the share's next period. Without
/// events to follow, the period alone finds new jobs.
async fn follow_changes(fleet: Fleet, jobs: Arc<FleetJobs>) {
    let mut events = match fleet.events.follow().await {
        Ok(events) => events,
        Err(e) => {
            warn!(error = %e, "Cannot follow the job events; new jobs are found within a second instead.");
            return;
        }
    };
    loop {
        match events.recv().await {
            Ok(event) if event.pool != fleet.pool => {}
            Ok(event) => {
                jobs.changed.notify_one();
                // Its watcher looks at once: an ended job is let go without waiting.
                if let Some(ctx) = jobs.cached(&event.job_id) {
                    ctx.changed.notify_one();
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => jobs.changed.notify_one(),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Acts on what the agent reports: finalizes a job this node saw complete, announces a
/// failure it caused, or fails a job no node can start.
pub(super) async fn handle_event(fleet: &Fleet, jobs: &FleetJobs, node: &str, event: AgentEvent) {
    match event {
        AgentEvent::Transitioned { job, status } => {
            let Ok(Some(ctx)) = jobs.get(&job).await else {
                return;
            };
            conclude(&*fleet.ledger, &ctx, status).await;
        }
        AgentEvent::GaveUp { job, reason } => {
            let Ok(Some(ctx)) = jobs.get(&job).await else {
                return;
            };
            if ctx.job.spec().node_count <= 1 || jobs.config.sole_node {
                let reason = format!("no runner process could start: {reason}");
                ctx.job.fail_or_warn(&reason, Some(&ctx.logs)).await;
            } else {
                warn!(job = %job, node, "This node gave up on the job; other nodes keep serving it.");
                let processes = ctx.node.seats.cap() as u32;
                tokio::spawn(recheck_given_up(fleet.clone(), ctx, processes, reason));
            }
        }
        AgentEvent::StuckInInit { job, reason } => {
            let Ok(Some(ctx)) = jobs.get(&job).await else {
                return;
            };
            // A mini-batch started somewhere: some process is past init, so not every one
            // is stuck (CONTRACT §5 rule 3).
            match fleet.ledger.status(&job).await {
                Ok(Some(status)) if !status.started && status.state == JobState::Running => {
                    ctx.job.fail_or_warn(&reason, Some(&ctx.logs)).await;
                }
                Ok(_) => {}
                Err(e) => warn!(job = %job, error = %e, "Cannot read the job's state."),
            }
        }
        AgentEvent::InitFailed {
            job,
            processes,
            failure,
        } => {
            let failures = match fleet.registry.add_init_failure(&job).await {
                Ok(n) => n,
                Err(e) => {
                    warn!(job = %job, error = %e, "Cannot count an init failure.");
                    return;
                }
            };
            if let Some(ctx) = jobs.cached(&job) {
                let last = format!("the last: {failure}");
                check_init_failures(&ctx, processes, failures, &last).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetrun_common::storage::Fault;

    use super::*;

    /// A beat notes the kinds of fault met since the last note, and nothing when none.
    #[tokio::test]
    async fn a_beat_notes_the_kinds_of_fault_met_since_the_last() {
        let fleet = Fleet::embedded("p");
        let before = faults().tally();
        assert_eq!(note_faults(&fleet, "n", before).await, before);
        assert!(fleet.registry.faults("p").await.unwrap().is_empty());
        faults().note(Fault::Throttled, 0);
        let noted = note_faults(&fleet, "n", before).await;
        let notes = fleet.registry.faults("p").await.unwrap();
        let kinds: Vec<(&str, Fault)> = notes.iter().map(|n| (&*n.node, n.fault)).collect();
        assert_eq!(kinds, [("n", Fault::Throttled)]);
        let again = Fleet::embedded("p");
        assert_eq!(note_faults(&again, "n", noted).await, noted);
        assert!(again.registry.faults("p").await.unwrap().is_empty());
    }
}
