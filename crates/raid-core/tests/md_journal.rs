//! md's write journal against the Linux kernel's own bytes (fixtures/mdadm-journal, made in
//! the VM rig by `deploy/vm/run-all.sh --only md-journal-fixtures`: mdadm 4.2, Linux 6.1):
//! the kernel's meta blocks decode and their pages check; its superblocks round-trip with the
//! tail; and replaying the kernel's log after the crash the rig simulated (every written page
//! of the members overwritten with 0xEE) rewrites the members byte for byte as the kernel's
//! replay did, and ends the log with the kernel's own empty meta block.

use std::path::PathBuf;
use std::sync::Arc;

use futures::executor::block_on;
use raid_core::md::journal::{JOURNAL_PAGE_BYTES, MetaBlock, Payload, crc32c_le, journal_seed};
use raid_core::md::{self, DevRole, MdUuid, StartOptions, Superblock};
use raid_core::{AlignedBuf, Member, MemoryMember};

mod md_common;

/// Named `md` so that `cargo test -p raid-core md` selects these tests.
mod md_journal {
    use super::*;

    const MEMBER_BYTES: u64 = 16 << 20;
    const DATA_AT: u64 = 2048 * 512;

    /// (name, members, journal bytes, UUID, DATA payloads, PARITY payloads of the written chain).
    const ARRAYS: [(&str, usize, u64, &str, usize, usize); 3] = [
        ("j6", 4, 32 << 20, "72616964:6e626400:00000000:000000a6", 56, 40),
        ("j5", 3, 16 << 20, "72616964:6e626400:00000000:000000a5", 22, 14),
        ("j4", 3, 16 << 20, "72616964:6e626400:00000000:000000a4", 6, 6),
    ];

    fn fixture(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mdadm-journal").join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    pub(super) fn padded(bytes: &[u8]) -> Vec<u8> {
        let mut v = bytes.to_vec();
        v.resize(bytes.len().next_multiple_of(4096), 0);
        v
    }

    /// A member's written data area, expanded from its sparse file (data-blocks.txt), and the
    /// list of its non-zero blocks.
    fn written_data(array: &str, i: usize) -> (Vec<u8>, Vec<usize>) {
        let name = format!("{array}-written-m{i}.data.bin");
        let index = String::from_utf8(fixture("data-blocks.txt")).unwrap();
        let line = index.lines().find(|l| l.starts_with(&format!("{name} "))).expect("listed");
        let mut words = line.split_whitespace().skip(1);
        let total: usize = words.next().unwrap().parse().unwrap();
        let blocks: Vec<usize> = words
            .flat_map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()
            })
            .collect();
        let sparse = fixture(&name);
        assert_eq!(sparse.len(), blocks.len() * 4096, "{name}");
        let mut data = vec![0u8; total * 4096];
        for (k, &b) in blocks.iter().enumerate() {
            data[b * 4096..(b + 1) * 4096].copy_from_slice(&sparse[k * 4096..(k + 1) * 4096]);
        }
        (data, blocks)
    }

    fn device(name: &str, bytes: u64, head: &[u8], at: u64, data: &[u8]) -> Arc<MemoryMember> {
        let m = Arc::new(MemoryMember::new(name.to_string(), bytes));
        block_on(m.write_at(0, AlignedBuf::from_slice(&padded(head)), false)).0.unwrap();
        block_on(m.write_at(at, AlignedBuf::from_slice(&padded(data)), false)).0.unwrap();
        m
    }

    fn superblock(head: &[u8]) -> Superblock {
        Superblock::decode(&padded(head)[4096..8192]).unwrap_or_else(|e| panic!("{}", e.message))
    }

    #[test]
    fn the_kernels_log_decodes_and_its_pages_check() {
        for (name, _, _, uuid, data_payloads, parity_payloads) in ARRAYS {
            let seed = journal_seed(uuid.parse::<MdUuid>().unwrap().0);
            let log = fixture(&format!("{name}-written-j.log.bin"));
            let tail = superblock(&fixture(&format!("{name}-written-j.head.bin"))).recovery_offset;
            assert_eq!(tail, 16, "{name}: the tail after the assembly");
            let (mut pos, mut seq, mut counts) = (tail as usize, None, (0, 0));
            while pos * 512 + JOURNAL_PAGE_BYTES <= log.len() {
                let Ok(mb) = MetaBlock::decode(&log[pos * 512..], seed) else { break };
                assert_eq!(mb.position, pos as u64, "{name}");
                assert!(seq.is_none_or(|s| mb.seq == s + 1), "{name}: seq follows");
                seq = Some(mb.seq);
                let mut page = pos * 512 + JOURNAL_PAGE_BYTES;
                for p in &mb.payloads {
                    let sums = match p {
                        Payload::Data { checksum, .. } => {
                            counts.0 += 1;
                            vec![*checksum]
                        }
                        Payload::Parity { checksums, .. } => {
                            counts.1 += 1;
                            checksums.clone()
                        }
                        Payload::Flush { .. } => panic!("{name}: write-through logs no flush payload"),
                    };
                    for sum in sums {
                        assert_eq!(crc32c_le(seed, &log[page..page + JOURNAL_PAGE_BYTES]), sum, "{name} at {pos}");
                        page += JOURNAL_PAGE_BYTES;
                    }
                }
                // Re-encoding gives the kernel's bytes.
                assert_eq!(&mb.encode(seed)[..], &log[pos * 512..pos * 512 + JOURNAL_PAGE_BYTES], "{name} at {pos}");
                pos += mb.unit_sectors() as usize;
            }
            assert_eq!(counts, (data_payloads, parity_payloads), "{name}: the payloads of the chain");
        }
    }

    #[test]
    fn the_journal_superblock_round_trips_with_its_tail() {
        for (name, ..) in ARRAYS {
            for state in ["created", "written", "reassembled"] {
                let head = padded(&fixture(&format!("{name}-{state}-j.head.bin")));
                let sb = superblock(&head);
                assert_eq!(sb.role(), DevRole::Journal, "{name}-{state}");
                let meta = md::ArrayMetadata::from_superblock(&sb);
                let mut meta =
                    md::ArrayMetadata { members: vec![md::ArrayMetadata::member_from_superblock(&sb)], ..meta };
                meta.journal_tail = sb.recovery_offset;
                meta.members[0].recovery_offset = None;
                assert!(meta.has_journal());
                assert_eq!(
                    meta.superblock_for(0).encode(),
                    head[4096..4096 + sb.encode().len()].to_vec(),
                    "{name}-{state}"
                );
            }
        }
    }

    #[test]
    fn replaying_the_kernels_log_rewrites_the_members_as_the_kernel_did() {
        for (name, members, journal_bytes, _, _, parity_payloads) in ARRAYS {
            // The crash the rig simulated: heads and log as the running kernel left them, every
            // written page of the members overwritten with 0xEE.
            let mut want = Vec::new();
            let mut devices: Vec<Arc<MemoryMember>> = (0..members)
                .map(|i| {
                    let (data, blocks) = written_data(name, i);
                    let mut crashed = data.clone();
                    for b in blocks {
                        crashed[b * 4096..(b + 1) * 4096].fill(0xEE);
                    }
                    want.push(data);
                    let head = fixture(&format!("{name}-written-m{i}.head.bin"));
                    device(&format!("m{i}"), MEMBER_BYTES, &head, DATA_AT, &crashed)
                })
                .collect();
            let log = fixture(&format!("{name}-written-j.log.bin"));
            let journal = device("j", journal_bytes, &fixture(&format!("{name}-written-j.head.bin")), DATA_AT, &log);
            devices.push(journal.clone());
            let as_dyn: Vec<Arc<dyn Member>> = devices.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
            let assembly = md_common::assemble(&as_dyn);
            assert_eq!(assembly.journal, Some(members), "{name}: the journal is found");
            let started = block_on(md::start(&assembly, &as_dyn, StartOptions::default())).expect("start");
            assert!(!started.forced_read_only && !started.array.maintenance().status().resync_pending, "{name}");
            for (i, want) in want.iter().enumerate() {
                let (res, got) = block_on(devices[i].read_at(DATA_AT, AlignedBuf::zeroed(want.len())));
                res.unwrap();
                let first_diff = got.as_slice().iter().zip(want).position(|(a, b)| a != b);
                assert_eq!(first_diff, None, "{name} m{i}: data area differs from the kernel's replay at this byte");
            }
            let counts =
                block_on(started.array.maintenance().scrub(0, started.array.maintenance().scrub_units(), false))
                    .unwrap();
            assert_eq!(counts.mismatch_sectors, 0, "{name}: the kernel's check after its replay: 0");
            let stats = started.array.write_hole_stats().journal().expect("a journal");
            assert_eq!(stats.used_sectors, 8, "{name}: only the new empty meta block is in use");
            // The log now ends as the kernel's did: its empty meta block, and the tail on it.
            let blocks = log.len() / JOURNAL_PAGE_BYTES;
            let kernel_empty = fixture(&format!("{name}-recovered-j.log-rest.bin"));
            let (res, ours) = block_on(journal.read_at(DATA_AT + (blocks * 4096) as u64, AlignedBuf::zeroed(4096)));
            res.unwrap();
            assert_eq!(ours.as_slice(), &kernel_empty[..4096], "{name}: the empty meta block after the replay");
            let area = block_on(md::read_superblock_area(journal.as_ref())).unwrap();
            let sb = Superblock::decode(&area).unwrap_or_else(|e| panic!("{}", e.message));
            assert_eq!(sb.recovery_offset, (blocks * 8) as u64, "{name}: journal_tail on the empty meta block");
            assert!(parity_payloads > 0);
        }
    }
}

/// Hostile logs: payloads that point outside the array or at the wrong sectors, with valid
/// checksums, end the replay there (what came before is replayed); nothing panics.
mod md_journal_hostile {
    use super::md_journal::padded;
    use super::*;

    #[test]
    fn payloads_no_writer_makes_end_the_replay_without_harm() {
        let uuid: MdUuid = "72616964:6e626400:00000000:000000a4".parse().unwrap();
        let seed = journal_seed(uuid.0);
        for (k, bad) in [
            Payload::Data { array_sector: u64::MAX - 7, checksum: 0, flags: 0 },
            Payload::Data { array_sector: 3, checksum: 0, flags: 0 },
            Payload::Parity { member_sector: 1 << 40, checksums: vec![0], flags: 0 },
            Payload::Parity { member_sector: 0, checksums: vec![0, 0], flags: 0 },
        ]
        .into_iter()
        .enumerate()
        {
            let read = |name: &str| {
                std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mdadm-journal").join(name))
                    .unwrap()
            };
            let mut log = read("j4-written-j.log.bin");
            // The unit at block 6 (seq +2 from the tail's) becomes one with a bad payload; its
            // page checksums stay right.
            let page = vec![0x5A; JOURNAL_PAGE_BYTES];
            let sum = crc32c_le(seed, &page);
            let bad = match bad {
                Payload::Data { array_sector, flags, .. } => Payload::Data { array_sector, checksum: sum, flags },
                Payload::Parity { member_sector, checksums, flags } => {
                    Payload::Parity { member_sector, checksums: vec![sum; checksums.len()], flags }
                }
                p => p,
            };
            let old = MetaBlock::decode(&log[6 * 4096..], seed).unwrap();
            let pages = bad.pages();
            let mb = MetaBlock { seq: old.seq, position: old.position, payloads: vec![bad] };
            log[6 * 4096..7 * 4096].copy_from_slice(&mb.encode(seed));
            for p in 0..pages {
                log[(7 + p) * 4096..(8 + p) * 4096].copy_from_slice(&page);
            }
            let head = read("j4-written-j.head.bin");
            let journal = Arc::new(MemoryMember::new("j".to_string(), 16 << 20));
            block_on(journal.write_at(0, AlignedBuf::from_slice(&padded(&head)), false)).0.unwrap();
            block_on(journal.write_at(2048 * 512, AlignedBuf::from_slice(&padded(&log)), false)).0.unwrap();
            let mut devices: Vec<Arc<dyn Member>> = (0..3)
                .map(|i| {
                    let m = Arc::new(MemoryMember::new(format!("m{i}"), 16 << 20));
                    let head = read(&format!("j4-written-m{i}.head.bin"));
                    block_on(m.write_at(0, AlignedBuf::from_slice(&padded(&head)), false)).0.unwrap();
                    m as Arc<dyn Member>
                })
                .collect();
            devices.push(journal as Arc<dyn Member>);
            let started = block_on(md::start(&md_common::assemble(&devices), &devices, StartOptions::default()));
            let started = started.unwrap_or_else(|e| panic!("case {k}: {}", e.message));
            // The units before the bad one were replayed: row 0 of the first write is there.
            let w1 = read("j4-w1.data");
            let got = block_on(started.array.read(0, w1.len())).unwrap().to_vec();
            assert_eq!(got, w1, "case {k}: the unit before the bad one was replayed");
        }
    }
}
