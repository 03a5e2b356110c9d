//! [`FileDevice`]: a [`BlockDevice`] over a regular file or a block device.
//!
//! Every operation is a blocking syscall. On a disk-backed file it runs on tokio's blocking
//! pool (`spawn_blocking`); on a memory-backed file (tmpfs, ramfs: detected with `fstatfs`,
//! or forced with [`FileDevice::set_inline_io`]) it runs inline in the calling task, since
//! there a syscall is a memory copy that never waits for a disk and the thread hand-off
//! would cost more than the copy. Writes of any size run inline (1 MiB writes: 0.85-0.90x
//! nbdkit through the pool, 0.98-1.15x inline; `bench/vs-nbdkit.sh`). Reads of 128 KiB and more
//! of a memory-backed file are not read by the server: they return a [`FileRange`] with
//! the file's mapping, which the server sends with `sendmsg` from the mapped pages (one
//! kernel copy; [`FileDevice::set_send_reads_from_mapping`] turns that to `sendfile`);
//! [`FileDevice::set_send_file_reads`] turns file ranges off. Smaller reads use `pread`, whose replies the server batches. Likewise,
//! WRITEs of 128 KiB and more to a memory-backed file are received straight into a shared
//! mapping of it ([`FileMapping`](crate::FileMapping), one copy instead of two; [`FileDevice::set_receive_writes_in_place`]
//! turns that off). The syscalls are
//! `pread`/`pwrite` (offset-explicit, so concurrent requests never share a file position),
//! `fdatasync` for FLUSH and FUA, `fallocate` for TRIM (`PUNCH_HOLE`) and WRITE_ZEROES
//! (`PUNCH_HOLE`, or with NO_HOLE `ZERO_RANGE`, falling back to punch + allocate and
//! finally to writing zeroes, which FAST_ZERO refuses), `lseek(SEEK_DATA/SEEK_HOLE)` for
//! block status and `posix_fadvise(WILLNEED)` for CACHE.
//!
//! One file descriptor is shared by all connections, and the page cache is shared, so the
//! device is multi-conn safe: a FLUSH (fdatasync) covers writes from every connection.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::buffer_pool;

use crate::device::{
    BlockDevice, DeviceError, DeviceErrorKind, DeviceFuture, DeviceInfo, DeviceResult, Extent, FileRange, ReadChunk,
    SEND_FILE_MIN_BYTES, WriteTarget, ZeroFlags,
};
use crate::file_mapping::FileMappings;

/// Block status stops after this many extents (the rest of the range is left undescribed,
/// which the protocol allows).
const MAX_EXTENTS: usize = 1024;
/// Memory-backed operations that may copy up to this much run inline; larger ones go to the
/// blocking pool (except writes and reads answered with file ranges, see the module docs).
const INLINE_COPY_MAX_BYTES: u64 = 128 * 1024;
/// Buffer used when zeroes must be written by hand.
const ZERO_WRITE_BYTES: usize = 1024 * 1024;

/// A file served as a block device.
pub struct FileDevice {
    file: Arc<File>,
    info: DeviceInfo,
    /// Run syscalls in the calling task instead of the blocking pool.
    inline_io: bool,
    /// Answer large reads with file ranges the server sends itself (memory-backed files only).
    send_file_reads: bool,
    /// Offer large writes a mapping of the file to be received into (memory-backed only).
    receive_writes_in_place: bool,
    /// Hand the file ranges of large reads the file's mapping, to be sent from it.
    send_reads_from_mapping: bool,
    /// That mapping (writable unless the file is open read-only), made at first use.
    mapping: FileMappings,
}

/// Whether `file` is a regular file living in memory (tmpfs, ramfs), where I/O syscalls
/// never block on a disk. (Device nodes live on devtmpfs, which reports tmpfs too.)
fn is_memory_backed(file: &File) -> bool {
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    if !file.metadata().is_ok_and(|m| m.file_type().is_file()) {
        return false;
    }
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs writes a complete `statfs` into the pointed-to buffer when it returns 0;
    // the buffer is only read in that case.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) };
    if r != 0 {
        return false;
    }
    // SAFETY: fstatfs returned 0, so the struct is initialised.
    let stat = unsafe { stat.assume_init() };
    // `f_type` is i64 on x86_64 but narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let f_type = stat.f_type as i64;
    #[allow(clippy::unnecessary_cast)]
    let tmpfs = libc::TMPFS_MAGIC as i64;
    f_type == tmpfs || f_type == RAMFS_MAGIC
}

impl FileDevice {
    /// Opens `path` (read-write unless `read_only`) and serves its current size.
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let mut device = Self::from_file(file, read_only)?;
        device.info.description = format!("file {}", path.display());
        Ok(device)
    }

    /// Serves an open file; its size is taken now and fixed for the life of the device.
    pub fn from_file(file: File, read_only: bool) -> io::Result<Self> {
        use std::io::{Seek, SeekFrom};
        let mut handle = &file;
        // Seeking to the end works for regular files and block devices alike.
        let size_bytes = handle.seek(SeekFrom::End(0))?;
        let info = DeviceInfo { read_only, ..DeviceInfo::full_featured(size_bytes, String::from("file")) };
        let inline_io = is_memory_backed(&file);
        Ok(Self {
            file: Arc::new(file),
            info,
            inline_io,
            send_file_reads: inline_io,
            receive_writes_in_place: inline_io && !read_only,
            send_reads_from_mapping: inline_io,
            mapping: FileMappings::default(),
        })
    }

    /// Forces syscalls to run inline (`true`) or on the blocking pool (`false`), overriding
    /// the memory-backed detection done at open.
    pub fn set_inline_io(&mut self, inline: bool) {
        self.inline_io = inline;
    }

    /// Whether syscalls run inline in the calling task.
    pub fn inline_io(&self) -> bool {
        self.inline_io
    }

    /// Answers reads of 128 KiB and more with [`ReadChunk::File`] (sent by the server when the reply
    /// is written) instead of `pread` (`true` by default on memory-backed files). Only
    /// sound for a file whose pages are in memory and that nobody shrinks while it is
    /// served (see [`FileRange`]).
    pub fn set_send_file_reads(&mut self, enabled: bool) {
        self.send_file_reads = enabled;
    }

    /// Whether large reads are answered with file ranges.
    pub fn send_file_reads(&self) -> bool {
        self.send_file_reads
    }

    /// Offers WRITEs of 128 KiB and more a shared mapping of the file to be received into
    /// ([`BlockDevice::write_targets`]; `true` by default on writable memory-backed files).
    /// Only sensible for a file whose pages are in memory (elsewhere the receive would wait
    /// on page faults).
    pub fn set_receive_writes_in_place(&mut self, enabled: bool) {
        self.receive_writes_in_place = enabled && !self.info.read_only;
    }

    /// Whether large writes are received into a mapping of the file.
    pub fn receive_writes_in_place(&self) -> bool {
        self.receive_writes_in_place
    }

    /// Hands the file ranges of large reads a shared mapping of the file (`true` by default
    /// on memory-backed files, read-only ones included), so the server sends them with
    /// `sendmsg` from it; `false`: the server sends them with `sendfile` or a buffer.
    pub fn set_send_reads_from_mapping(&mut self, enabled: bool) {
        self.send_reads_from_mapping = enabled;
    }

    /// Whether file ranges of large reads carry the file's mapping.
    pub fn send_reads_from_mapping(&self) -> bool {
        self.send_reads_from_mapping
    }

    /// Runs a blocking operation that may copy `copy_bytes`: inline when the file is
    /// memory-backed and that is at most [`INLINE_COPY_MAX_BYTES`], else on the blocking pool.
    fn blocking<T, F>(&self, copy_bytes: u64, op: F) -> DeviceFuture<'_, DeviceResult<T>>
    where
        T: Send + 'static,
        F: FnOnce(&File) -> DeviceResult<T> + Send + 'static,
    {
        if self.inline_io && copy_bytes <= INLINE_COPY_MAX_BYTES {
            return Box::pin(std::future::ready(op(&self.file)));
        }
        let file = self.file.clone();
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || op(&file)).await {
                Ok(result) => result,
                Err(e) => Err(DeviceError::new(DeviceErrorKind::Io, format!("I/O task failed: {e}"))),
            }
        })
    }
}

/// Maps an OS error to a device error at `offset`.
fn os_error(e: io::Error, offset: u64) -> DeviceError {
    DeviceError::from_io(&e).at(offset)
}

/// `pread` of exactly `len` bytes into a (pooled) buffer, without zero-filling it first.
pub(crate) fn pread_exact(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let mut buf: Vec<u8> = buffer_pool::alloc(len);
    debug_assert!(buf.is_empty() && buf.capacity() >= len);
    let mut done = 0usize;
    while done < len {
        let at = offset + done as u64;
        let at = libc::off_t::try_from(at).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `buf` has capacity `len`; `done..len` is spare capacity the kernel may
        // write into, and only the bytes it reports written are later exposed via set_len.
        let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().add(done).cast(), len - done, at) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank below the device size"));
        }
        done += n as usize;
    }
    // SAFETY: pread initialised exactly the first `len` bytes (loop invariant `done == len`).
    unsafe { buf.set_len(len) };
    Ok(buffer_pool::freeze(buf))
}

/// `fallocate(mode)` over a byte range.
fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        // SAFETY: a plain syscall on a file descriptor owned by `file`, no pointers involved.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::ENODEV))
}

/// Writes `len` zero bytes at `offset` with ordinary writes.
fn write_zeroes_by_hand(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let zeroes = vec![0u8; ZERO_WRITE_BYTES.min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeroes.len() as u64) as usize;
        file.write_all_at(&zeroes[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// `lseek(fd, from, whence)`; `Ok(None)` for ENXIO (no data/hole at or after `from`).
fn seek_data_or_hole(file: &File, from: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let from = libc::off_t::try_from(from).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain syscall on a file descriptor owned by `file`. It moves the shared file
    // position, which nothing else uses (all I/O is pread/pwrite with explicit offsets).
    let r = unsafe { libc::lseek(file.as_raw_fd(), from, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) { Ok(None) } else { Err(e) };
    }
    Ok(Some(r as u64))
}

/// Allocation map of `offset..offset+len` of `file` from SEEK_DATA/SEEK_HOLE: holes (read as
/// zero) and data, at most 1024 extents (they may cover less than `len`). Errors as lseek's
/// (EINVAL and the like where a file system cannot seek holes). Also used for RAID members
/// that are files (member-io).
pub fn extents_of(file: &File, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
    let end = offset + len;
    let mut extents = Vec::new();
    let mut pos = offset;
    while pos < end && extents.len() < MAX_EXTENTS {
        let data_start = seek_data_or_hole(file, pos, libc::SEEK_DATA)?.unwrap_or(end).min(end);
        if data_start > pos {
            extents.push(Extent { len_bytes: data_start - pos, hole: true, zero: true });
            pos = data_start;
        }
        if pos >= end {
            break;
        }
        let hole_start = seek_data_or_hole(file, pos, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
        if hole_start <= pos {
            // Not expected from a sane filesystem; report the rest as data and stop.
            extents.push(Extent { len_bytes: end - pos, hole: false, zero: false });
            break;
        }
        extents.push(Extent { len_bytes: hole_start - pos, hole: false, zero: false });
        pos = hole_start;
    }
    Ok(extents)
}

impl BlockDevice for FileDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn write_targets(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        // (The server checks that the range lies inside the mapping.)
        let mapping = self.receive_writes_in_place.then(|| self.mapping.of(&self.file)).flatten();
        let target = mapping.map(|mapping| vec![WriteTarget { mapping, offset, len }]);
        Box::pin(std::future::ready(Ok(target)))
    }

    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        if self.send_file_reads && len >= SEND_FILE_MIN_BYTES {
            let mapping = self.send_reads_from_mapping.then(|| self.mapping.of(&self.file)).flatten();
            let range = FileRange { file: self.file.clone(), offset, len, mapping };
            return Box::pin(std::future::ready(Ok(vec![ReadChunk::File(range)])));
        }
        self.blocking(u64::from(len), move |file| {
            pread_exact(file, offset, len as usize).map(|b| vec![ReadChunk::Data(b)]).map_err(|e| os_error(e, offset))
        })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        // Inline at any size on memory-backed files (measured faster, see the module docs).
        self.blocking(0, move |file| {
            file.write_all_at(&data, offset).map_err(|e| os_error(e, offset))?;
            if fua {
                file.sync_data().map_err(|e| os_error(e, offset))?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        self.blocking(0, |file| file.sync_data().map_err(|e| DeviceError::from_io(&e)))
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.blocking(len, move |file| {
            match fallocate(file, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len) {
                Ok(()) => {}
                // TRIM is a hint: a filesystem that cannot punch holes just keeps the data.
                Err(e) if is_unsupported(&e) => return Ok(()),
                Err(e) => return Err(os_error(e, offset)),
            }
            if fua {
                file.sync_data().map_err(|e| os_error(e, offset))?;
            }
            Ok(())
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        self.blocking(len, move |file| {
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            let zero_range = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            let fast = if flags.no_hole {
                fallocate(file, zero_range, offset, len)
                    .or_else(|e| if is_unsupported(&e) { fallocate(file, punch, offset, len) } else { Err(e) })
                    .and_then(|()| fallocate(file, libc::FALLOC_FL_KEEP_SIZE, offset, len))
            } else {
                fallocate(file, punch, offset, len)
                    .or_else(|e| if is_unsupported(&e) { fallocate(file, zero_range, offset, len) } else { Err(e) })
            };
            match fast {
                Ok(()) => {}
                Err(e) if is_unsupported(&e) => {
                    if flags.fast_zero {
                        return Err(DeviceError::new(DeviceErrorKind::NotSupported, "no fast way to zero this file"));
                    }
                    write_zeroes_by_hand(file, offset, len).map_err(|e| os_error(e, offset))?;
                }
                Err(e) => return Err(os_error(e, offset)),
            }
            if flags.fua {
                file.sync_data().map_err(|e| os_error(e, offset))?;
            }
            Ok(())
        })
    }

    fn cache(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<()>> {
        self.blocking(0, move |file| {
            let (Ok(at), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
                return Err(DeviceError::new(DeviceErrorKind::Invalid, "range too large").at(offset));
            };
            // SAFETY: a plain syscall on a file descriptor owned by `file`, no pointers involved.
            let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), at, n, libc::POSIX_FADV_WILLNEED) };
            if r != 0 {
                return Err(os_error(io::Error::from_raw_os_error(r), offset));
            }
            Ok(())
        })
    }

    fn block_status(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<Extent>>> {
        self.blocking(0, move |file| match extents_of(file, offset, len) {
            Ok(extents) => Ok(extents),
            // No SEEK_DATA support: "allocated, contents unknown" is always correct.
            Err(e) if is_unsupported(&e) => Ok(vec![Extent { len_bytes: len, hole: false, zero: false }]),
            Err(e) => Err(os_error(e, offset)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_write_zero_trim_and_block_status() {
        for inline in [false, true] {
            exercise(inline).await;
        }
    }

    #[test]
    fn tmpfs_is_detected_as_memory_backed() {
        let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
        assert!(FileDevice::open(shm.path(), false).unwrap().inline_io());
        let disk = tempfile::NamedTempFile::new_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        assert!(!FileDevice::open(disk.path(), false).unwrap().inline_io());
        // A device node's filesystem (devtmpfs) says tmpfs, but its I/O goes to the device.
        assert!(!FileDevice::open("/dev/null", true).unwrap().inline_io());
    }

    #[tokio::test]
    async fn large_reads_of_memory_backed_files_are_file_ranges() {
        let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
        shm.as_file().set_len(1 << 20).unwrap();
        let mut dev = FileDevice::open(shm.path(), false).unwrap();
        assert!(dev.send_file_reads(), "on by default for tmpfs");
        let data: Vec<u8> = (0..256 << 10).map(|i| (i % 251) as u8).collect();
        dev.write(4096, Bytes::from(data.clone()), false).await.unwrap();
        match dev.read(4096, 256 << 10).await.unwrap().as_slice() {
            [ReadChunk::File(range)] => {
                assert_eq!((range.offset, range.len), (4096, 256 << 10));
                let mut back = vec![0u8; data.len()];
                range.file.read_exact_at(&mut back, range.offset).unwrap();
                assert!(back == data, "the range names the written bytes");
            }
            other => panic!("expected one file range, got {other:?}"),
        }
        // Under 128 KiB, or with the feature off: read now.
        assert!(matches!(dev.read(4096, 128 << 10).await.unwrap().as_slice(), [ReadChunk::File(_)]));
        assert_eq!(
            dev.read(4096, 124 << 10).await.unwrap(),
            vec![ReadChunk::Data(Bytes::from(data[..124 << 10].to_vec()))]
        );
        dev.set_send_file_reads(false);
        assert_eq!(dev.read(4096, 256 << 10).await.unwrap(), vec![ReadChunk::Data(Bytes::from(data.clone()))]);
        // Disk-backed files never send ranges by default.
        let disk = tempfile::NamedTempFile::new_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        assert!(!FileDevice::open(disk.path(), false).unwrap().send_file_reads());
    }

    async fn exercise(inline: bool) {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.as_file().set_len(8 << 20).unwrap();
        let mut dev = FileDevice::open(tmp.path(), false).unwrap();
        dev.set_inline_io(inline);
        assert_eq!(dev.info().size_bytes, 8 << 20);

        let data: Vec<u8> = (0..65536).map(|i| (i % 253) as u8).collect();
        dev.write(1 << 20, Bytes::from(data.clone()), true).await.unwrap();
        let got = dev.read(1 << 20, 65536).await.unwrap();
        assert_eq!(got, vec![ReadChunk::Data(Bytes::from(data))]);

        let status = dev.block_status(0, 8 << 20).await.unwrap();
        let data_bytes: u64 = status.iter().filter(|e| !e.hole).map(|e| e.len_bytes).sum();
        assert!((65536..8 << 20).contains(&data_bytes), "{status:?}");
        assert_eq!(status.iter().map(|e| e.len_bytes).sum::<u64>(), 8 << 20);

        for no_hole in [false, true] {
            dev.write_zeroes(1 << 20, 4096, ZeroFlags { no_hole, ..Default::default() }).await.unwrap();
            let got = dev.read(1 << 20, 4096).await.unwrap();
            assert_eq!(got, vec![ReadChunk::Data(Bytes::from(vec![0u8; 4096]))]);
        }
        dev.trim(1 << 20, 65536, false).await.unwrap();
        dev.flush().await.unwrap();
        dev.cache(0, 4096).await.unwrap();
        assert!(dev.read(8 << 20, 1).await.is_err());
    }
}
