//! The framing of one connection: what the socket's read half carries, request by request —
//! the header (decoded and validated), then for a WRITE its payload: from the buffer,
//! received whole into a payload buffer, or received straight into the device's mapped file
//! pages (`receive.rs`); a refused WRITE's payload is skipped to stay in sync. Replies go out
//! through the shared write half (`reply_writer.rs`). TLS slots in below this, as another
//! stream type (`NbdStream`).

use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::OwnedSemaphorePermit;
use tracing::debug;

use super::admission::Gate;
use super::byte_budget::BytePermit;
use super::receive::{read_payload, receive_in_place, write_targets};
use super::reply_writer::LocalReplies;
use crate::device::DeviceError;
use crate::error::Result;
use crate::protocol::request::{
    ExportLimits, Rejection, Request, RequestHeader, decode_request_header, payload_len, validate_request,
};
use crate::read_buffer::{discard, fill_up_to};
use crate::request_source::RequestSource;
use crate::send_file::ReplySink;

/// One connection's framing: the socket's read half and its buffer (request headers,
/// payloads received whole or into the device's pages, payloads of refused requests
/// skipped), and through `gate` the shared write half that replies go out on.
pub(super) struct Connection<'a, R, W> {
    pub(super) reader: R,
    pub(super) buf: BytesMut,
    pub(super) gate: Gate<'a, W>,
    /// The device wants payloads aligned (`BlockDevice::payload_alignment`, asked once when
    /// the connection starts: a member replaced later at worst costs a copy in the device).
    pub(super) aligned_payloads: bool,
    /// Read the next header alone (it follows a WRITE and `aligned_payloads`): a WRITE payload
    /// behind it is then received into a buffer of its own, not read ahead into `buf` at
    /// whatever address it lands.
    pub(super) header_alone: bool,
}

/// A WRITE's payload.
pub(super) enum Payload {
    Data(Bytes),
    /// Received into the device's [`WriteTarget`]s; the write completes with `write_received`.
    Received,
    /// Consumed, but it could not be put into the device's targets.
    Failed(DeviceError),
}

/// A request read off the wire, validated (or refused), holding its permits.
pub(super) struct Incoming {
    pub(super) header: RequestHeader,
    /// The validated request and its WRITE payload, or why it was refused.
    pub(super) outcome: Result<(Request, Option<Payload>), Rejection>,
    pub(super) slot: OwnedSemaphorePermit,
    pub(super) bytes: Option<BytePermit>,
}

impl<R: RequestSource, W: ReplySink> Connection<'_, R, W> {
    /// Reads the next request. `Ok(None)` on a clean close between requests, shutdown or abort.
    /// Before any wait (socket data, permits), replies collected in `local` are written.
    pub(super) async fn next_request(
        &mut self,
        limits: &ExportLimits,
        local: &mut LocalReplies,
    ) -> Result<Option<Incoming>> {
        let gate = &self.gate;
        let Some(slot) = gate.permits(gate.slots, 1, local).await? else { return Ok(None) };
        let header_len = limits.framing.request_header_len();
        if self.buf.len() < header_len {
            local.flush(gate.shared).await?;
            // Idle: nothing in flight but the slot just taken for this request. The header wait
            // runs in idle-timeout periods; the connection is closed at the end of a whole
            // period in which nothing was in flight (so it was idle at least that long).
            let in_flight = || gate.slots.available_permits() + 1 < gate.t.max_requests;
            let mut busy_in_period = gate.t.idle_timeout.is_some() && in_flight();
            let read_ahead = !self.header_alone;
            let filled = loop {
                let header = fill_up_to(&mut self.reader, &mut self.buf, header_len, read_ahead);
                let Some(limit) = gate.t.idle_timeout else { break gate.interruptible(header).await };
                match gate.interruptible(tokio::time::timeout(limit, header)).await {
                    Some(Ok(filled)) => break Some(filled),
                    None => break None,
                    Some(Err(_)) if busy_in_period || in_flight() => busy_in_period = in_flight(),
                    Some(Err(_)) => {
                        debug!(?limit, "idle timeout: closing the connection");
                        return Ok(None);
                    }
                }
            };
            let Some(filled) = filled else { return Ok(None) };
            if !filled? {
                debug!("client closed the connection");
                return Ok(None);
            }
        }
        let header = decode_request_header(&self.buf, limits.framing)?.expect("header is buffered");
        self.buf.advance(header_len);
        let payload = payload_len(&header, limits.framing)? as usize;
        self.header_alone = payload > 0 && self.aligned_payloads;
        let (outcome, bytes) = match validate_request(&header, limits) {
            Ok(request @ (Request::Write { len, .. } | Request::Read { len, .. })) => {
                // Room for the data before reading the payload or issuing the read.
                let bytes = if len > 0 {
                    let Some(permit) = gate.byte_permits(len, local).await? else {
                        return Ok(None);
                    };
                    Some(permit)
                } else {
                    None
                };
                let data = if payload == 0 {
                    None
                } else if self.buf.len() >= payload {
                    Some(Payload::Data(self.buf.split_to(payload).freeze()))
                } else {
                    local.flush(gate.shared).await?;
                    let targets = match request {
                        Request::Write { offset, len, .. } if self.reader.receives_in_place() => {
                            write_targets(gate.t, offset, len).await
                        }
                        _ => None,
                    };
                    let received = match targets {
                        Some(targets) => {
                            let stall = gate.t.stall_timeout;
                            let receive = receive_in_place(&mut self.reader, &mut self.buf, &targets, payload, stall);
                            let received = gate.interruptible(receive).await;
                            received.map(|r| r.map(|put| put.map_or_else(Payload::Failed, |()| Payload::Received)))
                        }
                        None => {
                            let read = read_payload(&mut self.reader, &mut self.buf, payload, gate.t.stall_timeout);
                            gate.interruptible(read).await.map(|r| r.map(Payload::Data))
                        }
                    };
                    let Some(received) = received else { return Ok(None) };
                    Some(received?)
                };
                (Ok((request, data)), bytes)
            }
            Ok(request) => (Ok((request, None)), None),
            Err(rejection) => {
                // The payload of a refused WRITE is consumed (not buffered) to stay in sync.
                if self.buf.len() < payload {
                    local.flush(gate.shared).await?;
                }
                discard(&mut self.reader, &mut self.buf, payload as u64).await?;
                (Err(rejection), None)
            }
        };
        Ok(Some(Incoming { header, outcome, slot, bytes }))
    }
}
