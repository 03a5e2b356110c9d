//! `BlockBuf`: the new contents of one block of a stripe write, either computed here (parity,
//! zeros, a copy of borrowed data) or the client's bytes shared as they arrived. Parity reads
//! a shared block in place and the member write takes it as it is, so a shared payload is
//! never copied on its way to a raid4/5/6's members (doc/one-copy-write-path.md).

use bytes::Bytes;

use crate::buf::AlignedBuf;

pub(crate) enum BlockBuf {
    Owned(AlignedBuf),
    Shared(Bytes),
}

impl BlockBuf {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            BlockBuf::Owned(buf) => buf.as_slice(),
            BlockBuf::Shared(bytes) => bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// As shared bytes, without a copy.
    pub fn into_bytes(self) -> Bytes {
        match self {
            BlockBuf::Owned(buf) => Bytes::from_owner(buf),
            BlockBuf::Shared(bytes) => bytes,
        }
    }
}

impl From<AlignedBuf> for BlockBuf {
    fn from(buf: AlignedBuf) -> Self {
        BlockBuf::Owned(buf)
    }
}
