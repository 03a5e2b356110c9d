//! Calendar formatting for superblock times, without a date crate: the `ctime(3)` form
//! mdadm prints ("Sun Nov 29 22:18:28 2026", UTC) and RFC 3339 for JSON.

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn split(secs: u64) -> (i64, u32, u32, u64, u64, u64, usize) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let weekday = ((days + 4).rem_euclid(7)) as usize; // 1970-01-01 was a Thursday
    (y, m, d, rem / 3600, rem / 60 % 60, rem % 60, weekday)
}

/// "Sun Nov 29 22:18:28 2026" (UTC).
pub fn ctime(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (y, m, d, hh, mm, ss, wd) = split(secs);
    format!("{} {} {d:2} {hh:02}:{mm:02}:{ss:02} {y}", DAYS[wd], MONTHS[m as usize - 1])
}

/// "2026-11-29T22:18:28Z".
pub fn rfc3339(secs: u64) -> String {
    let (y, m, d, hh, mm, ss, _) = split(secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(ctime(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(rfc3339(1_796_595_508), "2026-12-06T22:18:28Z");
        assert_eq!(ctime(951_782_400), "Tue Feb 29 00:00:00 2000");
    }
}
