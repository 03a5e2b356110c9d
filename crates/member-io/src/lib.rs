//! member-io: backends implementing `raid_core::Member`. (skeleton)
