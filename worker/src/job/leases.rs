//! How long a node's notes in the registry last: that it serves its pool (its beat, which
//! also holds its places in jobs), and that it follows a job. Each is renewed every third of
//! its life; a node killed outright is forgotten when they run out.

use std::time::Duration;

/// How long a node's word that it serves its pool lasts (renewed every third of it); a
/// place it holds in a job lasts as long.
pub(super) const BEAT_TTL: Duration = Duration::from_secs(15);

/// How long a node's note that it follows a job lasts (renewed every third of it): a node
/// killed outright holds the job's end back that long at most. Shorter than a place's lease,
/// since no work moves when it runs out.
pub(super) const FOLLOW_TTL: Duration = Duration::from_secs(6);
