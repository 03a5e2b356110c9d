//! Durations as people type them (`10s`, `500ms`, `2m`, `1.5s`, bare seconds: every timeout
//! flag and config key, and the benchmark's) and as the progress line shows them (`4m05s`).

use std::time::Duration;

/// Parses `10s`, `500ms`, `2m`, `1h`, `7d`, `1.5s` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("invalid duration '{text}': expected a number like 10s, 500ms, 2m"))?;
    let seconds_per_unit = match unit.trim() {
        "" | "s" | "sec" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => return Err(format!("invalid duration '{text}': unknown unit '{other}' (use ms, s, m, h or d)")),
    };
    let seconds = value * seconds_per_unit;
    if !seconds.is_finite() || seconds > 86_400.0 * 366.0 {
        return Err(format!("invalid duration '{text}': too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `45s`, `4m05s`, `1h02m`: short, for ETAs.
pub fn format_eta(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// fio's time syntax in whole milliseconds (`1500ms`).
pub fn fio_time(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A duration in the config file: a number of seconds (`30`) or text (`"500ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "DurationValue")]
pub struct ConfigDuration(pub Duration);

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum DurationValue {
    Seconds(u64),
    Text(String),
}

impl TryFrom<DurationValue> for ConfigDuration {
    type Error = String;
    fn try_from(value: DurationValue) -> Result<Self, String> {
        match value {
            DurationValue::Seconds(s) => Ok(ConfigDuration(Duration::from_secs(s))),
            DurationValue::Text(t) => parse_duration(&t).map(ConfigDuration),
        }
    }
}

/// A duration as the flags and messages show it: `30s`, `500ms`, `1.5s`.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("1.2.3s").is_err());
        assert!(parse_duration("99999999h").is_err());
    }

    #[test]
    fn config_durations_take_seconds_or_text() {
        #[derive(serde::Deserialize)]
        struct K {
            t: ConfigDuration,
        }
        let t = |text: &str| toml::from_str::<K>(text).map(|k| k.t.0).map_err(|e| e.to_string());
        assert_eq!(t("t = 30"), Ok(Duration::from_secs(30)));
        assert_eq!(t("t = \"500ms\""), Ok(Duration::from_millis(500)));
        assert_eq!(t("t = \"2m\""), Ok(Duration::from_secs(120)));
        assert!(t("t = \"soon\"").unwrap_err().contains("invalid duration"));
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn formats_etas() {
        assert_eq!(format_eta(Duration::from_secs(45)), "45s");
        assert_eq!(format_eta(Duration::from_secs(245)), "4m05s");
        assert_eq!(format_eta(Duration::from_secs(3720)), "1h02m");
        assert_eq!(fio_time(Duration::from_millis(1500)), "1500ms");
    }
}
