//! `InlineOps`: [`FileOps`] as blocking syscalls run in the calling task, for members whose
//! file lives in memory (tmpfs, ramfs).
//!
//! There a syscall is a memory copy that never waits for a disk, so handing it to a ring or
//! pool thread costs more than doing it: 4 KiB random reads of a one-member array on
//! /dev/shm over NBD, fio QD32, measured 78k IOPS with io_uring, 55k with the thread pool and
//! 129k inline (`OURS=raidnbd ONLY=randread OURS_ARGS="--io <engine>" ROUNDS=3 RUNTIME=6
//! crates/nbd-server/bench/vs-nbdkit.sh`). Every future completes in its first poll, so cancellation can
//! never leave a syscall holding a buffer. The factory picks this engine with `--io auto`
//! only for regular files on tmpfs/ramfs (device nodes live on devtmpfs, which also says
//! tmpfs, and are excluded).

use std::io;
use std::ops::Range;

use bytes::Bytes;
use raid_core::AlignedBuf;

use crate::file_ops::{FileOps, TransferResult};
use crate::member_file::FileRef;
use crate::sync_ops;

pub(crate) struct InlineOps;

impl FileOps for InlineOps {
    const SYNCHRONOUS: bool = true;

    async fn read(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        sync_ops::read(&file, offset_bytes, buf, range)
    }

    async fn write(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        sync_ops::write(&file, offset_bytes, buf, range)
    }

    async fn write_pieces(&self, file: FileRef, offset_bytes: u64, pieces: Vec<Bytes>) -> io::Result<usize> {
        sync_ops::write_pieces(&file, offset_bytes, pieces)
    }

    async fn fdatasync(&self, file: FileRef) -> io::Result<()> {
        sync_ops::fdatasync(&file)
    }

    async fn fallocate(&self, file: FileRef, mode: i32, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        sync_ops::fallocate(&file, mode, offset_bytes, len_bytes)
    }
}
