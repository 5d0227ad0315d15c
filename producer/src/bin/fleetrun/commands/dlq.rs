//! `fleetrun dlq`: the pool's dead-letter queue listed, shown, replayed or purged.

use std::io;
use std::process::ExitCode;

use clap::Subcommand;
use fleetrun_producer::{dlq, exit};
use fleetrun_worker::job::FleetArgs;

use crate::fleet::on_fleet;
use crate::out::print_json;

#[derive(Subcommand)]
pub enum DlqCommand {
    /// One line per dead letter, oldest first: its id, why it was dead-lettered, its
    /// deliveries, its run and first items (or its size, when it does not decode).
    List {
        /// Only the dead letters of this job.
        #[arg(long)]
        job: Option<String>,
        /// Print a JSON list for programs.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// One dead letter in full: its mini-batch's items or chunks, partition, run and
    /// headers. Exits 2 when no dead letter has the id.
    Show {
        /// `<job>:<index>`, or `raw-<digest>` for one that does not decode (as `list` shows).
        id: String,
        /// Print JSON for programs (a list: dead letters of one mini-batch share its id).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Put dead letters back to work: each is published again with a fresh delivery
    /// budget (its failure taken back from its Running job's counts), then removed. One of
    /// a job that ended is refused, saying what to run instead. Exits 2 when any is refused
    /// or none matched.
    Replay {
        #[command(flatten)]
        select: Selection,
        /// Print JSON for programs: what became of each.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Remove dead letters for good (their failures stay counted). Asks first on a
    /// terminal; elsewhere refused (exit 2) without --yes.
    Purge {
        #[command(flatten)]
        select: Selection,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
        /// Print JSON for programs: what was removed.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
}

/// Which dead letters `dlq replay` and `dlq purge` act on: ids, a job's, or all.
#[derive(clap::Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct Selection {
    /// Dead letters by id, as `dlq list` shows them.
    ids: Vec<String>,
    /// Every dead letter of this job.
    #[arg(long)]
    job: Option<String>,
    /// Every dead letter of the pool.
    #[arg(long)]
    all: bool,
}

impl Selection {
    fn select(self) -> dlq::Select {
        match (self.job, self.all) {
            (Some(job), _) => dlq::Select::Job(job),
            (None, true) => dlq::Select::All,
            (None, false) => dlq::Select::Ids(self.ids),
        }
    }
}

/// `fleetrun dlq …`.
pub fn main(command: DlqCommand) -> ExitCode {
    match command {
        DlqCommand::List { job, json, fleet } => on_fleet(fleet, |fleet, _| async move {
            let views: Vec<_> = dlq::list(&fleet, job.as_deref())
                .await?
                .into_iter()
                .map(dlq::DeadLetterView::brief)
                .collect();
            if json {
                print_json(&views);
            } else if views.is_empty() {
                say!("No dead letters.");
            }
            for view in views.iter().filter(|_| !json) {
                say!("{}", view.line());
            }
            Ok(ExitCode::SUCCESS)
        }),
        DlqCommand::Show { id, json, fleet } => on_fleet(fleet, |fleet, _| async move {
            let views: Vec<_> = dlq::list(&fleet, None)
                .await?
                .into_iter()
                .filter(|view| view.id == id)
                .collect();
            if views.is_empty() {
                eprintln!(
                    "error: no dead letter {id} in the pool's dead-letter queue (`fleetrun dlq list` shows them)"
                );
                return Ok(ExitCode::from(exit::REFUSED));
            }
            if json {
                print_json(&views);
                return Ok(ExitCode::SUCCESS);
            }
            for view in views {
                show_dead_letter(&view);
            }
            Ok(ExitCode::SUCCESS)
        }),
        DlqCommand::Replay {
            select,
            json,
            fleet,
        } => on_fleet(fleet, |fleet, _| async move {
            let settled = dlq::replay(&fleet, &select.select()).await?;
            Ok(settled_exit(&settled, json))
        }),
        DlqCommand::Purge {
            select,
            yes,
            json,
            fleet,
        } => {
            use std::io::IsTerminal;
            if !yes {
                if !io::stdin().is_terminal() {
                    eprintln!(
                        "error: dlq purge removes dead letters for good; pass --yes to do it without a terminal to ask on"
                    );
                    return ExitCode::from(exit::REFUSED);
                }
                eprint!("Remove the chosen dead letters for good? [y/N] ");
                let mut answer = String::new();
                if io::stdin().read_line(&mut answer).is_err()
                    || !answer.trim().eq_ignore_ascii_case("y")
                {
                    eprintln!("Nothing removed.");
                    return ExitCode::from(exit::REFUSED);
                }
            }
            on_fleet(fleet, |fleet, _| async move {
                let settled = dlq::purge(&fleet, &select.select()).await?;
                Ok(settled_exit(&settled, json))
            })
        }
    }
}

/// One dead letter in full, for people.
fn show_dead_letter(view: &dlq::DeadLetterView) {
    say!("Dead letter {}", view.id);
    let unknown = || "unknown".to_owned();
    say!(
        "  reason:      {}",
        view.reason.clone().unwrap_or_else(unknown)
    );
    say!(
        "  deliveries:  {}",
        view.deliveries.map_or_else(unknown, |n| n.to_string())
    );
    say!(
        "  dead since:  {}",
        view.dead_at
            .map_or_else(unknown, |t| format!("{t:.0} (Unix seconds)"))
    );
    say!("  size:        {} bytes", view.bytes);
    if let Some(why) = &view.undecodable {
        say!("  decodes:     no: {why}");
        return;
    }
    say!("  job:         {}", view.job.clone().unwrap_or_default());
    say!("  mini-batch:  {}", view.mini_batch.unwrap_or_default());
    say!("  run:         {}", view.run.unwrap_or_default());
    say!(
        "  wire:        version {}",
        view.wire_version.unwrap_or_default()
    );
    for (name, value) in &view.partition {
        say!("  partition:   {name} = {value}");
    }
    for item in &view.items {
        say!("  item:        {item}");
    }
    for chunk in &view.chunks {
        say!("  chunk:       {chunk}");
    }
}

/// What `dlq replay` and `dlq purge` say and exit with: 2 when any was refused or none
/// matched.
fn settled_exit(settled: &[dlq::Settled], json: bool) -> ExitCode {
    if json {
        print_json(&settled);
    } else if settled.is_empty() {
        eprintln!("No dead letter matched.");
    }
    for one in settled.iter().filter(|_| !json) {
        match &one.why {
            Some(why) => say!("{} {}: {why}", one.id, one.action),
            None => say!("{} {}", one.id, one.action),
        };
    }
    let refused = settled.iter().any(|one| one.action == "refused");
    if refused || settled.is_empty() {
        ExitCode::from(exit::REFUSED)
    } else {
        ExitCode::SUCCESS
    }
}
