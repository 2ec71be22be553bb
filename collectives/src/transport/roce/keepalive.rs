//! The keepalive thread of a caller-driven device: progress rounds while the rank thread is away.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hca::verbs::Verbs;

/// With caller-driven progress (`hca::soft::Progress::Caller`), the rank thread runs the device's
/// progress rounds itself while it waits (receive, timers, send: no hand-off to another thread,
/// and it sleeps in poll(2) on the socket). Between operations nobody would: ACKs owed to peers
/// would not leave and retransmission timers would not fire, so a peer could exhaust its retries
/// while this rank computes. The keepalive thread closes that gap: every [`KEEPALIVE`] it checks
/// whether the rank thread drove the device since its last look, and if not, runs rounds until
/// the socket is drained.
pub(super) struct Keepalive {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the keepalive thread looks.
pub const KEEPALIVE: Duration = Duration::from_millis(2);

impl Keepalive {
    pub(super) fn start(dev: Arc<dyn Verbs>, activity: Arc<AtomicU64>) -> io::Result<Keepalive> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("coll-keepalive".into())
            .spawn(move || {
                let mut seen = activity.load(Ordering::Relaxed);
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(KEEPALIVE);
                    let now = activity.load(Ordering::Relaxed);
                    if now != seen {
                        seen = now;
                        continue;
                    }
                    // A round that received builds its answers in the next one.
                    for _ in 0..64 {
                        if dev.progress() == 0 {
                            break;
                        }
                    }
                    dev.progress();
                }
            })?;
        Ok(Keepalive {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
