//! CLIENT PAUSE / UNPAUSE: hold this node's clients' commands for a while, as Redis does
//! before a failover (docs/resp.md, "Connection and server commands"). `ALL` holds every
//! command, `WRITE` the ones that may change data (the `write` flag, and PUBLISH). A held
//! command runs once the pause ends or CLIENT UNPAUSE arrives; CLIENT commands themselves are
//! never held, so UNPAUSE can always be sent. The pause is this node's: clients of other
//! replicas go on (pause every node to stop every write).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Write,
    All,
}

#[derive(Default)]
pub struct Pause {
    /// Checked on every command: the only cost while no pause is set.
    active: AtomicBool,
    until: Mutex<Option<(Instant, Mode)>>,
    ended: Notify,
}

impl Pause {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Mode)>> {
        self.until.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Pause for `timeout_ms`. As in Redis, a pause already set is extended, never shortened,
    /// and `ALL` is kept over `WRITE` while both apply.
    pub fn start(&self, timeout_ms: u64, mode: Mode) {
        let until = Instant::now() + Duration::from_millis(timeout_ms);
        let mut current = self.lock();
        let merged = match *current {
            Some((then, old)) if then > Instant::now() => (then.max(until), old.max(mode)),
            _ => (until, mode),
        };
        *current = Some(merged);
        self.active.store(true, Relaxed);
    }

    pub fn stop(&self) {
        *self.lock() = None;
        self.active.store(false, Relaxed);
        self.ended.notify_waiters();
    }

    /// Whether a pause is set (it may have run out already): a connection that cannot wait
    /// for it in place (the reactor's) hands its command to one that can.
    pub fn is_active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// Wait while a pause holds the command `name`.
    pub async fn hold(&self, name: &str) {
        if !self.active.load(Relaxed) || name == "client" {
            return;
        }
        loop {
            // Registered before the state is read, so an UNPAUSE in between is not missed.
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let Some((until, mode)) = *self.lock() else { return };
            if until <= Instant::now() || !holds(mode, name) {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(until.into()) => {}
                () = ended => {}
            }
        }
    }
}

fn holds(mode: Mode, name: &str) -> bool {
    mode == Mode::All
        || name == "publish"
        || name == "spublish"
        || name == "exec"
        || crate::command::has_flag(name, "write")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_pauses_hold_writes_only_and_unpause_releases_them() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        runtime.block_on(async {
            let pause = std::sync::Arc::new(Pause::default());
            pause.start(3_600_000, Mode::Write);
            pause.hold("get").await; // not held
            pause.hold("client").await;
            let held = tokio::spawn({
                let pause = pause.clone();
                async move { pause.hold("set").await }
            });
            tokio::task::yield_now().await;
            assert!(!held.is_finished(), "a write ran during a WRITE pause");
            pause.stop();
            held.await.expect("released");
        });
    }

    #[test]
    fn a_pause_is_extended_not_shortened() {
        let pause = Pause::default();
        pause.start(3_600_000, Mode::All);
        pause.start(0, Mode::Write);
        let (until, mode) = pause.lock().expect("set");
        assert!(until > Instant::now() + Duration::from_secs(3_000));
        assert_eq!(mode, Mode::All);
    }
}
