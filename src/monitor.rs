//! Watches the served arrays like `mdadm --monitor`: every [`POLL_INTERVAL`] it compares each
//! array's members and background work with what it saw last, and for every change
//! - logs it,
//! - runs `serve --on-event CMD` as `CMD EVENT EXPORT [MEMBER]` (mdadm --program's events:
//!   Fail, DegradedArray, RebuildStarted, RebuildFinished, SpareActive),
//! - tells systemd the arrays' state (`STATUS=`, shown by `systemctl status`).
//!
//! Polling keeps the engine free of callbacks into the binary; a state that comes and goes
//! between two polls is reported by what changed: a role that was failed or empty and is in
//! sync at the next look was rebuilt meanwhile (RebuildStarted, SpareActive, RebuildFinished).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nbd_server::CancellationToken;
use raid_core::Member;
use raid_core::engine::{Array, MaintenanceWork, SlotState};

/// How often the arrays are looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Most event commands running at once; events past it are logged and not run.
const MAX_RUNNING_COMMANDS: usize = 16;

pub struct Watched {
    pub export: String,
    pub array: Arc<Array<dyn Member>>,
}

/// One role as the monitor sees it.
#[derive(Clone, PartialEq, Debug)]
struct RoleSnapshot {
    name: Option<String>,
    state: SlotState,
    /// Failures so far (counted by the engine, so none is missed between polls) and the
    /// name of the device that failed last.
    failures: u64,
    last_failed: Option<String>,
}

/// What the monitor compares between polls.
#[derive(Clone, PartialEq, Debug)]
struct Snapshot {
    roles: Vec<RoleSnapshot>,
    work: Option<MaintenanceWork>,
    percent: u64,
}

impl Snapshot {
    fn of(array: &Array<dyn Member>) -> Snapshot {
        let maintenance = array.maintenance().status();
        let percent = (maintenance.done * 100).checked_div(maintenance.total).unwrap_or(0);
        Snapshot {
            roles: array
                .admin()
                .role_status()
                .into_iter()
                .map(|r| RoleSnapshot {
                    name: r.name,
                    state: r.state,
                    failures: r.failures,
                    last_failed: r.last_failed,
                })
                .collect(),
            work: maintenance.current,
            percent,
        }
    }

    fn degraded(&self) -> bool {
        self.roles.iter().any(|r| r.state != SlotState::InSync)
    }

    /// "raid5 clean", "raid5 degraded, recovery 42%".
    fn describe(&self, level: &str) -> String {
        let mut text = format!("{level} {}", if self.degraded() { "degraded" } else { "clean" });
        if let Some(work) = self.work {
            text.push_str(&format!(", {} {}%", work.name(), self.percent));
        }
        text
    }
}

/// An event for `--on-event`: (name, member).
type Event = (&'static str, Option<String>);

/// The events between two snapshots (`None`: the first look, at start).
fn events(before: Option<&Snapshot>, now: &Snapshot) -> Vec<Event> {
    let mut out = Vec::new();
    let Some(before) = before else {
        if now.degraded() {
            out.push(("DegradedArray", None));
        }
        if now.work.is_some() {
            out.push(("RebuildStarted", None));
        }
        return out;
    };
    for (i, role) in now.roles.iter().enumerate() {
        let Some(old) = before.roles.get(i) else { continue };
        for _ in old.failures..role.failures {
            out.push(("Fail", role.last_failed.clone()));
        }
        if role.state == SlotState::InSync && matches!(old.state, SlotState::Faulty | SlotState::Missing) {
            // Rebuilt between two looks (the rebuild of a sparse member can take less than
            // an interval): all of it happened, so all of it is told.
            out.push(("RebuildStarted", role.name.clone()));
            out.push(("SpareActive", role.name.clone()));
            out.push(("RebuildFinished", role.name.clone()));
        } else if role.state == SlotState::InSync && old.state == SlotState::Recovering {
            out.push(("SpareActive", role.name.clone()));
        } else if role.state == SlotState::InSync && old.name.is_some() && role.name != old.name {
            out.push(("SpareActive", role.name.clone())); // a replacement took the role over
        }
    }
    match (before.work, now.work) {
        (None, Some(w)) => out.push(("RebuildStarted", work_member(now, w))),
        (Some(w), None) => out.push(("RebuildFinished", work_member(before, w))),
        (Some(a), Some(b)) if a != b => {
            out.push(("RebuildFinished", work_member(before, a)));
            out.push(("RebuildStarted", work_member(now, b)));
        }
        _ => {}
    }
    out
}

fn work_member(snapshot: &Snapshot, work: MaintenanceWork) -> Option<String> {
    match work {
        MaintenanceWork::Recovery { role } | MaintenanceWork::Replace { role } => {
            snapshot.roles.get(role).and_then(|r| r.name.clone())
        }
        _ => None,
    }
}

/// Runs until `stop` is cancelled.
pub fn spawn(watched: Vec<Watched>, on_event: Option<String>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let running = Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING_COMMANDS));
        let mut last: Vec<Option<Snapshot>> = vec![None; watched.len()];
        let mut last_status = String::new();
        loop {
            let mut status = Vec::new();
            for (w, last) in watched.iter().zip(last.iter_mut()) {
                let now = Snapshot::of(&w.array);
                if last.as_ref() != Some(&now) {
                    for (event, member) in events(last.as_ref(), &now) {
                        tracing::info!(export = %w.export, member = member.as_deref().unwrap_or("-"), "event {event}");
                        if let Some(cmd) = &on_event {
                            run_command(cmd, event, &w.export, member.as_deref(), &running);
                        }
                    }
                    *last = Some(now.clone());
                }
                status.push(format!(
                    "{}: {}",
                    display_name(&w.export),
                    now.describe(&w.array.geometry().level().to_string())
                ));
            }
            let status = status.join("; ");
            if status != last_status {
                crate::notify::status(&status);
                last_status = status;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
            }
        }
    })
}

fn display_name(export: &str) -> &str {
    if export.is_empty() { "(default export)" } else { export }
}

/// `sh -c 'CMD "$@"' raidnbd EVENT EXPORT [MEMBER]`: CMD may carry its own arguments. Its
/// output goes to our stderr; it does not inherit systemd's notify and activation variables.
fn run_command(cmd: &str, event: &str, export: &str, member: Option<&str>, running: &Arc<tokio::sync::Semaphore>) {
    let Ok(permit) = running.clone().try_acquire_owned() else {
        tracing::warn!(
            event,
            "--on-event: {MAX_RUNNING_COMMANDS} commands still running; not running it for this event"
        );
        return;
    };
    let mut command = tokio::process::Command::new("/bin/sh");
    command.arg("-c").arg(format!("{cmd} \"$@\"")).arg("raidnbd").arg(event).arg(export);
    if let Some(m) = member {
        command.arg(m);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDNAMES");
    let event = event.to_string();
    match command.spawn() {
        Ok(mut child) => {
            tokio::spawn(async move {
                let _permit = permit;
                match child.wait().await {
                    Ok(s) if s.success() => {}
                    Ok(s) => tracing::warn!(event, "--on-event command exited with {s}"),
                    Err(e) => tracing::warn!(event, "--on-event command: {e}"),
                }
            });
        }
        Err(e) => tracing::warn!(event, "cannot run --on-event command: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(states: &[(&str, SlotState)], work: Option<MaintenanceWork>) -> Snapshot {
        let roles = states
            .iter()
            .map(|(n, s)| RoleSnapshot { name: Some(n.to_string()), state: *s, failures: 0, last_failed: None })
            .collect();
        Snapshot { roles, work, percent: 0 }
    }

    fn with_failures(mut snapshot: Snapshot, role: usize, failures: u64, name: &str) -> Snapshot {
        snapshot.roles[role].failures = failures;
        snapshot.roles[role].last_failed = Some(name.to_string());
        snapshot
    }

    /// Role 1 recovering onto spare "c" after "b" failed once.
    fn failed_again(after_fail: &Snapshot) -> Snapshot {
        let mut s = snap(
            &[("a", SlotState::InSync), ("c", SlotState::Recovering)],
            Some(MaintenanceWork::Recovery { role: 1 }),
        );
        s.roles[1].failures = after_fail.roles[1].failures;
        s.roles[1].last_failed = after_fail.roles[1].last_failed.clone();
        s
    }

    #[test]
    fn events_follow_mdadm_monitor() {
        use SlotState::*;
        let healthy = snap(&[("a", InSync), ("b", InSync)], None);
        assert!(events(None, &healthy).is_empty());
        let failed = with_failures(snap(&[("a", InSync), ("b", Faulty)], None), 1, 1, "b");
        assert_eq!(events(Some(&healthy), &failed), vec![("Fail", Some("b".into()))]);
        assert_eq!(events(None, &failed), vec![("DegradedArray", None)]);
        let rebuilding = failed_again(&failed);
        assert_eq!(events(Some(&failed), &rebuilding), vec![("RebuildStarted", Some("c".into()))]);
        // With a hot spare the role can go from in sync to recovering between two polls:
        // the engine's failure count still reports the Fail.
        assert_eq!(
            events(Some(&healthy), &rebuilding),
            vec![("Fail", Some("b".into())), ("RebuildStarted", Some("c".into()))]
        );
        let done = with_failures(snap(&[("a", InSync), ("c", InSync)], None), 1, 1, "b");
        assert_eq!(
            events(Some(&rebuilding), &done),
            vec![("SpareActive", Some("c".into())), ("RebuildFinished", Some("c".into()))]
        );
        // A rebuild that began and ended between two looks is told whole.
        assert_eq!(
            events(Some(&failed), &done),
            vec![
                ("RebuildStarted", Some("c".into())),
                ("SpareActive", Some("c".into())),
                ("RebuildFinished", Some("c".into()))
            ]
        );
        assert_eq!(rebuilding.describe("raid1"), "raid1 degraded, recovery 0%");
        assert_eq!(done.describe("raid1"), "raid1 clean");
    }
}
