//! The away record: which resync chunks were written while a member was away, for arrays
//! without a write-intent bitmap (md allows none beside the partial parity log), so that a
//! member that comes back is re-added by copying only those chunks, as with a bitmap.
//!
//! In memory, always (redundant levels without a bitmap): the chunks with writes in flight
//! and those written since the last member flush that completed (`recent`): a member that
//! fails may have lost exactly these (acknowledged, not yet durable on it). When a member
//! fails, the record begins: those chunks, and from then on every chunk written, are in it
//! until the array is whole again (every role in sync), when it ends.
//!
//! On disk (an [`AwayStore`] the binary provides, outside the members: md never looks
//! there), while a member is away: the whole record, saved before any data write to a chunk
//! not yet in it, and again after every superblock update. It carries the array UUID and
//! the superblocks' event count it was saved at; one whose count is not the assembled one
//! (md or raidnbd changed the array after it) is not trusted. A save that fails makes the
//! engine bump the event count (so the stale file is never trusted) and go on in memory.
//!
//! A returning member may use it when its superblock events are at least `since_events`
//! (the array's count when the first member of this away period left): it was up to date
//! then, and everything written since is in the record.

mod image;
mod record;

use std::io;
use std::sync::Arc;

pub use image::AwayImage;
use image::check_image;
pub use record::AwayStatus;
pub(crate) use record::{AwayRecord, SaveNeeded};

use super::{Array, META_LOCK_KEY, StateChange};
use crate::member::{IoFuture, Member};

/// Where the record is kept between runs (one per array; the binary: a file).
pub trait AwayStore: Send + Sync {
    /// Replaces the stored record with `image`, durably.
    fn save<'a>(&'a self, image: &'a [u8]) -> IoFuture<'a, io::Result<()>>;
    /// Removes the stored record (the array is whole again).
    fn remove(&self) -> IoFuture<'_, io::Result<()>>;
}

/// How [`Admin::track_away`](crate::engine::Admin::track_away) started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AwayStart {
    /// Not used: the array has a bitmap, no redundancy, no metadata, or is read-only.
    Off,
    /// Every role is in sync: the record begins when a member leaves.
    Idle,
    /// Degraded, with the stored record of this away period (`chunks` written so far).
    Resumed { since_events: u64, chunks: u64 },
    /// Degraded after a clean stop without a stored record: members that were in sync at
    /// the stop (events at least `since_events`) copy only what is written from now on.
    Begun { since_events: u64 },
    /// Degraded, no usable record (why): returning members are rebuilt whole.
    Untracked(String),
}

impl std::fmt::Display for AwayStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AwayStart::Off => write!(f, "not used"),
            AwayStart::Idle => write!(f, "idle (every member in sync)"),
            AwayStart::Resumed { since_events, chunks } => {
                write!(f, "resumed: {chunks} chunks written since event {since_events}")
            }
            AwayStart::Begun { since_events } => write!(f, "begun at event {since_events} (clean start, degraded)"),
            AwayStart::Untracked(why) => write!(f, "none usable ({why}): a returning member is rebuilt whole"),
        }
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Tracks what is written while a member is away, for arrays with redundancy and md
    /// metadata but no write-intent bitmap (call once, before serving). `stored`: the image
    /// `store` holds, if any; `assembled_events` / `assembled_clean`: the superblocks as
    /// assembled, before this run changed anything.
    pub(crate) async fn track_away(
        &self,
        store: Option<Arc<dyn AwayStore>>,
        stored: Option<&[u8]>,
        assembled_events: u64,
        assembled_clean: bool,
    ) -> AwayStart {
        let Some(summary) = self.metadata_summary() else { return AwayStart::Off };
        if self.intent.is_some() || !self.has_redundancy() || self.is_read_only() || self.away.get().is_some() {
            return AwayStart::Off;
        }
        let record = AwayRecord::new(self.layout().geometry().resync_sectors(), store.clone());
        let start = if self.members.is_optimal() {
            AwayStart::Idle
        } else {
            let image = stored.map(AwayImage::decode).transpose().and_then(|image| match image {
                Some(i) => check_image(&i, summary.uuid, assembled_events, record.chunk_sectors(), record.chunks())
                    .map(|()| Some(i)),
                None => Ok(None),
            });
            match image {
                Ok(Some(image)) => {
                    record.resume(image.since_events, (0..image.chunks).filter(|&c| image.is_set(c)));
                    let chunks = record.status().map_or(0, |s| s.chunks_written);
                    AwayStart::Resumed { since_events: image.since_events, chunks }
                }
                Ok(None) if assembled_clean => {
                    record.resume(assembled_events, []);
                    AwayStart::Begun { since_events: assembled_events }
                }
                Ok(None) => AwayStart::Untracked("unclean stop and no stored record".into()),
                Err(why) => AwayStart::Untracked(format!("the stored record: {why}")),
            }
        };
        let active = matches!(start, AwayStart::Resumed { .. } | AwayStart::Begun { .. });
        if self.away.set(record).is_err() {
            return AwayStart::Off;
        }
        let _g = self.locks.lock(META_LOCK_KEY).await;
        if active {
            self.away_save_locked(None).await;
        } else if let (Some(store), Some(_)) = (&store, stored) {
            // In sync, or not to be trusted: the file says nothing true any more.
            if let Err(e) = store.remove().await {
                tracing::warn!(error = %e, "cannot remove the stale away record");
            }
        }
        start
    }

    /// The away record's state (`None`: no member away, or not tracked).
    pub(crate) fn away_status(&self) -> Option<AwayStatus> {
        self.away.get().and_then(AwayRecord::status)
    }

    /// A returning member whose superblock events are at least this was up to date when the
    /// away record began: it may be re-added from the record.
    pub(crate) fn away_since_events(&self) -> Option<u64> {
        self.away.get().and_then(AwayRecord::since_events)
    }

    /// A member left (it is faulty in memory now; the superblocks say so next): begin the
    /// record. `events_before`: the superblocks' count before the change that failed it.
    pub(super) fn away_begin(&self, events_before: Option<u64>) {
        let Some(record) = self.away.get() else { return };
        let Some(events) = events_before.or_else(|| self.metadata_summary().map(|s| s.events)) else { return };
        record.begin(events);
    }

    /// Saves the record with the superblocks' current event count, unless generation
    /// `need` is saved already (`None`: save now). The caller holds the metadata lock.
    pub(super) async fn away_save_locked(&self, need: Option<u64>) {
        let (Some(record), Some(summary)) = (self.away.get(), self.metadata_summary()) else { return };
        if need.is_some_and(|n| record.saved_up_to(n)) {
            return;
        }
        let Some((image, generation)) = record.image_to_save(summary.uuid, summary.events) else { return };
        if !record.save(&image, generation).await {
            // The file may hold an older record at the current count: make it stale.
            self.persist_changes_locked(StateChange::Dirty).await.ok();
            self.dirty.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// After a superblock update: the record ends if the array is whole, else is saved
    /// again with the new event count. The caller holds the metadata lock.
    pub(super) async fn away_after_persist_locked(&self) {
        let Some(record) = self.away.get() else { return };
        if record.since_events().is_none() {
            return;
        }
        if self.members.is_optimal() {
            record.end().await;
            tracing::info!("every member in sync: the away record ends");
        } else {
            self.away_save_locked(None).await;
        }
    }
}
