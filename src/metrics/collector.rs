//! `ScrapeCollector`: turns the live statistics and array state into metric families at
//! scrape time (a prometheus-client [`Collector`]).
//!
//! One collector covers every export, so each family (HELP/TYPE) appears once with the
//! samples of all exports. Array gauges are sampled here, from the engine's status calls;
//! nothing is polled in the background. Member samples get their `role` label here too:
//! the role index when active, `N-replacement` while replacing role N, `spare`, or `none`
//! once removed.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use raid_core::engine::{MaintenanceStatus, MaintenanceWork, RoleStatus, SlotState};

use super::ExportMetrics;
use super::device::Command;
use member_io::{LinkErrorKind, LinkState, LinkStats};
use raid_core::decorator::OpKind;

use super::member::MemberStats;
use super::op_stats::OpStats;

/// Picks one counter out of a member's link statistics.
type LinkCounter = fn(&LinkStats) -> &std::sync::atomic::AtomicU64;

const SLOT_STATES: [SlotState; 4] = [SlotState::InSync, SlotState::Recovering, SlotState::Faulty, SlotState::Missing];

const MAINTENANCE_KINDS: [&str; 5] = ["recovery", "replace", "resync", "check", "repair"];

/// The exports being measured (appended as they are set up, read at each scrape).
#[derive(Default)]
pub struct ScrapeCollector {
    pub exports: Mutex<Vec<Arc<ExportMetrics>>>,
}

impl fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScrapeCollector").finish_non_exhaustive()
    }
}

/// The state of one array at scrape time.
struct ArraySample {
    export: String,
    roles: Vec<RoleStatus>,
    spares: usize,
    failed_roles: usize,
    size_bytes: u64,
    maintenance: MaintenanceStatus,
    dirty_bitmap_chunks: Option<u64>,
    corruption: Vec<raid_core::engine::CorruptionCounts>,
}

/// One member at scrape time, with its labels.
struct MemberSample {
    export: String,
    member: String,
    role: String,
    stats: Arc<MemberStats>,
}

/// Writes one family: its HELP/TYPE lines, then one sample per label set.
fn family<S: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    samples: impl IntoIterator<Item = (S, M)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, value) in samples {
        debug_assert_eq!(value.metric_type(), metric_type, "{name}");
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(v: u64) -> ConstCounter<u64> {
    ConstCounter::new(v)
}

fn gauge<N>(v: N) -> ConstGauge<N> {
    ConstGauge::new(v)
}

fn maintenance_kind(work: MaintenanceWork) -> &'static str {
    let name = work.name();
    debug_assert!(MAINTENANCE_KINDS.contains(&name), "{name}");
    name
}

impl ArraySample {
    fn degraded(&self) -> bool {
        self.roles.iter().any(|r| r.state != SlotState::InSync)
    }

    fn progress_ratio(&self) -> f64 {
        let m = &self.maintenance;
        if m.current.is_none() || m.total == 0 {
            return 0.0;
        }
        (m.done as f64 / m.total as f64).clamp(0.0, 1.0)
    }

    /// md's mismatch_cnt: the running check's count, else the last finished one's.
    fn mismatch_sectors(&self) -> u64 {
        let m = &self.maintenance;
        match m.current {
            Some(MaintenanceWork::Check | MaintenanceWork::Repair) => m.mismatch_sectors,
            _ => m.last_scrub.map_or(0, |(_, counts)| counts.mismatch_sectors),
        }
    }
}

impl ScrapeCollector {
    fn sample(&self) -> (Vec<Arc<ExportMetrics>>, Vec<ArraySample>, Vec<MemberSample>) {
        let exports = self.exports.lock().expect("metrics exports lock").clone();
        let mut arrays = Vec::new();
        let mut members = Vec::new();
        for export in &exports {
            let mut roles_by_name: HashMap<String, String> = HashMap::new();
            if let Some(array) = export.array.get() {
                let sample = ArraySample {
                    export: export.name.clone(),
                    roles: array.admin().role_status(),
                    spares: 0,
                    failed_roles: array.admin().failed_roles().len(),
                    size_bytes: array.size_bytes(),
                    maintenance: array.maintenance().status(),
                    dirty_bitmap_chunks: array.maintenance().dirty_bitmap_chunks(),
                    corruption: array.maintenance().corruption(),
                };
                for r in &sample.roles {
                    if let Some(name) = &r.name {
                        roles_by_name.insert(name.clone(), r.role.to_string());
                    }
                    if let Some((name, _, _)) = &r.replacement {
                        roles_by_name.insert(name.clone(), format!("{}-replacement", r.role));
                    }
                }
                let spares = array.admin().spare_status();
                for (name, _) in &spares {
                    roles_by_name.insert(name.clone(), "spare".into());
                }
                arrays.push(ArraySample { spares: spares.len(), ..sample });
            }
            for (name, stats) in export.members.lock().expect("metrics members lock").iter() {
                members.push(MemberSample {
                    export: export.name.clone(),
                    member: name.clone(),
                    role: roles_by_name.get(name).cloned().unwrap_or_else(|| "none".into()),
                    stats: stats.clone(),
                });
            }
        }
        (exports, arrays, members)
    }
}

fn export_ops<'a>(
    exports: &'a [Arc<ExportMetrics>],
) -> impl Iterator<Item = ([(&'static str, &'a str); 2], &'a OpStats)> + 'a {
    exports.iter().flat_map(|e| {
        Command::ALL.into_iter().map(move |c| ([("export", e.name.as_str()), ("command", c.name())], e.requests.op(c)))
    })
}

fn member_ops(members: &[MemberSample]) -> impl Iterator<Item = ([(&'static str, &str); 4], &OpStats)> {
    members.iter().flat_map(|m| {
        OpKind::ALL.into_iter().map(move |op| {
            (
                [
                    ("export", m.export.as_str()),
                    ("member", m.member.as_str()),
                    ("role", m.role.as_str()),
                    ("op", op.name()),
                ],
                m.stats.op(op),
            )
        })
    })
}

fn member_labels(m: &MemberSample) -> [(&'static str, &str); 3] {
    [("export", m.export.as_str()), ("member", m.member.as_str()), ("role", m.role.as_str())]
}

fn member_bytes(m: &MemberSample, ops: &[OpKind]) -> u64 {
    ops.iter().map(|&op| m.stats.op(op).bytes()).sum()
}

fn export_bytes(e: &ExportMetrics, commands: &[Command]) -> u64 {
    commands.iter().map(|&c| e.requests.op(c).bytes()).sum()
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let (exports, arrays, members) = self.sample();
        let enc = &mut encoder;
        let export_label = |name: &str| [("export", name.to_string())];

        // Exports: what NBD clients asked for.
        family(
            enc,
            "export_requests",
            "NBD requests completed, by command.",
            MetricType::Counter,
            export_ops(&exports).map(|(l, s)| (l, counter(s.completed()))),
        )?;
        family(
            enc,
            "export_request_errors",
            "NBD requests that failed, by command.",
            MetricType::Counter,
            export_ops(&exports).map(|(l, s)| (l, counter(s.errors()))),
        )?;
        family(
            enc,
            "export_request_duration_seconds",
            "Time from the NBD server handing a request to the export until it completed.",
            MetricType::Histogram,
            export_ops(&exports).map(|(l, s)| (l, s.latency.snapshot())),
        )?;
        family(
            enc,
            "export_read_bytes",
            "Bytes read by NBD clients.",
            MetricType::Counter,
            exports.iter().map(|e| (export_label(&e.name), counter(export_bytes(e, &[Command::Read])))),
        )?;
        family(
            enc,
            "export_read_in_place_bytes",
            "Bytes of export_read_bytes answered from member files in memory, not read into buffers (TCP and Unix sockets send them from the files' pages).",
            MetricType::Counter,
            exports.iter().map(|e| (export_label(&e.name), counter(e.requests.read_in_place_bytes()))),
        )?;
        family(
            enc,
            "export_write_in_place_bytes",
            "Bytes of export_written_bytes received straight into member files in memory, not into buffers.",
            MetricType::Counter,
            exports.iter().map(|e| (export_label(&e.name), counter(e.requests.write_in_place_bytes()))),
        )?;
        family(
            enc,
            "export_written_bytes",
            "Bytes written by NBD clients (WRITE payloads).",
            MetricType::Counter,
            exports.iter().map(|e| (export_label(&e.name), counter(export_bytes(e, &[Command::Write])))),
        )?;
        family(
            enc,
            "export_zeroed_bytes",
            "Bytes of TRIM and WRITE_ZEROES ranges completed.",
            MetricType::Counter,
            exports
                .iter()
                .map(|e| (export_label(&e.name), counter(export_bytes(e, &[Command::Trim, Command::WriteZeroes])))),
        )?;
        family(
            enc,
            "export_requests_in_flight",
            "NBD requests being served now.",
            MetricType::Gauge,
            exports.iter().map(|e| (export_label(&e.name), gauge(e.requests.in_flight()))),
        )?;

        // Members: what the array did with them.
        family(
            enc,
            "member_ops",
            "Member I/O operations completed, by kind.",
            MetricType::Counter,
            member_ops(&members).map(|(l, s)| (l, counter(s.completed()))),
        )?;
        family(
            enc,
            "member_errors",
            "Member I/O operations that failed, by kind.",
            MetricType::Counter,
            member_ops(&members).map(|(l, s)| (l, counter(s.errors()))),
        )?;
        family(
            enc,
            "member_op_duration_seconds",
            "Latency of member I/O operations, by kind.",
            MetricType::Histogram,
            member_ops(&members).map(|(l, s)| (l, s.latency.snapshot())),
        )?;
        family(
            enc,
            "member_read_bytes",
            "Bytes read from the member.",
            MetricType::Counter,
            members.iter().map(|m| (member_labels(m), counter(member_bytes(m, &[OpKind::Read])))),
        )?;
        family(
            enc,
            "member_written_bytes",
            "Bytes written to the member.",
            MetricType::Counter,
            members.iter().map(|m| (member_labels(m), counter(member_bytes(m, &[OpKind::Write])))),
        )?;
        family(
            enc,
            "member_zeroed_bytes",
            "Bytes discarded or zeroed on the member.",
            MetricType::Counter,
            members
                .iter()
                .map(|m| (member_labels(m), counter(member_bytes(m, &[OpKind::Discard, OpKind::WriteZeroes])))),
        )?;

        // Members on other hosts: what their connections went through.
        let links: Vec<(String, String, Arc<LinkStats>)> = exports
            .iter()
            .filter_map(|e| e.links.get().map(|l| (e, l)))
            .flat_map(|(e, l)| l.all().into_iter().map(move |(uri, s)| (e.name.clone(), uri, s)))
            .collect();
        let link_labels =
            |(export, uri, _): &(String, String, Arc<LinkStats>)| [("export", export.clone()), ("member", uri.clone())];
        let link_counters: [(&str, &str, LinkCounter); 5] = [
            ("member_link_disconnects", "Connections to an NBD member that were lost.", |l| &l.disconnects),
            ("member_link_reconnects", "Lost connections to an NBD member replaced by a new one.", |l| &l.reconnects),
            ("member_request_timeouts", "NBD member requests that got no answer within --member-timeout.", |l| {
                &l.timeouts
            }),
            ("member_request_retries", "NBD member requests re-sent on a new connection.", |l| &l.retries),
            ("member_log_lines_suppressed", "Warnings about an NBD member held back by the rate limit.", |l| {
                &l.log_lines_suppressed
            }),
        ];
        for (name, help, field) in link_counters {
            family(
                enc,
                name,
                help,
                MetricType::Counter,
                links.iter().map(|l| (link_labels(l), counter(LinkStats::get(field(&l.2))))),
            )?;
        }
        family(
            enc,
            "member_link_errors",
            "What went wrong with the link to an NBD member, by kind: timeout, protocol (a \
             violation), io (an error the server answered), connection (lost or refused), identity \
             (came back as another disk), refused (export or TLS).",
            MetricType::Counter,
            links.iter().flat_map(|l| {
                LinkErrorKind::ALL.into_iter().map(move |kind| {
                    let [export, member] = link_labels(l);
                    ([export, member, ("kind", kind.label().to_string())], counter(l.2.errors(kind)))
                })
            }),
        )?;
        family(
            enc,
            "member_link_up",
            "1 while the connection to an NBD member is up.",
            MetricType::Gauge,
            links.iter().map(|l| (link_labels(l), gauge(i64::from(l.2.state() == LinkState::Connected)))),
        )?;

        // Arrays: state sampled now.
        family(
            enc,
            "array_degraded",
            "1 when a role is not in sync (faulty, missing or recovering).",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(i64::from(a.degraded())))),
        )?;
        family(
            enc,
            "array_role_state",
            "1 for the current state of each role (in_sync, recovering, faulty, missing).",
            MetricType::Gauge,
            arrays.iter().flat_map(|a| {
                a.roles.iter().flat_map(move |r| {
                    SLOT_STATES.into_iter().map(move |s| {
                        (
                            [
                                ("export", a.export.clone()),
                                ("role", r.role.to_string()),
                                ("state", s.name().to_string()),
                            ],
                            gauge(i64::from(r.state == s)),
                        )
                    })
                })
            }),
        )?;
        family(
            enc,
            "array_failed_members",
            "Roles that are faulty or missing.",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(a.failed_roles as u64))),
        )?;
        family(
            enc,
            "array_spares",
            "Spare members waiting for a role.",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(a.spares as u64))),
        )?;
        family(
            enc,
            "array_size_bytes",
            "Size of the array as served.",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(a.size_bytes))),
        )?;
        family(
            enc,
            "array_maintenance_running",
            "1 for the background job running now (recovery, replace, resync, check, repair).",
            MetricType::Gauge,
            arrays.iter().flat_map(|a| {
                let current = a.maintenance.current.map(maintenance_kind);
                MAINTENANCE_KINDS.into_iter().map(move |k| {
                    ([("export", a.export.clone()), ("kind", k.to_string())], gauge(i64::from(current == Some(k))))
                })
            }),
        )?;
        family(
            enc,
            "array_maintenance_progress_ratio",
            "Progress of the running background job, 0 to 1 (0 when idle).",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(a.progress_ratio()))),
        )?;
        family(
            enc,
            "array_resync_pending",
            "1 while the resync after an unclean stop has not finished.",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(i64::from(a.maintenance.resync_pending)))),
        )?;
        family(
            enc,
            "array_mismatch_sectors",
            "md's mismatch_cnt: sectors found inconsistent by the running or last check/repair.",
            MetricType::Gauge,
            arrays.iter().map(|a| (export_label(&a.export), gauge(a.mismatch_sectors()))),
        )?;
        // Roles whose member has checksums (create --integrity).
        let checked = || {
            arrays.iter().flat_map(|a| {
                a.roles.iter().filter_map(move |r| {
                    let found = a.corruption.get(r.role).copied().unwrap_or_default();
                    r.integrity.map(|i| ([("export", a.export.clone()), ("role", r.role.to_string())], i, found))
                })
            })
        };
        family(
            enc,
            "array_role_verified_blocks",
            "4 KiB blocks read from the role's member and found to match their checksums.",
            MetricType::Counter,
            checked().map(|(l, i, _)| (l, counter(i.verified_blocks))),
        )?;
        family(
            enc,
            "array_role_corrupt_blocks",
            "4 KiB blocks read from the role's member that did not match their checksums (silent corruption).",
            MetricType::Counter,
            checked().map(|(l, i, _)| (l, counter(i.corrupt_blocks))),
        )?;
        family(
            enc,
            "array_role_healed_sectors",
            "Sectors of the role's member rewritten from redundancy after it returned wrong bytes.",
            MetricType::Counter,
            checked().map(|(l, _, c)| (l, counter(c.healed_sectors))),
        )?;
        family(
            enc,
            "array_role_untrusted_bytes",
            "Bytes of the role's member whose checksums are stamped again when next read (after an unclean stop).",
            MetricType::Gauge,
            checked().map(|(l, i, _)| (l, gauge(i.untrusted_bytes))),
        )?;
        family(
            enc,
            "array_bitmap_dirty_chunks",
            "Write-intent bitmap chunks marked dirty (arrays with a bitmap).",
            MetricType::Gauge,
            arrays.iter().filter_map(|a| a.dirty_bitmap_chunks.map(|c| (export_label(&a.export), gauge(c)))),
        )?;

        // The process: what serving costs.
        let none: [(&str, &str); 0] = [];
        family(
            enc,
            "process_cpu_seconds",
            "CPU time the server process used, user and system, all threads (getrusage).",
            MetricType::Counter,
            [(none, ConstCounter::new(process_cpu_seconds()))],
        )?;
        family(
            enc,
            "data_copied_bytes",
            "Bytes of written data copied in memory after they were received (out of a connection's read buffer, \
             gathering, stripe and parity jobs, joined runs, partial pages and sectors, mirror legs and NBD member \
             pieces from owned copies): copies per byte written = 1 + this / export_written_bytes.",
            MetricType::Counter,
            [(none, counter(raid_core::copy_count::copied_bytes() + nbd_server::buffered_payload_copied_bytes()))],
        )?;
        Ok(())
    }
}

/// User and system CPU seconds of this process so far.
fn process_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` through the pointer, which points to one.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: zeroed is a valid `rusage` (plain integers), and getrusage filled it.
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}
