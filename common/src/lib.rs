//! fleetrun's seams and wire types.
//!
//! # Layout
//!
//! The flow (producer → queue → node agents → runners → parts → ledger → finalizer) meets
//! the outside world at three seams, each a small trait with a distributed and an embedded
//! implementation:
//!
//! - [`queue::Queue`]: mini-batch messages with at-least-once delivery, a delivery count and
//!   a dead-letter queue ([`queue::MemoryQueue`] in process).
//! - [`ledger::Ledger`]: the job's count — done mini-batches, failed items, the thresholds,
//!   the state — changed only by atomic, idempotent steps ([`ledger::MemoryLedger`]).
//! - [`storage::Storage`]: inputs, output parts and the final output
//!   ([`storage::LocalStorage`] on a folder).
//!
//! [`events::Events`] tells the services around the fleet of every change of a job's state
//! (RabbitMQ's `fleetrun.events` topic exchange, or [`events::MemoryEvents`] in process).
//!
//! [`testing`] holds the conformance suites every implementation of a seam must pass, so the
//! embedded ones can never promise what the distributed ones do not do. [`wire`] holds the
//! messages that travel on the queue, [`protocol`] the frames between a node agent and its
//! runner processes, and [`python`] which CPython a job's runners use.

#[cfg(test)]
mod allocation;
pub mod events;
pub mod ledger;
pub mod protocol;
pub mod python;
pub mod queue;
pub mod report;
pub mod storage;
pub mod testing;
pub mod tls;
pub mod wire;
