//! Where the fleet's services are and how a worker runs: the settings, the connected
//! seams, the pool's constants, and opening a job's storages.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fleetrun_common::events::Events;
use fleetrun_common::ledger::redis::RedisLedger;
use fleetrun_common::ledger::{JobRegistry, Ledger, RedisRegistry};
use fleetrun_common::queue::amqp::AmqpQueue;
use fleetrun_common::queue::{Queue, QueueOptions};
use fleetrun_common::storage::s3::{S3Settings, S3Storage};
use fleetrun_common::storage::{LocalStorage, SelectedStorage, Storage, StorageError};
use fleetrun_common::tls::TlsFiles;
use fleetrun_config::{JobSpec, Location};
use serde::{Deserialize, Serialize};

use super::error::SettingsError;

/// The pool both binaries use when none is named.
pub const DEFAULT_POOL: &str = "default";
/// The prefix of every Redis key fleetrun writes.
pub const KEY_PREFIX: &str = "fleetrun";
/// Deliveries of one message before the broker dead-letters it: a backstop above any
/// `run_max_try` (at most 100), since workers record a mini-batch failed themselves once its
/// attempts are spent.
pub const POOL_DELIVERY_LIMIT: u32 = 101;

/// How long Redis keeps an ended job (its counts for `fleetrun status`, its record).
pub const KEEP_ENDED_JOBS: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where the fleet's services are. Flags win over the environment, which wins over the
/// config file (`$FLEETRUN_CONFIG`, else `~/.config/fleetrun/fleet.toml`).
#[derive(Debug, Clone, Default, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetArgs {
    /// RabbitMQ URL, e.g. amqp://guest:guest@127.0.0.1:5672/%2f
    #[arg(long, env = "FLEETRUN_AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,
    /// RabbitMQ management API URL (for the unacknowledged count), e.g. http://guest:guest@127.0.0.1:15672
    #[arg(long, env = "FLEETRUN_AMQP_MANAGEMENT_URL", hide_env_values = true)]
    pub amqp_management_url: Option<String>,
    /// Redis URL, e.g. redis://127.0.0.1:6379/
    #[arg(long, env = "FLEETRUN_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// The worker pool (its jobs' queues are `fleetrun.<pool>.job.<job>`).
    #[arg(long, env = "FLEETRUN_POOL")]
    pub pool: Option<String>,
    /// S3 endpoint for S3-compatible servers (else AWS_ENDPOINT_URL, else AWS).
    #[arg(long, env = "FLEETRUN_S3_ENDPOINT_URL")]
    pub s3_endpoint_url: Option<String>,
    /// Address buckets by path (default: on whenever a custom endpoint is set).
    #[arg(long, env = "FLEETRUN_S3_FORCE_PATH_STYLE")]
    pub s3_force_path_style: Option<bool>,
    /// PEM file of the CAs that sign the RabbitMQ and Redis servers' certificates (else the
    /// system's trust store); read for `amqps://` and `rediss://` URLs.
    #[arg(long, env = "FLEETRUN_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM file of the client certificate to present to RabbitMQ and Redis over TLS.
    #[arg(long, env = "FLEETRUN_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file of that client certificate's private key.
    #[arg(long, env = "FLEETRUN_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
}

impl FleetArgs {
    /// Fills what flags and environment left unset from the config file.
    pub fn resolve(self) -> Result<FleetArgs, SettingsError> {
        let path = std::env::var_os("FLEETRUN_CONFIG")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| Path::new(&h).join(".config/fleetrun/fleet.toml"))
            });
        let file = match path {
            Some(p) if p.is_file() => {
                let text =
                    std::fs::read_to_string(&p).map_err(|source| SettingsError::ReadConfig {
                        path: p.clone(),
                        source,
                    })?;
                toml::from_str::<FleetArgs>(&text)
                    .map_err(|source| SettingsError::ParseConfig { path: p, source })?
            }
            _ => FleetArgs::default(),
        };
        Ok(FleetArgs {
            amqp_url: self.amqp_url.or(file.amqp_url),
            amqp_management_url: self.amqp_management_url.or(file.amqp_management_url),
            redis_url: self.redis_url.or(file.redis_url),
            pool: self.pool.or(file.pool),
            s3_endpoint_url: self.s3_endpoint_url.or(file.s3_endpoint_url),
            s3_force_path_style: self.s3_force_path_style.or(file.s3_force_path_style),
            tls_ca_file: self.tls_ca_file.or(file.tls_ca_file),
            tls_cert_file: self.tls_cert_file.or(file.tls_cert_file),
            tls_key_file: self.tls_key_file.or(file.tls_key_file),
        })
    }

    pub fn pool(&self) -> &str {
        self.pool.as_deref().unwrap_or(DEFAULT_POOL)
    }

    /// Where the TLS material of the RabbitMQ and Redis connections is.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
        }
    }

    pub fn s3(&self) -> S3Settings {
        S3Settings {
            endpoint_url: self.s3_endpoint_url.clone(),
            force_path_style: self.s3_force_path_style,
            ..S3Settings::default()
        }
    }
}

/// The connected seams of a fleet.
#[derive(Clone)]
pub struct Fleet {
    pub queue: Arc<dyn Queue>,
    /// Where the changes of a job's state are told (the broker's events exchange).
    pub events: Arc<dyn Events>,
    pub ledger: Arc<dyn Ledger>,
    pub registry: Arc<dyn JobRegistry>,
    pub s3: S3Settings,
    pub pool: String,
}

/// Whether a command may use a pool no worker has started yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewPool {
    /// Refused ([`SettingsError::UnknownPool`]), before any queue is declared: a misspelled
    /// `--pool` would otherwise create durable queues nobody serves.
    Refuse,
    /// Declared: a job submitted to a pool its workers will serve once they start.
    Create,
}

impl Fleet {
    /// A fleet on the embedded seams (the in-process queue, events, ledger and registry), in
    /// pool `pool`: tests' and flows' that need no servers.
    pub fn embedded(pool: &str) -> Fleet {
        use fleetrun_common::events::MemoryEvents;
        use fleetrun_common::ledger::{MemoryLedger, MemoryRegistry};
        use fleetrun_common::queue::MemoryQueue;
        Fleet {
            events: Arc::new(MemoryEvents::new()),
            queue: Arc::new(MemoryQueue::new(QueueOptions::default())),
            ledger: Arc::new(MemoryLedger::new()),
            registry: Arc::new(MemoryRegistry::new()),
            s3: S3Settings::default(),
            pool: pool.to_owned(),
        }
    }

    /// The fleet of a worker: its pool is declared (and, from its first beat, known).
    pub async fn connect(args: &FleetArgs) -> Result<Fleet, SettingsError> {
        Self::connect_pool(args, NewPool::Create).await
    }

    /// The fleet of a command on `args`' pool; with [`NewPool::Refuse`], a pool no worker
    /// has started is refused before anything is declared on the broker.
    pub async fn connect_pool(args: &FleetArgs, new: NewPool) -> Result<Fleet, SettingsError> {
        let amqp = args.amqp_url.as_deref().ok_or(SettingsError::Missing {
            service: "RabbitMQ",
            var: "FLEETRUN_AMQP_URL",
            flag: "--amqp-url",
            key: "amqp_url",
        })?;
        let redis = args.redis_url.as_deref().ok_or(SettingsError::Missing {
            service: "Redis",
            var: "FLEETRUN_REDIS_URL",
            flag: "--redis-url",
            key: "redis_url",
        })?;
        let redis_error = |source| SettingsError::Redis {
            url: fleetrun_common::report::redact_url(redis),
            source,
        };
        let pool = args.pool().to_owned();
        let tls = args.tls_files().load()?;
        let ledger = RedisLedger::connect(redis, KEY_PREFIX, &tls)
            .await
            .map_err(redis_error)?;
        let registry = RedisRegistry::connect(redis, KEY_PREFIX, &tls)
            .await
            .map_err(redis_error)?;
        if new == NewPool::Refuse {
            let known = registry.pools().await.map_err(redis_error)?;
            if !known.contains(&pool) {
                let suggestion =
                    fleetrun_config::did_you_mean(&pool, known.iter().map(String::as_str))
                        .map(str::to_owned);
                return Err(SettingsError::UnknownPool {
                    pool,
                    known,
                    suggestion,
                });
            }
        }
        let options = QueueOptions {
            delivery_limit: Some(POOL_DELIVERY_LIMIT),
        };
        let management = args.amqp_management_url.as_deref();
        let queue = AmqpQueue::connect(amqp, &pool, options, management, &tls)
            .await
            .map_err(|source| SettingsError::Queue {
                url: fleetrun_common::report::redact_url(amqp),
                source,
            })?;
        let queue = Arc::new(queue);
        Ok(Fleet {
            events: queue.clone(),
            queue,
            ledger: Arc::new(ledger),
            registry: Arc::new(registry),
            s3: args.s3(),
            pool,
        })
    }
}

/// The job's input as storage. A local output folder inside a local input folder (or a
/// link to it) is left out of the input's listings: the job's own logs and parts are never
/// its input.
///
/// An input folder with an `MLTable` file lists only the files its `paths` select
/// ([`fleetrun_config::mltable::MlTable::selects`]), never the `MLTable` file itself.
pub async fn open_input(spec: &JobSpec, s3: &S3Settings) -> Result<Arc<dyn Storage>, StorageError> {
    let root = match &spec.input {
        fleetrun_config::Input::Files(location) => location.clone(),
        fleetrun_config::Input::Tabular(tabular) => tabular_root(&tabular.location).0,
    };
    let storage = match (&root, &spec.output) {
        (Location::Local(input), Location::Local(output)) => {
            Arc::new(LocalStorage::new(input).excluding(output))
        }
        _ => open_storage(&root, s3).await?,
    };
    Ok(match spec.mltable.clone() {
        Some(table) => Arc::new(SelectedStorage::new(
            storage,
            Arc::new(move |key: &str| table.selects(key)),
        )),
        None => storage,
    })
}

/// Where a tabular input's files are read from: the folder (storage root) its chunks' keys
/// are relative to, and the one file's key when the input names a single file. A local
/// path is one file when it is a file; an S3 location when it does not end with `/` and its
/// last part has a table extension (`.csv`, `.jsonl`, `.json`, `.parquet`).
pub fn tabular_root(location: &Location) -> (Location, Option<String>) {
    match location {
        Location::Local(path) if path.is_file() => {
            let parent = path.parent().unwrap_or(Path::new("/")).to_path_buf();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (Location::Local(parent), Some(name))
        }
        Location::S3 { bucket, prefix }
            if !prefix.ends_with('/')
                && fleetrun_config::TabularFormat::of_key(prefix).is_some() =>
        {
            let (parent, name) = match prefix.rsplit_once('/') {
                Some((parent, name)) => (format!("{parent}/"), name),
                None => (String::new(), prefix.as_str()),
            };
            let root = Location::S3 {
                bucket: bucket.clone(),
                prefix: parent,
            };
            (root, Some(name.to_owned()))
        }
        _ => (location.clone(), None),
    }
}

/// Storage for a location: a local folder or an S3 prefix.
pub async fn open_storage(
    location: &Location,
    s3: &S3Settings,
) -> Result<Arc<dyn Storage>, StorageError> {
    Ok(match location {
        Location::Local(path) => Arc::new(LocalStorage::new(path)),
        Location::S3 { bucket, prefix } => Arc::new(S3Storage::new(bucket, prefix, s3).await?),
    })
}
