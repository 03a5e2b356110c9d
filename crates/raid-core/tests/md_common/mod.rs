//! Helpers shared by the md_* integration tests: realistic superblocks, byte patching with a
//! recomputed checksum, running the real `mdadm --examine` on an image file, and assembling
//! devices from the superblocks on them; arrays on memory members (`in_memory`).

#![allow(dead_code)]

pub mod crash;
pub mod in_memory;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use futures::executor::block_on;
use raid_core::Member;
use raid_core::geometry::Level;
use raid_core::md::{
    self, Candidate, DevRole, FeatureMap, MdUuid, RESYNC_CLEAN, SB_CSUM_OFFSET, Superblock, sb_checksum,
};

/// The assembly of `devices` from the superblocks on them.
pub fn assemble(devices: &[Arc<dyn Member>]) -> md::Assembly {
    let candidates: Vec<Candidate> = devices
        .iter()
        .map(|m| {
            let area = block_on(md::read_superblock_area(m.as_ref())).unwrap();
            Candidate::from_bytes(m.name(), m.len_bytes(), &area)
        })
        .collect();
    md::assemble(&candidates).expect("assemble")
}

pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;

pub fn uuid(seed: u8) -> MdUuid {
    MdUuid(std::array::from_fn(|i| seed.wrapping_mul(17).wrapping_add(i as u8 * 13)))
}

pub fn name32(text: &str) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..text.len()].copy_from_slice(text.as_bytes());
    bytes
}

/// A raid5 member superblock shaped like mdadm 4.6 writes for 4 × 1 GiB members.
pub fn raid5_member(dev_number: u32) -> Superblock {
    let mut dev_roles = vec![DevRole::Spare; 128];
    for (slot, role) in dev_roles.iter_mut().enumerate().take(4) {
        *role = DevRole::Active(slot as u16);
    }
    Superblock {
        feature_map: FeatureMap::empty(),
        set_uuid: uuid(1),
        set_name: name32("testhost:data"),
        ctime: 1_700_000_000,
        level: Level::Raid5,
        layout: 2,
        size: 2_093_056,
        chunksize: 1024,
        raid_disks: 4,
        bitmap_offset: 0,
        new_level: 0,
        reshape_position: 0,
        delta_disks: 0,
        new_layout: 0,
        new_chunk: 0,
        new_offset: 0,
        data_offset: 4096,
        data_size: 2_093_056,
        super_offset: 8,
        recovery_offset: 0,
        dev_number,
        cnt_corrected_read: 0,
        device_uuid: uuid(100 + dev_number as u8),
        devflags: 0,
        bblog_shift: 0,
        bblog_size: 8,
        bblog_offset: 16,
        utime: 1_700_000_100,
        events: 42,
        resync_offset: RESYNC_CLEAN,
        logical_block_size: 0,
        dev_roles,
    }
}

/// Overwrites `value` at `at` and fixes the checksum, so only the patched field is wrong.
pub fn patch(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
    let max_dev = u32::from_le_bytes(bytes[220..224].try_into().unwrap()).min(1920);
    let csum = sb_checksum(bytes, max_dev);
    bytes[SB_CSUM_OFFSET..SB_CSUM_OFFSET + 4].copy_from_slice(&csum.to_le_bytes());
}

/// A fresh scratch directory under the system temp dir, removed on drop (raid-core has no
/// tempfile dev-dependency).
pub struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("raid-core-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        ScratchDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Path of `mdadm`, or a panic naming the Debian package.
pub fn mdadm() -> &'static str {
    for path in ["/usr/sbin/mdadm", "/sbin/mdadm"] {
        if Path::new(path).exists() {
            return path;
        }
    }
    panic!("mdadm is required for this test: install the Debian package `mdadm` (apt-get install mdadm)");
}

/// Writes a sparse image of `device_bytes` with `superblock` (4096 bytes) at byte 4096 and
/// returns `mdadm --examine` output.
pub fn examine(dir: &Path, file: &str, device_bytes: u64, superblock: &[u8]) -> String {
    use std::io::{Seek, SeekFrom, Write};
    let path = dir.join(file);
    let mut image = std::fs::File::create(&path).unwrap();
    image.set_len(device_bytes).unwrap();
    image.seek(SeekFrom::Start(4096)).unwrap();
    image.write_all(superblock).unwrap();
    drop(image);
    let out = Command::new(mdadm()).arg("--examine").arg(&path).output().expect("run mdadm --examine");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mdadm --examine {} failed: {}{}",
        path.display(),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The value after `key :` in `mdadm --examine` output, if the line is there.
pub fn field_opt<'a>(examine: &'a str, key: &str) -> Option<&'a str> {
    examine.lines().find_map(|line| {
        let (k, v) = line.split_once(" : ")?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// Checks a decoded superblock against the `mdadm --examine` text printed for the same device.
pub fn check_examine(sb: &Superblock, examine: &str) {
    use raid_core::md::DevRole;
    let context = format!("examine text:\n{examine}");
    assert!(field(examine, "Checksum").ends_with("- correct"), "mdadm found a bad checksum: {context}");
    assert_eq!(field(examine, "Magic"), "a92b4efc", "{context}");
    assert_eq!(field(examine, "Version"), "1.2", "{context}");
    assert_eq!(field(examine, "Array UUID"), sb.set_uuid.to_string(), "{context}");
    assert_eq!(field(examine, "Device UUID"), sb.device_uuid.to_string(), "{context}");
    assert!(field(examine, "Name").starts_with(&sb.name()), "{context}");
    assert_eq!(field(examine, "Raid Level"), sb.level.to_string(), "{context}");
    assert_eq!(field(examine, "Raid Devices"), sb.raid_disks.to_string(), "{context}");
    assert_eq!(field(examine, "Feature Map"), format!("{:#x}", sb.feature_map.bits()), "{context}");
    assert_eq!(field(examine, "Events"), sb.events.to_string(), "{context}");
    assert_eq!(field(examine, "Super Offset"), format!("{} sectors", sb.super_offset), "{context}");
    let avail = field(examine, "Avail Dev Size");
    assert!(avail.starts_with(&format!("{} sectors", sb.data_size)), "{context}");
    if sb.data_offset != 0 {
        assert_eq!(field(examine, "Data Offset"), format!("{} sectors", sb.data_offset), "{context}");
    }
    assert_eq!(field(examine, "State"), if sb.is_clean() { "clean" } else { "active" }, "{context}");
    let role = match sb.role() {
        DevRole::Active(r) if sb.feature_map.contains(FeatureMap::REPLACEMENT) => format!("Replacement device {r}"),
        DevRole::Active(r) => format!("Active device {r}"),
        DevRole::Journal => "Journal".to_string(),
        DevRole::Spare | DevRole::Faulty => "spare".to_string(),
    };
    assert_eq!(field(examine, "Device Role"), role, "{context}");
    if let Some(offset) = sb.recovery_offset() {
        assert_eq!(field(examine, "Recovery Offset"), format!("{offset} sectors"), "{context}");
    }
    if sb.bblog_size != 0 && sb.bblog_offset != 0 {
        let bbl = field(examine, "Bad Block Log");
        let want =
            format!("{} entries available at offset {} sectors", u32::from(sb.bblog_size) * 512 / 8, sb.bblog_offset);
        assert!(bbl.starts_with(&want), "{context}");
    }
    if let Some(chunk) = field_opt(examine, "Chunk Size") {
        assert_eq!(chunk, format!("{}K", sb.chunksize / 2), "{context}");
    }
    // Array State: one letter per role, counted over the role table as mdadm does.
    let state = field(examine, "Array State").split_whitespace().next().unwrap();
    let expected: String = (0..sb.raid_disks as usize)
        .map(|r| match sb.dev_roles.iter().filter(|x| x.active() == Some(r)).count() {
            0 => '.',
            1 => 'A',
            2 if sb.level != Level::Raid0 && sb.level != Level::Linear => 'R',
            _ => '?',
        })
        .collect();
    assert_eq!(state, expected, "{context}");
}

/// The value after `key :` in `mdadm --examine` output.
pub fn field<'a>(examine: &'a str, key: &str) -> &'a str {
    field_opt(examine, key).unwrap_or_else(|| panic!("no {key:?} in mdadm output:\n{examine}"))
}
