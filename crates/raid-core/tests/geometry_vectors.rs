//! Hand-checked layout vectors pinning md's placement (`md-format.md` §2, the kernel's
//! raid0.c / raid5.c / raid10.c / md-linear.c and the diagrams in mdadm's md.4), plus the
//! refusals of bad geometries. The tables here are written out by hand, not computed by
//! a second implementation, so a formula slip in `geometry` shows up as a diff.

/// Named `geometry` so `cargo test -p raid-core geometry` selects these tests.
mod geometry {
    use raid_core::geometry::{
        Extent, Geometry, GeometryError, Level, MAX_CHUNK_SECTORS, MAX_MEMBER_SECTORS, MAX_RAID_DISKS, Mapped,
        ParityLayout, Raid0Layout,
    };

    const C: u32 = 8;
    const C64: u64 = C as u64;

    fn ext(role: usize, member_sector: u64) -> Extent {
        Extent { role, member_sector }
    }

    /// Checks a parity table: rows = stripes, columns = roles, cells `P`, `Q` or `D<chunk>`
    /// (array chunk number). Every cell is checked through both `parity().stripe()` and
    /// `Geometry::map`.
    fn check_parity_table(level: Level, layout: u32, table: &[&str]) {
        let n = table[0].split_whitespace().count();
        let rows = table.len() as u64;
        let g = Geometry::new(level, layout, C, &vec![rows * C64; n]).unwrap();
        let p = g.parity().expect("parity geometry");
        assert_eq!(p.stripes(), rows);
        let mut data_cells = 0u64;
        for (stripe, row) in table.iter().enumerate() {
            let stripe = stripe as u64;
            let cells: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(cells.len(), n, "table row {row:?}");
            let layout_of_stripe = p.stripe(stripe);
            for (role, cell) in cells.iter().enumerate() {
                let what = format!("{level} layout {layout} stripe {stripe} role {role} ({cell})");
                match *cell {
                    "P" => assert_eq!(layout_of_stripe.p_role, role, "{what}"),
                    "Q" => assert_eq!(layout_of_stripe.q_role, Some(role), "{what}"),
                    d => {
                        let chunk: u64 = d.strip_prefix('D').unwrap().parse().unwrap();
                        data_cells += 1;
                        let (s, k, off) = p.locate(chunk * C64 + 3);
                        assert_eq!((s, off), (stripe, 3), "{what}");
                        assert_eq!(layout_of_stripe.data_roles[k], role, "{what}");
                        assert_eq!(p.data_role(stripe, k), role, "{what}");
                        assert_eq!(
                            g.map(chunk * C64 + 3),
                            Mapped { copies: vec![ext(role, stripe * C64 + 3)], len_sectors: C64 - 3 },
                            "{what}"
                        );
                    }
                }
            }
            if level != Level::Raid6 {
                assert_eq!(layout_of_stripe.q_role, None);
                assert!(layout_of_stripe.q_exponents.is_empty());
            }
        }
        assert_eq!(data_cells * C64, g.array_sectors(), "{level} layout {layout}: every data chunk in the table");
    }

    #[test]
    fn raid5_five_disk_tables() {
        // md-format.md §2.4 (cross-checked there against mdadm's geo_map).
        let left_symmetric =
            ["D0 D1 D2 D3 P", "D5 D6 D7 P D4", "D10 D11 P D8 D9", "D15 P D12 D13 D14", "P D16 D17 D18 D19"];
        let left_asymmetric =
            ["D0 D1 D2 D3 P", "D4 D5 D6 P D7", "D8 D9 P D10 D11", "D12 P D13 D14 D15", "P D16 D17 D18 D19"];
        let right_symmetric =
            ["P D0 D1 D2 D3", "D7 P D4 D5 D6", "D10 D11 P D8 D9", "D13 D14 D15 P D12", "D16 D17 D18 D19 P"];
        // By hand from the rule table: pd = stripe mod n, data k or k+1 past pd.
        let right_asymmetric =
            ["P D0 D1 D2 D3", "D4 P D5 D6 D7", "D8 D9 P D10 D11", "D12 D13 D14 P D15", "D16 D17 D18 D19 P"];
        let parity_first = ["P D0 D1 D2 D3", "P D4 D5 D6 D7", "P D8 D9 D10 D11"];
        let parity_last = ["D0 D1 D2 D3 P", "D4 D5 D6 D7 P", "D8 D9 D10 D11 P"];
        check_parity_table(Level::Raid5, 2, &left_symmetric);
        check_parity_table(Level::Raid5, 0, &left_asymmetric);
        check_parity_table(Level::Raid5, 3, &right_symmetric);
        check_parity_table(Level::Raid5, 1, &right_asymmetric);
        check_parity_table(Level::Raid5, 4, &parity_first);
        check_parity_table(Level::Raid5, 5, &parity_last);
        // raid4: parity on the last role whatever the layout says.
        for layout in [0, 2, 5, 9, 77] {
            check_parity_table(Level::Raid4, layout, &parity_last);
        }
    }

    #[test]
    fn raid5_small_arrays() {
        // Two disks left-symmetric is a mirror with alternating parity: D0 P / P D1.
        check_parity_table(Level::Raid5, 2, &["D0 P", "P D1", "D2 P"]);
        check_parity_table(Level::Raid5, 0, &["D0 P", "P D1", "D2 P"]);
        // Three disks left-symmetric.
        check_parity_table(Level::Raid5, 2, &["D0 D1 P", "D3 P D2", "P D4 D5", "D6 D7 P"]);
    }

    #[test]
    fn raid6_five_disk_tables() {
        // md-format.md §2.5: default layout 5 disks, first three rows given; the rest by hand.
        let left_symmetric =
            ["Q D0 D1 D2 P", "D3 D4 D5 P Q", "D7 D8 P Q D6", "D11 P Q D9 D10", "P Q D12 D13 D14", "Q D15 D16 D17 P"];
        let left_asymmetric = ["Q D0 D1 D2 P", "D3 D4 D5 P Q", "D6 D7 P Q D8", "D9 P Q D10 D11", "P Q D12 D13 D14"];
        let right_asymmetric = ["P Q D0 D1 D2", "D3 P Q D4 D5", "D6 D7 P Q D8", "D9 D10 D11 P Q", "Q D12 D13 D14 P"];
        let right_symmetric = ["P Q D0 D1 D2", "D5 P Q D3 D4", "D7 D8 P Q D6", "D9 D10 D11 P Q", "Q D12 D13 D14 P"];
        let parity_first = ["P Q D0 D1 D2", "P Q D3 D4 D5"];
        let parity_last = ["D0 D1 D2 P Q", "D3 D4 D5 P Q"];
        // DDF: zero-restart = right-asymmetric placement; N-restart = left-asymmetric with
        // stripe+1 (first stripe D D D P Q); N-continue = left-symmetric with Q before P.
        let ddf_zero_restart = right_asymmetric;
        let ddf_n_restart = ["D0 D1 D2 P Q", "D3 D4 P Q D5", "D6 P Q D7 D8", "P Q D9 D10 D11", "Q D12 D13 D14 P"];
        let ddf_n_continue = ["D0 D1 D2 Q P", "D4 D5 Q P D3", "D8 Q P D6 D7", "Q P D9 D10 D11", "P D12 D13 D14 Q"];
        // -6 layouts: the raid5 layout over roles 0..3, Q on role 4.
        let left_asymmetric_6 = ["D0 D1 D2 P Q", "D3 D4 P D5 Q", "D6 P D7 D8 Q", "P D9 D10 D11 Q", "D12 D13 D14 P Q"];
        let right_asymmetric_6 = ["P D0 D1 D2 Q", "D3 P D4 D5 Q", "D6 D7 P D8 Q", "D9 D10 D11 P Q", "P D12 D13 D14 Q"];
        let left_symmetric_6 = ["D0 D1 D2 P Q", "D4 D5 P D3 Q", "D8 P D6 D7 Q", "P D9 D10 D11 Q", "D12 D13 D14 P Q"];
        let right_symmetric_6 = ["P D0 D1 D2 Q", "D5 P D3 D4 Q", "D7 D8 P D6 Q", "D9 D10 D11 P Q", "P D12 D13 D14 Q"];
        let parity_first_6 = ["P D0 D1 D2 Q", "P D3 D4 D5 Q"];

        check_parity_table(Level::Raid6, 2, &left_symmetric);
        check_parity_table(Level::Raid6, 0, &left_asymmetric);
        check_parity_table(Level::Raid6, 1, &right_asymmetric);
        check_parity_table(Level::Raid6, 3, &right_symmetric);
        check_parity_table(Level::Raid6, 4, &parity_first);
        check_parity_table(Level::Raid6, 5, &parity_last);
        check_parity_table(Level::Raid6, 8, &ddf_zero_restart);
        check_parity_table(Level::Raid6, 9, &ddf_n_restart);
        check_parity_table(Level::Raid6, 10, &ddf_n_continue);
        check_parity_table(Level::Raid6, 16, &left_asymmetric_6);
        check_parity_table(Level::Raid6, 17, &right_asymmetric_6);
        check_parity_table(Level::Raid6, 18, &left_symmetric_6);
        check_parity_table(Level::Raid6, 19, &right_symmetric_6);
        check_parity_table(Level::Raid6, 20, &parity_first_6);
    }

    fn q_exponents(layout: u32, n: usize, stripe: u64) -> Vec<u8> {
        let g = Geometry::new(Level::Raid6, layout, C, &vec![16 * C64; n]).unwrap();
        g.parity().unwrap().stripe(stripe).q_exponents
    }

    #[test]
    fn raid6_q_coefficient_order() {
        // §2.5 example: left-asymmetric, 5 disks, stripe 2 = D6 D7 P Q D8;
        // Q = g^0·D8 + g^1·D6 + g^2·D7, i.e. exponents by data index [D6, D7, D8] = [1, 2, 0].
        assert_eq!(q_exponents(0, 5, 2), vec![1, 2, 0]);
        // Left-asymmetric other stripes (walk starts right after Q, role 0 when Q is last).
        assert_eq!(q_exponents(0, 5, 0), vec![0, 1, 2]); // Q D0 D1 D2 P
        assert_eq!(q_exponents(0, 5, 1), vec![0, 1, 2]); // D3 D4 D5 P Q
        assert_eq!(q_exponents(0, 5, 3), vec![2, 0, 1]); // D9 P Q D10 D11: walk D10 D11 D9
        assert_eq!(q_exponents(0, 5, 4), vec![0, 1, 2]); // P Q D12 D13 D14
        // Right-asymmetric.
        assert_eq!(q_exponents(1, 5, 1), vec![2, 0, 1]); // D3 P Q D4 D5: walk D4 D5 D3
        assert_eq!(q_exponents(1, 5, 2), vec![1, 2, 0]); // D6 D7 P Q D8: walk D8 D6 D7
        // Symmetric layouts: the exponent is the data index on every stripe.
        for layout in [2, 3] {
            for n in 4..=8 {
                for stripe in 0..2 * n as u64 {
                    assert_eq!(q_exponents(layout, n, stripe), (0..n as u8 - 2).collect::<Vec<_>>());
                }
            }
        }
        // -6 symmetric layouts are not: Q is last, so the walk is in role order.
        assert_eq!(q_exponents(18, 5, 1), vec![2, 0, 1]); // D4 D5 P D3 Q
        assert_eq!(q_exponents(19, 5, 2), vec![2, 0, 1]); // D7 D8 P D6 Q
        assert_eq!(q_exponents(16, 5, 2), vec![0, 1, 2]); // D6 P D7 D8 Q
        assert_eq!(q_exponents(20, 5, 0), vec![0, 1, 2]); // P D0 D1 D2 Q
        assert_eq!(q_exponents(4, 5, 0), vec![0, 1, 2]); // P Q D0 D1 D2
        assert_eq!(q_exponents(5, 5, 0), vec![0, 1, 2]); // D0 D1 D2 P Q
        // DDF: g^role, P and Q counted as zero slots.
        assert_eq!(q_exponents(8, 5, 0), vec![2, 3, 4]); // P Q D0 D1 D2
        assert_eq!(q_exponents(8, 5, 1), vec![0, 3, 4]); // D3 P Q D4 D5
        assert_eq!(q_exponents(8, 5, 4), vec![1, 2, 3]); // Q D12 D13 D14 P
        assert_eq!(q_exponents(9, 5, 1), vec![0, 1, 4]); // D3 D4 P Q D5
        assert_eq!(q_exponents(10, 5, 1), vec![4, 0, 1]); // D4 D5 Q P D3
        // raid4/5 have no Q.
        let g = Geometry::new(Level::Raid5, 0, C, &[C64 * 4; 4]).unwrap();
        assert!(g.parity().unwrap().stripe(1).q_exponents.is_empty());
        assert!(!g.parity().unwrap().is_ddf());
        assert!(Geometry::new(Level::Raid6, 9, C, &[C64 * 4; 4]).unwrap().parity().unwrap().is_ddf());
    }

    /// Builds the member-chunk grid of a raid10 (or any) array with chunk `C`: grid[row][role]
    /// = array chunk stored there, -1 for unused. Panics if two copies land on one cell.
    fn chunk_grid(g: &Geometry, rows: usize) -> Vec<Vec<i64>> {
        let mut grid = vec![vec![-1i64; g.raid_disks()]; rows];
        for chunk in 0..g.array_sectors() / C64 {
            let m = g.map(chunk * C64);
            assert_eq!(m.len_sectors, C64);
            for copy in m.copies {
                assert_eq!(copy.member_sector % C64, 0);
                let cell = &mut grid[(copy.member_sector / C64) as usize][copy.role];
                assert_eq!(*cell, -1, "chunk {chunk} collides with chunk {cell}");
                *cell = chunk as i64;
            }
        }
        grid
    }

    fn raid10(layout: &str, n: usize, size_chunks: u64) -> Geometry {
        let layout = raid_core::geometry::Raid10Layout::parse(layout)
            .map(|l| l.to_md())
            .unwrap_or_else(|| u32::from_str_radix(layout.trim_start_matches("0x"), 16).unwrap());
        Geometry::new(Level::Raid10, layout, C, &vec![size_chunks * C64; n]).unwrap()
    }

    #[test]
    fn raid10_md4_diagrams() {
        // md-format.md §2.6 / mdadm md.4.
        let g = raid10("n2", 4, 3);
        assert_eq!(g.array_sectors(), 6 * C64);
        assert_eq!(chunk_grid(&g, 3), vec![vec![0, 0, 1, 1], vec![2, 2, 3, 3], vec![4, 4, 5, 5]]);

        let g = raid10("n2", 3, 4);
        assert_eq!(g.array_sectors(), 6 * C64);
        assert_eq!(chunk_grid(&g, 4), vec![vec![0, 0, 1], vec![1, 2, 2], vec![3, 3, 4], vec![4, 5, 5]]);

        let g = raid10("f2", 4, 6);
        assert_eq!(g.array_sectors(), 12 * C64);
        assert_eq!(g.raid10().unwrap().stride_sectors(), 3 * C64);
        assert_eq!(
            chunk_grid(&g, 6),
            vec![
                vec![0, 1, 2, 3],
                vec![4, 5, 6, 7],
                vec![8, 9, 10, 11],
                vec![3, 0, 1, 2],
                vec![7, 4, 5, 6],
                vec![11, 8, 9, 10]
            ]
        );

        let g = raid10("o2", 4, 4);
        assert_eq!(g.array_sectors(), 8 * C64);
        assert_eq!(g.raid10().unwrap().stride_sectors(), C64);
        assert_eq!(chunk_grid(&g, 4), vec![vec![0, 1, 2, 3], vec![3, 0, 1, 2], vec![4, 5, 6, 7], vec![7, 4, 5, 6]]);
    }

    #[test]
    fn raid10_more_layouts_by_hand() {
        // n3 on 4 disks: chunk v at virtual chunks 3v..3v+2 (dev = vchunk mod 4, row = vchunk / 4).
        let g = raid10("n3", 4, 3);
        assert_eq!(g.array_sectors(), 4 * C64);
        assert_eq!(chunk_grid(&g, 3), vec![vec![0, 0, 0, 1], vec![1, 1, 2, 2], vec![2, 3, 3, 3]]);

        // f2 on 3 disks, size 4 chunks: 6 array chunks, stride ⌈6·2/3⌉/2 = 2 rows.
        let g = raid10("f2", 3, 4);
        assert_eq!(g.array_sectors(), 6 * C64);
        assert_eq!(chunk_grid(&g, 4), vec![vec![0, 1, 2], vec![3, 4, 5], vec![2, 0, 1], vec![5, 3, 4]]);

        // f3 on 3 disks, size 3 chunks: 3 array chunks, stride 1 row, copies shift by one role.
        let g = raid10("f3", 3, 3);
        assert_eq!(chunk_grid(&g, 3), vec![vec![0, 1, 2], vec![2, 0, 1], vec![1, 2, 0]]);

        // o3 on 3 disks, size 3 chunks: same picture, rows st·3 + f.
        let g = raid10("o3", 3, 3);
        assert_eq!(chunk_grid(&g, 3), vec![vec![0, 1, 2], vec![2, 0, 1], vec![1, 2, 0]]);

        // n2f2 (0x202) on 4 disks, size 4 chunks: 4 array chunks, stride 2 rows. md's slot
        // order is near copy 0, its far copy, near copy 1, its far copy.
        let g = raid10("0x202", 4, 4);
        assert_eq!(g.array_sectors(), 4 * C64);
        assert_eq!(g.map(0).copies, vec![ext(0, 0), ext(2, 2 * C64), ext(1, 0), ext(3, 2 * C64)]);
        assert_eq!(g.map(C64 + 5).copies, vec![ext(2, 5), ext(0, 2 * C64 + 5), ext(3, 5), ext(1, 2 * C64 + 5)]);
        assert_eq!(g.max_failures(), 3);

        // The far copies hang off md's `size`: f2 on 4 disks with size 6 vs 8 chunks.
        assert_eq!(raid10("f2", 4, 6).map(0).copies, vec![ext(0, 0), ext(1, 3 * C64)]);
        assert_eq!(raid10("f2", 4, 7).map(0).copies, vec![ext(0, 0), ext(1, 3 * C64)]);
        assert_eq!(raid10("f2", 4, 8).map(0).copies, vec![ext(0, 0), ext(1, 4 * C64)]);
        // Array size = ⌊⌊size/c⌋/fc⌋·n/nc chunks: n2 on 3 disks with 5 chunks = 7 chunks.
        assert_eq!(raid10("n2", 3, 5).array_sectors(), 7 * C64);
        assert_eq!(raid10("f2", 4, 7).array_sectors(), 12 * C64);
        // Copy order for far layouts: the near (first-half) copy first.
        assert_eq!(raid10("f2", 4, 6).map(5 * C64 + 1).copies, vec![ext(1, C64 + 1), ext(2, 4 * C64 + 1)]);
        assert_eq!(raid10("o2", 4, 4).map(5 * C64 + 1).copies, vec![ext(1, 2 * C64 + 1), ext(2, 3 * C64 + 1)]);
    }

    #[test]
    fn raid10_survives_exactly() {
        let n2_4 = raid10("n2", 4, 4);
        assert!(n2_4.survives(&[0, 2]));
        assert!(n2_4.survives(&[1, 3]));
        assert!(!n2_4.survives(&[0, 1]));
        assert!(!n2_4.survives(&[2, 3]));
        assert!(n2_4.survives(&[1, 2])); // mirrors are (0,1) and (2,3)
        assert_eq!(n2_4.max_failures(), 1);
        // n2 on 3 disks: every pair of roles holds some chunk's both copies.
        let n2_3 = raid10("n2", 3, 4);
        assert!(n2_3.survives(&[2]));
        for pair in [[0, 1], [1, 2], [0, 2]] {
            assert!(!n2_3.survives(&pair), "{pair:?}");
        }
        // f2 and o2 on 4 disks: copies on neighbouring roles (cyclic).
        for layout in ["f2", "o2"] {
            let g = raid10(layout, 4, 4);
            assert!(g.survives(&[0, 2]));
            assert!(g.survives(&[1, 3]));
            assert!(!g.survives(&[3, 0]));
            assert!(!g.survives(&[1, 2]));
        }
        // Out-of-range roles are not members; duplicates count once.
        assert!(n2_4.survives(&[0, 0, 9]));
    }

    #[test]
    fn raid0_multi_zone_worked_example() {
        // §2.2: sizes [1, 3, 3] chunks (plus a few sectors that rounding drops).
        let sizes = [C64 + 3, 3 * C64 + 7, 3 * C64];
        let original: [(usize, u64); 7] = [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (2, 2), (1, 2)];
        let alternate: [(usize, u64); 7] = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)];
        for (layout, expected) in [(1, original), (2, alternate)] {
            let g = Geometry::new(Level::Raid0, layout, C, &sizes).unwrap();
            assert_eq!(g.array_sectors(), 7 * C64);
            assert_eq!(g.raid0().unwrap().zones().len(), 2);
            for (chunk, (role, member_chunk)) in expected.into_iter().enumerate() {
                let m = g.map(chunk as u64 * C64 + 2);
                assert_eq!(m.copies, vec![ext(role, member_chunk * C64 + 2)], "layout {layout} chunk {chunk}");
                assert_eq!(m.len_sectors, C64 - 2);
            }
        }
        // md refuses to guess the layout of a multi-zone array.
        assert_eq!(
            Geometry::new(Level::Raid0, 0, C, &sizes),
            Err(GeometryError::BadLayout { level: Level::Raid0, layout: 0 })
        );
        assert!(matches!(Geometry::new(Level::Raid0, 3, C, &sizes), Err(GeometryError::BadLayout { .. })));
        // Single zone: any layout, plain striping over all members in role order.
        for layout in [0, 1, 2, 7] {
            let g = Geometry::new(Level::Raid0, layout, C, &[4 * C64 + 1, 4 * C64, 4 * C64 + 7]).unwrap();
            assert_eq!(g.raid0().unwrap().effective_layout(), Raid0Layout::Original);
            assert_eq!(g.array_sectors(), 12 * C64);
            for chunk in 0..12u64 {
                assert_eq!(g.map(chunk * C64).copies, vec![ext(chunk as usize % 3, chunk / 3 * C64)]);
            }
        }
    }

    #[test]
    fn raid0_three_zones() {
        // Sizes [2, 4, 1, 4] chunks: zone 0 = all 4 roles x 1 chunk (array chunks 0-3),
        // zone 1 = roles 0,1,3 x 1 chunk (chunks 4-6), zone 2 = roles 1,3 x 2 chunks (7-10).
        let sizes = [2 * C64, 4 * C64, C64, 4 * C64];
        let original = [(0, 0), (1, 0), (2, 0), (3, 0), (1, 1), (3, 1), (0, 1), (3, 2), (1, 2), (3, 3), (1, 3)];
        let alternate = [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (3, 1), (1, 2), (3, 2), (1, 3), (3, 3)];
        for (layout, expected) in [(1, original), (2, alternate)] {
            let g = Geometry::new(Level::Raid0, layout, C, &sizes).unwrap();
            assert_eq!(g.array_sectors(), 11 * C64);
            for (chunk, (role, member_chunk)) in expected.into_iter().enumerate() {
                assert_eq!(g.map(chunk as u64 * C64).copies, vec![ext(role, member_chunk * C64)], "layout {layout}");
            }
        }
    }

    #[test]
    fn linear_concatenates_in_role_order() {
        let g = Geometry::new(Level::Linear, 0, 0, &[100, 50, 70]).unwrap();
        assert_eq!(g.array_sectors(), 220);
        assert_eq!(g.map(0), Mapped { copies: vec![ext(0, 0)], len_sectors: 100 });
        assert_eq!(g.map(99), Mapped { copies: vec![ext(0, 99)], len_sectors: 1 });
        assert_eq!(g.map(100), Mapped { copies: vec![ext(1, 0)], len_sectors: 50 });
        assert_eq!(g.map(149), Mapped { copies: vec![ext(1, 49)], len_sectors: 1 });
        assert_eq!(g.map(150), Mapped { copies: vec![ext(2, 0)], len_sectors: 70 });
        assert_eq!(g.map(219), Mapped { copies: vec![ext(2, 69)], len_sectors: 1 });
        // Rounding 16: sizes become 96, 48, 64.
        let g = Geometry::new(Level::Linear, 0, 16, &[100, 50, 70]).unwrap();
        assert_eq!(g.array_sectors(), 208);
        assert_eq!(g.map(95), Mapped { copies: vec![ext(0, 95)], len_sectors: 1 });
        assert_eq!(g.map(96), Mapped { copies: vec![ext(1, 0)], len_sectors: 48 });
        assert_eq!(g.map(144), Mapped { copies: vec![ext(2, 0)], len_sectors: 64 });
        assert_eq!(g.linear().unwrap().member_sectors(1), 48);
        assert_eq!(g.max_failures(), 0);
        assert!(!g.survives(&[1]));
        assert!(g.survives(&[]));
        // A single member.
        assert_eq!(Geometry::new(Level::Linear, 0, 0, &[5]).unwrap().map(4).copies, vec![ext(0, 4)]);
    }

    #[test]
    fn raid1_mirrors_everything() {
        let g = Geometry::new(Level::Raid1, 0, 0, &[1000, 1000, 1000]).unwrap();
        assert_eq!(g.array_sectors(), 1000);
        assert_eq!(g.map(10), Mapped { copies: vec![ext(0, 10), ext(1, 10), ext(2, 10)], len_sectors: 990 });
        assert_eq!(g.max_failures(), 2);
        assert!(g.survives(&[0, 2]));
        assert!(!g.survives(&[0, 1, 2]));
        assert_eq!(g.resync_sectors(), 1000);
        assert_eq!(g.optimal_io_bytes(), 4096);
    }

    #[test]
    fn redundancy_and_hints() {
        let kib = 1024u64;
        let chunk = 1024; // 512 KiB
        let r5 = Geometry::new(Level::Raid5, 2, chunk, &[10_000; 4]).unwrap();
        // ext4 example in §2.7: raid5, 4 disks, 512K chunk -> stripe width 1536 KiB.
        assert_eq!(r5.optimal_io_bytes(), 1536 * kib);
        assert_eq!(r5.resync_sectors(), 9 * 1024); // size rounded to the chunk
        assert_eq!(r5.array_sectors(), 3 * 9 * 1024);
        assert_eq!(r5.max_failures(), 1);
        assert!(r5.survives(&[3]));
        assert!(!r5.survives(&[0, 3]));

        let r6 = Geometry::new(Level::Raid6, 2, chunk, &[2048; 6]).unwrap();
        assert_eq!(r6.optimal_io_bytes(), 4 * 512 * kib);
        assert_eq!(r6.max_failures(), 2);
        assert!(r6.survives(&[1, 4]));
        assert!(!r6.survives(&[1, 4, 5]));

        let r4 = Geometry::new(Level::Raid4, 0, chunk, &[2048; 3]).unwrap();
        assert_eq!(r4.optimal_io_bytes(), 2 * 512 * kib);
        assert_eq!(r4.parity().unwrap().layout(), ParityLayout::ParityLast);

        let r0 = Geometry::new(Level::Raid0, 1, chunk, &[2048; 3]).unwrap();
        assert_eq!(r0.optimal_io_bytes(), 3 * 512 * kib);
        assert_eq!(r0.resync_sectors(), 0);
        assert!(!r0.survives(&[0]));

        let big = 64 * 1024;
        assert_eq!(Geometry::new(Level::Raid10, 0x102, chunk, &[big; 4]).unwrap().optimal_io_bytes(), 2 * 512 * kib);
        assert_eq!(Geometry::new(Level::Raid10, 0x102, chunk, &[big; 3]).unwrap().optimal_io_bytes(), 3 * 512 * kib);
        assert_eq!(Geometry::new(Level::Raid10, 0x201, chunk, &[big; 4]).unwrap().optimal_io_bytes(), 4 * 512 * kib);
        let r10 = Geometry::new(Level::Raid10, 0x102, chunk, &[big; 4]).unwrap();
        assert_eq!(r10.resync_sectors(), r10.array_sectors());
        assert_eq!(r10.array_sectors(), 2 * big);
        assert_eq!(Geometry::new(Level::Linear, 0, 0, &[8, 8]).unwrap().optimal_io_bytes(), 4096);
    }

    #[test]
    fn bad_geometries_are_refused() {
        use GeometryError as E;
        // Member counts.
        for level in
            [Level::Linear, Level::Raid0, Level::Raid1, Level::Raid4, Level::Raid5, Level::Raid6, Level::Raid10]
        {
            assert!(matches!(Geometry::new(level, 0, C, &[]), Err(E::TooFewMembers { .. })), "{level}");
            assert_eq!(
                Geometry::new(level, level.default_layout(), C, &vec![64 * C64; MAX_RAID_DISKS + 1]),
                Err(E::TooManyMembers(MAX_RAID_DISKS + 1))
            );
        }
        assert_eq!(
            Geometry::new(Level::Raid5, 2, C, &[C64]),
            Err(E::TooFewMembers { level: Level::Raid5, min: 2, got: 1 })
        );
        assert_eq!(
            Geometry::new(Level::Raid6, 2, C, &[C64; 3]),
            Err(E::TooFewMembers { level: Level::Raid6, min: 4, got: 3 })
        );
        assert!(Geometry::new(Level::Raid6, 2, C, &vec![16 * C64; MAX_RAID_DISKS]).is_ok());

        // Chunks: powers of two from 4 KiB to the maximum.
        for level in [Level::Raid0, Level::Raid4, Level::Raid5, Level::Raid6, Level::Raid10] {
            for chunk in [0, 1, 4, 12, 24, 1000, MAX_CHUNK_SECTORS * 2, u32::MAX] {
                assert_eq!(
                    Geometry::new(level, level.default_layout(), chunk, &[1 << 30; 4]),
                    Err(E::BadChunk(chunk)),
                    "{level} chunk {chunk}"
                );
            }
            assert!(Geometry::new(level, level.default_layout(), MAX_CHUNK_SECTORS, &[1 << 30; 4]).is_ok());
        }
        // raid1 ignores the chunk; linear takes any rounding.
        assert!(Geometry::new(Level::Raid1, 0, 12345, &[100; 2]).is_ok());
        assert!(Geometry::new(Level::Linear, 0, 12, &[100; 2]).is_ok());

        // Layouts.
        for layout in [6, 7, 8, 10, 16, 20, 0x102] {
            assert_eq!(
                Geometry::new(Level::Raid5, layout, C, &[64; 4]),
                Err(E::BadLayout { level: Level::Raid5, layout })
            );
        }
        for layout in [6, 7, 11, 15, 21, 0x102] {
            assert_eq!(
                Geometry::new(Level::Raid6, layout, C, &[64; 4]),
                Err(E::BadLayout { level: Level::Raid6, layout })
            );
        }
        // raid10: far-set bits, zero copies, a single copy, more copies than members.
        for (layout, n) in [(0x2_0102, 4), (0x4_0102, 4), (0x100_0102, 4), (0, 4), (0x100, 4), (0x101, 4), (0x103, 2)] {
            assert_eq!(
                Geometry::new(Level::Raid10, layout, C, &vec![64 * C64; n]),
                Err(E::BadLayout { level: Level::Raid10, layout }),
                "{layout:#x}"
            );
        }
        assert_eq!(
            Geometry::new(Level::Raid10, 0x202, C, &[64 * C64; 3]),
            Err(E::BadLayout { level: Level::Raid10, layout: 0x202 })
        );
        assert!(Geometry::new(Level::Raid10, 0x103, C, &[64 * C64; 3]).is_ok());
        // n2o2: md's offset formula overlaps chunks unless nc divides n (see raid10.rs).
        assert_eq!(
            Geometry::new(Level::Raid10, 0x1_0202, C, &[64 * C64; 5]),
            Err(E::BadLayout { level: Level::Raid10, layout: 0x1_0202 })
        );
        assert!(Geometry::new(Level::Raid10, 0x1_0202, C, &[64 * C64; 4]).is_ok());

        // Sizes below one chunk name the member.
        assert_eq!(Geometry::new(Level::Raid0, 1, C, &[64, 7, 64]), Err(E::MemberTooSmall { role: 1, sectors: 7 }));
        assert_eq!(Geometry::new(Level::Raid5, 2, C, &[64, 64, 5]), Err(E::MemberTooSmall { role: 2, sectors: 5 }));
        assert_eq!(Geometry::new(Level::Raid1, 0, 0, &[64, 0]), Err(E::MemberTooSmall { role: 1, sectors: 0 }));
        assert_eq!(Geometry::new(Level::Linear, 0, 16, &[64, 15]), Err(E::MemberTooSmall { role: 1, sectors: 15 }));
        // raid10 f2 needs two chunks per member for a single array chunk row.
        assert_eq!(Geometry::new(Level::Raid10, 0x201, C, &[C64; 2]), Err(E::MemberTooSmall { role: 0, sectors: C64 }));
        assert!(Geometry::new(Level::Raid10, 0x201, C, &[2 * C64; 2]).is_ok());
        assert_eq!(
            Geometry::new(Level::Raid6, 2, C, &[64, 64, u64::MAX, 64]),
            Err(E::MemberTooLarge { role: 2, sectors: u64::MAX })
        );
        assert!(Geometry::new(Level::Raid0, 1, MAX_CHUNK_SECTORS, &[MAX_MEMBER_SECTORS; MAX_RAID_DISKS]).is_ok());

        // The messages say what is wrong.
        let text = Geometry::new(Level::Raid6, 2, C, &[C64; 3]).unwrap_err().to_string();
        assert!(text.contains("raid6") && text.contains('4') && text.contains('3'), "{text}");
        let text = Geometry::new(Level::Raid10, 0x2_0102, C, &[C64; 4]).unwrap_err().to_string();
        assert!(text.contains("0x20102") && text.contains("raid10"), "{text}");
    }

    #[test]
    #[should_panic(expected = "beyond the array end")]
    fn map_past_the_end_panics() {
        let g = Geometry::new(Level::Raid5, 2, C, &[C64; 3]).unwrap();
        g.map(g.array_sectors());
    }
}
