//! Integration tests of nbd-server, one test binary (saves link time on 2 cores).
//!
//! - `client_codec`: a minimal client made of `protocol::client_codec` alone against the server.
//! - `python`: python3-libnbd conformance scripts in `tests/py/` (handshake variants,
//!   every command, flag and error, pipelining, multi-conn).
//! - `tools`: real clients: nbdinfo, nbdcopy, qemu-io, fio, nbdfuse + losetup + mkfs.ext4.
//! - `tls`: STARTTLS byte by byte with a rustls client: replies per mode, state reset,
//!   client certificates, per-export rules, the address allow list.
//! - `raw`: hand-made bytes over TCP/Unix for what no client sends (garbage, truncation,
//!   absurd lengths, wrap-around offsets), plus pipelining depth, backpressure, limits and
//!   shutdown, observed through instrumented devices.
//!
//! A missing tool makes its test fail with the Debian package to install; nothing is
//! skipped silently.

mod client_codec;
mod python;
mod raw;
mod tls;
mod tools;
mod util;
