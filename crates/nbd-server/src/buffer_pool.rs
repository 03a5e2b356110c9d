//! Reusable large I/O buffers (READ data, WRITE payloads).
//!
//! A fresh multi-megabyte allocation is fresh pages: the first copy into it takes a page
//! fault per 4 KiB (profiling 1 MiB reads showed about a quarter of the server's CPU in
//! faults). Buffers of at least [`MIN_POOLED_BYTES`] are therefore recycled: [`alloc`]
//! hands out a `Vec` from a power-of-two size class, [`freeze`] turns it into `Bytes`
//! whose drop (after the reply was written, or the write applied) returns the `Vec` to its
//! class. At most [`MAX_RETAINED_BYTES`] are kept idle; beyond that buffers are freed.
//! Smaller buffers are plain allocations (the allocator serves those from warm memory).
//!
//! Every buffer has [`ALIGN_BYTES`] of slack, so that [`alloc_aligned`] can start a WRITE
//! payload at a 4 KiB boundary: a device whose members write with O_DIRECT then writes the
//! received bytes themselves instead of copying them into aligned memory first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

use crate::protocol::consts::MAX_PAYLOAD_BYTES;

/// The boundary [`alloc_aligned`] starts data at (every O_DIRECT memory alignment).
pub const ALIGN_BYTES: usize = 4096;
/// Buffers below this size are not pooled.
pub const MIN_POOLED_BYTES: usize = 64 * 1024;
/// Idle pooled memory is capped at this many bytes.
pub const MAX_RETAINED_BYTES: usize = 64 * 1024 * 1024;
/// Size classes: 64 KiB, 128 KiB, ... 64 MiB.
const CLASSES: usize = (MAX_PAYLOAD_BYTES as usize / MIN_POOLED_BYTES).trailing_zeros() as usize + 1;

const _: () = assert!(MIN_POOLED_BYTES.is_power_of_two());
const _: () = assert!(MIN_POOLED_BYTES << (CLASSES - 1) == MAX_PAYLOAD_BYTES as usize);

struct Pool {
    classes: [Mutex<Vec<Vec<u8>>>; CLASSES],
    retained_bytes: AtomicUsize,
}

static POOL: Pool = Pool { classes: [const { Mutex::new(Vec::new()) }; CLASSES], retained_bytes: AtomicUsize::new(0) };

/// The class index for a buffer of `len` bytes, if pooled.
fn class_of(len: usize) -> Option<usize> {
    if !(MIN_POOLED_BYTES..=MAX_PAYLOAD_BYTES as usize).contains(&len) {
        return None;
    }
    Some((len.next_power_of_two() / MIN_POOLED_BYTES).trailing_zeros() as usize)
}

/// The class of a buffer [`alloc`] made with `capacity`, if pooled.
fn pooled_class(capacity: usize) -> Option<usize> {
    let data = capacity.checked_sub(ALIGN_BYTES)?;
    class_of(data).filter(|&class| MIN_POOLED_BYTES << class == data)
}

/// An empty `Vec` with capacity for at least `len` bytes (recycled when large).
pub fn alloc(len: usize) -> Vec<u8> {
    let Some(class) = class_of(len) else { return Vec::with_capacity(len + ALIGN_BYTES) };
    let recycled = POOL.classes[class].lock().unwrap_or_else(PoisonError::into_inner).pop();
    match recycled {
        Some(mut buf) => {
            POOL.retained_bytes.fetch_sub(buf.capacity(), Ordering::Relaxed);
            buf.clear();
            debug_assert!(buf.capacity() >= len);
            buf
        }
        None => Vec::with_capacity((MIN_POOLED_BYTES << class) + ALIGN_BYTES),
    }
}

/// A buffer for `len` bytes that start at a 4 KiB boundary: the returned `Vec` already
/// holds that many padding bytes (its `len()`, below [`ALIGN_BYTES`]); append the data,
/// freeze, and slice the padding off (`freeze(buf).slice(pad..)`).
pub fn alloc_aligned(len: usize) -> Vec<u8> {
    let mut buf = alloc(len);
    let pad = buf.as_ptr().align_offset(ALIGN_BYTES);
    debug_assert!(pad < ALIGN_BYTES && buf.capacity() >= pad + len);
    buf.resize(pad, 0);
    buf
}

/// Freezes a buffer from [`alloc`]; dropping the last clone returns it to the pool.
pub fn freeze(buf: Vec<u8>) -> Bytes {
    if pooled_class(buf.capacity()).is_some() { Bytes::from_owner(Pooled(buf)) } else { Bytes::from(buf) }
}

/// Owner of a pooled buffer inside `Bytes`.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        let capacity = buf.capacity();
        let Some(class) = pooled_class(capacity) else { return };
        if POOL.retained_bytes.fetch_add(capacity, Ordering::Relaxed) + capacity > MAX_RETAINED_BYTES {
            POOL.retained_bytes.fetch_sub(capacity, Ordering::Relaxed);
            return;
        }
        POOL.classes[class].lock().unwrap_or_else(PoisonError::into_inner).push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_recycled_small_ones_are_not() {
        assert_eq!(class_of(4096), None);
        assert_eq!(class_of(MIN_POOLED_BYTES), Some(0));
        assert_eq!(class_of(MIN_POOLED_BYTES + 1), Some(1));
        assert_eq!(class_of(MAX_PAYLOAD_BYTES as usize), Some(CLASSES - 1));
        assert_eq!(class_of(MAX_PAYLOAD_BYTES as usize + 1), None);

        let mut buf = alloc(3 << 20);
        assert_eq!(buf.capacity(), (4 << 20) + ALIGN_BYTES);
        buf.resize(3 << 20, 7);
        let ptr = buf.as_ptr();
        let bytes = freeze(buf);
        assert_eq!(bytes.len(), 3 << 20);
        let clone = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(&clone[..], &[7; 10]);
        drop(clone);
        // The same allocation comes back for the next buffer of that class.
        let again = alloc((3 << 20) + 5);
        assert!(again.is_empty() && again.capacity() == (4 << 20) + ALIGN_BYTES);
        assert_eq!(again.as_ptr(), ptr);
        assert!(POOL.retained_bytes.load(Ordering::Relaxed) <= MAX_RETAINED_BYTES);
    }

    #[test]
    fn aligned_buffers_start_their_data_at_4k() {
        for len in [512, 4096, 65536, 1 << 20, 3 << 20] {
            let mut buf = alloc_aligned(len);
            let pad = buf.len();
            buf.extend_from_slice(&vec![9u8; len]);
            let data = freeze(buf).slice(pad..);
            assert_eq!(data.len(), len);
            assert_eq!(data.as_ptr() as usize % ALIGN_BYTES, 0, "{len}");
            assert!(data.iter().all(|&b| b == 9));
        }
    }
}
