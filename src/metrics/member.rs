//! `MeteredMember`: wraps a RAID member and records every I/O the engine issues to it (per
//! kind: completions, errors, bytes, latency).
//!
//! It is the outermost wrapper (over throttling and fault injection), so it sees exactly
//! what the engine sees: an injected fault is counted as that member's error. Statistics
//! live in a [`MemberStats`] shared by name, so a member removed and added again keeps
//! counting where it left off. Labels (export, role) are attached at scrape time, because a
//! member's role changes (a spare becomes a role, a replacement takes one over).

use std::sync::Arc;
use std::time::Instant;

use raid_core::decorator::{Decorated, Decoration, MemberOp, OpKind};

use super::op_stats::OpStats;

/// I/O statistics of one member.
#[derive(Debug, Default)]
pub struct MemberStats {
    ops: [OpStats; OpKind::ALL.len()],
}

impl MemberStats {
    pub fn op(&self, op: OpKind) -> &OpStats {
        &self.ops[op as usize]
    }
}

/// The decoration that records a member's I/O in its [`MemberStats`].
pub struct Meter {
    stats: Arc<MemberStats>,
}

impl From<Arc<MemberStats>> for Meter {
    fn from(stats: Arc<MemberStats>) -> Self {
        Self { stats }
    }
}

/// A member whose I/O is recorded: `MeteredMember::new(inner, stats)`.
pub type MeteredMember<M> = Decorated<M, Meter>;

impl Decoration for Meter {
    fn finished(&self, op: MemberOp, started: Instant, ok: bool) {
        self.stats.op(op.kind).record(started, ok, op.len_bytes);
    }

    /// Bytes handed out for an in-place read or write count as that member's bytes, but not
    /// as an operation with a latency: nothing waits on the member for them. (In an array
    /// that mixes members in memory with others, a request that then goes the normal way
    /// after all counts its bytes again.)
    fn in_place(&self, kind: OpKind, len_bytes: u64) -> bool {
        self.stats.op(kind).bytes.fetch_add(len_bytes, std::sync::atomic::Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raid_core::member::MemoryMember;
    use raid_core::{AlignedBuf, Member};

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
        let read = stats.op(OpKind::Read);
        assert_eq!((read.completed(), read.errors(), read.bytes()), (2, 1, 4096));
        m.write_slice_at(8192, &[7u8; 1024], false).await.unwrap();
        assert_eq!(stats.op(OpKind::Write).bytes(), 8192 + 1024);
        assert_eq!(stats.op(OpKind::Flush).completed(), 1);
        assert_eq!(stats.op(OpKind::Discard).bytes(), 4096);
        assert_eq!(stats.op(OpKind::WriteZeroes).bytes(), 512);
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
        let read = stats.op(OpKind::Read);
        assert_eq!((read.completed(), read.bytes()), (0, 8192), "bytes, not operations");
    }
}
