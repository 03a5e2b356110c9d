//! The write hole, and the policies that close it.
//!
//! A raid4/5/6 stripe's data and parity go to several members; a crash between those writes
//! leaves parity that matches neither the old nor the new data, and a member lost afterwards
//! is rebuilt wrong (the RAID write hole). A [`WriteHole`] policy decides what a striped
//! write makes durable before its member writes start, and how a start after a crash puts
//! right what the crash left:
//!
//! - [`Plain`]: nothing (md without a log): a resync after an unclean stop recomputes parity,
//!   and a member lost before it finishes may be rebuilt wrong.
//! - [`ParityLog`] (md's PPL, raid5): each stripe's partial parity is logged on its parity
//!   member first; replay recomputes parity of the logged stripes.
//! - [`Journal`] (md's write journal, raid4/5/6): data and parity pages go to a ring on the
//!   journal device first; replay rewrites the logged stripes.
//!
//! The striped write path calls one method, [`WriteHole::write`], once per attempt of a write
//! whose stripes it has locked and planned; the policy reads and computes the stripes through
//! [`StripeWork::compute`], protects them, and issues the member writes through
//! `Array::write_computed`. Everything else here is a hook of the array's life: whole-stripe
//! zeroing, flushes, devices joining, start and stop.

mod journal;
mod parity_log;

use std::ops::Range;

use futures::future::BoxFuture;

pub(crate) use journal::Journal;
pub use journal::{JournalConfig, JournalReport, JournalStats, MIN_JOURNAL_BYTES};
pub(crate) use parity_log::ParityLog;
pub use parity_log::{MIN_PARITY_LOG_AREA_BYTES, ParityLogConfig, ParityLogStats, ReplayReport};

use super::stripe_write::{ComputedJob, Job, WriteSource};
use super::{Array, Device, Layout};
use crate::error::Result;
use crate::geometry::StripeLayout;
use crate::member::Member;

/// What the write planner must respect for a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteRules {
    /// Rows (member sectors) of one job at most.
    pub max_job_rows: u64,
    /// Full-stripe segments are split by `max_job_rows` too (else they stay whole).
    pub split_full_stripes: bool,
    /// Writes are widened to whole pages of this many sectors first.
    pub page_sectors: Option<u64>,
    /// A segment whose parity is lost and cannot be rebuilt may still write its data.
    pub data_only: bool,
    /// Jobs carry their partial parity (the XOR of the data blocks they do not write).
    pub partial_parity: bool,
    /// Whole stripes are zeroed (or discarded) on the members; else zeros are written as data.
    pub zeroes_whole_stripes: bool,
}

/// How a start brings the policy up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteHoleStart {
    /// The superblocks say the array was not stopped cleanly.
    pub unclean: bool,
    /// Nothing may be written at all (`--read-only`).
    pub read_only: bool,
    /// The array comes up read-only although the caller allowed writes (dirty and degraded,
    /// or its journal missing).
    pub forced_read_only: bool,
}

/// What a start found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteHoleReport {
    None,
    ParityLog(ReplayReport),
    Journal(JournalReport),
}

/// Counters for status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteHoleStats {
    None,
    ParityLog(ParityLogStats),
    Journal(JournalStats),
}

impl WriteHoleStats {
    /// The partial parity log's counters, if that is the policy.
    pub fn parity_log(self) -> Option<ParityLogStats> {
        match self {
            WriteHoleStats::ParityLog(s) => Some(s),
            _ => None,
        }
    }

    /// The journal's counters, if that is the policy.
    pub fn journal(self) -> Option<JournalStats> {
        match self {
            WriteHoleStats::Journal(s) => Some(s),
            _ => None,
        }
    }
}

/// A striped write, planned under its stripe locks, for a policy to carry out.
pub(crate) struct StripeWork<'a> {
    pub layout: &'a Layout,
    /// Per stripe written: its layout (roles of data, P, Q).
    pub stripe_layouts: &'a [StripeLayout],
    pub jobs: Vec<Job>,
    pub src: WriteSource<'a>,
    pub writes: &'a [super::stripe_plan::StripeWrite],
}

impl<'a> StripeWork<'a> {
    /// Reads what the jobs need and computes every block they write (with their partial
    /// parity when `partial_parity`). `None`: a read failed (the member is faulty now) and
    /// the write must be planned again.
    pub async fn compute<M: Member + ?Sized>(
        self,
        array: &Array<M>,
        partial_parity: bool,
    ) -> Result<Option<Vec<ComputedJob>>> {
        array.read_and_compute(self, partial_parity).await
    }
}

/// What one attempt of a striped write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The member writes were issued (failures are recorded on the members).
    Done,
    /// A read failed before anything was written: plan again.
    ReadFailed,
}

/// Something a policy holds until whole stripes are zeroed (dropping it completes them).
pub(crate) type ZeroingToken<'a> = Box<dyn Send + 'a>;

/// See the module docs.
pub(crate) trait WriteHole<M: Member + ?Sized>: Send + Sync {
    /// The rules the planner follows.
    fn rules(&self, roles: usize) -> WriteRules;

    /// The one entry from the write path: computes the work's blocks, makes their protection
    /// durable, and issues their member writes (FUA with `fua`).
    fn write<'a>(&'a self, array: &'a Array<M>, work: StripeWork<'a>, fua: bool) -> BoxFuture<'a, Result<Written>>;

    /// Whole stripes from `stripe` (before `end`) one zeroing takes at most.
    fn zero_batch_stripes(&self, layout: &Layout, stripe: u64, end: u64) -> u64 {
        let _ = layout;
        (end - stripe).min(super::stripe_zero::ZERO_BATCH_STRIPES)
    }

    /// Makes the zeroing of whole `stripes` safe to start; the token is dropped once they
    /// are zeroed.
    fn protect_zeroing<'a>(
        &'a self,
        array: &'a Array<M>,
        layout: &'a Layout,
        stripes: Range<u64>,
    ) -> BoxFuture<'a, Result<Option<ZeroingToken<'a>>>> {
        let _ = (array, layout, stripes);
        Box::pin(async { Ok(None) })
    }

    /// A flush of every live member starts: its number for `member_flush_done`.
    fn member_flush_started(&self) -> u64 {
        0
    }

    /// Flush `number` made every write completed before it durable.
    fn member_flush_done(&self, number: u64) {
        let _ = number;
    }

    /// After an array flush (the members' flush is done).
    fn after_flush<'a>(&'a self, array: &'a Array<M>) -> BoxFuture<'a, Result<()>> {
        let _ = array;
        Box::pin(async { Ok(()) })
    }

    /// A client's FLUSH.
    fn client_flush<'a>(&'a self, array: &'a Array<M>) -> BoxFuture<'a, Result<()>> {
        Box::pin(array.flush())
    }

    /// Whether TRIM may discard (a policy whose replay could undo it says no).
    fn can_trim(&self) -> bool {
        true
    }

    /// `device` is about to take a role (its old log must not be replayed).
    fn device_joins<'a>(&'a self, device: &'a Device<M>) -> BoxFuture<'a, Result<()>> {
        let _ = device;
        Box::pin(async { Ok(()) })
    }

    /// At start, before the array takes writes: replay (or scan) what a crash left.
    fn start<'a>(&'a self, array: &'a Array<M>, start: WriteHoleStart) -> BoxFuture<'a, Result<WriteHoleReport>> {
        let _ = (array, start);
        Box::pin(async { Ok(WriteHoleReport::None) })
    }

    /// At an orderly stop, after the last flush.
    fn shutdown<'a>(&'a self, array: &'a Array<M>) -> BoxFuture<'a, Result<()>> {
        let _ = array;
        Box::pin(async { Ok(()) })
    }

    /// A device of the policy's own with this id (it gets superblocks too).
    fn device(&self, id: usize) -> Option<Device<M>> {
        let _ = id;
        None
    }

    /// Writing to the policy's own device failed.
    fn device_failed(&self, array: &Array<M>, error: &std::io::Error, what: &str) {
        let _ = (array, error, what);
    }

    fn stats(&self) -> WriteHoleStats {
        WriteHoleStats::None
    }

    /// Whether an array with this policy may be reshaped (md reshapes none with a log).
    fn reshapes(&self) -> bool {
        true
    }

    /// Whether its start after an unclean stop makes the crash's resync needless
    /// ([`Array::mark_resynced`]). The superblocks' dirty mark then says where a resync of
    /// new space begins (a resize, `resize.rs`), not 0.
    fn replaces_resync(&self) -> bool {
        false
    }
}

/// No log: member writes go at once (a resync after an unclean stop repairs parity).
pub(crate) struct Plain;

impl<M: Member + ?Sized> WriteHole<M> for Plain {
    fn rules(&self, _roles: usize) -> WriteRules {
        WriteRules {
            max_job_rows: u64::MAX,
            split_full_stripes: false,
            page_sectors: None,
            data_only: true,
            partial_parity: false,
            zeroes_whole_stripes: true,
        }
    }

    fn write<'a>(&'a self, array: &'a Array<M>, work: StripeWork<'a>, fua: bool) -> BoxFuture<'a, Result<Written>> {
        Box::pin(async move {
            let stripe_layouts = work.stripe_layouts;
            let Some(jobs) = work.compute(array, false).await? else { return Ok(Written::ReadFailed) };
            array.write_computed(jobs, stripe_layouts, fua).await;
            Ok(Written::Done)
        })
    }
}
