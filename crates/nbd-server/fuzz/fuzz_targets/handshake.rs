//! The handshake state machine over arbitrary client bytes (see `nbd_server::fuzzing::handshake`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nbd_server::fuzzing::handshake(data));
