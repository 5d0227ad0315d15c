//! The job registry: what a worker needs to serve a job it has never seen (its record: the
//! spec, where its code is), the list of jobs, each pool's unfinished jobs, and each job's
//! runner init failures over all its nodes; each pool's nodes, and the storage faults they
//! met lately.
//!
//! Kept beside the ledger and in the same store, but apart from its counting steps: records
//! are written once at submission and only read afterwards.

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::AsyncCommands;

use super::LedgerError;
use super::redis::retrying;
use crate::storage::Fault;

/// That a node met storage faults of one kind lately: what `fleetrun status` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultNote {
    pub node: String,
    pub fault: Fault,
    /// How long ago the node last noted it.
    pub age: Duration,
}

#[async_trait]
pub trait JobRegistry: Send + Sync {
    /// Stores a job's record (opaque bytes; the producer's JSON) and lists the job among its
    /// pool's unfinished jobs. Fails if the job exists.
    async fn register(&self, job: &str, pool: &str, record: &[u8]) -> Result<(), LedgerError>;
    /// The job's record, or `None` for a job this registry does not know.
    async fn record(&self, job: &str) -> Result<Option<Vec<u8>>, LedgerError>;
    /// Every registered job, oldest first.
    async fn jobs(&self) -> Result<Vec<String>, LedgerError>;
    /// The pool's jobs not yet marked finished, oldest first: what its workers look after
    /// (a job whose finalizer died, say) even if they never served it.
    async fn unfinished(&self, pool: &str) -> Result<Vec<String>, LedgerError>;
    /// Takes an ended job off its pool's unfinished jobs, and forgets it `keep` from now
    /// (its record, its init failures, its place among all jobs). Only the first call for
    /// the job, from its own pool, does anything.
    async fn retire(&self, job: &str, pool: &str, keep: Duration) -> Result<(), LedgerError>;
    /// Puts a retired job (one that [`super::Ledger::reopen`] continues) back among its
    /// pool's unfinished jobs, in its first place, and keeps it until it is retired again;
    /// its runner init failures start again from 0. `pool` is the job's own (its record's).
    /// False for a job it does not know.
    async fn reopen(&self, job: &str, pool: &str) -> Result<bool, LedgerError>;
    /// Keeps the digest of the job's input as its publication cut it into mini-batches:
    /// the whole input's once every mini-batch is published, before that
    /// `<mini-batches>:<digest>` of the first ones (now and then, and when publication
    /// stops): a resume that cuts it otherwise is refused. The last note replaces the one
    /// before; it lives as long as the job's record.
    async fn note_listing(&self, job: &str, listing: &str) -> Result<(), LedgerError>;
    /// The digest [`JobRegistry::note_listing`] kept, if any.
    async fn listing(&self, job: &str) -> Result<Option<String>, LedgerError>;
    /// Counts one more runner init failure of the job, on any node; returns the count so far.
    async fn add_init_failure(&self, job: &str) -> Result<u64, LedgerError>;
    /// The job's runner init failures so far (0 for a job that has none, or is unknown).
    async fn init_failures(&self, job: &str) -> Result<u64, LedgerError>;
    /// Says that `node` serves `pool` for `ttl` from now (every worker calls it well within
    /// that time while it runs).
    async fn beat(&self, pool: &str, node: &str, ttl: Duration) -> Result<(), LedgerError>;
    /// The nodes whose last beat for `pool` has not run out.
    async fn nodes(&self, pool: &str) -> Result<u64, LedgerError>;
    /// Notes that `node`, of `pool`, met storage faults of kind `fault` just now: the note
    /// replaces the node's last one of that kind, and fades `ttl` from now.
    async fn note_fault(
        &self,
        pool: &str,
        node: &str,
        fault: Fault,
        ttl: Duration,
    ) -> Result<(), LedgerError>;
    /// The pool's fault notes that have not faded, newest first.
    async fn faults(&self, pool: &str) -> Result<Vec<FaultNote>, LedgerError>;
    /// Every pool a worker has beaten for or a job was registered to, sorted: a pool exists
    /// once a worker of it has started or a job was submitted to it on purpose, and stays
    /// when it has no worker left (an autoscaler may have scaled it to zero, or not yet up).
    async fn pools(&self) -> Result<Vec<String>, LedgerError>;
    /// Claims, or renews, one of the job's `places` places (its `node_count`) for `node`
    /// until `ttl` from now. True if `node` holds one: it held one already, or fewer than
    /// `places` nodes hold one whose time has not run out.
    async fn claim_place(
        &self,
        job: &str,
        node: &str,
        places: u32,
        ttl: Duration,
    ) -> Result<bool, LedgerError>;
    /// Gives `node`'s place in the job up, so that another node takes it at once.
    async fn release_place(&self, job: &str, node: &str) -> Result<(), LedgerError>;
    /// Notes that `node` follows the job, and so may write to its logs and output, until
    /// `ttl` from now: a node renews it well within that time until it lets the job go.
    async fn follow(&self, job: &str, node: &str, ttl: Duration) -> Result<(), LedgerError>;
    /// `node` has let the job go: it writes nothing more for it.
    async fn let_go(&self, job: &str, node: &str) -> Result<(), LedgerError>;
    /// The nodes that follow the job and have not let it go, and whose time has not run
    /// out (a node that died lets nothing go): those that may still write for it. Sorted.
    async fn followers(&self, job: &str) -> Result<Vec<String>, LedgerError>;
}

/// The in-process registry.
#[derive(Default)]
pub struct MemoryRegistry {
    /// Jobs in registration order.
    jobs: Mutex<Vec<String>>,
    /// Each pool's nodes, and until when each serves it.
    nodes: Mutex<BTreeMap<(String, String), Instant>>,
    /// Every pool a node has beaten for.
    pools: Mutex<std::collections::BTreeSet<String>>,
    /// Each pool's nodes' fault notes: when each was noted and when it fades (on tokio's
    /// clock).
    faults: Mutex<BTreeMap<(String, String, Fault), FaultTimes>>,
    records: Mutex<BTreeMap<String, Registered>>,
    /// Each job's places, and until when each node holds its own (on tokio's clock, so that
    /// paused-time tests see them run out).
    places: Mutex<BTreeMap<(String, String), tokio::time::Instant>>,
    /// Each job's followers, and until when each follows it (on tokio's clock).
    followers: Mutex<BTreeMap<(String, String), tokio::time::Instant>>,
}

struct FaultTimes {
    noted: tokio::time::Instant,
    fades: tokio::time::Instant,
}

struct Registered {
    record: Vec<u8>,
    pool: String,
    finished: bool,
    init_failures: u64,
    listing: Option<String>,
    forget_at: Option<Instant>,
}

impl MemoryRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The records, with those whose time has come forgotten (and their jobs).
    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Registered>> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let before = records.len();
        records.retain(|_, r| r.forget_at.is_none_or(|at| at > now));
        if records.len() < before {
            self.jobs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|job| records.contains_key(job));
        }
        records
    }

    fn jobs_in_order(&self) -> Vec<String> {
        let _forgotten = self.records();
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl JobRegistry for MemoryRegistry {
    async fn register(&self, job: &str, pool: &str, record: &[u8]) -> Result<(), LedgerError> {
        let mut records = self.records();
        if records.contains_key(job) {
            return Err(LedgerError::JobExists(job.to_owned()));
        }
        records.insert(
            job.to_owned(),
            Registered {
                record: record.to_vec(),
                pool: pool.to_owned(),
                finished: false,
                init_failures: 0,
                listing: None,
                forget_at: None,
            },
        );
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(job.to_owned());
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pool.to_owned());
        Ok(())
    }

    async fn record(&self, job: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        Ok(self.records().get(job).map(|r| r.record.clone()))
    }

    async fn jobs(&self) -> Result<Vec<String>, LedgerError> {
        Ok(self.jobs_in_order())
    }

    async fn unfinished(&self, pool: &str) -> Result<Vec<String>, LedgerError> {
        let jobs = self.jobs_in_order();
        let records = self.records();
        Ok(jobs
            .into_iter()
            .filter(|job| {
                records
                    .get(job)
                    .is_some_and(|r| r.pool == pool && !r.finished)
            })
            .collect())
    }

    async fn retire(&self, job: &str, pool: &str, keep: Duration) -> Result<(), LedgerError> {
        if let Some(r) = self.records().get_mut(job)
            && r.pool == pool
            && !r.finished
        {
            r.finished = true;
            r.forget_at = Some(Instant::now() + keep);
        }
        Ok(())
    }

    async fn reopen(&self, job: &str, pool: &str) -> Result<bool, LedgerError> {
        Ok(match self.records().get_mut(job) {
            Some(r) => {
                debug_assert_eq!(r.pool, pool, "a job is reopened in its own pool");
                r.finished = false;
                r.forget_at = None;
                r.init_failures = 0;
                true
            }
            None => false,
        })
    }

    async fn note_listing(&self, job: &str, listing: &str) -> Result<(), LedgerError> {
        if let Some(r) = self.records().get_mut(job) {
            r.listing = Some(listing.to_owned());
        }
        Ok(())
    }

    async fn listing(&self, job: &str) -> Result<Option<String>, LedgerError> {
        Ok(self.records().get(job).and_then(|r| r.listing.clone()))
    }

    async fn add_init_failure(&self, job: &str) -> Result<u64, LedgerError> {
        let mut records = self.records();
        let r = records
            .get_mut(job)
            .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
        r.init_failures += 1;
        Ok(r.init_failures)
    }

    async fn init_failures(&self, job: &str) -> Result<u64, LedgerError> {
        Ok(self.records().get(job).map_or(0, |r| r.init_failures))
    }

    async fn beat(&self, pool: &str, node: &str, ttl: Duration) -> Result<(), LedgerError> {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((pool.to_owned(), node.to_owned()), Instant::now() + ttl);
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pool.to_owned());
        Ok(())
    }

    async fn pools(&self) -> Result<Vec<String>, LedgerError> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        Ok(pools.iter().cloned().collect())
    }

    async fn nodes(&self, pool: &str) -> Result<u64, LedgerError> {
        let now = Instant::now();
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.retain(|_, until| *until > now);
        Ok(nodes.keys().filter(|(p, _)| p == pool).count() as u64)
    }

    async fn note_fault(
        &self,
        pool: &str,
        node: &str,
        fault: Fault,
        ttl: Duration,
    ) -> Result<(), LedgerError> {
        let noted = tokio::time::Instant::now();
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (pool.to_owned(), node.to_owned(), fault),
                FaultTimes {
                    noted,
                    fades: noted + ttl,
                },
            );
        Ok(())
    }

    async fn faults(&self, pool: &str) -> Result<Vec<FaultNote>, LedgerError> {
        let now = tokio::time::Instant::now();
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.retain(|_, times| times.fades > now);
        let mut notes: Vec<FaultNote> = faults
            .iter()
            .filter(|((p, _, _), _)| p == pool)
            .map(|((_, node, fault), times)| FaultNote {
                node: node.clone(),
                fault: *fault,
                age: now - times.noted,
            })
            .collect();
        notes.sort_by_key(|note| note.age);
        Ok(notes)
    }

    async fn claim_place(
        &self,
        job: &str,
        node: &str,
        places: u32,
        ttl: Duration,
    ) -> Result<bool, LedgerError> {
        let now = tokio::time::Instant::now();
        let mut held = self.places.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|_, until| *until > now);
        let key = (job.to_owned(), node.to_owned());
        let taken = held.keys().filter(|(j, _)| j == job).count();
        if held.contains_key(&key) || taken < places as usize {
            held.insert(key, now + ttl);
            return Ok(true);
        }
        Ok(false)
    }

    async fn release_place(&self, job: &str, node: &str) -> Result<(), LedgerError> {
        self.places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(job.to_owned(), node.to_owned()));
        Ok(())
    }

    async fn follow(&self, job: &str, node: &str, ttl: Duration) -> Result<(), LedgerError> {
        let until = tokio::time::Instant::now() + ttl;
        self.followers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((job.to_owned(), node.to_owned()), until);
        Ok(())
    }

    async fn let_go(&self, job: &str, node: &str) -> Result<(), LedgerError> {
        self.followers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(job.to_owned(), node.to_owned()));
        Ok(())
    }

    async fn followers(&self, job: &str) -> Result<Vec<String>, LedgerError> {
        let now = tokio::time::Instant::now();
        let mut followers = self.followers.lock().unwrap_or_else(|p| p.into_inner());
        followers.retain(|_, until| *until > now);
        Ok(followers
            .keys()
            .filter(|(j, _)| j == job)
            .map(|(_, node)| node.clone())
            .collect())
    }
}

/// The registry on Redis: `<prefix>:jobs` (a sorted set scored by registration time),
/// `<prefix>:pool:<pool>:unfinished` (likewise, per pool), `<prefix>:retired` (scored by when
/// each retired job is forgotten) and `<prefix>:job:{<job>}:record` / `:init_failures`
/// beside the ledger's keys of the job (they expire when it is forgotten).
#[derive(Clone)]
pub struct RedisRegistry {
    conn: super::endpoint::Connection,
    prefix: String,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn backend(source: redis::RedisError) -> LedgerError {
    LedgerError::Redis {
        step: "connect",
        source,
    }
}

impl RedisRegistry {
    /// The members of `key`, a sorted set scored by expiry, whose time has not run out (see
    /// `LIVE`); `job` names the job in a retry's warning, if any.
    async fn live(&self, key: &str, job: &str) -> Result<Vec<String>, LedgerError> {
        retrying("read who is live", job, || {
            let mut conn = self.conn.get();
            async move { LIVE.key(key).invoke_async(&mut conn).await }
        })
        .await
    }

    pub async fn connect(
        url: &str,
        key_prefix: &str,
        tls: &crate::tls::Tls,
    ) -> Result<RedisRegistry, LedgerError> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(5)))
            .set_response_timeout(Some(std::time::Duration::from_secs(10)));
        let conn = super::endpoint::Connection::open(url, tls, config)
            .await
            .map_err(|e| super::endpoint::connect_error(url, tls, e, backend))?;
        Ok(RedisRegistry {
            conn,
            prefix: key_prefix.to_owned(),
        })
    }

    fn key(&self, job: &str, what: &str) -> String {
        format!("{}:job:{{{job}}}:{what}", self.prefix)
    }

    fn jobs_key(&self) -> String {
        format!("{}:jobs", self.prefix)
    }

    fn unfinished_key(&self, pool: &str) -> String {
        format!("{}:pool:{pool}:unfinished", self.prefix)
    }

    fn nodes_key(&self, pool: &str) -> String {
        format!("{}:pool:{pool}:nodes", self.prefix)
    }

    /// The pool's fault notes: a hash of `<fault label>:<node>` to `<noted> <fades>` (ms, on
    /// Redis's clock), gone once its last note faded.
    fn faults_key(&self, pool: &str) -> String {
        format!("{}:pool:{pool}:faults", self.prefix)
    }

    /// Every pool a node has beaten for: a set, never expired.
    fn pools_key(&self) -> String {
        format!("{}:pools", self.prefix)
    }

    /// The job's places: a sorted set of nodes scored by when each one's place runs out.
    fn places_key(&self, job: &str) -> String {
        self.key(job, "places")
    }

    fn retired_key(&self) -> String {
        format!("{}:retired", self.prefix)
    }
}

/// KEYS: the pool's unfinished, record, init_failures, retired, listing. ARGV: job, keep
/// (ms), forget at (s). Only a job still among the pool's unfinished ones is retired.
static RETIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('PEXPIRE', KEYS[5], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
return 1
"#,
    )
});

/// KEYS: the pool's unfinished, record, init_failures, retired, jobs, listing. ARGV: job.
/// Returns 0 for a job whose record is gone, else 1.
static REOPEN: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('PERSIST', KEYS[2])
redis.call('PERSIST', KEYS[6])
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
local first = redis.call('ZSCORE', KEYS[5], ARGV[1])
if not first then
  local t = redis.call('TIME')
  first = t[1]
  redis.call('ZADD', KEYS[5], first, ARGV[1])
end
redis.call('ZADD', KEYS[1], first, ARGV[1])
return 1
"#,
    )
});

/// KEYS: listing, record. ARGV: the listing's digest. Kept as long as the record (nothing
/// for a job whose record is gone).
static NOTE_LISTING: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"#,
    )
});

/// KEYS: init_failures, record. Counts one more; the count of a retired job expires with
/// its record.
static ADD_INIT_FAILURE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return n
"#,
    )
});

/// A script whose body starts knowing `now`, Redis's time in milliseconds.
fn on_redis_clock(body: &str) -> redis::Script {
    redis::Script::new(&format!(
        "local t = redis.call('TIME')\n\
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n{body}"
    ))
}

/// KEYS: the pool's nodes. ARGV: node, ttl (ms). Keeps each node's expiry, in the server's
/// milliseconds, as its score; drops the nodes whose time has run out.
static BEAT: LazyLock<redis::Script> = LazyLock::new(|| {
    on_redis_clock(
        r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"#,
    )
});

/// KEYS: the pool's fault notes. ARGV: `<fault>:<node>`, ttl (ms). Notes it now, on Redis's
/// clock; the hash lasts as long as its latest note.
static NOTE_FAULT: LazyLock<redis::Script> = LazyLock::new(|| {
    on_redis_clock(
        r#"
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], now .. ' ' .. (now + ttl))
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"#,
    )
});

/// KEYS: the pool's fault notes. The notes that have not faded, as `<fault>:<node>` and
/// their age (ms) in turn; drops those that have.
static LIVE_FAULTS: LazyLock<redis::Script> = LazyLock::new(|| {
    on_redis_clock(
        r#"
local notes = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #notes, 2 do
  local noted, fades = string.match(notes[i + 1], '^(%d+) (%d+)$')
  if fades and tonumber(fades) > now then
    table.insert(live, notes[i])
    table.insert(live, now - tonumber(noted))
  else
    redis.call('HDEL', KEYS[1], notes[i])
  end
end
return live
"#,
    )
});

/// KEYS: a sorted set scored by expiry (ms): a pool's nodes, a job's followers. Its members
/// whose time has not run out, on Redis's clock.
static LIVE: LazyLock<redis::Script> = LazyLock::new(|| {
    on_redis_clock(
        r#"
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"#,
    )
});

/// KEYS: the job's places, record. ARGV: node, places, ttl (ms). Drops the places whose
/// time has run out; renews the node's, or gives it one if fewer than `places` are held.
/// The set lives as long as the job's record (and a day at most past the last claim). A
/// job's followers are kept the same way, with no bound on their number.
static CLAIM_PLACE: LazyLock<redis::Script> = LazyLock::new(|| {
    on_redis_clock(
        r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false
   and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PEXPIRE', KEYS[1], 86400000) end
return 1
"#,
    )
});

/// KEYS: jobs, retired. ARGV: now (s). Takes the jobs forgotten by now off the list of all
/// jobs.
static FORGET: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, job in ipairs(gone) do
  redis.call('ZREM', KEYS[1], job)
  redis.call('ZREM', KEYS[2], job)
end
return #gone
"#,
    )
});

/// Every call is retried on a dropped connection or a lost reply, like the ledger's
/// ([`super::redis`]): each is idempotent but `add_init_failure`, whose retry after a lost
/// reply may count one failure twice.
#[async_trait]
impl JobRegistry for RedisRegistry {
    async fn register(&self, job: &str, pool: &str, record: &[u8]) -> Result<(), LedgerError> {
        let key = self.key(job, "record");
        let created = retrying("register", job, || {
            let mut conn = self.conn.get();
            let key = &key;
            async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(record)
                    .arg("NX")
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        })
        .await?
        .is_some();
        // A retry whose first try stored the record finds it there: still this call's.
        if !created && self.record(job).await?.as_deref() != Some(record) {
            return Err(LedgerError::JobExists(job.to_owned()));
        }
        let now = unix_now();
        retrying("register", job, || {
            let mut conn = self.conn.get();
            let (jobs, unfinished, pools) =
                (self.jobs_key(), self.unfinished_key(pool), self.pools_key());
            async move {
                redis::pipe()
                    .zadd(jobs, job, now)
                    .ignore()
                    .zadd(unfinished, job, now)
                    .ignore()
                    .sadd(pools, pool)
                    .ignore()
                    .query_async::<()>(&mut conn)
                    .await
            }
        })
        .await
    }

    async fn record(&self, job: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        let key = self.key(job, "record");
        retrying("read the record", job, || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.get(key).await }
        })
        .await
    }

    async fn jobs(&self) -> Result<Vec<String>, LedgerError> {
        let (jobs, retired) = (self.jobs_key(), self.retired_key());
        retrying("list the jobs", "", || {
            let mut conn = self.conn.get();
            let (jobs, retired) = (&jobs, &retired);
            async move {
                let _: i64 = FORGET
                    .key(jobs)
                    .key(retired)
                    .arg(unix_now())
                    .invoke_async(&mut conn)
                    .await?;
                conn.zrange(jobs, 0, -1).await
            }
        })
        .await
    }

    async fn unfinished(&self, pool: &str) -> Result<Vec<String>, LedgerError> {
        let key = self.unfinished_key(pool);
        retrying("list the unfinished jobs", "", || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.zrange(key, 0, -1).await }
        })
        .await
    }

    async fn retire(&self, job: &str, pool: &str, keep: Duration) -> Result<(), LedgerError> {
        let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX).max(1);
        let forget_at = unix_now() + keep.as_secs_f64();
        let keys = [
            self.unfinished_key(pool),
            self.key(job, "record"),
            self.key(job, "init_failures"),
            self.retired_key(),
            self.key(job, "listing"),
        ];
        retrying("retire", job, || {
            let mut conn = self.conn.get();
            let keys = &keys;
            async move {
                RETIRE
                    .key(keys.as_slice())
                    .arg(job)
                    .arg(keep_ms)
                    .arg(forget_at)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        })
        .await?;
        Ok(())
    }

    async fn reopen(&self, job: &str, pool: &str) -> Result<bool, LedgerError> {
        let keys = [
            self.unfinished_key(pool),
            self.key(job, "record"),
            self.key(job, "init_failures"),
            self.retired_key(),
            self.jobs_key(),
            self.key(job, "listing"),
        ];
        let reopened: i64 = retrying("reopen", job, || {
            let mut conn = self.conn.get();
            let keys = &keys;
            async move {
                REOPEN
                    .key(keys.as_slice())
                    .arg(job)
                    .invoke_async(&mut conn)
                    .await
            }
        })
        .await?;
        Ok(reopened == 1)
    }

    async fn note_listing(&self, job: &str, listing: &str) -> Result<(), LedgerError> {
        let (key, record) = (self.key(job, "listing"), self.key(job, "record"));
        retrying("note the listing", job, || {
            let mut conn = self.conn.get();
            let (key, record) = (&key, &record);
            async move {
                NOTE_LISTING
                    .key(key)
                    .key(record)
                    .arg(listing)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        })
        .await
        .map(drop)
    }

    async fn listing(&self, job: &str) -> Result<Option<String>, LedgerError> {
        let key = self.key(job, "listing");
        retrying("read the listing", job, || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.get(key).await }
        })
        .await
    }

    async fn add_init_failure(&self, job: &str) -> Result<u64, LedgerError> {
        let (count, record) = (self.key(job, "init_failures"), self.key(job, "record"));
        retrying("count an init failure", job, || {
            let mut conn = self.conn.get();
            let (count, record) = (&count, &record);
            async move {
                ADD_INIT_FAILURE
                    .key(count)
                    .key(record)
                    .invoke_async(&mut conn)
                    .await
            }
        })
        .await
    }

    async fn init_failures(&self, job: &str) -> Result<u64, LedgerError> {
        let key = self.key(job, "init_failures");
        let count: Option<u64> = retrying("read the init failures", job, || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.get(key).await }
        })
        .await?;
        Ok(count.unwrap_or(0))
    }

    async fn beat(&self, pool: &str, node: &str, ttl: Duration) -> Result<(), LedgerError> {
        let (key, pools) = (self.nodes_key(pool), self.pools_key());
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        retrying("beat", "", || {
            let mut conn = self.conn.get();
            let (key, pools) = (&key, &pools);
            async move {
                BEAT.key(key)
                    .arg(node)
                    .arg(ttl_ms)
                    .invoke_async::<i64>(&mut conn)
                    .await?;
                // Apart from the script: the set is in another cluster slot than the pool's.
                conn.sadd::<_, _, i64>(pools, pool).await
            }
        })
        .await?;
        Ok(())
    }

    async fn pools(&self) -> Result<Vec<String>, LedgerError> {
        let key = self.pools_key();
        let mut pools: Vec<String> = retrying("list the pools", "", || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.smembers(key).await }
        })
        .await?;
        pools.sort();
        Ok(pools)
    }

    async fn claim_place(
        &self,
        job: &str,
        node: &str,
        places: u32,
        ttl: Duration,
    ) -> Result<bool, LedgerError> {
        let (key, record) = (self.places_key(job), self.key(job, "record"));
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        let held: i64 = retrying("claim a place", job, || {
            let mut conn = self.conn.get();
            let (key, record) = (&key, &record);
            async move {
                CLAIM_PLACE
                    .key(key)
                    .key(record)
                    .arg(node)
                    .arg(places)
                    .arg(ttl_ms)
                    .invoke_async(&mut conn)
                    .await
            }
        })
        .await?;
        Ok(held == 1)
    }

    async fn release_place(&self, job: &str, node: &str) -> Result<(), LedgerError> {
        let key = self.places_key(job);
        retrying("release a place", job, || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.zrem::<_, _, i64>(key, node).await }
        })
        .await?;
        Ok(())
    }

    async fn follow(&self, job: &str, node: &str, ttl: Duration) -> Result<(), LedgerError> {
        let (key, record) = (self.key(job, "followers"), self.key(job, "record"));
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        retrying("note a follower", job, || {
            let mut conn = self.conn.get();
            let (key, record) = (&key, &record);
            async move {
                CLAIM_PLACE
                    .key(key)
                    .key(record)
                    .arg(node)
                    .arg(u32::MAX)
                    .arg(ttl_ms)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        })
        .await?;
        Ok(())
    }

    async fn let_go(&self, job: &str, node: &str) -> Result<(), LedgerError> {
        let key = self.key(job, "followers");
        retrying("let a job go", job, || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { conn.zrem::<_, _, i64>(key, node).await }
        })
        .await?;
        Ok(())
    }

    async fn followers(&self, job: &str) -> Result<Vec<String>, LedgerError> {
        let mut followers = self.live(&self.key(job, "followers"), job).await?;
        followers.sort();
        Ok(followers)
    }

    async fn nodes(&self, pool: &str) -> Result<u64, LedgerError> {
        Ok(self.live(&self.nodes_key(pool), "").await?.len() as u64)
    }

    async fn note_fault(
        &self,
        pool: &str,
        node: &str,
        fault: Fault,
        ttl: Duration,
    ) -> Result<(), LedgerError> {
        let key = self.faults_key(pool);
        let field = format!("{}:{node}", fault.label());
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        retrying("note a storage fault", "", || {
            let mut conn = self.conn.get();
            let (key, field) = (&key, &field);
            async move {
                NOTE_FAULT
                    .key(key)
                    .arg(field)
                    .arg(ttl_ms)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        })
        .await?;
        Ok(())
    }

    async fn faults(&self, pool: &str) -> Result<Vec<FaultNote>, LedgerError> {
        let key = self.faults_key(pool);
        let live: Vec<(String, u64)> = retrying("read the storage faults", "", || {
            let mut conn = self.conn.get();
            let key = &key;
            async move { LIVE_FAULTS.key(key).invoke_async(&mut conn).await }
        })
        .await?;
        let mut notes: Vec<FaultNote> = live
            .into_iter()
            .filter_map(|(field, age_ms)| {
                let (label, node) = field.split_once(':')?;
                Some(FaultNote {
                    node: node.to_owned(),
                    fault: Fault::of_label(label)?,
                    age: Duration::from_millis(age_ms),
                })
            })
            .collect();
        notes.sort_by_key(|note| note.age);
        Ok(notes)
    }
}
