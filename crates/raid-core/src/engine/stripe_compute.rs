//! raid4/5/6 parity computation for the write path: the new blocks of a planned job (read-
//! modify-write in one pass over old, new, P and Q; full-stripe and reconstruct-write parity
//! from all data; a degraded stripe rebuilt first), its partial parity when a policy logs
//! it, and the joining of member writes that are contiguous on one member.

use super::MAX_IO_BYTES;
use super::block_buf::BlockBuf;
use super::stripe_plan::{Mode, StripeWrite};
use super::stripe_read::block_kinds;
use super::stripe_write::{ComputedJob, Job, MemberWrite, WriteSource};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::geometry::StripeLayout;
use crate::parity::{self, BlockKind};
use crate::payload::Payload;

/// Computes the new blocks of one job. With `want_pp`, also its partial parity (the XOR of
/// the data blocks it does not write) when it writes P.
pub(super) fn compute_job(
    mut job: Job,
    write: &StripeWrite,
    layout: &StripeLayout,
    np: usize,
    src: WriteSource<'_>,
    want_pp: bool,
) -> ComputedJob {
    let dd = layout.data_roles.len();
    let len = (job.sectors() * SECTOR_BYTES) as usize;
    let kinds = block_kinds(layout, np);
    let written = |k: usize| job.written & (1 << k) != 0;
    // A shared payload's block is a slice of it; a borrowed one is copied.
    let new_data = |k: usize| match &src {
        WriteSource::Data(data) => {
            let bw = write.blocks[k].expect("written block");
            let at = bw.req_offset_bytes + ((job.rows.0 - bw.rows.0) as u64 * SECTOR_BYTES) as usize;
            match data.slice(at..at + len) {
                Payload::Shared(bytes) => BlockBuf::Shared(bytes),
                // Borrowed, or a block across two gathered writes.
                other => {
                    crate::copy_count::copied(len);
                    let mut buf = AlignedBuf::for_overwrite(len);
                    other.copy_to(buf.as_mut_slice());
                    BlockBuf::Owned(buf)
                }
            }
        }
        WriteSource::Zeros => BlockBuf::Owned(AlignedBuf::zeroed(len)),
    };
    let mut out = Vec::with_capacity(dd + np);
    let mut partial_parity = None;
    match job.mode {
        Mode::ReadModifyWrite => {
            let parity_read: Vec<usize> = (dd..dd + np).filter(|&b| job.blocks[b].is_some()).collect();
            // Partial parity = new P XOR the new data.
            let mut new_xor = (want_pp && job.blocks[dd].is_some()).then(|| AlignedBuf::zeroed(len));
            for k in (0..dd).filter(|&k| written(k)) {
                let new = new_data(k);
                if let Some(x) = new_xor.as_mut() {
                    parity::xor_into(x.as_mut_slice(), new.as_slice());
                }
                if !parity_read.is_empty() {
                    let old = job.blocks[k].take().expect("old data was read");
                    let BlockKind::Data { exponent } = kinds[k] else { unreachable!("data kind") };
                    let (data_and_p, q) = job.blocks.split_at_mut(dd + 1);
                    let q = q.first_mut().and_then(Option::as_mut).map(AlignedBuf::as_mut_slice);
                    match data_and_p[dd].as_mut() {
                        // One pass over old, new, P and Q; no delta buffer.
                        Some(p) => parity::update_parity(p.as_mut_slice(), q, old.as_slice(), new.as_slice(), exponent),
                        None => {
                            // Only Q was read (P is lost).
                            let mut delta = old;
                            parity::xor_into(delta.as_mut_slice(), new.as_slice());
                            parity::mul_exp_xor_into(q.expect("Q was read"), delta.as_slice(), exponent);
                        }
                    }
                }
                out.push((k, new));
            }
            partial_parity = new_xor.map(|mut x| {
                parity::xor_into(x.as_mut_slice(), job.blocks[dd].as_ref().expect("P was read").as_slice());
                x
            });
            for b in parity_read {
                out.push((b, job.blocks[b].take().expect("parity was read").into()));
            }
        }
        Mode::DataOnly => {
            for k in (0..dd).filter(|&k| written(k)) {
                out.push((k, new_data(k)));
            }
        }
        Mode::Full | Mode::ReconstructWrite | Mode::Degraded => {
            if job.mode == Mode::Degraded {
                let missing: Vec<usize> = (0..dd + np).filter(|&b| job.blocks[b].is_none()).collect();
                for &b in &missing {
                    job.blocks[b] = Some(AlignedBuf::for_overwrite(len)); // reconstruct ignores their contents
                }
                let mut slices: Vec<&mut [u8]> =
                    job.blocks.iter_mut().map(|b| b.as_mut().expect("filled").as_mut_slice()).collect();
                assert!(parity::reconstruct(&mut slices, &kinds, &missing), "planned within redundancy");
            }
            let mut new: Vec<Option<BlockBuf>> = (0..dd).map(|k| written(k).then(|| new_data(k))).collect();
            // compute_parity_split stores P and Q; the data is read where it lies.
            let mut parity: Vec<AlignedBuf> = (0..np).map(|_| AlignedBuf::for_overwrite(len)).collect();
            {
                let data: Vec<&[u8]> = (0..dd)
                    .map(|k| match &new[k] {
                        Some(block) => block.as_slice(),
                        None => job.blocks[k].as_ref().expect("read or rebuilt").as_slice(),
                    })
                    .collect();
                let exponents: Vec<u8> = kinds[..dd]
                    .iter()
                    .map(|kind| match kind {
                        BlockKind::Data { exponent } => *exponent,
                        _ => unreachable!("data blocks come first"),
                    })
                    .collect();
                let (p, q) = parity.split_first_mut().expect("a P block");
                parity::compute_parity_split(
                    &data,
                    &exponents,
                    p.as_mut_slice(),
                    q.first_mut().map(|q| q.as_mut_slice()),
                );
            }
            if want_pp {
                let unwritten: Vec<usize> = (0..dd).filter(|&k| !written(k)).collect();
                let mut pp = AlignedBuf::zeroed(if unwritten.is_empty() { 0 } else { len });
                for k in unwritten {
                    parity::xor_into(pp.as_mut_slice(), job.blocks[k].as_ref().expect("computed").as_slice());
                }
                partial_parity = Some(pp);
            }
            for k in (0..dd).filter(|&k| written(k)) {
                out.push((k, new[k].take().expect("computed")));
            }
            out.extend(parity.into_iter().enumerate().map(|(i, buf)| (dd + i, buf.into())));
        }
    }
    ComputedJob {
        write: job.write,
        stripe: write.stripe,
        member_sector: job.member_sector,
        rows: job.rows,
        written: job.written,
        mode: job.mode,
        blocks: out,
        partial_parity,
    }
}

/// Adjacent writes to one member, written as one (a gathering write of their buffers).
pub(super) struct MemberRun {
    pub role: usize,
    pub member_sector: u64,
    pub len_bytes: usize,
    pub bufs: Vec<BlockBuf>,
}

/// Merges writes that are contiguous on one member into runs.
pub(super) fn concat_runs(mut writes: Vec<MemberWrite>) -> Vec<MemberRun> {
    writes.sort_unstable_by_key(|w| (w.role, w.member_sector));
    let mut out: Vec<MemberRun> = Vec::new();
    for w in writes {
        if let Some(last) = out.last_mut() {
            let end = last.member_sector + last.len_bytes as u64 / SECTOR_BYTES;
            if last.role == w.role && end == w.member_sector && last.len_bytes + w.buf.len() <= MAX_IO_BYTES {
                last.len_bytes += w.buf.len();
                last.bufs.push(w.buf);
                continue;
            }
            debug_assert!(last.role != w.role || end <= w.member_sector, "overlapping member writes");
        }
        out.push(MemberRun { role: w.role, member_sector: w.member_sector, len_bytes: w.buf.len(), bufs: vec![w.buf] });
    }
    out
}
