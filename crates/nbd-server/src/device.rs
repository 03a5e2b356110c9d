//! The block-device contract the server serves. The crate knows nothing about what is
//! behind it: a RAID array, a file, memory.
//!
//! All offsets and lengths are bytes. The server has already checked every request
//! against `info().size_bytes`, the advertised flags and the read-only state, so a device
//! only sees in-range requests of the kinds it advertised. Futures are boxed so exports
//! can be `Arc<dyn BlockDevice>`.
//!
//! Durability contract (NBD "ordering of messages and writes"): `flush` must make every
//! write that *completed* before it was called durable, no matter which connection
//! issued it; `write(.., fua = true)` completes only once its data is durable.

use std::fs::File;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::file_mapping::FileMapping;
use crate::protocol::consts::MAX_PAYLOAD_BYTES;

/// A boxed, sendable future returned by device operations.
pub type DeviceFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a device is and can do; fixed for the life of an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub size_bytes: u64,
    pub read_only: bool,
    /// FLUSH and FUA are honoured (NBD SEND_FLUSH | SEND_FUA).
    pub can_flush: bool,
    pub can_trim: bool,
    pub can_write_zeroes: bool,
    /// WRITE_ZEROES with FAST_ZERO can be honoured (else the server answers ENOTSUP).
    pub can_fast_zero: bool,
    /// CACHE is implemented (prefetch hint).
    pub can_cache: bool,
    /// State is shared across connections: a FLUSH on one covers writes on all.
    pub can_multi_conn: bool,
    pub rotational: bool,
    /// `NBD_INFO_BLOCK_SIZE`: minimum block (power of two, 1..=65536).
    pub min_block_bytes: u32,
    /// Preferred block (power of two, >= max(min, 512)), e.g. the RAID stripe width. A value
    /// that is not a power of two (a stripe of 3 data chunks) is advertised as its largest
    /// power-of-two divisor (the chunk size); 0 means 4096.
    pub preferred_block_bytes: u32,
    /// Largest READ/WRITE payload accepted (the server caps it at 64 MiB). The server
    /// always advertises 64 MiB to clients and splits larger client requests into pieces
    /// of at most this size (rounded down to `min_block_bytes`), so a device never sees a
    /// READ/WRITE longer than this. 0 means 64 MiB.
    pub max_payload_bytes: u32,
    /// The device takes READ and WRITE at any byte offset and length although it prefers
    /// `min_block_bytes` (it does its own read-modify-write of partial blocks, atomically
    /// against other writes). Clients that do not negotiate block sizes then get a minimum
    /// block of 1, as the spec recommends; others keep `min_block_bytes`.
    pub byte_granular: bool,
    /// Human-readable text for `NBD_INFO_DESCRIPTION` and LIST.
    pub description: String,
}

impl DeviceInfo {
    /// A writable device of `size_bytes` that supports every optional command, with byte
    /// granularity, 4 KiB preferred blocks and the protocol's largest payload.
    pub fn full_featured(size_bytes: u64, description: String) -> Self {
        Self {
            size_bytes,
            read_only: false,
            can_flush: true,
            can_trim: true,
            can_write_zeroes: true,
            can_fast_zero: true,
            can_cache: true,
            can_multi_conn: true,
            rotational: false,
            min_block_bytes: 1,
            preferred_block_bytes: 4096,
            max_payload_bytes: MAX_PAYLOAD_BYTES,
            byte_granular: false,
            description,
        }
    }
}

/// Flags of a WRITE_ZEROES request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    pub fua: bool,
    /// The range must stay allocated (no hole punching).
    pub no_hole: bool,
    /// Fail with [`DeviceErrorKind::NotSupported`] rather than be slower than a WRITE.
    pub fast_zero: bool,
}

/// One piece of READ data, in order; together the pieces cover the request exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadChunk {
    Data(Bytes),
    /// `n` bytes that read as zero (may be sent as an NBD hole).
    Zero(u32),
    /// Bytes of a file, sent by the kernel from the page cache to the socket (from the
    /// range's mapping, else `sendfile`) when the reply is written, without a copy through
    /// the server.
    File(FileRange),
}

impl ReadChunk {
    pub fn len(&self) -> usize {
        match self {
            ReadChunk::Data(b) => b.len(),
            ReadChunk::Zero(n) => *n as usize,
            ReadChunk::File(range) => range.len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads of at least this length are worth answering with [`ReadChunk::File`] where a
/// device can; shorter ones are cheaper copied into a reply the server batches with others.
/// (Random reads of a tmpfs file, fio QD16-32, `sendfile` against `pread`: 64 KiB about
/// 0.85x, 128 KiB about 1.08x; crate README. 128 KiB is also the Linux NBD client's default
/// largest request.)
pub const SEND_FILE_MIN_BYTES: u32 = 128 * 1024;

/// `len` bytes of `file` from `offset`, for [`ReadChunk::File`].
///
/// Contract: the bytes are read when the reply is written, so a device returns this only
/// for a file whose pages are in memory (tmpfs, ramfs: sending never waits for a disk) and
/// that covers the range for as long as the device lives. A write to the range that races
/// the reply may be seen by it, as the protocol allows for requests in flight together.
/// If the file turns out shorter, the connection is closed (the reply header is already
/// on the wire), never padded.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub file: Arc<File>,
    pub offset: u64,
    pub len: u32,
    /// A shared mapping of `file` the device holds, if any: the range is then sent from it
    /// with `sendmsg` (one copy, by the kernel) rather than with `sendfile` or through a
    /// buffer (`send_file.rs` says why).
    pub mapping: Option<Arc<crate::FileMapping>>,
}

/// The same bytes of the same file; the mapping is how they are sent, not what they are.
impl PartialEq for FileRange {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.file, &other.file) && self.offset == other.offset && self.len == other.len
    }
}

impl Eq for FileRange {}

/// WRITEs of at least this length are worth receiving in place where a device offers it
/// ([`BlockDevice::write_targets`]); for shorter ones the extra calls cost more than the
/// copy they save.
pub const RECEIVE_IN_PLACE_MIN_BYTES: u32 = 128 * 1024;

/// `len` bytes of a mapped file from `offset`: where part of a WRITE's payload is received.
#[derive(Clone)]
pub struct WriteTarget {
    pub mapping: Arc<FileMapping>,
    pub offset: u64,
    pub len: u32,
}

/// One `base:allocation` extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len_bytes: u64,
    /// NBD_STATE_HOLE: not allocated.
    pub hole: bool,
    /// NBD_STATE_ZERO: reads as zeros.
    pub zero: bool,
}

/// Why a device operation failed; mapped to an NBD error code in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceErrorKind {
    /// EIO.
    Io,
    /// ENOSPC.
    NoSpace,
    /// EINVAL.
    Invalid,
    /// ENOTSUP (only meaningful for FAST_ZERO).
    NotSupported,
    /// EPERM.
    ReadOnly,
    /// ESHUTDOWN.
    ShuttingDown,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DeviceError {
    pub kind: DeviceErrorKind,
    pub message: String,
    /// Byte offset where the error happened, when known (sent as NBD ERROR_OFFSET).
    pub offset: Option<u64>,
}

impl DeviceError {
    pub fn new(kind: DeviceErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), offset: None }
    }

    pub fn at(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// (Added by the protocol owner.) Classifies an OS error the way the NBD spec and
    /// nbdkit do: ENOSPC/EDQUOT/EFBIG → `NoSpace`, EROFS/EPERM/EACCES → `ReadOnly`,
    /// EOPNOTSUPP/ENOTSUP → `NotSupported`, EINVAL → `Invalid`, ESHUTDOWN → `ShuttingDown`,
    /// anything else → `Io`. The message keeps the OS text.
    pub fn from_io(err: &std::io::Error) -> Self {
        let kind = match err.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => DeviceErrorKind::NoSpace,
            Some(libc::EROFS | libc::EPERM | libc::EACCES) => DeviceErrorKind::ReadOnly,
            Some(libc::EOPNOTSUPP) => DeviceErrorKind::NotSupported,
            Some(libc::EINVAL) => DeviceErrorKind::Invalid,
            Some(libc::ESHUTDOWN) => DeviceErrorKind::ShuttingDown,
            _ => DeviceErrorKind::Io,
        };
        Self::new(kind, err.to_string())
    }
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Anything that can be served over NBD.
pub trait BlockDevice: Send + Sync + 'static {
    fn info(&self) -> DeviceInfo;

    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>>;

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>>;

    /// The memory alignment [`write`](Self::write) payloads should start at for the device to
    /// write them without copying them first (e.g. O_DIRECT files); 1 (the default): any.
    /// Above 1, the server receives each WRITE payload straight into its own buffer (a 4 KiB
    /// boundary) instead of taking it out of the connection's read buffer: the header after a
    /// WRITE is read on its own, so the payload behind it is not read ahead with it.
    fn payload_alignment(&self) -> usize {
        1
    }

    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>>;

    /// Discard hint; contents of the range are unspecified afterwards.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>>;

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>>;

    /// Where the payload of a WRITE of `len` bytes at `offset` may be received straight
    /// into, instead of being passed to [`write`](Self::write): pages of mapped files (in
    /// memory), in request order, covering the request exactly. The server then receives the
    /// bytes there and calls [`write_received`](Self::write_received). `None` (the default)
    /// means "pass it to `write`"; so does an error (`write` then reports it). Asked only on
    /// TCP, for WRITEs of at least [`RECEIVE_IN_PLACE_MIN_BYTES`] and at most the device's
    /// `max_payload_bytes` whose payload is not yet all received. A target the kernel cannot
    /// copy into (a page past the end of a truncated file, no room on tmpfs) is written with
    /// `pwrite` instead, which reports such errors. Nothing tells the device if the
    /// connection fails before `write_received`, so this must not take anything that only
    /// `write_received` gives back.
    ///
    /// Contract: whatever must happen before the bytes land (e.g. marking an array dirty) is
    /// done when this returns; the write is complete once `write_received` returns. If the
    /// connection fails mid-payload, part of the range may hold new bytes, as after any
    /// write that was never answered.
    fn write_targets(&self, _offset: u64, _len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Completes a WRITE whose payload was received into [`write_targets`](Self::write_targets);
    /// with `fua` it is durable on return. The default flushes for `fua`.
    fn write_received(&self, _offset: u64, _len: u32, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        if fua { self.flush() } else { Box::pin(std::future::ready(Ok(()))) }
    }

    /// Prefetch hint; the default does nothing.
    fn cache(&self, _offset: u64, _len: u64) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// The meta contexts of its own the device answers BLOCK_STATUS for, beside
    /// `base:allocation` ("namespace:name"; fixed for the life of the device). None by
    /// default.
    fn meta_contexts(&self) -> &'static [&'static str] {
        &[]
    }

    /// Status in context `meta_contexts()[index]` from `offset`: (length, flags) extents in
    /// order covering at least one byte (the server clips them to the request). The default
    /// says flags 0 over the range.
    fn context_status(&self, index: usize, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<(u64, u32)>>> {
        let _ = (index, offset);
        Box::pin(std::future::ready(Ok(vec![(len, 0)])))
    }

    /// Allocation status from `offset` covering at least one byte; the default reports one
    /// allocated, non-zero extent (always a safe answer).
    fn block_status(&self, _offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<Extent>>> {
        Box::pin(std::future::ready(Ok(vec![Extent { len_bytes: len, hole: false, zero: false }])))
    }
}
