//! The job registry: what a worker needs to serve a job it has never seen (its record: the
//! spec, where its code is), the pool's list of jobs, and per-job init-failure counts.
//!
//! Kept beside the ledger and in the same store, but apart from its counting steps: records
//! are written once at submission and only read afterwards.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use redis::AsyncCommands;

use super::LedgerError;

#[async_trait]
pub trait JobRegistry: Send + Sync {
    /// Stores a job's record (opaque bytes; the producer's JSON). Fails if the job exists.
    async fn register(&self, job: &str, record: &[u8]) -> Result<(), LedgerError>;
    /// The job's record, or `None` for a job this registry does not know.
    async fn record(&self, job: &str) -> Result<Option<Vec<u8>>, LedgerError>;
    /// Every registered job, oldest first.
    async fn jobs(&self) -> Result<Vec<String>, LedgerError>;
    /// Counts one more runner init failure of the job; returns the count so far.
    async fn add_init_failure(&self, job: &str) -> Result<u64, LedgerError>;
}

/// The in-process registry.
#[derive(Default)]
pub struct MemoryRegistry {
    jobs: Mutex<BTreeMap<u64, String>>,
    records: Mutex<BTreeMap<String, (Vec<u8>, u64)>>,
}

impl MemoryRegistry {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl JobRegistry for MemoryRegistry {
    async fn register(&self, job: &str, record: &[u8]) -> Result<(), LedgerError> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.contains_key(job) {
            return Err(LedgerError::JobExists(job.to_owned()));
        }
        records.insert(job.to_owned(), (record.to_vec(), 0));
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let next = jobs.keys().next_back().map_or(0, |k| k + 1);
        jobs.insert(next, job.to_owned());
        Ok(())
    }

    async fn record(&self, job: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        Ok(records.get(job).map(|(r, _)| r.clone()))
    }

    async fn jobs(&self) -> Result<Vec<String>, LedgerError> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        Ok(jobs.values().cloned().collect())
    }

    async fn add_init_failure(&self, job: &str) -> Result<u64, LedgerError> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let entry = records
            .get_mut(job)
            .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
        entry.1 += 1;
        Ok(entry.1)
    }
}

/// The registry on Redis: `<prefix>:jobs` (a sorted set scored by registration time) and
/// `<prefix>:job:{<job>}:record` / `:init_failures` beside the ledger's keys of the job.
#[derive(Clone)]
pub struct RedisRegistry {
    conn: redis::aio::ConnectionManager,
    prefix: String,
}

fn backend(e: redis::RedisError) -> LedgerError {
    LedgerError::Backend(e.to_string())
}

impl RedisRegistry {
    pub async fn connect(url: &str, key_prefix: &str) -> Result<RedisRegistry, LedgerError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(5)))
            .set_response_timeout(Some(std::time::Duration::from_secs(10)));
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(backend)?;
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
}

#[async_trait]
impl JobRegistry for RedisRegistry {
    async fn register(&self, job: &str, record: &[u8]) -> Result<(), LedgerError> {
        let mut conn = self.conn.clone();
        let created: bool = redis::cmd("SET")
            .arg(self.key(job, "record"))
            .arg(record)
            .arg("NX")
            .query_async::<Option<String>>(&mut conn)
            .await
            .map_err(backend)?
            .is_some();
        if !created {
            return Err(LedgerError::JobExists(job.to_owned()));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let _: () = conn
            .zadd(self.jobs_key(), job, now)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn record(&self, job: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        let mut conn = self.conn.clone();
        conn.get(self.key(job, "record")).await.map_err(backend)
    }

    async fn jobs(&self) -> Result<Vec<String>, LedgerError> {
        let mut conn = self.conn.clone();
        conn.zrange(self.jobs_key(), 0, -1).await.map_err(backend)
    }

    async fn add_init_failure(&self, job: &str) -> Result<u64, LedgerError> {
        let mut conn = self.conn.clone();
        conn.incr(self.key(job, "init_failures"), 1u64)
            .await
            .map_err(backend)
    }
}
