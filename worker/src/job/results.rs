//! What a job tells its user (CONTRACT §7): `job_progress_overview.txt` while it runs, and
//! `job_result.txt`, the final overview and `job_error.txt` when it ends, written through
//! the job's handle (`Job::write_results`) by whichever process ends it, from what it
//! gathers ([`Ended`]).

use std::time::Duration;

use bytes::Bytes;
use fleetrun_common::ledger::{JobState, JobTimes, Status, times};
use fleetrun_common::storage::Storage;
use fleetrun_config::JobSpec;
use tracing::warn;

use crate::logs::{self, JobLogs};

/// What a job's result files say besides its status, as its handle gathers it.
pub struct Ended<'a> {
    pub job: &'a str,
    pub spec: &'a JobSpec,
    /// Since its submission.
    pub elapsed: Duration,
    /// Its report's rows (`processed_mini-batches.csv`), as the ledger kept them.
    pub report_rows: &'a [String],
    /// Where its runners' time went.
    pub times: &'a JobTimes,
}

/// `job_result.txt`: the result, the counts and, for a job that did not complete, why and
/// where to look.
pub fn result_text(ended: &Ended<'_>, status: &Status) -> String {
    let threshold = match ended.spec.error_threshold {
        -1 => "-1 (failures ignored)".to_owned(),
        n => n.to_string(),
    };
    let total = status.total.map_or_else(
        || format!("{} created (listing unfinished)", status.created),
        |t| t.to_string(),
    );
    let mut text = format!(
        "Job: {}\nResult: {}\nElapsed: {:.1}s\nMini-batches: {} processed of {total}\nItems: {} succeeded, {} failed (error_threshold {threshold})\nMini-batches failed: {}\n",
        ended.job,
        status.state,
        ended.elapsed.as_secs_f64(),
        status.done,
        status.items_succeeded,
        status.items_failed,
        status.batches_failed,
    );
    if let Some(reason) = &status.reason {
        text.push_str(&format!("Cause: {reason}\n"));
    }
    let system = status
        .reason
        .as_deref()
        .is_some_and(|r| r.starts_with("system error"));
    if status.state == JobState::Failed && system {
        text.push_str("Where to look: the cause above; it is the node's, not the script's.\n");
    } else if status.state == JobState::Expired {
        text.push_str(&format!(
            "Where to look: the output holds the rows of every finished mini-batch; {} lists the unfinished ones, and `fleetrun resume {}` runs only those.\n",
            logs::UNFINISHED_CSV,
            ended.job
        ));
    } else if status.state == JobState::Failed {
        text.push_str("Where to look: user/error.txt (script errors), user/error/ (full tracebacks), sys/node/*/_main.txt (processes), failed_items.csv.\n");
    }
    text
}

/// `job_progress_overview.txt`: mini-batches created and processed, and once the job has
/// ended its result.
pub fn overview_text(status: &Status) -> String {
    let created = status.total.unwrap_or(status.created);
    let mut text = format!(
        "Mini-batches created: {created}{}\nMini-batches processed: {}\nItems succeeded: {}\nItems failed: {}\nMini-batches failed: {}\nState: {}\nUpdated: {}\n",
        if status.total.is_some() {
            " (all)"
        } else {
            " (so far)"
        },
        status.done,
        status.items_succeeded,
        status.items_failed,
        status.batches_failed,
        status.state,
        logs::now(),
    );
    if status.state.is_terminal() {
        text.push_str(&format!("Result: {}\n", status.state));
        if let Some(reason) = &status.reason {
            text.push_str(&format!("Cause: {reason}\n"));
        }
    }
    text
}

/// `job_result.txt`'s line on GPU memory, from the report's `rows` (those of
/// `processed_mini-batches.csv`): how many `run()` calls ran out of GPU memory (counted
/// apart from the script's errors), how many mini-batches then ran in pieces, and the most
/// items a piece held in the last of them (the size that fit). `None` when no call ran out.
pub fn memory_summary(rows: &[String]) -> Option<String> {
    // The columns of `logs::REPORT_HEADER`: the result is the third.
    let result = |row: &String| row.split(',').nth(2).map(str::to_owned);
    let ran_out = rows
        .iter()
        .filter(|row| result(row).as_deref() == Some("out_of_gpu_memory"))
        .count();
    if ran_out == 0 {
        return None;
    }
    let split: Vec<&String> = rows
        .iter()
        .filter(|row| result(row).as_deref() == Some("split"))
        .collect();
    let size = split.last().and_then(|row| {
        let (_, after) = row.split_once("in pieces of at most ")?;
        after.split(' ').next()?.parse::<u64>().ok()
    });
    let last = size.map_or_else(String::new, |size| {
        format!(", the last in pieces of at most {size} items")
    });
    Some(format!(
        "Out of GPU memory: {ran_out} run() calls (not script errors); {} mini-batches ran in pieces{last}\n",
        split.len()
    ))
}

/// Where a job's runners' times are written, under its `logs/`: one row per runner.
pub const RUNNERS_CSV: &str = "perf/runners.csv";

/// `job_result.txt`'s line of where the runners' time went, as shares of all their time:
/// `GPU busy 78%: compute 78%, waiting for input 15%, init 4%, idle 3% (2 runners, 61.0 s)`
/// ("Runners busy" when no runner had a GPU; busy is the share in `run()`). `None` before
/// any runner's time was flushed.
pub fn time_line(times: &JobTimes) -> Option<String> {
    let all = times::sum(times);
    let total = all.total();
    if total <= 0.0 {
        return None;
    }
    let share = |s: f64| (100.0 * s / total).round();
    let who = if times.iter().any(|(id, _)| !id.gpu.is_empty()) {
        "GPU"
    } else {
        "Runners"
    };
    Some(format!(
        "{who} busy {:.0}%: compute {:.0}%, waiting for input {:.0}%, init {:.0}%, idle {:.0}% ({} runner{}, {total:.1} s)",
        share(all.run_s),
        share(all.run_s),
        share(all.input_wait_s),
        share(all.init_s),
        share(all.idle_s),
        times.len(),
        if times.len() == 1 { "" } else { "s" },
    ))
}

/// `job_result.txt`'s line of the runners' GPUs' use over their lives, where the nodes'
/// monitors read them (NVML): `GPU use: utilisation 63% on average, peak memory 10240 MiB
/// (2 runners' GPUs sampled)`. `None` when no runner's GPU was read.
pub fn gpu_line(times: &JobTimes) -> Option<String> {
    let sampled = times
        .iter()
        .filter(|(_, t)| t.gpu_utilization_pct().is_some() || t.gpu_memory_peak_mib().is_some())
        .count();
    if sampled == 0 {
        return None;
    }
    let all = times::sum(times);
    let mut parts = Vec::new();
    if let Some(percent) = all.gpu_utilization_pct() {
        parts.push(format!("utilisation {percent:.0}% on average"));
    }
    if let Some(mib) = all.gpu_memory_peak_mib() {
        parts.push(format!("peak memory {mib:.0} MiB"));
    }
    let whose = if sampled == 1 {
        "runner's GPU"
    } else {
        "runners' GPUs"
    };
    Some(format!(
        "GPU use: {} ({sampled} {whose} sampled)",
        parts.join(", ")
    ))
}

/// `logs/perf/runners.csv`: each runner's seconds by phase, and its GPU's mean utilisation
/// and peak memory where the node's monitor read them (empty otherwise).
pub fn runners_csv(times: &JobTimes) -> String {
    let mut csv = String::from(
        "node,runner,gpu,init_s,run_s,input_wait_s,idle_s,total_s,gpu_util_mean_pct,gpu_mem_peak_mib\n",
    );
    let known =
        |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
    for (id, t) in times {
        csv.push_str(&format!(
            "{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{},{}\n",
            crate::logs::csv_field(&id.node),
            crate::logs::csv_field(&id.runner),
            crate::logs::csv_field(&id.gpu),
            t.init_s,
            t.run_s,
            t.input_wait_s,
            t.idle_s,
            t.total(),
            known(t.gpu_utilization_pct(), 1),
            known(t.gpu_memory_peak_mib(), 0),
        ));
    }
    csv
}

/// `job_error.txt`: how many script errors this process saw, and the first of them.
fn error_summary(logs: Option<&JobLogs>) -> String {
    let errors = logs
        .map(|l| {
            l.flush();
            std::fs::read_to_string(l.file(logs::USER_ERROR)).unwrap_or_default()
        })
        .unwrap_or_default();
    let count = errors.lines().count();
    let mut summary = format!("Script errors: {count}\n");
    for line in errors.lines().take(20) {
        summary.push_str(line);
        summary.push('\n');
    }
    if count > 20 {
        summary.push_str(&format!("... {} more in user/error.txt\n", count - 20));
    }
    summary
}

/// Writes an ended job's results into `output`'s `logs/`: `job_result.txt`,
/// `perf/runners.csv`, the final overview and `job_error.txt` (from the script errors this
/// process's `logs` saw).
pub(super) async fn write(
    output: &dyn Storage,
    ended: &Ended<'_>,
    logs: Option<&JobLogs>,
    status: &Status,
) {
    let mut result = result_text(ended, status);
    result.push_str(&memory_summary(ended.report_rows).unwrap_or_default());
    for line in [time_line(ended.times), gpu_line(ended.times)]
        .into_iter()
        .flatten()
    {
        result.push_str(&line);
        result.push('\n');
    }
    let runners = (!ended.times.is_empty()).then(|| (RUNNERS_CSV, runners_csv(ended.times)));
    let files = runners.into_iter().chain([
        (logs::JOB_RESULT, result),
        (logs::PROGRESS_OVERVIEW, overview_text(status)),
        (logs::JOB_ERROR, error_summary(logs)),
    ]);
    for (name, text) in files {
        if let Err(e) = output.put(&format!("logs/{name}"), Bytes::from(text)).await {
            warn!(job = %ended.job, file = name, error = %e, "Cannot write a result file.");
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetrun_common::ledger::{RunnerId, RunnerTimes};

    use super::{gpu_line, memory_summary, runners_csv, time_line};

    #[test]
    fn the_time_line_gives_each_phase_its_share_of_all_runners_time() {
        let runner = |name: &str, gpu: &str, t: [f64; 4]| {
            let id = RunnerId {
                node: "n".into(),
                runner: name.into(),
                gpu: gpu.into(),
            };
            let [init_s, run_s, input_wait_s, idle_s] = t;
            let times = RunnerTimes {
                init_s,
                run_s,
                input_wait_s,
                idle_s,
                ..RunnerTimes::default()
            };
            (id, times)
        };
        assert_eq!(time_line(&Vec::new()), None);
        let times = vec![
            runner("process001", "", [2.0, 30.0, 6.0, 2.0]),
            runner("process002", "", [2.0, 48.0, 9.0, 1.0]),
        ];
        assert_eq!(
            time_line(&times).unwrap(),
            "Runners busy 78%: compute 78%, waiting for input 15%, init 4%, idle 3% (2 runners, 100.0 s)"
        );
        let gpu = vec![runner("process001", "0", [1.0, 1.0, 0.0, 0.0])];
        assert!(time_line(&gpu).unwrap().starts_with("GPU busy 50%"));
        let csv = runners_csv(&times);
        assert!(csv.starts_with(
            "node,runner,gpu,init_s,run_s,input_wait_s,idle_s,total_s,gpu_util_mean_pct,gpu_mem_peak_mib\n"
        ));
        assert!(
            csv.contains("n,process002,,2.000,48.000,9.000,1.000,60.000,,\n"),
            "{csv}"
        );
    }

    #[test]
    fn the_gpu_line_and_columns_say_what_the_monitor_read_and_nothing_else() {
        let id = |runner: &str| RunnerId {
            node: "n".into(),
            runner: runner.into(),
            gpu: "0".into(),
        };
        let read = RunnerTimes {
            run_s: 10.0,
            gpu_samples: 4.0,
            gpu_util_sum: 250.0,
            gpu_mem_peak_mib: 10240.0,
            ..RunnerTimes::default()
        };
        let unread = RunnerTimes {
            run_s: 10.0,
            ..RunnerTimes::default()
        };
        assert_eq!(gpu_line(&vec![(id("process001"), unread)]), None);
        let times = vec![(id("process001"), read), (id("process002"), unread)];
        assert_eq!(
            gpu_line(&times).unwrap(),
            "GPU use: utilisation 62% on average, peak memory 10240 MiB (1 runner's GPU sampled)"
        );
        let csv = runners_csv(&times);
        assert!(
            csv.contains(",process001,0,0.000,10.000,0.000,0.000,10.000,62.5,10240\n"),
            "{csv}"
        );
        assert!(
            csv.contains(",process002,0,0.000,10.000,0.000,0.000,10.000,,\n"),
            "{csv}"
        );
    }

    #[test]
    fn the_memory_line_counts_runs_out_apart_and_names_the_last_size() {
        let rows: Vec<String> = [
            "0,1,out_of_gpu_memory,10,0,0,0,process000,t,1.0,1.0,CUDA out of memory.",
            "0,1,out_of_gpu_memory,5,0,0,0,process000,t,1.0,1.0,CUDA out of memory.",
            "0,1,split,10,10,0,0,process000,t,,,\"in pieces of at most 3 items: 5 runs, 1 out of GPU memory; 0 of 10 items failed alone\"",
            "1,1,raised,10,0,0,0,process000,t,1.0,1.0,ValueError: no",
            "2,1,split,10,10,0,0,process000,t,,,in pieces of at most 4 items: 4 runs, 1 out of GPU memory; 0 of 10 items failed alone",
            "3,1,split,10,10,0,0,process000,t,,,in pieces of at most 3 items: 4 runs, 0 out of GPU memory; 0 of 10 items failed alone",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            memory_summary(&rows).as_deref(),
            Some(
                "Out of GPU memory: 2 run() calls (not script errors); 3 mini-batches ran in pieces, the last in pieces of at most 3 items\n"
            )
        );
        assert_eq!(memory_summary(&rows[3..4]), None);
    }
}
