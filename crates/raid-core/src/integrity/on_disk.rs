//! What lies on a member: where md's data and the checksum area are (read from its
//! superblock), the table written to it, a new area formatted, and which blocks an unclean
//! stop left untrusted (md's bitmap).

use std::io;

use super::area::{BLOCK_BYTES, Header, IntegrityArea};
use super::table::{ChecksumTable, stamp};
use crate::bad_ranges::BadRanges;
use crate::buf::AlignedBuf;
use crate::geometry::Level;
use crate::md::{Bitmap, FeatureMap, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES, Superblock};
use crate::member::Member;

const B: u64 = BLOCK_BYTES;
/// Bytes of the table read or computed per member I/O.
pub(super) const IO_BYTES: u64 = 8 << 20;
/// The most of a bitmap read to learn what an unclean stop left dirty.
const MAX_BITMAP_BYTES: u64 = 4 << 20;

pub(super) fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

pub(super) async fn read_bytes<M: Member + ?Sized>(m: &M, offset_bytes: u64, len_bytes: u64) -> io::Result<AlignedBuf> {
    let (res, buf) = m.read_at(offset_bytes, AlignedBuf::for_overwrite(len_bytes as usize)).await;
    res.map(|()| buf)
}

/// The member's md superblock and where its checksum area lies (whether or not it fits).
async fn superblock_and_area<M: Member + ?Sized>(m: &M) -> io::Result<Option<(Superblock, IntegrityArea)>> {
    if m.len_bytes() < SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64 {
        return Ok(None);
    }
    let sb_bytes = read_bytes(m, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES as u64).await?;
    let Ok(sb) = Superblock::decode(sb_bytes.as_slice()) else { return Ok(None) };
    let area = IntegrityArea::after((sb.data_offset + sb.data_size) * 512);
    Ok(Some((sb, area)))
}

/// The member's superblock and integrity area, if it has an md superblock and room for one.
pub(super) async fn locate<M: Member + ?Sized>(m: &M) -> io::Result<Option<(Superblock, IntegrityArea)>> {
    Ok(superblock_and_area(m).await?.filter(|(_, area)| area.fits(m.len_bytes())))
}

/// The member's superblock and the area it would keep checksums in; an error that names the
/// room missing when the area does not fit after md's data (checked for every member before
/// any is formatted).
pub async fn area_with_room<M: Member + ?Sized>(m: &M) -> io::Result<(Superblock, IntegrityArea)> {
    let Some((sb, area)) = superblock_and_area(m).await? else {
        return Err(invalid(format!("{}: no md superblock", m.name())));
    };
    if !area.fits(m.len_bytes()) {
        let data_end = (sb.data_offset + sb.data_size) * 512;
        return Err(invalid(format!(
            "{}: no room for checksums: md's data area ends at byte {data_end} and they need {} bytes after it; the \
             member has {}",
            m.name(),
            area.table_offset_bytes() + area.table_bytes() - data_end,
            m.len_bytes().saturating_sub(data_end)
        )));
    }
    Ok((sb, area))
}

/// The first block of md's data area (the lower one during a reshape that moves it).
pub(super) fn first_data_block(sb: &Superblock) -> u64 {
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
    let (sb, area) = area_with_room(member).await?;
    let table = ChecksumTable::zeroed(area.blocks());
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
pub(super) async fn write_pages<M: Member + ?Sized>(
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

/// The blocks md resyncs after an unclean stop: the dirty chunks of a per-device bitmap
/// (raid1/4/5/6), else all of `all`.
pub(super) async fn dirty_blocks<M: Member + ?Sized>(m: &M, sb: &Superblock, all: (u64, u64)) -> BadRanges {
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
