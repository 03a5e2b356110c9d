//! The reply reader over arbitrary server bytes and requests in flight (see
//! `nbd_client::fuzzing::replies`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nbd_client::fuzzing::replies(data);
});
