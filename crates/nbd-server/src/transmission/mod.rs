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
//! order. READ data that the device returned as a file range goes out from the file's mapping
//! or with `sendfile` in the middle of a batch (`send_file.rs`).
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
//!
//! Files, one concept each: `connection.rs` (the framing of one connection: headers,
//! payloads, the in-place path via `receive.rs`), `admission.rs` (request slots and byte
//! permits, interruptible waits), `byte_budget.rs` (a connection's reserve and share of the
//! pool, and the permits a request holds), `dispatch.rs` (a request against the device, and
//! its reply), `reply_writer.rs` (batched vectored writes of replies, file ranges), and this
//! file (the reader loop that schedules them). `admission` uses `reply_writer` (it writes out
//! the reader's replies before it waits); both use `byte_budget`, which uses neither.

mod admission;
mod byte_budget;
mod connection;
mod dispatch;
mod receive;
mod reply_writer;

pub use receive::buffered_payload_copied_bytes;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span};

use crate::advertise::Advertised;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::protocol::consts::cmd;
use crate::protocol::framing::{Framing, ReplyTo};
use crate::protocol::request::{ExportLimits, Request};
use crate::request_source::RequestSource;
use crate::send_file::ReplySink;
use admission::Gate;
use byte_budget::ByteBudget;
use connection::{Connection, Incoming, Payload};
use dispatch::{RequestCtx, rejection_reply};
use reply_writer::{LOCAL_FLUSH_REPLIES, LocalReplies, Outgoing, SocketWriter, write_batch, write_loop};

/// Requests up to this length may be executed inline by the reader...
const INLINE_MAX_BYTES: u32 = 128 * 1024;
/// ... except WRITEs from this length on, which are handed off (`yield_to_the_spawned_task`).
const HAND_OFF_WRITE_MIN_BYTES: u32 = 128 * 1024;
/// Replies of at least this size are written by the request's own task when it can.
const DIRECT_REPLY_MIN_BYTES: usize = 128 * 1024;
/// Everything a connection needs for the transmission phase.
pub(crate) struct Transmission {
    pub device: Arc<dyn BlockDevice>,
    pub advertised: Advertised,
    pub framing: Framing,
    /// The meta contexts selected (see `handshake::Negotiated::meta_contexts`).
    pub meta_contexts: u32,
    /// Server-wide bytes-in-flight pool and its size (`ServerConfig::max_in_flight_bytes`).
    pub in_flight_bytes: Arc<Semaphore>,
    pub in_flight_pool_bytes: usize,
    pub max_requests: usize,
    /// `ServerConfig::idle_timeout`.
    pub idle_timeout: Option<std::time::Duration>,
    /// `ServerConfig::stall_timeout`.
    pub stall_timeout: std::time::Duration,
    pub shutdown: CancellationToken,
    pub send_file: crate::send_file::SendFilePolicy,
}

pub(crate) async fn run<R, W>(reader: R, writer: W, read_buf: BytesMut, t: Transmission) -> Result<()>
where
    R: RequestSource,
    W: ReplySink,
{
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let abort = CancellationToken::new();
    let slots = Arc::new(Semaphore::new(t.max_requests));
    let stall_timeout = t.stall_timeout;
    let shared = Arc::new(Mutex::new(SocketWriter {
        writer,
        scratch: Vec::with_capacity(16 * 1024),
        stall_timeout,
        send_file: t.send_file.clone(),
    }));
    let writer_task = tokio::spawn(write_loop(shared.clone(), rx, abort.clone()).in_current_span());

    let bytes = ByteBudget::new(t.in_flight_bytes.clone(), t.in_flight_pool_bytes);
    let gate = Gate { t: &t, slots: &slots, shared: &shared, abort: &abort, bytes: &bytes };
    let aligned_payloads = t.device.payload_alignment() > 1;
    let mut reader = Connection { reader, buf: read_buf, gate, aligned_payloads, header_alone: false };
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

async fn read_loop<R, W>(
    r: &mut Connection<'_, R, W>,
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
        framing: t.framing,
        meta_context_selected: t.meta_contexts != 0,
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
                let to = ReplyTo { framing: t.framing, cookie: header.cookie, offset: header.offset };
                let reply = rejection_reply(to, rejection);
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
            to: ReplyTo { framing: t.framing, cookie: header.cookie, offset: header.offset },
            piece_bytes: t.advertised.device_piece_bytes,
            meta_contexts: t.meta_contexts,
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
        let hand_off =
            header.command == cmd::WRITE && header.length >= u64::from(HAND_OFF_WRITE_MIN_BYTES) && !in_place;
        let ready = if (header.length <= u64::from(INLINE_MAX_BYTES) || in_place) && !hand_off {
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
                        tokio::select! {
                            biased;
                            // A hard disconnect abandons the write, as `write_loop` does.
                            _ = abort.cancelled() => {}
                            written = write_batch(&mut guard, std::slice::from_ref(&outgoing)) => {
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
