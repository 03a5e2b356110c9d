//! [`IntegrityMember`]: a member whose data-area reads are verified against its checksum table.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::area::{BLOCK_BYTES, Header, IntegrityArea};
use super::block_locks::BlockLocks;
use super::corruption::Corruption;
use super::on_disk::{IO_BYTES, dirty_blocks, first_data_block, invalid, locate, read_bytes, write_pages};
use super::table::{ChecksumTable, stamp};
use crate::allocation::Allocation;
use crate::bad_ranges::BadRanges;
use crate::buf::AlignedBuf;
use crate::md::{SUPERBLOCK_BYTE_OFFSET, Superblock};
use crate::member::{BufResult, IoFuture, Member, check_range};

const B: u64 = BLOCK_BYTES;

/// What a member's checksums found so far, for status displays and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntegrityReport {
    /// Bytes covered by the table.
    pub covered_bytes: u64,
    /// Blocks read and found right.
    pub verified_blocks: u64,
    /// Blocks read and found wrong.
    pub corrupt_blocks: u64,
    /// Untrusted blocks stamped from what they held (after an unclean stop, or md's writes).
    pub restamped_blocks: u64,
    /// Bytes still untrusted.
    pub untrusted_bytes: u64,
}

pub struct IntegrityMember<M> {
    inner: M,
    area: IntegrityArea,
    /// Blocks `[first_verified_block, area.blocks())` are md's data area; those before it
    /// are md's metadata (superblock, bitmap, logs), which carries its own checksums.
    first_verified_block: u64,
    table: ChecksumTable,
    locks: BlockLocks,
    /// Blocks (as `BadRanges` units) read unverified and stamped from what they hold.
    untrusted: Mutex<BadRanges>,
    has_untrusted: AtomicBool,
    header: Mutex<Header>,
    /// The header's event count is older than the superblocks' (md wrote the array): it is
    /// rewritten only once every block was read and stamped again, so a stop before that
    /// leaves the checksums untrusted at the next start too.
    stale: AtomicBool,
    /// The event count of the last superblock written through (or read at the start).
    superblock_events: AtomicU64,
    /// Where md's bitmap lies, `[start, end)` bytes (from the last superblock; empty without
    /// one): atomics, as every write looks at them.
    bitmap_start_bytes: AtomicU64,
    bitmap_end_bytes: AtomicU64,
    flush_lock: futures::lock::Mutex<()>,
    verified_blocks: AtomicU64,
    corrupt_blocks: AtomicU64,
    restamped_blocks: AtomicU64,
}

impl<M: Member> IntegrityMember<M> {
    /// Wraps `inner` when it holds a checksum area (after its md data area); gives it back
    /// when it does not. A damaged header is an error.
    pub async fn open(inner: M) -> io::Result<Result<Self, M>> {
        let Some((sb, area)) = locate(&inner).await? else { return Ok(Err(inner)) };
        let header_bytes = read_bytes(&inner, area.start_bytes, B).await?;
        let header = match Header::decode(header_bytes.as_slice()) {
            None => return Ok(Err(inner)),
            Some(Err(why)) => return Err(invalid(format!("{}: {why}", inner.name()))),
            Some(Ok(h)) if h.covered_bytes != area.start_bytes => {
                return Err(invalid(format!(
                    "{}: integrity header covers {} bytes, but md's data area ends at {}",
                    inner.name(),
                    h.covered_bytes,
                    area.start_bytes
                )));
            }
            Some(Ok(h)) => h,
        };
        let table = ChecksumTable::zeroed(area.blocks());
        let mut at = 0;
        while at < area.table_bytes() {
            let n = IO_BYTES.min(area.table_bytes() - at);
            table.load(at / 4, read_bytes(&inner, area.table_offset_bytes() + at, n).await?.as_slice());
            at += n;
        }
        let first_verified_block = first_data_block(&sb);
        // What the array uses of the data area (md's `size`; all of it for linear/raid0): a
        // check reads every block of it, so nothing stays untrusted after one.
        let used_sectors = if sb.size > 0 { sb.size } else { sb.data_size };
        let used_end = ((sb.data_offset + used_sectors) * 512).div_ceil(B).min(area.blocks());
        let all = (first_verified_block, used_end.saturating_sub(first_verified_block));
        let stale = header.device_uuid != sb.device_uuid.0 || header.events != sb.events;
        let untrusted = if stale {
            tracing::warn!(
                member = inner.name(),
                header_events = header.events,
                superblock_events = sb.events,
                "the array was written without raidnbd since its checksums were: they are untrusted until a check \
                 stamps them again"
            );
            BadRanges::from_ranges([all])
        } else if !sb.is_clean() {
            let dirty = dirty_blocks(&inner, &sb, all).await;
            tracing::info!(
                member = inner.name(),
                untrusted_bytes = dirty.sectors() * B,
                "unclean stop: checksums of what md resyncs are untrusted until read"
            );
            dirty
        } else {
            BadRanges::default()
        };
        let header = Header { device_uuid: sb.device_uuid.0, ..header };
        let opened = Self::new(stale, inner, area, first_verified_block, table, header, untrusted);
        opened.learn_superblock(&sb);
        Ok(Ok(opened))
    }

    /// Wraps a device about to join an array whose members have checksums (a spare, a
    /// replacement): its area is placed at its end (what [`reserve_bytes`] keeps), the array
    /// sees it end there ([`Member::len_bytes`]), so md's `data_size` recorded for it ends
    /// there too and the area is found after a restart. Every block is untrusted until
    /// written (a rebuild writes them all); the header is written with its first superblock.
    /// `first_data_block`: where md's data area starts on the array's devices.
    ///
    /// [`reserve_bytes`]: super::reserve_bytes
    pub fn fresh(inner: M, first_data_block: u64) -> io::Result<Self> {
        let len = inner.len_bytes();
        let area = IntegrityArea { start_bytes: len - super::area::reserve_bytes(len) };
        if area.blocks() <= first_data_block {
            return Err(invalid(format!("{}: too small to hold data and checksums", inner.name())));
        }
        let header = Header { covered_bytes: area.start_bytes, device_uuid: [0; 16], events: 0 };
        let untrusted = BadRanges::from_ranges([(first_data_block, area.blocks() - first_data_block)]);
        Ok(Self::new(false, inner, area, first_data_block, ChecksumTable::zeroed(area.blocks()), header, untrusted))
    }

    fn new(
        stale: bool,
        inner: M,
        area: IntegrityArea,
        first_verified_block: u64,
        table: ChecksumTable,
        header: Header,
        untrusted: BadRanges,
    ) -> Self {
        IntegrityMember {
            inner,
            area,
            first_verified_block,
            table,
            locks: BlockLocks::default(),
            has_untrusted: AtomicBool::new(!untrusted.is_empty()),
            untrusted: Mutex::new(untrusted),
            superblock_events: AtomicU64::new(header.events),
            header: Mutex::new(header),
            stale: AtomicBool::new(stale),
            bitmap_start_bytes: AtomicU64::new(0),
            bitmap_end_bytes: AtomicU64::new(0),
            flush_lock: futures::lock::Mutex::new(()),
            verified_blocks: AtomicU64::new(0),
            corrupt_blocks: AtomicU64::new(0),
            restamped_blocks: AtomicU64::new(0),
        }
    }

    /// What a superblock read or written says of this device: its event count, its bitmap.
    fn learn_superblock(&self, sb: &Superblock) {
        self.superblock_events.store(sb.events, Ordering::Release);
        let (start, end) = sb
            .bitmap_offset()
            .and_then(|sectors| SUPERBLOCK_BYTE_OFFSET.checked_add_signed(i64::from(sectors) * 512))
            .map_or((0, 0), |at| (at, sb.data_offset * 512)); // md's data start bounds it
        self.bitmap_start_bytes.store(start, Ordering::Release);
        self.bitmap_end_bytes.store(end, Ordering::Release);
    }

    fn in_bitmap(&self, offset_bytes: u64) -> bool {
        offset_bytes >= self.bitmap_start_bytes.load(Ordering::Acquire)
            && offset_bytes < self.bitmap_end_bytes.load(Ordering::Acquire)
    }

    /// The verified blocks `[first, end)` that `[offset_bytes, +len_bytes)` touches.
    fn blocks_of(&self, offset_bytes: u64, len_bytes: u64) -> Option<(u64, u64)> {
        let first = (offset_bytes / B).max(self.first_verified_block);
        let end = (offset_bytes + len_bytes).div_ceil(B).min(self.area.blocks());
        (first < end).then_some((first, end))
    }

    fn is_untrusted(&self, block: u64) -> bool {
        self.has_untrusted.load(Ordering::Acquire) && self.untrusted.lock().expect("untrusted").overlaps(block, 1)
    }

    fn trust(&self, first: u64, end: u64) {
        if self.has_untrusted.load(Ordering::Acquire) {
            let mut untrusted = self.untrusted.lock().expect("untrusted");
            untrusted.remove(first, end - first);
            self.has_untrusted.store(!untrusted.is_empty(), Ordering::Release);
        }
    }

    fn corruption(&self, first: u64, end: u64) -> io::Error {
        Corruption { member: self.inner.name().to_string(), offset_bytes: first * B, len_bytes: (end - first) * B }
            .into_io()
    }

    /// Stamps an untrusted block from what it holds, with no write in flight on it.
    async fn restamp(&self, block: u64) -> io::Result<()> {
        let _guard = self.locks.lock(block, 1).await;
        let buf = read_bytes(&self.inner, block * B, B).await?;
        self.table.set(block, stamp(buf.as_slice()));
        self.trust(block, block + 1);
        self.restamped_blocks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Checks `data` (whole blocks from `first_block`) against the table, within the
    /// verified blocks `[lo, hi)`.
    async fn verify(&self, first_block: u64, data: &[u8], (lo, hi): (u64, u64)) -> io::Result<()> {
        let mut wrong: Option<(u64, u64)> = None;
        let mut checked = 0;
        for (i, block) in data.chunks_exact(B as usize).enumerate() {
            let b = first_block + i as u64;
            if b < lo || b >= hi {
                continue;
            }
            checked += 1;
            let s = stamp(block);
            // A write in flight may have put these bytes there: its stamps are announced
            // before it starts and stored before it lets go.
            if s == self.table.get(b) || self.locks.pending(b, s) || s == self.table.get(b) {
                continue;
            }
            if self.is_untrusted(b) {
                self.restamp(b).await?;
                continue;
            }
            wrong = Some(wrong.map_or((b, b + 1), |(f, _)| (f, b + 1)));
        }
        self.verified_blocks.fetch_add(checked, Ordering::Relaxed);
        // Untrusted blocks read here matched or were stamped again: trusted from now on.
        let (from, to) = (first_block.max(lo), (first_block + data.len() as u64 / B).min(hi));
        if from < to {
            self.trust(from, to);
        }
        let Some((first, end)) = wrong else { return Ok(()) };
        self.corrupt_blocks.fetch_add(end - first, Ordering::Relaxed);
        Err(self.corruption(first, end))
    }

    /// Writes the table pages changed since the last time (and the header, once a stale one
    /// is current again), then flushes the member.
    async fn persist(&self) -> io::Result<()> {
        let _serial = self.flush_lock.lock().await;
        let pages = self.table.take_dirty();
        if let Err(e) = write_pages(&self.inner, &self.area, &self.table, &pages).await {
            self.table.mark_dirty(&pages);
            return Err(e);
        }
        if self.stale.load(Ordering::Acquire) && !self.has_untrusted.load(Ordering::Acquire) {
            // Every block was read and stamped since md wrote: the table is current again.
            let image = {
                let mut header = self.header.lock().expect("header");
                header.events = self.superblock_events.load(Ordering::Acquire);
                header.encode()
            };
            self.inner.write_at(self.area.start_bytes, AlignedBuf::from_slice(&image), false).await.0?;
            self.stale.store(false, Ordering::Release);
            tracing::info!(member = self.inner.name(), "checksums stamped again: trusted from here on");
        }
        self.inner.flush().await
    }

    fn write_superblock(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let sb = Superblock::decode(buf.as_slice()).ok();
            // What a superblock records (clean, rebuilt up to here, ...) vouches for the
            // checksums too: they go first.
            if let Err(e) = self.persist().await {
                return (Err(e), buf);
            }
            let (res, buf) = self.inner.write_at(offset_bytes, buf, fua).await;
            if let (Ok(()), Some(sb)) = (&res, sb) {
                self.learn_superblock(&sb);
                if self.stale.load(Ordering::Acquire) {
                    return (res, buf); // the header keeps its old count (see `stale`)
                }
                let image = {
                    let mut header = self.header.lock().expect("header");
                    header.events = sb.events;
                    header.device_uuid = sb.device_uuid.0;
                    header.encode()
                };
                let written = self.inner.write_at(self.area.start_bytes, AlignedBuf::from_slice(&image), fua).await.0;
                return (written, buf);
            }
            (res, buf)
        })
    }

    /// Zeroes or discards, then stamps the blocks touched from what they hold now.
    async fn zero(&self, offset_bytes: u64, len_bytes: u64, discard: bool) -> io::Result<()> {
        check_range(self.name(), self.len_bytes(), offset_bytes, len_bytes)?;
        let Some((first, end)) = self.blocks_of(offset_bytes, len_bytes) else {
            return if discard {
                self.inner.discard(offset_bytes, len_bytes).await
            } else {
                self.inner.write_zeroes(offset_bytes, len_bytes).await
            };
        };
        let _guard = self.locks.lock(first, end - first).await;
        if discard {
            self.inner.discard(offset_bytes, len_bytes).await?;
        } else {
            self.inner.write_zeroes(offset_bytes, len_bytes).await?;
        }
        for b in first..end {
            if b * B >= offset_bytes && (b + 1) * B <= offset_bytes + len_bytes {
                self.table.set(b, 0);
            } else {
                self.table.set(b, stamp(read_bytes(&self.inner, b * B, B).await?.as_slice()));
            }
        }
        self.trust(first, end);
        Ok(())
    }
}

impl<M: Member> Member for IntegrityMember<M> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The device as the array sees it ends where its checksum area starts.
    fn len_bytes(&self) -> u64 {
        self.area.start_bytes
    }

    fn refresh_len(&self) -> IoFuture<'_, io::Result<u64>> {
        Box::pin(std::future::ready(Ok(self.area.start_bytes)))
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn memory_alignment(&self) -> usize {
        self.inner.memory_alignment()
    }

    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        let len = buf.len() as u64;
        if let Err(e) = check_range(self.name(), self.len_bytes(), offset_bytes, len) {
            return Box::pin(std::future::ready((Err(e), buf)));
        }
        let Some(verified) = self.blocks_of(offset_bytes, len) else { return self.inner.read_at(offset_bytes, buf) };
        Box::pin(async move {
            if offset_bytes.is_multiple_of(B) && len.is_multiple_of(B) {
                let (res, buf) = self.inner.read_at(offset_bytes, buf).await;
                if let Err(e) = res {
                    return (Err(e), buf);
                }
                let checked = self.verify(offset_bytes / B, buf.as_slice(), verified).await;
                return (checked, buf);
            }
            // Whole blocks are read to verify a part of one.
            let start = offset_bytes / B * B;
            let end = ((offset_bytes + len).div_ceil(B) * B).min(self.inner.len_bytes());
            let wide = match read_bytes(&self.inner, start, end - start).await {
                Ok(wide) => wide,
                Err(e) => return (Err(e), buf),
            };
            let mut buf = buf;
            let checked = self.verify(start / B, wide.as_slice(), verified).await;
            if checked.is_ok() {
                buf.as_mut_slice().copy_from_slice(&wide.as_slice()[(offset_bytes - start) as usize..][..len as usize]);
            }
            (checked, buf)
        })
    }

    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        if offset_bytes == SUPERBLOCK_BYTE_OFFSET {
            return self.write_superblock(offset_bytes, buf, fua);
        }
        if self.in_bitmap(offset_bytes) {
            // A bitmap write may clear bits: the checksums of those chunks are made durable
            // first (after a crash only set bits leave checksums untrusted).
            return Box::pin(async move {
                if let Err(e) = self.persist().await {
                    return (Err(e), buf);
                }
                self.inner.write_at(offset_bytes, buf, fua).await
            });
        }
        let len = buf.len() as u64;
        if let Err(e) = check_range(self.name(), self.len_bytes(), offset_bytes, len) {
            return Box::pin(std::future::ready((Err(e), buf)));
        }
        let Some((first, end)) = self.blocks_of(offset_bytes, len) else {
            return self.inner.write_at(offset_bytes, buf, fua);
        };
        Box::pin(async move {
            let guard = self.locks.lock(first, end - first).await;
            let mut stamps = Vec::with_capacity((end - first) as usize);
            for b in first..end {
                let (at, to) = (b * B, (b + 1) * B);
                if at >= offset_bytes && to <= offset_bytes + len {
                    stamps.push(stamp(&buf.as_slice()[(at - offset_bytes) as usize..][..B as usize]));
                    continue;
                }
                // A block written in part: its stamp covers the bytes it keeps, which must
                // be right (else nothing is written, and the blocks are reported wrong).
                let mut block = match read_bytes(&self.inner, at, B).await {
                    Ok(block) => block,
                    Err(e) => return (Err(e), buf),
                };
                if !self.is_untrusted(b) && stamp(block.as_slice()) != self.table.get(b) {
                    self.corrupt_blocks.fetch_add(1, Ordering::Relaxed);
                    return (Err(self.corruption(first, end)), buf);
                }
                let (from, until) = (offset_bytes.max(at), (offset_bytes + len).min(to));
                block.as_mut_slice()[(from - at) as usize..(until - at) as usize]
                    .copy_from_slice(&buf.as_slice()[(from - offset_bytes) as usize..(until - offset_bytes) as usize]);
                stamps.push(stamp(block.as_slice()));
            }
            guard.announce(stamps);
            let (res, buf) = self.inner.write_at(offset_bytes, buf, fua).await;
            if res.is_ok() {
                guard.store_announced(|b, s| self.table.set(b, s));
                self.trust(first, end);
            }
            drop(guard);
            (res, buf)
        })
    }

    /// The data's flush only: changed checksum pages are written before the next superblock
    /// or bitmap write, which is all crash consistency needs (module docs), so a client's
    /// FLUSH costs no table writes. (Except once: a stale header whose blocks were all read
    /// since is brought up to date.)
    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        if self.stale.load(Ordering::Acquire) && !self.has_untrusted.load(Ordering::Acquire) {
            return Box::pin(self.persist());
        }
        self.inner.flush()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, true))
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, false))
    }

    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.inner.cache(offset_bytes, len_bytes)
    }

    fn zeroes_fast(&self) -> bool {
        self.inner.zeroes_fast()
    }

    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<Vec<Allocation>>> {
        if let Err(e) = check_range(self.name(), self.len_bytes(), offset_bytes, len_bytes) {
            return Box::pin(std::future::ready(Err(e)));
        }
        self.inner.allocation(offset_bytes, len_bytes)
    }

    fn retire(&self, why: &str) {
        self.inner.retire(why)
    }

    fn integrity(&self) -> Option<IntegrityReport> {
        Some(IntegrityReport {
            covered_bytes: self.area.start_bytes,
            verified_blocks: self.verified_blocks.load(Ordering::Relaxed),
            corrupt_blocks: self.corrupt_blocks.load(Ordering::Relaxed),
            restamped_blocks: self.restamped_blocks.load(Ordering::Relaxed),
            untrusted_bytes: self.untrusted.lock().expect("untrusted").sectors() * B,
        })
    }
}
