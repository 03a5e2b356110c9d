//! `ArrayBuilder`: everything an array is started from, checked once, then built.
//!
//! What md's assembly decided (`md::start` is the builder's one caller outside tests): the
//! geometry and the device serving each role, the spares, the metadata store and whether
//! the superblocks say dirty, the write-intent bitmap, bad blocks, write-mostly roles, the
//! write-hole policy, and a reshape in progress (the previous layout and the front).
//! [`ArrayBuilder::build`] checks that the members are large enough for every layout and
//! that the array survives the roles missing; [`ArrayBuilder::start`] also starts the
//! write-hole policy (replaying what a crash left) before the array takes writes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::lock_table::LockTable;
use super::membership::Membership;
use super::shape::{Direction, Layout, Reshape, Shape, ShapeCell};
use super::slot::{Device, RoleMember, SlotState};
use super::write_hole::{self, JournalConfig, ParityLogConfig, WriteHole, WriteHoleReport, WriteHoleStart};
use super::{Array, MetadataStore, away, intent, maintenance, quiesce};
use crate::SECTOR_BYTES;
use crate::bad_ranges::BadRanges;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::Geometry;
use crate::member::Member;

/// The write-hole policy asked for.
enum WriteHoleChoice<M: ?Sized> {
    Plain,
    ParityLog(ParityLogConfig),
    Journal(Device<M>, JournalConfig),
}

/// See the module docs.
pub struct ArrayBuilder<M: Member + ?Sized> {
    layout: Layout,
    reshape: Option<Reshape>,
    members: Vec<Option<RoleMember<M>>>,
    spares: Vec<Device<M>>,
    metadata: Option<Box<dyn MetadataStore>>,
    dirty: bool,
    resync_from: Option<u64>,
    write_intent: Option<(u64, u64, Vec<u64>)>,
    bad_blocks: Vec<(usize, BadRanges)>,
    write_mostly: Vec<usize>,
    write_hole: WriteHoleChoice<M>,
}

impl<M: Member + ?Sized> ArrayBuilder<M> {
    /// An array of `geometry` over the member serving each role (`None` = missing), without
    /// metadata (state changes are not recorded: tests, raw arrays) until [`Self::metadata`].
    pub fn new(geometry: Geometry, members: Vec<Option<RoleMember<M>>>) -> Self {
        Self {
            layout: Layout::settled(geometry),
            reshape: None,
            members,
            spares: Vec::new(),
            metadata: None,
            dirty: false,
            resync_from: None,
            write_intent: None,
            bad_blocks: Vec::new(),
            write_mostly: Vec::new(),
            write_hole: WriteHoleChoice::Plain,
        }
    }

    /// State changes go to `store`.
    pub fn metadata(mut self, store: Box<dyn MetadataStore>) -> Self {
        self.metadata = Some(store);
        self
    }

    /// The superblocks say dirty already (an unclean stop): a resync follows unless the
    /// write-hole policy's replay makes it needless.
    pub fn dirty(mut self, dirty: bool) -> Self {
        self.dirty = dirty;
        self
    }

    /// Devices that are already spares of this array (found at assembly).
    pub fn spares(mut self, spares: Vec<Device<M>>) -> Self {
        self.spares = spares;
        self
    }

    /// The superblocks say a resync stopped cleanly at `sectors` (md's resync_offset).
    pub fn resync_from(mut self, sectors: u64) -> Self {
        self.resync_from = Some(sectors);
        self
    }

    /// md's write-intent bitmap: `chunks` bits of `chunk_sectors` resync sectors, `dirty` set.
    pub fn write_intent(mut self, chunk_sectors: u64, chunks: u64, dirty: &[u64]) -> Self {
        self.write_intent = Some((chunk_sectors, chunks, dirty.to_vec()));
        self
    }

    /// The bad ranges `role`'s device already has (its bad-block log).
    pub fn bad_blocks(mut self, role: usize, bad: BadRanges) -> Self {
        self.bad_blocks.push((role, bad));
        self
    }

    /// `role` is write-mostly (md's `WriteMostly1`): read only when no other copy can be.
    pub fn write_mostly(mut self, role: usize) -> Self {
        self.write_mostly.push(role);
        self
    }

    /// md's partial parity log (raid5).
    pub fn parity_log(mut self, config: ParityLogConfig) -> Self {
        self.write_hole = WriteHoleChoice::ParityLog(config);
        self
    }

    /// md's write journal on `device` (raid4/5/6).
    pub fn journal(mut self, device: Device<M>, config: JournalConfig) -> Self {
        self.write_hole = WriteHoleChoice::Journal(device, config);
        self
    }

    /// A reshape in progress from `previous` to this builder's geometry, whose member sectors
    /// start `shift_sectors` after each device's data origin, with array sectors on the
    /// reshaped side of `front_sectors` already moved (md's `reshape_position`).
    pub fn reshaping(mut self, previous: Layout, shift_sectors: u64, front_sectors: u64, direction: Direction) -> Self {
        self.layout = Layout::new(self.layout.geometry().clone(), shift_sectors);
        self.reshape = Some(Reshape { previous: Arc::new(previous), front_sectors, direction });
        self
    }

    /// Checks the members and builds the array (its write-hole policy not started yet).
    pub fn build(self) -> Result<Array<M>>
    where
        M: 'static,
    {
        let cannot = |why: String| RaidError::new(ErrorKind::CannotAssemble, why);
        let layouts: Vec<&Layout> =
            std::iter::once(&self.layout).chain(self.reshape.as_ref().map(|r| &*r.previous)).collect();
        let roles = layouts.iter().map(|l| l.geometry().raid_disks()).max().unwrap_or(0);
        if self.members.len() != roles {
            return Err(cannot(format!("{} members given for {roles} roles", self.members.len())));
        }
        for (role, m) in self.members.iter().enumerate() {
            let Some(m) = m else { continue };
            let used = layouts
                .iter()
                .filter(|l| role < l.geometry().raid_disks())
                .map(|l| l.shift_sectors() + l.geometry().member_sectors(role))
                .max()
                .unwrap_or(0);
            let needed = m.data_offset_bytes + used * SECTOR_BYTES;
            if m.member.len_bytes() < needed {
                return Err(cannot(format!(
                    "{}: member is {} bytes, role {role} needs {needed} bytes",
                    m.member.name(),
                    m.member.len_bytes()
                )));
            }
            if m.member.alignment() as u64 > SECTOR_BYTES {
                return Err(cannot(format!(
                    "{}: member needs {}-byte aligned I/O; open it without O_DIRECT",
                    m.member.name(),
                    m.member.alignment()
                )));
            }
        }
        let geometry = self.layout.geometry().clone();
        let shape = match self.reshape {
            None => Shape::settled(self.layout),
            Some(reshape) => Shape::reshaping(self.layout, reshape),
        };
        let members = Membership::new(self.members);
        let missing: Vec<usize> =
            (0..members.slots().len()).filter(|&r| members.slots()[r].state() == SlotState::Missing).collect();
        if !shape.survives(&missing) {
            return Err(cannot(format!("{} cannot run with roles {missing:?} missing", geometry.level())));
        }
        let write_hole: Box<dyn WriteHole<M>> = match self.write_hole {
            WriteHoleChoice::Plain => Box::new(write_hole::Plain),
            WriteHoleChoice::ParityLog(config) => Box::new(write_hole::ParityLog::for_array(config, &geometry)?),
            WriteHoleChoice::Journal(device, config) => {
                members.next_device_id.fetch_max(device.id + 1, Ordering::AcqRel);
                Box::new(write_hole::Journal::for_array(device, config, &geometry)?)
            }
        };
        if shape.reshape().is_some() && !write_hole.reshapes() {
            return Err(cannot("md reshapes no array with a partial parity log or a write journal".into()));
        }
        members.add_spares(self.spares);
        for (role, bad) in self.bad_blocks {
            if let Some(slot) = members.slots().get(role) {
                slot.set_bad(bad);
            }
        }
        for role in self.write_mostly {
            if let Some(slot) = members.slots().get(role) {
                slot.read_balance.write_mostly.store(true, Ordering::Relaxed);
            }
        }
        let array = Array {
            shape: ShapeCell::new(shape),
            members,
            locks: LockTable::new(),
            metadata: self.metadata.map(Mutex::new),
            dirty: AtomicBool::new(self.dirty),
            maintenance: maintenance::MaintenanceState::new(self.dirty),
            client_io_bytes: AtomicU64::new(0),
            intent: self.write_intent.map(|(chunk, chunks, dirty)| intent::WriteIntent::new(chunk, chunks, &dirty)),
            away: std::sync::OnceLock::<away::AwayRecord>::new(),
            read_only: AtomicBool::new(false),
            quiesce: quiesce::Quiesce::default(),
            gather: std::sync::OnceLock::new(),
            write_hole,
        };
        if self.dirty
            && let Some(sectors) = self.resync_from.filter(|&s| s != 0)
        {
            array.resume_resync_from(sectors);
        }
        Ok(array)
    }

    /// Builds the array and starts its write-hole policy (after an unclean stop: replays
    /// what the crash left) before it takes writes; read-only as `start` says.
    pub async fn start(self, start: WriteHoleStart) -> Result<(Array<M>, WriteHoleReport)>
    where
        M: 'static,
    {
        let array = self.build()?;
        let report = array.write_hole.start(&array, start).await?;
        array.set_read_only(start.read_only || start.forced_read_only);
        Ok((array, report))
    }
}
