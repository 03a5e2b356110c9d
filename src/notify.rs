//! systemd's readiness protocol (sd_notify(3)) for `Type=notify` units: READY=1 once every
//! socket listens, STATUS= with the arrays' state, STOPPING=1 at shutdown. Without
//! NOTIFY_SOCKET (not started by systemd) every call does nothing.

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd (NOTIFY_SOCKET): {e}");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping: draining, flushing, marking arrays clean")]);
}
