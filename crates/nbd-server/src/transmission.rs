//! The transmission phase of one connection: pipelined requests, replies in completion
//! order, one socket writer at a time.
//!
//! ```text
//!   socket read half                                                 socket write half
//!        │                                                          (behind one mutex)
//!   read_loop ── header ─ validate ─┬─ rejected / small and ready ─▶ local batch ──┐ ▲
//!   (slot permit, byte permits,     │                                               ├─┘ vectored
//!    WRITE payload → Bytes or       └─ spawn(execute) ─ device ─▶ mpsc ─▶ write_loop ┘   writes
//!    the device's mapped pages)
//! ```
//!
//! Requests that complete at once (rejections, small requests on a device that answers
//! without waiting: memory, page cache) are answered by the reader itself: it collects
//! their replies and writes them in one batch before it next waits for anything (socket
//! data, a permit). That saves a task spawn and a cross-thread wake-up per request.
//! Everything else runs as a task whose reply goes through a channel to `write_loop`,
//! which batches whatever is ready; a large reply (128 KiB and up) is written by its own
//! task instead when the socket is free at that moment (one cross-thread hand-off less).
//! A large WRITE (128 KiB and up) is spawned and the reader then yields, so the write's
//! copy runs on the core that received its payload while another worker goes on reading
//! (`yield_to_the_spawned_task`); its payload is received whole, not segment by segment
//! (`request_source.rs`), and where the device offers mapped file pages
//! (`BlockDevice::write_targets`) it is received straight into them, after which there is
//! nothing left to copy and the reader answers it itself. All of them write whole batches
//! under the same mutex, so replies never interleave on the wire; their order is completion
//! order. READ data that the device returned as a file range goes out with `sendfile` in
//! the middle of a batch (`send_file.rs`).
//!
//! Bounds: a request first takes a per-connection slot (at most
//! `max_requests_per_connection` in flight; when none is free the socket is not read, so
//! the client is slowed by TCP), then, for READ/WRITE, `len` permits of the server-wide
//! byte semaphore, taken *before* a WRITE payload is read or a READ is issued. Both are
//! released when the reply has been written to the socket (or dropped). The reader never
//! waits while holding unwritten replies, so it cannot deadlock on its own permits.
//!
//! Ending: DISC, a clean close or server shutdown stop the reader; requests in flight run
//! to completion and their replies are written; then the socket is shut down. A protocol
//! violation or socket error ends the connection at once (hard disconnect).

use std::future::Future;
use std::io::IoSlice;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span};

use crate::advertise::Advertised;
use crate::buffer_pool;
use crate::device::{
    BlockDevice, DeviceError, DeviceErrorKind, DeviceResult, FileRange, RECEIVE_IN_PLACE_MIN_BYTES, ReadChunk,
    WriteTarget,
};
use crate::error::{Error, Result};
use crate::protocol::consts::cmd;
use crate::protocol::read_reply::{ReadFraming, push_device_error, read_reply};
use crate::protocol::reply::{Reply, Segment, encode_extents};
use crate::protocol::request::{
    ExportLimits, REQUEST_HEADER_LEN, Rejection, Request, RequestHeader, decode_request_header, payload_len,
    validate_request,
};
use crate::read_buffer::{discard, fill};
use crate::request_source::RequestSource;
use crate::send_file::{ReplySink, write_all_vectored};

/// Requests up to this length may be executed inline by the reader...
const INLINE_MAX_BYTES: u32 = 128 * 1024;
/// ... except WRITEs from this length on, which are handed off (`yield_to_the_spawned_task`).
const HAND_OFF_WRITE_MIN_BYTES: u32 = 128 * 1024;
/// Replies of at least this size are written by the request's own task when it can.
const DIRECT_REPLY_MIN_BYTES: usize = 128 * 1024;
/// A WRITE payload with at least this much still to come is received whole (`RequestSource`).
const WAKE_FOR_PAYLOAD_MIN_BYTES: usize = 128 * 1024;
/// The reader writes its collected replies once they hold this many bytes...
const LOCAL_FLUSH_BYTES: usize = 256 * 1024;
/// ... or this many replies.
const LOCAL_FLUSH_REPLIES: usize = 64;

/// Everything a connection needs for the transmission phase.
pub(crate) struct Transmission {
    pub device: Arc<dyn BlockDevice>,
    pub advertised: Advertised,
    pub structured_replies: bool,
    pub meta_context_selected: bool,
    /// Server-wide bytes-in-flight semaphore.
    pub in_flight_bytes: Arc<Semaphore>,
    pub max_requests: usize,
    pub shutdown: CancellationToken,
}

/// A reply ready for the socket, with the permits it releases once written.
struct Outgoing {
    reply: Reply,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// The socket's write half and the scratch buffer for headers, shared by both writers.
struct SocketWriter<W> {
    writer: W,
    scratch: Vec<u8>,
}

type SharedWriter<W> = Arc<Mutex<SocketWriter<W>>>;

/// Replies the reader produced itself and has not written yet.
struct LocalReplies {
    replies: Vec<Outgoing>,
    bytes: usize,
}

impl LocalReplies {
    fn push(&mut self, outgoing: Outgoing) {
        self.bytes += outgoing.reply.wire_len();
        self.replies.push(outgoing);
    }

    fn is_full(&self) -> bool {
        self.bytes >= LOCAL_FLUSH_BYTES || self.replies.len() >= LOCAL_FLUSH_REPLIES
    }

    /// Writes the collected replies (whole, under the writer lock) and releases their permits.
    async fn flush<W: ReplySink>(&mut self, shared: &SharedWriter<W>) -> Result<()> {
        if self.replies.is_empty() {
            return Ok(());
        }
        let mut guard = shared.lock().await;
        let SocketWriter { writer, scratch } = &mut *guard;
        write_batch(writer, &self.replies, scratch).await?;
        self.replies.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// Runs transmission until the connection ends.
pub(crate) async fn run<R, W>(reader: R, writer: W, read_buf: BytesMut, t: Transmission) -> Result<()>
where
    R: RequestSource,
    W: ReplySink,
{
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let abort = CancellationToken::new();
    let slots = Arc::new(Semaphore::new(t.max_requests));
    let shared = Arc::new(Mutex::new(SocketWriter { writer, scratch: Vec::with_capacity(16 * 1024) }));
    let writer_task = tokio::spawn(write_loop(shared.clone(), rx, abort.clone()).in_current_span());

    let gate = Gate { t: &t, slots: &slots, shared: &shared, abort: &abort };
    let mut reader = Reader { reader, buf: read_buf, gate };
    let mut local = LocalReplies { replies: Vec::with_capacity(LOCAL_FLUSH_REPLIES), bytes: 0 };
    let read_result = read_loop(&mut reader, &mut local, tx).await;
    let read_result = match read_result {
        Ok(()) => local.flush(&shared).await,
        Err(e) => Err(e),
    };
    drop(reader);
    drop(local);
    if read_result.is_err() {
        // Hard disconnect: don't wait to deliver replies, close our side now.
        abort.cancel();
        let _ = shared.lock().await.writer.shutdown().await;
    }
    let write_result = match writer_task.await {
        Ok(result) => result,
        Err(join_error) => Err(Error::Io(std::io::Error::other(join_error))),
    };
    // Wait for every request task to finish (each holds a slot until its reply is written or
    // dropped), so nothing touches the device after this connection is reported closed.
    let all_slots = u32::try_from(t.max_requests).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all_slots).await;
    read_result.and(write_result)
}

/// The read side of a connection: the socket, its buffer and what admission needs.
struct Reader<'a, R, W> {
    reader: R,
    buf: BytesMut,
    gate: Gate<'a, W>,
}

/// What admitting a request needs besides the socket (shared with other tasks, so `Sync`).
struct Gate<'a, W> {
    t: &'a Transmission,
    slots: &'a Arc<Semaphore>,
    shared: &'a SharedWriter<W>,
    abort: &'a CancellationToken,
}

async fn read_loop<R, W>(
    r: &mut Reader<'_, R, W>,
    local: &mut LocalReplies,
    tx: mpsc::UnboundedSender<Outgoing>,
) -> Result<()>
where
    R: RequestSource,
    W: ReplySink,
{
    let t = r.gate.t;
    let limits = ExportLimits {
        size_bytes: t.advertised.size_bytes,
        transmission_flags: t.advertised.transmission_flags,
        structured_replies: t.structured_replies,
        meta_context_selected: t.meta_context_selected,
        min_block_bytes: t.advertised.min_block_bytes,
        max_payload_bytes: t.advertised.max_payload_bytes,
    };
    loop {
        let Some(Incoming { header, outcome, slot, bytes }) = r.next_request(&limits, local).await? else {
            return Ok(());
        };
        let (request, payload) = match outcome {
            Ok((Request::Disc, _)) => {
                debug!("DISC");
                return Ok(());
            }
            Ok(accepted) => accepted,
            Err(rejection) => {
                debug!(
                    cookie = header.cookie,
                    command = header.command,
                    errno = rejection.errno,
                    reason = rejection.message,
                    "request rejected"
                );
                let reply = rejection_reply(&header, t.structured_replies, rejection);
                local.push(Outgoing { reply, _slot: slot, _bytes: bytes });
                if local.is_full() {
                    local.flush(r.gate.shared).await?;
                }
                continue;
            }
        };
        let span = debug_span!(
            "request",
            cookie = header.cookie,
            command = header.command,
            offset = header.offset,
            len = header.length
        );
        let in_place = matches!(payload, Some(Payload::Received | Payload::Failed(_)));
        let ctx = RequestCtx {
            device: t.device.clone(),
            cookie: header.cookie,
            structured: t.structured_replies,
            piece_bytes: t.advertised.device_piece_bytes,
        };
        let mut task = Box::pin(
            async move {
                let reply = ctx.execute(request, payload).await;
                Outgoing { reply, _slot: slot, _bytes: bytes }
            }
            .instrument(span),
        );
        // Fast path: a small request on a device that completes at once is answered by the
        // reader. Large READs become tasks, so their copies run on other workers in parallel
        // with the reader (inline 1 MiB reads measured slower), as does anything that has to
        // wait. Large WRITEs are handed off (below), unless their payload is already in place.
        let hand_off = header.command == cmd::WRITE && header.length >= HAND_OFF_WRITE_MIN_BYTES && !in_place;
        let ready = if (header.length <= INLINE_MAX_BYTES || in_place) && !hand_off {
            match task.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(outgoing) => Some(outgoing),
                Poll::Pending => None,
            }
        } else {
            None
        };
        match ready {
            Some(outgoing) => {
                local.push(outgoing);
                if local.is_full() {
                    local.flush(r.gate.shared).await?;
                }
            }
            None => {
                let tx = tx.clone();
                let (shared, abort) = (r.gate.shared.clone(), r.gate.abort.clone());
                tokio::spawn(async move {
                    let outgoing = task.await;
                    // A large reply is written by its own task when the socket is free: one
                    // cross-thread hand-off less per request, which is most of a 1 MiB
                    // request's overhead.
                    if outgoing.reply.wire_len() >= DIRECT_REPLY_MIN_BYTES
                        && let Ok(mut guard) = shared.try_lock()
                    {
                        let SocketWriter { writer, scratch } = &mut *guard;
                        tokio::select! {
                            biased;
                            // A hard disconnect abandons the write, as `write_loop` does.
                            _ = abort.cancelled() => {}
                            written = write_batch(writer, std::slice::from_ref(&outgoing), scratch) => {
                                if let Err(e) = written {
                                    debug!(error = %e, "reply write failed");
                                    abort.cancel();
                                }
                            }
                        }
                        return;
                    }
                    let _ = tx.send(outgoing);
                });
                if hand_off {
                    local.flush(r.gate.shared).await?;
                    yield_to_the_spawned_task().await;
                }
            }
        }
    }
}

/// Lets the task just spawned run on this worker next, while the reader itself is queued
/// where another worker can take it.
///
/// Why: a large WRITE's payload was just received on this core. Spawned from a worker, its
/// task sits in that worker's LIFO slot, so it runs here next and copies the payload while it
/// is still in this core's cache; meanwhile the reader, waking itself and returning
/// `Pending`, is rescheduled at the back of the worker's queue and an idle worker is
/// notified to steal it, so the next request is received on the other core in parallel
/// with this copy. (Executed inline, receive and copy alternate on one core; spawned without
/// yielding, the reader keeps the core and the copy is stolen by the other, cache-cold.)
async fn yield_to_the_spawned_task() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// A WRITE's payload.
enum Payload {
    Data(Bytes),
    /// Received into the device's [`WriteTarget`]s; the write completes with `write_received`.
    Received,
    /// Consumed, but it could not be put into the device's targets.
    Failed(DeviceError),
}

/// A request read off the wire, validated (or refused), holding its permits.
struct Incoming {
    header: RequestHeader,
    /// The validated request and its WRITE payload, or why it was refused.
    outcome: Result<(Request, Option<Payload>), Rejection>,
    slot: OwnedSemaphorePermit,
    bytes: Option<OwnedSemaphorePermit>,
}

impl<W: ReplySink> Gate<'_, W> {
    /// Waits for `wait` unless shutdown or abort comes first (then `None`). Only waits that
    /// are safe to abandon go through here; writes never do.
    async fn interruptible<T>(&self, wait: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            _ = self.t.shutdown.cancelled() => {
                debug!("shutdown: no more requests are read");
                None
            }
            _ = self.abort.cancelled() => None,
            value = wait => Some(value),
        }
    }

    /// `n` permits of `semaphore`, writing out `local` first if it has to wait.
    async fn permits(
        &self,
        semaphore: &Arc<Semaphore>,
        n: u32,
        local: &mut LocalReplies,
    ) -> Result<Option<OwnedSemaphorePermit>> {
        if let Ok(permit) = semaphore.clone().try_acquire_many_owned(n) {
            return Ok(Some(permit));
        }
        local.flush(self.shared).await?;
        let acquired = self.interruptible(semaphore.clone().acquire_many_owned(n)).await;
        Ok(acquired.map(|p| p.expect("semaphores are never closed")))
    }
}

impl<R: RequestSource, W: ReplySink> Reader<'_, R, W> {
    /// Reads the next request. `Ok(None)` on a clean close between requests, shutdown or abort.
    /// Before any wait (socket data, permits), replies collected in `local` are written.
    async fn next_request(&mut self, limits: &ExportLimits, local: &mut LocalReplies) -> Result<Option<Incoming>> {
        let gate = &self.gate;
        let Some(slot) = gate.permits(gate.slots, 1, local).await? else { return Ok(None) };
        if self.buf.len() < REQUEST_HEADER_LEN {
            local.flush(gate.shared).await?;
            let Some(filled) = gate.interruptible(fill(&mut self.reader, &mut self.buf, REQUEST_HEADER_LEN)).await
            else {
                return Ok(None);
            };
            if !filled? {
                debug!("client closed the connection");
                return Ok(None);
            }
        }
        let header = decode_request_header(&self.buf)?.expect("header is buffered");
        self.buf.advance(REQUEST_HEADER_LEN);
        let payload = payload_len(&header)? as usize;
        let (outcome, bytes) = match validate_request(&header, limits) {
            Ok(request @ (Request::Write { len, .. } | Request::Read { len, .. })) => {
                // Room for the data before reading the payload or issuing the read.
                let bytes = if len > 0 {
                    let Some(permit) = gate.permits(&gate.t.in_flight_bytes, len, local).await? else {
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
                            let receive = receive_in_place(&mut self.reader, &mut self.buf, &targets, payload);
                            let received = gate.interruptible(receive).await;
                            received.map(|r| r.map(|put| put.map_or_else(Payload::Failed, |()| Payload::Received)))
                        }
                        None => {
                            let read = read_payload(&mut self.reader, &mut self.buf, payload);
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

/// Where the device wants a WRITE's payload received, if it does (checked: the targets
/// cover the request exactly, inside their mappings).
async fn write_targets(t: &Transmission, offset: u64, len: u32) -> Option<Vec<WriteTarget>> {
    if len < RECEIVE_IN_PLACE_MIN_BYTES || len > t.advertised.device_piece_bytes {
        return None;
    }
    let targets = match t.device.write_targets(offset, len).await {
        Ok(targets) => targets?,
        Err(e) => {
            debug!(error = %e, "no write targets; the write goes the normal way");
            return None;
        }
    };
    let covered: u64 = targets.iter().map(|t| u64::from(t.len)).sum();
    let inside = targets.iter().all(|t| t.mapping.iovec(t.offset, t.len as usize).is_some());
    if covered != u64::from(len) || !inside {
        debug!(covered, inside, "write targets do not fit the request; the write goes the normal way");
        return None;
    }
    Some(targets)
}

/// Receives a WRITE payload of `len` bytes into `targets` (the device's mapped file pages):
/// the buffered part is written with `pwrite`, the rest received by the kernel straight
/// into the mappings, whole if it is large. `Ok(Err(_))`: the payload was consumed but could
/// not be put in place (e.g. no space for a page of a full tmpfs); the WRITE fails with that
/// error and the connection goes on.
///
/// When the kernel cannot copy into a mapped page (`EFAULT`: a page past the end of a
/// truncated file, or one tmpfs has no room for), the rest of the payload is read into a
/// buffer and written with `pwrite`, which reports such errors as errors.
async fn receive_in_place<R: RequestSource>(
    reader: &mut R,
    buf: &mut BytesMut,
    targets: &[WriteTarget],
    len: usize,
) -> Result<DeviceResult<()>> {
    debug_assert!(buf.len() < len);
    let buffered = buf.split().freeze();
    if let Err(e) = write_at_targets(targets, 0, &buffered) {
        discard(reader, buf, (len - buffered.len()) as u64).await?;
        return Ok(Err(e));
    }
    let rest = target_pieces(targets, buffered.len(), len - buffered.len());
    let iovecs = rest.map(|(target, at, n)| target.mapping.iovec(at, n).expect("targets lie inside their mappings"));
    let mut iovecs = IoVecs(iovecs.collect());
    let mut done = buffered.len();
    let mut first = 0;
    let mut threshold = WakeThreshold::default();
    let mut short = false;
    while done < len {
        threshold.before_read(reader, len - done, short)?;
        let (source, list) = (&mut *reader, &mut iovecs);
        // SAFETY: the iovecs point into mappings `targets` keeps alive across the call; the
        // crate never makes references into mapped memory (file_mapping.rs).
        let receive = move |cx: &mut Context<'_>| unsafe { source.poll_receive_into(cx, &list.0[first..]) };
        let n = match std::future::poll_fn(receive).await {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                threshold.finish(reader)?;
                debug!(received = done, len, "cannot receive into the mapping; the rest goes with pwrite");
                let rest = read_payload(reader, buf, len - done).await?;
                return Ok(write_at_targets(targets, done, &rest));
            }
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(Error::UnexpectedEof);
        }
        short = n < len - done; // (or a full read of the first UIO_MAXIOV regions: harmless)
        done += n;
        first += advance_iovecs(&mut iovecs.0[first..], n);
    }
    threshold.finish(reader)?;
    Ok(Ok(()))
}

/// Writes `data`, the payload's bytes from position `from`, where `targets` put them.
fn write_at_targets(targets: &[WriteTarget], from: usize, data: &[u8]) -> DeviceResult<()> {
    use std::os::unix::fs::FileExt;
    let mut written = 0;
    for (target, at, n) in target_pieces(targets, from, data.len()) {
        target.mapping.file().write_all_at(&data[written..written + n], at).map_err(|e| DeviceError::from_io(&e))?;
        written += n;
    }
    debug_assert_eq!(written, data.len(), "the targets cover the payload");
    Ok(())
}

/// Where the payload's bytes `[from, from + len)` go: (target, file offset, length) pieces,
/// in order.
fn target_pieces(targets: &[WriteTarget], from: usize, len: usize) -> impl Iterator<Item = (&WriteTarget, u64, usize)> {
    let end = from + len;
    let mut position = 0;
    targets.iter().filter_map(move |target| {
        let (start, stop) = (position, position + target.len as usize);
        position = stop;
        let (first, last) = (start.max(from), stop.min(end));
        (first < last).then(|| (target, target.offset + (first - start) as u64, last - first))
    })
}

/// Iovecs into mapped file pages, kept across awaits.
struct IoVecs(Vec<libc::iovec>);

// SAFETY: the pointers are addresses in `FileMapping`s (process-wide memory, `Send + Sync`)
// that only the kernel writes; moving the list to another thread changes nothing.
unsafe impl Send for IoVecs {}

/// Consumes `n` received bytes from the front of `iovecs`: returns how many iovecs are
/// used up, and shortens the next one by what it received.
fn advance_iovecs(iovecs: &mut [libc::iovec], mut n: usize) -> usize {
    let mut used = 0;
    while n > 0 {
        let first = &mut iovecs[used];
        if n < first.iov_len {
            // SAFETY: `n < iov_len`, so the new base stays inside the same region.
            first.iov_base = unsafe { first.iov_base.cast::<u8>().add(n) }.cast();
            first.iov_len -= n;
            return used;
        }
        n -= first.iov_len;
        used += 1;
    }
    used
}

/// The wake threshold (`RequestSource::set_wake_threshold`) while one payload is received.
/// It is never more than what is still to come: the client may wait for this reply before it
/// sends anything more.
#[derive(Default)]
struct WakeThreshold {
    /// 0: never set (the socket's is 1).
    current: usize,
}

impl WakeThreshold {
    /// Before waiting for more of a payload with `remaining` bytes to come; `rearm` sets the
    /// threshold even if unchanged (see `RequestSource::poll_receive_into`).
    fn before_read<R: RequestSource>(&mut self, reader: &R, remaining: usize, rearm: bool) -> Result<()> {
        let wanted = if remaining >= WAKE_FOR_PAYLOAD_MIN_BYTES { remaining } else { 1 };
        if wanted != self.current.max(1) || rearm {
            reader.set_wake_threshold(wanted)?;
            self.current = wanted;
        }
        // More than the payload's rest could wait for bytes the client never sends.
        assert!(self.current <= remaining, "wake threshold {} over the {remaining} bytes to come", self.current);
        Ok(())
    }

    /// Once the payload is in: any data wakes the reader again.
    fn finish<R: RequestSource>(self, reader: &R) -> Result<()> {
        if self.current > 1 {
            reader.set_wake_threshold(1)?;
        }
        Ok(())
    }
}

/// Reads a WRITE payload of `len` bytes into its own buffer: the buffered part is copied,
/// the rest is read straight into a (pooled) payload buffer, whole if it is large
/// (`RequestSource::set_wake_threshold`).
async fn read_payload<R: RequestSource>(reader: &mut R, buf: &mut BytesMut, len: usize) -> Result<Bytes> {
    debug_assert!(buf.len() < len);
    let mut payload = buffer_pool::alloc(len);
    payload.extend_from_slice(buf);
    buf.clear();
    let mut threshold = WakeThreshold::default();
    while payload.len() < len {
        let remaining = len - payload.len();
        threshold.before_read(reader, remaining, false)?;
        if (&mut *reader).take(remaining as u64).read_buf(&mut payload).await? == 0 {
            return Err(Error::UnexpectedEof);
        }
    }
    threshold.finish(reader)?;
    debug_assert_eq!(payload.len(), len);
    Ok(buffer_pool::freeze(payload))
}

/// The reply to a request refused before reaching the device.
fn rejection_reply(header: &RequestHeader, structured: bool, rejection: Rejection) -> Reply {
    let mut reply = Reply::with_capacity(1);
    reply.push_error(header.cookie, structured, rejection.errno, rejection.message, None);
    reply
}

/// What a spawned request needs.
struct RequestCtx {
    device: Arc<dyn BlockDevice>,
    cookie: u64,
    structured: bool,
    /// Largest READ/WRITE handed to the device at once.
    piece_bytes: u32,
}

impl RequestCtx {
    async fn execute(self, request: Request, payload: Option<Payload>) -> Reply {
        match request {
            Request::Read { offset, len, df } => {
                let result = self.read(offset, len).await;
                if let Err(e) = &result {
                    debug!(error = %e, kind = ?e.kind, "device read failed");
                }
                let framing = match (self.structured, df) {
                    (false, _) => ReadFraming::Simple,
                    (true, false) => ReadFraming::Structured,
                    (true, true) => ReadFraming::Unfragmented,
                };
                read_reply(self.cookie, offset, len, framing, result)
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
                self.status_reply(result, offset, len, false)
            }
            Request::Flush => {
                let result = self.device.flush().await;
                self.status_reply(result, 0, 0, false)
            }
            Request::Trim { offset, len, fua } => {
                let result = if len == 0 { Ok(()) } else { self.device.trim(offset, u64::from(len), fua).await };
                self.status_reply(result, offset, len, false)
            }
            Request::Cache { offset, len } => {
                let result = if len == 0 { Ok(()) } else { self.device.cache(offset, u64::from(len)).await };
                self.status_reply(result, offset, len, false)
            }
            Request::WriteZeroes { offset, len, flags } => {
                let result =
                    if len == 0 { Ok(()) } else { self.device.write_zeroes(offset, u64::from(len), flags).await };
                self.status_reply(result, offset, len, flags.fast_zero)
            }
            Request::BlockStatus { offset, len, req_one } => {
                debug_assert!(self.structured && len > 0);
                match self.device.block_status(offset, u64::from(len)).await {
                    Ok(extents) => {
                        let mut reply = Reply::with_capacity(1);
                        reply.push_block_status(self.cookie, &encode_extents(&extents, len, req_one));
                        reply
                    }
                    Err(e) => self.status_reply(Err(e), offset, len, false),
                }
            }
            Request::Disc => unreachable!("DISC is handled by the reader"),
        }
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
    fn status_reply(&self, result: DeviceResult<()>, offset: u64, len: u32, fast_zero: bool) -> Reply {
        let mut reply = Reply::with_capacity(1);
        match result {
            Ok(()) => reply.push_simple(self.cookie, 0),
            Err(e) => {
                debug!(error = %e, kind = ?e.kind, "device request failed");
                push_device_error(&mut reply, self.cookie, self.structured, &e, offset, len, fast_zero)
            }
        }
        reply
    }
}

/// Most replies written in one vectored write.
const MAX_BATCH_REPLIES: usize = 128;
/// Stop adding replies to a batch past this many bytes.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Stay below IOV_MAX (1024) slices per write.
const MAX_BATCH_SLICES: usize = 768;
/// Data segments up to this size are copied next to the headers instead of getting a slice.
const COPY_THRESHOLD_BYTES: usize = 512;
/// Zero runs are written from this static page.
static ZERO_PAGE: [u8; 256 * 1024] = [0; 256 * 1024];

/// One piece of a batch: a range of the scratch buffer, a data buffer, zeroes or a file range.
enum Piece<'a> {
    Scratch(usize, usize),
    Data(&'a [u8]),
    Zeroes(usize),
    File(&'a FileRange),
}

/// Writes replies of spawned requests as they complete, batching whatever is ready.
async fn write_loop<W: ReplySink>(
    shared: SharedWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    abort: CancellationToken,
) -> Result<()> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(MAX_BATCH_REPLIES);
    loop {
        let first = tokio::select! {
            biased;
            _ = abort.cancelled() => return Ok(()),
            first = rx.recv() => first,
        };
        let Some(first) = first else { break };
        let mut batch_bytes = first.reply.wire_len();
        let mut batch_segments = first.reply.segments.len();
        batch.push(first);
        while batch.len() < MAX_BATCH_REPLIES && batch_bytes < MAX_BATCH_BYTES && batch_segments < MAX_BATCH_SLICES / 2
        {
            match rx.try_recv() {
                Ok(next) => {
                    batch_bytes += next.reply.wire_len();
                    batch_segments += next.reply.segments.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let written = tokio::select! {
            biased;
            _ = abort.cancelled() => return Ok(()),
            written = async {
                let mut guard = shared.lock().await;
                let SocketWriter { writer, scratch } = &mut *guard;
                write_batch(writer, &batch, scratch).await
            } => written,
        };
        if let Err(e) = written {
            abort.cancel();
            return Err(e);
        }
        batch.clear();
    }
    let mut guard = shared.lock().await;
    guard.writer.flush().await?;
    let _ = guard.writer.shutdown().await;
    Ok(())
}

/// Writes all replies of `batch` with as few syscalls as the socket allows.
async fn write_batch<W: ReplySink>(writer: &mut W, batch: &[Outgoing], scratch: &mut Vec<u8>) -> Result<()> {
    scratch.clear();
    let mut pieces: Vec<Piece<'_>> = Vec::with_capacity(batch.len() * 2);
    for outgoing in batch {
        for segment in &outgoing.reply.segments {
            let small: Option<&[u8]> = match segment {
                Segment::Inline(inline) => Some(inline.as_slice()),
                Segment::Data(data) if data.len() <= COPY_THRESHOLD_BYTES => Some(data),
                _ => None,
            };
            if let Some(bytes) = small {
                let start = scratch.len();
                scratch.extend_from_slice(bytes);
                match pieces.last_mut() {
                    Some(Piece::Scratch(_, end)) if *end == start => *end = scratch.len(),
                    _ => pieces.push(Piece::Scratch(start, scratch.len())),
                }
            } else {
                match segment {
                    Segment::Data(data) => pieces.push(Piece::Data(data)),
                    Segment::Zeroes(n) => pieces.push(Piece::Zeroes(*n)),
                    Segment::File(range) => pieces.push(Piece::File(range)),
                    Segment::Inline(_) => unreachable!("inline segments are copied"),
                }
            }
        }
    }
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(pieces.len() + 4);
    let mut sent_files = 0usize;
    for piece in &pieces {
        match *piece {
            Piece::Scratch(start, end) => slices.push(IoSlice::new(&scratch[start..end])),
            Piece::Data(data) => slices.push(IoSlice::new(data)),
            Piece::Zeroes(mut n) => {
                while n > 0 {
                    let step = n.min(ZERO_PAGE.len());
                    slices.push(IoSlice::new(&ZERO_PAGE[..step]));
                    n -= step;
                }
            }
            // What is queued goes out first, in the same call.
            Piece::File(range) => {
                sent_files += slices.iter().map(|s| s.len()).sum::<usize>() + range.len as usize;
                writer.write_then_send_file(&mut slices, range).await?;
                slices.clear();
            }
        }
    }
    debug_assert_eq!(
        sent_files + slices.iter().map(|s| s.len()).sum::<usize>(),
        batch.iter().map(|o| o.reply.wire_len()).sum::<usize>(),
        "the batch's pieces cover its replies exactly"
    );
    write_all_vectored(writer, &mut slices).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::Mutex;

    use tokio::io::{AsyncRead, ReadBuf};

    use super::*;

    /// A stream that delivers its bytes in the given pieces and checks every wake
    /// threshold against the bytes it still holds (what a real client has committed to).
    struct Pieces {
        pieces: VecDeque<Vec<u8>>,
        threshold: Mutex<usize>,
        thresholds_set: Mutex<Vec<usize>>,
    }

    impl Pieces {
        fn left(&self) -> usize {
            self.pieces.iter().map(Vec::len).sum()
        }
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let threshold = *self.threshold.lock().unwrap();
            assert!(threshold <= self.left(), "reader waits for {threshold} bytes, only {} will come", self.left());
            if let Some(mut piece) = self.pieces.pop_front() {
                let n = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..n]);
                if n < piece.len() {
                    self.pieces.push_front(piece.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl RequestSource for Pieces {
        fn set_wake_threshold(&self, bytes: usize) -> std::io::Result<()> {
            *self.threshold.lock().unwrap() = bytes;
            self.thresholds_set.lock().unwrap().push(bytes);
            Ok(())
        }
    }

    #[tokio::test]
    async fn payload_wake_thresholds_never_exceed_the_bytes_to_come() {
        const KIB: usize = 1024;
        let len = 1024 * KIB;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        // (bytes already buffered, sizes of the first pieces; one more piece holds the rest)
        let cases: [(usize, &[usize]); 6] = [
            (0, &[len]),
            (0, &[900 * KIB, 100 * KIB, 24 * KIB]), // a rest under the minimum after a big piece
            (10 * KIB, &[64 * KIB; 15]),
            (100 * KIB, &[1, 200 * KIB, 50 * KIB, 127 * KIB, 1]),
            (900 * KIB, &[124 * KIB]), // less than the minimum to come: no threshold
            (0, &[129 * KIB, 895 * KIB]),
        ];
        for (buffered, sizes) in cases {
            let mut rest = &data[buffered..];
            let mut pieces = VecDeque::new();
            for &size in sizes {
                let (piece, tail) = rest.split_at(size.min(rest.len()));
                pieces.push_back(piece.to_vec());
                rest = tail;
            }
            if !rest.is_empty() {
                pieces.push_back(rest.to_vec());
            }
            let mut reader = Pieces { pieces, threshold: Mutex::new(1), thresholds_set: Mutex::new(Vec::new()) };
            let mut buf = BytesMut::from(&data[..buffered]);
            let payload = read_payload(&mut reader, &mut buf, len).await.unwrap();
            assert!(payload[..] == data[..], "payload bytes in order");
            assert_eq!(*reader.threshold.lock().unwrap(), 1, "threshold restored for the next header");
            let set = reader.thresholds_set.into_inner().unwrap();
            if len - buffered >= WAKE_FOR_PAYLOAD_MIN_BYTES {
                assert_eq!(set.first(), Some(&(len - buffered)), "waits for the whole rest at once");
            } else {
                assert!(set.is_empty(), "small rests are read as they come: {set:?}");
            }
        }
    }
}
