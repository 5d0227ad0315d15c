#![cfg(feature = "services")]
//! `S3Storage` through a fault relay in front of the test's S3 server: throttling, server
//! errors and an outage of seconds are retried and never reach the caller; a fault that
//! outlasts the retries reaches it as a transient error, never as a missing object.

use std::time::{Duration, Instant};

use bytes::Bytes;
use fleetrun_common::storage::s3::{RETRY_SPAN, S3Settings, S3Storage};
use fleetrun_common::storage::{Fault, Storage, StorageError, faults};
use fleetrun_common::testing::random_suffix;
use fleetrun_tests::s3_relay::S3Relay;
use fleetrun_tests::services::s3_endpoint;
use futures::TryStreamExt;

/// A storage on a new bucket (made directly on the server), reached through `relay`.
async fn through(relay: &S3Relay) -> S3Storage {
    let bucket = format!("fleetrun-faults-{}", random_suffix());
    let settings = |endpoint: String| S3Settings {
        endpoint_url: Some(endpoint),
        region: Some("us-east-1".to_owned()),
        force_path_style: Some(true),
        access_key_id: Some("test".to_owned()),
        secret_access_key: Some("test".to_owned()),
    };
    let direct = S3Storage::new(&bucket, "", &settings(s3_endpoint()))
        .await
        .unwrap();
    direct.create_bucket_if_missing().await.unwrap();
    S3Storage::new(&bucket, "", &settings(relay.url()))
        .await
        .unwrap()
}

#[tokio::test]
async fn throttling_and_server_errors_on_a_fifth_of_requests_are_retried_unseen() {
    let relay = S3Relay::start(&s3_endpoint(), 5);
    let s3 = through(&relay).await;
    let throttled = faults().count(Fault::Throttled) + faults().count(Fault::ServerError);
    for i in 0..30 {
        s3.put(&format!("k/{i:02}"), Bytes::from(format!("v{i}")))
            .await
            .unwrap();
    }
    for i in 0..30 {
        let body = s3.get(&format!("k/{i:02}")).await.unwrap();
        assert_eq!(body, format!("v{i}"));
    }
    let keys: Vec<_> = s3.list("k/").map_ok(|m| m.key).try_collect().await.unwrap();
    assert_eq!(keys.len(), 30);
    let counts = relay.counts();
    assert!(counts.errors >= 10, "{counts:?}");
    let met = faults().count(Fault::Throttled) + faults().count(Fault::ServerError) - throttled;
    assert!(met >= counts.errors, "{met} counted, {counts:?}");
}

#[tokio::test]
async fn an_outage_of_seconds_is_ridden_out() {
    let relay = S3Relay::start(&s3_endpoint(), 0);
    let s3 = through(&relay).await;
    s3.put("before", Bytes::from_static(b"x")).await.unwrap();
    relay.down(true);
    let started = Instant::now();
    let put = tokio::spawn(async move { s3.put("during", Bytes::from_static(b"y")).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    relay.down(false);
    put.await.unwrap().unwrap();
    assert!(started.elapsed() < RETRY_SPAN + Duration::from_secs(5));
    assert!(relay.counts().resets > 0, "{:?}", relay.counts());
}

#[tokio::test]
async fn an_outage_past_the_retries_is_a_transient_error() {
    let relay = S3Relay::start(&s3_endpoint(), 0);
    let s3 = through(&relay).await;
    relay.down(true);
    let started = Instant::now();
    let e = s3.get("anything").await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    assert!(
        matches!(
            e,
            StorageError::Unavailable {
                fault: Fault::Unreachable,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() <= RETRY_SPAN + Duration::from_secs(5));
}
