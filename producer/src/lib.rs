//! fleetrun's producer side: partitioning inputs into mini-batches, finalizing outputs, and
//! the local driver behind `fleetrun run`.
//!
//! # Layout
//!
//! - [`partition`]: lists an input and publishes mini-batch messages as it goes.
//! - [`finalize`]: joins output parts into the one `append_row` file.
//! - [`local`]: runs a whole job on this machine on the embedded seams.
//! - [`progress`]: the terminal's view of a running job.

pub mod finalize;
pub mod local;
pub mod partition;
pub mod progress;
