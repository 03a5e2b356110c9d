//! `ThreadOps`: [`FileOps`] as blocking syscalls (`sync_ops`: pread/pwrite/fdatasync/fallocate) on the
//! process-wide [`BlockingPool`], results back through a oneshot.
//!
//! The job owns the buffer and the [`FileRef`]; a dropped future only drops the receiver.

use std::io;
use std::ops::Range;

use bytes::Bytes;
use raid_core::AlignedBuf;
use tokio::sync::oneshot;

use crate::file_ops::{FileOps, TransferResult, engine_gone};
use crate::member_file::FileRef;
use crate::sync_ops;
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
    async fn read(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        let len = buf.len();
        let job = move || sync_ops::read(&file, offset_bytes, buf, range);
        self.run(job).await.unwrap_or_else(|| (Err(engine_gone(ENGINE)), AlignedBuf::zeroed(len)))
    }

    async fn write(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        let len = buf.len();
        let job = move || sync_ops::write(&file, offset_bytes, buf, range);
        self.run(job).await.unwrap_or_else(|| (Err(engine_gone(ENGINE)), AlignedBuf::zeroed(len)))
    }

    async fn write_pieces(&self, file: FileRef, offset_bytes: u64, pieces: Vec<Bytes>) -> io::Result<usize> {
        let job = move || sync_ops::write_pieces(&file, offset_bytes, pieces);
        self.run(job).await.unwrap_or_else(|| Err(engine_gone(ENGINE)))
    }

    async fn fdatasync(&self, file: FileRef) -> io::Result<()> {
        self.run(move || sync_ops::fdatasync(&file)).await.unwrap_or_else(|| Err(engine_gone(ENGINE)))
    }

    async fn fallocate(&self, file: FileRef, mode: i32, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let job = move || sync_ops::fallocate(&file, mode, offset_bytes, len_bytes);
        self.run(job).await.unwrap_or_else(|| Err(engine_gone(ENGINE)))
    }
}
