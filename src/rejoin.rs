//! Re-add of returning members (md's re-add; udev and `mdadm --incremental` do it there).
//!
//! A member on another host that failed because its server went away (its link is
//! [`LinkState::Lost`]: not back within `--member-timeout`, or lost holding unflushed writes)
//! or that was absent at start is tried again every [`REJOIN_INTERVAL`]. When its export
//! answers with this array's superblock, in a role that is failed now, and the write-intent
//! bitmap (or, without one, the away record) has covered every write since it left, it is
//! re-added: only the chunks written meanwhile are copied. A member that failed with I/O
//! errors (its server answered: the disk is bad) is not retried, nor one that came back as
//! another disk; `ctl re-add` asks for the same on any member, once. Members the array had
//! recorded as failed, or that fell behind, when it was assembled are tried as well.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use member_io::LinkState;
use raid_core::Member;
use raid_core::engine::Array;
use raid_core::md::Superblock;
use tokio::sync::Notify;

use crate::open::{MemberOpenOptions, open_member, read_superblock_area};

/// How often members that went away are tried again.
const REJOIN_INTERVAL: Duration = Duration::from_secs(2);

/// The failed role `member` can come back to with a bitmap-based recovery, or why not: its
/// superblock is this array's, its role is failed now, and the bitmap covered every write
/// since it left (its events are at least the bitmap's events_cleared, as md checks) or,
/// without a bitmap, the away record did (its events are at least the record's start).
pub async fn returning_role(array: &Array<dyn Member>, member: &dyn Member) -> Result<usize, String> {
    let summary = array.admin().metadata_summary().ok_or("the array has no md metadata")?;
    let (cleared, history) = match (summary.bitmap_events_cleared, array.admin().away_since_events()) {
        (Some(cleared), _) => (cleared, "the bitmap's history"),
        (None, Some(since)) => (since, "the away record began"),
        (None, None) => {
            return Err("the array has no write-intent bitmap and no record of what was written meanwhile".into());
        }
    };
    let area = read_superblock_area(member).await.map_err(|e| format!("{e:#}"))?;
    let sb = Superblock::decode(&area).map_err(|e| format!("no md superblock: {e}"))?;
    if sb.set_uuid.0 != summary.uuid {
        return Err("its superblock belongs to another array".into());
    }
    let role = sb.role().active().ok_or("it held no role")?;
    if !array.admin().failed_roles().contains(&role) {
        return Err(format!("its role {role} is not failed"));
    }
    if sb.events < cleared {
        return Err(format!("it left before {history} (events {} < {cleared}): add it as a spare", sb.events));
    }
    if sb.events > summary.events {
        return Err(format!(
            "its events {} are ahead of the array's {}: it was used elsewhere",
            sb.events, summary.events
        ));
    }
    Ok(role)
}

/// Watches `array` for members on other hosts coming back; `absent`: members named at start
/// that could not be opened.
pub fn spawn(array: Arc<Array<dyn Member>>, options: MemberOpenOptions, absent: Vec<String>, wake: Arc<Notify>) {
    let absent: BTreeSet<String> = absent.into_iter().filter(|m| nbd_client::ExportAddress::is_uri(m)).collect();
    tokio::spawn(async move {
        // The URI each role last had, and the URIs tried and refused (never tried again).
        let mut last_uri: BTreeMap<usize, String> = BTreeMap::new();
        let mut refused: BTreeSet<String> = BTreeSet::new();
        loop {
            tokio::time::sleep(REJOIN_INTERVAL).await;
            let roles = array.admin().role_status();
            for r in &roles {
                if let Some(name) = r.name.as_ref().filter(|n| nbd_client::ExportAddress::is_uri(n)) {
                    last_uri.insert(r.role, name.clone());
                }
            }
            let failed = array.admin().failed_roles();
            if failed.is_empty() || array.is_read_only() {
                continue;
            }
            let lost = failed
                .iter()
                .filter_map(|role| last_uri.get(role))
                .filter(|uri| options.links.find(uri).is_some_and(|l| matches!(l.state(), LinkState::Lost(_))));
            let candidates: BTreeSet<String> =
                lost.chain(absent.iter()).filter(|u| !refused.contains(*u)).cloned().collect();
            for uri in candidates {
                if roles.iter().any(|r| r.name.as_deref() == Some(&uri) && !failed.contains(&r.role)) {
                    continue; // back in service already (ctl add)
                }
                let Ok(member) = open_member(&uri, &options).await else { continue };
                match returning_role(&array, member.as_ref()).await {
                    Ok(role) => match array.admin().re_add(role, member).await {
                        Ok(()) => {
                            tracing::info!(member = %uri, role, "member is back: re-added");
                            wake.notify_one();
                        }
                        Err(e) => {
                            tracing::warn!(member = %uri, "member is back but cannot be re-added: {e}");
                            refused.insert(uri);
                        }
                    },
                    Err(why) => {
                        tracing::warn!(member = %uri, "member answers again but is not re-added: {why}");
                        refused.insert(uri);
                    }
                }
            }
        }
    });
}
