//! Recognising a member when its server comes back: its md superblock area (4 KiB at
//! 4 KiB, which every superblock write goes through this member to) must read as this member
//! last wrote or read it, or as a superblock write in flight would leave it. A server
//! restarted empty or with another disk is refused instead of serving its zeros.

use std::ops::Range;

use nbd_client::{Client, ClientError};
use raid_core::md::{SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES};

/// The bytes that identify a member.
pub(super) const IDENTITY: Range<u64> = SUPERBLOCK_BYTE_OFFSET..SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64;

/// The member's superblock area as last seen.
#[derive(Default)]
pub(super) struct Identity {
    acked: Option<Vec<u8>>,
    /// A write of the area in flight.
    pending: Option<Vec<u8>>,
}

/// Why a server that answered is not this member.
pub(super) type Mismatch = String;

impl Identity {
    pub(super) fn new(acked: Option<Vec<u8>>) -> Self {
        Self { acked, pending: None }
    }

    /// A write of `data` at `offset` is about to go out; `true` if it covers the whole area.
    pub(super) fn writing(&mut self, offset: u64, data: &[u8]) -> bool {
        let end = offset + data.len() as u64;
        if offset <= IDENTITY.start && end >= IDENTITY.end {
            let at = (IDENTITY.start - offset) as usize;
            self.pending = Some(data[at..at + SUPERBLOCK_BYTES].to_vec());
            true
        } else {
            if offset < IDENTITY.end && end > IDENTITY.start {
                // Part of the area: what it holds now is not known here.
                self.acked = None;
            }
            false
        }
    }

    /// The write that covered the area finished (`ok`: the server acknowledged it).
    pub(super) fn written(&mut self, ok: bool) {
        let pending = self.pending.take();
        if ok {
            self.acked = pending;
        }
    }

    /// `data` was read at `offset`: what the area holds, if it covers it and no write of it
    /// is in flight.
    pub(super) fn seen(&mut self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        if offset <= IDENTITY.start && end >= IDENTITY.end && self.pending.is_none() {
            let at = (IDENTITY.start - offset) as usize;
            self.acked = Some(data[at..at + SUPERBLOCK_BYTES].to_vec());
        }
    }

    /// Whether a server whose area reads `now` is this member.
    pub(super) fn recognise(&self, now: Option<&[u8]>) -> Result<(), Mismatch> {
        match (&self.acked, now) {
            (Some(known), Some(now)) if known == now || self.pending.as_deref() == Some(now) => Ok(()),
            (None, _) | (_, None) => Err("the member's superblock area is not known here".into()),
            _ => Err("the export came back with other contents (its superblock area changed)".into()),
        }
    }
}

/// The superblock area of the export behind `client` (`None` if the export is too small).
pub(super) async fn read_identity(client: &Client, len_bytes: u64) -> Result<Option<Vec<u8>>, ClientError> {
    if len_bytes < IDENTITY.end {
        return Ok(None);
    }
    Ok(Some(client.read(IDENTITY.start, SUPERBLOCK_BYTES as u32).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_known_by_what_was_last_written_or_read_or_is_being_written() {
        let old = vec![1u8; SUPERBLOCK_BYTES];
        let new = vec![2u8; SUPERBLOCK_BYTES];
        let mut id = Identity::new(Some(old.clone()));
        assert!(id.recognise(Some(&old)).is_ok());
        assert!(id.recognise(Some(&new)).is_err());
        assert!(id.writing(IDENTITY.start, &new));
        assert!(id.recognise(Some(&old)).is_ok() && id.recognise(Some(&new)).is_ok(), "either, while in flight");
        id.written(true);
        assert!(id.recognise(Some(&old)).is_err() && id.recognise(Some(&new)).is_ok());
        assert!(!id.writing(IDENTITY.start + 512, &[0u8; 512]));
        assert!(id.recognise(Some(&new)).is_err(), "a partial write makes the area unknown");
        id.seen(0, &[[0u8; 4096], [3u8; 4096]].concat());
        assert!(id.recognise(Some(&[3u8; SUPERBLOCK_BYTES])).is_ok());
        assert!(id.recognise(None).is_err());
    }
}
