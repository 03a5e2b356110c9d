//! [`LinkRegistry`]: the connection statistics ([`LinkStats`]: reconnects, timeouts) of the
//! NBD members an export opened, by URI.
//!
//! Contract: every open of the same URI (a re-add, a reconnect) gets the same statistics, so
//! the counts go on across opens; the registry only grows. `open` fills it when it opens a
//! member; `metrics`, `control` and `rejoin` read it. It uses none of them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use member_io::LinkStats;

/// The link statistics of the NBD members an export opened, by URI: every open of the same
/// URI (a re-add) shares one, so the counts go on.
#[derive(Clone, Default)]
pub struct LinkRegistry(Arc<Mutex<BTreeMap<String, Arc<LinkStats>>>>);

impl LinkRegistry {
    /// The statistics of `uri` (created on first use).
    pub fn get(&self, uri: &str) -> Arc<LinkStats> {
        self.0.lock().expect("link registry").entry(uri.to_string()).or_default().clone()
    }

    /// The statistics of `uri`, if it was ever opened.
    pub fn find(&self, uri: &str) -> Option<Arc<LinkStats>> {
        self.0.lock().expect("link registry").get(uri).cloned()
    }

    pub fn all(&self) -> Vec<(String, Arc<LinkStats>)> {
        self.0.lock().expect("link registry").iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}
