//! Property tests of the geometry over every level, layout, member count 2..8 and chunk
//! 4 KiB..4 MiB: the map is injective, stays inside the members, runs are contiguous,
//! stripes use every role once, and raid10 `survives` agrees with a brute-force check.
//! Array sizes are kept to a few chunks per member so each case walks its whole array.

use proptest::prelude::*;
use raid_core::geometry::{Geometry, GeometryError, Level, ParityLayout, Raid10Layout};

/// One generated array: what `Geometry::new` gets plus what every copy must fit in.
#[derive(Debug, Clone)]
struct Case {
    level: Level,
    layout: u32,
    chunk_sectors: u32,
    member_sectors: Vec<u64>,
}

fn raid10_layouts(n: usize) -> Vec<u32> {
    let mut layouts = Vec::new();
    for near_copies in 1..=n as u32 {
        for far_copies in 1..=n as u32 {
            for offset in [false, true] {
                let copies = near_copies * far_copies;
                // Offset with nc > 1 not dividing n is refused (md's formula overlaps chunks).
                let offset_overlaps = offset && near_copies > 1 && !n.is_multiple_of(near_copies as usize);
                if copies < 2 || copies as usize > n || (offset && far_copies == 1) || offset_overlaps {
                    continue;
                }
                layouts.push(Raid10Layout { near_copies, far_copies, offset }.to_md());
            }
        }
    }
    layouts
}

fn layouts(level: Level, n: usize) -> Vec<u32> {
    match level {
        Level::Raid4 | Level::Raid5 => (0..=5).collect(),
        Level::Raid6 => ParityLayout::ALL.iter().map(|l| *l as u32).collect(),
        Level::Raid10 => raid10_layouts(n),
        Level::Raid0 => vec![1, 2],
        Level::Linear | Level::Raid1 => vec![0],
    }
}

fn case() -> impl Strategy<Value = Case> {
    let levels = prop::sample::select(vec![
        Level::Linear,
        Level::Raid0,
        Level::Raid1,
        Level::Raid4,
        Level::Raid5,
        Level::Raid6,
        Level::Raid10,
    ]);
    (levels, 2usize..=8, 0u32..=10)
        .prop_filter("raid6 needs 4 members", |(level, n, _)| *level != Level::Raid6 || *n >= 4)
        .prop_flat_map(|(level, n, chunk_shift)| {
            let chunk = 8u64 << chunk_shift;
            // Unequal sizes for linear/raid0 (per-device data_size), one md `size` otherwise.
            let per_member = prop::collection::vec((1u64..=5, 0..chunk), n);
            let shared = (1u64..=9, 0..chunk).prop_map(move |s| vec![s; n]);
            let sizes = if matches!(level, Level::Linear | Level::Raid0) { per_member.boxed() } else { shared.boxed() };
            (Just(level), prop::sample::select(layouts(level, n)), Just(chunk_shift), sizes, any::<bool>())
        })
        .prop_map(|(level, layout, chunk_shift, sizes, linear_rounding)| {
            let chunk = 8u64 << chunk_shift;
            // raid10 needs fc chunks per member for one row of array chunks.
            let min_chunks =
                Raid10Layout::from_md(layout).filter(|_| level == Level::Raid10).map_or(1, |l| l.far_copies);
            let member_sectors =
                sizes.iter().map(|&(chunks, extra)| (chunks + u64::from(min_chunks) - 1) * chunk + extra).collect();
            let chunk_sectors = if level == Level::Linear && !linear_rounding { 0 } else { chunk as u32 };
            Case { level, layout, chunk_sectors, member_sectors }
        })
}

/// Used sectors of each role (every copy must end within it), checked against what was given.
fn usable(case: &Case, g: &Geometry) -> Result<Vec<u64>, TestCaseError> {
    let used: Vec<u64> = (0..g.raid_disks()).map(|r| g.member_sectors(r)).collect();
    for (role, &u) in used.iter().enumerate() {
        prop_assert!(u <= case.member_sectors[role], "role {} uses {} of {}", role, u, case.member_sectors[role]);
        if g.chunk_sectors() != 0 && case.level != Level::Raid1 {
            prop_assert_eq!(u % u64::from(g.chunk_sectors()), 0);
        }
    }
    Ok(used)
}

/// Sorted intervals per role must not overlap.
fn assert_disjoint(intervals: &mut [Vec<(u64, u64)>]) -> Result<(), TestCaseError> {
    for (role, list) in intervals.iter_mut().enumerate() {
        list.sort_unstable();
        for pair in list.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0, "role {} overlap {:?} {:?}", role, pair[0], pair[1]);
        }
    }
    Ok(())
}

fn check_case(case: &Case, probe: u64) -> Result<(), TestCaseError> {
    let g = Geometry::new(case.level, case.layout, case.chunk_sectors, &case.member_sectors)
        .map_err(|e| TestCaseError::fail(format!("{case:?}: {e}")))?;
    let n = g.raid_disks();
    let array = g.array_sectors();
    prop_assert!(array > 0);
    let usable = usable(case, &g)?;
    let expected_copies = match case.level {
        Level::Raid1 => n,
        Level::Raid10 => g.raid10().unwrap().layout().copies() as usize,
        _ => 1,
    };
    let chunked = !matches!(case.level, Level::Linear | Level::Raid1);
    let chunk = u64::from(case.chunk_sectors);

    let mut intervals: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
    let mut s = 0u64;
    while s < array {
        let m = g.map(s);
        let len = m.len_sectors;
        prop_assert!(len >= 1 && s + len <= array, "sector {} len {}", s, len);
        if chunked {
            prop_assert!(len <= chunk - s % chunk, "run crosses a chunk at {}", s);
        }
        prop_assert_eq!(m.copies.len(), expected_copies);
        let mut roles: Vec<usize> = m.copies.iter().map(|c| c.role).collect();
        roles.sort_unstable();
        roles.dedup();
        prop_assert_eq!(roles.len(), expected_copies, "two copies on one role at {}", s);
        for c in &m.copies {
            prop_assert!(c.role < n);
            prop_assert!(c.member_sector + len <= usable[c.role], "copy {:?} len {} beyond member", c, len);
            intervals[c.role].push((c.member_sector, c.member_sector + len));
        }
        if case.level == Level::Raid1 {
            prop_assert!(m.copies.iter().all(|c| c.member_sector == s));
        }
        // Any sector inside the run maps to the same copies shifted, with the rest of the run.
        for i in [len - 1, probe % len] {
            let inner = g.map(s + i);
            prop_assert_eq!(inner.len_sectors, len - i);
            let shifted: Vec<_> = m.copies.iter().map(|c| (c.role, c.member_sector + i)).collect();
            let got: Vec<_> = inner.copies.iter().map(|c| (c.role, c.member_sector)).collect();
            prop_assert_eq!(got, shifted);
        }
        s += len;
    }

    if let Some(p) = g.parity() {
        let data_disks = n - p.parity_disks();
        prop_assert_eq!(p.data_disks(), data_disks);
        prop_assert_eq!(array, p.stripes() * p.stripe_data_sectors());
        for stripe in 0..p.stripes() {
            let layout = p.stripe(stripe);
            prop_assert_eq!(layout.data_roles.len(), data_disks);
            let mut all: Vec<usize> = layout.data_roles.clone();
            all.push(layout.p_role);
            if let Some(q) = layout.q_role {
                prop_assert_ne!(q, layout.p_role);
                all.push(q);
                let mut exps = layout.q_exponents.clone();
                exps.sort_unstable();
                exps.dedup();
                prop_assert_eq!(exps.len(), data_disks, "q exponents not distinct");
                if p.is_ddf() {
                    let roles: Vec<u8> = layout.data_roles.iter().map(|&r| r as u8).collect();
                    prop_assert_eq!(&layout.q_exponents, &roles);
                } else {
                    prop_assert_eq!(exps, (0..data_disks as u8).collect::<Vec<_>>());
                }
            } else {
                prop_assert_eq!(case.level == Level::Raid6, false);
            }
            all.sort_unstable();
            prop_assert_eq!(all, (0..n).collect::<Vec<_>>(), "stripe {} roles not a permutation", stripe);
            // The data map agrees with the stripe layout; parity fills the rest of the row.
            let row = p.stripe_member_sector(stripe);
            for (k, &role) in layout.data_roles.iter().enumerate() {
                let at = p.data_array_sector(stripe, k);
                prop_assert_eq!(p.locate(at), (stripe, k, 0));
                prop_assert_eq!(g.map(at).copies[0].role, role);
                prop_assert_eq!(g.map(at).copies[0].member_sector, row);
            }
            for parity_role in std::iter::once(layout.p_role).chain(layout.q_role) {
                intervals[parity_role].push((row, row + chunk));
            }
        }
        // Data plus parity cover every member sector of every stripe exactly once.
        for list in &intervals {
            prop_assert_eq!(list.iter().map(|(a, b)| b - a).sum::<u64>(), p.size_sectors());
        }
    }
    assert_disjoint(&mut intervals)?;
    let covered: u64 = intervals.iter().flatten().map(|(a, b)| b - a).sum();
    let parity_sectors = g.parity().map_or(0, |p| p.size_sectors() * p.parity_disks() as u64);
    prop_assert_eq!(covered, array * expected_copies as u64 + parity_sectors);

    if case.level == Level::Raid10 {
        // survives() against brute force over every chunk, for every subset of members.
        let chunk_roles: Vec<Vec<usize>> =
            (0..array / chunk).map(|v| g.map(v * chunk).copies.iter().map(|c| c.role).collect()).collect();
        for mask in 0u32..(1 << n) {
            let missing: Vec<usize> = (0..n).filter(|r| mask & (1 << r) != 0).collect();
            let brute = chunk_roles.iter().all(|roles| roles.iter().any(|r| !missing.contains(r)));
            prop_assert_eq!(g.survives(&missing), brute, "missing {:?}", missing);
            if missing.len() <= g.max_failures() && missing.len() == 1 {
                prop_assert!(g.survives(&missing));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn geometry_map_is_injective_and_in_bounds(case in case(), probe in any::<u64>()) {
        check_case(&case, probe)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary input never panics: it is refused or yields a usable geometry.
    #[test]
    fn geometry_new_never_panics(
        level in prop::sample::select(vec![Level::Linear, Level::Raid0, Level::Raid1, Level::Raid4, Level::Raid5, Level::Raid6, Level::Raid10]),
        layout in prop_oneof![any::<u32>(), 0u32..32, 0x100u32..0x400, 0x10100u32..0x10400],
        chunk in prop_oneof![any::<u32>(), (0u32..20).prop_map(|s| 1 << s)],
        sizes in prop::collection::vec(prop_oneof![any::<u64>(), 0u64..1 << 20, 0u64..1 << 49], 0..70),
    ) {
        match Geometry::new(level, layout, chunk, &sizes) {
            Ok(g) => {
                let end = g.array_sectors();
                prop_assert!(end > 0);
                for s in [0, end / 3, end - 1] {
                    let m = g.map(s);
                    prop_assert!(m.len_sectors >= 1 && s + m.len_sectors <= end);
                    prop_assert!(m.copies.iter().all(|c| c.role < g.raid_disks()));
                }
                prop_assert!(g.survives(&[]));
                let _ = (g.optimal_io_bytes(), g.resync_sectors(), g.max_failures());
            }
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                if let GeometryError::TooFewMembers { got, .. } = e {
                    prop_assert_eq!(got, sizes.len());
                }
            }
        }
    }
}
