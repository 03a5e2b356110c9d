//! Byte-granular writes: [`Array::write_bytes`] takes any offset and length.
//!
//! Members take whole 512-byte sectors, so a write that starts or ends inside a sector
//! rewrites that sector: read it, patch the bytes, write it back. That read-modify-write
//! runs under the lock every write of the sector takes (its stripe on raid4/5/6, its lock
//! unit on the other levels), so two writers of different bytes of one sector never undo
//! each other's bytes, and a whole-sector write is never lost under a patched old copy.
//! The aligned middle of the request is an ordinary write. (An in-place receive into a
//! member file of a linear/raid0 array holds no lock while the client sends the payload:
//! it may race an overlapping byte-granular write as any two overlapping writes race.)

use std::sync::atomic::Ordering;

use super::shape::{Part, Parts};
use super::stripe_write::WriteSource;
use super::{Array, DataPath, Layout, LockGuard, MAX_IO_BYTES};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::member::Member;
use crate::payload::Payload;

impl<M: Member + ?Sized> Array<M> {
    /// Writes `data` at `offset_bytes`, neither of which needs to be a multiple of 512;
    /// with `fua` it is durable on return.
    pub async fn write_bytes(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        let len = data.len() as u64;
        if offset_bytes.is_multiple_of(SECTOR_BYTES) && len.is_multiple_of(SECTOR_BYTES) {
            return self.write(offset_bytes, data, fua).await;
        }
        let _in_flight = self.enter_write("write")?;
        let start_sector = offset_bytes / SECTOR_BYTES;
        let end_bytes = offset_bytes.saturating_add(len);
        let end_sector = end_bytes.div_ceil(SECTOR_BYTES);
        self.check_io(start_sector * SECTOR_BYTES, (end_sector - start_sector) * SECTOR_BYTES, false)?;
        if data.len() > MAX_IO_BYTES {
            return Err(RaidError::new(ErrorKind::Refused, format!("request of {len} bytes exceeds 32 MiB")));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.client_io_bytes.fetch_add(len, Ordering::Relaxed);
        self.ensure_dirty().await?;
        // The sectors wholly covered, and the one or two partly covered.
        let first_whole = offset_bytes.div_ceil(SECTOR_BYTES);
        let last_whole = end_bytes / SECTOR_BYTES;
        let head = !offset_bytes.is_multiple_of(SECTOR_BYTES);
        let tail = !end_bytes.is_multiple_of(SECTOR_BYTES) && (end_sector - 1 != start_sector || !head);
        // The bytes of the request that fall into `sector`, and where in it.
        let patch = |sector: u64| {
            let sector_start = sector * SECTOR_BYTES;
            let from = offset_bytes.max(sector_start);
            let to = end_bytes.min(sector_start + SECTOR_BYTES);
            let in_data = (from - offset_bytes) as usize..(to - offset_bytes) as usize;
            ((from - sector_start) as usize, &data[in_data])
        };
        let head_write = async {
            if !head {
                return Ok(());
            }
            let (at, bytes) = patch(start_sector);
            self.patch_sector(start_sector, at, bytes, fua).await
        };
        let tail_write = async {
            if !tail {
                return Ok(());
            }
            let (at, bytes) = patch(end_sector - 1);
            self.patch_sector(end_sector - 1, at, bytes, fua).await
        };
        let middle_write = async {
            if last_whole <= first_whole {
                return Ok(());
            }
            let from = (first_whole * SECTOR_BYTES - offset_bytes) as usize;
            let to = (last_whole * SECTOR_BYTES - offset_bytes) as usize;
            self.write_sectors(first_whole, Payload::Borrowed(&data[from..to]), fua).await
        };
        let (h, m, t) = futures::join!(head_write, middle_write, tail_write);
        h.and(m).and(t)
    }

    /// Read-modify-write of one sector under its write lock: `bytes` replace the sector's
    /// bytes from `at`.
    async fn patch_sector(&self, sector: u64, at: usize, bytes: &[u8], fua: bool) -> Result<()> {
        debug_assert!(at + bytes.len() <= SECTOR_BYTES as usize && !bytes.is_empty());
        let entered = self.shape.enter(sector, 1).await?;
        let Parts::One(Part { layout, .. }) = &entered.parts else { unreachable!("one sector is one part") };
        let _guards = self.lock_write_range(layout, sector, 1).await;
        let old = match DataPath::of(layout) {
            DataPath::Striped => self.read_striped_in(layout, sector, SECTOR_BYTES as usize, true).await?,
            DataPath::Mirrored => self.read_mirrored(layout, sector, SECTOR_BYTES as usize).await?,
        };
        let mut buf = AlignedBuf::from_slice(&old.to_vec());
        buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
        crate::copy_count::copied(bytes.len());
        match DataPath::of(layout) {
            DataPath::Striped => self.write_striped_locked(layout, sector, buf.as_slice().into(), fua).await,
            DataPath::Mirrored => self.write_mirrored_locked(layout, sector, buf.as_slice().into(), fua).await,
        }
    }

    /// Whole sectors by the data path of each part's layout (inside an entered write, the
    /// array marked dirty).
    pub(super) async fn write_sectors(&self, start_sector: u64, data: Payload<'_>, fua: bool) -> Result<()> {
        let entered = self.shape.enter(start_sector, data.len() as u64 / SECTOR_BYTES).await?;
        match &entered.parts {
            Parts::One(part) => self.write_part(part, data, fua).await,
            Parts::Two(a, b) => {
                let at = (a.sectors * SECTOR_BYTES) as usize;
                let (first, second) = (data.slice(0..at), data.slice(at..data.len()));
                let (a, b) = futures::join!(self.write_part(a, first, fua), self.write_part(b, second, fua));
                a.and(b)
            }
        }
    }

    /// Writes one part of a request, in its layout.
    pub(super) async fn write_part(&self, part: &Part, data: Payload<'_>, fua: bool) -> Result<()> {
        match DataPath::of(&part.layout) {
            DataPath::Striped => {
                self.write_striped(&part.layout, part.start, part.sectors, WriteSource::Data(data), fua).await
            }
            DataPath::Mirrored => self.write_mirrored(&part.layout, part.start, data, fua).await,
        }
    }

    /// The locks a write of `[sector, +sectors)` of `layout` takes.
    async fn lock_write_range(&self, layout: &Layout, sector: u64, sectors: u64) -> Vec<LockGuard<'_>> {
        match DataPath::of(layout) {
            DataPath::Striped => self.locks.lock_all(self.stripes_of(layout, sector, sectors)).await,
            DataPath::Mirrored => self.lock_mirror_range(layout, sector, sectors).await,
        }
    }
}
