//! `fleetrun serve`: the fleet's HTTP API.

use std::process::ExitCode;

use fleetrun_worker::job::FleetArgs;

use crate::fleet::{new_pool, on_pool};

#[derive(clap::Args)]
pub struct Args {
    /// Where to listen (port 0: any free port).
    #[arg(long, env = "FLEETRUN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Also serve the pool's jobs as Prometheus metrics at `/metrics` on this address
    /// (port 0: any free port), among them each job's expected seconds of work left
    /// (`fleetrun_job_work_seconds_left`), the autoscaling signal.
    #[arg(long, env = "FLEETRUN_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Serve a pool no worker has started yet (else refused, exit 2), so that jobs
    /// posted before its first worker starts wait for it.
    #[arg(long)]
    pub create_pool: bool,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let (listen, metrics_addr) = (args.listen, args.metrics_addr);
    on_pool(
        args.fleet,
        new_pool(args.create_pool),
        |fleet, interrupt| async move {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
            say!("Listening on http://{}", listener.local_addr()?);
            let metrics = match metrics_addr {
                Some(addr) => {
                    let metrics = tokio::net::TcpListener::bind(addr)
                        .await
                        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
                    say!("Metrics on http://{}/metrics", metrics.local_addr()?);
                    Some(metrics)
                }
                None => None,
            };
            let token = std::env::var("FLEETRUN_API_TOKEN").ok();
            let shutdown = interrupt.token().clone();
            fleetrun_producer::serve::run(fleet, listener, metrics, token, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        },
    )
}
