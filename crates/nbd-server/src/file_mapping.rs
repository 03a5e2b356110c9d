//! [`FileMapping`]: a file in memory (tmpfs, ramfs) mapped shared, so a WRITE's payload can
//! be received from the socket straight into the file's pages and a READ sent from them.
//!
//! Why: a WRITE is otherwise copied twice by the server, socket → buffer (`recv`) and
//! buffer → page cache (`pwrite`). Received into a mapping of the file, it is copied once,
//! by the kernel, and the server's CPU per 1 MiB write drops by about a third
//! (crates/nbd-server/README.md). A READ sent with `sendmsg` from the mapping is likewise one
//! kernel copy, and cheaper than `sendfile` on some machines (send_file.rs).
//!
//! A file open for writing is mapped writable; one open only for reading is mapped read-only
//! and is only sent from (`FileMapping::send_iovec`).
//!
//! Safety model: the mapping's memory is only ever handed to the kernel (`recvmsg` and
//! `sendmsg` iovecs), never read or written through Rust references, so other writers of
//! the same file (`pwrite`, other connections) are no aliasing concern, and a file truncated
//! under the mapping makes the receive or send fail with `EFAULT` (a kernel copy from or
//! into a page past the end of the file, or into one a full tmpfs cannot allocate, is an
//! error, not a `SIGBUS`); the server then goes on with `pwrite` or `sendfile`, which report
//! such errors as errors.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// A shared mapping of a whole file, as long as it was when mapped.
pub struct FileMapping {
    file: Arc<File>,
    base: NonNull<u8>,
    len_bytes: usize,
    /// Mapped `PROT_WRITE` (the file is open for writing).
    writable: bool,
}

// SAFETY: the mapping is process-wide memory, valid until `Drop`; this type never creates
// references into it, it only hands addresses to the kernel, so sharing it across threads
// cannot create a data race in Rust's sense.
unsafe impl Send for FileMapping {}
// SAFETY: as above; `&FileMapping` only reads its immutable fields.
unsafe impl Sync for FileMapping {}

impl std::fmt::Debug for FileMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileMapping")
            .field("len_bytes", &self.len_bytes)
            .field("writable", &self.writable)
            .finish_non_exhaustive()
    }
}

impl FileMapping {
    /// Maps `file` (open for reading) at its current length, which must not be 0; writable
    /// if the file is open for writing too.
    pub fn new(file: Arc<File>) -> io::Result<Self> {
        let len_bytes =
            usize::try_from(file.metadata()?.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len_bytes == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot map an empty file"));
        }
        // SAFETY: F_GETFL on an open descriptor reads its status flags; no memory is passed.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let writable = flags & libc::O_ACCMODE == libc::O_RDWR;
        let protection = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh shared mapping chosen by the kernel (no fixed address, so nothing
        // existing is replaced) of an open descriptor; the result is checked below.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len_bytes, protection, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { file, base, len_bytes, writable })
    }

    /// The mapped file.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// How much of the file is mapped.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes as u64
    }

    /// `len` bytes at file offset `offset` as an iovec for the kernel to send from, if the
    /// range is mapped.
    pub(crate) fn send_iovec(&self, offset: u64, len: usize) -> Option<libc::iovec> {
        let start = usize::try_from(offset).ok()?;
        if start.checked_add(len)? > self.len_bytes {
            return None;
        }
        // SAFETY: `start + len <= len_bytes`, so the address stays inside the mapping.
        let base = unsafe { self.base.as_ptr().add(start) };
        Some(libc::iovec { iov_base: base.cast(), iov_len: len })
    }

    /// As [`Self::send_iovec`], for the kernel to receive into: `None` unless the mapping is
    /// writable.
    pub(crate) fn receive_iovec(&self, offset: u64, len: usize) -> Option<libc::iovec> {
        self.writable.then(|| self.send_iovec(offset, len)).flatten()
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no address into it outlives `self`
        // (iovecs are only used while their owner holds an `Arc<FileMapping>`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len_bytes) };
    }
}

/// The mappings a device made of its files, one per file, made at first use and kept for
/// the life of the device. A file that cannot be mapped is logged once and remembered as
/// such (its writes are then received into buffers).
///
/// Files are told apart by their `Arc`: the caller must hand the same `Arc<File>` for a
/// file each time (an entry holds it, so its address cannot be reused for another file).
/// Memory accounting: pages sent from or written through a mapping stay mapped, so they count in the
/// process's resident size (as shared memory) though they belong to the files.
#[derive(Default)]
pub struct FileMappings {
    entries: Mutex<Vec<MappedFile>>,
}

/// A file and its mapping (`None`: it could not be mapped).
type MappedFile = (Arc<File>, Option<Arc<FileMapping>>);

impl FileMappings {
    /// The mapping of `file` (writable if the file is open for writing), made now if it is
    /// the first call.
    pub fn of(&self, file: &Arc<File>) -> Option<Arc<FileMapping>> {
        let mut entries = self.entries.lock().expect("mapping list lock");
        if let Some((_, mapping)) = entries.iter().find(|(f, _)| Arc::ptr_eq(f, file)) {
            return mapping.clone();
        }
        let mapping = match FileMapping::new(file.clone()) {
            Ok(mapping) => Some(Arc::new(mapping)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot map a file; its large writes are received into buffers and its large reads sent without the mapping");
                None
            }
        };
        entries.push((file.clone(), mapping.clone()));
        mapping
    }
}
