//! Who holds an attempt ([`Holding`]): its node, runner process and start, as the ledger
//! keeps it and as its report row names it; and the attempts in flight as the ledger notes
//! them ([`held_attempts`]), which the operator page and a stalled job's cause read.

use fleetrun_common::ledger::InFlight;
use fleetrun_common::wire::MiniBatch;
use serde::{Deserialize, Serialize};

use crate::logs;

/// One attempt's holder: what its report row names, and what a stalled job's cause says of
/// it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Holding {
    pub(super) node: String,
    pub(super) process: String,
    /// The attempt's number: one more than the attempts the mini-batch spent before it, as
    /// the ledger tells when the attempt starts (not kept with the holder: the ledger counts).
    #[serde(skip)]
    pub(super) attempt: u32,
    /// When the attempt started, as report rows write it.
    pub(super) start: String,
    /// Tells this attempt from any other, on any node.
    pub(super) id: u64,
    /// The mini-batch's first item (a tabular one's first chunk), to name it by.
    #[serde(default)]
    pub(super) first: String,
    /// When the attempt started, in seconds since the Unix epoch.
    #[serde(default)]
    pub(super) since: f64,
}

impl Holding {
    /// The holder of an attempt of `batch`; `attempt` is its number until the ledger tells
    /// (`holding::started`).
    pub(super) fn new(node: &str, process: &str, attempt: u32, batch: &MiniBatch) -> Holding {
        let first = match batch.items.first() {
            Some(item) => item.clone(),
            None => batch
                .chunks
                .first()
                .map(|c| c.describe())
                .unwrap_or_default(),
        };
        Holding {
            node: node.to_owned(),
            process: process.to_owned(),
            attempt,
            start: logs::now(),
            id: rand::random(),
            first,
            since: fleetrun_common::ledger::unix_now(),
        }
    }

    pub(super) fn encode(&self) -> String {
        serde_json::to_string(self).expect("a holding always encodes")
    }
}

/// An attempt in flight, as the ledger notes it (see [`held_attempts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldAttempt {
    /// The mini-batch.
    pub index: u64,
    pub node: String,
    /// The runner process (`processNNN`).
    pub process: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// The mini-batch's first item (a tabular one's first chunk); empty when not noted.
    pub first: String,
    /// When the attempt started, in seconds since the Unix epoch; `None` when not noted.
    pub since: Option<f64>,
}

/// The attempts in flight (`held`: the ledger's
/// [`in_flight`](fleetrun_common::ledger::Ledger::in_flight)) that this build can read,
/// longest running first: what a stalled job's cause and the operator page name.
pub fn held_attempts(held: &[InFlight]) -> Vec<HeldAttempt> {
    let mut known: Vec<HeldAttempt> = held
        .iter()
        .filter_map(|h| {
            let holding = serde_json::from_str::<Holding>(&h.holder).ok()?;
            Some(HeldAttempt {
                index: h.index,
                node: holding.node,
                process: holding.process,
                attempt: h.spent + 1,
                first: holding.first,
                since: (holding.since > 0.0).then_some(holding.since),
            })
        })
        .collect();
    known.sort_by(|a, b| {
        let since = |h: &HeldAttempt| h.since.unwrap_or(0.0);
        since(a).total_cmp(&since(b)).then(a.index.cmp(&b.index))
    });
    known
}

/// The mini-batches in flight as a stalled job's cause names them (`held`: the ledger's
/// [`in_flight`](fleetrun_common::ledger::Ledger::in_flight), at `now`, seconds since the
/// epoch): each one's index, first item, node and process, how long it has run and its
/// attempt. The first few, longest running first.
pub(crate) fn describe_in_flight(held: &[InFlight], now: f64) -> String {
    const NAMED: usize = 5;
    if held.is_empty() {
        return "no mini-batch is in flight: no worker holds one".to_owned();
    }
    let mut named: Vec<String> = held_attempts(held)
        .iter()
        .take(NAMED)
        .map(|h| {
            let first = if h.first.is_empty() {
                String::new()
            } else {
                format!(" (first item {})", h.first)
            };
            let running = h
                .since
                .map(|since| format!(" for {:.0}s", (now - since).max(0.0)))
                .unwrap_or_default();
            format!(
                "mini-batch {}{first} on node {} {}{running}, attempt {}",
                h.index, h.node, h.process, h.attempt
            )
        })
        .collect();
    if held.len() > named.len() {
        named.push(format!("{} more", held.len() - named.len()));
    }
    format!("in flight: {}", named.join("; "))
}

#[cfg(test)]
mod tests {
    use fleetrun_common::ledger::InFlight;
    use fleetrun_common::wire::MiniBatch;

    use super::{Holding, describe_in_flight};

    fn held(index: u64, node: &str, since: f64) -> InFlight {
        let batch = MiniBatch::new("j", index, vec![format!("in/f{index}.txt")]);
        let mut holding = Holding::new(node, "process001", 9, &batch);
        holding.since = since;
        InFlight {
            index,
            holder: holding.encode(),
            spent: 1,
        }
    }

    #[test]
    fn a_stall_names_what_is_in_flight_longest_running_first() {
        let held = [held(7, "w1", 1000.0), held(3, "w2", 940.0)];
        assert_eq!(
            describe_in_flight(&held, 1060.0),
            "in flight: mini-batch 3 (first item in/f3.txt) on node w2 process001 for 120s, attempt 2; mini-batch 7 (first item in/f7.txt) on node w1 process001 for 60s, attempt 2"
        );
    }

    #[test]
    fn a_stall_names_the_first_five_and_counts_the_rest() {
        let held: Vec<_> = (0..8).map(|i| held(i, "w1", 100.0 + i as f64)).collect();
        let text = describe_in_flight(&held, 200.0);
        assert_eq!(text.matches("mini-batch ").count(), 5, "{text}");
        assert!(text.ends_with("; 3 more"), "{text}");
    }

    #[test]
    fn a_stall_with_nothing_in_flight_says_so() {
        assert_eq!(
            describe_in_flight(&[], 0.0),
            "no mini-batch is in flight: no worker holds one"
        );
    }
}
