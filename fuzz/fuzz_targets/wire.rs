//! A queue message's body, as a worker receives it: decoding any bytes returns a message or
//! an error (the message is dead-lettered), never panics; a message that decodes encodes
//! and decodes to itself.
//!
//! The target compiles `common/src/wire.rs` itself rather than depending on
//! `fleetrun-common`, whose seams pull in the AWS SDK, lapin and redis: building those with
//! coverage instrumentation would cost CI minutes for code no target calls.
#![no_main]

#[allow(dead_code)]
#[path = "../../common/src/wire.rs"]
mod wire;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    if let Ok(message) = wire::MiniBatch::decode(body) {
        let again =
            wire::MiniBatch::decode(&message.encode()).expect("a decoded message re-encodes");
        assert_eq!(again, message);
        let _ = message.chunks.iter().map(wire::Chunk::describe).count();
    }
});
