//! The workloads, named the way disk users know them:
//!
//! - `dd-write`: what `dd if=/dev/zero of=DEV bs=1M oflag=direct conv=fdatasync` measures —
//!   sequential 1 MiB writes one at a time, with the final flush inside the timing
//!   (fio rw=write bs=1M iodepth=1 end_fsync=1, no warm-up).
//! - CrystalDiskMark's default set: SEQ1M Q8T1, SEQ1M Q1T1, RND4K Q32T1, RND4K Q1T1, each
//!   read and write (Q = queue depth, T = threads; one fio job = one NBD connection).
//! - `seq-fullstripe-write`: sequential writes of whole stripes (bs = chunk × data disks ×
//!   k, the smallest k giving ≥ 1 MiB; aligned, since fio starts at offset 0), Q8T1. On
//!   RAID4/5/6 every stripe is then written without reading anything first.
//! - The block-size sweep: random read and random write at each `--sweep` size, Q8T1,
//!   showing where a volume turns from IOPS-bound into bandwidth-bound.

use anyhow::{Result, bail};

use super::plan::ArraySpec;
use crate::size::format_size;

/// The access pattern, as fio names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
}

impl Rw {
    pub fn fio_name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
        }
    }

    pub fn is_write(self) -> bool {
        matches!(self, Rw::Write | Rw::RandWrite)
    }

    pub fn is_random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite)
    }
}

/// Block size of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Fixed(u64),
    /// Whole stripes of the array under test (see [`full_stripe_block_bytes`]).
    FullStripe,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Stable name for `--workloads`, CSV and JSON: `rnd4k-q32t1-read`.
    pub id: String,
    /// What tables and charts show: `RND4K Q32T1 read`.
    pub label: String,
    pub rw: Rw,
    pub block: Block,
    pub iodepth: u32,
    /// Flush at the end, inside the timing (dd conv=fdatasync).
    pub end_fsync: bool,
    /// Warm up before measuring (dd has none).
    pub ramp: bool,
}

impl Workload {
    fn new(id: &str, label: &str, rw: Rw, block: Block, iodepth: u32) -> Self {
        Self { id: id.into(), label: label.into(), rw, block, iodepth, end_fsync: false, ramp: true }
    }

    /// The block size used on `array`.
    pub fn block_bytes(&self, array: &ArraySpec) -> u64 {
        match self.block {
            Block::Fixed(bytes) => bytes,
            Block::FullStripe => full_stripe_block_bytes(array),
        }
    }
}

/// Target size of a full-stripe write: at least this much per request.
const FULL_STRIPE_TARGET_BYTES: u64 = 1 << 20;
/// Largest request an NBD client may send here.
const MAX_REQUEST_BYTES: u64 = 32 << 20;

/// bs = stripe data bytes × k, the smallest k with bs ≥ 1 MiB (1 MiB without stripes).
pub fn full_stripe_block_bytes(array: &ArraySpec) -> u64 {
    let Some(stripe) = array.stripe_data_bytes() else { return FULL_STRIPE_TARGET_BYTES };
    debug_assert!(stripe > 0 && stripe % 512 == 0);
    let k = FULL_STRIPE_TARGET_BYTES.div_ceil(stripe).max(1);
    let bytes = stripe * k;
    if bytes <= MAX_REQUEST_BYTES {
        bytes
    } else {
        // A stripe wider than the largest request: as many whole chunks as fit (or the
        // largest request, when even one chunk does not).
        let chunk = array.chunk_bytes.unwrap_or(stripe);
        if chunk > MAX_REQUEST_BYTES { MAX_REQUEST_BYTES } else { MAX_REQUEST_BYTES / chunk * chunk }
    }
}

/// Every workload, in report order.
pub fn all(sweep_bytes: &[u64]) -> Vec<Workload> {
    let mut list = vec![
        Workload {
            end_fsync: true,
            ramp: false,
            ..Workload::new("dd-write", "dd-style write 1M (Q1, flush)", Rw::Write, Block::Fixed(1 << 20), 1)
        },
        Workload::new("seq1m-q8t1-read", "SEQ1M Q8T1 read", Rw::Read, Block::Fixed(1 << 20), 8),
        Workload::new("seq1m-q8t1-write", "SEQ1M Q8T1 write", Rw::Write, Block::Fixed(1 << 20), 8),
        Workload::new("seq1m-q1t1-read", "SEQ1M Q1T1 read", Rw::Read, Block::Fixed(1 << 20), 1),
        Workload::new("seq1m-q1t1-write", "SEQ1M Q1T1 write", Rw::Write, Block::Fixed(1 << 20), 1),
        // What the Linux kernel client sends when streaming to /dev/nbd0.
        Workload::new("seq128k-q32t1-read", "SEQ128K Q32T1 read", Rw::Read, Block::Fixed(128 << 10), 32),
        Workload::new("seq128k-q32t1-write", "SEQ128K Q32T1 write", Rw::Write, Block::Fixed(128 << 10), 32),
        Workload::new("rnd4k-q32t1-read", "RND4K Q32T1 read", Rw::RandRead, Block::Fixed(4096), 32),
        Workload::new("rnd4k-q32t1-write", "RND4K Q32T1 write", Rw::RandWrite, Block::Fixed(4096), 32),
        Workload::new("rnd4k-q1t1-read", "RND4K Q1T1 read", Rw::RandRead, Block::Fixed(4096), 1),
        Workload::new("rnd4k-q1t1-write", "RND4K Q1T1 write", Rw::RandWrite, Block::Fixed(4096), 1),
        Workload::new("seq-fullstripe-write", "SEQ full-stripe write Q8T1", Rw::Write, Block::FullStripe, 8),
    ];
    for rw in [Rw::RandRead, Rw::RandWrite, Rw::Read, Rw::Write] {
        for &bs in sweep_bytes {
            let size = format_size(bs);
            list.push(Workload::new(
                &format!("sweep-{}-{size}", rw.fio_name()),
                &format!("sweep {} {size} Q8T1", rw.fio_name()),
                rw,
                Block::Fixed(bs),
                8,
            ));
        }
    }
    list
}

/// Keeps the workloads named in `filter` (ids, or prefixes ending at a `-`: `sweep`,
/// `sweep-randread`, `rnd4k`); all when the filter is empty. Unknown names are errors.
pub fn select(all: Vec<Workload>, filter: &[String]) -> Result<Vec<Workload>> {
    if filter.is_empty() {
        return Ok(all);
    }
    let matches = |w: &Workload, name: &str| w.id == name || w.id.starts_with(&format!("{name}-"));
    for name in filter {
        if !all.iter().any(|w| matches(w, name)) {
            let ids: Vec<&str> = all.iter().map(|w| w.id.as_str()).collect();
            bail!("unknown workload '{name}' in --workloads; known: {}", ids.join(", "));
        }
    }
    Ok(all.into_iter().filter(|w| filter.iter().any(|name| matches(w, name))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use raid_core::geometry::Level;

    fn array(level: Level, chunk: u64) -> ArraySpec {
        ArraySpec { level: Some(level), members: 4, chunk_bytes: Some(chunk) }
    }

    #[test]
    fn full_stripes_are_whole_stripes_of_at_least_1m() {
        // raid5 4 x 64K: stripe 192K, k = 6.
        assert_eq!(full_stripe_block_bytes(&array(Level::Raid5, 64 << 10)), (6 * 192) << 10);
        // raid6 4 x 64K: stripe 128K, k = 8.
        assert_eq!(full_stripe_block_bytes(&array(Level::Raid6, 64 << 10)), 1 << 20);
        // raid5 4 x 512K: one stripe of 1.5M.
        assert_eq!(full_stripe_block_bytes(&array(Level::Raid5, 512 << 10)), 3 << 19);
        // raid5 4 x 4K: 12K stripes, k = 86.
        assert_eq!(full_stripe_block_bytes(&array(Level::Raid5, 4 << 10)), (86 * 12) << 10);
        assert_eq!(full_stripe_block_bytes(&ArraySpec::single()), 1 << 20);
        for (level, chunk) in [(Level::Raid5, 4096u64), (Level::Raid6, 1 << 20), (Level::Raid0, 64 << 20)] {
            let a = array(level, chunk);
            let bs = full_stripe_block_bytes(&a);
            assert!(
                bs <= MAX_REQUEST_BYTES && bs.is_multiple_of(chunk.min(MAX_REQUEST_BYTES)),
                "{level} {chunk}: {bs}"
            );
        }
    }

    #[test]
    fn selects_by_id_and_prefix() {
        let all = all(&[4096, 1 << 20]);
        assert_eq!(all.len(), 12 + 8);
        let picked = select(all.clone(), &["sweep-randread".into(), "dd-write".into()]).unwrap();
        let ids: Vec<&str> = picked.iter().map(|w| w.id.as_str()).collect();
        assert_eq!(ids, ["dd-write", "sweep-randread-4K", "sweep-randread-1M"]);
        assert_eq!(select(all.clone(), &["rnd4k".into()]).unwrap().len(), 4);
        assert!(select(all.clone(), &["seq1m-q8".into()]).is_err(), "prefixes end at a dash");
        assert!(select(all, &["nonsense".into()]).is_err());
    }
}
