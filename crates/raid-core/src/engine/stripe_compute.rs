//! raid4/5/6 parity computation for the write path: the new blocks of a planned job (read-
//! modify-write in one pass over old, new, P and Q; full-stripe and reconstruct-write parity
//! from all data; a degraded stripe rebuilt first), its partial parity when a policy logs
//! it, and the joining of member writes that are contiguous on one member.

use super::MAX_IO_BYTES;
use super::stripe_plan::{Mode, StripeWrite};
use super::stripe_read::block_kinds;
use super::stripe_write::{ComputedJob, Job, MemberWrite, WriteSource};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::geometry::StripeLayout;
use crate::parity::{self, BlockKind};

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
    let new_data = |k: usize| match src {
        WriteSource::Data(data) => {
            let bw = write.blocks[k].expect("written block");
            let at = bw.req_offset_bytes + ((job.rows.0 - bw.rows.0) as u64 * SECTOR_BYTES) as usize;
            crate::copy_count::copied(len);
            AlignedBuf::from_slice(&data[at..at + len])
        }
        WriteSource::Zeros => AlignedBuf::zeroed(len),
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
                out.push((b, job.blocks[b].take().expect("parity was read")));
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
            for k in (0..dd).filter(|&k| written(k)) {
                job.blocks[k] = Some(new_data(k));
            }
            for b in dd..dd + np {
                job.blocks[b] = Some(AlignedBuf::for_overwrite(len)); // compute_parity stores P and Q
            }
            {
                let mut slices: Vec<&mut [u8]> =
                    job.blocks.iter_mut().map(|b| b.as_mut().expect("every block present").as_mut_slice()).collect();
                parity::compute_parity(&mut slices, &kinds);
            }
            if want_pp {
                let unwritten: Vec<usize> = (0..dd).filter(|&k| !written(k)).collect();
                let mut pp = AlignedBuf::zeroed(if unwritten.is_empty() { 0 } else { len });
                for k in unwritten {
                    parity::xor_into(pp.as_mut_slice(), job.blocks[k].as_ref().expect("computed").as_slice());
                }
                partial_parity = Some(pp);
            }
            for b in (0..dd).filter(|&k| written(k)).chain(dd..dd + np) {
                out.push((b, job.blocks[b].take().expect("computed")));
            }
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

/// Merges writes that are contiguous on one member into one buffer each.
pub(super) fn concat_runs(mut writes: Vec<MemberWrite>) -> Vec<MemberWrite> {
    /// Adjacent writes to one member, joined.
    struct Run {
        role: usize,
        member_sector: u64,
        len_bytes: usize,
        bufs: Vec<AlignedBuf>,
    }
    writes.sort_unstable_by_key(|w| (w.role, w.member_sector));
    let mut out: Vec<Run> = Vec::new();
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
        out.push(Run { role: w.role, member_sector: w.member_sector, len_bytes: w.buf.len(), bufs: vec![w.buf] });
    }
    out.into_iter()
        .map(|mut run| {
            if run.bufs.len() == 1 {
                let buf = run.bufs.pop().expect("one buffer");
                return MemberWrite { role: run.role, member_sector: run.member_sector, buf };
            }
            let mut joined = AlignedBuf::for_overwrite(run.len_bytes);
            crate::copy_count::copied(run.len_bytes);
            let mut at = 0;
            for b in &run.bufs {
                joined.as_mut_slice()[at..at + b.len()].copy_from_slice(b.as_slice());
                at += b.len();
            }
            MemberWrite { role: run.role, member_sector: run.member_sector, buf: joined }
        })
        .collect()
}
