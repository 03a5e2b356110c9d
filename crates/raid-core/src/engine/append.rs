//! A linear array grows by appending members (md's `linear_add`, `mdadm --grow --add` on a
//! linear array): the new members' space follows the array's end, so no byte moves. One
//! superblock update (the new roles, `raid_disks`), made while every request pauses, then the
//! shape takes the longer geometry; a crash before it leaves the old array (the new devices
//! spares), after it the new one. New connections see the new size at once.

use std::sync::Arc;

use super::shape::Layout;
use super::slot::Device;
use super::{Array, META_LOCK_KEY, StateChange};
use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level, MAX_RAID_DISKS};
use crate::member::Member;

fn refused(message: String) -> RaidError {
    RaidError::new(ErrorKind::Refused, message)
}

impl<M: Member + ?Sized> Array<M> {
    /// Appends `devices` (new devices of the array) to a linear array.
    pub(crate) async fn append(&self, devices: Vec<Device<M>>) -> Result<()> {
        self.check_writable("grow")?;
        let paused = self.shape.pause().await;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let geometry = self.shape.load().layout().geometry().clone();
        debug_assert_eq!(geometry.level(), Level::Linear);
        let old_disks = geometry.raid_disks();
        let new_disks = old_disks + devices.len();
        if devices.is_empty() || new_disks > MAX_RAID_DISKS {
            return Err(refused(format!(
                "{new_disks} members: a grow adds 1 to {} members",
                MAX_RAID_DISKS - old_disks
            )));
        }
        let mut sectors: Vec<u64> = (0..old_disks).map(|r| geometry.member_sectors(r)).collect();
        sectors.extend(devices.iter().map(|d| d.member.len_bytes().saturating_sub(d.data_offset_bytes) / SECTOR_BYTES));
        let grown = Geometry::new(Level::Linear, geometry.layout(), geometry.chunk_sectors(), &sectors)
            .map_err(|e| refused(format!("the grown array: {e}")))?;
        let new_roles: Vec<(usize, usize)> = devices.iter().enumerate().map(|(i, d)| (d.id, old_disks + i)).collect();
        self.record_new_devices_locked(&devices, Some(StateChange::Append { raid_disks: new_disks, new_roles }))
            .await?;
        let added = self.members.take_spares(&devices);
        self.members.add_roles(added);
        self.shape.install(self.shape.next_shape(Arc::new(Layout::settled(grown)), None));
        drop(_g);
        drop(paused);
        tracing::info!(from = old_disks, to = new_disks, size_bytes = self.size_bytes(), "linear array grown");
        Ok(())
    }
}
