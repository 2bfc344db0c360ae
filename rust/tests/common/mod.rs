//! Helpers shared by the integration tests.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Runs `f` on its own thread and fails if it does not finish within `limit`, so a deadlock
/// fails the test instead of hanging it.
pub fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("no result after {limit:?}: deadlock?"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the test thread panicked"),
    }
}
