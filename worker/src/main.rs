//! `fleetrun-worker`: the node agent a fleet container runs. Serves every job of its pool;
//! SIGTERM (or Ctrl-C) drains: no new mini-batches, the ones in hand finish or go back to
//! the queue; a second signal, or the drain timeout, stops at once.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use fleetrun_common::report::one_line;
use fleetrun_worker::agent;
use fleetrun_worker::endpoints::{self, Observed};
use fleetrun_worker::job::{self, Fleet, FleetArgs, WorkerConfig};
use fleetrun_worker::log_format::{self, LogFormat};
use fleetrun_worker::metrics::Metrics;
use fleetrun_worker::node;
use fleetrun_worker::process::find_runner_exe;
use fleetrun_worker::shutdown;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "fleetrun-worker",
    version,
    about = "Serve a fleetrun pool's mini-batches on this node."
)]
struct Cli {
    #[command(flatten)]
    fleet: FleetArgs,
    /// The most runner processes on this node, over all jobs (default: one per GPU, else one
    /// per core). Each job gets its `process_count_per_node` of them, at most this many.
    #[arg(long, env = "FLEETRUN_MAX_PROCESSES", value_parser = node::processes_parser())]
    max_processes: Option<usize>,
    /// The older name of `--max-processes` (`--max-processes` wins when both are given).
    #[arg(long, env = "FLEETRUN_PROCESSES", value_parser = node::processes_parser())]
    processes: Option<usize>,
    /// This node's id in logs (default: the host name, this process's pid and a few random
    /// characters).
    #[arg(long, env = "FLEETRUN_NODE_ID")]
    node_id: Option<String>,
    /// Unacknowledged mini-batches each runner slot may hold: one running, the next one
    /// already waiting in the runner's channel, and one being finished (part written,
    /// recorded) meanwhile.
    #[arg(long, env = "FLEETRUN_PREFETCH", default_value_t = agent::DEFAULT_PREFETCH)]
    prefetch: u16,
    /// Where code, staged inputs and logs are kept (default: a folder of this process under
    /// the temp dir, removed by the next worker to start once this one is gone).
    #[arg(long, env = "FLEETRUN_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Seconds to finish the mini-batches in hand after SIGTERM before stopping at once.
    #[arg(long, env = "FLEETRUN_DRAIN_TIMEOUT", default_value_t = 600)]
    drain_timeout: u64,
    /// Serve `/metrics` (Prometheus) and `/healthz` on this address, e.g. `0.0.0.0:9464`
    /// (port 0: any free port; the log says which). Off when unset.
    #[arg(long, env = "FLEETRUN_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // lapin logs the broker's errors in its own Debug form; fleetrun says what they mean.
    fleetrun_common::tls::install_crypto_provider();
    let format = match log_format::init("info,lapin=off", true) {
        Ok(format) => format,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(serve(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let error = one_line(e.as_ref());
            match format {
                // A collector reads every line as JSON: the last one too.
                LogFormat::Json => tracing::error!(%error, "Worker stopped on an error."),
                LogFormat::Text => eprintln!("error: {error}"),
            }
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: Cli) -> anyhow::Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let temp_dir = std::env::temp_dir();
    node::sweep_stale_scratch(&temp_dir);
    let args = cli.fleet.resolve()?;
    let fleet = Fleet::connect(&args).await?;
    if let Some(url) = args.redis_url.as_deref()
        && let Some(gap) =
            fleetrun_common::ledger::redis::durability_gap(url, &args.tls_files().load()?).await
    {
        tracing::warn!(%gap, "The ledger's Redis can lose recordings it acknowledged: mini-batches recorded just before it dies would be counted nowhere.");
    }
    let node_id = cli.node_id.unwrap_or_else(node::default_node_id);
    let gpus = fleetrun_worker::gpu::detect_gpus();
    // A cache folder of our own naming is this process's scratch: removed when it stops.
    let scratch = cli.cache_dir.is_none();
    let config = WorkerConfig {
        processes: cli
            .max_processes
            .or(cli.processes)
            .unwrap_or_else(|| node::default_slots(gpus)),
        gpus,
        prefetch: cli.prefetch,
        runner_exe: find_runner_exe()?,
        launcher: fleetrun_worker::process::ProcessLauncher::shared(),
        cache_dir: cli
            .cache_dir
            .unwrap_or_else(|| node::default_cache_dir(&temp_dir, &node_id)),
        node_id,
        warm_job: None,
        sole_node: false,
        metrics: Arc::new(match cli.metrics_addr {
            Some(_) => Metrics::new().with_gpus(),
            None => Metrics::new(),
        }),
    };
    tracing::info!(node = %config.node_id, pool = %fleet.pool, processes = config.processes, "Worker serving.");
    let drain = CancellationToken::new();
    let abort = CancellationToken::new();
    let stopped = CancellationToken::new();
    let endpoints = match cli.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for metrics"))?;
            let addr = listener.local_addr()?;
            tracing::info!(node = %config.node_id, %addr, "Metrics on http://{addr}.");
            let observed = Observed {
                metrics: config.metrics.clone(),
                ledger: fleet.ledger.clone(),
                queue: fleet.queue.clone(),
            };
            Some(tokio::spawn(endpoints::serve(
                listener,
                observed,
                stopped.clone(),
            )))
        }
        None => None,
    };
    let (signalled, signals) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            tokio::select! { _ = terminate.recv() => {}, _ = interrupt.recv() => {} }
            if signalled.send(()).await.is_err() {
                return;
            }
        }
    });
    let grace = Duration::from_secs(cli.drain_timeout);
    let signals = tokio::spawn(shutdown::stop_on_signals(
        signals,
        grace,
        drain.clone(),
        abort.clone(),
    ));
    let cache_dir = config.cache_dir.clone();
    job::serve(config, fleet, drain, abort).await;
    signals.abort();
    stopped.cancel();
    if let Some(endpoints) = endpoints
        && let Ok(Err(e)) = endpoints.await
    {
        tracing::warn!(error = %e, "The metrics endpoint failed.");
    }
    if scratch
        && let Err(e) = std::fs::remove_dir_all(&cache_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(folder = %cache_dir.display(), error = %e, "Cannot remove the scratch folder.");
    }
    tracing::info!("Worker stopped.");
    Ok(())
}
