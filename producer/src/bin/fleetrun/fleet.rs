//! Reaching the fleet a command acts on: its settings resolved, connected, errors mapped to
//! exit codes.

use std::process::ExitCode;

use fleetrun_common::report::one_line;
use fleetrun_producer::exit;
use fleetrun_producer::local::Interrupt;
use fleetrun_worker::job::{Fleet, FleetArgs, NewPool, SettingsError};

use crate::signals::on_signals;

/// Runs a fleet command on a pool a worker has started: resolves the settings, connects,
/// maps errors to exit code 1 (2 for an unknown pool).
pub fn on_fleet<F, Fut>(args: FleetArgs, command: F) -> ExitCode
where
    F: FnOnce(Fleet, Interrupt) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    on_pool(args, NewPool::Refuse, command)
}

/// [`on_fleet`] that may declare a pool no worker has started, with `new`.
pub fn on_pool<F, Fut>(args: FleetArgs, new: NewPool, command: F) -> ExitCode
where
    F: FnOnce(Fleet, Interrupt) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = runtime.block_on(async {
        let args = args.resolve()?;
        let fleet = Fleet::connect_pool(&args, new).await?;
        command(fleet, on_signals()?).await
    });
    result.unwrap_or_else(|e: anyhow::Error| {
        eprintln!("error: {}", one_line(e.as_ref()));
        let unknown_pool = matches!(
            e.downcast_ref::<SettingsError>(),
            Some(SettingsError::UnknownPool { .. })
        );
        ExitCode::from(if unknown_pool {
            exit::REFUSED
        } else {
            exit::ERROR
        })
    })
}

/// Whether `--create-pool` was given.
pub fn new_pool(create: bool) -> NewPool {
    if create {
        NewPool::Create
    } else {
        NewPool::Refuse
    }
}
