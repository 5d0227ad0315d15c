//! The ledger on Redis: one Lua script per atomic step.
//!
//! # Keys
//!
//! A job's keys carry its id as a hash tag, so Redis Cluster keeps them in one slot and one
//! script may touch them all (`<prefix>` is the caller's, e.g. `fleetrun`; it must not hold
//! a `{`):
//!
//! - `<prefix>:job:{<job>}:state`, a HASH: `state` ([`JobState::as_str`]), `total` (absent
//!   until sealed), `done`, `items_succeeded`, `items_failed`, `batches_failed`, `reason`
//!   (a reason given to [`Ledger::transition`]), the limits (`error_threshold`,
//!   `allowed_failed_count` with -1 for none, `allowed_failed_percent`), `created_at` (server
//!   time, Unix seconds), `created` (mini-batches published, at its highest), `started` (1
//!   once a runner started a mini-batch), `finalizer` and `finalizer_until` (who finalizes the job, and
//!   until when, in server milliseconds), and the bookkeeping fields described below.
//! - `<prefix>:job:{<job>}:done`, a HASH from each recorded mini-batch index to the id of the
//!   call that recorded it first.
//! - `<prefix>:job:{<job>}:parts`, a HASH from each recorded mini-batch index to where its
//!   output part is, as the first recording gave it: a few dozen bytes per mini-batch, or
//!   the part itself when it is small, within the job's budget (`part_bytes` in `state`
//!   counts them). Deleted once the job is Completed.
//! - `<prefix>:job:{<job>}:failed`, a HASH from each mini-batch first recorded with failures
//!   to its counts (`succeeded failed batch_failed`), which [`Ledger::reopen`] takes back.
//! - `holders`, `spent` and `report`: who runs each mini-batch in flight, the attempts each
//!   spent on the script's faults, the job's report rows.
//!
//! [`Ledger::retire`] sets them all to expire together once the job has ended, so Redis
//! forgets a job whole: never its `done` entries before its state.
//!
//! # Why every step is a script
//!
//! Each step reads the count, decides and writes: record a mini-batch once, add its failures,
//! check the limits, notice that everything is done, flip the state. Run as one Lua script,
//! nothing else runs in between, so two workers can never both count a mini-batch or both
//! see "I moved the job". Record and seal end in the same `settle` snippet (the twin of
//! [`super::MemoryLedger`]'s `settle_state`), pasted into both scripts, so they cannot
//! judge differently. The state names in the Lua come from [`JobState::as_str`].
//!
//! # Reasons
//!
//! A job failed by a limit keeps the counts it failed at (`exceeded_items_failed`,
//! `exceeded_batches_failed`, `exceeded_total`), not text: reading the status writes the
//! reason with [`Limits::exceeded`] from them, so it is the embedded ledger's text to the
//! letter. The flip itself happens inside the script. A `reason` field, set by a later
//! [`Ledger::transition`], wins; failing on a limit clears it, as the embedded ledger
//! overwrites it.
//!
//! # Retries
//!
//! A [`ConnectionManager`] reconnects by itself, but the command that finds the connection
//! dropped fails, and a reply can be lost after the script ran (a timeout proves nothing).
//! So every call is retried a few times with backoff, under one call id: `create`, `seal`,
//! `record` and `transition` store the id of the call that did something (`created_by`,
//! `sealed_by`, the `done` entry, `moved_by`), and a retry that finds its own id answers as
//! the first attempt did. A retried `record` thus neither counts twice nor loses the
//! `first`/`transitioned` it earned (unless another call moved the state in between), and a
//! retried `create` does not report its own job as existing.
//!
//! # Durability
//!
//! A worker acknowledges a mini-batch's message once the ledger acknowledged its recording,
//! so a recording the server acknowledged and then lost is a mini-batch counted nowhere: its
//! message is gone and its job never completes. Redis keeps every write it acknowledged
//! through the death of its process only with `appendonly yes` and `appendfsync always`
//! (`deploy/redis/redis.conf`): under `everysec`, while a background sync is slow, Redis
//! answers writes it has not yet handed to the kernel (for up to two seconds), and a kill
//! loses them. [`durability_gap`] tells a worker when its Redis runs otherwise.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use redis::aio::ConnectionManagerConfig;
use redis::{RedisError, RedisResult, RetryMethod, Script};
use tracing::{debug, warn};

use crate::tls::Tls;

use super::endpoint::Connection;
use super::replicas::{Replicas, Replicated};

use super::{
    Forgot, InFlight, JobState, JobTimes, Ledger, LedgerError, Limits, Outcome, Recorded, Reopened,
    RunnerId, RunnerTimes, Started, Status,
};

/// How long a command may wait for its reply. The crate's default (500 ms) fails calls the
/// server still executes, and a busy server can take longer.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Mini-batches whose parts one `HMGET` asks for.
const PARTS_PER_CALL: u64 = 1000;

/// Retries of one call on a dropped connection or a lost reply: 50 ms doubling to 1 s.
const RETRY: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(50))
    .with_max_delay(Duration::from_secs(1))
    .with_max_times(5)
    .with_jitter();

/// Names the states as Rust does, and answers a retry whose call already moved the job.
fn prelude() -> String {
    format!(
        r#"
local RUNNING, FINALIZING, FAILED, CANCELED, EXPIRED = '{}', '{}', '{}', '{}', '{}'

-- Gives ARGV-style `owner` the lease `field` of the job at `key` for `ms` unless another holds
-- it unexpired: 1 if `owner` holds it after, else 0.
local function lease(key, field, owner, ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local f = redis.call('HMGET', key, field, field .. '_until')
  if f[1] and f[1] ~= owner and tonumber(f[2]) > now then return 0 end
  redis.call('HSET', key, field, owner, field .. '_until', now + tonumber(ms))
  return 1
end

-- Now by the server's clock, in seconds since the Unix epoch, as `updated_at` keeps it.
local function now()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- 1 if the call `call` was the last to move the job's state (its reply may have been lost).
local function moved_by(key, call)
  if redis.call('HGET', key, 'moved_by') == call then return 1 end
  return 0
end
"#,
        JobState::Running.as_str(),
        JobState::Finalizing.as_str(),
        JobState::Failed.as_str(),
        JobState::Canceled.as_str(),
        JobState::Expired.as_str(),
    )
}

/// `MemoryLedger`'s `settle_state` in Lua: a Running job whose counts exceed a limit fails
/// (keeping the counts it failed at, from which the reason is written); else one whose every
/// mini-batch is done moves to Finalizing. The comparisons are `Limits::exceeded`'s, in the
/// same doubles. Returns 1 if the state moved.
const SETTLE_LUA: &str = r#"
local function settle(key, call)
  local f = redis.call('HMGET', key, 'state', 'total', 'done', 'items_failed',
    'batches_failed', 'error_threshold', 'allowed_failed_count', 'allowed_failed_percent')
  if f[1] ~= RUNNING then return 0 end
  local total, done = tonumber(f[2]), tonumber(f[3])
  local items, batches = tonumber(f[4]), tonumber(f[5])
  local threshold, count, percent = tonumber(f[6]), tonumber(f[7]), tonumber(f[8])
  if (threshold >= 0 and items > threshold)
      or (count >= 0 and batches > count)
      or (total ~= nil and total > 0 and batches * 100 > percent * total) then
    redis.call('HSET', key, 'state', FAILED, 'moved_by', call, 'updated_at', now(),
      'exceeded_items_failed', f[4], 'exceeded_batches_failed', f[5],
      'exceeded_total', f[2] or '')
    redis.call('HDEL', key, 'reason')
    return 1
  end
  if total ~= nil and done == total then
    redis.call('HSET', key, 'state', FINALIZING, 'moved_by', call, 'updated_at', now())
    return 1
  end
  return 0
end
"#;

/// KEYS: state, done, parts, holders, report, spent, failed. ARGV: call id, error_threshold,
/// allowed_failed_count (-1 = none),
/// allowed_failed_percent. Returns 1 if the job was entered (by this call), 0 if it exists.
const CREATE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'created_by') == ARGV[1] then return 1 end
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'state', RUNNING, 'done', 0, 'items_succeeded', 0,
  'items_failed', 0, 'batches_failed', 0, 'error_threshold', ARGV[2],
  'allowed_failed_count', ARGV[3], 'allowed_failed_percent', ARGV[4],
  'created_at', now[1], 'created_by', ARGV[1], 'updated_at', now[1])
return 1
"#;

/// KEYS: state. ARGV: call id, total. Returns nil for an unknown job, else
/// `{first, moved, HGETALL state}`.
const SEAL_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local first, moved = 1, 0
if redis.call('HSETNX', KEYS[1], 'total', ARGV[2]) == 1 then
  redis.call('HSET', KEYS[1], 'sealed_by', ARGV[1])
  moved = settle(KEYS[1], ARGV[1])
elseif redis.call('HGET', KEYS[1], 'sealed_by') == ARGV[1] then
  moved = moved_by(KEYS[1], ARGV[1])
else
  first = 0
end
return {first, moved, redis.call('HGETALL', KEYS[1])}
"#;

/// KEYS: state, done, parts, holders, report, failed. ARGV: call id, index, items succeeded,
/// items failed, batch failed (0/1), part ('' for none), report row ('' for none). Returns
/// nil for an unknown job, else `{first, moved, HGETALL state}`.
const RECORD_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HDEL', KEYS[4], ARGV[2])
local function keep_row()
  if ARGV[7] == '' then return end
  redis.call('RPUSH', KEYS[5], ARGV[7])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[5], ttl) end
end
local first, moved = 1, 0
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'done', 1)
  redis.call('HINCRBY', KEYS[1], 'items_succeeded', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'items_failed', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'batches_failed', ARGV[5])
  redis.call('HSET', KEYS[1], 'updated_at', now())
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[6]) end
  if ARGV[4] ~= '0' or ARGV[5] ~= '0' then
    redis.call('HSET', KEYS[6], ARGV[2], ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
  end
  -- A late recording of a retired job: what it just created goes with the job.
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
    redis.call('PEXPIRE', KEYS[6], ttl)
  end
  keep_row()
  moved = settle(KEYS[1], ARGV[1])
elseif redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then
  moved = moved_by(KEYS[1], ARGV[1])
else
  keep_row()
  first = 0
end
return {first, moved, redis.call('HGETALL', KEYS[1])}
"#;

/// KEYS: state, holders, report, spent. ARGV: index, row ('' for none), call id, charged
/// (0/1). Returns nil for an unknown job, else `{holder before}` (false for none); keeps
/// the row and counts a charged attempt once per call (a retried call finds its id noted)
/// and forgets the holder.
const ATTEMPT_ENDED_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
local before = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'ended_by') ~= ARGV[3] then
  redis.call('HSET', KEYS[1], 'ended_by', ARGV[3])
  local ttl = redis.call('PTTL', KEYS[1])
  if ARGV[2] ~= '' then
    redis.call('RPUSH', KEYS[3], ARGV[2])
    if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
  end
  if ARGV[4] == '1' then
    redis.call('HINCRBY', KEYS[4], ARGV[1], 1)
    if ttl > 0 then redis.call('PEXPIRE', KEYS[4], ttl) end
  end
end
return {before}
"#;

/// KEYS: state. ARGV: call id, to, has reason (0/1), reason, from-states…. Returns nil for
/// an unknown job, else `{moved, HGETALL state}`.
const TRANSITION_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local state = redis.call('HGET', KEYS[1], 'state')
for i = 5, #ARGV do
  if ARGV[i] == state then
    redis.call('HSET', KEYS[1], 'state', ARGV[2], 'moved_by', ARGV[1], 'updated_at', now())
    if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'reason', ARGV[4]) end
    return {1, redis.call('HGETALL', KEYS[1])}
  end
end
return {moved_by(KEYS[1], ARGV[1]), redis.call('HGETALL', KEYS[1])}
"#;

/// KEYS: state, done, parts, holders, report, spent, failed, times. ARGV: keep (ms). Returns
/// nil for an unknown job, else 1 if it has ended (its keys now expire), 0 if it still runs or
/// finalizes.
const RETIRE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local state = redis.call('HGET', KEYS[1], 'state')
if state == RUNNING or state == FINALIZING then return 0 end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ARGV[1]) end
return 1
"#;

/// KEYS: state, times. ARGV: field, seconds, field, seconds, ... Returns nil for an unknown
/// job, else 1: each field of the job's times hash is increased by its seconds, and the hash
/// expires with a retired job's state.
const ADD_TIMES_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
for i = 1, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"#;

/// KEYS: state, done, parts, holders, report, spent, failed, times. ARGV: call id. Returns
/// nil for an unknown job, else `{reopened, moved, HGETALL state, HKEYS done}` (0 and no indices when
/// the job is in a state that cannot be reopened; a retry of the call that reopened it
/// answers as that call did).
const REOPEN_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= FAILED and state ~= CANCELED and state ~= EXPIRED then
  if redis.call('HGET', KEYS[1], 'reopened_by') == ARGV[1] then
    return {1, moved_by(KEYS[1], ARGV[1]), redis.call('HGETALL', KEYS[1]),
      redis.call('HKEYS', KEYS[2])}
  end
  return {0, 0, redis.call('HGETALL', KEYS[1]), {}}
end
local failed = redis.call('HGETALL', KEYS[7])
for i = 1, #failed, 2 do
  local index = failed[i]
  if redis.call('HDEL', KEYS[2], index) == 1 then
    redis.call('HDEL', KEYS[3], index)
    local s, f, b = string.match(failed[i + 1], '^(%d+) (%d+) (%d+)$')
    redis.call('HINCRBY', KEYS[1], 'done', -1)
    redis.call('HINCRBY', KEYS[1], 'items_succeeded', 0 - tonumber(s))
    redis.call('HINCRBY', KEYS[1], 'items_failed', 0 - tonumber(f))
    redis.call('HINCRBY', KEYS[1], 'batches_failed', 0 - tonumber(b))
  end
end
redis.call('DEL', KEYS[4], KEYS[6], KEYS[7])
redis.call('HDEL', KEYS[1], 'reason', 'exceeded_items_failed', 'exceeded_batches_failed',
  'exceeded_total', 'finalizer', 'finalizer_until', 'publisher', 'publisher_until')
redis.call('HINCRBY', KEYS[1], 'run', 1)
redis.call('HSET', KEYS[1], 'state', RUNNING, 'reopened_by', ARGV[1], 'moved_by', ARGV[1],
  'updated_at', now())
for _, key in ipairs(KEYS) do redis.call('PERSIST', key) end
local moved = settle(KEYS[1], ARGV[1])
return {1, moved, redis.call('HGETALL', KEYS[1]), redis.call('HKEYS', KEYS[2])}
"#;

/// KEYS: state, done, parts, holders, spent, failed. ARGV: call id, index. Returns nil for an
/// unknown job, else `{found, HGETALL state}`: 1 the failure was forgotten (by this call), 2
/// recorded without failure, 3 not recorded, 4 the job is not Running.
const FORGET_FAILURE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HGET', KEYS[1], 'forgot_by') == ARGV[1] then
  return {1, redis.call('HGETALL', KEYS[1])}
end
if redis.call('HGET', KEYS[1], 'state') ~= RUNNING then
  return {4, redis.call('HGETALL', KEYS[1])}
end
local counts = redis.call('HGET', KEYS[6], ARGV[2])
if not counts then
  if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
    return {2, redis.call('HGETALL', KEYS[1])}
  end
  return {3, redis.call('HGETALL', KEYS[1])}
end
for i = 2, 6 do redis.call('HDEL', KEYS[i], ARGV[2]) end
local s, f, b = string.match(counts, '^(%d+) (%d+) (%d+)$')
redis.call('HINCRBY', KEYS[1], 'done', -1)
redis.call('HINCRBY', KEYS[1], 'items_succeeded', 0 - tonumber(s))
redis.call('HINCRBY', KEYS[1], 'items_failed', 0 - tonumber(f))
redis.call('HINCRBY', KEYS[1], 'batches_failed', 0 - tonumber(b))
redis.call('HSET', KEYS[1], 'forgot_by', ARGV[1], 'updated_at', now())
return {1, redis.call('HGETALL', KEYS[1])}
"#;

/// KEYS: state. ARGV: owner, lease (ms). Returns nil for an unknown job, else 1 if `owner`
/// now holds the finalization (claimed or renewed), 0 if the job is not Finalizing or
/// another owner's lease has not run out. Times are the server's.
const CLAIM_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HGET', KEYS[1], 'state') ~= FINALIZING then return 0 end
return lease(KEYS[1], 'finalizer', ARGV[1], ARGV[2])
"#;

/// KEYS: state. ARGV: owner, lease in ms. Returns nil for an unknown job, 1 if `owner`
/// publishes the Running, unsealed job, else 0.
const PUBLISH_CLAIM_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HGET', KEYS[1], 'state') ~= RUNNING then return 0 end
if redis.call('HEXISTS', KEYS[1], 'total') == 1 then return 0 end
return lease(KEYS[1], 'publisher', ARGV[1], ARGV[2])
"#;

/// KEYS: state. ARGV: mini-batches created. Keeps the highest. Returns nil for an unknown
/// job, else 1.
const CREATED_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local created = tonumber(redis.call('HGET', KEYS[1], 'created')) or 0
if tonumber(ARGV[1]) > created then redis.call('HSET', KEYS[1], 'created', ARGV[1]) end
return 1
"#;

/// KEYS: state. Returns nil for an unknown job, else 1.
const STARTED_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'started', 1)
return 1
"#;

/// KEYS: state. ARGV: bytes, budget. Adds the bytes to the job's `part_bytes`. Returns nil
/// for an unknown job, 1 within the budget, else 0.
const RESERVE_PART_BYTES_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local total = redis.call('HINCRBY', KEYS[1], 'part_bytes', ARGV[1])
if total <= tonumber(ARGV[2]) then return 1 end
return 0
"#;

/// KEYS: state, parts. Returns nil for an unknown job, else 1.
const FORGET_PARTS_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'parts_forgotten', 1)
redis.call('DEL', KEYS[2])
return 1
"#;

/// KEYS: state, parts. ARGV: mini-batch indices. Returns `{0, {}}` once the parts were
/// forgotten, else `{1, HMGET parts indices}`.
const PARTS_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 'parts_forgotten') then return {0, {}} end
return {1, redis.call('HMGET', KEYS[2], unpack(ARGV))}
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("{}{SETTLE_LUA}{body}", prelude()))
}

static CREATE: LazyLock<Script> = LazyLock::new(|| script(CREATE_LUA));
static SEAL: LazyLock<Script> = LazyLock::new(|| script(SEAL_LUA));
static RECORD: LazyLock<Script> = LazyLock::new(|| script(RECORD_LUA));
static ATTEMPT_ENDED: LazyLock<Script> = LazyLock::new(|| script(ATTEMPT_ENDED_LUA));
static TRANSITION: LazyLock<Script> = LazyLock::new(|| script(TRANSITION_LUA));
static CLAIM: LazyLock<Script> = LazyLock::new(|| script(CLAIM_LUA));
static PUBLISH_CLAIM: LazyLock<Script> = LazyLock::new(|| script(PUBLISH_CLAIM_LUA));
static RETIRE: LazyLock<Script> = LazyLock::new(|| script(RETIRE_LUA));
static ADD_TIMES: LazyLock<Script> = LazyLock::new(|| script(ADD_TIMES_LUA));
static REOPEN: LazyLock<Script> = LazyLock::new(|| script(REOPEN_LUA));
static FORGET_FAILURE: LazyLock<Script> = LazyLock::new(|| script(FORGET_FAILURE_LUA));
static CREATED: LazyLock<Script> = LazyLock::new(|| script(CREATED_LUA));
static STARTED: LazyLock<Script> = LazyLock::new(|| script(STARTED_LUA));
static RESERVE_PART_BYTES: LazyLock<Script> = LazyLock::new(|| script(RESERVE_PART_BYTES_LUA));
static FORGET_PARTS: LazyLock<Script> = LazyLock::new(|| script(FORGET_PARTS_LUA));
static PARTS: LazyLock<Script> = LazyLock::new(|| script(PARTS_LUA));

/// What seal and record return: first (0/1), moved (0/1), the state hash.
type StepReply = (i64, i64, HashMap<String, String>);

/// The [`Ledger`] shared by every worker of a fleet, kept in Redis.
pub struct RedisLedger {
    conn: Connection,
    prefix: String,
    /// Tells this ledger's calls from other processes' in the stored call ids.
    instance: String,
    calls: AtomicU64,
    /// The primary's replicas, which every write waits for (see [`super::replicas`]).
    replicas: Replicas,
}

/// The keys of one job.
struct JobKeys {
    state: String,
    done: String,
    parts: String,
    /// Who runs an attempt of each mini-batch not yet recorded.
    holders: String,
    /// The job's report rows (a list).
    report: String,
    /// The attempts each mini-batch spent on the script's faults.
    spent: String,
    /// The counts of each mini-batch recorded with failures.
    failed: String,
    /// Each runner's seconds by phase (a hash, see `times::field`).
    times: String,
}

impl JobKeys {
    /// Every key of the job, in the order the scripts that touch them all take them.
    fn all(&self) -> [&str; 7] {
        [
            &self.state,
            &self.done,
            &self.parts,
            &self.holders,
            &self.report,
            &self.spent,
            &self.failed,
        ]
    }
}

impl RedisLedger {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port/db`, or
    /// `rediss://` over TLS with `tls`' material) and keeps the ledger under `key_prefix`
    /// (the fleet's, e.g. `fleetrun`; tests take a random one each).
    pub async fn connect(
        url: &str,
        key_prefix: &str,
        tls: &Tls,
    ) -> Result<RedisLedger, LedgerError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(CONNECTION_TIMEOUT));
        let conn = Connection::open(url, tls, config)
            .await
            .map_err(|e| super::endpoint::connect_error(url, tls, e, |e| backend("connect", e)))?;
        Ok(RedisLedger {
            conn,
            replicas: Replicas::new(),
            prefix: key_prefix.to_owned(),
            instance: instance_id(),
            calls: AtomicU64::new(0),
        })
    }

    /// Runs a lease script (`CLAIM` or `PUBLISH_CLAIM`) for `owner`.
    async fn claim(
        &self,
        script: &Script,
        job: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LedgerError> {
        let keys = self.keys(job);
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        // Idempotent: a retry by the same owner renews its own claim.
        let held: Option<i64> = retrying("claim", job, || {
            let mut conn = self.conn.get();
            let key = &keys.state;
            async move {
                script
                    .key(key)
                    .arg(owner)
                    .arg(lease_ms)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        match held {
            Some(held) => Ok(held == 1),
            None => Err(LedgerError::UnknownJob(job.to_owned())),
        }
    }

    fn keys(&self, job: &str) -> JobKeys {
        let base = format!("{}:job:{{{job}}}", self.prefix);
        JobKeys {
            state: format!("{base}:state"),
            done: format!("{base}:done"),
            parts: format!("{base}:parts"),
            holders: format!("{base}:holders"),
            spent: format!("{base}:spent"),
            report: format!("{base}:report"),
            failed: format!("{base}:failed"),
            times: format!("{base}:times"),
        }
    }

    /// A new id for one call, the same across its retries.
    fn call_id(&self) -> String {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.instance)
    }
}

/// The error for a script's nil answer: the job is not in the ledger.
fn unknown(job: &str) -> LedgerError {
    LedgerError::UnknownJob(job.to_owned())
}

/// Runs `attempt` until it succeeds, retrying the errors [`LedgerError::is_transient`] says
/// a new try may cure (a dropped connection, a timeout, a server still loading). Only for
/// idempotent attempts.
pub(super) async fn retrying<T, F, Fut>(
    step: &'static str,
    job: &str,
    mut attempt: F,
) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    (|| {
        let attempt = attempt();
        async move { attempt.await.map_err(|e| backend(step, e)) }
    })
    .retry(RETRY)
    .when(LedgerError::is_transient)
    .notify(|e: &LedgerError, wait: Duration| {
        warn!(
            job = %job, step, error = %e, retry_in = ?wait,
            "Redis call failed; retrying."
        );
    })
    .await
}

#[async_trait]
impl Ledger for RedisLedger {
    async fn create(&self, job: &str, limits: Limits) -> Result<(), LedgerError> {
        let keys = self.keys(job);
        let call = self.call_id();
        let allowed_count = limits
            .allowed_failed_count
            .map_or_else(|| "-1".to_owned(), |n| n.to_string());
        let percent = limits.allowed_failed_percent.to_string();
        let entered: i64 = retrying("create", job, || {
            let mut conn = self.conn.get();
            let (keys, call, allowed_count, percent) = (&keys, &call, &allowed_count, &percent);
            async move {
                CREATE
                    .key(&keys.all()[..])
                    .arg(call)
                    .arg(limits.error_threshold)
                    .arg(allowed_count)
                    .arg(percent)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        if entered == 1 {
            Ok(())
        } else {
            Err(LedgerError::JobExists(job.to_owned()))
        }
    }

    async fn seal(&self, job: &str, total: u64) -> Result<Recorded, LedgerError> {
        let keys = self.keys(job);
        let call = self.call_id();
        let reply = retrying("seal", job, || {
            let mut conn = self.conn.get();
            let (keys, call) = (&keys, &call);
            async move {
                SEAL.key(&keys.state)
                    .arg(call)
                    .arg(total)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        recorded("seal", job, reply)
    }

    async fn record_attempt(
        &self,
        job: &str,
        index: u64,
        outcome: Outcome,
        part: Option<&str>,
        row: Option<&str>,
    ) -> Result<Recorded, LedgerError> {
        // HINCRBY takes signed 64-bit numbers; refuse before the script half-applies one.
        let count = |n: u64| i64::try_from(n).map_err(|_| LedgerError::OutOfRange(n));
        let (succeeded, failed) = (count(outcome.succeeded)?, count(outcome.failed)?);
        let keys = self.keys(job);
        let call = self.call_id();
        let reply = retrying("record", job, || {
            let mut conn = self.conn.get();
            let (keys, call) = (&keys, &call);
            async move {
                RECORD
                    .key(&keys.state)
                    .key(&keys.done)
                    .key(&keys.parts)
                    .key(&keys.holders)
                    .key(&keys.report)
                    .key(&keys.failed)
                    .arg(call)
                    .arg(index)
                    .arg(succeeded)
                    .arg(failed)
                    .arg(u8::from(outcome.batch_failed))
                    .arg(part.unwrap_or(""))
                    .arg(row.unwrap_or(""))
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        recorded("record", job, reply)
    }

    async fn attempt_started(
        &self,
        job: &str,
        index: u64,
        holder: &str,
    ) -> Result<Started, LedgerError> {
        let keys = self.keys(job);
        // Plain commands in one round trip, not a script: this runs once per attempt, and a
        // script costs Redis several times their CPU. Not atomic, and need not be: only a
        // lost attempt's holder, never a live one's, is ever read back, and the attempts a
        // mini-batch spent change only when one of its attempts ends. A retry finds this
        // call's own holder noted: it is not another's.
        let (known, spent, before, _): (bool, Option<u32>, Option<String>, i64) =
            retrying("attempt_started", job, || {
                let mut conn = self.conn.get();
                let keys = &keys;
                async move {
                    redis::pipe()
                        .exists(&keys.state)
                        .hget(&keys.spent, index)
                        .hget(&keys.holders, index)
                        .hset(&keys.holders, index, holder)
                        .query_async(&mut conn)
                        .await
                }
            })
            .await?;
        if !known {
            // The holder just noted would outlive a job the ledger has forgotten.
            let mut conn = self.conn.get();
            let _: Result<i64, _> = redis::cmd("HDEL")
                .arg(&keys.holders)
                .arg(index)
                .query_async(&mut conn)
                .await;
            return Err(LedgerError::UnknownJob(job.to_owned()));
        }
        Ok(Started {
            lost: before.filter(|before| before != holder),
            spent: spent.unwrap_or(0),
        })
    }

    async fn attempt_ended(
        &self,
        job: &str,
        index: u64,
        row: Option<&str>,
        charged: bool,
    ) -> Result<Option<String>, LedgerError> {
        let keys = self.keys(job);
        let call = self.call_id();
        let reply: Option<(Option<String>,)> = retrying("attempt_ended", job, || {
            let mut conn = self.conn.get();
            let (keys, call) = (&keys, &call);
            async move {
                ATTEMPT_ENDED
                    .key(&keys.state)
                    .key(&keys.holders)
                    .key(&keys.report)
                    .key(&keys.spent)
                    .arg(index)
                    .arg(row.unwrap_or(""))
                    .arg(call)
                    .arg(u8::from(charged))
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        let (before,) = reply.ok_or_else(|| unknown(job))?;
        Ok(before)
    }

    async fn in_flight(&self, job: &str) -> Result<Vec<InFlight>, LedgerError> {
        let keys = self.keys(job);
        type Reply = (bool, Vec<(u64, String)>, HashMap<u64, u32>);
        let (known, held, spent): Reply = retrying("in_flight", job, || {
            let mut conn = self.conn.get();
            let keys = &keys;
            async move {
                redis::pipe()
                    .exists(&keys.state)
                    .hgetall(&keys.holders)
                    .hgetall(&keys.spent)
                    .query_async(&mut conn)
                    .await
            }
        })
        .await?;
        if !known {
            return Err(LedgerError::UnknownJob(job.to_owned()));
        }
        let mut held: Vec<InFlight> = held
            .into_iter()
            .map(|(index, holder)| InFlight {
                index,
                holder,
                spent: spent.get(&index).copied().unwrap_or(0),
            })
            .collect();
        held.sort_unstable_by_key(|h| h.index);
        Ok(held)
    }

    async fn report(&self, job: &str, row: &str) -> Result<(), LedgerError> {
        // A row with no mini-batch to let go: the same step, holding nothing.
        self.attempt_ended(job, u64::MAX, Some(row), false)
            .await
            .map(drop)
    }

    async fn report_rows(
        &self,
        job: &str,
        start: u64,
        count: u64,
    ) -> Result<Vec<String>, LedgerError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let keys = self.keys(job);
        let to_index = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let last = to_index(start.saturating_add(count - 1));
        retrying("report_rows", job, || {
            let mut conn = self.conn.get();
            let key = &keys.report;
            async move {
                redis::cmd("LRANGE")
                    .arg(key)
                    .arg(to_index(start))
                    .arg(last)
                    .query_async(&mut conn)
                    .await
            }
        })
        .await
    }

    async fn recorded(&self, job: &str, indices: Range<u64>) -> Result<Vec<bool>, LedgerError> {
        let keys = self.keys(job);
        let mut recorded = Vec::with_capacity(indices.end.saturating_sub(indices.start) as usize);
        let mut start = indices.start;
        while start < indices.end {
            let end = indices.end.min(start.saturating_add(PARTS_PER_CALL));
            let chunk: Vec<u64> = (start..end).collect();
            let got: Vec<Option<String>> = retrying("recorded", job, || {
                let mut conn = self.conn.get();
                let (key, chunk) = (&keys.done, &chunk);
                async move {
                    redis::cmd("HMGET")
                        .arg(key)
                        .arg(chunk)
                        .query_async(&mut conn)
                        .await
                }
            })
            .await?;
            recorded.extend(got.iter().map(Option::is_some));
            start = end;
        }
        Ok(recorded)
    }

    async fn parts(
        &self,
        job: &str,
        indices: Range<u64>,
    ) -> Result<Vec<Option<String>>, LedgerError> {
        let keys = self.keys(job);
        let mut parts = Vec::with_capacity(indices.end.saturating_sub(indices.start) as usize);
        let mut start = indices.start;
        while start < indices.end {
            let end = indices.end.min(start.saturating_add(PARTS_PER_CALL));
            let chunk: Vec<u64> = (start..end).collect();
            let (kept, got): (i64, Vec<Option<String>>) = retrying("parts", job, || {
                let mut conn = self.conn.get();
                let (keys, chunk) = (&keys, &chunk);
                async move {
                    PARTS
                        .key(&keys.state)
                        .key(&keys.parts)
                        .arg(chunk)
                        .invoke_async(&mut conn)
                        .await
                }
            })
            .await?;
            if kept == 0 {
                return Err(LedgerError::PartsForgotten(job.to_owned()));
            }
            parts.extend(got);
            start = end;
        }
        Ok(parts)
    }

    async fn reserve_part_bytes(
        &self,
        job: &str,
        bytes: u64,
        budget: u64,
    ) -> Result<bool, LedgerError> {
        let keys = self.keys(job);
        // A retry may count the bytes twice: the budget errs on the small side.
        let within: Option<i64> = retrying("reserve part bytes", job, || {
            let mut conn = self.conn.get();
            let key = &keys.state;
            async move {
                RESERVE_PART_BYTES
                    .key(key)
                    .arg(bytes)
                    .arg(budget)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        within.map(|within| within == 1).ok_or_else(|| unknown(job))
    }

    async fn forget_parts(&self, job: &str) -> Result<(), LedgerError> {
        let keys = self.keys(job);
        let known: Option<i64> = retrying("forget parts", job, || {
            let mut conn = self.conn.get();
            let keys = &keys;
            async move {
                FORGET_PARTS
                    .key(&keys.state)
                    .key(&keys.parts)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        known.map(drop).ok_or_else(|| unknown(job))
    }

    async fn transition(
        &self,
        job: &str,
        from: &[JobState],
        to: JobState,
        reason: Option<&str>,
    ) -> Result<(bool, Status), LedgerError> {
        let keys = self.keys(job);
        let call = self.call_id();
        let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        let reply: Option<(i64, HashMap<String, String>)> = retrying("transition", job, || {
            let mut conn = self.conn.get();
            let (keys, call, from) = (&keys, &call, &from);
            async move {
                TRANSITION
                    .key(&keys.state)
                    .arg(call)
                    .arg(to.as_str())
                    .arg(u8::from(reason.is_some()))
                    .arg(reason.unwrap_or(""))
                    .arg(from)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        let (moved, fields) = reply.ok_or_else(|| unknown(job))?;
        let status = parse_status(job, &fields)?;
        if moved == 1 {
            debug!(job = %job, state = %status.state, "Job moved.");
        }
        Ok((moved == 1, status))
    }

    async fn claim_finalization(
        &self,
        job: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LedgerError> {
        self.claim(&CLAIM, job, owner, lease).await
    }

    async fn claim_publication(
        &self,
        job: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LedgerError> {
        self.claim(&PUBLISH_CLAIM, job, owner, lease).await
    }

    async fn reopen(&self, job: &str) -> Result<Reopened, LedgerError> {
        let keys = self.keys(job);
        let call = self.call_id();
        type Reply = (i64, i64, HashMap<String, String>, Vec<u64>);
        let reply: Option<Reply> = retrying("reopen", job, || {
            let mut conn = self.conn.get();
            let (keys, call) = (&keys, &call);
            async move {
                REOPEN
                    .key(&keys.all()[..])
                    .key(&keys.times)
                    .arg(call)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        let (reopened, moved, fields, done) = reply.ok_or_else(|| unknown(job))?;
        let status = parse_status(job, &fields)?;
        if reopened == 0 {
            return Err(LedgerError::NotResumable {
                job: job.to_owned(),
                state: status.state,
            });
        }
        debug!(job = %job, run = status.run, state = %status.state, "Job reopened.");
        Ok(Reopened {
            done,
            recorded: Recorded {
                first: true,
                transitioned: moved == 1,
                status,
            },
        })
    }

    async fn forget_failure(&self, job: &str, index: u64) -> Result<Forgot, LedgerError> {
        let keys = self.keys(job);
        let call = self.call_id();
        let reply: Option<(i64, HashMap<String, String>)> = retrying("forget_failure", job, || {
            let mut conn = self.conn.get();
            let (keys, call) = (&keys, &call);
            async move {
                FORGET_FAILURE
                    .key(&keys.state)
                    .key(&keys.done)
                    .key(&keys.parts)
                    .key(&keys.holders)
                    .key(&keys.spent)
                    .key(&keys.failed)
                    .arg(call)
                    .arg(index)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        let (found, fields) = reply.ok_or_else(|| unknown(job))?;
        let status = parse_status(job, &fields)?;
        Ok(match found {
            1 => Forgot::Forgotten(status),
            2 => Forgot::NotFailed,
            3 => Forgot::NotRecorded,
            _ => Forgot::NotRunning(status.state),
        })
    }

    async fn retire(&self, job: &str, keep: Duration) -> Result<bool, LedgerError> {
        let keys = self.keys(job);
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1);
        // Idempotent: a retry sets the same expiry again.
        let ended: Option<i64> = retrying("retire", job, || {
            let mut conn = self.conn.get();
            let keys = &keys;
            async move {
                RETIRE
                    .key(&keys.all()[..])
                    .key(&keys.times)
                    .arg(keep_ms)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        match ended {
            Some(ended) => Ok(ended == 1),
            None => Err(LedgerError::UnknownJob(job.to_owned())),
        }
    }

    async fn add_runner_times(
        &self,
        job: &str,
        runner: &RunnerId,
        times: &RunnerTimes,
    ) -> Result<(), LedgerError> {
        let keys = self.keys(job);
        let added: Vec<(String, f64)> = times
            .fields()
            .filter(|(_, seconds)| *seconds != 0.0)
            .map(|(phase, seconds)| (super::times::field(runner, phase), seconds))
            .collect();
        if added.is_empty() {
            return Ok(());
        }
        // Not retried: a retry after a lost answer would add the seconds twice.
        let mut conn = self.conn.get();
        let mut call = ADD_TIMES.key(&keys.state);
        call.key(&keys.times);
        for (field, seconds) in &added {
            call.arg(field).arg(seconds);
        }
        let known: Option<i64> = call
            .replicated(&mut conn, &self.replicas)
            .await
            .map_err(|e| backend("add_runner_times", e))?;
        known.map(drop).ok_or_else(|| unknown(job))
    }

    async fn runner_times(&self, job: &str) -> Result<JobTimes, LedgerError> {
        let keys = self.keys(job);
        let fields: Vec<(String, f64)> = retrying("runner_times", job, || {
            let mut conn = self.conn.get();
            let key = &keys.times;
            async move { redis::cmd("HGETALL").arg(key).query_async(&mut conn).await }
        })
        .await?;
        let mut by_runner = std::collections::BTreeMap::<RunnerId, RunnerTimes>::new();
        for (field, seconds) in fields {
            if let Some((id, phase)) = super::times::parse_field(&field) {
                by_runner.entry(id).or_default().add(phase, seconds);
            }
        }
        Ok(by_runner.into_iter().collect())
    }

    async fn created(&self, job: &str, mini_batches: u64) -> Result<(), LedgerError> {
        let keys = self.keys(job);
        // Idempotent: a retry sets the same maximum.
        let known: Option<i64> = retrying("created", job, || {
            let mut conn = self.conn.get();
            let key = &keys.state;
            async move {
                CREATED
                    .key(key)
                    .arg(mini_batches)
                    .replicated(&mut conn, &self.replicas)
                    .await
            }
        })
        .await?;
        known.map(drop).ok_or_else(|| unknown(job))
    }

    async fn started(&self, job: &str) -> Result<(), LedgerError> {
        let keys = self.keys(job);
        let known: Option<i64> = retrying("started", job, || {
            let mut conn = self.conn.get();
            let key = &keys.state;
            async move { STARTED.key(key).replicated(&mut conn, &self.replicas).await }
        })
        .await?;
        known.map(drop).ok_or_else(|| unknown(job))
    }

    async fn status(&self, job: &str) -> Result<Option<Status>, LedgerError> {
        let keys = self.keys(job);
        let fields: HashMap<String, String> = retrying("status", job, || {
            let mut conn = self.conn.get();
            let key = &keys.state;
            async move { redis::cmd("HGETALL").arg(key).query_async(&mut conn).await }
        })
        .await?;
        if fields.is_empty() {
            return Ok(None);
        }
        parse_status(job, &fields).map(Some)
    }
}

/// What the Redis at `url` can lose of the writes it acknowledged, when its settings say it
/// can (see the module's "Durability"): `None` when it keeps them all, or when it does not
/// tell its settings (`CONFIG` refused, as managed services may).
pub async fn durability_gap(url: &str, tls: &Tls) -> Option<String> {
    let settings = async {
        let config =
            ConnectionManagerConfig::new().set_connection_timeout(Some(CONNECTION_TIMEOUT));
        let mut conn = Connection::open(url, tls, config).await?.get();
        let (_, appendonly): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut conn)
            .await?;
        let (_, appendfsync): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async(&mut conn)
            .await?;
        Ok::<_, RedisError>((appendonly, appendfsync))
    };
    match tokio::time::timeout(CONNECTION_TIMEOUT, settings).await {
        Ok(Ok((appendonly, appendfsync))) => gap(&appendonly, &appendfsync),
        Ok(Err(e)) => {
            debug!(error = %e, "Redis does not tell its persistence settings.");
            None
        }
        Err(_) => None,
    }
}

/// What a Redis with these `appendonly` and `appendfsync` settings loses of the writes it
/// acknowledged when its process dies.
fn gap(appendonly: &str, appendfsync: &str) -> Option<String> {
    const SET: &str = "set appendonly yes and appendfsync always (deploy/redis/redis.conf)";
    if !appendonly.eq_ignore_ascii_case("yes") {
        return Some(format!(
            "appendonly is {appendonly}: a restart forgets the ledger; {SET}"
        ));
    }
    if !appendfsync.eq_ignore_ascii_case("always") {
        return Some(format!(
            "appendfsync is {appendfsync}: a kill can lose the last seconds of recordings it acknowledged, and their mini-batches with them; {SET}"
        ));
    }
    None
}

/// Reads the reply of a seal or record script.
fn recorded(
    step: &'static str,
    job: &str,
    reply: Option<StepReply>,
) -> Result<Recorded, LedgerError> {
    let (first, moved, fields) = reply.ok_or_else(|| unknown(job))?;
    let status = parse_status(job, &fields)?;
    let transitioned = moved == 1;
    if transitioned {
        debug!(job = %job, step, state = %status.state, "Job moved.");
    }
    Ok(Recorded {
        first: first == 1,
        transitioned,
        status,
    })
}

/// Errors a new try may cure: the connection dropped or timed out, or the server asks to
/// wait (loading, failing over). A refused password is not one, though the client would
/// reconnect for it: the same password is refused again.
pub(super) fn is_transient(e: &RedisError) -> bool {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return false;
    }
    // A primary demoted by a failover refuses writes until the endpoint leads to the new one.
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || matches!(
            e.retry_method(),
            RetryMethod::Reconnect
                | RetryMethod::ReconnectFromInitialConnections
                | RetryMethod::RetryImmediately
                | RetryMethod::WaitAndRetry
        )
}

fn backend(step: &'static str, source: RedisError) -> LedgerError {
    LedgerError::Redis { step, source }
}

/// A process-unique, practically fleet-unique id for this ledger's calls.
fn instance_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:016x}", h.finish())
}

/// The job's status from its state hash.
fn parse_status(job: &str, fields: &HashMap<String, String>) -> Result<Status, LedgerError> {
    let f = Fields { job, fields };
    let state = f
        .text("state")
        .and_then(JobState::parse)
        .ok_or_else(|| f.corrupt("state"))?;
    let reason = match fields.get("reason") {
        Some(reason) => Some(reason.clone()),
        None if fields.contains_key("exceeded_items_failed") => {
            let limits = f.limits()?;
            let items = f.count("exceeded_items_failed")?;
            let batches = f.count("exceeded_batches_failed")?;
            let total = f.num("exceeded_total")?;
            // The script failed the job on exactly these numbers, so `exceeded` names a limit.
            Some(
                limits
                    .exceeded(items, batches, total)
                    .unwrap_or_else(|| "a limit was exceeded".to_owned()),
            )
        }
        None => None,
    };
    Ok(Status {
        state,
        total: f.num("total")?,
        done: f.count("done")?,
        created: f.num("created")?.unwrap_or(0),
        started: f.text("started") == Some("1"),
        items_succeeded: f.count("items_succeeded")?,
        items_failed: f.count("items_failed")?,
        batches_failed: f.count("batches_failed")?,
        reason,
        updated_at: f.parse("updated_at")?,
        run: f.parse("run")?.unwrap_or(0),
    })
}

/// A job's state hash, read field by field.
struct Fields<'a> {
    job: &'a str,
    fields: &'a HashMap<String, String>,
}

impl Fields<'_> {
    fn corrupt(&self, name: &str) -> LedgerError {
        LedgerError::Corrupt {
            job: self.job.to_owned(),
            field: name.to_owned(),
        }
    }

    /// A field's text; an empty field counts as absent.
    fn text(&self, name: &str) -> Option<&str> {
        self.fields
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn parse<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, LedgerError> {
        self.text(name)
            .map(|v| v.parse().map_err(|_| self.corrupt(name)))
            .transpose()
    }

    fn num(&self, name: &str) -> Result<Option<u64>, LedgerError> {
        self.parse(name)
    }

    fn count(&self, name: &str) -> Result<u64, LedgerError> {
        self.required(name)
    }

    fn required<T: std::str::FromStr>(&self, name: &str) -> Result<T, LedgerError> {
        self.parse(name)?.ok_or_else(|| self.corrupt(name))
    }

    fn limits(&self) -> Result<Limits, LedgerError> {
        Ok(Limits {
            error_threshold: self.required("error_threshold")?,
            allowed_failed_count: match self.text("allowed_failed_count") {
                Some("-1") => None,
                _ => Some(self.required("allowed_failed_count")?),
            },
            allowed_failed_percent: self.required("allowed_failed_percent")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const FAILED_ON_PERCENT: &[(&str, &str)] = &[
        ("state", "Failed"),
        ("total", "4"),
        ("done", "3"),
        ("items_succeeded", "20"),
        ("items_failed", "2"),
        ("batches_failed", "2"),
        ("error_threshold", "-1"),
        ("allowed_failed_count", "-1"),
        ("allowed_failed_percent", "20.5"),
        ("exceeded_items_failed", "1"),
        ("exceeded_batches_failed", "1"),
        ("exceeded_total", "4"),
    ];

    #[test]
    fn a_limit_reason_is_written_by_limits_exceeded_from_the_counts_it_failed_at() {
        let status = parse_status("j", &fields(FAILED_ON_PERCENT)).unwrap();
        let limits = Limits {
            allowed_failed_percent: 20.5,
            ..Limits::NONE
        };
        assert_eq!(status.reason, limits.exceeded(1, 1, Some(4)));
        assert_eq!(status.state, JobState::Failed);
        assert_eq!(
            (status.total, status.done, status.batches_failed),
            (Some(4), 3, 2)
        );
    }

    #[test]
    fn a_given_reason_wins_and_no_total_means_unsealed() {
        let mut f = fields(FAILED_ON_PERCENT);
        f.insert("reason".into(), "by user".into());
        f.remove("total");
        let status = parse_status("j", &f).unwrap();
        assert_eq!(status.reason.as_deref(), Some("by user"));
        assert_eq!(status.total, None);
    }

    #[test]
    fn a_count_limit_and_an_unsealed_total_round_trip() {
        let mut f = fields(FAILED_ON_PERCENT);
        f.insert("allowed_failed_count".into(), "0".into());
        f.insert("exceeded_total".into(), String::new());
        let status = parse_status("j", &f).unwrap();
        assert!(
            status
                .reason
                .unwrap()
                .starts_with("allowed_failed_count exceeded: 1 failed"),
        );
    }

    /// Runs `retrying` over answers given in turn, counting the tries.
    async fn tries(answers: Vec<RedisResult<u8>>) -> (Result<u8, LedgerError>, usize) {
        let answers = std::sync::Mutex::new(answers.into_iter());
        let tried = AtomicU64::new(0);
        let result = retrying("record", "j", || {
            tried.fetch_add(1, Ordering::Relaxed);
            let answer = answers.lock().unwrap().next().expect("an answer per try");
            async move { answer }
        })
        .await;
        (result, tried.load(Ordering::Relaxed) as usize)
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_connection_is_retried_and_a_refused_password_is_not() {
        let reset = || {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection reset by peer",
            ))
        };
        let (result, tried) = tries(vec![Err(reset()), Err(reset()), Ok(7)]).await;
        assert_eq!((result.unwrap(), tried), (7, 3));

        let refused = || {
            RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "WRONGPASS invalid username-password pair",
            ))
        };
        let (result, tried) = tries(vec![Err(refused()), Ok(7)]).await;
        let e = result.unwrap_err();
        assert_eq!(tried, 1, "{e}");
        assert!(!e.is_transient(), "{e}");
        assert!(
            matches!(&e, LedgerError::Redis { step: "record", .. }),
            "{e:?}"
        );
        let cause = std::error::Error::source(&e).expect("the Redis error is its cause");
        assert!(cause.to_string().contains("WRONGPASS"), "{cause}");

        // Tries run out on a fault that lasts; the error then still says it was transient.
        let (result, tried) = tries((0..10).map(|_| Err(reset())).collect()).await;
        assert_eq!(tried, 6);
        assert!(result.unwrap_err().is_transient());
    }

    #[test]
    fn a_corrupt_hash_is_a_corrupt_field() {
        let mut f = fields(FAILED_ON_PERCENT);
        f.insert("state".into(), "Sleeping".into());
        assert!(matches!(
            parse_status("j", &f),
            Err(LedgerError::Corrupt { field, .. }) if field == "state"
        ));
    }

    #[test]
    fn only_an_append_only_file_synced_before_each_answer_keeps_every_recording() {
        assert_eq!(gap("yes", "always"), None);
        let everysec = gap("yes", "everysec").expect("everysec loses writes");
        assert!(
            everysec.starts_with("appendfsync is everysec"),
            "{everysec}"
        );
        assert!(gap("yes", "no").is_some());
        let off = gap("no", "always").expect("no file, no ledger after a restart");
        assert!(off.starts_with("appendonly is no"), "{off}");
    }

    #[test]
    fn scripts_hold_the_rust_state_names_and_the_shared_settle() {
        for body in [SEAL_LUA, RECORD_LUA] {
            assert!(body.contains("settle(KEYS[1], ARGV[1])"));
        }
        let prelude = prelude();
        for state in [JobState::Running, JobState::Finalizing, JobState::Failed] {
            assert!(prelude.contains(&format!("'{}'", state.as_str())));
        }
    }
}
