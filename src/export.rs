//! `ArrayDevice`: a RAID array seen as an NBD block device.
//!
//! This is the only place where raid-core meets nbd-server, and the only place raid-core
//! errors become NBD errors. Read data is handed to the server as the member buffers
//! themselves (`Bytes::from_owner`), so reads are not copied again on their way out.
//!
//! Reads of at least [`SEND_FILE_MIN_BYTES`] that the array can answer in place (members that are
//! files in memory, a level without parity, healthy copies: `Array::read_in_place`) are
//! handed over as file ranges, which the server sends with `sendfile`. Likewise, WRITEs of
//! at least `RECEIVE_IN_PLACE_MIN_BYTES` (the server asks only for those) that the array
//! can take in place (members that are files in memory, linear or raid0:
//! `Array::write_in_place`) are received by the server straight into shared mappings of the
//! member files, made once per member file.
//!
//! The device serves one [`Volume`]: the array itself, or with `serve --cache writeback`
//! the array's one shared write cache (one per array, so a FLUSH on any connection covers
//! writes made on all of them and multi-conn stays safe), which offers no in-place paths.

use std::sync::Arc;

use bytes::Bytes;
use nbd_server::FileMappings;
use nbd_server::device::{
    BlockDevice, DeviceError, DeviceErrorKind, DeviceFuture, DeviceInfo, DeviceResult, FileRange, ReadChunk,
    SEND_FILE_MIN_BYTES, WriteTarget, ZeroFlags,
};
use nbd_server::protocol::consts::MAX_PAYLOAD_BYTES;
use raid_core::geometry::Geometry;
use raid_core::{ErrorKind, RaidError, Volume};

pub struct ArrayDevice {
    /// The array, or the write-back cache over it.
    volume: Arc<dyn Volume>,
    info: DeviceInfo,
    /// Mappings of member files that took writes in place.
    mappings: FileMappings,
}

impl ArrayDevice {
    /// Serves `volume`, an array of `geometry` (or a layer over one).
    pub fn new(volume: Arc<dyn Volume>, geometry: &Geometry, read_only: bool, description: String) -> Self {
        let info = DeviceInfo {
            read_only,
            can_fast_zero: false,
            can_cache: false,
            min_block_bytes: 512,
            preferred_block_bytes: preferred_block_bytes(geometry.optimal_io_bytes(), geometry.chunk_sectors()),
            ..DeviceInfo::full_featured(volume.size_bytes(), description)
        };
        Self { volume, info, mappings: FileMappings::default() }
    }
}

/// NBD wants a power of two: the full stripe width when it is one, else the chunk.
fn preferred_block_bytes(optimal_io_bytes: u64, chunk_sectors: u32) -> u32 {
    let chunk_bytes = u64::from(chunk_sectors) * 512;
    let pick = if optimal_io_bytes.is_power_of_two() { optimal_io_bytes } else { chunk_bytes };
    pick.clamp(4096, u64::from(MAX_PAYLOAD_BYTES)).next_power_of_two() as u32
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
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        Box::pin(async move {
            if len >= SEND_FILE_MIN_BYTES
                && let Some(extents) = self.volume.read_in_place(offset, len as usize).map_err(to_device_error)?
            {
                return Ok(extents
                    .into_iter()
                    .map(|e| {
                        let len = u32::try_from(e.len_bytes).expect("an extent is part of one request");
                        ReadChunk::File(FileRange { file: e.file, offset: e.offset_bytes, len })
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
        Box::pin(async move { self.volume.write(offset, &data, fua).await.map_err(to_device_error) })
    }

    fn write_targets(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        Box::pin(async move {
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
        Box::pin(async move { self.volume.trim(offset, len, fua).await.map_err(to_device_error) })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move {
            if flags.fast_zero {
                return Err(DeviceError::new(DeviceErrorKind::NotSupported, "fast zeroing is not supported"));
            }
            self.volume.write_zeroes(offset, len, !flags.no_hole, flags.fua).await.map_err(to_device_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_block_is_a_power_of_two() {
        assert_eq!(preferred_block_bytes(4 * 65536, 128), 262144); // raid0 4 x 64K
        assert_eq!(preferred_block_bytes(3 * 65536, 128), 65536); // raid5 4 disks: chunk
        assert_eq!(preferred_block_bytes(4096, 0), 4096); // raid1
        assert_eq!(preferred_block_bytes(1 << 30, 8192), 32 << 20);
    }
}
