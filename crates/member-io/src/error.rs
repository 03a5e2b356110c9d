//! The crate's one error type, for opening members and configuring backends.
//!
//! Member *operations* return `std::io::Error` (that is the `raid_core::Member` contract);
//! [`MemberIoError`] covers everything before a member exists: parsing options, probing
//! io_uring, opening files, starting the ring thread.
//!
//! ```text
//! MemberIoError
//!  ├─ Nbd ── an NBD member (nbd://, nbd+unix://) that cannot be reached or negotiated
//!  ├─ Open / Create / Stat ── io::Error on a path (source kept)
//!  ├─ NotFileOrBlockDevice / UnsupportedAlignment / DirectIoRefused ── the path is unusable as asked
//!  ├─ UringUnavailable ── `--io uring` forced but the probe failed (reason carries errno + fix)
//!  ├─ RingSetup ── the ring thread could not be started
//!  └─ InvalidOption ── a CLI/env value that does not parse
//! ```

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemberIoError {
    /// A member that is an NBD export could not be reached or negotiated.
    #[error("cannot open NBD member: {0}")]
    Nbd(#[from] nbd_client::ClientError),

    #[error("cannot open member {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot create member file {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot inspect member {path}: {source}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("member {path} is neither a regular file nor a block device")]
    NotFileOrBlockDevice { path: PathBuf },

    #[error("member {path} needs O_DIRECT alignment of {align_bytes} bytes; at most 4096 is supported")]
    UnsupportedAlignment { path: PathBuf, align_bytes: u64 },

    #[error("member {path}: the filesystem refuses O_DIRECT ({source}); use direct=auto or direct=off")]
    DirectIoRefused {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("io_uring requested but unavailable: {reason}")]
    UringUnavailable { reason: String },

    #[error("cannot start the io_uring thread: {source}")]
    RingSetup {
        #[source]
        source: io::Error,
    },

    #[error("invalid option: {0}")]
    InvalidOption(String),
}

pub type Result<T, E = MemberIoError> = std::result::Result<T, E>;
