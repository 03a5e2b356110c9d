//! `AlignedBuf`: an owned, page-aligned, always-initialised byte buffer.
//!
//! Member I/O moves buffers by value (`read_at(offset, buf) -> (result, buf)`), so a
//! buffer handed to the kernel (io_uring, O_DIRECT) lives until the I/O completes even
//! when the task that asked for it is cancelled. Alignment is [`BUF_ALIGN`] bytes,
//! which satisfies every O_DIRECT alignment Linux reports (`statx` `dio_mem_align`
//! is at most the page size).
//!
//! Allocations whose capacity is a power of two between 4 KiB and 32 MiB are recycled
//! through a small process-wide pool (at most [`POOL_LIMIT_BYTES`]): a fresh large
//! allocation costs a page fault per 4 KiB on first touch, which dominated the CPU cost
//! of 1 MiB reads. [`AlignedBuf::for_overwrite`] hands out recycled memory whose old
//! contents the caller must overwrite completely before showing them to anyone.

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Alignment of every [`AlignedBuf`] allocation, in bytes.
pub const BUF_ALIGN: usize = 4096;

/// Most bytes the recycling pool keeps.
pub const POOL_LIMIT_BYTES: usize = 64 << 20;
/// Pooled capacities: 4 KiB << class, class 0..POOL_CLASSES (4 KiB .. 32 MiB).
const POOL_CLASSES: usize = 14;

/// A recycled allocation (capacity given by its class).
struct Pooled(NonNull<u8>);
// SAFETY: a pooled allocation is owned by nobody but the pool; it is plain memory.
unsafe impl Send for Pooled {}

static POOL: [Mutex<Vec<Pooled>>; POOL_CLASSES] = [const { Mutex::new(Vec::new()) }; POOL_CLASSES];
static POOLED_BYTES: AtomicUsize = AtomicUsize::new(0);

fn pool_class(capacity: usize) -> Option<usize> {
    let class = capacity.checked_ilog2()?.checked_sub(BUF_ALIGN.ilog2())? as usize;
    (capacity.is_power_of_two() && class < POOL_CLASSES).then_some(class)
}

/// An owned heap buffer aligned to [`BUF_ALIGN`], always fully initialised.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); no interior
// mutability or thread-affine state.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of initialised bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len_bytes`.
    pub fn zeroed(len_bytes: usize) -> Self {
        let capacity = len_bytes.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Layout::from_size_align(capacity, BUF_ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size (capacity >= BUF_ALIGN).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        debug_assert_eq!(ptr.as_ptr() as usize % BUF_ALIGN, 0);
        Self { ptr, len: len_bytes, capacity }
    }

    /// A buffer of `len_bytes` whose contents are unspecified (zeros, or bytes of an
    /// earlier buffer): for reads and copies that overwrite all of it. Reuses pooled
    /// memory when it can.
    pub fn for_overwrite(len_bytes: usize) -> Self {
        let capacity = len_bytes.max(BUF_ALIGN).next_power_of_two();
        if let Some(class) = pool_class(capacity)
            && let Some(Pooled(ptr)) = POOL[class].lock().expect("buffer pool").pop()
        {
            POOLED_BYTES.fetch_sub(capacity, Ordering::Relaxed);
            debug_assert_eq!(ptr.as_ptr() as usize % BUF_ALIGN, 0);
            return Self { ptr, len: len_bytes, capacity };
        }
        let mut buf = Self::zeroed(capacity);
        buf.len = len_bytes;
        buf
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::for_overwrite(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (a multiple of [`BUF_ALIGN`]); `len` can grow up to this without reallocating.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the visible length. Growing exposes bytes that are zero or hold earlier
    /// contents (of this buffer, or of a recycled one), never uninitialised memory.
    ///
    /// # Panics
    /// If `len_bytes > capacity()`.
    pub fn set_len(&mut self, len_bytes: usize) {
        assert!(len_bytes <= self.capacity, "set_len beyond capacity");
        self.len = len_bytes;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `capacity >= len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Raw pointer for handing to the kernel. Valid while `self` is alive and not moved out of.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable raw pointer for handing to the kernel (reads into this buffer).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn fill(&mut self, byte: u8) {
        self.as_mut_slice().fill(byte);
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(class) = pool_class(self.capacity) {
            if POOLED_BYTES.fetch_add(self.capacity, Ordering::Relaxed) + self.capacity <= POOL_LIMIT_BYTES {
                POOL[class].lock().expect("buffer pool").push(Pooled(self.ptr));
                return;
            }
            POOLED_BYTES.fetch_sub(self.capacity, Ordering::Relaxed);
        }
        let layout = Layout::from_size_align(self.capacity, BUF_ALIGN).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self.as_slice())
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 511, 512, 4096, 4097, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            assert!(b.capacity() >= len && b.capacity().is_multiple_of(BUF_ALIGN));
        }
    }

    #[test]
    fn recycled_buffers_are_aligned_and_sized() {
        for len in [1, 4096, 4097, 65536, 1 << 20, 3 << 20] {
            let mut a = AlignedBuf::for_overwrite(len);
            a.fill(0xab);
            let ptr = a.as_ptr();
            drop(a);
            let b = AlignedBuf::for_overwrite(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
            assert!(b.capacity() >= len);
            // Usually the same allocation comes back (other tests may race for it).
            let _ = ptr;
        }
        assert!(POOLED_BYTES.load(Ordering::Relaxed) <= POOL_LIMIT_BYTES);
        let data = [7u8; 5000];
        assert_eq!(AlignedBuf::from_slice(&data).as_slice(), &data);
    }

    #[test]
    fn set_len_keeps_contents() {
        let mut b = AlignedBuf::from_slice(&[7u8; 100]);
        b.set_len(10);
        b.set_len(100);
        assert!(b.as_slice().iter().all(|&x| x == 7));
    }
}
