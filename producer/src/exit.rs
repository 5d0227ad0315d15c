//! The exit codes of `fleetrun`, in one table (docs/guide.md, "Exit codes", shows the same).

/// The job completed (or the command did what it was asked).
pub const COMPLETED: u8 = 0;
/// Something outside the job went wrong: a service unreachable, the runner missing.
pub const ERROR: u8 = 1;
/// Refused before anything ran: a job file or flag that does not validate, an output folder
/// that holds what fleetrun did not write or that another job holds, a `--job-id` that names
/// another job.
pub const REFUSED: u8 = 2;
/// The job failed: a threshold was exceeded, a stop rule fired, or a system error.
pub const FAILED: u8 = 42;
/// `status` and `wait`: the job was canceled (`fleetrun cancel`, or an interrupted
/// `fleetrun run`).
pub const CANCELED: u8 = 43;
/// The job expired: its deadline passed before it finished (`run`, `submit --wait`,
/// `status`, `wait`, `resume`); its output holds the rows of every finished mini-batch.
pub const EXPIRED: u8 = 44;
/// `status` and `wait`: the job has not ended yet (Running or Finalizing; for `wait`, when
/// its `--timeout` ran out). `EX_TEMPFAIL`: ask again later.
pub const NOT_ENDED: u8 = 75;
/// SIGINT and SIGTERM.
pub const SIGINT: i32 = 2;
pub const SIGTERM: i32 = 15;

/// What `status` and `wait` exit with for a job in `state`.
pub const fn of_state(state: fleetrun_common::ledger::JobState) -> u8 {
    use fleetrun_common::ledger::JobState;
    match state {
        JobState::Completed => COMPLETED,
        JobState::Failed => FAILED,
        JobState::Canceled => CANCELED,
        JobState::Expired => EXPIRED,
        JobState::Running | JobState::Finalizing => NOT_ENDED,
    }
}

/// A job canceled by `signal` (130 for SIGINT, 143 for SIGTERM), as shells report it.
pub const fn signaled(signal: i32) -> u8 {
    (128 + signal) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_exit_as_shells_report_them() {
        assert_eq!(signaled(SIGINT), 130);
        assert_eq!(signaled(SIGTERM), 143);
    }
}
