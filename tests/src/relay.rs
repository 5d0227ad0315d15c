//! A TCP relay a test puts between clients and a server on loopback: one address that can be
//! moved to another server (as a failover behind a load balancer or a Kubernetes Service
//! moves it), whose traffic can be stalled (a link that stops carrying bytes, the kernel
//! keeping what was sent), whose connections can be cut, and that can take connections and
//! never answer them (a server that hangs).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often an idle relay thread looks at its flags.
const TICK: Duration = Duration::from_millis(10);

pub struct Relay {
    port: u16,
    state: Arc<State>,
}

struct State {
    target: AtomicU16,
    stalled: AtomicBool,
    closed: AtomicBool,
    /// New connections are taken and never answered.
    swallowing: AtomicBool,
    /// Both ends of every connection relayed, to cut them.
    streams: Mutex<Vec<TcpStream>>,
    /// The connections taken while swallowing: open, unanswered, until the relay goes.
    swallowed: Mutex<Vec<TcpStream>>,
}

impl Relay {
    /// A relay on a free loopback port to the server on `target`.
    pub fn to(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            target: AtomicU16::new(target),
            stalled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            swallowing: AtomicBool::new(false),
            streams: Mutex::new(Vec::new()),
            swallowed: Mutex::new(Vec::new()),
        });
        let accepting = state.clone();
        std::thread::spawn(move || accept(listener, accepting));
        Relay { port, state }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// New connections go to the server on `target`; the open ones stay where they are
    /// until [`Relay::cut`].
    pub fn retarget(&self, target: u16) {
        self.state.target.store(target, Ordering::SeqCst);
    }

    /// Stops carrying bytes either way: what is sent waits in the kernel's buffers.
    pub fn stall(&self) {
        self.state.stalled.store(true, Ordering::SeqCst);
    }

    /// Carries bytes again.
    pub fn resume(&self) {
        self.state.stalled.store(false, Ordering::SeqCst);
    }

    /// Takes the connections that come from now on and never answers them, nor closes them
    /// while the relay lives (`false`: relays new ones again; those taken stay unanswered).
    pub fn swallow(&self, swallowing: bool) {
        self.state.swallowing.store(swallowing, Ordering::SeqCst);
    }

    /// Closes every connection relayed so far, both ends, dropping what waited in them.
    pub fn cut(&self) {
        let streams = std::mem::take(&mut *self.state.streams.lock().unwrap());
        for stream in streams {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.closed.store(true, Ordering::SeqCst);
        self.cut();
    }
}

fn accept(listener: TcpListener, state: Arc<State>) {
    while !state.closed.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(TICK);
                continue;
            }
            Err(_) => return,
        };
        if state.swallowing.load(Ordering::SeqCst) {
            state.swallowed.lock().unwrap().push(client);
            continue;
        }
        let target = SocketAddr::from(([127, 0, 0, 1], state.target.load(Ordering::SeqCst)));
        let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
            // As a relay to a dead server does: the client's connection closes.
            continue;
        };
        let _ = client.set_nonblocking(false);
        {
            let mut streams = state.streams.lock().unwrap();
            streams.push(client.try_clone().unwrap());
            streams.push(server.try_clone().unwrap());
        }
        for (from, to) in [
            (client.try_clone().unwrap(), server.try_clone().unwrap()),
            (server, client),
        ] {
            let state = state.clone();
            std::thread::spawn(move || pump(from, to, &state));
        }
    }
}

/// Copies `from` to `to` while neither end closed, holding off while stalled.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &State) {
    from.set_read_timeout(Some(TICK)).unwrap();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if state.stalled.load(Ordering::SeqCst) {
            if state.closed.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(TICK);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
