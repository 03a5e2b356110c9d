//! The write journal policy (md's raid5-cache in write-through mode, raid4/5/6): what closes
//! the write hole where md's PPL cannot (raid4, raid6).
//!
//! Before the member writes of a stripe start, the new data pages and the new parity pages
//! (P, and Q) go, FUA, into a ring on the journal device, in md's format ([`crate::journal`]).
//! After a crash, replay from the ring's tail rewrites every logged stripe from its pages, so
//! every stripe holds the data of a whole logged write (or an older one) with matching parity,
//! whatever part of its member writes landed, and a member lost afterwards is rebuilt right.
//! The ring: `ring.rs`; replay: `replay.rs`.
//!
//! Here: the policy's side of a write (the log works in 4 KiB pages: writes are widened to
//! whole pages first, the rest of a partly written page read under the stripe lock; a
//! write's pages go a wave at a time), of zeroing (zeros are logged as data: a discard not
//! logged could be undone by the replay of an older unit), of FLUSH (nothing to do: every
//! completed write is durable in the ring) and of start and stop.

mod replay;
mod ring;

use futures::future::BoxFuture;

pub use replay::JournalReport;
pub(crate) use ring::Journal;
pub use ring::{JournalConfig, JournalStats, MIN_JOURNAL_BYTES};
use ring::{LoggedRow, MAX_WAVE_PAGES};

use super::{StripeWork, WriteHole, WriteHoleReport, WriteHoleStart, WriteHoleStats, WriteRules, Written};
use crate::SECTOR_BYTES;
use crate::engine::stripe_write::MemberWrite;
use crate::engine::{Array, Device, Layout};
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, StripeLayout};
use crate::journal::{JOURNAL_PAGE_BYTES, JOURNAL_PAGE_SECTORS, Payload, crc32c_le};
use crate::member::Member;

/// One computed job of a journaled write: its stripe, rows and member writes.
struct JournaledJob<'a> {
    stripe: u64,
    layout: &'a StripeLayout,
    member_sector: u64,
    sectors: u64,
    writes: Vec<MemberWrite>,
}

impl<M: Member + ?Sized> Journal<M> {
    /// The journal on `device` for an array of `geometry` with `roles` roles (raid4/5/6;
    /// md's `--write-journal`), refused when its ring cannot hold one stripe row per wave.
    /// The device is written to by the journal only, besides its superblock.
    pub(crate) fn for_array(device: Device<M>, config: JournalConfig, geometry: &Geometry) -> Result<Self> {
        let bad = |why: String| RaidError::new(ErrorKind::CannotAssemble, format!("write journal: {why}"));
        if geometry.parity().is_none() {
            return Err(bad(format!("{} has no parity", geometry.level())));
        }
        let ring_bytes = config.area_sectors * SECTOR_BYTES;
        if ring_bytes < MIN_JOURNAL_BYTES || !config.area_sectors.is_multiple_of(JOURNAL_PAGE_SECTORS) {
            return Err(bad(format!("a ring of {ring_bytes} bytes is too small (at least {MIN_JOURNAL_BYTES})")));
        }
        if device.member.len_bytes() < config.area_offset_bytes + ring_bytes {
            return Err(bad(format!("{} is smaller than its ring", device.member.name())));
        }
        if config.tail_sectors >= config.area_sectors || !config.tail_sectors.is_multiple_of(JOURNAL_PAGE_SECTORS) {
            return Err(bad(format!("tail at sector {} is outside the ring", config.tail_sectors)));
        }
        let wave_pages = MAX_WAVE_PAGES.min((config.area_sectors / JOURNAL_PAGE_SECTORS / 4) as usize) as u64;
        if wave_pages < 2 * geometry.raid_disks() as u64 + 2 {
            return Err(bad("the ring is too small for one stripe row per wave".into()));
        }
        Ok(Journal::new(device, config))
    }

    /// Logs the jobs' pages a wave at a time, and writes each wave's member writes once its
    /// units (and all earlier ones) are durable. The log makes them durable, so the member
    /// writes need no FUA.
    async fn write_waves(&self, array: &Array<M>, layout: &Layout, jobs: Vec<JournaledJob<'_>>) -> Result<()> {
        let max_pages = self.max_wave_pages();
        let parity_disks = layout.parity().expect("journal arrays have parity").parity_disks();
        let mut jobs = jobs.into_iter().peekable();
        while jobs.peek().is_some() {
            let mut wave: Vec<JournaledJob<'_>> = Vec::new();
            let mut pages = 0;
            while let Some(job) = jobs.peek() {
                // At most: its rows times its member writes (data and parity) and P and Q.
                let n = (job.sectors / JOURNAL_PAGE_SECTORS) as usize * (job.writes.len() + parity_disks);
                if !wave.is_empty() && pages + n > max_pages {
                    break;
                }
                pages += n;
                wave.push(jobs.next().expect("peeked"));
            }
            let ticket = {
                let rows: Vec<LoggedRow<'_>> = wave.iter().flat_map(|job| self.logged_rows(layout, job)).collect();
                self.log(array, &rows).await?
            };
            array.write_runs(wave.into_iter().flat_map(|j| j.writes).collect(), false).await;
            drop(ticket); // the member writes are done
        }
        Ok(())
    }

    /// The journal rows (4 KiB stripe rows: data pages, then P and Q) of one job.
    fn logged_rows<'a>(&self, layout: &Layout, job: &'a JournaledJob<'_>) -> Vec<LoggedRow<'a>> {
        static ZERO_PAGE: [u8; JOURNAL_PAGE_BYTES] = [0; JOURNAL_PAGE_BYTES];
        let pg = layout.parity().expect("journal arrays have parity");
        let (dd, chunk) = (pg.data_disks() as u64, u64::from(pg.chunk_sectors()));
        let seed = self.seed();
        let stripe_start = layout.stripe_member_sector(job.stripe);
        let sl = job.layout;
        let mut writes: Vec<&MemberWrite> = job.writes.iter().collect();
        writes.sort_unstable_by_key(|w| w.role);
        let parity_roles: Vec<usize> = std::iter::once(sl.p_role).chain(sl.q_role).collect();
        (0..job.sectors / JOURNAL_PAGE_SECTORS)
            .map(|i| {
                let row = job.member_sector + i * JOURNAL_PAGE_SECTORS;
                let page_of = |w: &'a MemberWrite| {
                    &w.buf.as_slice()[i as usize * JOURNAL_PAGE_BYTES..(i as usize + 1) * JOURNAL_PAGE_BYTES]
                };
                let mut payloads = Vec::new();
                let mut pages = Vec::new();
                for w in writes.iter().filter(|w| !parity_roles.contains(&w.role)) {
                    let k = sl.data_roles.iter().position(|&r| r == w.role).expect("a data role") as u64;
                    let page = page_of(w);
                    payloads.push(Payload::Data {
                        array_sector: job.stripe * dd * chunk + k * chunk + (row - stripe_start),
                        checksum: crc32c_le(seed, page),
                        flags: 0,
                    });
                    pages.push(page);
                }
                let mut checksums = Vec::new();
                for &p in &parity_roles {
                    // A parity member that is not written gets a page of zeros in the log
                    // (replay skips members that are not there).
                    let page = writes.iter().find(|w| w.role == p).map_or(&ZERO_PAGE[..], |w| page_of(w));
                    checksums.push(crc32c_le(seed, page));
                    pages.push(page);
                }
                payloads.push(Payload::Parity { member_sector: row, checksums, flags: 0 });
                LoggedRow { payloads, pages }
            })
            .collect()
    }
}

impl<M: Member + ?Sized> WriteHole<M> for Journal<M> {
    fn rules(&self, roles: usize) -> WriteRules {
        WriteRules {
            max_job_rows: self.max_job_rows(roles),
            split_full_stripes: true,
            page_sectors: Some(JOURNAL_PAGE_SECTORS),
            // Every write is logged with its parity: a stripe whose parity cannot be
            // computed is not written.
            data_only: false,
            partial_parity: false,
            zeroes_whole_stripes: false,
        }
    }

    fn write<'a>(&'a self, array: &'a Array<M>, work: StripeWork<'a>, _fua: bool) -> BoxFuture<'a, Result<Written>> {
        Box::pin(async move {
            let (layout, stripe_layouts) = (work.layout, work.stripe_layouts);
            let Some(jobs) = work.compute(array, false).await? else { return Ok(Written::ReadFailed) };
            let jobs = jobs
                .into_iter()
                .map(|job| {
                    let sl = &stripe_layouts[job.write];
                    JournaledJob {
                        stripe: job.stripe,
                        layout: sl,
                        member_sector: job.member_sector,
                        sectors: job.sectors(),
                        writes: job.member_writes(array, sl),
                    }
                })
                .collect();
            // FUA or not: durable in the journal.
            self.write_waves(array, layout, jobs).await?;
            Ok(Written::Done)
        })
    }

    /// Every completed write is durable in the journal already (its units are written FUA and
    /// the tail passes them only after a member flush): md completes such flushes at once too.
    fn client_flush<'a>(&'a self, _array: &'a Array<M>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.check_not_failed() })
    }

    fn can_trim(&self) -> bool {
        false
    }

    fn start<'a>(&'a self, array: &'a Array<M>, start: WriteHoleStart) -> BoxFuture<'a, Result<WriteHoleReport>> {
        Box::pin(async move {
            let replay = !(start.read_only || start.forced_read_only);
            Ok(WriteHoleReport::Journal(self.walk(array, replay).await?))
        })
    }

    /// As md's stop: the tail moves to the last unit (the next start replays only it).
    fn shutdown<'a>(&'a self, array: &'a Array<M>) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.reclaim(array, false))
    }

    fn device(&self, id: usize) -> Option<Device<M>> {
        (self.device.id == id).then(|| self.device.clone())
    }

    fn device_failed(&self, array: &Array<M>, error: &std::io::Error, what: &str) {
        self.fail(array, error, what);
    }

    fn reshapes(&self) -> bool {
        false
    }

    fn replaces_resync(&self) -> bool {
        true
    }

    fn stats(&self) -> WriteHoleStats {
        WriteHoleStats::Journal(Journal::stats(self))
    }
}
