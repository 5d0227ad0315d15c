//! The lines an attempt leaves in the job's results: its row of the report
//! (`processed_mini-batches.csv`) and its failed items' lines of `failed_items.csv`.

use fleetrun_common::ledger::Outcome;
use fleetrun_common::wire::MiniBatch;

use super::holder::Holding;
use crate::logs::csv_field;

/// An attempt's row of the job's report (`processed_mini-batches.csv`): its mini-batch,
/// attempt, result, items and counts, who ran it and when, how long it took (elapsed and
/// `run()` seconds, when known) and the first line of `note`.
pub(super) fn report_row(
    batch: &MiniBatch,
    holding: &Holding,
    result: &str,
    outcome: Outcome,
    times: Option<(f64, f64)>,
    note: &str,
) -> String {
    let times = times.map_or_else(
        || ",".to_owned(),
        |(elapsed, run)| format!("{elapsed:.3},{run:.3}"),
    );
    format!(
        "{},{},{result},{},{},{},{},{},{},{times},{}",
        batch.index,
        holding.attempt,
        report_items(batch, outcome),
        outcome.succeeded,
        outcome.failed,
        csv_field(&holding.node),
        csv_field(&holding.process),
        holding.start,
        csv_field(note.lines().next().unwrap_or_default()),
    )
}

/// The items of a mini-batch as its report row says: its files, or a tabular one's rows
/// (as many as the producer counted, or as `run()` was given).
pub(super) fn report_items(batch: &MiniBatch, outcome: Outcome) -> u64 {
    if batch.chunks.is_empty() {
        return batch.items.len() as u64;
    }
    let counted: u64 = batch.chunks.iter().filter_map(|c| c.rows).sum();
    counted.max(outcome.succeeded + outcome.failed)
}

/// An item's line of `failed_items.csv`: the item, its mini-batch, the attempts spent and the
/// first line of the cause.
pub(super) fn failed_item_line(item: &str, index: u64, attempts: u32, cause: &str) -> String {
    format!(
        "{},{index},{attempts},{}",
        csv_field(item),
        csv_field(cause.lines().next().unwrap_or_default())
    )
}

/// The lines of `failed_items.csv` for the items of `batch`: its files, or a tabular
/// mini-batch's file and byte range (its items are rows), each with the `cause`'s first line.
pub(super) fn failed_item_lines(batch: &MiniBatch, attempts: u32, cause: &str) -> Vec<String> {
    let described: Vec<String> = batch.chunks.iter().map(|c| c.describe()).collect();
    batch
        .items
        .iter()
        .chain(&described)
        .map(|item| failed_item_line(item, batch.index, attempts, cause))
        .collect()
}
