//! `AlignedBuf`: an owned, page-aligned, zero-initialised byte buffer.
//!
//! Member I/O moves buffers by value (`read_at(offset, buf) -> (result, buf)`), so a
//! buffer handed to the kernel (io_uring, O_DIRECT) lives until the I/O completes even
//! when the task that asked for it is cancelled. Alignment is [`BUF_ALIGN`] bytes,
//! which satisfies every O_DIRECT alignment Linux reports (`statx` `dio_mem_align`
//! is at most the page size).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`] allocation, in bytes.
pub const BUF_ALIGN: usize = 4096;

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

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len());
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

    /// Changes the visible length. Growing exposes bytes that are zero or hold
    /// earlier contents of this same buffer, never uninitialised memory.
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
            assert!(b.capacity() >= len && b.capacity() % BUF_ALIGN == 0);
        }
    }

    #[test]
    fn set_len_keeps_contents() {
        let mut b = AlignedBuf::from_slice(&[7u8; 100]);
        b.set_len(10);
        b.set_len(100);
        assert!(b.as_slice().iter().all(|&x| x == 7));
    }
}
