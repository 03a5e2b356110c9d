//! `MeteredMember`: wraps a RAID member and records every I/O the engine issues to it (per
//! kind: completions, errors, bytes, latency).
//!
//! It is the outermost wrapper (over throttling and fault injection), so it sees exactly
//! what the engine sees: an injected fault is counted as that member's error. Statistics
//! live in a [`MemberStats`] shared by name, so a member removed and added again keeps
//! counting where it left off. Labels (export, role) are attached at scrape time, because a
//! member's role changes (a spare becomes a role, a replacement takes one over).

use std::fs::File;
use std::io;
use std::time::Instant;

use std::sync::Arc;

use raid_core::member::{BufResult, IoFuture};
use raid_core::{AlignedBuf, Member};

use super::op_stats::OpStats;

/// Member I/O kinds, as labelled in the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberOp {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

impl MemberOp {
    pub const ALL: [MemberOp; 5] =
        [MemberOp::Read, MemberOp::Write, MemberOp::Flush, MemberOp::Discard, MemberOp::WriteZeroes];

    pub fn name(self) -> &'static str {
        match self {
            MemberOp::Read => "read",
            MemberOp::Write => "write",
            MemberOp::Flush => "flush",
            MemberOp::Discard => "discard",
            MemberOp::WriteZeroes => "write_zeroes",
        }
    }
}

/// I/O statistics of one member.
#[derive(Debug, Default)]
pub struct MemberStats {
    ops: [OpStats; MemberOp::ALL.len()],
}

impl MemberStats {
    pub fn op(&self, op: MemberOp) -> &OpStats {
        &self.ops[op as usize]
    }
}

pub struct MeteredMember<M: Member> {
    inner: M,
    stats: Arc<MemberStats>,
}

impl<M: Member> MeteredMember<M> {
    pub fn new(inner: M, stats: Arc<MemberStats>) -> Self {
        Self { inner, stats }
    }

    fn metered_buf<'a>(&'a self, op: MemberOp, request: IoFuture<'a, BufResult>) -> IoFuture<'a, BufResult> {
        let started = Instant::now();
        Box::pin(async move {
            let (result, buf) = request.await;
            self.stats.op(op).record(started, result.is_ok(), buf.len() as u64);
            (result, buf)
        })
    }

    fn metered<'a>(
        &'a self,
        op: MemberOp,
        bytes: u64,
        request: IoFuture<'a, io::Result<()>>,
    ) -> IoFuture<'a, io::Result<()>> {
        let started = Instant::now();
        Box::pin(async move {
            let result = request.await;
            self.stats.op(op).record(started, result.is_ok(), bytes);
            result
        })
    }
}

impl<M: Member> Member for MeteredMember<M> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        self.metered_buf(MemberOp::Read, self.inner.read_at(offset_bytes, buf))
    }

    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        self.metered_buf(MemberOp::Write, self.inner.write_at(offset_bytes, buf, fua))
    }

    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> IoFuture<'a, io::Result<()>> {
        self.metered(MemberOp::Write, data.len() as u64, self.inner.write_slice_at(offset_bytes, data, fua))
    }

    /// Bytes handed out for an in-place read count as read bytes of the member, but not as
    /// an operation with a latency: nothing waits on the member for them. (In an array that
    /// mixes members in memory with others, a read that then goes the normal way after all
    /// counts its bytes again through `read_at`.)
    fn memory_file(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        let file = self.inner.memory_file(offset_bytes, len_bytes)?;
        self.stats.op(MemberOp::Read).bytes.fetch_add(len_bytes, std::sync::atomic::Ordering::Relaxed);
        Some(file)
    }

    /// Likewise, bytes handed out for an in-place write count as written bytes (again, in a
    /// mixed array a write that then goes the normal way counts them twice).
    fn memory_file_for_write(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        let file = self.inner.memory_file_for_write(offset_bytes, len_bytes)?;
        self.stats.op(MemberOp::Write).bytes.fetch_add(len_bytes, std::sync::atomic::Ordering::Relaxed);
        Some(file)
    }

    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        self.metered(MemberOp::Flush, 0, self.inner.flush())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.metered(MemberOp::Discard, len_bytes, self.inner.discard(offset_bytes, len_bytes))
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.metered(MemberOp::WriteZeroes, len_bytes, self.inner.write_zeroes(offset_bytes, len_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raid_core::member::MemoryMember;

    #[tokio::test]
    async fn records_member_io_and_errors() {
        let stats = Arc::new(MemberStats::default());
        let m = MeteredMember::new(MemoryMember::new("m0", 64 << 10), stats.clone());
        assert_eq!((m.name(), m.len_bytes(), m.alignment()), ("m0", 64 << 10, 1));
        let (res, _) = m.write_at(0, AlignedBuf::zeroed(8192), false).await;
        res.unwrap();
        let (res, buf) = m.read_at(4096, AlignedBuf::zeroed(4096)).await;
        res.unwrap();
        assert_eq!(buf.len(), 4096);
        // Past the end: the backend's error is the member's error.
        let (res, _) = m.read_at(64 << 10, AlignedBuf::zeroed(4096)).await;
        assert!(res.is_err());
        m.flush().await.unwrap();
        m.discard(0, 4096).await.unwrap();
        m.write_zeroes(0, 512).await.unwrap();
        let read = stats.op(MemberOp::Read);
        assert_eq!((read.completed(), read.errors(), read.bytes()), (2, 1, 4096));
        m.write_slice_at(8192, &[7u8; 1024], false).await.unwrap();
        assert_eq!(stats.op(MemberOp::Write).bytes(), 8192 + 1024);
        assert_eq!(stats.op(MemberOp::Flush).completed(), 1);
        assert_eq!(stats.op(MemberOp::Discard).bytes(), 4096);
        assert_eq!(stats.op(MemberOp::WriteZeroes).bytes(), 512);
    }

    #[test]
    fn in_place_reads_count_as_read_bytes() {
        let shm = tempfile::NamedTempFile::new_in("/dev/shm").expect("/dev/shm");
        shm.as_file().set_len(64 << 10).unwrap();
        let stats = Arc::new(MemberStats::default());
        let inner = member_io::open_member(shm.path(), &member_io::OpenOptions::default()).unwrap();
        let m = MeteredMember::new(inner, stats.clone());
        assert!(m.memory_file(4096, 8192).is_some(), "a tmpfs member reads in place");
        assert!(m.memory_file(60 << 10, 8192).is_none(), "not past its end");
        let read = stats.op(MemberOp::Read);
        assert_eq!((read.completed(), read.bytes()), (0, 8192), "bytes, not operations");
    }
}
