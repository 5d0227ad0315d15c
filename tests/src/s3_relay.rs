//! A fault relay in front of an S3 server, as a busy S3 and a bad minute of its endpoint
//! look to a client: it forwards each HTTP request to the server, but answers a share of them
//! itself with 503 SlowDown or 500 InternalError (in turn), and while it is down it resets
//! every connection, open or new (TCP RST, as a crashed load balancer gives). It can also
//! be slow: hold every GET of an object under a prefix for a set time before forwarding it
//! ([`S3Relay::slow_gets`]), as a far or busy store stages inputs slowly.
//!
//! It runs on a runtime of its own, so a test of any kind (plain or `#[tokio::test]`) starts
//! it; dropping it stops it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

type Body = BoxBody<Bytes, hyper::Error>;

/// What the relay did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayCounts {
    /// Requests passed to the server.
    pub forwarded: u64,
    /// Requests answered 503 SlowDown or 500 InternalError.
    pub errors: u64,
    /// Connections reset while down.
    pub resets: u64,
}

struct State {
    upstream: String,
    /// Of every this many requests, one is answered with an error (0: none).
    error_every: u64,
    down: watch::Sender<bool>,
    requests: AtomicU64,
    forwarded: AtomicU64,
    errors: AtomicU64,
    resets: AtomicU64,
    /// GETs of paths starting with this are held this long before they are forwarded.
    slow_gets: Mutex<Option<(String, Duration)>>,
    client: Client<HttpConnector, Incoming>,
}

/// A running relay; see the module's documentation.
pub struct S3Relay {
    addr: SocketAddr,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl S3Relay {
    /// A relay on a free loopback port in front of the S3 server at `upstream`
    /// (`http://host:port`), answering one request of every `error_every` with an error
    /// (0: none).
    pub fn start(upstream: &str, error_every: u64) -> S3Relay {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the relay");
        let (down, _) = watch::channel(false);
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            error_every,
            down,
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            slow_gets: Mutex::new(None),
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        // Bound here, not on the runtime: a test on a runtime of its own may start a relay.
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port for the relay");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the relay's address");
        runtime.spawn(accept(listener, state.clone()));
        S3Relay {
            addr,
            state,
            runtime: Some(runtime),
        }
    }

    /// The URL to give clients instead of the server's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Takes the relay down (every connection reset, open or new) or up again.
    pub fn down(&self, down: bool) {
        self.state.down.send_replace(down);
    }

    /// Holds every GET whose path (`/bucket/key`) starts with `prefix` for `by` before
    /// forwarding it; listings (`/bucket?list-type=2…`) and writes go at once.
    pub fn slow_gets(&self, prefix: &str, by: Duration) {
        *self.state.slow_gets.lock().unwrap() = Some((prefix.to_owned(), by));
    }

    pub fn counts(&self) -> RelayCounts {
        let s = &self.state;
        RelayCounts {
            forwarded: s.forwarded.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            resets: s.resets.load(Ordering::Relaxed),
        }
    }
}

impl Drop for S3Relay {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept(listener: std::net::TcpListener, state: Arc<State>) {
    let listener = TcpListener::from_std(listener).expect("a listener on the relay's runtime");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        if *state.down.borrow() {
            reset(&state, stream.as_raw_fd());
            continue;
        }
        tokio::spawn(serve(stream, state.clone()));
    }
}

/// Serves one client connection until it closes, or resets it when the relay goes down.
async fn serve(stream: TcpStream, state: Arc<State>) {
    let fd = stream.as_raw_fd();
    let mut down = state.down.subscribe();
    let relay = state.clone();
    let service = service_fn(move |request| answer(relay.clone(), request));
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        _ = down.wait_for(|down| *down) => {
            // The socket is still open (the connection owns it until this returns).
            reset(&state, fd);
        }
    }
}

/// Makes closing the socket `fd` reset the connection (SO_LINGER of 0), and counts it.
fn reset(state: &State, fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `fd` is an open socket its caller owns; the option's value outlives the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    state.resets.fetch_add(1, Ordering::Relaxed);
}

async fn answer(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let n = state.requests.fetch_add(1, Ordering::Relaxed);
    if state.error_every > 0 && mix(n).is_multiple_of(state.error_every) {
        state.errors.fetch_add(1, Ordering::Relaxed);
        // The body read first, so the connection stays usable, as S3's does.
        let _ = request.into_body().collect().await;
        return Ok(fault(n));
    }
    let hold = match &*state.slow_gets.lock().unwrap() {
        Some((prefix, by))
            if request.method() == hyper::Method::GET
                && request.uri().path().starts_with(prefix.as_str()) =>
        {
            Some(*by)
        }
        _ => None,
    };
    if let Some(by) = hold {
        tokio::time::sleep(by).await;
    }
    Ok(match forward(&state, request).await {
        Ok(response) => {
            state.forwarded.fetch_add(1, Ordering::Relaxed);
            response.map(BodyExt::boxed)
        }
        Err(e) => plain(StatusCode::BAD_GATEWAY, format!("relay: {e}")),
    })
}

async fn forward(
    state: &State,
    mut request: Request<Incoming>,
) -> Result<Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    *request.uri_mut() = format!("{}{path}", state.upstream).parse()?;
    // The Host header stays the client's: it is part of what the client signed.
    Ok(state.client.request(request).await?)
}

/// S3's answer to a request it throttles or fails: 503 SlowDown and 500 InternalError in
/// turn.
fn fault(n: u64) -> Response<Body> {
    let (status, code, message) = if n.is_multiple_of(2) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "Please reduce your request rate.",
        )
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "We encountered an internal error. Please try again.",
        )
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>relay-{n}</RequestId></Error>"
    );
    let mut response = plain(status, body);
    response
        .headers_mut()
        .insert("content-type", "application/xml".parse().unwrap());
    response
}

fn plain(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// SplitMix64's finaliser: which requests fail looks random, and is the same on every run.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
