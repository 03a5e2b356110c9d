//! `UringOps`: [`FileOps`] as requests to a [`UringDriver`] ring thread.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use raid_core::AlignedBuf;

use crate::file_ops::{FileOps, TransferResult};
use crate::member_file::FileRef;
use crate::sync_ops::IoVecs;
use crate::uring::driver::{Op, UringDriver};

pub(crate) struct UringOps {
    driver: Arc<UringDriver>,
}

impl UringOps {
    pub(crate) fn new(driver: Arc<UringDriver>) -> Self {
        Self { driver }
    }

    async fn transfer(&self, file: FileRef, op: Op, len: usize) -> TransferResult {
        let completion = self.driver.submit(file, op).await;
        // A buffer only goes missing when the ring thread died; hand back a same-size stand-in.
        let buf = completion.buf.unwrap_or_else(|| AlignedBuf::zeroed(len));
        (completion.result.map(|n| n as usize), buf)
    }
}

impl FileOps for UringOps {
    async fn read(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        let len = buf.len();
        self.transfer(file, Op::Read { offset_bytes, buf, range }, len).await
    }

    async fn write(&self, file: FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
        let len = buf.len();
        self.transfer(file, Op::Write { offset_bytes, buf, range }, len).await
    }

    async fn write_pieces(&self, file: FileRef, offset_bytes: u64, pieces: Vec<Bytes>) -> io::Result<usize> {
        let op = Op::WritePieces { offset_bytes, iovecs: IoVecs::new(pieces) };
        self.driver.submit(file, op).await.result.map(|n| n as usize)
    }

    async fn fdatasync(&self, file: FileRef) -> io::Result<()> {
        self.driver.submit(file, Op::Fdatasync).await.result.map(drop)
    }

    async fn fallocate(&self, file: FileRef, mode: i32, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.driver.submit(file, Op::Fallocate { mode, offset_bytes, len_bytes }).await.result.map(drop)
    }
}
