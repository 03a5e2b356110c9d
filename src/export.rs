//! `ArrayDevice`: a RAID array seen as an NBD block device.
//!
//! This is the only place where raid-core meets nbd-server, and the only place raid-core
//! errors become NBD errors. Read data is handed to the server as the member buffers
//! themselves (`Bytes::from_owner`), so reads are not copied again on their way out.
//!
//! Reads of at least [`SEND_FILE_MIN_BYTES`] that the array can answer in place (members that are
//! files in memory, a level without parity, healthy copies: `Array::read_in_place`) are
//! handed over as file ranges with a shared mapping of the member file (made once per member
//! file, read-only on a read-only array), which the server sends from with `sendmsg`. Likewise, WRITEs of
//! at least `RECEIVE_IN_PLACE_MIN_BYTES` (the server asks only for those) that the array
//! can take in place (members that are files in memory, linear or raid0:
//! `Array::write_in_place`) are received by the server straight into those mappings.
//!
//! Allocation: BLOCK_STATUS answers the volume's `base:allocation` (holes and zeros from
//! the members through the geometry), so copies of a sparse array stay sparse. FAST_ZERO
//! is advertised and honoured where zeroing writes no data (`Volume::zeroes_fast`: whole
//! stripes, members that zero in place); elsewhere it fails at once with ENOTSUP, as the
//! spec asks, and the client writes the zeros itself. The meta context `raidnbd:sync`
//! (`Volume::sync_status`) says what a rebuild or resync will touch.
//!
//! The device serves one [`Volume`]: the array itself, or with `serve --cache writeback`
//! the array's one shared write cache (one per array, so a FLUSH on any connection covers
//! writes made on all of them and multi-conn stays safe), which offers no in-place paths.
//!
//! Byte granularity: the array advertises 512-byte blocks, but clients that negotiate no
//! block sizes may send any offset and length (`DeviceInfo::byte_granular`, when the volume
//! [`writes_bytes`](Volume::writes_bytes)). Such a read is read as its partial edge sectors
//! and its aligned middle and handed over as slices; such a write goes to
//! `Volume::write_bytes` (read-modify-write of the edge sectors under the array's write
//! locks); TRIM keeps to the whole sectors inside the range (it is a hint); WRITE_ZEROES
//! writes zero bytes into the partial edge sectors and zeroes the sectors between.

use std::sync::Arc;

use bytes::Bytes;
use nbd_server::FileMappings;
use nbd_server::device::{
    BlockDevice, DeviceError, DeviceErrorKind, DeviceFuture, DeviceInfo, DeviceResult, Extent, FileRange, ReadChunk,
    SEND_FILE_MIN_BYTES, WriteTarget, ZeroFlags,
};
use raid_core::engine::MAX_IO_BYTES;
use raid_core::geometry::Geometry;
use raid_core::{ErrorKind, RaidError, SECTOR_BYTES, Volume};

pub struct ArrayDevice {
    /// The array, or the write-back cache over it.
    volume: Arc<dyn Volume>,
    info: DeviceInfo,
    /// Mappings of member files that took writes in place.
    mappings: FileMappings,
}

impl ArrayDevice {
    /// Serves `volume`, an array of `geometry` (or a layer over one) whose clients address it
    /// in blocks of `logical_block_bytes` (md's logical block size, 512 unless recorded).
    pub fn new(
        volume: Arc<dyn Volume>,
        geometry: &Geometry,
        logical_block_bytes: u32,
        read_only: bool,
        description: String,
    ) -> Self {
        let info = DeviceInfo {
            read_only,
            can_fast_zero: true,
            can_cache: true,
            min_block_bytes: logical_block_bytes,
            preferred_block_bytes: preferred_block_bytes(geometry.optimal_io_bytes(), geometry.chunk_sectors())
                .max(logical_block_bytes),
            max_payload_bytes: MAX_IO_BYTES as u32,
            byte_granular: volume.writes_bytes(),
            can_trim: volume.can_trim(),
            ..DeviceInfo::full_featured(volume.size_bytes(), description)
        };
        Self { volume, info, mappings: FileMappings::default() }
    }
}

/// The NBD meta context of our own: what a rebuild or resync will touch.
pub const SYNC_CONTEXT: &str = "raidnbd:sync";

/// NBD wants a power of two: the full stripe width when it is one, else the chunk.
fn preferred_block_bytes(optimal_io_bytes: u64, chunk_sectors: u32) -> u32 {
    let chunk_bytes = u64::from(chunk_sectors) * 512;
    let pick = if optimal_io_bytes.is_power_of_two() { optimal_io_bytes } else { chunk_bytes };
    pick.clamp(4096, MAX_IO_BYTES as u64).next_power_of_two() as u32
}

/// The one mapping from RAID errors to NBD errors.
fn to_device_error(e: RaidError) -> DeviceError {
    let kind = match e.kind {
        ErrorKind::OutOfRange | ErrorKind::Refused => DeviceErrorKind::Invalid,
        _ => DeviceErrorKind::Io,
    };
    DeviceError::new(kind, e.to_string())
}

impl BlockDevice for ArrayDevice {
    /// The size is the array's now: a reshape that grew it shows in new connections (a
    /// connection keeps the size it was told, as NBD wants).
    fn info(&self) -> DeviceInfo {
        DeviceInfo { size_bytes: self.volume.size_bytes(), ..self.info.clone() }
    }

    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        Box::pin(async move {
            if !is_aligned(offset, u64::from(len)) {
                return self.read_bytes(offset, len).await;
            }
            if len >= SEND_FILE_MIN_BYTES
                && let Some(extents) = self.volume.read_in_place(offset, len as usize).map_err(to_device_error)?
            {
                return Ok(extents
                    .into_iter()
                    .map(|e| {
                        let len = u32::try_from(e.len_bytes).expect("an extent is part of one request");
                        let mapping = self.mappings.of(&e.file);
                        ReadChunk::File(FileRange { file: e.file, offset: e.offset_bytes, len, mapping })
                    })
                    .collect());
            }
            let data = self.volume.read(offset, len as usize).await.map_err(to_device_error)?;
            let (bufs, segments) = data.into_parts();
            let owners: Vec<Bytes> = bufs.into_iter().map(Bytes::from_owner).collect();
            Ok(segments
                .into_iter()
                .map(|s| ReadChunk::Data(owners[s.buf].slice(s.start_bytes..s.start_bytes + s.len_bytes)))
                .collect())
        })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move {
            let written = if is_aligned(offset, data.len() as u64) {
                self.volume.write_shared(offset, data, fua).await
            } else {
                self.volume.write_bytes(offset, &data, fua).await
            };
            written.map_err(to_device_error)
        })
    }

    fn payload_alignment(&self) -> usize {
        self.volume.payload_alignment()
    }

    fn write_targets(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        Box::pin(async move {
            if !is_aligned(offset, u64::from(len)) {
                return Ok(None);
            }
            let Some(extents) = self.volume.write_in_place(offset, len as usize).await.map_err(to_device_error)? else {
                return Ok(None);
            };
            let mut targets = Vec::with_capacity(extents.len());
            for e in extents {
                let Some(mapping) = self.mappings.of(&e.file) else { return Ok(None) };
                let len = u32::try_from(e.len_bytes).expect("an extent is part of one request");
                targets.push(WriteTarget { mapping, offset: e.offset_bytes, len });
            }
            Ok(Some(targets))
        })
    }

    fn write_received(&self, _offset: u64, _len: u32, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move { if fua { self.volume.flush().await.map_err(to_device_error) } else { Ok(()) } })
    }

    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move { self.volume.flush().await.map_err(to_device_error) })
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move {
            // A hint: only the whole sectors inside the range.
            let start = offset.next_multiple_of(SECTOR_BYTES);
            let end = offset.saturating_add(len) / SECTOR_BYTES * SECTOR_BYTES;
            if end <= start {
                return Ok(());
            }
            self.volume.trim(start, end - start, fua).await.map_err(to_device_error)
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move {
            if flags.fast_zero && !(is_aligned(offset, len) && self.volume.zeroes_fast(offset, len)) {
                return Err(DeviceError::new(
                    DeviceErrorKind::NotSupported,
                    "zeroing this range would write data (a partial stripe, or members that cannot zero in place)",
                ));
            }
            if !is_aligned(offset, len) {
                return self.write_zeroes_bytes(offset, len, flags).await;
            }
            self.volume.write_zeroes(offset, len, !flags.no_hole, flags.fua).await.map_err(to_device_error)
        })
    }

    /// Read-ahead on the members holding the range (whole sectors around it).
    fn cache(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move {
            let start = offset / SECTOR_BYTES * SECTOR_BYTES;
            let end = (offset + len).next_multiple_of(SECTOR_BYTES);
            self.volume.cache(start, end - start).await.map_err(to_device_error)
        })
    }

    fn meta_contexts(&self) -> &'static [&'static str] {
        &[SYNC_CONTEXT]
    }

    /// `raidnbd:sync`: what a rebuild or resync will touch (`Volume::sync_status`: bit 0 not
    /// in sync, bit 1 dirty in the write-intent bitmap), for the whole sectors around the range.
    fn context_status(&self, index: usize, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<(u64, u32)>>> {
        debug_assert_eq!(index, 0, "one context of our own");
        let start = offset / SECTOR_BYTES * SECTOR_BYTES;
        let end = (offset + len).next_multiple_of(SECTOR_BYTES);
        let status = self.volume.sync_status(start, end - start).map_err(to_device_error);
        // The first extent starts at `start`; the server clips the answer to the request.
        let status = status.map(|mut extents| {
            if let Some(first) = extents.first_mut() {
                first.0 -= (offset - start).min(first.0 - 1);
            }
            extents
        });
        Box::pin(std::future::ready(status))
    }

    /// The volume's `base:allocation` (holes and zeros from the members, through the
    /// geometry), asked for the whole sectors around the range; a partial edge sector takes
    /// the state of its sector.
    fn block_status(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<Extent>>> {
        Box::pin(async move {
            let start = offset / SECTOR_BYTES * SECTOR_BYTES;
            let end = (offset + len).next_multiple_of(SECTOR_BYTES);
            let status = self.volume.block_status(start, end - start).await.map_err(to_device_error)?;
            let (mut skip, mut left) = (offset - start, len);
            let mut extents = Vec::with_capacity(status.len());
            for a in status {
                let head = skip.min(a.len_bytes);
                skip -= head;
                let n = (a.len_bytes - head).min(left);
                if n == 0 {
                    continue;
                }
                extents.push(Extent { len_bytes: n, hole: a.hole, zero: a.zero });
                left -= n;
            }
            Ok(extents)
        })
    }
}

fn is_aligned(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(SECTOR_BYTES) && len.is_multiple_of(SECTOR_BYTES)
}

/// `[offset, offset + len)` as (start, len) of its partial head sector, its whole sectors and
/// its partial tail sector, each `None` when empty.
fn split_at_sectors(offset: u64, len: u64) -> [Option<(u64, u64)>; 3] {
    let end = offset + len;
    let first_whole = offset.next_multiple_of(SECTOR_BYTES);
    let last_whole = end / SECTOR_BYTES * SECTOR_BYTES;
    let head_end = first_whole.min(end);
    let tail_start = last_whole.max(head_end);
    let range = |from: u64, to: u64| (to > from).then(|| (from, to - from));
    [range(offset, head_end), range(first_whole, last_whole), range(tail_start, end)]
}

impl ArrayDevice {
    /// A READ at any byte offset: its whole sectors read as usual, each partial edge sector
    /// read whole and sliced.
    async fn read_bytes(&self, offset: u64, len: u32) -> DeviceResult<Vec<ReadChunk>> {
        let mut chunks = Vec::new();
        for (at, n) in split_at_sectors(offset, u64::from(len)).into_iter().flatten() {
            let sector = at / SECTOR_BYTES * SECTOR_BYTES;
            let span = (at + n).next_multiple_of(SECTOR_BYTES) - sector;
            let data = self.volume.read(sector, span as usize).await.map_err(to_device_error)?;
            let whole = Bytes::from(data.to_vec());
            let skip = (at - sector) as usize;
            chunks.push(ReadChunk::Data(whole.slice(skip..skip + n as usize)));
        }
        Ok(chunks)
    }

    /// WRITE_ZEROES at any byte offset: zero bytes into the partial edge sectors, the
    /// whole sectors between zeroed as usual.
    async fn write_zeroes_bytes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceResult<()> {
        for (at, n) in split_at_sectors(offset, len).into_iter().flatten() {
            let done = if is_aligned(at, n) {
                self.volume.write_zeroes(at, n, !flags.no_hole, flags.fua).await
            } else {
                self.volume.write_bytes(at, &[0u8; SECTOR_BYTES as usize][..n as usize], flags.fua).await
            };
            done.map_err(to_device_error)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_split_into_partial_and_whole_sectors() {
        assert_eq!(split_at_sectors(100, 100), [Some((100, 100)), None, None]);
        assert_eq!(split_at_sectors(512, 88), [None, None, Some((512, 88))]);
        assert_eq!(split_at_sectors(500, 100), [Some((500, 12)), None, Some((512, 88))]);
        assert_eq!(split_at_sectors(500, 1124), [Some((500, 12)), Some((512, 1024)), Some((1536, 88))]);
        assert_eq!(split_at_sectors(1024, 512), [None, Some((1024, 512)), None]);
        assert_eq!(split_at_sectors(7, 0), [None, None, None]);
    }

    #[test]
    fn preferred_block_is_a_power_of_two() {
        assert_eq!(preferred_block_bytes(4 * 65536, 128), 262144); // raid0 4 x 64K
        assert_eq!(preferred_block_bytes(3 * 65536, 128), 65536); // raid5 4 disks: chunk
        assert_eq!(preferred_block_bytes(4096, 0), 4096); // raid1
        assert_eq!(preferred_block_bytes(1 << 30, 8192), 32 << 20);
    }
}
