//! raid4/5/6 reads: data chunks straight from their members, and what cannot be read
//! (a member missing, failing, recovering below the range, or bad there) rebuilt from the
//! rest of its stripe under the stripe lock.
//!
//! Block order inside a stripe, used for buffers and parity kinds everywhere in the striped
//! path: data indexes `0..dd`, then P, then Q (raid6).
//!
//! Failure handling: a failed read marks the member faulty and the stripe is read again
//! (`load_stripe_rows`), until more blocks are gone than parity can rebuild: then the read
//! fails with EIO rather than return a wrong byte.

use futures::future::join_all;

use super::io::Piece;
use super::read_assembler::ReadAssembler;
use super::{Array, Layout};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::StripeLayout;
use crate::member::Member;
use crate::parity::{self, BlockKind};
use crate::read_data::ReadData;

/// The role holding block `block` (data index, then P, then Q) of a stripe.
pub(super) fn block_role(layout: &StripeLayout, block: usize) -> usize {
    let dd = layout.data_roles.len();
    match block.checked_sub(dd) {
        None => layout.data_roles[block],
        Some(0) => layout.p_role,
        Some(_) => layout.q_role.expect("Q block only on raid6"),
    }
}

/// The parity kind of every block of a stripe, in block order.
pub(super) fn block_kinds(layout: &StripeLayout, parity_disks: usize) -> Vec<BlockKind> {
    let dd = layout.data_roles.len();
    let mut kinds: Vec<BlockKind> =
        (0..dd).map(|k| BlockKind::Data { exponent: layout.q_exponents.get(k).copied().unwrap_or(0) }).collect();
    kinds.push(BlockKind::P);
    if parity_disks == 2 {
        kinds.push(BlockKind::Q);
    }
    kinds
}

/// A data piece of one stripe that must be rebuilt for a degraded read.
struct WantedPiece {
    /// Index of the data block in the stripe.
    data_index: usize,
    /// First row (sector within the chunk) of the piece.
    row: u32,
    sectors: u64,
    /// Where the piece goes in the request.
    req_offset_bytes: usize,
}

/// Where a rebuilt piece lies in its block buffer and in the request.
struct PiecePlacement {
    req_offset_bytes: usize,
    buf_offset_bytes: usize,
    len_bytes: usize,
}

/// Rebuilt block buffers of one stripe with the pieces of the request they hold.
type RebuiltPieces = Vec<(AlignedBuf, Vec<PiecePlacement>)>;

impl<M: Member + ?Sized> Array<M> {
    pub(super) async fn read_striped(&self, layout: &Layout, start_sector: u64, len_bytes: usize) -> Result<ReadData> {
        self.read_striped_in(layout, start_sector, len_bytes, false).await
    }

    /// Reads, with the stripes' locks already held by the caller when `stripes_locked`
    /// (a degraded read then rebuilds without taking them again).
    pub(super) async fn read_striped_in(
        &self,
        layout: &Layout,
        start_sector: u64,
        len_bytes: usize,
        stripes_locked: bool,
    ) -> Result<ReadData> {
        let end = start_sector + len_bytes as u64 / SECTOR_BYTES;
        let mut out = ReadAssembler::new(len_bytes);
        let (mut direct, mut degraded) = (Vec::new(), Vec::new());
        let mut sector = start_sector;
        while sector < end {
            let mapped = layout.map(sector);
            let run = mapped.len_sectors.min(end - sector);
            let copy = mapped.copies[0];
            let piece = Piece {
                role: copy.role,
                member_sector: copy.member_sector,
                sectors: run,
                req_offset_bytes: ((sector - start_sector) * SECTOR_BYTES) as usize,
            };
            if self.members.slots()[copy.role].is_readable(copy.member_sector, run) {
                direct.push(piece);
            } else {
                degraded.push(piece);
            }
            sector += run;
        }
        degraded.extend(self.read_pieces(direct, &mut out).await?);
        if degraded.is_empty() {
            return Ok(out.finish());
        }
        // Group what must be rebuilt by stripe.
        let pg = layout.parity().expect("striped read on a parity layout");
        let mut by_stripe: std::collections::BTreeMap<u64, Vec<WantedPiece>> = Default::default();
        for p in degraded {
            let (stripe, data_index, row) = pg.locate(start_sector + p.req_offset_bytes as u64 / SECTOR_BYTES);
            by_stripe.entry(stripe).or_default().push(WantedPiece {
                data_index,
                row,
                sectors: p.sectors,
                req_offset_bytes: p.req_offset_bytes,
            });
        }
        let rebuilt = join_all(
            by_stripe
                .into_iter()
                .map(|(stripe, wanted)| self.read_degraded_stripe(layout, stripe, wanted, stripes_locked)),
        )
        .await;
        for result in rebuilt {
            for (buf, pieces) in result? {
                let b = out.add_buf(buf);
                for p in pieces {
                    out.piece(p.req_offset_bytes, b, p.buf_offset_bytes, p.len_bytes);
                }
            }
        }
        Ok(out.finish())
    }

    /// Rebuilds the wanted data pieces of one stripe from its readable blocks.
    /// Returns block buffers with the placement of each piece.
    async fn read_degraded_stripe(
        &self,
        layout: &Layout,
        stripe: u64,
        wanted: Vec<WantedPiece>,
        locked: bool,
    ) -> Result<RebuiltPieces> {
        let _guard = if locked {
            debug_assert!(self.locks.is_locked(stripe), "the caller holds stripe {stripe}'s lock");
            None
        } else {
            Some(self.locks.lock(stripe).await)
        };
        let lo = wanted.iter().map(|w| w.row).min().expect("at least one piece");
        let hi = wanted.iter().map(|w| w.row + w.sectors as u32).max().expect("at least one piece");
        let mut blocks = self.load_stripe_rows(layout, stripe, (lo, hi)).await?;
        let mut out: RebuiltPieces = Vec::new();
        let mut index_of_block = vec![usize::MAX; blocks.len()];
        for w in wanted {
            let k = w.data_index;
            if index_of_block[k] == usize::MAX {
                index_of_block[k] = out.len();
                out.push((blocks[k].take().expect("block loaded"), Vec::new()));
            }
            out[index_of_block[k]].1.push(PiecePlacement {
                req_offset_bytes: w.req_offset_bytes,
                buf_offset_bytes: ((w.row - lo) as u64 * SECTOR_BYTES) as usize,
                len_bytes: (w.sectors * SECTOR_BYTES) as usize,
            });
        }
        Ok(out)
    }

    /// Reads every readable block of `rows` of `stripe` and rebuilds the others.
    /// The caller holds the stripe lock. Retries (after marking the member faulty) when a
    /// read fails; fails when more blocks are unreadable than the level can rebuild.
    pub(super) async fn load_stripe_rows(
        &self,
        layout: &Layout,
        stripe: u64,
        rows: (u32, u32),
    ) -> Result<Vec<Option<AlignedBuf>>> {
        debug_assert!(self.locks.is_locked(stripe), "a stripe is rebuilt only under its lock");
        let pg = layout.parity().expect("a parity layout");
        let stripe_layout = pg.stripe(stripe);
        let np = pg.parity_disks();
        let nblocks = stripe_layout.data_roles.len() + np;
        let member_sector = layout.stripe_member_sector(stripe) + u64::from(rows.0);
        let sectors = u64::from(rows.1 - rows.0);
        for _attempt in 0..=self.members.slots().len() {
            let readable: Vec<usize> = (0..nblocks)
                .filter(|&b| self.members.slots()[block_role(&stripe_layout, b)].is_readable(member_sector, sectors))
                .collect();
            let missing: Vec<usize> = (0..nblocks).filter(|b| !readable.contains(b)).collect();
            if missing.len() > np {
                return Err(RaidError::new(
                    ErrorKind::Io,
                    format!(
                        "stripe {stripe}: roles {:?} unavailable, {} can rebuild at most {np}",
                        missing.iter().map(|&b| block_role(&stripe_layout, b)).collect::<Vec<_>>(),
                        pg.level()
                    ),
                ));
            }
            let results = join_all(
                readable.iter().map(|&b| self.read_member(block_role(&stripe_layout, b), member_sector, sectors)),
            )
            .await;
            let mut blocks: Vec<Option<AlignedBuf>> = (0..nblocks).map(|_| None).collect();
            let mut failed = false;
            for (&b, res) in readable.iter().zip(results) {
                match res {
                    Ok(buf) => blocks[b] = Some(buf),
                    Err(e) => {
                        self.member_failed(block_role(&stripe_layout, b), &e, "read").await;
                        failed = true;
                    }
                }
            }
            if failed {
                continue;
            }
            let len = (sectors * SECTOR_BYTES) as usize;
            for &b in &missing {
                blocks[b] = Some(AlignedBuf::for_overwrite(len)); // reconstruct ignores their contents
            }
            let kinds = block_kinds(&stripe_layout, np);
            let mut slices: Vec<&mut [u8]> =
                blocks.iter_mut().map(|b| b.as_mut().expect("filled").as_mut_slice()).collect();
            assert!(parity::reconstruct(&mut slices, &kinds, &missing), "reconstruct within redundancy");
            return Ok(blocks);
        }
        Err(RaidError::new(ErrorKind::Io, format!("stripe {stripe}: members kept failing")))
    }
}
