//! A stream of runner protocol frames (length-prefixed MessagePack), read as the agent reads
//! a runner's replies and as a runner reads the agent's requests: any bytes end in frames, a
//! clean end or an error, never a panic. The first byte picks the direction.
//!
//! Compiles `common/src/protocol.rs` (and the `wire.rs` and `python.rs` it names) directly; see
//! `wire.rs` beside this file for why.
#![no_main]

#[allow(dead_code)]
#[path = "../../common/src/wire.rs"]
mod wire;

#[allow(dead_code)]
#[path = "../../common/src/python.rs"]
mod python;

#[allow(dead_code)]
#[path = "../../common/src/protocol.rs"]
mod protocol;

use libfuzzer_sys::fuzz_target;
use protocol::{Reply, Request, read_frame};

/// Frames a stream may hold before the target stops reading it.
const MAX_FRAMES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&direction, stream)) = data.split_first() else {
        return;
    };
    let mut stream = std::io::Cursor::new(stream);
    for _ in 0..MAX_FRAMES {
        let read = if direction & 1 == 0 {
            read_frame::<_, Request>(&mut stream).map(|r| r.is_some())
        } else {
            read_frame::<_, Reply>(&mut stream).map(|r| r.is_some())
        };
        if !matches!(read, Ok(true)) {
            break;
        }
    }
});
