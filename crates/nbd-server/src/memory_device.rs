//! [`MemoryDevice`]: a sparse in-memory [`BlockDevice`] for tests and benchmarks.
//!
//! Memory is allocated in 64 KiB pages on first write, so a large device costs only what
//! was written (plus 24 bytes of bookkeeping per page). Unallocated pages read as zero and
//! are reported as holes by block status; TRIM and WRITE_ZEROES (without NO_HOLE) free
//! whole pages again. Each page has its own lock, so requests on different pages run in
//! parallel and a request never sees a torn page.
//!
//! For error-path tests, [`MemoryDevice::inject_error`] makes every request touching a
//! byte range fail with a chosen [`DeviceErrorKind`], like a bad sector would, and
//! [`MemoryDevice::flush_count`] tells how many flushes reached the device.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use bytes::Bytes;

use crate::buffer_pool;

use crate::device::{
    BlockDevice, DeviceError, DeviceErrorKind, DeviceFuture, DeviceInfo, DeviceResult, Extent, ReadChunk, ZeroFlags,
};

/// Allocation granularity.
pub const PAGE_BYTES: u64 = 64 * 1024;

type Page = RwLock<Option<Box<[u8]>>>;

/// A sparse RAM disk.
pub struct MemoryDevice {
    info: DeviceInfo,
    pages: Box<[Page]>,
    faults: RwLock<Vec<(Range<u64>, DeviceErrorKind)>>,
    flushes: AtomicU64,
}

impl MemoryDevice {
    /// A writable device of `size_bytes`, all zero, supporting every feature.
    pub fn new(size_bytes: u64) -> Self {
        let info = DeviceInfo::full_featured(size_bytes, format!("memory device, {size_bytes} bytes"));
        Self::with_info(info)
    }

    /// A device described by `info` (size, flags, block sizes, description are taken as
    /// given; the device honours every operation regardless of the flags).
    pub fn with_info(info: DeviceInfo) -> Self {
        let page_count = info.size_bytes.div_ceil(PAGE_BYTES);
        let page_count = usize::try_from(page_count).expect("memory device larger than the address space");
        let pages = (0..page_count).map(|_| RwLock::new(None)).collect();
        Self { info, pages, faults: RwLock::new(Vec::new()), flushes: AtomicU64::new(0) }
    }

    /// Builder: mark the device read-only.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.info.read_only = read_only;
        self
    }

    /// Builder: change the advertised block sizes.
    pub fn block_sizes(mut self, min_bytes: u32, preferred_bytes: u32, max_payload_bytes: u32) -> Self {
        self.info.min_block_bytes = min_bytes;
        self.info.preferred_block_bytes = preferred_bytes;
        self.info.max_payload_bytes = max_payload_bytes;
        self
    }

    /// Builder: say that the device takes any byte offset and length whatever its minimum
    /// block (true of memory: see [`DeviceInfo::byte_granular`](crate::DeviceInfo)).
    pub fn byte_granular(mut self, byte_granular: bool) -> Self {
        self.info.byte_granular = byte_granular;
        self
    }

    /// Builder: set the description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.info.description = description.into();
        self
    }

    /// Every read, write, trim, write-zeroes or block-status request that touches `range`
    /// fails with `kind`, reporting the first failing byte as the error offset.
    pub fn inject_error(&self, range: Range<u64>, kind: DeviceErrorKind) {
        self.faults.write().unwrap_or_else(PoisonError::into_inner).push((range, kind));
    }

    /// Removes all injected errors.
    pub fn clear_errors(&self) {
        self.faults.write().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// How many times `flush` was called.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Bytes of page memory currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        let allocated =
            self.pages.iter().filter(|p| p.read().unwrap_or_else(PoisonError::into_inner).is_some()).count();
        allocated as u64 * PAGE_BYTES
    }

    fn check_faults(&self, offset: u64, len: u64) -> DeviceResult<()> {
        let faults = self.faults.read().unwrap_or_else(PoisonError::into_inner);
        let end = offset.saturating_add(len);
        for (range, kind) in faults.iter() {
            if range.start < end && offset < range.end {
                let at = range.start.max(offset);
                return Err(DeviceError::new(*kind, format!("injected error at byte {at}")).at(at));
            }
        }
        Ok(())
    }

    /// Checks the range is inside the device (the server already did; this is the device's
    /// own guard against misuse).
    fn check_range(&self, offset: u64, len: u64) -> DeviceResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size_bytes => Ok(()),
            _ => Err(DeviceError::new(DeviceErrorKind::Invalid, "request outside the device").at(offset)),
        }
    }

    /// Calls `f(page_index, offset_in_page, len_in_page)` for every page piece of the range.
    fn for_each_piece(offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize)) {
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let in_page = pos % PAGE_BYTES;
            let n = (PAGE_BYTES - in_page).min(end - pos);
            f((pos / PAGE_BYTES) as usize, in_page as usize, n as usize);
            pos += n;
        }
    }

    fn read_now(&self, offset: u64, len: u32) -> DeviceResult<Vec<ReadChunk>> {
        self.check_range(offset, u64::from(len))?;
        self.check_faults(offset, u64::from(len))?;
        let mut chunks = Vec::new();
        let mut pending: Option<Vec<u8>> = None;
        let mut remaining = len as usize;
        Self::for_each_piece(offset, u64::from(len), |page, at, n| {
            let guard = self.pages[page].read().unwrap_or_else(PoisonError::into_inner);
            match guard.as_deref() {
                Some(bytes) => {
                    pending.get_or_insert_with(|| buffer_pool::alloc(remaining)).extend_from_slice(&bytes[at..at + n]);
                }
                None => {
                    if let Some(data) = pending.take() {
                        chunks.push(ReadChunk::Data(buffer_pool::freeze(data)));
                    }
                    match chunks.last_mut() {
                        Some(ReadChunk::Zero(z)) => *z += n as u32,
                        _ => chunks.push(ReadChunk::Zero(n as u32)),
                    }
                }
            }
            remaining -= n;
        });
        if let Some(data) = pending {
            chunks.push(ReadChunk::Data(buffer_pool::freeze(data)));
        }
        Ok(chunks)
    }

    fn write_now(&self, offset: u64, data: &[u8]) -> DeviceResult<()> {
        self.check_range(offset, data.len() as u64)?;
        self.check_faults(offset, data.len() as u64)?;
        let mut consumed = 0;
        Self::for_each_piece(offset, data.len() as u64, |page, at, n| {
            let mut guard = self.pages[page].write().unwrap_or_else(PoisonError::into_inner);
            let bytes = guard.get_or_insert_with(|| vec![0u8; PAGE_BYTES as usize].into_boxed_slice());
            bytes[at..at + n].copy_from_slice(&data[consumed..consumed + n]);
            consumed += n;
        });
        Ok(())
    }

    /// Zeroes a range; whole pages are freed unless `keep_allocated`.
    fn zero_now(&self, offset: u64, len: u64, keep_allocated: bool) -> DeviceResult<()> {
        self.check_range(offset, len)?;
        self.check_faults(offset, len)?;
        Self::for_each_piece(offset, len, |page, at, n| {
            let mut guard = self.pages[page].write().unwrap_or_else(PoisonError::into_inner);
            let whole_page = n as u64 == PAGE_BYTES;
            match guard.as_mut() {
                Some(_) if whole_page && !keep_allocated => *guard = None,
                Some(bytes) => bytes[at..at + n].fill(0),
                None if keep_allocated => *guard = Some(vec![0u8; PAGE_BYTES as usize].into_boxed_slice()),
                None => {}
            }
        });
        Ok(())
    }

    fn block_status_now(&self, offset: u64, len: u64) -> DeviceResult<Vec<Extent>> {
        self.check_range(offset, len)?;
        self.check_faults(offset, len)?;
        let mut extents: Vec<Extent> = Vec::new();
        Self::for_each_piece(offset, len, |page, _, n| {
            let hole = self.pages[page].read().unwrap_or_else(PoisonError::into_inner).is_none();
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.len_bytes += n as u64,
                _ => extents.push(Extent { len_bytes: n as u64, hole, zero: hole }),
            }
        });
        Ok(extents)
    }
}

impl BlockDevice for MemoryDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        Box::pin(std::future::ready(self.read_now(offset, len)))
    }

    fn write(&self, offset: u64, data: Bytes, _fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(self.write_now(offset, &data)))
    }

    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(Ok(())))
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(self.zero_now(offset, len, false)))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(self.zero_now(offset, len, flags.no_hole)))
    }

    fn cache(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(self.check_range(offset, len)))
    }

    fn block_status(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<Extent>>> {
        Box::pin(std::future::ready(self.block_status_now(offset, len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flatten(chunks: &[ReadChunk]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            match c {
                ReadChunk::Data(d) => out.extend_from_slice(d),
                ReadChunk::Zero(n) => out.resize(out.len() + *n as usize, 0),
                ReadChunk::File(_) => unreachable!("a memory device returns no file ranges"),
            }
        }
        out
    }

    #[tokio::test]
    async fn sparse_read_write_trim_zero() {
        let dev = MemoryDevice::new(4 * PAGE_BYTES + 100);
        assert_eq!(dev.read(0, 1000).await.unwrap(), vec![ReadChunk::Zero(1000)]);
        let data: Vec<u8> = (0..3 * PAGE_BYTES as usize).map(|i| (i % 251) as u8).collect();
        dev.write(PAGE_BYTES / 2, Bytes::from(data.clone()), false).await.unwrap();
        let got = dev.read(PAGE_BYTES / 2, data.len() as u32).await.unwrap();
        assert_eq!(flatten(&got), data);
        assert_eq!(dev.allocated_bytes(), 4 * PAGE_BYTES);

        dev.trim(PAGE_BYTES, 2 * PAGE_BYTES, false).await.unwrap();
        assert_eq!(dev.allocated_bytes(), 2 * PAGE_BYTES);
        let status = dev.block_status(0, 4 * PAGE_BYTES).await.unwrap();
        assert_eq!(
            status.iter().map(|e| (e.len_bytes, e.hole)).collect::<Vec<_>>(),
            vec![(PAGE_BYTES, false), (2 * PAGE_BYTES, true), (PAGE_BYTES, false)]
        );
        dev.write_zeroes(2 * PAGE_BYTES, PAGE_BYTES, ZeroFlags { no_hole: true, ..Default::default() }).await.unwrap();
        assert_eq!(dev.allocated_bytes(), 3 * PAGE_BYTES);
        let got = flatten(&dev.read(0, (4 * PAGE_BYTES + 100) as u32).await.unwrap());
        assert!(got[PAGE_BYTES as usize..3 * PAGE_BYTES as usize].iter().all(|&b| b == 0));
        assert_eq!(&got[PAGE_BYTES as usize / 2..PAGE_BYTES as usize], &data[..PAGE_BYTES as usize / 2]);
    }

    #[tokio::test]
    async fn injected_errors_and_range_guard() {
        let dev = MemoryDevice::new(PAGE_BYTES);
        dev.inject_error(4096..8192, DeviceErrorKind::Io);
        let e = dev.read(0, 8192).await.unwrap_err();
        assert_eq!((e.kind, e.offset), (DeviceErrorKind::Io, Some(4096)));
        assert!(dev.read(0, 4096).await.is_ok());
        dev.clear_errors();
        assert!(dev.read(0, 8192).await.is_ok());
        assert_eq!(dev.read(PAGE_BYTES - 1, 2).await.unwrap_err().kind, DeviceErrorKind::Invalid);
        assert_eq!(
            dev.write(u64::MAX, Bytes::from_static(b"ab"), false).await.unwrap_err().kind,
            DeviceErrorKind::Invalid
        );
    }
}
