//! The thread-pool engine: blocking pread/pwrite/fdatasync/fallocate on a shared pool,
//! the fallback when io_uring is unavailable (or forced with `--io threads`).

pub(crate) mod ops;
pub(crate) mod pool;
