//! Driving fio's NBD engine and reading its JSON.
//!
//! fio is the tool disk users trust, so the bench does not measure anything itself: it
//! builds one fio command per run (`--ioengine=nbd --uri=nbd://…`, one job = one NBD
//! connection), lets fio write `--output-format=json` to a file, and takes bandwidth,
//! IOPS and latency from it. Missing fio (or a fio without the nbd engine) is an error
//! naming the package to install.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use super::workloads::Rw;
use crate::duration::fio_time;

/// One fio run against an NBD export.
#[derive(Debug, Clone)]
pub struct FioJob {
    pub name: String,
    pub uri: String,
    pub rw: Rw,
    pub block_bytes: u64,
    pub iodepth: u32,
    /// `Some((ramp, runtime))`: time based; `None`: one pass over the whole export.
    pub timing: Option<(Duration, Duration)>,
    pub end_fsync: bool,
}

/// What one run measured (the direction the job did).
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub bytes_per_sec: f64,
    pub iops: f64,
    pub lat_mean_us: f64,
    pub lat_p99_us: Option<f64>,
    pub io_bytes: u64,
    /// fio's own CPU (user + system) per request of the measured period, microseconds.
    pub client_cpu_us_per_op: Option<f64>,
}

/// Checks fio is installed and has the nbd engine; returns its version line.
pub fn check_installed() -> Result<String> {
    let out = Command::new("fio").arg("--version").output();
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => bail!("`fio --version` failed ({}): reinstall fio (Debian/Ubuntu: apt-get install fio)", out.status),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("fio is not installed: apt-get install fio (Debian/Ubuntu; the package includes the nbd engine)")
        }
        Err(e) => bail!("cannot run fio: {e}"),
    };
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let engines = Command::new("fio").arg("--enghelp").output().context("cannot run fio --enghelp")?;
    let listed = String::from_utf8_lossy(&engines.stdout);
    if !listed.lines().any(|l| l.trim() == "nbd") {
        bail!(
            "{version} has no nbd engine (built without libnbd): install a fio built with libnbd \
             (Debian/Ubuntu: apt-get install fio, which depends on libnbd0)"
        );
    }
    Ok(version)
}

/// The fio arguments for `job`, writing JSON to `json_path`.
pub fn arguments(job: &FioJob, json_path: &Path) -> Vec<String> {
    let mut args = vec![
        format!("--name={}", job.name),
        "--ioengine=nbd".to_string(),
        format!("--uri={}", job.uri),
        format!("--rw={}", job.rw.fio_name()),
        format!("--bs={}", job.block_bytes),
        format!("--iodepth={}", job.iodepth),
        "--numjobs=1".to_string(),
        "--group_reporting".to_string(),
        "--output-format=json".to_string(),
        format!("--output={}", json_path.display()),
    ];
    if job.rw.is_random() {
        // Random offsets over the whole export, without fio's coverage bitmap.
        args.extend(["--norandommap".to_string(), "--randrepeat=0".to_string()]);
    }
    if let Some((ramp, runtime)) = job.timing {
        args.extend(["--time_based".to_string(), format!("--runtime={}", fio_time(runtime))]);
        if !ramp.is_zero() {
            args.push(format!("--ramp_time={}", fio_time(ramp)));
        }
    }
    if job.end_fsync {
        args.push("--end_fsync=1".to_string());
    }
    args
}

/// Runs `job` to completion (or until `interrupted`), returning what fio measured.
pub fn run(job: &FioJob, json_path: &Path, interrupted: &AtomicBool) -> Result<Measurement> {
    run_args(job, arguments(job, json_path), json_path, interrupted)
}

/// Runs an untimed `job` that moves only `bytes` (e.g. one write and a flush).
pub fn run_bytes(job: &FioJob, bytes: u64, json_path: &Path, interrupted: &AtomicBool) -> Result<Measurement> {
    let mut args = arguments(job, json_path);
    args.push(format!("--io_size={bytes}"));
    run_args(job, args, json_path, interrupted)
}

fn run_args(job: &FioJob, args: Vec<String>, json_path: &Path, interrupted: &AtomicBool) -> Result<Measurement> {
    let err_path = json_path.with_extension("stderr");
    let err_file = std::fs::File::create(&err_path).with_context(|| format!("cannot create {}", err_path.display()))?;
    let mut child = Command::new("fio")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
        .context("cannot start fio")?;
    let limit = match job.timing {
        Some((ramp, runtime)) => (ramp + runtime) * 3 + Duration::from_secs(120),
        None => Duration::from_secs(3 * 3600),
    };
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for fio")? {
            break status;
        }
        if interrupted.load(Ordering::Relaxed) || started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            if interrupted.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            bail!("fio did not finish within {}s: fio {}", limit.as_secs(), args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let text = std::fs::read_to_string(json_path).unwrap_or_default();
    if !status.success() {
        bail!("fio failed ({status}): {}\ncommand: fio {}", last_lines(&stderr, 5), args.join(" "));
    }
    parse(&text, job.rw.is_write()).with_context(|| format!("fio {}: {}", args.join(" "), last_lines(&stderr, 3)))
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Reads fio's JSON (tolerating text fio prints before it) for the read or write side.
pub fn parse(text: &str, write: bool) -> Result<Measurement> {
    let start = text.find('{').ok_or_else(|| anyhow!("fio wrote no JSON"))?;
    let doc: Value = serde_json::from_str(&text[start..]).context("fio's JSON does not parse")?;
    let job = doc.get("jobs").and_then(|j| j.get(0)).ok_or_else(|| anyhow!("fio's JSON has no jobs"))?;
    let error = job.get("error").and_then(Value::as_i64).unwrap_or(0);
    if error != 0 {
        bail!("fio reported error {error} ({})", std::io::Error::from_raw_os_error(error as i32));
    }
    let side = job.get(if write { "write" } else { "read" }).ok_or_else(|| anyhow!("fio's JSON has no totals"))?;
    let number = |v: Option<&Value>, what: &str| {
        v.and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| anyhow!("fio's JSON lacks {what}"))
    };
    let bytes_per_sec = number(side.get("bw_bytes"), "bw_bytes")?;
    let iops = number(side.get("iops"), "iops")?;
    let io_bytes = number(side.get("io_bytes"), "io_bytes")? as u64;
    let lat_mean_us = number(side.get("lat_ns").and_then(|l| l.get("mean")), "lat_ns.mean")? / 1000.0;
    let lat_p99_us = side
        .get("clat_ns")
        .and_then(|c| c.get("percentile"))
        .and_then(|p| p.get("99.000000"))
        .and_then(Value::as_f64)
        .map(|ns| ns / 1000.0);
    if io_bytes == 0 {
        bail!("fio moved no data");
    }
    // fio's CPU over the job's runtime (usr_cpu and sys_cpu are percent of it).
    let client_cpu_us_per_op = (|| {
        let percent = job.get("usr_cpu")?.as_f64()? + job.get("sys_cpu")?.as_f64()?;
        let runtime_ms = job.get("job_runtime")?.as_f64()?;
        let ios = side.get("total_ios")?.as_f64().filter(|&n| n > 0.0)?;
        Some(percent / 100.0 * runtime_ms * 1000.0 / ios)
    })();
    Ok(Measurement { bytes_per_sec, iops, lat_mean_us, lat_p99_us, io_bytes, client_cpu_us_per_op })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"fio: connected to NBD server
{"fio version":"fio-3.33","jobs":[{"jobname":"t","error":0,"usr_cpu":10.0,"sys_cpu":15.0,"job_runtime":2000,
 "read":{"io_bytes":0,"bw_bytes":0,"iops":0.0,"lat_ns":{"mean":0.0}},
 "write":{"io_bytes":67108864,"bw_bytes":285569634,"iops":272.34,"total_ios":500,
  "lat_ns":{"mean":3650000.5},"clat_ns":{"percentile":{"99.000000":5210112}}}}]}"#;

    #[test]
    fn parses_the_written_side() {
        let m = parse(SAMPLE, true).unwrap();
        assert_eq!(m.bytes_per_sec, 285569634.0);
        assert_eq!(m.iops, 272.34);
        assert_eq!(m.io_bytes, 64 << 20);
        assert!((m.lat_mean_us - 3650.0005).abs() < 1e-6);
        assert_eq!(m.lat_p99_us, Some(5210.112));
        // 25 % of 2 s over 500 requests.
        assert_eq!(m.client_cpu_us_per_op, Some(1000.0));
        assert!(parse(SAMPLE, false).is_err(), "the read side moved nothing");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("", true).is_err());
        assert!(parse("{not json", true).is_err());
        assert!(parse(r#"{"jobs":[]}"#, true).is_err());
        assert!(parse(r#"{"jobs":[{"error":5,"write":{}}]}"#, true).is_err());
    }

    #[test]
    fn builds_time_based_random_jobs() {
        let job = FioJob {
            name: "rnd".into(),
            uri: "nbd://127.0.0.1:1/x".into(),
            rw: Rw::RandWrite,
            block_bytes: 4096,
            iodepth: 32,
            timing: Some((Duration::from_secs(2), Duration::from_secs(10))),
            end_fsync: false,
        };
        let args = arguments(&job, Path::new("/tmp/x.json"));
        for want in [
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4096",
            "--iodepth=32",
            "--time_based",
            "--runtime=10000ms",
            "--ramp_time=2000ms",
            "--norandommap",
            "--output=/tmp/x.json",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
    }
}
