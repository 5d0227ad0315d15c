//! `AmqpQueue` over TLS against the TLS-only RabbitMQ of `scripts/services.sh` (a private CA,
//! `verify_peer` and `fail_if_no_peer_cert`), and each way a handshake fails, said in one line
//! naming the node and the cause, never the password. The server certificates a client must
//! refuse are served by `openssl s_server`.
#![cfg(feature = "services")]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetrun_common::queue::amqp::{AmqpQueue, TlsCause};
use fleetrun_common::queue::{Queue, QueueError, QueueOptions};
use fleetrun_common::report::one_line;
use fleetrun_common::testing::random_suffix;
use fleetrun_common::tls::{Tls, TlsFiles};
use fleetrun_tests::{KillOnDrop, services, wait_for};

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

async fn connect(url: &str, tls: &Tls) -> Result<AmqpQueue, QueueError> {
    let pool = format!("tls-{}", random_suffix());
    AmqpQueue::connect(url, &pool, QueueOptions::default(), None, tls).await
}

/// The failure of connecting to `url` with `tls`: a TLS failure at `node` with one of
/// `causes`, said in one line without the password.
async fn assert_refused(url: &str, tls: &Tls, node: &str, causes: &[TlsCause]) {
    let error = connect(url, tls).await.err().expect("the handshake fails");
    let line = one_line(&error);
    let QueueError::Tls(failure) = &error else {
        panic!("not a TLS failure: {line}");
    };
    assert_eq!(failure.node, node, "{line}");
    assert!(causes.contains(&failure.cause), "{line}");
    assert!(!line.contains('\n') && line.contains(node), "{line}");
    assert!(!line.contains("secret"), "{line}");
}

#[tokio::test]
async fn a_queue_over_amqps_with_a_client_certificate_publishes_and_consumes() {
    let queue = connect(&services::amqps_url(), &tls("ca.pem", true))
        .await
        .expect("connect over TLS");
    queue.publish("lane", b"over tls".to_vec()).await.unwrap();
    let mut consumer = queue.consume("lane", 1).await.unwrap();
    let delivery = consumer.next().await.expect("a delivery");
    assert_eq!(&delivery.body[..], b"over tls");
    drop((delivery, consumer));
    queue.delete().await.unwrap();
}

/// `auth_mechanism=external`: the broker takes the client certificate's name
/// (`fleetrun-client`) as the user, and no password is sent.
#[tokio::test]
async fn the_client_certificate_alone_logs_in_with_auth_mechanism_external() {
    let url = services::amqps_url();
    let parsed = reqwest::Url::parse(&url).unwrap();
    let external = format!(
        "amqps://{}:{}/%2f?auth_mechanism=external",
        parsed.host_str().unwrap(),
        parsed.port().unwrap()
    );
    let queue = connect(&external, &tls("ca.pem", true))
        .await
        .expect("log in by certificate");
    queue.delete().await.unwrap();
}

#[tokio::test]
async fn a_server_signed_by_an_unknown_ca_is_refused_naming_it() {
    let url = services::amqps_url();
    assert_refused(
        &url,
        &tls("other-ca.pem", true),
        &node_of(&url),
        &[TlsCause::UnknownCa],
    )
    .await;
}

#[tokio::test]
async fn a_server_that_requires_a_client_certificate_says_so_when_none_is_given() {
    let url = services::amqps_url();
    assert_refused(
        &url,
        &tls("ca.pem", false),
        &node_of(&url),
        // Its alert, or the reset that can overtake it.
        &[
            TlsCause::NoClientCertificate,
            TlsCause::ClosedWithoutCertificate,
        ],
    )
    .await;
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused_naming_it() {
    let server = SServer::start("expired");
    let url = server.url();
    assert_refused(
        &url,
        &tls("ca.pem", true),
        &node_of(&url),
        &[TlsCause::Expired],
    )
    .await;
}

#[tokio::test]
async fn a_server_certificate_for_another_name_is_refused_naming_it() {
    let server = SServer::start("elsewhere");
    let url = server.url();
    assert_refused(
        &url,
        &tls("ca.pem", true),
        &node_of(&url),
        &[TlsCause::WrongName],
    )
    .await;
}

fn node_of(url: &str) -> String {
    let parsed = reqwest::Url::parse(url).unwrap();
    format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap())
}

/// `openssl s_server` with the test certificate `name` on a free loopback port.
struct SServer {
    _child: KillOnDrop,
    port: u16,
}

impl SServer {
    fn start(name: &str) -> SServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = services::tls_dir();
        let file = |ext: &str| dir.join(format!("{name}.{ext}"));
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(file("pem"))
            .arg("-key")
            .arg(file("key"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl runs");
        let server = SServer {
            _child: KillOnDrop(child),
            port,
        };
        wait_for(
            "openssl s_server to listen",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        assert!(Path::new(&file("pem")).exists());
        server
    }

    fn url(&self) -> String {
        format!("amqps://u:secret@127.0.0.1:{}/%2f", self.port)
    }
}
