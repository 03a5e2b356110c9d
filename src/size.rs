//! Human sizes and rates: `512`, `64K`, `1G`, `2T` (binary multiples, optional `B`/`iB`
//! suffix), as every storage tool accepts them.

/// Parses a size in bytes: a whole number with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let digits_end = upper.find(|c: char| !c.is_ascii_digit()).unwrap_or(upper.len());
    let (number, suffix) = upper.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("invalid size '{text}': expected a number like 512, 64K, 1G"));
    }
    let value: u64 = number.parse().map_err(|_| format!("invalid size '{text}': number too large"))?;
    let shift = match suffix.trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => return Err(format!("invalid size '{text}': unknown suffix '{other}' (use K, M, G or T)")),
    };
    value.checked_mul(1u64 << shift).ok_or_else(|| format!("invalid size '{text}': too large"))
}

/// Formats bytes with the largest binary unit that divides them exactly (`64K`, `1G`).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}")
}

/// Formats bytes for people: `1.5 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < units.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", units[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("20MB"), Ok(20 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("20000000T").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(65536), "64K");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }
}
