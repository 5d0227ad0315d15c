//! The ledger over `rediss://` against the TLS-only Redis of `scripts/services.sh` (a private
//! CA, `tls-auth-clients yes`, a password): it works with the CA and a client certificate,
//! and a handshake that fails is said in one line naming the server and the cause, never the
//! password.
#![cfg(feature = "services")]

use fleetrun_common::ledger::redis::RedisLedger;
use fleetrun_common::ledger::{Ledger, LedgerError, Limits};
use fleetrun_common::testing::random_suffix;
use fleetrun_common::tls::{Tls, TlsCause, TlsFiles};
use fleetrun_tests::services;

fn tls(ca: &str, identity: bool) -> Tls {
    let dir = services::tls_dir();
    TlsFiles {
        ca_file: Some(dir.join(ca)),
        cert_file: identity.then(|| dir.join("client.pem")),
        key_file: identity.then(|| dir.join("client.key")),
    }
    .load()
    .expect("the test certificates (scripts/services.sh start)")
}

async fn connect(tls: &Tls) -> Result<RedisLedger, LedgerError> {
    RedisLedger::connect(
        &services::rediss_url(),
        &format!("tls-{}", random_suffix()),
        tls,
    )
    .await
}

#[tokio::test]
async fn the_ledger_over_rediss_with_a_private_ca_and_a_client_certificate_records() {
    let ledger = connect(&tls("ca.pem", true)).await.unwrap();
    ledger.create("j", Limits::NONE).await.unwrap();
    let sealed = ledger.seal("j", 0).await.unwrap();
    assert_eq!(sealed.status.total, Some(0));
}

/// The failure of connecting with `tls`: a TLS failure with `cause`, one line, no password.
async fn assert_refused(tls: &Tls, cause: TlsCause) {
    let error = connect(tls).await.err().expect("the handshake fails");
    let line = error.to_string();
    let LedgerError::Tls { cause: said, .. } = &error else {
        panic!("not a TLS failure: {line}");
    };
    assert_eq!(*said, cause, "{line}");
    assert!(!line.contains('\n') && line.contains("127.0.0.1"), "{line}");
    assert!(!line.contains("secret"), "{line}");
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_said_to_be_of_an_unknown_ca() {
    assert_refused(&tls("other-ca.pem", true), TlsCause::UnknownCa).await;
}

#[tokio::test]
async fn a_server_that_asks_for_a_client_certificate_says_so_when_none_is_shown() {
    assert_refused(&tls("ca.pem", false), TlsCause::NoClientCertificate).await;
}
