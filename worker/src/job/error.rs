//! What can go wrong in a job's life outside the script: the seams, the job's record and
//! code, the fleet's settings. Typed, with their causes kept (STYLE.md "Errors").

use std::path::PathBuf;

use fleetrun_common::ledger::LedgerError;
use fleetrun_common::queue::QueueError;
use fleetrun_common::storage::StorageError;

/// A job's record, its code or its storages could not be had.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A record written by another version of fleetrun, or damaged.
    #[error("job record does not decode: {0}")]
    Record(#[source] serde_json::Error),
    /// A file or folder on this machine: the code to ship, the cache to stage it in.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("entry_script {} is not inside source_directory {}", entry.display(), root.display())]
    EntryOutsideSource { entry: PathBuf, root: PathBuf },
}

impl JobError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> JobError {
        let path = path.into();
        move |source| JobError::Io { path, source }
    }
}

/// Where the fleet's services are could not be told, or they could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{}: {source}", path.display())]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    ParseConfig {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error(transparent)]
    Tls(#[from] fleetrun_common::tls::TlsError),
    #[error("no {service} URL: set {var}, {flag} or {key} in the config file")]
    Missing {
        service: &'static str,
        var: &'static str,
        flag: &'static str,
        key: &'static str,
    },
    /// `url` with its password hidden.
    #[error("RabbitMQ at {url}: {source}")]
    Queue {
        url: String,
        #[source]
        source: QueueError,
    },
    /// `url` with its password hidden.
    #[error("Redis at {url}: {source}")]
    Redis {
        url: String,
        #[source]
        source: LedgerError,
    },
    /// A command named a pool no worker has started (a typo, most often): refused before
    /// any of its queues is declared.
    #[error("{}", unknown_pool(pool, known, suggestion.as_deref()))]
    UnknownPool {
        pool: String,
        /// The pools workers have started, sorted.
        known: Vec<String>,
        suggestion: Option<String>,
    },
}

fn unknown_pool(pool: &str, known: &[String], suggestion: Option<&str>) -> String {
    let mut text = format!("--pool {pool}: no worker of pool {pool} has ever started");
    const SHOWN: usize = 10;
    match known.len() {
        0 => text.push_str(" (no pool has one yet)"),
        n if n <= SHOWN => text.push_str(&format!(" (known pools: {})", known.join(", "))),
        n => text.push_str(&format!(
            " (known pools: {} and {} more)",
            known[..SHOWN].join(", "),
            n - SHOWN
        )),
    }
    if let Some(suggestion) = suggestion {
        text.push_str(&format!("; did you mean {suggestion}?"));
    }
    text.push_str(
        "; start a worker of the pool first, or pass --create-pool to submit to a new pool",
    );
    text
}
