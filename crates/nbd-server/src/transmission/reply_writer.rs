//! The reply writer: replies ready for the socket (`Outgoing`, holding the permits they free
//! once written), the reader's own batch (`LocalReplies`), and batched vectored writes under
//! the one mutex of the write half (`write_loop`, `write_batch`: headers and small data
//! copied together, large data as slices, file ranges by `send_file.rs`), so replies never
//! interleave on the wire.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

use super::byte_budget::BytePermit;
use crate::device::FileRange;
use crate::error::{Error, Result};
use crate::protocol::reply::{Reply, Segment};
use crate::send_file::{ReplySink, write_all_vectored};

/// The reader writes its collected replies once they hold this many bytes...
pub(super) const LOCAL_FLUSH_BYTES: usize = 256 * 1024;
/// ... or this many replies.
pub(super) const LOCAL_FLUSH_REPLIES: usize = 64;

/// A reply ready for the socket, with the permits it releases once written.
pub(super) struct Outgoing {
    pub(super) reply: Reply,
    pub(super) _slot: OwnedSemaphorePermit,
    pub(super) _bytes: Option<BytePermit>,
}

/// The socket's write half and the scratch buffer for headers, shared by both writers.
pub(super) struct SocketWriter<W> {
    pub(super) writer: W,
    pub(super) scratch: Vec<u8>,
    /// A batch the client does not take within this long ends the connection
    /// (`ServerConfig::stall_timeout`): its permits go back to the others.
    pub(super) stall_timeout: Duration,
    /// Whether file ranges without a mapping go out with `sendfile` now (else through a buffer).
    pub(super) send_file: crate::send_file::SendFilePolicy,
}

pub(super) type SharedWriter<W> = Arc<Mutex<SocketWriter<W>>>;

/// Replies the reader produced itself and has not written yet.
pub(super) struct LocalReplies {
    pub(super) replies: Vec<Outgoing>,
    pub(super) bytes: usize,
}

impl LocalReplies {
    pub(super) fn push(&mut self, outgoing: Outgoing) {
        self.bytes += outgoing.reply.wire_len();
        self.replies.push(outgoing);
    }

    pub(super) fn is_full(&self) -> bool {
        self.bytes >= LOCAL_FLUSH_BYTES || self.replies.len() >= LOCAL_FLUSH_REPLIES
    }

    /// Writes the collected replies (whole, under the writer lock) and releases their permits.
    pub(super) async fn flush<W: ReplySink>(&mut self, shared: &SharedWriter<W>) -> Result<()> {
        if self.replies.is_empty() {
            return Ok(());
        }
        write_batch(&mut *shared.lock().await, &self.replies).await?;
        self.replies.clear();
        self.bytes = 0;
        Ok(())
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
pub(super) async fn write_loop<W: ReplySink>(
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
            written = async { write_batch(&mut *shared.lock().await, &batch).await } => written,
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

/// Writes all replies of `batch` with as few syscalls as the socket allows, within the
/// stall timeout.
pub(super) async fn write_batch<W: ReplySink>(socket: &mut SocketWriter<W>, batch: &[Outgoing]) -> Result<()> {
    let stall = socket.stall_timeout;
    let use_sendfile = socket.send_file.use_sendfile();
    let SocketWriter { writer, scratch, .. } = socket;
    tokio::time::timeout(stall, write_replies(writer, batch, scratch, use_sendfile))
        .await
        .map_err(|_| Error::Stalled { what: "reading its replies", after: stall })?
}

async fn write_replies<W: ReplySink>(
    writer: &mut W,
    batch: &[Outgoing],
    scratch: &mut Vec<u8>,
    use_sendfile: bool,
) -> Result<()> {
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
                // A mapped range goes to the socket's own path whatever the policy.
                match use_sendfile || range.mapping.is_some() {
                    true => writer.write_then_send_file(&mut slices, range).await?,
                    false => crate::send_file::write_then_copy_file(writer, &mut slices, range).await?,
                }
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
    // A TLS session may hold the last records of the batch (the socket was full when they
    // were sealed): pushed out now, not with the next batch the client may never ask for.
    writer.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tokio::io::AsyncReadExt;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::protocol::framing::{Framing, ReplyTo};
    use crate::send_file::SendFilePolicy;

    /// A batch is on the wire when `write_batch` returns, also on a stream that holds written
    /// bytes until flushed (a TLS session holds its last records when the socket was full;
    /// here a `BufWriter`): a client waiting for those replies would wait forever.
    #[tokio::test]
    async fn a_written_batch_is_flushed() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let (_, writer) = tokio::io::split(tokio::io::BufWriter::new(near));
        let slots = Arc::new(Semaphore::new(4));
        let mut socket = SocketWriter {
            writer,
            scratch: Vec::new(),
            stall_timeout: Duration::from_secs(5),
            send_file: SendFilePolicy::new(slots.clone(), 4),
        };
        let mut reply = Reply::with_capacity(2);
        reply.push_simple(ReplyTo { framing: Framing::Simple, cookie: 7, offset: 0 }, 0);
        reply.push_data(Bytes::from(vec![0xa5; 1000]));
        let want = reply.to_vec();
        let outgoing = Outgoing { reply, _slot: slots.clone().acquire_owned().await.unwrap(), _bytes: None };
        write_batch(&mut socket, &[outgoing]).await.unwrap();
        let mut got = vec![0; want.len()];
        let read = tokio::time::timeout(Duration::from_secs(5), far.read_exact(&mut got)).await;
        assert!(read.is_ok(), "the batch's bytes stayed in the writer's buffer");
        assert_eq!(got, want);
    }
}
