//! How a worker stops on signals (SIGTERM, Ctrl-C): the first drains (no new mini-batches,
//! the ones in hand finish), a second one or the drain timeout stops at once (unfinished
//! mini-batches go back to the queue).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Cancels `drain` on the first signal received, and `abort` on a second one or `grace`
/// after the first. Returns once it has aborted, or when the signals end before the first.
pub async fn stop_on_signals(
    mut signals: mpsc::Receiver<()>,
    grace: Duration,
    drain: CancellationToken,
    abort: CancellationToken,
) {
    if signals.recv().await.is_none() {
        return;
    }
    info!(
        grace_s = grace.as_secs(),
        "Draining: finishing the mini-batches in hand."
    );
    drain.cancel();
    tokio::select! {
        Some(()) = signals.recv() => {}
        _ = tokio::time::sleep(grace) => {}
    }
    warn!("Stopping now; unfinished mini-batches go back to the queue.");
    abort.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(600);

    fn start() -> (
        mpsc::Sender<()>,
        CancellationToken,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (signals, received) = mpsc::channel(4);
        let (drain, abort) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(stop_on_signals(
            received,
            GRACE,
            drain.clone(),
            abort.clone(),
        ));
        (signals, drain, abort, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_drains_and_the_drain_timeout_stops_at_once() {
        let (signals, drain, abort, task) = start();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!drain.is_cancelled(), "nothing stops without a signal");
        signals.send(()).await.unwrap();
        let signalled = tokio::time::Instant::now();
        drain.cancelled().await;
        assert!(!abort.is_cancelled());
        abort.cancelled().await;
        assert_eq!(signalled.elapsed(), GRACE);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_signal_stops_at_once() {
        let (signals, drain, abort, task) = start();
        signals.send(()).await.unwrap();
        drain.cancelled().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!abort.is_cancelled());
        let second = tokio::time::Instant::now();
        signals.send(()).await.unwrap();
        abort.cancelled().await;
        assert_eq!(second.elapsed(), Duration::ZERO);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn signals_that_end_unsent_stop_nothing_and_a_closed_source_after_one_waits_the_grace() {
        let (signals, drain, abort, task) = start();
        drop(signals);
        task.await.unwrap();
        assert!(!drain.is_cancelled() && !abort.is_cancelled());

        let (signals, drain, abort, task) = start();
        signals.send(()).await.unwrap();
        drop(signals);
        let signalled = tokio::time::Instant::now();
        drain.cancelled().await;
        abort.cancelled().await;
        assert_eq!(signalled.elapsed(), GRACE);
        task.await.unwrap();
    }
}
