//! `ThreadOps`: [`FileOps`] as blocking syscalls (pread/pwrite/fdatasync/fallocate) on the
//! process-wide [`BlockingPool`], results back through a oneshot.
//!
//! The job owns the buffer and the [`FileRef`]; a dropped future only drops the receiver.

use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use raid_core::AlignedBuf;
use tokio::sync::oneshot;

use crate::file_ops::{FileOps, TransferResult, engine_gone};
use crate::member_file::FileRef;
use crate::threads::pool::BlockingPool;

const ENGINE: &str = "member-io thread pool";

pub(crate) struct ThreadOps {
    pool: &'static BlockingPool,
}

impl ThreadOps {
    pub(crate) fn global() -> Self {
        Self { pool: BlockingPool::global() }
    }

    async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.pool.spawn(move || {
            // The receiver may be gone (cancelled); the job's buffers drop here either way.
            let _ = tx.send(job());
        });
        rx.await.ok()
    }
}

impl FileOps for ThreadOps {
    async fn read(&self, file: FileRef, offset_bytes: u64, mut buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        let len = buf.len();
        let job = move || {
            let res =
                retry_eintr(|| file.file().as_file().read_at(&mut buf.as_mut_slice()[range.clone()], offset_bytes));
            (res, buf)
        };
        self.run(job).await.unwrap_or_else(|| (Err(engine_gone(ENGINE)), AlignedBuf::zeroed(len)))
    }

    async fn write(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        let len = buf.len();
        let job = move || {
            let res = retry_eintr(|| file.file().as_file().write_at(&buf.as_slice()[range.clone()], offset_bytes));
            (res, buf)
        };
        self.run(job).await.unwrap_or_else(|| (Err(engine_gone(ENGINE)), AlignedBuf::zeroed(len)))
    }

    async fn fdatasync(&self, file: FileRef) -> io::Result<()> {
        let job = move || retry_eintr(|| file.file().as_file().sync_data());
        self.run(job).await.unwrap_or_else(|| Err(engine_gone(ENGINE)))
    }

    async fn fallocate(&self, file: FileRef, mode: i32, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let job = move || {
            let offset = libc::off_t::try_from(offset_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
            let len = libc::off_t::try_from(len_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
            retry_eintr(|| {
                // SAFETY: fallocate takes plain integers; the fd stays open while `file` lives.
                let rc = unsafe { libc::fallocate(file.raw_fd(), mode, offset, len) };
                if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
            })
        };
        self.run(job).await.unwrap_or_else(|| Err(engine_gone(ENGINE)))
    }
}

fn retry_eintr<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
