//! Parsing byte counts and rates for the CLI (`--member-bw 20M`, `--member-bw 20MB`).
//!
//! `K`, `M`, `G`, `T` (and `KiB`..`TiB`) are binary (1024-based), as in dd and qemu;
//! `kB`/`KB`, `MB`, `GB`, `TB` are decimal. A trailing `/s` is ignored so rates read naturally.
//! Fractions are allowed (`1.5G`); results are rounded down to whole bytes.

use crate::error::MemberIoError;

/// Parses `"20M"`, `"20MB/s"`, `"4096"`, `"1.5GiB"` into bytes.
pub fn parse_bytes(text: &str) -> Result<u64, MemberIoError> {
    let invalid =
        || MemberIoError::InvalidOption(format!("byte count {text:?}: expected e.g. 4096, 20M, 20MB, 1.5GiB"));
    let s = text.trim();
    let s = s.strip_suffix("/s").unwrap_or(s).trim_end();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let multiplier: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        "T" | "t" | "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(invalid()),
    };
    if number.is_empty() {
        return Err(invalid());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(invalid);
    }
    let value: f64 = number.parse().map_err(|_| invalid())?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(invalid());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("20M").unwrap(), 20 << 20);
        assert_eq!(parse_bytes("20MB/s").unwrap(), 20_000_000);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes(" 2k ").unwrap(), 2048);
        for bad in ["", "M", "20X", "-1", "1e3", "99999999999999999999T", "1.2.3K"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
