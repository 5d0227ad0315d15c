#![cfg(feature = "services")]
//! `S3Storage` against a real S3 server (moto_server or s3s-fs on loopback, at
//! `FLEETRUN_TEST_S3_ENDPOINT`). Every test works in a bucket of its own.

use std::sync::Arc;

use bytes::Bytes;
use fleetrun_common::storage::s3::{S3Settings, S3Storage};
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_common::testing::random_suffix;
use fleetrun_tests::services::s3_endpoint;
use futures::{StreamExt, TryStreamExt};

fn settings() -> S3Settings {
    S3Settings {
        endpoint_url: Some(s3_endpoint()),
        region: Some("us-east-1".to_owned()),
        force_path_style: None,
        access_key_id: Some("test".to_owned()),
        secret_access_key: Some("test".to_owned()),
    }
}

fn bucket_name() -> String {
    format!("fleetrun-test-{}", random_suffix())
}

/// A storage on a new bucket, under `prefix`.
async fn storage(prefix: &str) -> S3Storage {
    let s = S3Storage::new(&bucket_name(), prefix, &settings())
        .await
        .unwrap();
    s.create_bucket_if_missing().await.unwrap();
    s
}

async fn keys(s: &dyn Storage, prefix: &str) -> Vec<String> {
    s.list(prefix)
        .map_ok(|m| m.key)
        .try_collect()
        .await
        .unwrap()
}

mod bucket_root {
    use super::*;

    fleetrun_common::storage_conformance!(|| async {
        Arc::new(storage("").await) as Arc<dyn Storage>
    });
}

mod under_a_prefix {
    use super::*;

    fleetrun_common::storage_conformance!(|| async {
        Arc::new(storage("jobs/x/").await) as Arc<dyn Storage>
    });
}

#[tokio::test]
async fn a_prefixed_storage_sees_only_its_own_keys() {
    let root = storage("").await;
    let x = root.at("jobs/x").unwrap();
    let x2 = root.at("jobs/x2/").unwrap();
    for (s, key) in [(&root, "top"), (&x, "in/1"), (&x, "in/2"), (&x2, "in/1")] {
        s.put(key, Bytes::from(key.to_owned())).await.unwrap();
    }
    assert_eq!(keys(&x, "").await, ["in/1", "in/2"]);
    assert_eq!(keys(&x2, "").await, ["in/1"]);
    assert_eq!(
        keys(&root, "").await,
        ["jobs/x/in/1", "jobs/x/in/2", "jobs/x2/in/1", "top"]
    );
    assert_eq!(&root.get("jobs/x2/in/1").await.unwrap()[..], b"in/1");
    assert!(matches!(x.get("top").await, Err(StorageError::NotFound(_))));

    x.delete_prefix("").await.unwrap();
    assert_eq!(keys(&root, "").await, ["jobs/x2/in/1", "top"]);
}

#[tokio::test]
async fn ranged_get_reads_only_its_bytes() {
    let s = storage("").await;
    let body: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 251) as u8).collect();
    s.put("big.bin", Bytes::from(body.clone())).await.unwrap();
    let (start, end) = (5_000_000, 5_000_100);
    let got = s.get_range("big.bin", start, end).await.unwrap();
    assert_eq!(&got[..], &body[start as usize..end as usize]);
    // The server returns the range itself: ask the SDK for the same bytes and look.
    let out = s
        .client()
        .get_object()
        .bucket(s.bucket())
        .key("big.bin")
        .range(format!("bytes={start}-{}", end - 1))
        .send()
        .await
        .unwrap();
    assert_eq!(
        out.content_range(),
        Some(format!("bytes {start}-{}/{}", end - 1, body.len()).as_str())
    );
    assert_eq!(out.content_length(), Some(100));

    let len = body.len() as u64;
    assert_eq!(
        s.get_range("big.bin", len - 2, len + 10)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(
        s.get_range("big.bin", len, len + 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.get_range("big.bin", len + 5, len + 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.get_range("big.bin", 7, 7).await.unwrap().is_empty());
    for (start, end) in [(0, 10), (3, 3)] {
        assert!(matches!(
            s.get_range("nope", start, end).await,
            Err(StorageError::NotFound(_))
        ));
    }
}

#[tokio::test]
async fn path_style_works_with_a_host_name_endpoint() {
    // Virtual-hosted addressing would send these requests to `<bucket>.localhost`.
    let endpoint = s3_endpoint().replace("127.0.0.1", "localhost");
    let s = S3Storage::new(
        &bucket_name(),
        "",
        &S3Settings {
            endpoint_url: Some(endpoint),
            ..settings()
        },
    )
    .await
    .unwrap();
    s.create_bucket_if_missing().await.unwrap();
    s.create_bucket_if_missing().await.unwrap();
    s.put("k", Bytes::from_static(b"v")).await.unwrap();
    assert_eq!(&s.get("k").await.unwrap()[..], b"v");
}

#[tokio::test]
async fn a_missing_bucket_is_said_as_such_not_as_a_missing_object() {
    let bucket = bucket_name();
    let s = S3Storage::new(&bucket, "", &settings()).await.unwrap();
    match s.get("k").await {
        Err(e @ StorageError::NoBucket { .. }) => {
            assert_eq!(e.to_string(), format!("s3://{bucket}: no such bucket"))
        }
        other => panic!("{other:?}"),
    }
    let listed: Vec<_> = s.list("").collect().await;
    assert!(
        matches!(listed[..], [Err(StorageError::NoBucket { .. })]),
        "{listed:?}"
    );
}

#[tokio::test]
async fn odd_keys_round_trip() {
    let s = storage("p q/").await;
    let odd = ["dir/a b+c%20é.txt", "dir/ü/ñ", "dir/x=1&y=2", "dir/~tilde*"];
    for k in odd {
        s.put(k, Bytes::from(k.to_owned())).await.unwrap();
    }
    let mut want = odd.to_vec();
    want.sort();
    assert_eq!(keys(&s, "dir/").await, want);
    for k in odd {
        assert_eq!(&s.get(k).await.unwrap()[..], k.as_bytes());
    }
}

#[tokio::test]
async fn folder_markers_and_unusable_keys_are_not_listed() {
    let s = storage("").await;
    for k in ["in/", "in/sub/", "in//double", "in/../up"] {
        s.client()
            .put_object()
            .bucket(s.bucket())
            .key(k)
            .send()
            .await
            .unwrap();
    }
    s.put("in/sub/real", Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(keys(&s, "").await, ["in/sub/real"]);
    // Deleting a folder removes what listing hides too.
    s.delete_prefix("in").await.unwrap();
    let left = s
        .client()
        .list_objects_v2()
        .bucket(s.bucket())
        .send()
        .await
        .unwrap();
    assert_eq!(left.key_count(), Some(0), "{:?}", left.contents());
}

#[tokio::test]
async fn delete_prefix_is_a_folder_and_pages_through_many_keys() {
    let s = storage("").await;
    let mut puts: Vec<String> = (0..1_100).map(|i| format!("_parts/j/{i:05}")).collect();
    puts.extend([
        "_parts/j".to_owned(),
        "_parts/jk/0".to_owned(),
        "keep".to_owned(),
    ]);
    futures::stream::iter(&puts)
        .map(|k| s.put(k, Bytes::from_static(b"x")))
        .buffer_unordered(16)
        .try_collect::<()>()
        .await
        .unwrap();
    assert_eq!(keys(&s, "_parts/j/").await.len(), 1_100);
    s.delete_prefix("_parts/j").await.unwrap();
    assert_eq!(keys(&s, "").await, ["_parts/jk/0", "keep"]);
}

/// A multipart upload's ETag ends in `-<number of parts>`.
async fn etag(s: &S3Storage, key: &str) -> String {
    let out = s
        .client()
        .head_object()
        .bucket(s.bucket())
        .key(key)
        .send()
        .await
        .unwrap();
    out.e_tag().unwrap_or_default().trim_matches('"').to_owned()
}

#[tokio::test]
async fn small_writes_are_one_put_and_large_ones_multipart() {
    let s = storage("").await;
    let mut w = s.writer("small").await.unwrap();
    w.write(Bytes::from_static(b"ab")).await.unwrap();
    w.write(Bytes::from_static(b"c")).await.unwrap();
    assert_eq!(w.finish().await.unwrap(), 3);
    assert_eq!(&s.get("small").await.unwrap()[..], b"abc");
    assert!(!etag(&s, "small").await.contains('-'));

    let w = s.writer("empty").await.unwrap();
    assert_eq!(w.finish().await.unwrap(), 0);
    assert!(s.get("empty").await.unwrap().is_empty());

    // One write larger than two parts.
    let body: Vec<u8> = (0..(17u32 << 20)).map(|i| (i % 253) as u8).collect();
    let mut w = s.writer("large").await.unwrap();
    w.write(Bytes::from(body.clone())).await.unwrap();
    assert_eq!(w.finish().await.unwrap(), body.len() as u64);
    assert_eq!(s.get("large").await.unwrap(), body);
    assert!(etag(&s, "large").await.ends_with("-3"));
}

#[tokio::test]
async fn a_dropped_writer_aborts_its_upload() {
    let s = storage("").await;
    let mut w = s.writer("out/abandoned").await.unwrap();
    w.write(Bytes::from(vec![b'x'; 9 << 20])).await.unwrap();
    let uploads = |s: &S3Storage| {
        let s = s.clone();
        async move {
            s.client()
                .list_multipart_uploads()
                .bucket(s.bucket())
                .send()
                .await
                .unwrap()
                .uploads()
                .len()
        }
    };
    assert_eq!(uploads(&s).await, 1);
    drop(w);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while uploads(&s).await != 0 {
        assert!(std::time::Instant::now() < deadline, "upload not aborted");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(matches!(
        s.get("out/abandoned").await,
        Err(StorageError::NotFound(_))
    ));
}

#[tokio::test]
async fn bad_settings_are_refused() {
    let half = S3Settings {
        secret_access_key: None,
        ..settings()
    };
    assert!(S3Storage::new("b", "", &half).await.is_err());
    assert!(matches!(
        S3Storage::new("b", "a/../b", &settings()).await,
        Err(StorageError::BadKey { .. })
    ));
}
