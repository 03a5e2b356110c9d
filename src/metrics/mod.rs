//! Prometheus metrics (`raidnbd serve --metrics ADDR`, off by default).
//!
//! ```text
//!  NBD server ─► MeteredDevice ─► ArrayDevice ─► Array ─► MeteredMember ─► Faulty ─► Throttled ─► backend
//!                 │ ExportStats                            │ MemberStats (by member name)
//!                 └──────────────┬─────────────────────────┘
//!  GET /metrics ─► http ─► Registry ─► ScrapeCollector: counters and histograms read from
//!                                      the atomics, array gauges sampled from the engine now
//! ```
//!
//! Recording costs a few relaxed atomic adds per request and per member I/O (no locks, no
//! allocation besides the wrapper's boxed future); all label handling and formatting
//! happens at scrape time. prometheus-client does the exposition formats (escaping,
//! HELP/TYPE, `# EOF`); metric names start with `raidnbd_`.

mod collector;
mod device;
mod http;
mod latency;
mod member;
mod op_stats;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result};
use nbd_server::BlockDevice;
use prometheus_client::registry::Registry;
use raid_core::Member;
use raid_core::engine::Array;

use collector::ScrapeCollector;
pub use device::{ExportStats, MeteredDevice};
pub use http::Format;
pub use member::{MemberStats, MeteredMember};

/// Everything measured about one export.
pub struct ExportMetrics {
    pub name: String,
    pub requests: Arc<ExportStats>,
    /// Statistics of every member ever opened for this export, by member name.
    members: Mutex<BTreeMap<String, Arc<MemberStats>>>,
    /// The array behind the export, for gauges (set once it is assembled).
    array: OnceLock<Arc<Array<dyn Member>>>,
    /// Its NBD members' connections (set with the member options).
    pub links: OnceLock<crate::link_registry::LinkRegistry>,
}

impl ExportMetrics {
    /// The statistics of the member named `name` (created on first use).
    pub fn member(&self, name: &str) -> Arc<MemberStats> {
        self.members.lock().expect("metrics members lock").entry(name.to_string()).or_default().clone()
    }

    /// Wraps `member` so its I/O is recorded under its name.
    pub fn meter_member(&self, member: Arc<dyn Member>) -> Arc<dyn Member> {
        let stats = self.member(member.name());
        Arc::new(MeteredMember::new(member, stats))
    }
}

/// The metrics of a server: a registry over all exports.
pub struct Metrics {
    registry: Registry,
    collector: Arc<ScrapeCollector>,
}

impl Default for Metrics {
    fn default() -> Self {
        let collector = Arc::new(ScrapeCollector::default());
        let mut registry = Registry::with_prefix("raidnbd");
        registry.register_collector(Box::new(collector.clone()));
        Self { registry, collector }
    }
}

impl Metrics {
    /// The metrics of export `name` (created on first use).
    pub fn export(&self, name: &str) -> Arc<ExportMetrics> {
        let mut exports = self.collector.exports.lock().expect("metrics exports lock");
        if let Some(e) = exports.iter().find(|e| e.name == name) {
            return e.clone();
        }
        let export = Arc::new(ExportMetrics {
            name: name.to_string(),
            requests: Arc::default(),
            members: Mutex::default(),
            array: OnceLock::new(),
            links: OnceLock::new(),
        });
        exports.push(export.clone());
        export
    }

    /// The exposition text.
    pub fn render(&self, format: Format) -> String {
        let mut out = String::with_capacity(64 << 10);
        let encoded = match format {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry),
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &self.registry),
        };
        encoded.expect("writing to a String cannot fail");
        out
    }
}

/// Binds `addr` and serves `/metrics` there in the background; `None` (the default) turns
/// metrics off. Fails when the address cannot be bound.
pub async fn start(addr: Option<SocketAddr>) -> Result<Option<Arc<Metrics>>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let metrics = Arc::new(Metrics::default());
    let render: http::Render = {
        let metrics = metrics.clone();
        Arc::new(move |format| metrics.render(format))
    };
    tracing::info!("metrics on http://{addr}/metrics");
    tokio::spawn(http::serve(listener, render, http::Limits::default()));
    Ok(Some(metrics))
}

/// Registers `array` as export `name`'s array and wraps `device` to record its requests;
/// without metrics, returns `device` unchanged.
pub fn instrument(
    metrics: Option<&Arc<Metrics>>,
    name: &str,
    array: &Arc<Array<dyn Member>>,
    device: Arc<dyn BlockDevice>,
) -> Arc<dyn BlockDevice> {
    let Some(metrics) = metrics else { return device };
    let export = metrics.export(name);
    if export.array.set(array.clone()).is_err() {
        tracing::warn!("metrics: export {name:?} is served twice; its array gauges show the first");
    }
    Arc::new(MeteredDevice::new(device, export.requests.clone()))
}
