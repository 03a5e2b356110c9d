//! Detects what a device already holds, so `create` does not destroy it by accident:
//! md superblocks (v0.90, 1.0, 1.1, 1.2), filesystems and partition tables.

use anyhow::Result;
use raid_core::{AlignedBuf, Member};

/// Bytes read from the start of the member (covers the btrfs superblock at 64 KiB).
const PROBE_BYTES: u64 = 68 * 1024;

const MD_MAGIC_LE: [u8; 4] = 0xa92b_4efcu32.to_le_bytes();

/// A description of the first signature found, if any.
pub async fn find_signature(member: &dyn Member) -> Result<Option<String>> {
    let len = member.len_bytes();
    let head_len = len.min(PROBE_BYTES) / 4096 * 4096;
    let mut head = vec![0u8; PROBE_BYTES as usize];
    if head_len > 0 {
        let (res, buf) = member.read_at(0, AlignedBuf::zeroed(head_len as usize)).await;
        res?;
        head[..head_len as usize].copy_from_slice(buf.as_slice());
    }
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    let found = if at(4096, &MD_MAGIC_LE) {
        Some("an md superblock (v1.2)")
    } else if at(0, &MD_MAGIC_LE) {
        Some("an md superblock (v1.1)")
    } else if at(1080, &[0x53, 0xef]) {
        Some("an ext2/3/4 filesystem")
    } else if at(0, b"XFSB") {
        Some("an XFS filesystem")
    } else if at(0x10040, b"_BHRfS_M") {
        Some("a btrfs filesystem")
    } else if at(0, b"LUKS\xba\xbe") {
        Some("a LUKS volume")
    } else if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        Some("a swap area")
    } else if at(512, b"EFI PART") {
        Some("a GPT partition table")
    } else if at(512 + 24, b"LVM2") || at(512, b"LABELONE") {
        Some("an LVM physical volume")
    } else if at(510, &[0x55, 0xaa]) {
        Some("a boot sector or partition table")
    } else {
        None
    };
    if let Some(what) = found {
        return Ok(Some(what.to_string()));
    }
    // md v1.0 and v0.90 live near the end.
    if len >= 8192 + 12288 {
        let v10 = ((len / 512 - 16) & !7) * 512;
        let v090 = (len & !(64 * 1024 - 1)) - 64 * 1024;
        for (offset, what) in [(v10, "an md superblock (v1.0)"), (v090, "an md superblock (v0.90)")] {
            let (res, buf) = member.read_at(offset, AlignedBuf::zeroed(4096)).await;
            res?;
            let magic_090 = 0xa92b_4efcu32.to_ne_bytes();
            if buf.as_slice()[..4] == MD_MAGIC_LE || buf.as_slice()[..4] == magic_090 {
                return Ok(Some(what.to_string()));
            }
        }
    }
    Ok(None)
}
