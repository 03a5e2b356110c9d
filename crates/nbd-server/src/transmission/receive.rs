//! Receiving a WRITE payload: whole into a pooled buffer (`read_payload`), or into the
//! device's mapped file pages (`write_targets`, `receive_in_place`), waking the reader only
//! once the payload is in (`WakeThreshold`, `RequestSource::set_wake_threshold`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Context;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tracing::debug;

use super::Transmission;
use crate::buffer_pool;
use crate::device::{DeviceError, DeviceResult, RECEIVE_IN_PLACE_MIN_BYTES, WriteTarget};
use crate::error::{Error, Result};
use crate::read_buffer::discard;
use crate::request_source::RequestSource;

/// Bytes of WRITE payloads copied out of connections' read buffers into payload buffers
/// (the part of a payload read ahead with its header), for the copies-per-byte metric.
static BUFFERED_PAYLOAD_COPIED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of WRITE payloads this process copied out of read buffers so far.
pub fn buffered_payload_copied_bytes() -> u64 {
    BUFFERED_PAYLOAD_COPIED_BYTES.load(Ordering::Relaxed)
}

/// One read of a payload, which fails the connection if the client sends nothing for `stall`.
async fn progress<T>(stall: Duration, read: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(stall, read)
        .await
        .map_err(|_| Error::Stalled { what: "sending a WRITE payload", after: stall })
}

/// A WRITE payload with at least this much still to come is received whole (`RequestSource`).
const WAKE_FOR_PAYLOAD_MIN_BYTES: usize = 128 * 1024;
/// Where the device wants a WRITE's payload received, if it does (checked: the targets
/// cover the request exactly, inside their mappings).
pub(super) async fn write_targets(t: &Transmission, offset: u64, len: u32) -> Option<Vec<WriteTarget>> {
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
    let inside = targets.iter().all(|t| t.mapping.receive_iovec(t.offset, t.len as usize).is_some());
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
pub(super) async fn receive_in_place<R: RequestSource>(
    reader: &mut R,
    buf: &mut BytesMut,
    targets: &[WriteTarget],
    len: usize,
    stall: Duration,
) -> Result<DeviceResult<()>> {
    debug_assert!(buf.len() < len);
    let buffered = buf.split().freeze();
    if let Err(e) = write_at_targets(targets, 0, &buffered) {
        discard(reader, buf, (len - buffered.len()) as u64).await?;
        return Ok(Err(e));
    }
    let rest = target_pieces(targets, buffered.len(), len - buffered.len());
    let iovecs =
        rest.map(|(target, at, n)| target.mapping.receive_iovec(at, n).expect("targets lie inside their mappings"));
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
        let n = match progress(stall, std::future::poll_fn(receive)).await? {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                threshold.finish(reader)?;
                debug!(received = done, len, "cannot receive into the mapping; the rest goes with pwrite");
                let rest = read_payload(reader, buf, len - done, stall).await?;
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

/// Reads a WRITE payload of `len` bytes into its own buffer, starting at a 4 KiB boundary
/// (`buffer_pool::alloc_aligned`): the buffered part is copied,
/// the rest is read straight into a (pooled) payload buffer, whole if it is large
/// (`RequestSource::set_wake_threshold`).
/// Each read must bring bytes within `stall` (`ServerConfig::stall_timeout`).
pub(super) async fn read_payload<R: RequestSource>(
    reader: &mut R,
    buf: &mut BytesMut,
    len: usize,
    stall: Duration,
) -> Result<Bytes> {
    debug_assert!(buf.len() < len);
    let mut payload = buffer_pool::alloc_aligned(len);
    let pad = payload.len();
    payload.extend_from_slice(buf);
    BUFFERED_PAYLOAD_COPIED_BYTES.fetch_add(buf.len() as u64, Ordering::Relaxed);
    buf.clear();
    let mut threshold = WakeThreshold::default();
    while payload.len() - pad < len {
        let remaining = len - (payload.len() - pad);
        threshold.before_read(reader, remaining, false)?;
        let mut limited = (&mut *reader).take(remaining as u64);
        if progress(stall, limited.read_buf(&mut payload)).await?? == 0 {
            return Err(Error::UnexpectedEof);
        }
    }
    threshold.finish(reader)?;
    debug_assert_eq!(payload.len() - pad, len);
    Ok(buffer_pool::freeze(payload).slice(pad..))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::Mutex;

    use std::task::Poll;

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
            let payload = read_payload(&mut reader, &mut buf, len, Duration::from_secs(5)).await.unwrap();
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
