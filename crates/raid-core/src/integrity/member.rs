//! [`IntegrityMember`]: a member whose data-area reads are verified against its checksum table.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::area::{BLOCK_BYTES, Header, IntegrityArea};
use super::block_locks::BlockLocks;
use super::corruption::Corruption;
use super::table::{ChecksumTable, STAMPS_PER_PAGE, stamp};
use crate::allocation::Allocation;
use crate::bad_ranges::BadRanges;
use crate::buf::AlignedBuf;
use crate::geometry::Level;
use crate::md::{Bitmap, FeatureMap, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES, Superblock};
use crate::member::{BufResult, IoFuture, Member};

const B: u64 = BLOCK_BYTES;
/// Bytes of the table read or computed per member I/O.
const IO_BYTES: u64 = 8 << 20;
/// The most of a bitmap read to learn what an unclean stop left dirty.
const MAX_BITMAP_BYTES: u64 = 4 << 20;

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
    flush_lock: futures::lock::Mutex<()>,
    verified_blocks: AtomicU64,
    corrupt_blocks: AtomicU64,
    restamped_blocks: AtomicU64,
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

async fn read_bytes<M: Member + ?Sized>(m: &M, offset_bytes: u64, len_bytes: u64) -> io::Result<AlignedBuf> {
    let (res, buf) = m.read_at(offset_bytes, AlignedBuf::for_overwrite(len_bytes as usize)).await;
    res.map(|()| buf)
}

/// The member's superblock and integrity area, if it has an md superblock and room for one.
async fn locate<M: Member + ?Sized>(m: &M) -> io::Result<Option<(Superblock, IntegrityArea)>> {
    if m.len_bytes() < SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64 {
        return Ok(None);
    }
    let sb_bytes = read_bytes(m, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES as u64).await?;
    let Ok(sb) = Superblock::decode(sb_bytes.as_slice()) else { return Ok(None) };
    let area = IntegrityArea::after((sb.data_offset + sb.data_size) * 512);
    Ok(area.fits(m.len_bytes()).then_some((sb, area)))
}

/// The first block of md's data area (the lower one during a reshape that moves it).
fn first_data_block(sb: &Superblock) -> u64 {
    let mut start = sb.data_offset;
    if sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET) {
        start = start.saturating_add_signed(i64::from(sb.new_offset));
    }
    start * 512 / B
}

/// Writes a fresh checksum area on `member`, whose md superblock is already written: the
/// stamps of what its data area holds (holes and zeros stamp 0, so a sparse member reads
/// nothing), and a header with the superblock's event count. For `create --integrity`.
pub async fn format<M: Member + ?Sized>(member: &M) -> io::Result<()> {
    let Some((sb, area)) = locate(member).await? else {
        return Err(invalid(format!("{}: no md superblock with room for checksums after its data", member.name())));
    };
    let table = ChecksumTable::from_bytes(&vec![0u8; area.table_bytes() as usize], area.blocks());
    let mut at = first_data_block(&sb) * B;
    while at < area.start_bytes {
        let extents = member.allocation(at, area.start_bytes - at).await?;
        for extent in extents {
            let end = at + extent.len_bytes;
            if !extent.zero {
                let mut pos = at / B * B;
                while pos < end {
                    let n = IO_BYTES.min(end.div_ceil(B) * B - pos);
                    let buf = read_bytes(member, pos, n).await?;
                    for (i, block) in buf.as_slice().chunks_exact(B as usize).enumerate() {
                        table.set(pos / B + i as u64, stamp(block));
                    }
                    pos += n;
                }
            }
            at = end;
        }
    }
    let table_is_hole = member
        .allocation(area.table_offset_bytes(), area.table_bytes())
        .await
        .is_ok_and(|e| e.len() == 1 && e[0].zero && e[0].len_bytes == area.table_bytes());
    let dirty: Vec<u64> = if table_is_hole { table.take_dirty() } else { (0..area.table_bytes() / B).collect() };
    write_pages(member, &area, &table, &dirty).await?;
    let header = Header { covered_bytes: area.start_bytes, device_uuid: sb.device_uuid.0, events: sb.events };
    member.write_at(area.start_bytes, AlignedBuf::from_slice(&header.encode()), false).await.0?;
    member.flush().await
}

/// Writes table pages (ascending), contiguous ones as one write.
async fn write_pages<M: Member + ?Sized>(
    member: &M,
    area: &IntegrityArea,
    table: &ChecksumTable,
    pages: &[u64],
) -> io::Result<()> {
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] == pages[j - 1] + 1 && (j - i) as u64 * B < IO_BYTES {
            j += 1;
        }
        let mut buf = AlignedBuf::for_overwrite((j - i) * B as usize);
        for (k, chunk) in buf.as_mut_slice().chunks_exact_mut(B as usize).enumerate() {
            table.page_bytes(pages[i + k], chunk);
        }
        member.write_at(area.table_offset_bytes() + pages[i] * B, buf, false).await.0?;
        i = j;
    }
    Ok(())
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
        let mut bytes = Vec::with_capacity(area.table_bytes() as usize);
        let mut at = 0;
        while at < area.table_bytes() {
            let n = IO_BYTES.min(area.table_bytes() - at);
            bytes.extend_from_slice(read_bytes(&inner, area.table_offset_bytes() + at, n).await?.as_slice());
            at += n;
        }
        let table = ChecksumTable::from_bytes(&bytes, area.blocks());
        let first_verified_block = first_data_block(&sb);
        let all = (first_verified_block, area.blocks() - first_verified_block);
        let untrusted = if header.device_uuid != sb.device_uuid.0 || header.events != sb.events {
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
        Ok(Ok(Self::new(inner, area, first_verified_block, table, header, untrusted)))
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
        Ok(Self::new(
            inner,
            area,
            first_data_block,
            ChecksumTable::from_bytes(&vec![0u8; area.table_bytes() as usize], area.blocks()),
            header,
            untrusted,
        ))
    }

    fn new(
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
            header: Mutex::new(header),
            flush_lock: futures::lock::Mutex::new(()),
            verified_blocks: AtomicU64::new(0),
            corrupt_blocks: AtomicU64::new(0),
            restamped_blocks: AtomicU64::new(0),
        }
    }

    pub fn inner(&self) -> &M {
        &self.inner
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
        let Some((first, end)) = wrong else { return Ok(()) };
        self.corrupt_blocks.fetch_add(end - first, Ordering::Relaxed);
        Err(self.corruption(first, end))
    }

    /// Writes the table pages changed since the last time, then flushes the member.
    async fn persist(&self) -> io::Result<()> {
        let _serial = self.flush_lock.lock().await;
        let pages = self.table.take_dirty();
        if let Err(e) = write_pages(&self.inner, &self.area, &self.table, &pages).await {
            self.table.mark_dirty(&pages);
            return Err(e);
        }
        self.inner.flush().await
    }

    fn write_superblock(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let sb = Superblock::decode(buf.as_slice()).ok();
            // A clean superblock vouches for the checksums too: they go first.
            if sb.as_ref().is_some_and(Superblock::is_clean)
                && let Err(e) = self.persist().await
            {
                return (Err(e), buf);
            }
            let (res, buf) = self.inner.write_at(offset_bytes, buf, fua).await;
            if let (Ok(()), Some(sb)) = (&res, sb) {
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

/// The blocks md resyncs after an unclean stop: the dirty chunks of a per-device bitmap
/// (raid1/4/5/6), else all of `all`.
async fn dirty_blocks<M: Member + ?Sized>(m: &M, sb: &Superblock, all: (u64, u64)) -> BadRanges {
    let everything = BadRanges::from_ranges([all]);
    let per_device = matches!(sb.level, Level::Raid1 | Level::Raid4 | Level::Raid5 | Level::Raid6);
    let Some(offset) =
        sb.bitmap_offset().filter(|_| per_device && !sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE))
    else {
        return everything;
    };
    let at = (SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(offset) * 512) as u64;
    let room = (sb.data_offset * 512).saturating_sub(at).min(MAX_BITMAP_BYTES) / B * B;
    let Ok(bytes) = read_bytes(m, at, room.max(B)).await else { return everything };
    let Ok(bitmap) = Bitmap::decode(bytes.as_slice(), sb.set_uuid) else { return everything };
    if bitmap.events < sb.events || bitmap.state & crate::md::BITMAP_STALE != 0 {
        return everything;
    }
    let chunk_bytes = bitmap.chunk_sectors() * 512;
    let data_start = sb.data_offset * 512;
    BadRanges::from_ranges((0..bitmap.chunks()).filter(|&c| bitmap.is_set(c)).map(|c| {
        let first = (data_start + c * chunk_bytes) / B;
        let end = (data_start + (c + 1) * chunk_bytes).div_ceil(B).min(all.0 + all.1);
        (first, end.saturating_sub(first))
    }))
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

    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        let len = buf.len() as u64;
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
        let len = buf.len() as u64;
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
            guard.announce(&stamps);
            let (res, buf) = self.inner.write_at(offset_bytes, buf, fua).await;
            if res.is_ok() {
                for (b, s) in (first..end).zip(stamps) {
                    self.table.set(b, s);
                }
                self.trust(first, end);
            }
            drop(guard);
            (res, buf)
        })
    }

    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.persist())
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

const _: () = assert!(STAMPS_PER_PAGE * 4 == B);
