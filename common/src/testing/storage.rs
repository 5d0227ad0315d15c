//! The storage conformance suite.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;

use crate::storage::{Storage, StorageError};

/// Generates one `#[tokio::test]` per case for the storage built by `$make`, an async closure
/// returning an empty `Arc<dyn Storage>`.
#[macro_export]
macro_rules! storage_conformance {
    ($make:expr) => {
        $crate::storage_conformance!(@cases $make;
            put_then_get, missing_is_not_found, ranged_get_reads_only_its_bytes,
            pieces_make_the_whole_object,
            list_is_recursive_in_key_order, list_by_prefix, list_streams_many,
            put_replaces, writer_appears_only_on_finish, delete_prefix_removes_only_it,
            escaping_keys_are_refused);
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::storage::$case($make).await;
            }
        )*
    };
}

/// The keys `list` gives under `prefix`, checked against `list_keys` (the same, in the same
/// order) and `list_keys_any_order` (the same set).
async fn keys(s: &dyn Storage, prefix: &str) -> Vec<String> {
    let keys: Vec<String> = s
        .list(prefix)
        .map_ok(|m| m.key)
        .try_collect()
        .await
        .unwrap();
    let names: Vec<String> = s.list_keys(prefix).try_collect().await.unwrap();
    assert_eq!(names, keys, "list_keys and list agree under {prefix:?}");
    let mut any: Vec<String> = s.list_keys_any_order(prefix).try_collect().await.unwrap();
    any.sort();
    let mut set = keys.clone();
    set.sort();
    assert_eq!(
        any, set,
        "list_keys_any_order lists the keys of list under {prefix:?}"
    );
    keys
}

pub async fn put_then_get<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    s.put("a/b.txt", Bytes::from_static(b"hello"))
        .await
        .unwrap();
    assert_eq!(&s.get("a/b.txt").await.unwrap()[..], b"hello");
    let listed: Vec<_> = s.list("").try_collect().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].key.as_str(), listed[0].size), ("a/b.txt", 5));
}

pub async fn missing_is_not_found<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    assert!(matches!(
        s.get("nope").await,
        Err(StorageError::NotFound(_))
    ));
    assert!(keys(&*s, "").await.is_empty());
    assert!(keys(&*s, "no/such/folder/").await.is_empty());
}

pub async fn pieces_make_the_whole_object<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    // Larger than one piece of any implementation's transfer.
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    s.put("big.bin", Bytes::from(body.clone())).await.unwrap();
    let pieces: Vec<Bytes> = s
        .get_pieces("big.bin")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(pieces.concat(), body);
    assert!(matches!(
        s.get_pieces("nope").await.map(|_| ()),
        Err(StorageError::NotFound(_))
    ));
}

pub async fn ranged_get_reads_only_its_bytes<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    s.put("t.csv", Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    assert_eq!(&s.get_range("t.csv", 2, 5).await.unwrap()[..], b"234");
    assert_eq!(&s.get_range("t.csv", 8, 100).await.unwrap()[..], b"89");
}

pub async fn list_is_recursive_in_key_order<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    // Byte order of whole keys: "a-c" < "a/b" because '-' < '/'.
    let mut want = vec!["a/b", "a-c", "a/z/1", "b", "a/a", "A"];
    for k in &want {
        s.put(k, Bytes::from_static(b"x")).await.unwrap();
    }
    want.sort();
    assert_eq!(keys(&*s, "").await, want);
}

pub async fn list_by_prefix<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    for k in ["in/x/1", "in/x/2", "in/y", "inner", "out/1"] {
        s.put(k, Bytes::from_static(b"x")).await.unwrap();
    }
    assert_eq!(keys(&*s, "in/").await, ["in/x/1", "in/x/2", "in/y"]);
    assert_eq!(keys(&*s, "in/x/").await, ["in/x/1", "in/x/2"]);
    assert_eq!(keys(&*s, "in").await, ["in/x/1", "in/x/2", "in/y", "inner"]);
}

pub async fn list_streams_many<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    // More than one page of any backend (S3 pages hold 1,000 keys).
    let n = 1_100;
    for i in 0..n {
        s.put(&format!("many/{i:05}"), Bytes::from_static(b"x"))
            .await
            .unwrap();
    }
    let got = keys(&*s, "many/").await;
    assert_eq!(got.len(), n);
    assert!(got.windows(2).all(|w| w[0] < w[1]));
}

pub async fn put_replaces<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    s.put("p/0", Bytes::from_static(b"first run, longer"))
        .await
        .unwrap();
    s.put("p/0", Bytes::from_static(b"second")).await.unwrap();
    assert_eq!(&s.get("p/0").await.unwrap()[..], b"second");
    assert_eq!(keys(&*s, "p/").await, ["p/0"]);
}

pub async fn writer_appears_only_on_finish<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    let mut w = s.writer("out/result.txt").await.unwrap();
    // Large enough to need several parts on S3 (parts are at least 5 MiB).
    let piece = Bytes::from(vec![b'x'; 3 << 20]);
    for _ in 0..4 {
        w.write(piece.clone()).await.unwrap();
    }
    w.write(Bytes::from_static(b"end\n")).await.unwrap();
    assert!(matches!(
        s.get("out/result.txt").await,
        Err(StorageError::NotFound(_))
    ));
    assert_eq!(w.finish().await.unwrap(), (12 << 20) + 4);
    let body = s.get("out/result.txt").await.unwrap();
    assert_eq!(body.len(), (12 << 20) + 4);
    assert!(body.ends_with(b"xend\n"));
}

pub async fn delete_prefix_removes_only_it<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    for k in ["_parts/j/0", "_parts/j/1", "_parts/k/0", "keep"] {
        s.put(k, Bytes::from_static(b"x")).await.unwrap();
    }
    s.delete_prefix("_parts/j/").await.unwrap();
    assert_eq!(keys(&*s, "").await, ["_parts/k/0", "keep"]);
}

pub async fn escaping_keys_are_refused<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Storage>>,
{
    let s = make().await;
    for key in ["../x", "a/../../x", "/abs"] {
        assert!(
            matches!(
                s.put(key, Bytes::new()).await,
                Err(StorageError::BadKey { .. })
            ),
            "{key}"
        );
        assert!(
            matches!(s.get(key).await, Err(StorageError::BadKey { .. })),
            "{key}"
        );
    }
}
