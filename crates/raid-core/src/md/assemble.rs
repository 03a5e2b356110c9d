//! `assemble`: plan an array from candidate member devices, the way md and mdadm decide
//! (`md-format.md` §1.8; kernel `super_1_load`/`super_1_validate`, mdadm `Assemble.c`).
//!
//! ```text
//!  candidates (any order): { name, device_bytes, superblock: Ok(sb) | Err(decode error) }
//!     │ 1. any decode error                        → error naming each such member
//!     │ 2. freshest = highest events among members whose own role is active
//!     │    any member of another array (set_uuid)   → error naming both groups
//!     │ 3. per member: events + 1 < freshest and active (own or freshest's view) → stale
//!     │    role: own table at equal events (must match the freshest's table),
//!     │          the freshest's table when behind (crash right after a failure was recorded),
//!     │          but never active unless its own superblock says so too
//!     │    geometry differing from the freshest, role ≥ raid_disks, duplicate role or
//!     │    dev_number, device smaller than its superblock says → error naming the member(s)
//!     │ 4. Geometry::survives(missing ∪ rebuilding roles), else error listing what was found
//!     ▼
//!  Assembly { metadata, members[role] → candidate, spares, faulty, missing_roles, stale, dirty, degraded }
//! ```
//!
//! A member given explicitly whose superblock does not decode is an error even when the array
//! could run without it (mdadm refuses too): the user named it, so something is wrong. Members
//! the freshest superblock records as faulty are reported in `faulty` and not used.
//!
//! Never writes anything; the caller reads the superblocks (4 KiB at byte 4096) and opens the
//! chosen members. Errors are [`ErrorKind::BadMetadata`] for undecodable superblocks and
//! [`ErrorKind::ArrayFailed`] for a consistent set with too few members to run, and
//! [`ErrorKind::CannotAssemble`] otherwise.

use std::collections::BTreeMap;

use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError};
use crate::geometry::{Geometry, GeometryError, Level, ParityLayout};

use super::dev_role::DevRole;
use super::feature::FeatureMap;
use super::metadata::ArrayMetadata;
use super::superblock::Superblock;
use super::uuid::MdUuid;

/// One device offered for assembly.
#[derive(Debug)]
pub struct Candidate {
    /// How the user named it (a path), used in every message.
    pub name: String,
    /// The device's size in bytes.
    pub device_bytes: u64,
    /// The decoded superblock, or why it did not decode.
    pub superblock: Result<Superblock, RaidError>,
}

impl Candidate {
    /// Decodes `superblock_bytes` (the 4 KiB at byte 4096 of the device).
    pub fn from_bytes(name: impl Into<String>, device_bytes: u64, superblock_bytes: &[u8]) -> Candidate {
        Candidate { name: name.into(), device_bytes, superblock: Superblock::decode(superblock_bytes) }
    }
}

/// The plan for running one array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembly {
    /// The array's metadata: array fields from the freshest superblock, one member record per
    /// used candidate (active members in role order, then spares).
    pub metadata: ArrayMetadata,
    /// Indexed by role: the candidate index serving it (`None` = missing).
    pub members: Vec<Option<usize>>,
    /// `metadata.members[k]` describes `candidates[member_candidates[k]]`.
    pub member_candidates: Vec<usize>,
    /// Candidates that are spares of this array (size-checked, usable for rebuilds).
    pub spares: Vec<usize>,
    /// Candidates the freshest superblock records as failed; not used.
    pub faulty: Vec<usize>,
    /// Roles with no member.
    pub missing_roles: Vec<usize>,
    /// Roles whose member is only partly rebuilt (`recovery_offset`); they count as missing for
    /// redundancy until the rebuild finishes.
    pub recovering_roles: Vec<usize>,
    /// Members too far behind (`events + 1 < freshest`): name and their event count. Not used.
    pub stale: Vec<(String, u64)>,
    /// Indices into `metadata.members` of those used whose own superblock is one update
    /// behind the freshest (a crash while it was written): `md::start` writes theirs again
    /// before anything else.
    pub behind: Vec<usize>,
    /// The candidate that is the array's write journal (raid4/5/6, feature `JOURNAL`).
    pub journal: Option<usize>,
    /// The array has a journal but no usable journal device was given: md serves it read-only.
    pub journal_missing: bool,
    /// The array was not shut down clean (`resync_offset != MaxSector`).
    pub dirty: bool,
    /// Some role is missing or rebuilding.
    pub degraded: bool,
    /// Things the operator should know (bitmap/bad blocks not used yet, stale members, ...).
    pub notices: Vec<String>,
}

impl Assembly {
    /// Index into `metadata.members` of the record for `candidates[candidate]`, if used.
    pub fn member_index_of_candidate(&self, candidate: usize) -> Option<usize> {
        self.member_candidates.iter().position(|&c| c == candidate)
    }

    /// A dirty, degraded raid4/5/6: parity of stripes being written at the crash may be wrong, so
    /// rebuilding the missing member's data from it can return garbage (the write hole). The
    /// kernel refuses to start such an array unless told to (`start_dirty_degraded`).
    /// Roles that hold only parity (raid4's, a raid6 `*-6` layout's Q: `parity_only_roles`)
    /// are safe to miss: the data is all there and the resync recomputes the parity.
    pub fn parity_untrusted(&self) -> bool {
        let meta = &self.metadata;
        let parity_only = |layout: u32, roles: usize| match ParityLayout::from_md(layout) {
            Some(layout) if meta.level.parity_blocks() > 0 => layout.parity_only_roles(meta.level, roles),
            _ if meta.level == Level::Raid4 => vec![roles - 1],
            _ => Vec::new(),
        };
        let roles = self.members.len();
        // Going forward, a member filling a missing role holds the new layout below the front
        // (the reshape recovers it) and stood for a parity-only role of the old one.
        let (missing_parity, recovering_parity) = if meta.is_reshaping() && meta.delta_disks >= 0 {
            let old_roles = (i64::from(meta.raid_disks) - i64::from(meta.delta_disks)) as usize;
            (parity_only(meta.new_layout, roles), parity_only(meta.layout, old_roles.min(roles)))
        } else {
            (parity_only(meta.layout, roles), parity_only(meta.layout, roles))
        };
        let data_missing = self.missing_roles.iter().any(|role| !missing_parity.contains(role))
            || self.recovering_roles.iter().any(|role| !recovering_parity.contains(role));
        self.dirty
            && data_missing
            && meta.level.parity_blocks() > 0
            && meta.ppl_area().is_none()
            && self.journal.is_none()
    }
}

fn cannot(message: String) -> RaidError {
    RaidError::new(ErrorKind::CannotAssemble, message)
}

fn join<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// Plans the assembly of the array the candidates belong to. Pure: see the module docs.
pub fn assemble(candidates: &[Candidate]) -> Result<Assembly, RaidError> {
    if candidates.is_empty() {
        return Err(cannot("cannot assemble: no member devices given".into()));
    }
    for (i, c) in candidates.iter().enumerate() {
        if let Some(earlier) = candidates[..i].iter().find(|o| o.name == c.name) {
            return Err(cannot(format!("cannot assemble: member {} is given twice", earlier.name)));
        }
    }

    // 1. Every named member must carry a valid superblock.
    let undecodable: Vec<String> = candidates
        .iter()
        .filter_map(|c| c.superblock.as_ref().err().map(|e| format!("{}: {}", c.name, e.message)))
        .collect();
    if !undecodable.is_empty() {
        return Err(RaidError::new(
            ErrorKind::BadMetadata,
            format!("cannot assemble: no usable md superblock on {}", undecodable.join("; ")),
        ));
    }
    let sbs: Vec<&Superblock> = candidates.iter().map(|c| c.superblock.as_ref().expect("checked above")).collect();

    // 2. The freshest active member defines the array.
    let freshest = (0..candidates.len())
        .filter(|&i| matches!(sbs[i].role(), DevRole::Active(_)))
        .max_by(|&a, &b| sbs[a].events.cmp(&sbs[b].events).then(b.cmp(&a)))
        .ok_or_else(|| {
            let roles = join(candidates.iter().zip(&sbs).map(|(c, sb)| format!("{} ({})", c.name, sb.role())));
            cannot(format!("cannot assemble: no member is active in an array, only {roles}"))
        })?;
    let fresh = sbs[freshest];
    let array_name = format!("{} array {:?}", fresh.level, fresh.name());
    check_single_array(candidates, &sbs, fresh.set_uuid)?;

    // 3. Classify each member.
    // Roles: `raid_disks`, or during a reshape that removes members the old count (the
    // members going keep their roles until it ends).
    let raid_disks = if fresh.feature_map.contains(FeatureMap::RESHAPE_ACTIVE) && fresh.delta_disks < 0 {
        (i64::from(fresh.raid_disks) - i64::from(fresh.delta_disks)) as usize
    } else {
        fresh.raid_disks as usize
    };
    let mut members: Vec<Option<usize>> = vec![None; raid_disks];
    let mut spares = Vec::new();
    let mut faulty = Vec::new();
    let mut stale = Vec::new();
    let mut recovering_roles = Vec::new();
    let mut journal: Option<usize> = None;
    let mut notices = Vec::new();
    let mut by_dev_number: BTreeMap<u32, usize> = BTreeMap::new();
    let mut by_device_uuid: BTreeMap<MdUuid, usize> = BTreeMap::new();
    for (i, (c, sb)) in candidates.iter().zip(&sbs).enumerate() {
        let own_role = sb.role();
        let behind = fresh.events.saturating_sub(sb.events);
        // A device behind the freshest cannot be trusted about its role (it may have been failed
        // in a write it missed): read it from the freshest table, as the kernel does.
        let fresh_role = || fresh.dev_roles.get(sb.dev_number as usize).copied();
        let role = if i == freshest || sb.events > fresh.events {
            own_role
        } else if behind == 0 {
            if sb.dev_roles != fresh.dev_roles {
                return Err(cannot(format!(
                    "cannot assemble {array_name}: {} and {} have the same event count {} but different role tables \
                     (split brain?)",
                    candidates[freshest].name, c.name, sb.events
                )));
            }
            own_role
        } else if behind == 1 {
            let role = fresh_role().ok_or_else(|| {
                cannot(format!(
                    "cannot assemble {array_name}: {} has dev_number {} which the freshest superblock (on {}) does \
                     not know",
                    c.name, sb.dev_number, candidates[freshest].name
                ))
            })?;
            if matches!(role, DevRole::Active(_)) && !matches!(own_role, DevRole::Active(_)) {
                // Activated in the write it missed: its own superblock never said it holds data.
                notices.push(format!(
                    "{} is active only in newer superblocks than its own; treated as a spare (needs a rebuild)",
                    c.name
                ));
                DevRole::Spare
            } else {
                role
            }
        } else {
            // More than one behind: a spare or failed device keeps the freshest's view of it; one
            // that is (or would be) active missed writes and is stale.
            let role = fresh_role().unwrap_or(DevRole::Spare);
            if matches!(own_role, DevRole::Active(_)) || matches!(role, DevRole::Active(_)) {
                notices.push(format!(
                    "{} is stale (events {}, array at {}) and is not used; add it back to rebuild it",
                    c.name, sb.events, fresh.events
                ));
                stale.push((c.name.clone(), sb.events));
                continue;
            }
            role
        };
        if behind == 1 {
            // It missed the last update, which may have changed the geometry (a takeover, a
            // reshape starting or ending): it takes the freshest's, as its role (the kernel
            // too reads the geometry from the freshest only).
            check_same_array(&array_name, &candidates[freshest].name, fresh, &c.name, sb)?;
        } else {
            check_same_geometry(&array_name, &candidates[freshest].name, fresh, &c.name, sb)?;
        }
        for (key_name, previous) in [
            ("dev_number", by_dev_number.insert(sb.dev_number, i)),
            ("device UUID", by_device_uuid.insert(sb.device_uuid, i)),
        ] {
            if let Some(other) = previous {
                return Err(cannot(format!(
                    "cannot assemble {array_name}: {} and {} have the same {key_name}; one is probably a copy of \
                     the other",
                    candidates[other].name, c.name
                )));
            }
        }
        for notice in sb.notices() {
            notices.push(format!("{}: {notice}", c.name));
        }
        match role {
            DevRole::Active(r) if usize::from(r) >= raid_disks => {
                return Err(cannot(format!(
                    "cannot assemble {array_name}: {} claims role {r} but the array has {raid_disks} roles",
                    c.name
                )));
            }
            DevRole::Active(_) if sb.feature_map.contains(FeatureMap::REPLACEMENT) => spares.push(i),
            DevRole::Active(r) => {
                let r = usize::from(r);
                if let Some(other) = members[r] {
                    return Err(cannot(format!(
                        "cannot assemble {array_name}: {} and {} both claim role {r}",
                        candidates[other].name, c.name
                    )));
                }
                members[r] = Some(i);
                if sb.recovery_offset().is_some() && !super::reshape::missed_forward_reshape_end(sb, fresh) {
                    recovering_roles.push(r);
                }
            }
            DevRole::Spare => spares.push(i),
            DevRole::Faulty => {
                notices.push(format!("{} is recorded as failed and is not used", c.name));
                faulty.push(i);
            }
            DevRole::Journal if !fresh.feature_map.contains(FeatureMap::JOURNAL) => {
                notices.push(format!("{}: a journal device of an array without a journal: not used", c.name));
            }
            DevRole::Journal if behind > 1 => {
                notices.push(format!(
                    "{} is a stale journal (events {}, array at {}): not used",
                    c.name, sb.events, fresh.events
                ));
            }
            DevRole::Journal => {
                if let Some(other) = journal {
                    return Err(cannot(format!(
                        "cannot assemble {array_name}: {} and {} are both its journal",
                        candidates[other].name, c.name
                    )));
                }
                journal = Some(i);
            }
        }
    }
    for &i in members.iter().flatten().chain(&spares) {
        check_fits(&array_name, &candidates[i], sbs[i], fresh)?;
    }

    // 4. Can it run?
    let missing_roles: Vec<usize> = (0..raid_disks).filter(|&r| members[r].is_none()).collect();
    let found = || {
        let mut parts = vec![format!(
            "found: {}",
            join(
                members.iter().enumerate().filter_map(|(r, m)| m.map(|i| format!("{} (role {r})", candidates[i].name)))
            )
        )];
        if !spares.is_empty() {
            parts.push(format!("spares: {}", join(spares.iter().map(|&i| &candidates[i].name))));
        }
        if !stale.is_empty() {
            parts.push(format!(
                "stale: {}",
                join(stale.iter().map(|(name, events)| format!("{name} (events {events} < {})", fresh.events)))
            ));
        }
        if !faulty.is_empty() {
            parts.push(format!("failed: {}", join(faulty.iter().map(|&i| &candidates[i].name))));
        }
        parts.join("; ")
    };
    let forward_reshape = fresh.feature_map.contains(FeatureMap::RESHAPE_ACTIVE)
        && fresh.delta_disks >= 0
        && matches!(fresh.level, Level::Raid4 | Level::Raid5 | Level::Raid6);
    let mut unavailable: Vec<usize> = missing_roles.iter().chain(&recovering_roles).copied().collect();
    unavailable.sort_unstable();
    let level = fresh.level;
    let geometry = if matches!(level, Level::Linear | Level::Raid0) && !missing_roles.is_empty() {
        None // no sizes for absent members, and no redundancy anyway
    } else {
        let member_sectors: Vec<u64> = match level {
            // Each member's data area as it is now (one that missed the last update, caught up).
            Level::Linear | Level::Raid0 => members
                .iter()
                .map(|m| {
                    m.map_or(0, |i| {
                        let mut member = ArrayMetadata::member_from_superblock(sbs[i]);
                        member.catch_up_with_reshape(sbs[i], fresh);
                        member.data_size
                    })
                })
                .collect(),
            _ => vec![fresh.size; raid_disks],
        };
        // Without RAID0_LAYOUT md treats a raid0 layout as unknown and refuses multi-zone arrays.
        let raid0_unknown_layout = level == Level::Raid0 && !fresh.feature_map.contains(FeatureMap::RAID0_LAYOUT);
        let layout = if raid0_unknown_layout { 0 } else { fresh.layout };
        Some(Geometry::new(level, layout, fresh.chunksize, &member_sectors).map_err(|e| {
            let hint = if raid0_unknown_layout && matches!(e, GeometryError::BadLayout { .. }) {
                " (the members differ in size and the superblock records no raid0 layout; set one with \
                 `mdadm --assemble --update=layout-original` or `layout-alternate`)"
            } else {
                ""
            };
            cannot(format!(
                "cannot assemble {array_name}: the superblock on {} describes an invalid geometry: {e}{hint}",
                candidates[freshest].name
            ))
        })?)
    };
    let runs = match &geometry {
        None => false,
        Some(_) if forward_reshape => {
            // A member filling a missing role holds the new layout below the front (the
            // reshape recovers it) and nothing of the old one: each layout on its own terms.
            let old_roles = (i64::from(fresh.raid_disks) - i64::from(fresh.delta_disks)) as usize;
            let shaped = |layout, chunk, roles| Geometry::new(level, layout, chunk, &vec![fresh.size; roles]).ok();
            let old = shaped(fresh.layout, fresh.chunksize, old_roles.min(raid_disks));
            let new = shaped(fresh.new_layout, fresh.new_chunk, raid_disks);
            old.is_some_and(|g| g.survives(&unavailable)) && new.is_some_and(|g| g.survives(&missing_roles))
        }
        Some(g) => unavailable.is_empty() || g.survives(&unavailable),
    };
    if !runs {
        let at_most = geometry.as_ref().map_or(0, Geometry::max_failures);
        let rebuilding = if recovering_roles.is_empty() {
            String::new()
        } else {
            format!(" (roles {} are only partly rebuilt and count as missing)", join(&recovering_roles))
        };
        // Its own kind: the set is consistent but too small to run (mdadm --detail --test: 2).
        return Err(RaidError::new(
            ErrorKind::ArrayFailed,
            format!(
                "cannot assemble {array_name}: {} of {raid_disks} members missing (roles {}){rebuilding}; {level} \
                 survives at most {at_most}; {}",
                unavailable.len(),
                join(&unavailable),
                found()
            ),
        ));
    }

    let mut metadata = ArrayMetadata::from_superblock(fresh);
    let member_candidates: Vec<usize> = members.iter().flatten().chain(&spares).chain(&journal).copied().collect();
    let behind: Vec<usize> =
        (0..member_candidates.len()).filter(|&k| sbs[member_candidates[k]].events < fresh.events).collect();
    metadata.members = member_candidates
        .iter()
        .map(|&i| {
            let mut member = ArrayMetadata::member_from_superblock(sbs[i]);
            member.catch_up_with_reshape(sbs[i], fresh);
            member
        })
        .collect();
    if let Some(j) = journal {
        metadata.journal_tail = sbs[j].recovery_offset;
        metadata.members.last_mut().expect("the journal's record").recovery_offset = None;
    }
    let journal_missing = metadata.has_journal() && journal.is_none();
    if journal_missing {
        notices.push(format!(
            "{array_name} has a write journal that is missing or stale: it is served read-only (as md does)"
        ));
    }
    if let Some(reshape) = metadata.reshape_state().map_err(|e| cannot(format!("cannot assemble {e}")))? {
        notices.push(format!(
            "{array_name} is being reshaped from {} to {} members ({} of {} array sectors done); serving it continues the reshape",
            reshape.previous_raid_disks,
            metadata.raid_disks,
            reshape.done_sectors(),
            reshape.end_sectors
        ));
    }
    let dirty = !fresh.is_clean();
    let degraded = !unavailable.is_empty();
    if degraded && journal.is_some() {
        notices.push(format!(
            "{array_name} is degraded: its write journal is replayed at start, which makes every stripe \
             written around a crash whole again"
        ));
    } else if dirty && degraded && level.parity_blocks() > 0 && metadata.ppl_area().is_some() {
        notices.push(format!(
            "{array_name} is dirty and degraded: its partial parity log is replayed at start, which makes the \
             parity of the stripes written around the crash right again"
        ));
    }
    let mut assembly = Assembly {
        metadata,
        members,
        member_candidates,
        spares,
        faulty,
        missing_roles,
        recovering_roles,
        stale,
        behind,
        journal,
        journal_missing,
        dirty,
        degraded,
        notices,
    };
    if assembly.parity_untrusted() {
        assembly.notices.push(format!(
            "{array_name} is dirty and degraded: parity written around the crash may be wrong, so data rebuilt from \
             it may be too (md refuses to start such an array unless forced)"
        ));
    }
    Ok(assembly)
}

/// All candidates must carry `uuid`; otherwise name every group.
fn check_single_array(candidates: &[Candidate], sbs: &[&Superblock], uuid: MdUuid) -> Result<(), RaidError> {
    if sbs.iter().all(|sb| sb.set_uuid == uuid) {
        return Ok(());
    }
    let mut groups: Vec<(MdUuid, String, Vec<&str>)> = Vec::new();
    for (c, sb) in candidates.iter().zip(sbs) {
        match groups.iter_mut().find(|g| g.0 == sb.set_uuid) {
            Some(group) => group.2.push(&c.name),
            None => groups.push((sb.set_uuid, sb.name(), vec![&c.name])),
        }
    }
    // The chosen array first.
    groups.sort_by_key(|g| g.0 != uuid);
    let described = groups
        .iter()
        .map(|(uuid, name, names)| format!("{} in array {name:?} (UUID {uuid})", names.join(", ")))
        .collect::<Vec<_>>();
    Err(cannot(format!(
        "cannot assemble: the devices belong to {} different arrays: {}",
        groups.len(),
        described.join("; ")
    )))
}

/// The kernel refuses members whose level/layout/chunk differ from the reference ("strangely
/// different superblock"); mdadm also compares ctime and raid_disks.
fn check_same_geometry(
    array_name: &str,
    fresh_name: &str,
    fresh: &Superblock,
    name: &str,
    sb: &Superblock,
) -> Result<(), RaidError> {
    let differs = [
        ("level", sb.level != fresh.level),
        ("layout", sb.layout != fresh.layout),
        ("chunk size", sb.chunksize != fresh.chunksize),
        ("raid_disks", sb.raid_disks != fresh.raid_disks),
        ("creation time", sb.ctime != fresh.ctime),
    ];
    let what: Vec<&str> = differs.iter().filter(|(_, d)| *d).map(|(w, _)| *w).collect();
    if what.is_empty() {
        return Ok(());
    }
    Err(cannot(format!(
        "cannot assemble {array_name}: {name} has the same UUID as {fresh_name} but a different {}",
        what.join(", ")
    )))
}

/// A device one update behind the freshest: created with it (the same creation time).
fn check_same_array(
    array_name: &str,
    fresh_name: &str,
    fresh: &Superblock,
    name: &str,
    sb: &Superblock,
) -> Result<(), RaidError> {
    if sb.ctime == fresh.ctime {
        return Ok(());
    }
    Err(cannot(format!(
        "cannot assemble {array_name}: {name} has the same UUID as {fresh_name} but a different creation time"
    )))
}

/// The device must hold what its superblock describes (kernel `super_1_load`, mdadm `load_super1`),
/// and for levels with a component size each member must hold it.
fn check_fits(array_name: &str, c: &Candidate, sb: &Superblock, fresh: &Superblock) -> Result<(), RaidError> {
    let device_sectors = c.device_bytes / SECTOR_BYTES;
    let needs_data = sb.data_offset.saturating_add(sb.data_size);
    if device_sectors < needs_data {
        return Err(cannot(format!(
            "cannot assemble {array_name}: {} is too small: {device_sectors} sectors, its superblock needs data_offset \
             {} + data_size {} = {needs_data}",
            c.name, sb.data_offset, sb.data_size
        )));
    }
    if fresh.level != Level::Linear && fresh.level != Level::Raid0 && sb.data_size < fresh.size {
        return Err(cannot(format!(
            "cannot assemble {array_name}: {} has data_size {} sectors, smaller than the array's component size {}",
            c.name, sb.data_size, fresh.size
        )));
    }
    Ok(())
}
