//! What a run costs the server: its CPU time per request and per MiB moved, and how often it
//! copies written data, from its own metrics (`--metrics`) scraped just before and just
//! after the run. Both sides of every ratio are the server's own counts over the same
//! window (the CPU from getrusage, the requests and bytes it completed), so fio's warm-up
//! and the gaps around the run count on both sides alike.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

/// The server's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub requests: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub copied_bytes: u64,
}

/// What the requests between two samples cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub cpu_us_per_op: f64,
    pub cpu_us_per_mib: f64,
    /// 1 (received into a buffer) + copies after that, per byte written; `None` without writes.
    pub copies_per_written_byte: Option<f64>,
}

/// Scrapes the metrics endpoint on 127.0.0.1:`port`.
pub fn scrape(port: u16) -> Result<Sample> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).context("cannot reach the server's metrics")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text).context("reading the server's metrics")?;
    parse(&text)
}

/// The counters from a Prometheus text exposition (samples of one name summed over labels).
pub fn parse(text: &str) -> Result<Sample> {
    let sum = |name: &str| -> Option<f64> {
        let mut found = None;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((key, value)) = line.rsplit_once(' ') else { continue };
            if key.split('{').next() == Some(name) {
                *found.get_or_insert(0.0) += value.trim().parse::<f64>().ok()?;
            }
        }
        found
    };
    let need = |name: &str| sum(name).ok_or_else(|| anyhow!("the server's metrics lack {name}"));
    Ok(Sample {
        cpu_seconds: need("raidnbd_process_cpu_seconds_total")?,
        requests: need("raidnbd_export_requests_total")? as u64,
        read_bytes: need("raidnbd_export_read_bytes_total")? as u64,
        written_bytes: need("raidnbd_export_written_bytes_total")? as u64,
        copied_bytes: need("raidnbd_data_copied_bytes_total")? as u64,
    })
}

/// The cost of what the server did from `before` to `after`; `None` when it did nothing.
pub fn between(before: &Sample, after: &Sample) -> Option<Cost> {
    let cpu_us = (after.cpu_seconds - before.cpu_seconds).max(0.0) * 1e6;
    let requests = after.requests.checked_sub(before.requests)?;
    let written = after.written_bytes.checked_sub(before.written_bytes)?;
    let moved = after.read_bytes.checked_sub(before.read_bytes)? + written;
    if requests == 0 || moved == 0 {
        return None;
    }
    let copied = after.copied_bytes.saturating_sub(before.copied_bytes);
    Some(Cost {
        cpu_us_per_op: cpu_us / requests as f64,
        cpu_us_per_mib: cpu_us / (moved as f64 / (1 << 20) as f64),
        copies_per_written_byte: (written > 0).then(|| 1.0 + copied as f64 / written as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "HTTP/1.0 200 OK\r\n\
        content-type: text/plain\r\n\
        \r\n\
        # HELP raidnbd_export_requests Requests.\n\
        # TYPE raidnbd_export_requests counter\n\
        raidnbd_export_requests_total{export=\"bench\",command=\"read\"} 100\n\
        raidnbd_export_requests_total{export=\"bench\",command=\"write\"} 28\n\
        raidnbd_export_read_bytes_total{export=\"bench\"} 409600\n\
        raidnbd_export_written_bytes_total{export=\"bench\"} 1048576\n\
        raidnbd_process_cpu_seconds_total 1.5\n\
        raidnbd_data_copied_bytes_total 2097152\n\
        # EOF\n";

    #[test]
    fn sums_labelled_samples_and_divides_by_the_window() {
        let after = parse(TEXT).unwrap();
        assert_eq!(after.requests, 128);
        assert_eq!((after.read_bytes, after.written_bytes, after.copied_bytes), (409600, 1 << 20, 2 << 20));
        let before = Sample { cpu_seconds: 1.0, requests: 0, read_bytes: 0, written_bytes: 0, copied_bytes: 0 };
        let cost = between(&before, &after).unwrap();
        assert!((cost.cpu_us_per_op - 500_000.0 / 128.0).abs() < 1e-6, "{cost:?}");
        let mib = (409600.0 + 1048576.0) / 1048576.0;
        assert!((cost.cpu_us_per_mib - 500_000.0 / mib).abs() < 1e-6, "{cost:?}");
        assert_eq!(cost.copies_per_written_byte, Some(3.0), "received once, copied twice more");
        assert_eq!(between(&after, &after), None, "nothing done");
    }

    #[test]
    fn names_what_is_missing() {
        let err = parse("raidnbd_process_cpu_seconds_total 1\n").unwrap_err();
        assert!(err.to_string().contains("raidnbd_export_requests_total"), "{err}");
    }
}
