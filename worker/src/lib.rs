//! The node agent of fleetrun.
//!
//! # Layout
//!
//! - [`agent`]: takes mini-batches off the queue, one slot per runner process; writes parts,
//!   records outcomes in the ledger, settles deliveries. A slot's loop, one attempt, the
//!   runner's lifecycle, the look-ahead and input staging each have a file of their own.
//! - [`process`]: one runner process from the agent's side (spawn, init, run with a timeout,
//!   kill, restart), behind the `Launcher` and `Runner` traits the agent drives.
//! - [`logs`]: the job's log folder (CONTRACT.md §7).
//! - [`monitor`]: the resource monitor of a job on a node (`logs/perf/<node_id>/`).
//! - [`node`]: this node's id, its scratch folder, and the sweep of scratch left by processes
//!   that are gone.
//! - [`gpu`]: one GPU index per runner process (CONTRACT.md §3).
//! - [`parts`]: where output parts wait for the finalizer, and how it joins them.
//! - [`scratch`]: the system error of a node's own folder that cannot take its writes.
//! - [`job`]: serving a pool's jobs from RabbitMQ, Redis and S3: settings, the job
//!   registry's records, code shipping, watching and adopting jobs, finalizing them, the
//!   dead-letter recorder.
//! - [`metrics`]: the node's Prometheus metrics (mini-batches and items by result, `run()`
//!   seconds, runner starts and deaths, ledger and broker errors).
//! - [`endpoints`]: `--metrics-addr`'s HTTP endpoints, `/metrics` and `/healthz`.
//! - [`log_format`]: the worker's and `fleetrun`'s own log lines, text or JSON.
//! - [`shutdown`]: a worker's stop on signals: drain first, then stop at once.
//! - `testing` (tests, and the `testing` feature): a fake runner for the flow tests.
//!
//! The runner process itself (embedded Python) is the `fleetrun-runner` crate.

pub mod agent;
pub mod endpoints;
pub mod gpu;
pub mod ip;
pub mod job;
pub mod log_format;
pub mod logs;
pub mod metrics;
pub mod monitor;
pub mod node;
pub mod oom;
pub mod output;
pub mod parts;
pub mod process;
pub mod scratch;
pub mod shutdown;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod worker_config;
