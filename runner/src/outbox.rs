//! The runner's replies on their way to the agent: each written at once, or, when the
//! agent allows it (`InitParams::hold_replies`) and the next request is already in hand,
//! held back and sent with the replies after it, up to [`HELD_REPLIES`] in one write. A
//! thread of its own sends what was held once the first of it has waited [`HOLD_LIMIT`],
//! so a run that takes long, or hangs, never keeps the replies before it from the agent.
//!
//! That thread looks every [`HOLD_LIMIT`] while replies are being held, and is not woken
//! for each: a wake per reply would cost what holding saves. After [`IDLE_LOOKS`] looks
//! that found nothing held it sleeps until the next reply is held.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use fleetrun_common::protocol::{HELD_REPLIES, HOLD_LIMIT};

/// Looks that found nothing held before the flusher sleeps until told.
const IDLE_LOOKS: u32 = 10;

pub struct Outbox {
    shared: Arc<Shared>,
    /// Replies held back, as this side last left them (the flusher may have sent them
    /// since): lets the runner skip the lock when it holds nothing.
    held_here: AtomicBool,
    flusher: Option<JoinHandle<()>>,
}

struct Shared {
    channel: UnixStream,
    state: Mutex<State>,
    /// Told when something is held, and when the outbox closes.
    held: Condvar,
}

#[derive(Default)]
struct State {
    /// Replies held back, framed, in order.
    bytes: Vec<u8>,
    count: usize,
    /// When the first of them was held.
    since: Option<Instant>,
    /// Why the flusher could not write what was held: said at the next send.
    failed: Option<io::Error>,
    /// The flusher sleeps until told that something is held.
    parked: bool,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes what is held and `frame` (if any) in one write; the lock is held meanwhile, so
    /// replies keep their order. A reply with nothing held before it is written as it is,
    /// not copied.
    fn write(&self, state: &mut State, frame: &[u8]) -> io::Result<()> {
        if let Some(e) = state.failed.take() {
            return Err(e);
        }
        if state.bytes.is_empty() {
            return (&self.channel).write_all(frame);
        }
        state.bytes.extend_from_slice(frame);
        let result = (&self.channel).write_all(&state.bytes);
        state.bytes.clear();
        state.count = 0;
        state.since = None;
        result
    }
}

impl Outbox {
    /// An outbox on `channel`; `hold`: replies may be held back (a thread then sends what
    /// waits too long).
    pub fn new(channel: &UnixStream, hold: bool) -> io::Result<Outbox> {
        let shared = Arc::new(Shared {
            channel: channel.try_clone()?,
            state: Mutex::new(State::default()),
            held: Condvar::new(),
        });
        let flusher = if hold {
            let shared = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("fleetrun-replies".to_owned())
                    .spawn(move || flush_late(&shared))?,
            )
        } else {
            None
        };
        Ok(Outbox {
            shared,
            flusher,
            held_here: AtomicBool::new(false),
        })
    }

    /// Whether replies may be held back.
    pub fn holds(&self) -> bool {
        self.flusher.is_some()
    }

    /// Sends `frame`, after whatever is held, now.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        let mut state = self.shared.lock();
        self.held_here.store(false, Relaxed);
        self.shared.write(&mut state, frame)
    }

    /// Holds `frame` back to go with the next reply; sends it with those held before once
    /// [`HELD_REPLIES`] are in hand.
    pub fn hold(&self, frame: &[u8]) -> io::Result<()> {
        let mut state = self.shared.lock();
        if state.count + 1 >= HELD_REPLIES {
            self.held_here.store(false, Relaxed);
            return self.shared.write(&mut state, frame);
        }
        self.held_here.store(true, Relaxed);
        state.bytes.extend_from_slice(frame);
        state.count += 1;
        if state.since.is_none() {
            state.since = Some(Instant::now());
        }
        if std::mem::take(&mut state.parked) {
            self.shared.held.notify_one();
        }
        Ok(())
    }

    /// Whether this side left replies held back (the flusher may have sent them since).
    pub fn held(&self) -> bool {
        self.held_here.load(Relaxed)
    }

    /// Sends what is held now: before the runner waits for a request, and before it ends.
    pub fn flush(&self) -> io::Result<()> {
        if !self.held_here.swap(false, Relaxed) {
            return Ok(());
        }
        let mut state = self.shared.lock();
        if state.count == 0 && state.failed.is_none() {
            return Ok(());
        }
        self.shared.write(&mut state, &[])
    }

    /// Whether some reply is held back.
    #[cfg(test)]
    fn holding(&self) -> bool {
        self.shared.lock().count > 0
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.held.notify_one();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

/// The flusher: sends what was held once its first reply has waited [`HOLD_LIMIT`],
/// looking every [`HOLD_LIMIT`] while replies come, sleeping when they stop.
fn flush_late(shared: &Shared) {
    let mut state = shared.lock();
    let mut idle = 0;
    loop {
        if state.closed {
            return;
        }
        match state.since {
            Some(since) if since.elapsed() >= HOLD_LIMIT => {
                idle = 0;
                if let Err(e) = shared.write(&mut state, &[]) {
                    state.failed = Some(e);
                }
            }
            Some(_) => idle = 0,
            None => idle += 1,
        }
        state = if idle >= IDLE_LOOKS {
            idle = 0;
            state.parked = true;
            shared.held.wait(state).unwrap_or_else(|p| p.into_inner())
        } else {
            shared
                .held
                .wait_timeout(state, HOLD_LIMIT)
                .unwrap_or_else(|p| p.into_inner())
                .0
        };
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::Duration;

    use super::*;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (a, b)
    }

    #[test]
    fn held_replies_go_out_together_and_in_order() {
        let (a, b) = pair();
        let outbox = Outbox::new(&a, true).unwrap();
        outbox.hold(b"one ").unwrap();
        outbox.hold(b"two ").unwrap();
        outbox.send(b"three").unwrap();
        let mut got = vec![0; 13];
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(got, b"one two three");
        assert!(!outbox.holding());
    }

    #[test]
    fn the_last_of_held_replies_sends_them_all() {
        let (a, b) = pair();
        let outbox = Outbox::new(&a, true).unwrap();
        for _ in 0..HELD_REPLIES - 1 {
            outbox.hold(b"r").unwrap();
        }
        assert!(outbox.holding());
        outbox.hold(b"r").unwrap();
        assert!(!outbox.holding());
        let mut got = vec![0; HELD_REPLIES];
        (&b).read_exact(&mut got).unwrap();
    }

    /// A held reply reaches the agent about HOLD_LIMIT later even when nothing follows it
    /// (the next run hangs).
    #[test]
    fn a_held_reply_goes_out_on_its_own_once_it_waited_too_long() {
        let (a, b) = pair();
        let outbox = Outbox::new(&a, true).unwrap();
        outbox.hold(b"alone").unwrap();
        let mut got = vec![0; 5];
        // Bounded by the read timeout: a reply never sent fails here.
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(got, b"alone");
        assert!(!outbox.holding());
    }
}
