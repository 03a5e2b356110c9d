//! The error of a read that found bytes that do not match their checksums.

use std::fmt;
use std::io;

/// Blocks of a member that hold wrong bytes: `[offset_bytes, +len_bytes)` of the device, 4 KiB
/// aligned, from the first wrong block of a read to its last. Travels inside an
/// `io::Error` of kind `InvalidData` ([`corruption_of`] finds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub member: String,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: bytes {}..{} do not match their checksums (silent corruption)",
            self.member,
            self.offset_bytes,
            self.offset_bytes + self.len_bytes
        )
    }
}

impl std::error::Error for Corruption {}

impl Corruption {
    pub fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }
}

/// The corruption an I/O error reports, if it is one.
pub fn corruption_of(error: &io::Error) -> Option<&Corruption> {
    error.get_ref()?.downcast_ref::<Corruption>()
}
