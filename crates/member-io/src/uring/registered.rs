//! A fixed pool of io_uring registered buffers ("fixed buffers"), sized by RLIMIT_MEMLOCK.
//!
//! Registered buffers spare the kernel from pinning user pages on every I/O. Member
//! buffers belong to callers and change every request, so they cannot be registered;
//! instead the ring thread copies write data into a free slot (and read data out of it)
//! and uses ReadFixed/WriteFixed. When every slot is busy, or the I/O is larger than a
//! slot, the op goes out as a plain Read/Write on the caller's buffer.
//!
//! The crate benchmark measured no consistent gain (README.md), so the pool is opt-in
//! (`UringConfig::registered_buffers`).
//!
//! The pool must outlive the ring it is registered with (the ring thread declares the ring
//! before the pool so that it is dropped first).

use std::io;

use io_uring::IoUring;
use raid_core::AlignedBuf;

/// Bytes per slot: covers 4 KiB..64 KiB random I/O, where pinning cost matters most.
pub(crate) const SLOT_BYTES: usize = 64 * 1024;
/// Upper bound on the pool whatever the rlimit says.
pub(crate) const POOL_MAX_BYTES: usize = 8 << 20;

pub(crate) struct RegisteredPool {
    memory: AlignedBuf,
    free_slots: Vec<u16>,
}

impl RegisteredPool {
    /// Allocates and registers up to `budget_bytes` of slots with `ring`.
    pub(crate) fn register(ring: &IoUring, budget_bytes: usize) -> io::Result<Self> {
        let slots = (budget_bytes.min(POOL_MAX_BYTES) / SLOT_BYTES).min(usize::from(u16::MAX));
        if slots == 0 {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        let mut memory = AlignedBuf::zeroed(slots * SLOT_BYTES);
        let base = memory.as_mut_ptr();
        let iovecs: Vec<libc::iovec> = (0..slots)
            .map(|i| libc::iovec {
                // SAFETY: i * SLOT_BYTES < slots * SLOT_BYTES = memory.len(), so the pointer stays in bounds.
                iov_base: unsafe { base.add(i * SLOT_BYTES) }.cast(),
                iov_len: SLOT_BYTES,
            })
            .collect();
        // SAFETY: every iovec points into `memory`, which lives in the returned pool; the
        // ring thread keeps the pool alive until after the ring is dropped (field order).
        unsafe { ring.submitter().register_buffers(&iovecs)? };
        let free_slots = (0..slots as u16).rev().collect();
        Ok(Self { memory, free_slots })
    }

    pub(crate) fn slots(&self) -> usize {
        self.memory.len() / SLOT_BYTES
    }

    /// A free slot for an I/O of `len_bytes`, if one fits.
    pub(crate) fn take(&mut self, len_bytes: usize) -> Option<u16> {
        if len_bytes > SLOT_BYTES {
            return None;
        }
        self.free_slots.pop()
    }

    pub(crate) fn release(&mut self, slot: u16) {
        debug_assert!(usize::from(slot) < self.slots() && !self.free_slots.contains(&slot));
        self.free_slots.push(slot);
    }

    pub(crate) fn slot_mut(&mut self, slot: u16) -> &mut [u8] {
        let start = usize::from(slot) * SLOT_BYTES;
        &mut self.memory.as_mut_slice()[start..start + SLOT_BYTES]
    }
}

/// Bytes of registered buffers we allow ourselves: half the RLIMIT_MEMLOCK soft limit
/// (the ring itself and other rings of this user need the rest), capped at [`POOL_MAX_BYTES`].
pub(crate) fn memlock_budget_bytes() -> usize {
    // SAFETY: rlimit is plain data; all-zero is valid.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if rc != 0 {
        return 0;
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        return POOL_MAX_BYTES;
    }
    usize::try_from(limit.rlim_cur / 2).unwrap_or(POOL_MAX_BYTES).min(POOL_MAX_BYTES)
}
