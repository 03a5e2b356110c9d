//! Opening a member path: regular file or block device, O_DIRECT or buffered, its size and
//! alignment; plus [`FileRef`], the counted handle every in-flight request carries.
//!
//! ```text
//! open_member_file(path, direct, read_only)
//!   stat ─► regular file | block device (else NotFileOrBlockDevice)
//!   open(O_DIRECT) ─EINVAL & direct=auto─► open(buffered)
//!   statx(DIOALIGN) ─unsupported or >4096 & direct=auto─► reopen buffered
//!   size: st_size (file) | lseek(END) (block device); asked again by refresh_len, only grows
//! ```
//!
//! Writable block devices are opened with O_EXCL (an exclusive claim, like mdadm): a
//! mounted filesystem or a device another array uses cannot become a member by mistake.
//!
//! The member's size is taken at open and again when the array asks (`refresh_len`: a
//! volume resized in the cloud, a file extended) and it only grows: the array geometry
//! depends on it, and a file that shrinks under us must make reads fail rather than
//! silently change the geometry.
//! The file descriptor lives in an `Arc` shared by every request in flight ([`FileRef`]),
//! so closing a member while the kernel still works on it can never recycle the fd.

use std::fs::{File, OpenOptions as FsOpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use raid_core::buf::BUF_ALIGN;

use crate::dio_align::{self, DioAlign};
use crate::error::{MemberIoError, Result};
use crate::memory_fs::is_memory_backed;
use crate::options::DirectMode;

/// An open member device and what we know about it.
#[derive(Debug)]
pub(crate) struct MemberFile {
    file: Arc<File>,
    name: String,
    is_block_device: bool,
    len_bytes: AtomicU64,
    direct: bool,
    align_bytes: usize,
    read_only: bool,
    /// A buffered regular file on tmpfs/ramfs: its page cache is the storage.
    in_memory: bool,
    in_flight_ops: AtomicUsize,
    /// Set once `fallocate(PUNCH_HOLE)` returned EOPNOTSUPP, so we stop asking.
    pub(crate) punch_hole_unsupported: AtomicBool,
    /// Set once `fallocate(ZERO_RANGE)` returned EOPNOTSUPP.
    pub(crate) zero_range_unsupported: AtomicBool,
    /// Set once plain `fallocate(KEEP_SIZE)` (re-allocation after a punch) returned EOPNOTSUPP.
    pub(crate) allocate_unsupported: AtomicBool,
}

impl MemberFile {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
    pub(crate) fn as_file(&self) -> &File {
        &self.file
    }
    pub(crate) fn len_bytes(&self) -> u64 {
        self.len_bytes.load(Ordering::Acquire)
    }
    /// The device's size now; a larger one is taken from here on (see the module docs).
    pub(crate) fn refresh_len(&self) -> io::Result<u64> {
        let now = device_len(&self.file, self.is_block_device)?;
        self.len_bytes.fetch_max(now, Ordering::AcqRel);
        Ok(now)
    }
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }
    pub(crate) fn is_block_device(&self) -> bool {
        self.is_block_device
    }
    pub(crate) fn align_bytes(&self) -> usize {
        self.align_bytes
    }
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }
    /// The file, if it is a buffered file in memory whose bytes may be read or written in place.
    pub(crate) fn memory_file(&self) -> Option<&Arc<File>> {
        self.in_memory.then_some(&self.file)
    }
    /// Requests (including cancelled ones) the kernel or a worker still holds.
    pub(crate) fn in_flight_ops(&self) -> usize {
        self.in_flight_ops.load(Ordering::Acquire)
    }
}

/// A counted reference to an open member file; dropped only when the request it rides
/// with has fully completed, so `in_flight_ops` falls to zero only when nothing is pending.
pub(crate) struct FileRef(Arc<MemberFile>);

impl FileRef {
    pub(crate) fn new(file: &Arc<MemberFile>) -> Self {
        file.in_flight_ops.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(file))
    }
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.0.file.as_raw_fd()
    }
    pub(crate) fn file(&self) -> &MemberFile {
        &self.0
    }
}

impl Drop for FileRef {
    fn drop(&mut self) {
        let before = self.0.in_flight_ops.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "in-flight counter underflow");
    }
}

/// Opens `path` as a member according to `direct` and `read_only`.
pub(crate) fn open_member_file(path: &Path, direct: DirectMode, read_only: bool) -> Result<MemberFile> {
    let meta = std::fs::metadata(path).map_err(|source| MemberIoError::Stat { path: path.into(), source })?;
    let is_block_device = meta.file_type().is_block_device();
    if !meta.is_file() && !is_block_device {
        return Err(MemberIoError::NotFileOrBlockDevice { path: path.into() });
    }

    let exclusive = is_block_device && !read_only;
    let open = |direct| open_raw(path, direct, read_only, exclusive);
    let (file, align_bytes, direct) = match direct {
        DirectMode::Off => (open(false)?, 1, false),
        DirectMode::On => {
            let file = open(true).map_err(|e| refused_or_open(path, e))?;
            let align = direct_alignment(path, &file, is_block_device)?
                .ok_or_else(|| MemberIoError::DirectIoRefused { path: path.into(), source: einval() })?;
            (file, align, true)
        }
        DirectMode::Auto => match open(true) {
            Ok(file) => match direct_alignment(path, &file, is_block_device) {
                Ok(Some(align)) => (file, align, true),
                Ok(None) | Err(MemberIoError::UnsupportedAlignment { .. }) => {
                    drop(file); // release an O_EXCL claim before reopening
                    tracing::info!(member = %path.display(), "O_DIRECT unusable here; using buffered I/O");
                    (open(false)?, 1, false)
                }
                Err(e) => return Err(e),
            },
            Err(MemberIoError::Open { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(member = %path.display(), "filesystem refuses O_DIRECT; using buffered I/O");
                (open(false)?, 1, false)
            }
            Err(e) => return Err(e),
        },
    };

    let len_bytes =
        device_len(&file, is_block_device).map_err(|source| MemberIoError::Stat { path: path.into(), source })?;
    debug_assert!(align_bytes.is_power_of_two() && align_bytes <= BUF_ALIGN);
    let in_memory = !is_block_device && !direct && is_memory_backed(path);
    Ok(MemberFile {
        file: Arc::new(file),
        name: path.display().to_string(),
        is_block_device,
        len_bytes: AtomicU64::new(len_bytes),
        direct,
        align_bytes,
        read_only,
        in_memory,
        in_flight_ops: AtomicUsize::new(0),
        punch_hole_unsupported: AtomicBool::new(false),
        zero_range_unsupported: AtomicBool::new(false),
        allocate_unsupported: AtomicBool::new(false),
    })
}

/// The size of an open member: a block device's end, a file's length. Seeking moves the
/// shared file position, which no member I/O uses (all of it is positional).
fn device_len(file: &File, is_block_device: bool) -> io::Result<u64> {
    if is_block_device { (&*file).seek(SeekFrom::End(0)) } else { Ok(file.metadata()?.len()) }
}

/// `exclusive` adds O_EXCL, which on a block device claims it (EBUSY if it is mounted,
/// a member of another array, or already open exclusively), as mdadm does for members.
///
/// EBUSY is retried for up to [`EXCL_RETRY`]: when io_uring held the last reference to a
/// member's file, the kernel drops it (and the claim) shortly after our close, so a member
/// closed and reopened at once can see a stale claim for a few hundred microseconds.
fn open_raw(path: &Path, direct: bool, read_only: bool, exclusive: bool) -> Result<File> {
    let mut opts = FsOpenOptions::new();
    opts.read(true).write(!read_only);
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if exclusive {
        flags |= libc::O_EXCL;
    }
    opts.custom_flags(flags);
    let started = Instant::now();
    loop {
        match opts.open(path) {
            Err(e) if exclusive && e.raw_os_error() == Some(libc::EBUSY) && started.elapsed() < EXCL_RETRY => {
                std::thread::sleep(Duration::from_millis(1));
            }
            res => return res.map_err(|source| MemberIoError::Open { path: path.into(), source }),
        }
    }
}

/// How long a busy block device is retried before EBUSY is reported.
const EXCL_RETRY: Duration = Duration::from_millis(250);

/// `Some(alignment)` if O_DIRECT works with our page-aligned buffers, `None` if the kernel
/// says the file cannot do O_DIRECT.
fn direct_alignment(path: &Path, file: &File, is_block_device: bool) -> Result<Option<usize>> {
    let probed = dio_align::probe(file.as_fd(), is_block_device)
        .map_err(|source| MemberIoError::Stat { path: path.into(), source })?;
    match probed {
        DioAlign::Unsupported => Ok(None),
        DioAlign::Bytes(align) if align.is_power_of_two() && align <= BUF_ALIGN as u64 => Ok(Some(align as usize)),
        DioAlign::Bytes(align_bytes) => Err(MemberIoError::UnsupportedAlignment { path: path.into(), align_bytes }),
    }
}

fn refused_or_open(path: &Path, err: MemberIoError) -> MemberIoError {
    match err {
        MemberIoError::Open { source, .. } if source.raw_os_error() == Some(libc::EINVAL) => {
            MemberIoError::DirectIoRefused { path: path.into(), source }
        }
        other => other,
    }
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// Creates a new sparse file of `len_bytes` (fails if `path` exists, so it never resizes a member).
pub fn create_sparse_file(path: impl AsRef<Path>, len_bytes: u64) -> Result<()> {
    let path = path.as_ref();
    let file = FsOpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|source| MemberIoError::Create { path: path.into(), source })?;
    file.set_len(len_bytes).map_err(|source| MemberIoError::Create { path: path.into(), source })
}
