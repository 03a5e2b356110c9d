//! Bar charts as hand-written SVG (no plotting dependency): people would rather look at
//! bars than read tables.
//!
//! - [`throughput_chart`]: one small panel per workload, each with its own y scale (4 KiB
//!   random I/O and 1 MiB streams differ by 100×), grouped bars, one color per array,
//!   the value on every bar. Panels of small blocks (≤ 16 KiB) show IOPS, others MB/s.
//! - [`ratio_chart`]: one chart, every workload, bars = each array's MB/s over a single
//!   member's, with a dashed line at 1×.

use std::fmt::Write as _;

use super::record::{BenchReport, RunRecord, Status};
use super::report::{distinct, format_iops, format_mb};

const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const SINGLE_COLOR: &str = "#8c8c8c";
const FONT: &str = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A bar series: one (array, cache mode) that has measurements.
struct Series {
    array: String,
    cache: String,
    label: String,
    color: &'static str,
}

fn series(runs: &[RunRecord], include_single: bool) -> Vec<Series> {
    let caches: Vec<&str> = distinct(runs, |r| &r.cache)
        .into_iter()
        .filter(|c| runs.iter().any(|r| r.cache == *c && r.status == Status::Ok))
        .collect();
    let mut out = Vec::new();
    let mut color = 0;
    for array in distinct(runs, |r| &r.array) {
        let single = runs.iter().any(|r| r.array == array && r.level == "single");
        for &cache in &caches {
            if !runs.iter().any(|r| r.array == array && r.cache == cache && r.status == Status::Ok) {
                continue;
            }
            let label = if caches.len() > 1 { format!("{array} ({cache})") } else { array.to_string() };
            let c = if single {
                SINGLE_COLOR
            } else {
                color += 1;
                PALETTE[(color - 1) % PALETTE.len()]
            };
            if single && !include_single {
                continue;
            }
            out.push(Series { array: array.to_string(), cache: cache.to_string(), label, color: c });
        }
    }
    out
}

/// A "nice" axis top and tick step for values up to `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 || !max.is_finite() {
        return (1.0, 0.25);
    }
    let raw = max / 4.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude);
    ((max / step).ceil().max(1.0) * step, step)
}

fn tick_label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 1000.0 && v % 1000.0 == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A value label on top of a bar (rotated when the bar is narrow).
fn bar_value(svg: &mut String, x_center: f64, y_top: f64, bar_w: f64, text: &str) {
    if bar_w >= 6.5 * text.len() as f64 {
        let _ = writeln!(
            svg,
            r#"<text x="{x_center:.1}" y="{:.1}" text-anchor="middle" font-size="10" {FONT}>{}</text>"#,
            y_top - 3.0,
            esc(text)
        );
    } else {
        let _ = writeln!(
            svg,
            r#"<text x="{x_center:.1}" y="{:.1}" text-anchor="start" font-size="9" {FONT} transform="rotate(-90 {x_center:.1} {:.1})" dy="3">{}</text>"#,
            y_top - 3.0,
            y_top - 3.0,
            esc(text)
        );
    }
}

fn legend(svg: &mut String, series: &[Series], x0: f64, y0: f64, width: f64) -> f64 {
    let (mut x, mut y) = (x0, y0);
    for s in series {
        let w = 24.0 + 7.0 * s.label.chars().count() as f64;
        if x + w > x0 + width && x > x0 {
            x = x0;
            y += 18.0;
        }
        let _ = writeln!(svg, r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/>"#, y - 10.0, s.color);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{y:.1}" font-size="12" {FONT}>{}</text>"#, x + 16.0, esc(&s.label));
        x += w;
    }
    y + 8.0
}

fn open_svg(width: f64, height: f64, title: &str) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}">"#
    );
    let _ = writeln!(svg, "<title>{}</title>", esc(title));
    let _ = writeln!(svg, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    svg
}

fn subtitle(report: &BenchReport) -> String {
    let s = &report.settings;
    let mut parts = vec![format!("{} members", crate::size::format_size(s.member_bytes))];
    if let Some(bw) = s.member_bw_bytes_per_sec {
        parts.push(format!("{}/s", crate::size::format_size(bw)));
    }
    if let Some(iops) = s.member_iops {
        parts.push(format!("{iops} IOPS"));
    }
    if s.member_bw_bytes_per_sec.is_none() && s.member_iops.is_none() {
        parts.push("unthrottled".into());
    }
    parts.push(format!("{} s runs", s.runtime_seconds));
    parts.push(report.machine.fio_version.clone());
    parts.join(" · ")
}

/// Whether a workload is shown in IOPS rather than MB/s.
fn shows_iops(runs: &[RunRecord], workload: &str) -> bool {
    runs.iter().filter(|r| r.workload == workload).all(|r| r.block_bytes <= 16 << 10)
}

/// Small multiples: a panel per workload with grouped bars per array.
pub fn throughput_chart(report: &BenchReport) -> String {
    let runs = &report.runs;
    let series = series(runs, true);
    let workloads: Vec<&str> = distinct(runs, |r| &r.workload)
        .into_iter()
        .filter(|w| runs.iter().any(|r| r.workload == *w && r.status == Status::Ok))
        .collect();
    let cols = workloads.len().clamp(1, 4);
    let rows = workloads.len().div_ceil(cols).max(1);
    let (panel_w, panel_h) = (300.0, 240.0);
    let width = cols as f64 * panel_w + 20.0;
    let mut body = String::new();
    let legend_bottom = legend(&mut body, &series, 20.0, 62.0, width - 40.0);
    let top = legend_bottom + 10.0;
    let height = top + rows as f64 * panel_h + 10.0;
    let title = "raidnbd bench: throughput per workload (higher is better)";
    let mut svg = open_svg(width, height, title);
    let _ = writeln!(svg, r#"<text x="20" y="26" font-size="18" font-weight="bold" {FONT}>{}</text>"#, esc(title));
    let _ =
        writeln!(svg, r##"<text x="20" y="44" font-size="12" fill="#555" {FONT}>{}</text>"##, esc(&subtitle(report)));
    svg.push_str(&body);
    for (i, &w) in workloads.iter().enumerate() {
        let (px, py) = (10.0 + (i % cols) as f64 * panel_w, top + (i / cols) as f64 * panel_h);
        let iops = shows_iops(runs, w);
        let unit = if iops { "IOPS" } else { "MB/s" };
        let label = runs.iter().find(|r| r.workload == w).map_or(w, |r| r.label.as_str());
        let values: Vec<Option<f64>> = series
            .iter()
            .map(|s| {
                runs.iter()
                    .find(|r| r.array == s.array && r.cache == s.cache && r.workload == w && r.status == Status::Ok)
                    .and_then(|r| if iops { r.iops } else { r.mb_per_s })
            })
            .collect();
        let max = values.iter().flatten().fold(0.0f64, |m, &v| m.max(v));
        let (ymax, step) = nice_axis(max);
        let (left, right, ptop, bottom) = (px + 58.0, px + panel_w - 12.0, py + 34.0, py + panel_h - 26.0);
        let scale = |v: f64| bottom - (v / ymax) * (bottom - ptop);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13" font-weight="bold" {FONT}>{}</text>"#,
            (left + right) / 2.0,
            py + 18.0,
            esc(label)
        );
        let mut t = 0.0;
        while t <= ymax + step * 1e-9 {
            let y = scale(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10" {FONT}>{}</text>"##,
                left - 4.0,
                y + 3.5,
                tick_label(t)
            );
            t += step;
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" {FONT} transform="rotate(-90 {:.1} {:.1})">{unit}</text>"#,
            px + 14.0,
            (ptop + bottom) / 2.0,
            px + 14.0,
            (ptop + bottom) / 2.0
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{bottom:.1}" x2="{right:.1}" y2="{bottom:.1}" stroke="#333"/><line x1="{left:.1}" y1="{ptop:.1}" x2="{left:.1}" y2="{bottom:.1}" stroke="#333"/>"##
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="#555" {FONT}>arrays (colors: legend)</text>"##,
            (left + right) / 2.0,
            bottom + 16.0
        );
        let slot = (right - left) / series.len().max(1) as f64;
        let bar_w = (slot * 0.8).min(48.0);
        for (k, (s, v)) in series.iter().zip(&values).enumerate() {
            let Some(v) = *v else { continue };
            let xc = left + slot * (k as f64 + 0.5);
            let y = scale(v);
            let _ = writeln!(
                svg,
                r#"<rect x="{:.1}" y="{y:.1}" width="{bar_w:.1}" height="{:.1}" fill="{}"><title>{}: {} {unit}</title></rect>"#,
                xc - bar_w / 2.0,
                (bottom - y).max(0.0),
                s.color,
                esc(&s.label),
                if iops { format_iops(v) } else { format_mb(v) }
            );
            bar_value(&mut svg, xc, y, bar_w, &if iops { format_iops(v) } else { format_mb(v) });
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// One chart of ratios to a single member, every workload, every array.
pub fn ratio_chart(report: &BenchReport) -> String {
    let runs = &report.runs;
    let series = series(runs, false);
    let workloads: Vec<&str> = distinct(runs, |r| &r.workload)
        .into_iter()
        .filter(|w| runs.iter().any(|r| r.workload == *w && r.ratio_vs_single.is_some() && r.level != "single"))
        .collect();
    let group_w = (series.len().max(1) as f64 * 16.0 + 14.0).max(60.0);
    // Room on the left for the y axis and the slanted label of the first group.
    let longest = workloads.iter().map(|w| w.len()).max().unwrap_or(10) as f64;
    let (left, right_pad) = ((longest * 5.0).max(80.0), 90.0);
    let width = (left + workloads.len().max(1) as f64 * group_w + right_pad).max(640.0);
    let mut body = String::new();
    let legend_bottom = legend(&mut body, &series, 20.0, 62.0, width - 40.0);
    let (ptop, plot_h) = (legend_bottom + 24.0, 320.0);
    let bottom = ptop + plot_h;
    let height = bottom + 170.0;
    let title = "raidnbd bench: each array's MB/s over a single member's";
    let mut svg = open_svg(width, height, title);
    let _ = writeln!(svg, r#"<text x="20" y="26" font-size="18" font-weight="bold" {FONT}>{}</text>"#, esc(title));
    let _ =
        writeln!(svg, r##"<text x="20" y="44" font-size="12" fill="#555" {FONT}>{}</text>"##, esc(&subtitle(report)));
    svg.push_str(&body);
    let values: Vec<Vec<Option<f64>>> = workloads
        .iter()
        .map(|w| {
            series
                .iter()
                .map(|s| {
                    runs.iter()
                        .find(|r| r.array == s.array && r.cache == s.cache && r.workload == *w)
                        .and_then(|r| r.ratio_vs_single)
                })
                .collect()
        })
        .collect();
    let max = values.iter().flatten().flatten().fold(1.0f64, |m, &v| m.max(v));
    let (ymax, step) = nice_axis(max);
    let right = left + workloads.len().max(1) as f64 * group_w;
    let scale = |v: f64| bottom - (v / ymax) * plot_h;
    let mut t = 0.0;
    while t <= ymax + step * 1e-9 {
        let y = scale(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11" {FONT}>{}×</text>"##,
            left - 5.0,
            y + 4.0,
            tick_label(t)
        );
        t += step;
    }
    let y1 = scale(1.0);
    let _ = writeln!(
        svg,
        r##"<line x1="{left:.1}" y1="{y1:.1}" x2="{right:.1}" y2="{y1:.1}" stroke="#333" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="start" fill="#333" {FONT}>single = 1×</text>"##,
        right + 6.0,
        y1 + 4.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{:.1}" text-anchor="middle" font-size="12" {FONT} transform="rotate(-90 18 {:.1})">× single member (MB/s ratio)</text>"#,
        (ptop + bottom) / 2.0,
        (ptop + bottom) / 2.0
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{left:.1}" y1="{bottom:.1}" x2="{right:.1}" y2="{bottom:.1}" stroke="#333"/><line x1="{left:.1}" y1="{ptop:.1}" x2="{left:.1}" y2="{bottom:.1}" stroke="#333"/>"##
    );
    for (g, w) in workloads.iter().enumerate() {
        let gx = left + g as f64 * group_w;
        let label = runs.iter().find(|r| r.workload == *w).map_or(*w, |r| r.label.as_str());
        let lx = gx + group_w / 2.0;
        let _ = writeln!(
            svg,
            r#"<text x="{lx:.1}" y="{:.1}" text-anchor="end" font-size="11" {FONT} transform="rotate(-40 {lx:.1} {:.1})">{}</text>"#,
            bottom + 14.0,
            bottom + 14.0,
            esc(label)
        );
        let bar_w = 14.0;
        let inner = series.len() as f64 * 16.0;
        for (k, (s, v)) in series.iter().zip(&values[g]).enumerate() {
            let Some(v) = *v else { continue };
            let x = gx + (group_w - inner) / 2.0 + k as f64 * 16.0 + 1.0;
            let y = scale(v);
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{bar_w:.1}" height="{:.1}" fill="{}"><title>{} · {}: {v:.2}×</title></rect>"#,
                (bottom - y).max(0.0),
                s.color,
                esc(&s.label),
                esc(label)
            );
            bar_value(&mut svg, x + bar_w / 2.0, y, bar_w, &format!("{v:.1}"));
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12" {FONT}>workload</text>"#,
        (left + right) / 2.0,
        height - 8.0
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::tests::record;
    use crate::bench::record::{Machine, Settings, fill_ratios};

    fn report(runs: Vec<RunRecord>) -> BenchReport {
        BenchReport {
            tool: "raidnbd bench".into(),
            version: "0".into(),
            command: "raidnbd bench".into(),
            preset: None,
            published: Vec::new(),
            started_unix: 0,
            finished_unix: 0,
            machine: Machine::probe("fio-3.33".into()),
            settings: Settings {
                member_bytes: 1 << 30,
                member_location: "x".into(),
                member_bw_bytes_per_sec: Some(20 << 20),
                member_iops: Some(200),
                export_bw_bytes_per_sec: None,
                io_engine: "auto".into(),
                buffered: false,
                runtime_seconds: 10.0,
                ramp_seconds: 2.0,
                fill: true,
                caches: vec!["writethrough".into()],
                cache_bytes: None,
                rounds: 1,
                write_gather_us: None,
                consistency_policy: None,
            },
            runs,
            samples: vec![],
            notes: vec![],
        }
    }

    /// Tags open and close in order (a small well-formedness check).
    pub fn assert_balanced(svg: &str) {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            let end = rest[i..].find('>').expect("tag closes") + i;
            let tag = &rest[i + 1..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().unwrap().to_string());
            }
        }
        assert!(stack.is_empty(), "unclosed {stack:?}");
    }

    #[test]
    fn charts_have_bars_values_and_axes() {
        let mut runs = vec![
            record("single", "writethrough", "seq", Some(20.9)),
            record("raid0 4x64K", "writethrough", "seq", Some(82.0)),
            record("raid5 4x64K", "writethrough", "seq", Some(61.5)),
            record("raid5 4x64K", "writeback", "seq", None),
        ];
        runs.iter_mut().for_each(|r| r.block_bytes = 1 << 20);
        fill_ratios(&mut runs);
        let r = report(runs);
        let svg = throughput_chart(&r);
        assert_balanced(&svg);
        assert!(svg.contains(">82.0<") && svg.contains(">20.9<") && svg.contains(">MB/s<"), "{svg}");
        assert_eq!(svg.matches("<rect x=").count(), 3 + 3, "3 legend swatches + 3 bars (skipped has none)");
        let ratio = ratio_chart(&r);
        assert_balanced(&ratio);
        assert!(ratio.contains("3.9") && ratio.contains("single = 1×") && ratio.contains("× single member"));
    }

    #[test]
    fn axes_are_nice() {
        assert_eq!(nice_axis(83.0), (100.0, 25.0));
        assert_eq!(nice_axis(3.9), (4.0, 1.0));
        assert_eq!(nice_axis(812.0), (1000.0, 250.0));
        assert_eq!(nice_axis(0.0), (1.0, 0.25));
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(1000.0), "1k");
    }
}
