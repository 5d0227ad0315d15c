//! SIGINT and SIGTERM, as every command takes them.

use fleetrun_producer::exit;
use fleetrun_producer::local::Interrupt;
use tokio::signal::unix::{SignalKind, signal};

/// SIGINT and SIGTERM alike stop what the command does; the exit code says which (130, 143).
pub fn on_signals() -> std::io::Result<Interrupt> {
    let interrupt = Interrupt::new();
    let on_signal = interrupt.clone();
    let mut terminate = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let number = tokio::select! {
            _ = int.recv() => exit::SIGINT,
            _ = terminate.recv() => exit::SIGTERM,
        };
        eprintln!("Interrupted.");
        on_signal.raise(number);
    });
    Ok(interrupt)
}
