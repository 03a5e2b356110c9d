//! The NBD wire format, free of I/O: constants, handshake codec, request decoding and
//! validation, reply encoding — and the client's side (`client_codec`: greeting, options,
//! info replies, request encoding, reply chunk payloads), so a client shares one codec with
//! the server. Everything here is a pure function over byte buffers (check-then-parse),
//! which is what the fuzz targets drive.

pub mod client_codec;
pub mod consts;
pub mod framing;
pub mod handshake_codec;
pub mod read_reply;
pub mod reply;
pub mod request;
