//! Dispatch: one validated request against the device, in device-sized pieces, and the reply
//! it gets (data, status, or the device error mapped once, `protocol::read_reply`).

use std::sync::Arc;

use bytes::Bytes;
use tracing::debug;

use super::connection::Payload;
use crate::device::{BlockDevice, DeviceError, DeviceErrorKind, DeviceResult, ReadChunk};
use crate::protocol::consts::BASE_ALLOCATION_ID;
use crate::protocol::framing::ReplyTo;
use crate::protocol::read_reply::{push_device_error, read_reply};
use crate::protocol::reply::{Reply, encode_descriptors, encode_extents};
use crate::protocol::request::{Rejection, Request};

/// Longest range one BLOCK_STATUS answer describes (a reply may cover less than asked;
/// aligned to any minimum block size).
const MAX_BLOCK_STATUS_BYTES: u64 = 1 << 31;

/// The reply to a request refused before reaching the device.
pub(super) fn rejection_reply(to: ReplyTo, rejection: Rejection) -> Reply {
    let mut reply = Reply::with_capacity(1);
    reply.push_error(to, rejection.errno, rejection.message, None);
    reply
}

/// What a spawned request needs.
pub(super) struct RequestCtx {
    pub(super) device: Arc<dyn BlockDevice>,
    pub(super) to: ReplyTo,
    /// Largest READ/WRITE handed to the device at once.
    pub(super) piece_bytes: u32,
    /// The meta contexts selected: BLOCK_STATUS answers one chunk for each.
    pub(super) meta_contexts: u32,
}

impl RequestCtx {
    pub(super) async fn execute(self, request: Request, payload: Option<Payload>) -> Reply {
        match request {
            Request::Read { offset, len, df } => {
                let result = self.read(offset, len).await;
                if let Err(e) = &result {
                    debug!(error = %e, kind = ?e.kind, "device read failed");
                }
                read_reply(self.to, len, df, result)
            }
            Request::Write { offset, len, fua } => {
                let result = match payload {
                    Some(Payload::Received) => self.device.write_received(offset, len, fua).await,
                    Some(Payload::Failed(e)) => Err(e),
                    Some(Payload::Data(data)) => {
                        debug_assert_eq!(data.len(), len as usize);
                        self.write(offset, data, fua).await
                    }
                    None => self.write(offset, Bytes::new(), fua).await,
                };
                self.status_reply(result, len.into(), false)
            }
            Request::Flush => {
                let result = self.device.flush().await;
                self.status_reply(result, 0, false)
            }
            Request::Trim { offset, len, fua } => {
                let result = if len == 0 { Ok(()) } else { self.device.trim(offset, len, fua).await };
                self.status_reply(result, len, false)
            }
            Request::Cache { offset, len } => {
                let result = if len == 0 { Ok(()) } else { self.device.cache(offset, len).await };
                self.status_reply(result, len, false)
            }
            Request::WriteZeroes { offset, len, flags } => {
                let result = if len == 0 { Ok(()) } else { self.device.write_zeroes(offset, len, flags).await };
                self.status_reply(result, len, flags.fast_zero)
            }
            Request::BlockStatus { offset, len, req_one } => {
                debug_assert!(self.to.framing.structured() && len > 0 && self.meta_contexts != 0);
                let len = len.min(MAX_BLOCK_STATUS_BYTES);
                match self.block_status(offset, len, req_one).await {
                    Ok(chunks) => {
                        let mut reply = Reply::with_capacity(chunks.len());
                        let last = chunks.len() - 1;
                        for (i, (id, extents)) in chunks.iter().enumerate() {
                            reply.push_block_status(self.to, *id, extents, i == last);
                        }
                        reply
                    }
                    Err(e) => self.status_reply(Err(e), len, false),
                }
            }
            Request::Disc => unreachable!("DISC is handled by the reader"),
        }
    }

    /// The descriptors of every selected meta context, in id order: (context id, extents).
    async fn block_status(&self, offset: u64, len: u64, req_one: bool) -> DeviceResult<Vec<(u32, Vec<(u64, u32)>)>> {
        let mut chunks = Vec::new();
        for bit in (0..u32::BITS).filter(|b| self.meta_contexts & (1 << b) != 0) {
            let id = BASE_ALLOCATION_ID + bit;
            let extents = match bit {
                0 => encode_extents(&self.device.block_status(offset, len).await?, len, req_one),
                _ => encode_descriptors(self.device.context_status(bit as usize - 1, offset, len).await?, len, req_one),
            };
            chunks.push((id, extents));
        }
        Ok(chunks)
    }

    /// Reads `len` bytes, in device-sized pieces, checking the device returned exactly `len`.
    async fn read(&self, offset: u64, len: u32) -> DeviceResult<Vec<ReadChunk>> {
        let mut chunks = Vec::new();
        let mut done = 0u32;
        while done < len {
            let piece = (len - done).min(self.piece_bytes);
            let piece_offset = offset + u64::from(done);
            let got = self.device.read(piece_offset, piece).await?;
            let got_len: usize = got.iter().map(ReadChunk::len).sum();
            if got_len != piece as usize {
                return Err(DeviceError::new(
                    DeviceErrorKind::Io,
                    format!("device returned {got_len} bytes for a read of {piece}"),
                )
                .at(piece_offset));
            }
            // Usually one piece: keep the device's vector. (read_reply drops empty chunks.)
            if chunks.is_empty() {
                chunks = got;
            } else {
                chunks.extend(got);
            }
            done += piece;
        }
        Ok(chunks)
    }

    /// Writes `data` in device-sized pieces.
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceResult<()> {
        let piece = self.piece_bytes as usize;
        let mut done = 0usize;
        while done < data.len() {
            let end = (done + piece).min(data.len());
            self.device.write(offset + done as u64, data.slice(done..end), fua).await?;
            done = end;
        }
        Ok(())
    }

    /// The reply to a command without data: success, or the error mapped in one place.
    fn status_reply(&self, result: DeviceResult<()>, len: u64, fast_zero: bool) -> Reply {
        let mut reply = Reply::with_capacity(1);
        match result {
            Ok(()) => reply.push_ok(self.to),
            Err(e) => {
                debug!(error = %e, kind = ?e.kind, "device request failed");
                push_device_error(&mut reply, self.to, &e, len, fast_zero)
            }
        }
        reply
    }
}
