//! Member I/O helpers shared by every level: sector addressing relative to the data
//! offset, read-load accounting, and coalescing of pieces that are contiguous on one
//! member into a single I/O (a 1 MiB read of a 4-member raid0 becomes 4 member reads,
//! not one per chunk).

use std::io;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::future::join_all;

use super::Array;
use super::read_assembler::ReadAssembler;
use super::slot::Device;
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{RaidError, Result};
use crate::member::Member;
use crate::payload::Payload;

/// A piece of a request that lives contiguously on one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub role: usize,
    pub member_sector: u64,
    pub sectors: u64,
    /// Byte offset of the piece within the request.
    pub req_offset_bytes: usize,
}

/// Several pieces merged into one member I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub role: usize,
    pub member_sector: u64,
    pub sectors: u64,
    /// The pieces, with their byte offset inside the run.
    pub pieces: Vec<(Piece, usize)>,
}

/// Largest single member I/O built by coalescing.
const MAX_RUN_SECTORS: u64 = (32 << 20) / SECTOR_BYTES;

/// Merges pieces that are adjacent on the same member (in member order).
pub(crate) fn coalesce(mut pieces: Vec<Piece>) -> Vec<Run> {
    pieces.sort_unstable_by_key(|p| (p.role, p.member_sector));
    let mut runs: Vec<Run> = Vec::new();
    for p in pieces {
        if let Some(run) = runs.last_mut()
            && run.role == p.role
            && run.member_sector + run.sectors == p.member_sector
            && run.sectors + p.sectors <= MAX_RUN_SECTORS
        {
            let at = (run.sectors * SECTOR_BYTES) as usize;
            run.sectors += p.sectors;
            run.pieces.push((p, at));
            continue;
        }
        debug_assert!(runs.last().is_none_or(|r| r.role != p.role || r.member_sector + r.sectors <= p.member_sector));
        runs.push(Run { role: p.role, member_sector: p.member_sector, sectors: p.sectors, pieces: vec![(p, 0)] });
    }
    runs
}

/// Decrements a member's read load when the read finishes or is cancelled.
struct LoadGuard<'a>(&'a std::sync::atomic::AtomicU64, u64);

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Reads `sectors` at `member_sector` of `role` into a new buffer.
    /// Reads pieces (coalesced per member) into `out`; returns the pieces whose member
    /// failed, after marking it faulty. Without redundancy a failure is an error.
    pub(super) async fn read_pieces(&self, pieces: Vec<Piece>, out: &mut ReadAssembler) -> Result<Vec<Piece>> {
        let runs = coalesce(pieces);
        let results = join_all(runs.iter().map(|r| self.read_member(r.role, r.member_sector, r.sectors))).await;
        let mut failed = Vec::new();
        for (run, res) in runs.into_iter().zip(results) {
            match res {
                Ok(buf) => {
                    let b = out.add_buf(buf);
                    for (p, at) in run.pieces {
                        out.piece(p.req_offset_bytes, b, at, (p.sectors * SECTOR_BYTES) as usize);
                    }
                }
                Err(e) => {
                    self.member_failed(run.role, &e, "read").await;
                    if !self.has_redundancy() {
                        return Err(RaidError::io(format!("read of role {} failed", run.role), e));
                    }
                    failed.extend(run.pieces.into_iter().map(|(p, _)| p));
                }
            }
        }
        Ok(failed)
    }

    pub(crate) async fn read_member(&self, role: usize, member_sector: u64, sectors: u64) -> io::Result<AlignedBuf> {
        let slot = &self.members.slots()[role];
        let device = slot.device().ok_or_else(|| io::Error::other(format!("role {role} has no device")))?;
        let started = std::time::Instant::now();
        let read = read_device(&device, member_sector, sectors, &slot.inflight_read_bytes).await;
        if read.is_ok() {
            slot.read_balance.record(started.elapsed());
        }
        read
    }

    /// Writes `buf` at `member_sector` of `role`, and to the role's replacement if one is
    /// being built (a failure there drops the replacement, not the role).
    pub(crate) async fn write_member(
        &self,
        role: usize,
        member_sector: u64,
        buf: AlignedBuf,
        fua: bool,
    ) -> io::Result<()> {
        debug_assert_eq!(buf.len() as u64 % SECTOR_BYTES, 0);
        let slot = &self.members.slots()[role];
        let device = slot.device().ok_or_else(|| io::Error::other(format!("role {role} has no device")))?;
        if let Some(replacement) = slot.replacement() {
            // Both legs write the one buffer, shared (not copied).
            let shared = vec![Bytes::from_owner(buf)];
            let (primary, second) = futures::join!(
                device.member.write_shared_at(device.offset_bytes(member_sector), shared.clone(), fua),
                replacement.device.member.write_shared_at(replacement.device.offset_bytes(member_sector), shared, fua)
            );
            if let Err(e) = second {
                self.replacement_failed(role, &replacement, &e).await;
            }
            return primary;
        }
        write_device(&device, member_sector, buf, fua).await
    }

    /// `write_member` of `pieces` of a client's payload, one after another. Shared pieces go
    /// to the member (and the replacement being built) as they are, without a copy; one
    /// borrowed piece is borrowed by members that write synchronously; several borrowed
    /// pieces are joined (a copy).
    pub(crate) async fn write_member_pieces(
        &self,
        role: usize,
        member_sector: u64,
        pieces: Vec<Payload<'_>>,
        fua: bool,
    ) -> io::Result<()> {
        debug_assert!(pieces.iter().all(|p| (p.len() as u64).is_multiple_of(SECTOR_BYTES)));
        let slot = &self.members.slots()[role];
        let device = slot.device().ok_or_else(|| io::Error::other(format!("role {role} has no device")))?;
        let offset = |device: &Device<M>| device.offset_bytes(member_sector);
        let shared: Option<Vec<Bytes>> = pieces.iter().try_fold(Vec::new(), |mut all, p| {
            all.extend(p.shared_pieces()?);
            Some(all)
        });
        let replacement = slot.replacement();
        match (shared, pieces.as_slice(), replacement) {
            (Some(shared), _, None) => device.member.write_shared_at(offset(&device), shared, fua).await,
            (Some(shared), _, Some(replacement)) => {
                let (primary, second) = futures::join!(
                    device.member.write_shared_at(offset(&device), shared.clone(), fua),
                    replacement.device.member.write_shared_at(offset(&replacement.device), shared, fua)
                );
                if let Err(e) = second {
                    self.replacement_failed(role, &replacement, &e).await;
                }
                primary
            }
            (None, [Payload::Borrowed(one)], None) => device.member.write_slice_at(offset(&device), one, fua).await,
            (None, _, _) => {
                let len = pieces.iter().map(Payload::len).sum();
                let mut buf = AlignedBuf::for_overwrite(len);
                let mut at = 0;
                for p in &pieces {
                    p.copy_to(&mut buf.as_mut_slice()[at..at + p.len()]);
                    at += p.len();
                }
                crate::copy_count::copied(len);
                self.write_member(role, member_sector, buf, fua).await
            }
        }
    }

    /// Zeroes `sectors` at `member_sector` of `role` (deallocating if allowed), replacement included.
    pub(crate) async fn zero_member(
        &self,
        role: usize,
        member_sector: u64,
        sectors: u64,
        deallocate: bool,
    ) -> io::Result<()> {
        let slot = &self.members.slots()[role];
        let device = slot.device().ok_or_else(|| io::Error::other(format!("role {role} has no device")))?;
        if let Some(replacement) = slot.replacement() {
            let (primary, second) = futures::join!(
                zero_device(&device, member_sector, sectors, deallocate),
                zero_device(&replacement.device, member_sector, sectors, deallocate)
            );
            if let Err(e) = second {
                self.replacement_failed(role, &replacement, &e).await;
            }
            return primary;
        }
        zero_device(&device, member_sector, sectors, deallocate).await
    }

    /// The largest memory alignment any member (or replacement being built) writes in place
    /// from (`Member::memory_alignment`).
    pub(crate) fn members_memory_alignment(&self) -> usize {
        let slots = self.members.slots();
        let devices =
            slots.iter().flat_map(|s| s.device().into_iter().chain(s.replacement().map(|r| r.device.clone())));
        devices.map(|d| d.member.memory_alignment()).max().unwrap_or(1)
    }

    /// Current read load of a role, for choosing between copies.
    pub(crate) fn read_load(&self, role: usize) -> u64 {
        self.members.slots()[role].inflight_read_bytes.load(Ordering::Relaxed)
    }
}

/// Reads from a device with load accounting.
pub(crate) async fn read_device<M: Member + ?Sized>(
    device: &Device<M>,
    member_sector: u64,
    sectors: u64,
    load: &std::sync::atomic::AtomicU64,
) -> io::Result<AlignedBuf> {
    let len = sectors * SECTOR_BYTES;
    load.fetch_add(len, Ordering::Relaxed);
    let _load = LoadGuard(load, len);
    // The member fills all of it or fails (then the buffer is dropped unseen).
    let buf = AlignedBuf::for_overwrite(len as usize);
    let (res, buf) = device.member.read_at(device.offset_bytes(member_sector), buf).await;
    res.map(|()| buf)
}

pub(crate) async fn write_device<M: Member + ?Sized>(
    device: &Device<M>,
    member_sector: u64,
    buf: AlignedBuf,
    fua: bool,
) -> io::Result<()> {
    device.member.write_at(device.offset_bytes(member_sector), buf, fua).await.0
}

async fn zero_device<M: Member + ?Sized>(
    device: &Device<M>,
    member_sector: u64,
    sectors: u64,
    deallocate: bool,
) -> io::Result<()> {
    let (offset, len) = (device.offset_bytes(member_sector), sectors * SECTOR_BYTES);
    if deallocate { device.member.discard(offset, len).await } else { device.member.write_zeroes(offset, len).await }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(role: usize, member_sector: u64, sectors: u64, req: usize) -> Piece {
        Piece { role, member_sector, sectors, req_offset_bytes: req }
    }

    #[test]
    fn coalesces_contiguous_pieces_per_member() {
        let runs = coalesce(vec![p(0, 0, 8, 0), p(1, 0, 8, 4096), p(0, 8, 8, 8192), p(1, 16, 8, 12288)]);
        assert_eq!(runs.len(), 3);
        assert_eq!((runs[0].role, runs[0].member_sector, runs[0].sectors), (0, 0, 16));
        assert_eq!(runs[0].pieces[1].1, 4096);
        assert_eq!((runs[1].role, runs[1].member_sector, runs[1].sectors), (1, 0, 8));
        assert_eq!((runs[2].role, runs[2].member_sector, runs[2].sectors), (1, 16, 8));
    }
}
