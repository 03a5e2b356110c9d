//! READ reply framing round trip (see `nbd_server::fuzzing::read_replies`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nbd_server::fuzzing::read_replies(data));
