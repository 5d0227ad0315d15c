//! fleetrun's producer side: partitioning inputs into mini-batches, finalizing outputs, and
//! the local driver behind `fleetrun run`.
//!
//! # Layout
//!
//! - [`partition`]: cuts a file input (a listing, a partitioned listing, a list of items)
//!   into mini-batches as it is listed; [`fleet::cut`] picks the cutter for a job's input.
//! - [`publisher`]: the one way every input kind's mini-batches reach the queue, in order,
//!   with a window of publishes awaiting confirmation.
//! - [`dlq`]: the operators' tools on the pool's dead-letter queue.
//! - [`fleet`]: submitting to, following and canceling jobs on a fleet.
//! - [`local`]: runs a whole job on this machine on the embedded seams.
//! - [`progress`]: the terminal's view of a running job.
//! - [`pace`]: a job's recent rate, measured over a window of its counts.
//! - [`serve`]: `fleetrun serve`, the fleet's HTTP API.
//! - [`summary`]: a job's state as `status`, `jobs` and `wait` show it, as text or JSON.
//! - [`tabular`]: cuts a tabular input (CSV, JSON Lines, Parquet) into byte-range chunks.
//! - [`verify`]: `fleetrun verify`, an output checked against its job's manifest.
//! - [`work_left`]: a job's expected seconds of work left, the autoscaling signal.
//! - [`exit`]: the exit codes of `fleetrun`, in one table.

pub mod dlq;
pub mod exit;
pub mod fleet;
pub mod job_id;
pub mod local;
pub mod mltable;
pub mod pace;
pub mod partition;
pub mod progress;
pub mod publisher;
pub mod resume;
pub mod serve;
pub mod summary;
pub mod tabular;
pub mod verify;
pub mod work_left;
