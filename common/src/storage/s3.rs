//! Storage on S3 or an S3-compatible server (aws-sdk-s3).
//!
//! An [`S3Storage`] is a bucket and a key prefix: key `a/b.png` of the storage
//! `s3://bucket/jobs/x/` is the object `jobs/x/a/b.png`. Keys pass [`check_key`] before
//! they reach S3, and listing skips objects whose keys would fail it (folder markers such as
//! `in/`, keys with `//` or `..`), so every key this storage hands out is a valid relative
//! key. Code that stages objects to local files must still join keys to its folder through
//! [`check_key`], never trusting a key from a bucket as a path.
//!
//! Settings resolve as the AWS SDKs do (environment, `~/.aws/config` profiles, instance
//! metadata), with [`S3Settings`] overriding; see [`S3Settings::client`].
//!
//! S3 throttles (503 SlowDown), fails on its side (500 InternalError) and drops
//! connections as a matter of course. The client retries such requests with backoff, up to
//! [`MAX_ATTEMPTS`] attempts over about [`RETRY_SPAN`]; a request that still does not get
//! through is a [`StorageError::Unavailable`], which callers hand back as an infrastructure
//! fault rather than fail anything for. Every faulty attempt is counted ([`super::faults`]).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_s3::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_s3::config::{ConfigBag, Credentials, Intercept, Region, RuntimeComponents};
use aws_sdk_s3::error::{BoxError, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketLocationConstraint, CompletedMultipartUpload, CompletedPart, CreateBucketConfiguration,
    Delete, ObjectIdentifier,
};
use bytes::{Bytes, BytesMut};
use futures::stream::{self, BoxStream, StreamExt};
use serde::{Deserialize, Serialize};

use super::{Fault, ObjectMeta, ObjectWriter, Storage, StorageError, check_key, join_key};

/// The region used when neither the settings nor the AWS environment name one: local S3
/// servers accept any region, and AWS routes `us-east-1` requests for any bucket.
const DEFAULT_REGION: &str = "us-east-1";

/// S3 refuses multipart parts smaller than this, except the last one.
const MIN_PART_SIZE: usize = 5 << 20;

/// Writers upload parts of this size (8 MiB) for their first [`PARTS_PER_STEP`] parts, then
/// double it every [`PARTS_PER_STEP`] parts: S3 allows 10,000 parts, so a fixed 8 MiB would
/// cap objects at 80 GB, while this reaches S3's 5 TiB object limit with parts of at most
/// 4 GiB (S3's maximum part is 5 GiB).
const BASE_PART_SIZE: usize = 8 << 20;
const PARTS_PER_STEP: i32 = 1_000;
const _: () = assert!(BASE_PART_SIZE >= MIN_PART_SIZE);

/// DeleteObjects takes at most this many keys a request.
const DELETE_BATCH: usize = 1_000;

/// Attempts of a request that meets faults (throttling, server errors, connection resets),
/// the first included, before it fails as [`StorageError::Unavailable`].
pub const MAX_ATTEMPTS: u32 = 8;
/// The first retry waits up to this long; each further one up to twice as long as the one
/// before, at most [`MAX_BACKOFF`] (each wait a random share of that: "full jitter").
const INITIAL_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The longest a request waits between its [`MAX_ATTEMPTS`] attempts, in all (17.75 s):
/// the longest S3 outage a request may ride out (half that on average, with the jitter).
pub const RETRY_SPAN: Duration = retry_span();

const fn retry_span() -> Duration {
    let (mut total, mut wait, mut retries) = (Duration::ZERO, INITIAL_BACKOFF, 1);
    while retries < MAX_ATTEMPTS {
        total = total.saturating_add(if wait.as_millis() < MAX_BACKOFF.as_millis() {
            wait
        } else {
            MAX_BACKOFF
        });
        wait = wait.saturating_mul(2);
        retries += 1;
    }
    total
}

/// How to reach S3. Every field is optional: unset ones come from the standard AWS
/// environment variables and profiles (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_PROFILE`,
/// `AWS_ACCESS_KEY_ID`, …), then from the defaults below.
#[derive(Default, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Settings {
    /// The S3 server's URL, for S3-compatible servers (MinIO, moto, s3s-fs, …); AWS when
    /// unset and `AWS_ENDPOINT_URL(_S3)` is unset too.
    pub endpoint_url: Option<String>,
    /// The signing region; `us-east-1` when neither this nor the AWS environment sets one.
    pub region: Option<String>,
    /// Address buckets as `<endpoint>/<bucket>/<key>` instead of `<bucket>.<endpoint>/<key>`.
    /// Defaults to true whenever a custom endpoint is configured (here or in the AWS
    /// environment), false for AWS itself.
    pub force_path_style: Option<bool>,
    /// A static access key; set together with `secret_access_key`, or neither.
    pub access_key_id: Option<String>,
    /// The static access key's secret (never printed by `Debug`).
    pub secret_access_key: Option<String>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint_url", &self.endpoint_url)
            .field("region", &self.region)
            .field("force_path_style", &self.force_path_style)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl S3Settings {
    /// Settings from fleetrun's own environment variables, `FLEETRUN_S3_ENDPOINT_URL`,
    /// `FLEETRUN_S3_REGION` and `FLEETRUN_S3_FORCE_PATH_STYLE` (`true`/`false`, `1`/`0`,
    /// `yes`/`no`, `on`/`off`); they take precedence over the AWS ones, which the SDK reads
    /// anyway when the client is built. Empty variables count as unset.
    pub fn from_env() -> Result<S3Settings, StorageError> {
        S3Settings::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<S3Settings, StorageError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let force_path_style = match var("FLEETRUN_S3_FORCE_PATH_STYLE") {
            None => None,
            Some(v) => Some(parse_bool(&v).ok_or_else(|| {
                settings_error(format!(
                    "FLEETRUN_S3_FORCE_PATH_STYLE={v:?} is not true or false"
                ))
            })?),
        };
        Ok(S3Settings {
            endpoint_url: var("FLEETRUN_S3_ENDPOINT_URL"),
            region: var("FLEETRUN_S3_REGION"),
            force_path_style,
            access_key_id: None,
            secret_access_key: None,
        })
    }

    /// Builds an S3 client: the AWS SDK's default chain, overridden by these settings.
    ///
    /// Building one loads profiles and may ask instance metadata for credentials and the
    /// region, so build one per set of settings and share it (clones are cheap) through
    /// [`S3Storage::with_client`].
    pub async fn client(&self) -> Result<Client, StorageError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) => {
                loader = loader.credentials_provider(Credentials::new(
                    id,
                    secret,
                    None,
                    None,
                    "fleetrun-settings",
                ));
            }
            (None, None) => {}
            _ => {
                return Err(settings_error(
                    "access_key_id and secret_access_key must be set together".to_owned(),
                ));
            }
        }
        let shared = loader.load().await;
        // `shared.endpoint_url()` holds ours or `AWS_ENDPOINT_URL` (environment or profile);
        // the S3-specific variable is resolved inside the S3 config, where it cannot be read
        // back, so look at it here.
        let custom_endpoint = shared.endpoint_url().is_some()
            || (!env_flag("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
                && std::env::var("AWS_ENDPOINT_URL_S3").is_ok_and(|v| !v.trim().is_empty()));
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(path_style(self.force_path_style, custom_endpoint))
            .retry_config(retry_config())
            // The SDK's default retry quota stops retrying once a few dozen attempts failed
            // in a row: an outage of seconds would then fail every request at once. The
            // attempts and backoff above bound the retries instead.
            .retry_partition(
                RetryPartition::custom("fleetrun-s3")
                    .token_bucket(TokenBucket::unlimited())
                    .build(),
            )
            .interceptor(CountFaults);
        if shared.region().is_none() {
            config = config.region(Region::new(DEFAULT_REGION));
        }
        Ok(Client::from_conf(config.build()))
    }
}

/// The retries of every request: see [`MAX_ATTEMPTS`] and [`RETRY_SPAN`].
fn retry_config() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(MAX_ATTEMPTS)
        .with_initial_backoff(INITIAL_BACKOFF)
        .with_max_backoff(MAX_BACKOFF)
}

/// Counts the fault each attempt of a request meets, retried or not, and warns now and
/// then that S3 faults are being retried.
#[derive(Debug)]
struct CountFaults;

impl Intercept for CountFaults {
    fn name(&self) -> &'static str {
        "CountFaults"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let fault = match (context.response(), context.output_or_error()) {
            (Some(response), _) => Fault::of_answer(response.status().as_u16(), None),
            (None, Some(Err(_))) => Some(Fault::Unreachable),
            (None, _) => None,
        };
        if let Some(fault) = fault {
            let counts = super::faults();
            if counts.note(fault, crate::ledger::unix_now() as u64) {
                tracing::warn!(
                    throttled = counts.count(Fault::Throttled),
                    server_errors = counts.count(Fault::ServerError),
                    unreachable = counts.count(Fault::Unreachable),
                    "S3 {fault}, retrying."
                );
            }
        }
        Ok(())
    }
}

/// Path-style addressing unless asked otherwise, whenever the endpoint is not AWS's own:
/// virtual-hosted buckets need DNS names like `bucket.localhost` that local servers lack.
fn path_style(forced: Option<bool>, custom_endpoint: bool) -> bool {
    forced.unwrap_or(custom_endpoint)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| parse_bool(&v) == Some(true))
}

fn settings_error(why: String) -> StorageError {
    StorageError::Settings(why)
}

/// The object metadata that names who wrote an object of a job's named output
/// (`<job>/<node>/<process>`): an object without it is not fleetrun's.
pub const WRITER_METADATA: &str = "fleetrun-writer";

/// A bucket and key prefix on S3 as storage.
#[derive(Debug, Clone)]
pub struct S3Storage {
    client: Client,
    bucket: String,
    /// The key prefix, `""` or ending in `/`.
    prefix: String,
}

impl S3Storage {
    /// Storage on `s3://<bucket>/<prefix>`, with a client of its own built from `settings`.
    pub async fn new(
        bucket: &str,
        prefix: &str,
        settings: &S3Settings,
    ) -> Result<S3Storage, StorageError> {
        S3Storage::with_client(settings.client().await?, bucket, prefix)
    }

    /// Storage on `s3://<bucket>/<prefix>` through an existing client. `prefix` is a folder:
    /// `"jobs/x"` and `"jobs/x/"` both mean the keys under `jobs/x/`.
    pub fn with_client(
        client: Client,
        bucket: &str,
        prefix: &str,
    ) -> Result<S3Storage, StorageError> {
        if bucket.is_empty() || bucket.contains('/') {
            return Err(StorageError::BadBucket(bucket.to_owned()));
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            check_key(prefix)?;
        }
        Ok(S3Storage {
            client,
            bucket: bucket.to_owned(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
        })
    }

    /// The same bucket under another prefix, sharing this storage's client.
    pub fn at(&self, prefix: &str) -> Result<S3Storage, StorageError> {
        S3Storage::with_client(self.client.clone(), &self.bucket, prefix)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key prefix, `""` or ending in `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// [`Storage::list`] with each object's ETag (`""` when S3 gives none): a listing that
    /// tells a changed object from an unchanged one without reading it.
    pub fn list_tagged<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxStream<'a, Result<(ObjectMeta, String), StorageError>> {
        self.list_objects(format!("{}{prefix}", self.prefix))
            .flat_map(move |page| {
                let items: Vec<_> = match page {
                    Err(e) => vec![Err(e)],
                    Ok(objects) => objects
                        .iter()
                        .filter_map(|o| {
                            let key = self.storage_key(o.key()?)?;
                            let size = o.size().unwrap_or(0).max(0) as u64;
                            let etag = o.e_tag().unwrap_or_default().to_owned();
                            Some(Ok((ObjectMeta { key, size }, etag)))
                        })
                        .collect(),
                };
                stream::iter(items)
            })
            .boxed()
    }

    /// Who wrote `key`, as the metadata [`S3Storage::put_written_by`] leaves says: `None`
    /// when there is no such object, `Some(None)` for an object fleetrun did not write so.
    pub async fn written_by(&self, key: &str) -> Result<Option<Option<String>>, StorageError> {
        let object_key = self.object_key(key)?;
        let head = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(&object_key)
            .send()
            .await;
        match head {
            Ok(out) => Ok(Some(
                out.metadata().and_then(|m| m.get(WRITER_METADATA)).cloned(),
            )),
            Err(e) => match self.error(key, e) {
                StorageError::NotFound(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    /// [`Storage::put`] with the writer noted in the object's metadata
    /// ([`WRITER_METADATA`]), where [`S3Storage::written_by`] reads it.
    pub async fn put_written_by(
        &self,
        key: &str,
        body: Bytes,
        writer: &str,
    ) -> Result<(), StorageError> {
        let object_key = self.object_key(key)?;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&object_key)
            .metadata(WRITER_METADATA, writer)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| self.backend(key, e))?;
        Ok(())
    }

    /// Creates the bucket unless it exists already (in the client's region), for demos,
    /// tests and first-time set-up.
    pub async fn create_bucket_if_missing(&self) -> Result<(), StorageError> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => return Ok(()),
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(self.backend("", e)),
        }
        let mut create = self.client.create_bucket().bucket(&self.bucket);
        let region = self.client.config().region().map(|r| r.as_ref());
        if let Some(region) = region.filter(|r| *r != DEFAULT_REGION) {
            create = create.create_bucket_configuration(
                CreateBucketConfiguration::builder()
                    .location_constraint(BucketLocationConstraint::from(region))
                    .build(),
            );
        }
        match create.send().await {
            Ok(_) => Ok(()),
            // Lost a race with another creator of our own.
            Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => Ok(()),
            Err(e) => Err(self.backend("", e)),
        }
    }

    /// The object key of a storage key.
    fn object_key(&self, key: &str) -> Result<String, StorageError> {
        check_key(key)?;
        Ok(join_key(&self.prefix, key))
    }

    /// Maps an SDK error about `key`: a missing object is `NotFound`, anything else is a
    /// backend error carrying the whole cause chain.
    fn error<E>(&self, key: &str, e: SdkError<E, HttpResponse>) -> StorageError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let missing_object = match e.code() {
            Some("NoSuchKey") => true,
            Some("NoSuchBucket") => false,
            _ => status(&e) == Some(404),
        };
        if missing_object {
            StorageError::NotFound(key.to_owned())
        } else {
            self.backend(key, e)
        }
    }

    /// Maps an SDK error about `key` other than a missing object: a missing bucket, a fault
    /// of the service's ([`StorageError::Unavailable`]), or anything else as a backend error
    /// carrying the whole cause chain.
    fn backend<E>(&self, key: &str, e: SdkError<E, HttpResponse>) -> StorageError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        if e.code() == Some("NoSuchBucket") {
            return StorageError::NoBucket {
                bucket: self.bucket.clone(),
            };
        }
        let what = format!("s3://{}/{}{key}", self.bucket, self.prefix);
        match fault(&e) {
            Some(fault) => StorageError::Unavailable {
                what,
                fault,
                detail: format!("S3 {fault} after {MAX_ATTEMPTS} attempts: {}", cause(&e)),
                source: Box::new(e),
            },
            None => StorageError::Refused {
                what,
                detail: cause(&e),
                source: Box::new(e),
            },
        }
    }

    /// Every object under the object-key prefix `full`, page by page, with S3's keys.
    fn list_objects(
        &self,
        full: String,
    ) -> BoxStream<'_, Result<Vec<aws_sdk_s3::types::Object>, StorageError>> {
        let pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&full)
            .into_paginator()
            .send();
        stream::unfold(Some(pages), move |pages| {
            let full = full.clone();
            async move {
                let mut pages = pages?;
                match pages.next().await? {
                    Ok(page) => Some((Ok(page.contents.unwrap_or_default()), Some(pages))),
                    Err(e) => {
                        let relative = full.strip_prefix(&self.prefix).unwrap_or(&full);
                        Some((Err(self.backend(relative, e)), None))
                    }
                }
            }
        })
        .boxed()
    }

    /// The storage key of a listed object, or `None` for objects this storage cannot name.
    fn storage_key(&self, object_key: &str) -> Option<String> {
        let key = object_key.strip_prefix(&self.prefix)?;
        if key.ends_with('/') {
            // A folder marker (the S3 console's "Create folder"): not a file.
            return None;
        }
        if let Err(e) = check_key(key) {
            tracing::warn!(bucket = %self.bucket, key = %object_key, error = %e, "Skipping an object whose key is not a valid relative key.");
            return None;
        }
        Some(key.to_owned())
    }

    /// The whole object's body, not yet read.
    async fn body(&self, key: &str) -> Result<ByteStream, StorageError> {
        let object_key = self.object_key(key)?;
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&object_key)
            .send()
            .await
            .map_err(|e| self.error(key, e))?;
        Ok(out.body)
    }
}

fn status<E>(e: &SdkError<E, HttpResponse>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// The fault of the service's an SDK error is, if it is one: an answer that it throttles or
/// failed, or no answer at all. A request the client could not make (a malformed endpoint,
/// missing credentials) is no fault of the service's.
fn fault<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> Option<Fault> {
    match e {
        SdkError::ServiceError(service) => {
            Fault::of_answer(service.raw().status().as_u16(), service.err().code())
        }
        SdkError::DispatchFailure(failure) if failure.is_user() => None,
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            Some(Fault::Unreachable)
        }
        _ => None,
    }
}

/// A failure reading an object's body once S3 began sending it: the connection broke (or
/// the bytes were damaged on the way), which a later read may not meet.
fn body_failed(key: &str, e: aws_sdk_s3::primitives::ByteStreamError) -> StorageError {
    StorageError::Unavailable {
        what: key.to_owned(),
        fault: Fault::Unreachable,
        detail: format!("reading the object: {}", crate::report::one_line(&e)),
        source: Box::new(e),
    }
}

#[async_trait]
impl Storage for S3Storage {
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.list_objects(format!("{}{prefix}", self.prefix))
            .flat_map(move |page| {
                let items: Vec<_> = match page {
                    Err(e) => vec![Err(e)],
                    Ok(objects) => objects
                        .iter()
                        .filter_map(|o| {
                            let key = self.storage_key(o.key()?)?;
                            let size = o.size().unwrap_or(0).max(0) as u64;
                            Some(Ok(ObjectMeta { key, size }))
                        })
                        .collect(),
                };
                stream::iter(items)
            })
            .boxed()
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        collect(self.body(key).await?, key).await
    }

    async fn get_pieces(&self, key: &str) -> Result<super::Pieces, StorageError> {
        let body = self.body(key).await?;
        let key = key.to_owned();
        // The SDK reads the body as it is asked for it: one piece (its HTTP frame) at a time.
        Ok(stream::unfold(Some(body), move |body| {
            let key = key.clone();
            async move {
                let mut body = body?;
                match body.try_next().await {
                    Ok(Some(piece)) => Some((Ok(piece), Some(body))),
                    Ok(None) => None,
                    Err(e) => Some((Err(body_failed(&key, e)), None)),
                }
            }
        })
        .boxed())
    }

    async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StorageError> {
        let object_key = self.object_key(key)?;
        if end <= start {
            // No bytes to ask for, but a missing object is still missing.
            self.client
                .head_object()
                .bucket(&self.bucket)
                .key(&object_key)
                .send()
                .await
                .map_err(|e| self.error(key, e))?;
            return Ok(Bytes::new());
        }
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&object_key)
            .range(format!("bytes={start}-{}", end - 1))
            .send()
            .await
        {
            Ok(out) => out,
            // The range starts at or past the end of the object.
            Err(e) if e.code() == Some("InvalidRange") || status(&e) == Some(416) => {
                return Ok(Bytes::new());
            }
            Err(e) => return Err(self.error(key, e)),
        };
        let whole = out.content_range.is_none();
        let body = collect(out.body, key).await?;
        if whole {
            // The server ignored the range and sent the whole object.
            let len = body.len() as u64;
            return Ok(body.slice(start.min(len) as usize..end.min(len) as usize));
        }
        Ok(body)
    }

    async fn put(&self, key: &str, body: Bytes) -> Result<(), StorageError> {
        let object_key = self.object_key(key)?;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&object_key)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| self.backend(key, e))?;
        Ok(())
    }

    async fn writer(&self, key: &str) -> Result<Box<dyn ObjectWriter>, StorageError> {
        let object_key = self.object_key(key)?;
        Ok(Box::new(S3Writer {
            storage: self.clone(),
            key: key.to_owned(),
            object_key,
            buf: BytesMut::new(),
            upload_id: None,
            parts: Vec::new(),
            size: 0,
            failed: false,
        }))
    }

    /// Deletes every object under `prefix` as a folder, like [`super::LocalStorage`]: `"a/"`
    /// and `"a"` both delete `a/…` (and an object named `a`), never `ab`.
    async fn delete_prefix(&self, prefix: &str) -> Result<(), StorageError> {
        let folder = prefix.trim_end_matches('/');
        let mut doomed = Vec::new();
        let mut pages = if folder.is_empty() {
            self.list_objects(self.prefix.clone())
        } else {
            doomed.push(self.object_key(folder)?);
            self.list_objects(format!("{}{folder}/", self.prefix))
        };
        while let Some(page) = pages.next().await {
            doomed.extend(page?.into_iter().filter_map(|o| o.key));
            while doomed.len() >= DELETE_BATCH {
                let rest = doomed.split_off(DELETE_BATCH);
                self.delete_objects(prefix, std::mem::replace(&mut doomed, rest))
                    .await?;
            }
        }
        if !doomed.is_empty() {
            self.delete_objects(prefix, doomed).await?;
        }
        Ok(())
    }

    fn local_path(&self, _key: &str) -> Option<std::path::PathBuf> {
        None
    }
}

impl S3Storage {
    /// Deletes up to [`DELETE_BATCH`] objects by their object keys; missing ones are fine.
    async fn delete_objects(&self, prefix: &str, keys: Vec<String>) -> Result<(), StorageError> {
        let objects = keys
            .into_iter()
            .map(|k| ObjectIdentifier::builder().key(k).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StorageError::Request {
                what: "delete request",
                source: Box::new(e),
            })?;
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|e| StorageError::Request {
                what: "delete request",
                source: Box::new(e),
            })?;
        let out = self
            .client
            .delete_objects()
            .bucket(&self.bucket)
            .delete(delete)
            .send()
            .await
            .map_err(|e| self.backend(prefix, e))?;
        if let Some(first) = out.errors().first() {
            return Err(StorageError::NotDeleted {
                bucket: self.bucket.clone(),
                key: first.key().unwrap_or_default().to_owned(),
                failed: out.errors().len(),
                reason: format!(
                    "{} {}",
                    first.code().unwrap_or_default(),
                    first.message().unwrap_or_default()
                ),
            });
        }
        Ok(())
    }
}

async fn collect(body: ByteStream, key: &str) -> Result<Bytes, StorageError> {
    body.collect()
        .await
        .map(|data| data.into_bytes())
        .map_err(|e| body_failed(key, e))
}

/// An SDK error as one line for a person: what S3 answered (`NoSuchBucket: The specified
/// bucket does not exist`), or why no answer came (the causes' messages, joined). Never the
/// SDK's `Debug` form, which carries the raw response.
fn cause<E>(e: &SdkError<E, HttpResponse>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match e {
        SdkError::ServiceError(service) => {
            let err = service.err();
            let status = service.raw().status().as_u16();
            match (err.code(), err.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => format!("{code} (HTTP {status})"),
                _ => format!("S3 answered HTTP {status}"),
            }
        }
        other => crate::report::one_line(other),
    }
}

/// The part size for part number `n` (from 1); see [`BASE_PART_SIZE`].
fn part_size(n: i32) -> usize {
    BASE_PART_SIZE << ((n - 1) / PARTS_PER_STEP).clamp(0, 9)
}

/// Writes an object as a multipart upload, started once the first full part is buffered; an
/// object that ends smaller than one part is one PutObject instead. Parts upload
/// one at a time, so a writer holds at most one part in memory.
///
/// On an error, or when dropped before `finish`, the upload is aborted: S3 would otherwise
/// keep (and bill) its parts until a lifecycle rule removes them.
struct S3Writer {
    storage: S3Storage,
    key: String,
    object_key: String,
    buf: BytesMut,
    upload_id: Option<String>,
    parts: Vec<CompletedPart>,
    size: u64,
    /// Set after an error: the upload is gone, so later writes must not start a new one.
    failed: bool,
}

impl S3Writer {
    fn next_part_number(&self) -> i32 {
        self.parts.len() as i32 + 1
    }

    async fn upload_part(&mut self, body: Bytes) -> Result<(), StorageError> {
        let s = &self.storage;
        let upload_id = match &self.upload_id {
            Some(id) => id.clone(),
            None => {
                let out = s
                    .client
                    .create_multipart_upload()
                    .bucket(&s.bucket)
                    .key(&self.object_key)
                    .send()
                    .await
                    .map_err(|e| s.backend(&self.key, e))?;
                let id = out
                    .upload_id
                    .ok_or_else(|| StorageError::NoUploadId(self.key.clone()))?;
                self.upload_id = Some(id.clone());
                id
            }
        };
        let number = self.next_part_number();
        let out = s
            .client
            .upload_part()
            .bucket(&s.bucket)
            .key(&self.object_key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| s.backend(&self.key, e))?;
        self.parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(out.e_tag)
                .build(),
        );
        Ok(())
    }

    async fn complete(&mut self) -> Result<(), StorageError> {
        let s = &self.storage;
        if self.upload_id.is_none() {
            let body = self.buf.split().freeze();
            s.client
                .put_object()
                .bucket(&s.bucket)
                .key(&self.object_key)
                .body(ByteStream::from(body))
                .send()
                .await
                .map_err(|e| s.backend(&self.key, e))?;
            return Ok(());
        }
        if !self.buf.is_empty() {
            let last = self.buf.split().freeze();
            self.upload_part(last).await?;
        }
        let s = &self.storage;
        let upload_id = self.upload_id.clone().unwrap_or_default();
        s.client
            .complete_multipart_upload()
            .bucket(&s.bucket)
            .key(&self.object_key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(std::mem::take(&mut self.parts)))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| s.backend(&self.key, e))?;
        self.upload_id = None;
        Ok(())
    }

    /// Aborts the upload after an error and passes the error on.
    async fn fail(&mut self, e: StorageError) -> StorageError {
        self.failed = true;
        self.buf = BytesMut::new();
        if let Some(id) = self.upload_id.take() {
            abort(&self.storage, &self.key, &self.object_key, &id).await;
        }
        e
    }
}

async fn abort(s: &S3Storage, key: &str, object_key: &str, upload_id: &str) {
    if let Err(e) = s
        .client
        .abort_multipart_upload()
        .bucket(&s.bucket)
        .key(object_key)
        .upload_id(upload_id)
        .send()
        .await
    {
        tracing::warn!(bucket = %s.bucket, key = %object_key, upload_id, error = %cause(&e), "Could not abort a multipart upload; its parts stay until a lifecycle rule removes them.");
    } else {
        tracing::debug!(bucket = %s.bucket, key, upload_id, "Aborted a multipart upload.");
    }
}

#[async_trait]
impl ObjectWriter for S3Writer {
    async fn write(&mut self, piece: Bytes) -> Result<(), StorageError> {
        if self.failed {
            return Err(StorageError::WriterFailed {
                key: self.key.clone(),
                step: "writing",
            });
        }
        self.size += piece.len() as u64;
        self.buf.extend_from_slice(&piece);
        loop {
            let want = part_size(self.next_part_number());
            if self.buf.len() < want {
                return Ok(());
            }
            let part = self.buf.split_to(want).freeze();
            if let Err(e) = self.upload_part(part).await {
                return Err(self.fail(e).await);
            }
        }
    }

    async fn finish(mut self: Box<Self>) -> Result<u64, StorageError> {
        if self.failed {
            return Err(StorageError::WriterFailed {
                key: self.key.clone(),
                step: "finishing",
            });
        }
        match self.complete().await {
            Ok(()) => Ok(self.size),
            Err(e) => Err(self.fail(e).await),
        }
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let storage = self.storage.clone();
                let key = std::mem::take(&mut self.key);
                let object_key = std::mem::take(&mut self.object_key);
                runtime.spawn(async move { abort(&storage, &key, &object_key, &upload_id).await });
            }
            Err(_) => {
                tracing::warn!(bucket = %self.storage.bucket, key = %self.object_key, upload_id, "Writer dropped outside a runtime; its multipart upload is left behind.");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleetrun_variables_are_read() {
        let vars = |name: &str| match name {
            "FLEETRUN_S3_ENDPOINT_URL" => Some("http://127.0.0.1:9000".to_owned()),
            "FLEETRUN_S3_FORCE_PATH_STYLE" => Some("off".to_owned()),
            "FLEETRUN_S3_REGION" => Some(String::new()),
            _ => None,
        };
        let s = S3Settings::from_vars(vars).unwrap();
        assert_eq!(s.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(s.force_path_style, Some(false));
        assert_eq!(s.region, None);
        let bad = |name: &str| (name == "FLEETRUN_S3_FORCE_PATH_STYLE").then(|| "maybe".to_owned());
        assert!(S3Settings::from_vars(bad).is_err());
    }

    #[test]
    fn path_style_follows_custom_endpoints_unless_forced() {
        assert!(path_style(None, true));
        assert!(!path_style(None, false));
        assert!(!path_style(Some(false), true));
        assert!(path_style(Some(true), false));
    }

    #[test]
    fn requests_ride_out_an_outage_of_seconds() {
        assert_eq!(RETRY_SPAN, Duration::from_millis(17_750));
    }

    #[test]
    fn part_sizes_reach_five_tebibytes_in_ten_thousand_parts() {
        assert!(part_size(1) >= MIN_PART_SIZE);
        assert_eq!(part_size(1_000), part_size(1));
        assert_eq!(part_size(1_001), 2 * part_size(1));
        let total: u64 = (1..=10_000).map(|n| part_size(n) as u64).sum();
        assert!(total >= 5 << 40, "{total}");
        assert!(part_size(10_000) <= 5 << 30);
    }

    #[test]
    fn debug_hides_the_secret() {
        let s = S3Settings {
            secret_access_key: Some("hunter2".to_owned()),
            ..S3Settings::default()
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn prefixes_are_folders() {
        let client = S3Settings {
            region: Some("us-east-1".to_owned()),
            access_key_id: Some("a".to_owned()),
            secret_access_key: Some("b".to_owned()),
            ..S3Settings::default()
        }
        .client()
        .await
        .unwrap();
        for (given, want) in [
            ("", ""),
            ("/", ""),
            ("jobs/x", "jobs/x/"),
            ("/jobs/x/", "jobs/x/"),
        ] {
            let s = S3Storage::with_client(client.clone(), "b", given).unwrap();
            assert_eq!(s.prefix(), want, "{given:?}");
        }
        assert!(S3Storage::with_client(client.clone(), "b", "a/../b").is_err());
        assert!(S3Storage::with_client(client, "", "").is_err());
    }
}
