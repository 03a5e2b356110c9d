//! The io_uring engine: the ring thread ([`driver`]), its registered-buffer pool
//! ([`registered`]) and the `FileOps` adapter ([`ops`]). All of the crate's io_uring
//! `unsafe` lives in this module.

pub(crate) mod driver;
pub(crate) mod ops;
pub(crate) mod registered;
