//! The partial parity log policy (md's PPL, raid5).
//!
//! Before the data and parity of a stripe are written, the stripe's *partial parity* (the
//! XOR of the data it does not modify) goes, FUA, to the log area of the stripe's parity
//! member. After a crash, replay recomputes each logged stripe's parity as partial parity
//! XOR the modified data now on the members, so parity agrees with the data whatever part
//! of the write landed, and a member lost afterwards is rebuilt right. Full-stripe writes
//! log an entry without partial parity (parity is then recomputed from all data), as md.
//! Format: [`crate::ppl`]; the log: `log.rs`; replay: `replay.rs`.
//!
//! Here: the policy's side of a write (an entry per job that writes P, logged a wave at a
//! time: at most [`MAX_WAVE_ENTRIES`] entries and [`MAX_WAVE_PP_BYTES`] of partial parity per
//! log and wave), of whole-stripe zeroing (logged as full-stripe writes), of flushes (the
//! newest header stops naming writes a flush made durable) and of devices joining (their
//! area is cleared, so no header of an earlier life is ever replayed).

mod log;
mod replay;

use futures::future::BoxFuture;

pub use log::MIN_PARITY_LOG_AREA_BYTES;
pub(crate) use log::ParityLog;
use log::{Footprint, LogRequest, MAX_ENTRY_PP_BYTES, MAX_WAVE_ENTRIES, MAX_WAVE_PP_BYTES};
pub use replay::ReplayReport;

use super::{
    StripeWork, WriteHole, WriteHoleReport, WriteHoleStart, WriteHoleStats, WriteRules, Written, ZeroingToken,
};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::engine::stripe_plan::Mode;
use crate::engine::stripe_write::{ComputedJob, MemberWrite};
use crate::engine::{Array, Device, Layout};
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level, StripeLayout};
use crate::member::Member;
use crate::ppl::{PplEntry, carries_data_crcs, ppl_checksum, zeros_checksum};

/// Where each member's log lives and what its headers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityLogConfig {
    /// Byte offset of the area on every member (md: superblock + `ppl.offset` sectors).
    pub area_offset_bytes: u64,
    pub area_bytes: u64,
    /// md: CRC-32C of the array UUID.
    pub signature: u32,
    /// Data checksums one header carries at most (`ppl::MAX_DATA_CRCS`; fewer only in
    /// tests: entries without them are retired from the log once durable instead).
    pub max_data_crcs: usize,
}

/// Counters for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParityLogStats {
    /// Entries logged (each counted once, however many headers repeated it).
    pub entries_logged: u64,
    pub headers_written: u64,
    /// Member flushes started because a log was full.
    pub drains: u64,
    /// Headers written only so that the newest one stops naming durable writes (`retire_logs`).
    pub retires: u64,
}

impl ParityLog {
    /// The log of an array of `geometry`, refused where md's PPL cannot be (not raid5, more
    /// than 64 members, stripes of 4 GiB or more).
    pub(crate) fn for_array(config: ParityLogConfig, geometry: &Geometry) -> Result<Self> {
        if geometry.level() != Level::Raid5 {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!("a partial parity log is for raid5 (as md's PPL), not {}", geometry.level()),
            ));
        }
        let pg = geometry.parity().expect("raid5 has parity");
        let stripe_data_bytes = pg.stripe_data_sectors() * SECTOR_BYTES;
        if geometry.raid_disks() > 64 || stripe_data_bytes > u64::from(u32::MAX) {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!(
                    "a partial parity log takes at most 64 members and stripes under 4 GiB (md's limits); this \
                     array has {} members and {stripe_data_bytes}-byte stripes",
                    geometry.raid_disks()
                ),
            ));
        }
        if config.area_bytes < MIN_PARITY_LOG_AREA_BYTES {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!(
                    "a PPL area of {} bytes is too small (at least {MIN_PARITY_LOG_AREA_BYTES})",
                    config.area_bytes
                ),
            ));
        }
        Ok(ParityLog::new(config, geometry.raid_disks(), u64::from(pg.chunk_sectors()), pg.data_disks() as u64))
    }

    /// The entry (and its partial parity) a job asks to log: when it writes P to a writable
    /// member. md's PPL fields for the rows and data blocks it writes.
    fn log_request<M: Member + ?Sized>(
        &self,
        array: &Array<M>,
        job: &mut ComputedJob,
        layout: &StripeLayout,
    ) -> Option<LogRequest> {
        let (dd, chunk) = (self.data_disks, self.chunk_sectors);
        if !array.members.slots()[layout.p_role].is_writable() || job.mode == Mode::DataOnly {
            return None;
        }
        let pp = job.partial_parity.take();
        debug_assert!(pp.is_some(), "a job writing P has its partial parity");
        let pp = pp?;
        let first = u64::from(job.written.trailing_zeros());
        let count = u64::from(job.written.count_ones());
        debug_assert_eq!(job.written >> first, (1u64 << count) - 1, "written data blocks are consecutive");
        let rows = job.sectors();
        let entry = PplEntry {
            data_sector: job.stripe * dd * chunk + first * chunk + u64::from(job.rows.0),
            pp_size: if count == dd { 0 } else { (rows * SECTOR_BYTES) as u32 },
            data_size: (count * rows * SECTOR_BYTES) as u32,
            parity_disk: layout.p_role as u32,
            checksum: ppl_checksum(pp.as_slice()),
        };
        // With two or more data blocks: the CRC-32C of each one's new data, in block order (a
        // degraded replay tells a write that landed whole by them: `ppl.rs` `DataChecksums`).
        let data_crcs = match carries_data_crcs(count) {
            true => job
                .blocks
                .iter()
                .filter(|(b, _)| (*b as u64) < dd)
                .map(|(_, buf)| ppl_checksum(buf.as_slice()))
                .collect(),
            false => Vec::new(),
        };
        let footprint = Footprint { stripe: job.stripe, written: job.written, rows: job.rows };
        Some(LogRequest { role: layout.p_role, entry, pp, footprint, data_crcs })
    }

    /// How many whole stripes from `stripe` one logged zeroing takes: at most
    /// [`MAX_WAVE_ENTRIES`] per parity member (a layout may put every parity on one).
    fn logged_zero_batch(&self, layout: &Layout, stripe: u64, end: u64) -> u64 {
        let pg = layout.parity().expect("raid5 has parity");
        let mut per_role = vec![0usize; pg.raid_disks()];
        let mut n = 0;
        while stripe + n < end {
            let p = pg.stripe(stripe + n).p_role;
            if per_role[p] == MAX_WAVE_ENTRIES {
                break;
            }
            per_role[p] += 1;
            n += 1;
        }
        n
    }

    /// Full-stripe entries (no partial parity) for zeroing whole `stripes`.
    fn zero_log_requests<M: Member + ?Sized>(
        &self,
        array: &Array<M>,
        layout: &Layout,
        stripes: std::ops::Range<u64>,
    ) -> Vec<LogRequest> {
        let pg = layout.parity().expect("raid5 has parity");
        let (dd, chunk) = (self.data_disks, self.chunk_sectors);
        let zeros_crc = zeros_checksum((chunk * SECTOR_BYTES) as usize);
        stripes
            .filter_map(|s| {
                let p = pg.stripe(s).p_role;
                array.members.slots()[p].is_writable().then(|| LogRequest {
                    role: p,
                    entry: PplEntry {
                        data_sector: s * dd * chunk,
                        pp_size: 0,
                        data_size: (dd * chunk * SECTOR_BYTES) as u32,
                        parity_disk: p as u32,
                        checksum: 0,
                    },
                    pp: AlignedBuf::zeroed(0),
                    footprint: Footprint { stripe: s, written: (1u64 << dd) - 1, rows: (0, chunk as u32) },
                    data_crcs: match carries_data_crcs(dd) {
                        true => vec![zeros_crc; dd as usize],
                        false => Vec::new(),
                    },
                })
            })
            .collect()
    }
}

impl<M: Member + ?Sized> WriteHole<M> for ParityLog {
    fn rules(&self, _roles: usize) -> WriteRules {
        WriteRules {
            // A partial-parity entry holds at most MAX_ENTRY_PP_BYTES: longer rows split.
            max_job_rows: MAX_ENTRY_PP_BYTES as u64 / SECTOR_BYTES,
            split_full_stripes: false,
            page_sectors: None,
            data_only: true,
            partial_parity: true,
            zeroes_whole_stripes: true,
        }
    }

    fn write<'a>(&'a self, array: &'a Array<M>, work: StripeWork<'a>, fua: bool) -> BoxFuture<'a, Result<Written>> {
        Box::pin(async move {
            let stripe_layouts = work.stripe_layouts;
            // Headers of the logs this write will use wait for its reads (bigger batches).
            let mut roles: Vec<usize> = work.jobs.iter().map(|j| stripe_layouts[j.write].p_role).collect();
            roles.sort_unstable();
            roles.dedup();
            roles.retain(|&r| array.members.slots()[r].is_writable());
            let mut expected = Some(self.expect(roles));
            let Some(jobs) = work.compute(array, true).await? else { return Ok(Written::ReadFailed) };
            let computed: Vec<(Vec<MemberWrite>, Option<LogRequest>)> = jobs
                .into_iter()
                .map(|mut job| {
                    let layout = &stripe_layouts[job.write];
                    let request = self.log_request(array, &mut job, layout);
                    (job.member_writes(array, layout), request)
                })
                .collect();
            for wave in log_waves(computed) {
                let ticket = match wave.requests.is_empty() {
                    true => None,
                    false => Some(self.log_partial_parity(array, wave.requests, &mut expected).await?),
                };
                array.write_runs(wave.writes, fua).await;
                // The member writes are done; with FUA they are durable.
                match ticket {
                    Some(t) if fua => self.retire_logs(array, &t.complete_durable()).await?,
                    _ => drop(ticket),
                }
            }
            Ok(Written::Done)
        })
    }

    fn zero_batch_stripes(&self, layout: &Layout, stripe: u64, end: u64) -> u64 {
        self.logged_zero_batch(layout, stripe, end)
    }

    /// Whole stripes being zeroed are logged as full-stripe writes (parity is recomputed at
    /// a replay, whatever part of the zeroing landed).
    fn protect_zeroing<'a>(
        &'a self,
        array: &'a Array<M>,
        layout: &'a Layout,
        stripes: std::ops::Range<u64>,
    ) -> BoxFuture<'a, Result<Option<ZeroingToken<'a>>>> {
        Box::pin(async move {
            let requests = self.zero_log_requests(array, layout, stripes);
            let ticket = self.log_partial_parity(array, requests, &mut None).await?;
            Ok(Some(Box::new(ticket) as ZeroingToken<'a>))
        })
    }

    fn member_flush_started(&self) -> u64 {
        self.flush_started()
    }

    fn member_flush_done(&self, number: u64) {
        self.flush_done(number);
    }

    /// The newest header of every log stops naming writes the flush made durable.
    fn after_flush<'a>(&'a self, array: &'a Array<M>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.retire_logs(array, &(0..array.members.slots().len()).collect::<Vec<_>>()).await })
    }

    /// Clears `device`'s log area, which may still hold the headers of an earlier life in this
    /// array (a member failed and added back). Replayed after a crash that came before its
    /// first new header, they would rewrite parity from partial parity of data changed since.
    /// md clears it too (`ppl_modify_log`).
    fn device_joins<'a>(&'a self, device: &'a Device<M>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let member = &device.member;
            self.clear_area(&**member)
                .await
                .map_err(|e| RaidError::io(format!("{}: cannot clear the parity log area", member.name()), e))
        })
    }

    fn start<'a>(&'a self, array: &'a Array<M>, start: WriteHoleStart) -> BoxFuture<'a, Result<WriteHoleReport>> {
        Box::pin(async move {
            if start.read_only {
                return Ok(WriteHoleReport::None);
            }
            Ok(WriteHoleReport::ParityLog(self.start_log(array, start.unclean).await?))
        })
    }

    fn reshapes(&self) -> bool {
        false
    }

    fn replaces_resync(&self) -> bool {
        true
    }

    fn stats(&self) -> WriteHoleStats {
        WriteHoleStats::ParityLog(ParityLog::stats(self))
    }
}

/// Member writes that may go once their entries are durable.
struct Wave {
    requests: Vec<LogRequest>,
    writes: Vec<MemberWrite>,
}

/// Groups jobs, in order, into waves whose entries fit one log write per log (a write larger
/// than that logs and writes its stripes a wave at a time).
fn log_waves(jobs: Vec<(Vec<MemberWrite>, Option<LogRequest>)>) -> Vec<Wave> {
    let mut waves: Vec<Wave> = Vec::new();
    // Per role in the current wave: (entries, partial parity bytes).
    let mut used: std::collections::HashMap<usize, (usize, usize)> = Default::default();
    for (writes, request) in jobs {
        let fits = request.as_ref().is_none_or(|r| {
            let (n, bytes) = used.get(&r.role).copied().unwrap_or((0, 0));
            n < MAX_WAVE_ENTRIES && bytes + r.pp.len() <= MAX_WAVE_PP_BYTES
        });
        if waves.is_empty() || !fits {
            waves.push(Wave { requests: Vec::new(), writes: Vec::new() });
            used.clear();
        }
        let wave = waves.last_mut().expect("a wave");
        if let Some(r) = request {
            let u = used.entry(r.role).or_insert((0, 0));
            *u = (u.0 + 1, u.1 + r.pp.len());
            wave.requests.push(r);
        }
        wave.writes.extend(writes);
    }
    waves
}
