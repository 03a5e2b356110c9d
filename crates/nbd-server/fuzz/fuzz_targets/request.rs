//! Request decoding and validation over arbitrary bytes and export limits, plus block status
//! encoding (see `nbd_server::fuzzing::{requests, extents}`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nbd_server::fuzzing::requests(data);
    nbd_server::fuzzing::extents(data);
});
