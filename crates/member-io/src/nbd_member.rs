//! [`NbdMember`]: a member that is an NBD export on another host (network RAID), reached with
//! nbd-client over `nbd://HOST[:PORT]/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`.
//!
//! Requests are split at the export's maximum payload; alignment is the export's minimum
//! block (at most 4096). Member `discard` and `write_zeroes` must leave zeros, which NBD's
//! TRIM does not promise, so both are WRITE_ZEROES (without and with NO_HOLE), or zero
//! writes when the export has no WRITE_ZEROES. FUA and FLUSH pass through. A connection that
//! breaks fails every request on it; reconnecting and member timeouts are not done yet
//! (issue 15), so a lost connection is a failed member.

use std::io;

use bytes::Bytes;
use nbd_client::{Client, ClientConfig, ExportAddress};
use raid_core::AlignedBuf;
use raid_core::member::{BufResult, IoFuture, Member, check_range};

use crate::error::Result;

/// Zero writes (export without WRITE_ZEROES) go out in pieces of at most this many bytes.
const ZERO_PIECE_BYTES: u64 = 1 << 20;

pub struct NbdMember {
    name: String,
    client: Client,
    len_bytes: u64,
    alignment: usize,
    /// Largest piece of one READ/WRITE (the export's maximum payload, whole alignments).
    piece_bytes: u64,
}

impl NbdMember {
    /// Connects to the export at `uri`.
    pub async fn connect(uri: &str) -> Result<Self> {
        let address = ExportAddress::parse(uri)?;
        let client = Client::connect(&address, &ClientConfig::default()).await?;
        let d = *client.details();
        if d.min_block_bytes > 4096 {
            return Err(nbd_client::ClientError::Invalid {
                address: uri.to_string(),
                what: format!("a minimum block of {} bytes (members take at most 4096)", d.min_block_bytes),
            }
            .into());
        }
        let alignment = d.min_block_bytes as usize;
        let piece_bytes = u64::from(d.max_payload_bytes).min(32 << 20) / alignment as u64 * alignment as u64;
        tracing::info!(
            member = uri,
            len_bytes = d.size_bytes,
            min_block = d.min_block_bytes,
            max_payload = d.max_payload_bytes,
            read_only = d.read_only(),
            "NBD member connected"
        );
        Ok(Self {
            name: uri.to_string(),
            client,
            len_bytes: d.size_bytes,
            alignment,
            piece_bytes: piece_bytes.max(alignment as u64),
        })
    }

    /// Whether the export refuses writes.
    pub fn read_only(&self) -> bool {
        self.client.details().read_only()
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(&self.name, self.len_bytes, offset, len)
    }

    async fn zero(&self, offset: u64, len: u64, may_deallocate: bool) -> io::Result<()> {
        self.check(offset, len)?;
        let can_zero = self.client.details().can_write_zeroes();
        let mut at = 0;
        while at < len {
            let n = (len - at).min(if can_zero { u64::from(u32::MAX) / 2 / 4096 * 4096 } else { ZERO_PIECE_BYTES });
            if can_zero {
                self.client.write_zeroes(offset + at, n as u32, may_deallocate, false).await?;
            } else {
                self.client.write(offset + at, Bytes::from(vec![0u8; n as usize]), false).await?;
            }
            at += n;
        }
        Ok(())
    }
}

impl Member for NbdMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn read_at(&self, offset_bytes: u64, mut buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let len = buf.len() as u64;
            if let Err(e) = self.check(offset_bytes, len) {
                return (Err(e), buf);
            }
            let mut at = 0;
            while at < len {
                let n = (len - at).min(self.piece_bytes);
                match self.client.read(offset_bytes + at, n as u32).await {
                    Ok(data) => buf.as_mut_slice()[at as usize..(at + n) as usize].copy_from_slice(&data),
                    Err(e) => return (Err(e.into()), buf),
                }
                at += n;
            }
            (Ok(()), buf)
        })
    }

    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let result = self.write_slice_at(offset_bytes, buf.as_slice(), fua).await;
            (result, buf)
        })
    }

    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> IoFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let len = data.len() as u64;
            self.check(offset_bytes, len)?;
            let mut at = 0;
            while at < len {
                let n = (len - at).min(self.piece_bytes);
                let piece = Bytes::copy_from_slice(&data[at as usize..(at + n) as usize]);
                self.client.write(offset_bytes + at, piece, fua).await?;
                at += n;
            }
            Ok(())
        })
    }

    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        // An export without FLUSH has no write cache: its writes are durable when answered.
        Box::pin(async move { if self.client.details().can_flush() { Ok(self.client.flush().await?) } else { Ok(()) } })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, true))
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, false))
    }
}
