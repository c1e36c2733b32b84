//! A held lock's shared state: its token, its lease mode and when the
//! holder's belief ends (the send time of the last acquire or renewal the
//! database confirmed, plus the lease, on the monotonic clock).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

#[derive(Debug)]
pub(crate) struct SqlHold {
    pub(crate) name: String,
    pub(crate) owner: hasp_owner::Owner,
    pub(crate) token: i64,
    /// Renewed by the client's task (no explicit lease).
    pub(crate) watchdog: bool,
    gone: AtomicBool,
    valid_until: Mutex<Instant>,
    lost_notify: Notify,
}

impl SqlHold {
    pub(crate) fn new(
        name: &str,
        owner: &hasp_owner::Owner,
        token: i64,
        lease_ms: u64,
        watchdog: bool,
        sent_at: Instant,
    ) -> Self {
        Self {
            name: name.to_owned(),
            owner: owner.clone(),
            token,
            watchdog,
            gone: AtomicBool::new(false),
            valid_until: Mutex::new(sent_at + Duration::from_millis(lease_ms)),
            lost_notify: Notify::new(),
        }
    }

    fn end(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.end()
    }

    /// A statement sent at `sent_at` set the lease to `lease_ms`.
    pub(crate) fn confirm(&self, sent_at: Instant, lease_ms: u64) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) =
            sent_at + Duration::from_millis(lease_ms);
        self.lost_notify.notify_waiters();
    }

    /// The database said the row is not ours any more.
    pub(crate) fn mark_gone(&self) {
        if !self.gone.swap(true, Ordering::AcqRel) {
            tracing::warn!(lock = %self.name, "database lock lost while held");
        }
        self.lost_notify.notify_waiters();
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.is_gone() || Instant::now() >= self.end()
    }

    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            let _ = tokio::time::timeout_at(self.end().into(), notified).await;
        }
    }
}
