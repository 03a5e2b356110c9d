//! The array engine: `Array<M>` turns block requests on the array into member I/O.
//!
//! ```text
//!  read/write/flush/trim/write_zeroes (bytes, 512-aligned, <= 32 MiB per read/write)
//!      │
//!      ├── linear, raid0, raid1, raid10 ── mirror.rs: map pieces, pick a readable copy
//!      │                                   (least loaded), write every writable copy
//!      └── raid4/5/6 ───────────────────── stripe.rs: per-stripe locks, full-stripe
//!                                          writes without reads, RMW vs reconstruct-write
//!                                          by fewest reads, degraded reconstruct
//!      member I/O: coalesced per member (io.rs), errors mark the member faulty
//!      state changes: metadata.rs (md superblocks through a MetadataStore)
//! ```
//!
//! Guarantees:
//! - A read returns the bytes last written, or an error; never other bytes. When a copy
//!   or a data block cannot be read, the engine reconstructs it (redundancy permitting)
//!   and marks the member faulty; when redundancy is exhausted the affected range fails
//!   with [`ErrorKind::Io`].
//! - Writes keep parity/mirrors consistent with the data, also in degraded mode, so a
//!   later rebuild is correct. Writes to one stripe are serialised by a per-stripe lock;
//!   different stripes proceed in parallel.
//! - `flush` makes every completed write durable on every live member; a write with
//!   `fua` is durable (data and parity) when it completes.

mod intent;
mod io;
mod lock_table;
mod maintenance;
mod metadata;
mod mirror;
mod read_data;
mod scrub;
mod slot;
mod stripe;
mod stripe_plan;

use std::io as stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use futures::future::join_all;

pub use lock_table::{LockGuard, LockTable};
pub use maintenance::{MaintenanceStatus, MaintenanceWork, Step};
pub use metadata::{MetadataStore, MetadataSummary, StateChange, SuperblockWrite};
pub use read_data::{FileExtent, ReadData, Segment};
pub use scrub::ScrubCounts;
pub use slot::{Device, RoleMember, SlotState};

use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::Geometry;
use crate::member::Member;
use crate::volume::{Volume, VolumeFuture};
use slot::Slot;

/// Largest READ/WRITE the engine accepts in one call (the NBD kernel client's maximum).
pub const MAX_IO_BYTES: usize = 32 << 20;

/// Lock key reserved for serialising superblock updates (never a stripe number).
const META_LOCK_KEY: u64 = u64::MAX;

/// Reads of raid1 larger than this are split across mirrors.
const MIRROR_READ_SPLIT_SECTORS: u64 = 512; // 256 KiB

/// Lock unit for raid1 writes, in array sectors.
const MIRROR_LOCK_SECTORS: u64 = 128; // 64 KiB

/// Snapshot of one role for status displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleStatus {
    pub role: usize,
    pub name: Option<String>,
    pub device_id: Option<usize>,
    pub state: SlotState,
    /// Member sectors rebuilt so far when recovering.
    pub recovery_offset_sectors: Option<u64>,
    /// A replacement being built for this role: (name, device id, sectors copied).
    pub replacement: Option<(String, usize, u64)>,
}

/// A running RAID array over members of type `M` (often `dyn Member`).
pub struct Array<M: Member + ?Sized> {
    geometry: Geometry,
    slots: Vec<Slot<M>>,
    /// Devices that belong to the array without a role.
    spares: Mutex<Vec<Device<M>>>,
    next_device_id: AtomicUsize,
    locks: LockTable,
    metadata: Option<Mutex<Box<dyn MetadataStore>>>,
    /// The superblocks currently say "dirty" (resync_offset = 0).
    dirty: AtomicBool,
    /// Background work state (rebuild, resync, scrub).
    maintenance: maintenance::MaintenanceState,
    /// Bytes of client I/O so far (rebuild throttling backs off when this moves).
    client_io_bytes: AtomicU64,
    /// The write-intent bitmap, when the array has one.
    intent: Option<intent::WriteIntent>,
    /// Nothing is written to the members: no data, no metadata, no background work.
    read_only: AtomicBool,
}

impl<M: Member + ?Sized> Array<M> {
    /// Starts an array from its geometry and the member serving each role (`None` =
    /// missing). `metadata` receives state changes; `None` runs without superblocks
    /// (tests, raw arrays). `dirty` says whether the superblocks already say dirty.
    pub fn new(
        geometry: Geometry,
        members: Vec<Option<RoleMember<M>>>,
        metadata: Option<Box<dyn MetadataStore>>,
        dirty: bool,
    ) -> Result<Self> {
        if members.len() != geometry.raid_disks() {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!("{} members given for {} roles", members.len(), geometry.raid_disks()),
            ));
        }
        for (role, m) in members.iter().enumerate() {
            let Some(m) = m else { continue };
            let needed = m.data_offset_bytes + geometry.member_sectors(role) * SECTOR_BYTES;
            if m.member.len_bytes() < needed {
                return Err(RaidError::new(
                    ErrorKind::CannotAssemble,
                    format!(
                        "{}: member is {} bytes, role {role} needs {needed} bytes",
                        m.member.name(),
                        m.member.len_bytes()
                    ),
                ));
            }
            if m.member.alignment() as u64 > SECTOR_BYTES {
                return Err(RaidError::new(
                    ErrorKind::CannotAssemble,
                    format!(
                        "{}: member needs {}-byte aligned I/O; open it without O_DIRECT",
                        m.member.name(),
                        m.member.alignment()
                    ),
                ));
            }
        }
        let slots: Vec<Slot<M>> = members.into_iter().map(Slot::new).collect();
        let missing: Vec<usize> = (0..slots.len()).filter(|&r| slots[r].state() == SlotState::Missing).collect();
        if !geometry.survives(&missing) {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!("{} cannot run with roles {missing:?} missing", geometry.level()),
            ));
        }
        let next_device_id = slots.iter().filter_map(|s| s.device().map(|d| d.id + 1)).max().unwrap_or(0);
        Ok(Self {
            geometry,
            slots,
            spares: Mutex::new(Vec::new()),
            next_device_id: AtomicUsize::new(next_device_id),
            locks: LockTable::new(),
            metadata: metadata.map(Mutex::new),
            dirty: AtomicBool::new(dirty),
            maintenance: maintenance::MaintenanceState::new(dirty),
            client_io_bytes: AtomicU64::new(0),
            intent: None,
            read_only: AtomicBool::new(false),
        })
    }

    /// Adds devices that are already spares of this array (found at assembly).
    pub fn with_spares(self, spares: Vec<Device<M>>) -> Self {
        let next = spares.iter().map(|d| d.id + 1).max().unwrap_or(0);
        self.next_device_id.fetch_max(next, Ordering::AcqRel);
        self.spares.lock().expect("spares lock").extend(spares);
        self
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_sectors() * SECTOR_BYTES
    }

    /// Whether every role is in sync.
    pub fn is_optimal(&self) -> bool {
        self.slots.iter().all(|s| s.state() == SlotState::InSync)
    }

    /// Roles that are faulty or missing.
    pub fn failed_roles(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&r| matches!(self.slots[r].state(), SlotState::Faulty | SlotState::Missing))
            .collect()
    }

    pub fn role_status(&self) -> Vec<RoleStatus> {
        self.slots
            .iter()
            .enumerate()
            .map(|(role, s)| RoleStatus {
                role,
                name: s.name(),
                device_id: s.device().map(|d| d.id),
                state: s.state(),
                recovery_offset_sectors: (s.state() == SlotState::Recovering).then(|| s.recovery_offset_sectors()),
                replacement: s
                    .replacement()
                    .map(|r| (r.device.member.name().to_string(), r.device.id, r.done_sectors.load(Ordering::Acquire))),
            })
            .collect()
    }

    /// Makes the array read-only: client writes and admin changes are refused, no metadata
    /// is written and no background work runs (md's read-only arrays write nothing either).
    /// Used for `--read-only`, offline checks and dirty degraded parity arrays.
    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Error if the array is read-only.
    fn check_writable(&self, what: &str) -> Result<()> {
        if self.is_read_only() {
            return Err(RaidError::new(ErrorKind::Refused, format!("{what}: the array is read-only")));
        }
        Ok(())
    }

    /// The metadata store's summary (`None` without metadata).
    pub fn metadata_summary(&self) -> Option<MetadataSummary> {
        self.metadata.as_ref().map(|m| m.lock().expect("metadata lock").summary())
    }

    /// Names and device ids of the spares.
    pub fn spare_status(&self) -> Vec<(String, usize)> {
        self.spares.lock().expect("spares lock").iter().map(|d| (d.member.name().to_string(), d.id)).collect()
    }

    /// Reads `len_bytes` at `offset_bytes`.
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<ReadData> {
        self.check_io(offset_bytes, len_bytes as u64, true)?;
        self.client_io_bytes.fetch_add(len_bytes as u64, Ordering::Relaxed);
        if self.geometry.parity().is_some() {
            self.read_striped(offset_bytes / SECTOR_BYTES, len_bytes).await
        } else {
            self.read_mirrored(offset_bytes / SECTOR_BYTES, len_bytes).await
        }
    }

    /// Writes `data` at `offset_bytes`; with `fua` it is durable on return.
    pub async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_writable("write")?;
        self.check_io(offset_bytes, data.len() as u64, true)?;
        self.client_io_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.ensure_dirty().await?;
        if self.geometry.parity().is_some() {
            self.write_striped(
                offset_bytes / SECTOR_BYTES,
                data.len() as u64 / SECTOR_BYTES,
                stripe::WriteSource::Data(data),
                fua,
            )
            .await
        } else {
            self.write_mirrored(offset_bytes / SECTOR_BYTES, data, fua).await
        }
    }

    /// Zeroes a range (any length). Whole stripes/chunks are zeroed on the members
    /// (deallocating when `may_deallocate`); partial stripes are written with zeros so
    /// parity stays consistent.
    pub async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> Result<()> {
        self.check_writable("write zeroes")?;
        self.check_io(offset_bytes, len_bytes, false)?;
        self.ensure_dirty().await?;
        self.zero_range(offset_bytes / SECTOR_BYTES, len_bytes / SECTOR_BYTES, may_deallocate, fua, false).await
    }

    /// Discards a range (any length). Only whole stripes (raid4/5/6) are discarded, on
    /// every member so parity stays consistent; the rest is left alone (TRIM is a hint).
    /// Discarded ranges read back as zeros.
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
        self.check_writable("trim")?;
        self.check_io(offset_bytes, len_bytes, false)?;
        self.ensure_dirty().await?;
        self.zero_range(offset_bytes / SECTOR_BYTES, len_bytes / SECTOR_BYTES, true, fua, true).await
    }

    /// Makes every completed write durable on every live member.
    pub async fn flush(&self) -> Result<()> {
        let live: Vec<usize> = (0..self.slots.len()).filter(|&r| self.slots[r].is_writable()).collect();
        let replacements: Vec<(usize, std::sync::Arc<slot::Replacement<M>>)> =
            (0..self.slots.len()).filter_map(|r| self.slots[r].replacement().map(|x| (r, x))).collect();
        let (results, replacement_results) = futures::join!(
            join_all(live.iter().map(|&r| async move { self.slots[r].member().flush().await })),
            join_all(replacements.iter().map(|(_, x)| x.device.member.flush()))
        );
        for (&role, res) in live.iter().zip(results) {
            if let Err(e) = res {
                self.member_failed(role, &e, "flush").await;
            }
        }
        for ((role, x), res) in replacements.iter().zip(replacement_results) {
            if let Err(e) = res {
                self.replacement_failed(*role, x, &e).await;
            }
        }
        self.check_survives("flush")
    }

    /// Orderly stop: flush, then record "clean" in the superblocks (or, when a resync
    /// after an unclean stop has not finished, how far it got, as md does).
    pub async fn shutdown(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        self.flush().await?;
        if self.dirty.load(Ordering::Acquire) {
            let _g = self.locks.lock(META_LOCK_KEY).await;
            let change = match self.resync_checkpoint() {
                Some(sectors) => StateChange::ResyncProgress { sectors },
                None => {
                    if self.is_optimal() {
                        self.intent_clear_all_locked().await;
                    }
                    StateChange::Clean
                }
            };
            self.persist_locked(change).await;
            self.dirty.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Marks the member in `role` faulty on request (admin "fail").
    pub async fn fail_role(&self, role: usize) -> Result<()> {
        self.check_writable("fail")?;
        if role >= self.slots.len() {
            return Err(RaidError::new(ErrorKind::Refused, format!("no role {role}")));
        }
        let mut failed = self.failed_roles();
        failed.push(role);
        if !self.geometry.survives(&failed) {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("failing role {role} would leave {} without its data", self.geometry.level()),
            ));
        }
        self.mark_faulty(role).await;
        Ok(())
    }

    /// Checks a request's alignment and range (and, with `limit`, its size); the write
    /// cache applies the same checks.
    pub(crate) fn check_io(&self, offset_bytes: u64, len_bytes: u64, limit: bool) -> Result<()> {
        let end = offset_bytes.checked_add(len_bytes);
        if !offset_bytes.is_multiple_of(SECTOR_BYTES) || !len_bytes.is_multiple_of(SECTOR_BYTES) {
            return Err(RaidError::new(
                ErrorKind::OutOfRange,
                format!("request {offset_bytes}+{len_bytes} is not 512-byte aligned"),
            ));
        }
        if end.is_none_or(|e| e > self.size_bytes()) {
            return Err(RaidError::new(
                ErrorKind::OutOfRange,
                format!("request {offset_bytes}+{len_bytes} beyond array end {}", self.size_bytes()),
            ));
        }
        if limit && len_bytes > MAX_IO_BYTES as u64 {
            return Err(RaidError::new(ErrorKind::Refused, format!("request of {len_bytes} bytes exceeds 32 MiB")));
        }
        Ok(())
    }

    fn has_redundancy(&self) -> bool {
        self.geometry.max_failures() > 0
    }

    /// Error unless the array still holds all its data.
    fn check_survives(&self, what: &str) -> Result<()> {
        let failed = self.failed_roles();
        if self.geometry.survives(&failed) {
            Ok(())
        } else {
            Err(RaidError::new(
                ErrorKind::ArrayFailed,
                format!("{what}: {} has lost roles {failed:?}, more than its redundancy", self.geometry.level()),
            ))
        }
    }

    /// Records that a member I/O failed: marks it faulty (redundant levels) and makes
    /// that durable before returning.
    async fn member_failed(&self, role: usize, error: &stdio::Error, what: &str) {
        let name = self.slots[role].name().unwrap_or_else(|| "?".into());
        if !self.has_redundancy() {
            tracing::error!(member = name, role, %error, "{what} failed");
            return;
        }
        tracing::error!(member = name, role, %error, "{what} failed: member marked faulty, array degraded");
        self.mark_faulty(role).await;
        self.maintenance.wake();
    }

    /// Marks the device of `role` faulty and records it durably. If a replacement was
    /// being built for the role, it takes over as a recovering member.
    async fn mark_faulty(&self, role: usize) {
        let slot = &self.slots[role];
        if !slot.set_faulty() {
            return;
        }
        let _g = self.locks.lock(META_LOCK_KEY).await;
        if let Some(device) = slot.device() {
            self.persist_locked(StateChange::Faulty { device: device.id }).await;
        }
        if let Some(replacement) = slot.replacement() {
            slot.set_replacement(None);
            let done = replacement.done_sectors.load(Ordering::Acquire);
            slot.take_device();
            slot.install(replacement.device.clone(), Some(done));
            tracing::warn!(role, member = replacement.device.member.name(), "replacement takes over the failed role");
            self.persist_locked(StateChange::Assign { device: replacement.device.id, role, replacement: false }).await;
            self.persist_locked(StateChange::RecoveryProgress { device: replacement.device.id, sectors: done }).await;
        }
    }

    /// A replacement's write failed: drop it (the role itself is unaffected).
    async fn replacement_failed(&self, role: usize, replacement: &slot::Replacement<M>, error: &stdio::Error) {
        let slot = &self.slots[role];
        let still = slot.replacement().is_some_and(|r| r.device.id == replacement.device.id);
        if !still {
            return;
        }
        slot.set_replacement(None);
        tracing::error!(role, member = replacement.device.member.name(), %error, "replacement failed and was dropped");
        let _g = self.locks.lock(META_LOCK_KEY).await;
        self.persist_locked(StateChange::Faulty { device: replacement.device.id }).await;
    }

    /// The live device with `id`: a role's device (unless faulty), a replacement, or a spare.
    fn device_by_id(&self, id: usize) -> Option<Device<M>> {
        for slot in &self.slots {
            if let Some(d) = slot.device().filter(|d| d.id == id) {
                return slot.is_writable().then_some(d);
            }
            if let Some(r) = slot.replacement().filter(|r| r.device.id == id) {
                return Some(r.device.clone());
            }
        }
        self.spares.lock().expect("spares lock").iter().find(|d| d.id == id).cloned()
    }

    /// Whether `id` is the device of some role (for mapping superblock write failures).
    fn role_of_device(&self, id: usize) -> Option<usize> {
        self.slots.iter().position(|s| s.device().is_some_and(|d| d.id == id))
    }

    /// Writes the superblocks for `change` (and for members that fail while doing so).
    /// The caller holds the metadata lock.
    async fn persist_locked(&self, change: StateChange) {
        if let Err(e) = self.try_persist_locked(change).await {
            tracing::error!(error = %e, "cannot record an array state change");
        }
    }

    /// Like `persist_locked`, but reports a change the store refuses.
    async fn try_persist_locked(&self, change: StateChange) -> Result<()> {
        let Some(store) = &self.metadata else { return Ok(()) };
        if self.is_read_only() {
            tracing::debug!(?change, "read-only array: state change not recorded");
            return Ok(());
        }
        let mut pending = vec![change];
        let mut first = true;
        while let Some(change) = pending.pop() {
            let applied = store.lock().expect("metadata lock").apply(&change);
            let writes = match applied {
                Ok(w) => w,
                Err(e) if first => return Err(e),
                Err(e) => {
                    tracing::error!(error = %e, "cannot record a member failure");
                    continue;
                }
            };
            first = false;
            let targets: Vec<(Device<M>, SuperblockWrite)> =
                writes.into_iter().filter_map(|w| self.device_by_id(w.device).map(|d| (d, w))).collect();
            let results = join_all(
                targets
                    .into_iter()
                    .map(|(d, w)| async move { (d.id, d.member.write_at(w.offset_bytes, w.image, true).await.0) }),
            )
            .await;
            for (device, res) in results {
                if let Err(e) = res {
                    tracing::error!(device, error = %e, "superblock write failed: device marked faulty");
                    match self.role_of_device(device) {
                        Some(role) if self.slots[role].set_faulty() => pending.push(StateChange::Faulty { device }),
                        Some(_) => {}
                        None => {
                            self.spares.lock().expect("spares lock").retain(|d| d.id != device);
                            for slot in &self.slots {
                                if slot.replacement().is_some_and(|r| r.device.id == device) {
                                    slot.set_replacement(None);
                                }
                            }
                            pending.push(StateChange::Faulty { device });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn zero_range(&self, start: u64, sectors: u64, deallocate: bool, fua: bool, trim_only: bool) -> Result<()> {
        if sectors == 0 {
            return Ok(());
        }
        if self.geometry.parity().is_some() {
            self.zero_striped(start, sectors, deallocate, trim_only).await?;
            if fua { self.flush().await } else { Ok(()) }
        } else {
            self.zero_mirrored(start, sectors, deallocate, fua).await
        }
    }

    async fn ensure_dirty(&self) -> Result<()> {
        if self.metadata.is_none() || self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = self.locks.lock(META_LOCK_KEY).await;
        if !self.dirty.load(Ordering::Acquire) {
            self.persist_locked(StateChange::Dirty).await;
            self.dirty.store(true, Ordering::Release);
        }
        self.check_survives("mark dirty")
    }
}

/// The array as a volume: its own methods, including the in-place paths.
impl<M: Member + ?Sized + 'static> Volume for Array<M> {
    fn size_bytes(&self) -> u64 {
        Array::size_bytes(self)
    }
    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, ReadData> {
        Box::pin(Array::read(self, offset_bytes, len_bytes))
    }
    fn write<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> VolumeFuture<'a, ()> {
        Box::pin(Array::write(self, offset_bytes, data, fua))
    }
    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(Array::flush(self))
    }
    fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(Array::trim(self, offset_bytes, len_bytes, fua))
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(Array::write_zeroes(self, offset_bytes, len_bytes, may_deallocate, fua))
    }
    fn read_in_place(&self, offset_bytes: u64, len_bytes: usize) -> Result<Option<Vec<FileExtent>>> {
        Array::read_in_place(self, offset_bytes, len_bytes)
    }
    fn write_in_place(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, Option<Vec<FileExtent>>> {
        Box::pin(Array::write_in_place(self, offset_bytes, len_bytes))
    }
}
