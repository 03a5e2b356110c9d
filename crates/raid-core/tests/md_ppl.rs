//! md's partial parity log against the Linux kernel's own bytes (fixtures/mdadm-ppl, made in
//! the VM rig by `deploy/vm/run-all.sh --only md-ppl-fixtures`: mdadm 4.2, Linux 6.1):
//! create places the area as mdadm does, our empty header is the kernel's byte for byte, the
//! kernel's headers decode, and replaying the kernel's log after a simulated crash rewrites
//! parity exactly as the kernel's own replay did. Then raidnbd's own log: a dirty, degraded
//! raid5 with PPL starts read-write, with the data written before the crash.

use std::path::PathBuf;
use std::sync::Arc;

use futures::executor::block_on;
use raid_core::geometry::Level;
use raid_core::md::ppl::{PPL_HEADER_BYTES, PplHeader, newest_header, ppl_checksum, ppl_signature};
use raid_core::md::{self, CreateParams, FeatureMap, MdUuid, SUPERBLOCK_BYTE_OFFSET, StartOptions, Superblock};
use raid_core::{AlignedBuf, Member, MemoryMember};

mod md_common;

/// Named `md` so that `cargo test -p raid-core md` selects these tests.
mod md_ppl {
    use super::*;

    const UUID: &str = "72616964:6e626400:00000000:000000f1";
    const MEMBER_BYTES: u64 = 64 << 20;
    const AREA_AT: usize = 8192;
    const DATA_AT: u64 = 4096 * 512;

    fn fixture(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mdadm-ppl").join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn uuid() -> MdUuid {
        UUID.parse().unwrap()
    }

    #[test]
    fn create_places_the_log_as_mdadm_and_the_empty_header_is_the_kernels() {
        let kernel = fixture("ppl5-created-m0.bin");
        let theirs = Superblock::decode(&kernel[4096..8192]).unwrap_or_else(|e| panic!("{}", e.message));
        let sizes = vec![Some(MEMBER_BYTES); 4];
        let params = CreateParams {
            level: Level::Raid5,
            layout: None,
            chunk_sectors: Some(128),
            name: "ppl5",
            homehost: Some("rig"),
            uuid: Some(uuid()),
            members_bytes: &sizes,
            ppl: true,
            journal_bytes: None,
        };
        let meta = md::create(&params, 0, &mut || MdUuid([1; 16])).unwrap();
        let ours = meta.superblock_for(0);
        assert_eq!(ours.feature_map, FeatureMap::PPL);
        assert_eq!(theirs.feature_map, FeatureMap::PPL);
        assert_eq!(ours.bitmap_offset, theirs.bitmap_offset, "ppl.offset and ppl.size");
        assert_eq!(meta.ppl_area(), Some((8, 2048)));
        assert_eq!((ours.data_offset, ours.data_size, ours.size), (theirs.data_offset, theirs.data_size, theirs.size));
        assert_eq!((ours.bblog_offset, ours.bblog_size), (theirs.bblog_offset, theirs.bblog_size));
        let empty = PplHeader { signature: ppl_signature(uuid().0), generation: 0, entries: Vec::new() }.encode();
        assert_eq!(&kernel[AREA_AT..AREA_AT + PPL_HEADER_BYTES], &empty[..], "the kernel's empty header");
    }

    #[test]
    fn the_kernels_headers_decode_with_their_partial_parity() {
        let sig = ppl_signature(uuid().0);
        // (member, newest header offset, generation, entries) as the kernel left them.
        for (m, at, generation, entries) in [(0, 0, 0, 0), (1, 16384, 9, 2), (2, 49152, 4, 1), (3, 8192, 8, 1)] {
            let mut head = fixture(&format!("ppl5-written-m{m}.bin"));
            head.resize(AREA_AT + (1 << 20), 0);
            let area = &head[AREA_AT..];
            let (found_at, header) = newest_header(area, sig).expect("a valid header");
            assert_eq!((found_at, header.generation, header.entries.len()), (at, generation, entries), "m{m}");
            let mut pp_at = at + PPL_HEADER_BYTES;
            for e in &header.entries {
                let pp = &area[pp_at..pp_at + e.pp_size as usize];
                assert_eq!(ppl_checksum(pp), e.checksum, "m{m}: entry {e:?}");
                assert_eq!(e.parity_disk, m as u32);
                pp_at += pp.len();
            }
        }
    }

    /// Member images: the head (superblock and log), the data area, zeros elsewhere.
    fn member_from(head: &[u8], data: &[u8], i: usize) -> Arc<MemoryMember> {
        let m = Arc::new(MemoryMember::new(format!("m{i}"), MEMBER_BYTES));
        block_on(m.write_at(0, AlignedBuf::from_slice(&padded(head)), false)).0.unwrap();
        block_on(m.write_at(DATA_AT, AlignedBuf::from_slice(&padded(data)), false)).0.unwrap();
        m
    }

    fn padded(bytes: &[u8]) -> Vec<u8> {
        let mut v = bytes.to_vec();
        v.resize(bytes.len().next_multiple_of(4096), 0);
        v
    }

    fn start(members: &[Arc<MemoryMember>], options: StartOptions) -> md::Started<dyn Member> {
        let members: Vec<Arc<dyn Member>> = members.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
        block_on(md::start(&md_common::assemble(&members), &members, options)).expect("start")
    }

    #[test]
    fn replaying_the_kernels_log_rewrites_parity_as_the_kernel_did() {
        // The crash the VM rig simulated: the logs and data as the running kernel left them
        // (superblocks dirty), then four parity chunks overwritten with 0xEE.
        let members: Vec<Arc<MemoryMember>> = (0..4)
            .map(|i| {
                let head = fixture(&format!("ppl5-written-m{i}.bin"));
                member_from(&head, &fixture(&format!("ppl5-written-m{i}.data.bin")), i)
            })
            .collect();
        for (m, chunk_at) in [(3, 0u64), (2, 64 << 10), (2, 320 << 10), (1, 640 << 10)] {
            let ee = AlignedBuf::from_slice(&[0xEE; 64 << 10]);
            block_on(members[m].write_at(DATA_AT + chunk_at, ee, false)).0.unwrap();
        }
        let started = start(&members, StartOptions::default());
        assert!(!started.forced_read_only);
        for (i, m) in members.iter().enumerate() {
            let want = padded(&fixture(&format!("ppl5-recovered-m{i}.data.bin")));
            let (res, got) = block_on(m.read_at(DATA_AT, AlignedBuf::zeroed(want.len())));
            res.unwrap();
            let first_diff = got.as_slice().iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(first_diff, None, "m{i}: data area differs from the kernel's replay at this byte");
        }
        // Like the kernel: parity the newest headers did not cover stays stale; a check finds it.
        let counts =
            block_on(started.array.maintenance().scrub(0, started.array.maintenance().scrub_units(), false)).unwrap();
        assert_eq!(counts.mismatch_sectors, 416, "the kernel's check after its replay: mismatch_cnt 416");
    }

    fn create(ppl: bool) -> Vec<Arc<MemoryMember>> {
        let sizes = vec![Some(8 << 20); 4];
        let params = CreateParams {
            level: Level::Raid5,
            layout: None,
            chunk_sectors: Some(128),
            name: "ppl",
            homehost: None,
            uuid: Some(MdUuid([9; 16])),
            members_bytes: &sizes,
            ppl,
            journal_bytes: None,
        };
        let mut n = 0u8;
        let meta = md::create(&params, 1_700_000_000, &mut || {
            n += 1;
            MdUuid([n; 16])
        })
        .unwrap();
        let empty = PplHeader { signature: ppl_signature(meta.uuid.0), generation: 0, entries: Vec::new() }.encode();
        (0..4)
            .map(|i| {
                let m = Arc::new(MemoryMember::new(format!("m{i}"), 8 << 20));
                let image = meta.superblock_for(i).encode();
                block_on(m.write_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::from_slice(&image), true)).0.unwrap();
                block_on(m.write_at(AREA_AT as u64, AlignedBuf::from_slice(&empty), true)).0.unwrap();
                m
            })
            .collect()
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
    }

    #[test]
    fn a_dirty_degraded_raid5_with_ppl_serves_read_write_and_needs_no_resync() {
        let members = create(true);
        let started = start(&members, StartOptions::default());
        // Durable data in every chunk of stripe 0, then a partial write the crash tears:
        // its data reaches one member, its parity does not.
        block_on(started.array.write(0, &pattern(1, 3 << 16), true)).unwrap();
        let stats = started.array.write_hole_stats().parity_log().expect("a parity log");
        assert!(stats.headers_written >= 1 && stats.entries_logged >= 1, "{stats:?}");
        drop(started);
        let torn = pattern(2, 4096);
        // Chunk 1 of stripe 0 lives on role 1 (left-symmetric, parity on role 3).
        let mut log_write = None;
        {
            let started = start(&members, StartOptions::default());
            assert!(!started.array.maintenance().status().resync_pending, "clean");
            block_on(started.array.write(1 << 16, &torn, false)).unwrap();
            log_write.replace(started.array.write_hole_stats().parity_log().unwrap());
            // Crash now; undo the parity write (the crash kept only the data write).
            drop(started);
        }
        assert!(log_write.unwrap().entries_logged >= 1);
        let old_parity = xor3(&pattern(1, 3 << 16));
        block_on(members[3].write_at(DATA_AT_SMALL, AlignedBuf::from_slice(&old_parity), false)).0.unwrap();
        // Role 0 (chunk 0, durable, never rewritten) is lost: rebuilt from parity, it is right
        // only if the replay fixed the parity.
        let started = start(&members[1..], StartOptions::default());
        assert!(!started.forced_read_only && !started.array.is_read_only(), "PPL closes the write hole");
        assert_eq!(block_on(started.array.read(0, 1 << 16)).unwrap().to_vec(), pattern(1, 3 << 16)[..1 << 16]);
        assert_eq!(block_on(started.array.read(1 << 16, 4096)).unwrap().to_vec(), torn);
        block_on(started.array.write(8 << 16, &pattern(3, 4096), false)).unwrap();
        assert!(!started.array.maintenance().status().resync_pending);
    }

    /// A write in flight at the crash on two data blocks of a row, one of them on the member
    /// lost afterwards: parity there matches neither old nor new data, so the lost block
    /// cannot be rebuilt. Its parity rows are marked bad (md's bad-block log, which mdadm
    /// reads): reads of it fail instead of returning garbage, across restarts and a rebuild,
    /// until a write makes the row right again.
    #[test]
    fn a_lost_block_that_was_in_flight_reads_as_an_error_until_rewritten() {
        let members = create(true);
        let durable = pattern(1, 3 << 16);
        {
            let started = start(&members, StartOptions::default());
            block_on(started.array.write(0, &durable, true)).unwrap();
            block_on(started.array.shutdown()).unwrap();
        }
        // In flight: all of chunk 0 (role 0) and the first 4 KiB of chunk 1 (role 1); rows
        // 0..8 of stripe 0 have two modified data blocks. The crash kept the write on role 1
        // and on parity (role 3), not on role 0.
        {
            let started = start(&members, StartOptions::default());
            block_on(started.array.write(0, &pattern(2, (1 << 16) + 4096), false)).unwrap();
            drop(started); // crash
        }
        block_on(members[0].write_at(DATA_AT_SMALL, AlignedBuf::from_slice(&durable[..1 << 16]), false)).0.unwrap();
        let survivors: Vec<Arc<MemoryMember>> = [0, 2, 3].iter().map(|&i| members[i].clone()).collect();
        let lost_row = |array: &raid_core::engine::Array<dyn Member>| block_on(array.read(1 << 16, 4096));
        {
            let started = start(&survivors, StartOptions::default());
            assert!(!started.array.is_read_only());
            let err = lost_row(&started.array).expect_err("the lost block's in-flight rows must not be rebuilt");
            assert_eq!(err.kind, raid_core::ErrorKind::Io, "{err}");
            // The rows where only role 0 was written were replayed: role 1 rebuilds right.
            let rest = block_on(started.array.read((1 << 16) + 4096, (1 << 16) - 4096)).unwrap().to_vec();
            assert_eq!(rest, durable[(1 << 16) + 4096..2 << 16]);
            assert_eq!(block_on(started.array.read(0, 1 << 16)).unwrap().to_vec(), durable[..1 << 16]);
            assert_eq!(started.array.admin().bad_blocks(3).ranges(), &[(0, 8)], "the parity rows of stripe 0 (role 3)");
            // Another block of those rows still takes writes; parity stays bad.
            block_on(started.array.write(0, &pattern(4, 4096), true)).unwrap();
            assert_eq!(block_on(started.array.read(0, 4096)).unwrap().to_vec(), pattern(4, 4096));
            assert!(lost_row(&started.array).is_err());
            block_on(started.array.shutdown()).unwrap();
        }
        // mdadm reads the mark from the parity member's log (device sectors: data at 4096).
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("m3.img");
        std::fs::write(&image, members[3].snapshot()).unwrap();
        let out =
            std::process::Command::new(md_common::mdadm()).arg("--examine-badblocks").arg(&image).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("4096 for 8 sectors"), "mdadm --examine-badblocks: {text}");
        // After a restart, and after a rebuild onto a new member: still an error.
        let spare = Arc::new(MemoryMember::new("m4", 8 << 20));
        {
            let started = start(&survivors, StartOptions::default());
            assert!(lost_row(&started.array).is_err(), "the mark survives a restart");
            block_on(started.array.admin().add_spare(spare.clone() as Arc<dyn Member>)).unwrap();
            while block_on(started.array.maintenance().step(1 << 20)).unwrap() != raid_core::engine::Step::Idle {}
            assert!(started.array.admin().is_optimal());
            assert_eq!(started.array.admin().bad_blocks(1).ranges(), &[(0, 8)], "the rebuilt member has the rows bad");
            assert!(lost_row(&started.array).is_err());
            let counts =
                block_on(started.array.maintenance().scrub(0, started.array.maintenance().scrub_units(), false))
                    .unwrap();
            assert_eq!((counts.mismatch_sectors, counts.skipped_bad_sectors), (0, 8));
            // Rewriting the lost rows makes them right (parity from readable data) and clears both marks.
            block_on(started.array.write(1 << 16, &pattern(5, 4096), false)).unwrap();
            assert_eq!(lost_row(&started.array).unwrap().to_vec(), pattern(5, 4096));
            assert!(started.array.admin().bad_blocks(1).is_empty() && started.array.admin().bad_blocks(3).is_empty());
            block_on(started.array.shutdown()).unwrap();
        }
        let all = vec![members[0].clone(), spare, members[2].clone(), members[3].clone()];
        let started = start(&all, StartOptions::default());
        assert_eq!(lost_row(&started.array).unwrap().to_vec(), pattern(5, 4096));
        let counts =
            block_on(started.array.maintenance().scrub(0, started.array.maintenance().scrub_units(), false)).unwrap();
        assert_eq!((counts.mismatch_sectors, counts.skipped_bad_sectors), (0, 0));
    }

    /// The same write, landed whole before the crash (acknowledged, never flushed): its data
    /// checksums in the log header show it, so the lost block is rebuilt as its new data and
    /// nothing is marked bad.
    #[test]
    fn a_lost_block_of_a_write_that_landed_whole_reads_back() {
        let members = create(true);
        {
            let started = start(&members, StartOptions::default());
            block_on(started.array.write(0, &pattern(1, 3 << 16), true)).unwrap();
            block_on(started.array.shutdown()).unwrap();
        }
        let new = pattern(2, (1 << 16) + 4096);
        {
            let started = start(&members, StartOptions::default());
            block_on(started.array.write(0, &new, false)).unwrap();
            drop(started); // crash: the header still names the write
        }
        let survivors: Vec<Arc<MemoryMember>> = [0, 2, 3].iter().map(|&i| members[i].clone()).collect();
        let started = start(&survivors, StartOptions::default());
        assert_eq!(block_on(started.array.read(0, new.len())).unwrap().to_vec(), new);
        assert!(started.array.admin().bad_blocks(3).is_empty());
    }

    /// Stripe 2 of `create`'s arrays: parity on role 1 (left-symmetric), data on roles 2, 3, 0.
    const STRIPE2: u64 = 6 << 16;

    /// Role 1 failed, removed, added again as a spare and rebuilt, while stripe 2 changed:
    /// its log area held headers (of an earlier life) with partial parity of data changed
    /// since. Returns the started array and what stripe 2 holds.
    fn member_back_in_role_1(members: &[Arc<MemoryMember>]) -> (md::Started<dyn Member>, Vec<u8>) {
        let started = start(members, StartOptions::default());
        let array = &started.array;
        let mut want = pattern(1, 3 << 16);
        block_on(array.write(STRIPE2, &want, true)).unwrap();
        // A small write: a header on role 1 whose partial parity holds chunks 1 and 2's data.
        block_on(array.write(STRIPE2, &pattern(2, 4096), false)).unwrap();
        block_on(array.flush()).unwrap();
        block_on(array.admin().fail_role(1)).unwrap();
        // While role 1 is away, chunk 1 of the stripe changes (no parity to write).
        block_on(array.write(STRIPE2 + (1 << 16), &pattern(3, 4096), true)).unwrap();
        block_on(array.admin().remove_device("m1")).unwrap();
        block_on(array.admin().add_spare(members[1].clone() as Arc<dyn Member>)).unwrap();
        while block_on(array.maintenance().step(1 << 20)).unwrap() != raid_core::engine::Step::Idle {}
        assert!(array.admin().is_optimal());
        want[..4096].copy_from_slice(&pattern(2, 4096));
        want[1 << 16..(1 << 16) + 4096].copy_from_slice(&pattern(3, 4096));
        assert_eq!(block_on(array.read(STRIPE2, want.len())).unwrap().to_vec(), want);
        // A write elsewhere (parity on role 3) keeps the array dirty.
        block_on(array.write(0, &pattern(4, 4096), true)).unwrap();
        (started, want)
    }

    /// After the crash: no mismatch, and with role 3 (chunk 1 of stripe 2) lost, chunk 1 is
    /// rebuilt right from role 1's parity.
    fn stripe2_survives_a_lost_member(members: &[Arc<MemoryMember>], want: &[u8]) {
        let started = start(members, StartOptions::default());
        let counts =
            block_on(started.array.maintenance().scrub(0, started.array.maintenance().scrub_units(), false)).unwrap();
        assert_eq!(counts.mismatch_sectors, 0, "stripe 2's parity after the replay");
        drop(started);
        let survivors: Vec<Arc<MemoryMember>> = [0, 1, 2].iter().map(|&i| members[i].clone()).collect();
        let started = start(&survivors, StartOptions::default());
        assert!(!started.array.is_read_only());
        assert_eq!(block_on(started.array.read(STRIPE2, want.len())).unwrap().to_vec(), want);
    }

    /// A crash before the member's first new header must not replay its old ones. As md
    /// (`ppl_modify_log`), the area is cleared before the device takes the role.
    #[test]
    fn a_member_back_in_its_role_brings_no_stale_log_to_a_replay() {
        let members = create(true);
        let (started, want) = member_back_in_role_1(&members);
        drop(started); // crash
        stripe2_survives_a_lost_member(&members, &want);
    }

    /// The crash tears the member's first new header instead: its writes had not gone out
    /// (data follows the header), so there is nothing to replay and nothing stale to find.
    #[test]
    fn a_torn_first_header_on_a_member_new_to_its_role_replays_nothing() {
        let members = create(true);
        let (started, want) = member_back_in_role_1(&members);
        // The bytes stripe 2 already holds: a crash before the data went out looks the same.
        block_on(started.array.write(STRIPE2, &want[..4096], false)).unwrap();
        assert!(started.array.write_hole_stats().parity_log().unwrap().headers_written >= 2);
        drop(started); // crash, tearing the header
        block_on(members[1].write_at(AREA_AT as u64, AlignedBuf::zeroed(2048), false)).0.unwrap();
        let area = block_on(members[1].read_at(AREA_AT as u64, AlignedBuf::zeroed(1 << 20))).1;
        assert!(newest_header(area.as_slice(), ppl_signature([9; 16])).is_none(), "no valid header on role 1");
        stripe2_survives_a_lost_member(&members, &want);
    }

    /// Data offset of `create`'s 8 MiB members.
    const DATA_AT_SMALL: u64 = 4096 * 512;

    /// P of the first 4 KiB rows of one stripe from its three 64 KiB data chunks.
    fn xor3(data: &[u8]) -> Vec<u8> {
        let c = 1 << 16;
        (0..4096).map(|i| data[i] ^ data[c + i] ^ data[2 * c + i]).collect()
    }
}
