//! How the consumer holding the former lock waits for requests, a batch deadline or the next
//! queue timeout: it polls for a while (how long adapts to how soon work has been coming),
//! then parks until a producer (or `close`, or `cancel`) wakes it.

use std::hint;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use crossbeam_utils::sync::Parker;

use super::{CLOSED, RequestQueue};
use crate::spin::Spin;

/// How long a waiting consumer keeps polling for work before it parks. Waking a parked thread
/// takes the OS 15-20 µs on the machines we measure on, longer than an instance that has just
/// finished a batch usually waits for the next request under load, and longer than the whole
/// enqueue-to-instance budget. A batch deadline inside the window is waited for by polling too,
/// which keeps short `max_queue_delay`s exact.
const SPIN_WINDOW: Duration = Duration::from_micros(50);
/// Polls between two readings of the clock while spinning.
const SPINS_PER_CLOCK_READ: u32 = 16;

/// How long the former lock holder polls before it parks (up to [`SPIN_WINDOW`]), adapted to
/// how soon work has been coming (see [`crate::spin`]).
pub(super) fn consumer_spin() -> Spin {
    Spin::new(SPIN_WINDOW)
}

impl<T> RequestQueue<T> {
    /// Something a waiting consumer must look at: a new request, or the queue closing.
    fn has_news(&self) -> bool {
        !self.items.is_empty() || self.state.load(Ordering::Relaxed) & CLOSED != 0
    }

    /// Polls for news for up to the spin window, or until `deadline` if that comes first:
    /// whether to look again (news came, or the deadline passed); false once the window passed
    /// without any, when the caller lets go of the former lock and waits idle.
    pub(super) fn poll_for_news(&self, spin: &mut Spin, deadline: Option<Instant>) -> bool {
        let start = Instant::now();
        let poll_end = match deadline {
            Some(deadline) if deadline <= start + spin.window() => deadline,
            _ => start + spin.window(),
        };
        loop {
            for _ in 0..SPINS_PER_CLOCK_READ {
                if self.has_news() {
                    spin.learn(start.elapsed());
                    return true;
                }
                hint::spin_loop();
            }
            let now = Instant::now();
            if now >= poll_end {
                return deadline.is_some_and(|deadline| now >= deadline);
            }
        }
    }

    /// Waits among the idle consumers (the former lock let go) until a producer wakes this
    /// one, the queue closes or `deadline` passes. May return early; callers loop.
    pub(super) fn wait_idle(&self, deadline: Option<Instant>) {
        self.idle.enter();
        // Pairs with the fences in `push` and `wake_for_leftovers`: either they see this
        // consumer idle (and wake it), or it sees their request, queued or left staged by a
        // batch taken since it looked. (This consumer found nothing staged: had anything live
        // been, it would have planned a batch.)
        fence(Ordering::SeqCst);
        if self.has_news() || self.staged_len.load(Ordering::Relaxed) > 0 {
            self.idle.leave();
        } else {
            self.idle.park(deadline);
        }
    }

    /// After a batch left (the former lock let go): wakes an idle consumer for what is still
    /// queued or staged, which no one else may be awake to take (a producer wakes none while
    /// the former lock is held).
    pub(super) fn wake_for_leftovers(&self) {
        // Pairs with the fence in `push`: either the producer saw the lock free (and woke
        // someone), or this sees its request.
        fence(Ordering::SeqCst);
        let left = self.has_news() || self.staged_len.load(Ordering::Relaxed) > 0;
        if left && self.idle.any() && !self.former.is_locked() {
            self.idle.wake_one();
        }
    }

    /// Waits (poll for up to the spin window, then park) until there is news or `deadline`
    /// passes. May return early; callers loop. A deadline within [`SPIN_WINDOW`] is polled
    /// for whatever the window, so short batch delays stay exact.
    pub(super) fn wait(&self, spin: &mut Spin, parker: &Parker, deadline: Option<Instant>) {
        let start = Instant::now();
        let poll_end = match deadline {
            Some(deadline) if deadline <= start + SPIN_WINDOW => deadline,
            _ => start + spin.window(),
        };
        loop {
            for _ in 0..SPINS_PER_CLOCK_READ {
                if self.has_news() {
                    spin.learn(start.elapsed());
                    return;
                }
                hint::spin_loop();
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return;
            }
            if now >= poll_end {
                break;
            }
        }
        self.consumer_parked.store(true, Ordering::Relaxed);
        // Pairs with the fence in `push` (see there).
        fence(Ordering::SeqCst);
        if !self.has_news() {
            match deadline {
                Some(deadline) => {
                    precise_timers::enable_for_this_thread();
                    parker.park_deadline(deadline);
                }
                None => parker.park(),
            }
        }
        self.consumer_parked.store(false, Ordering::Relaxed);
        if self.has_news() {
            spin.learn(start.elapsed());
        }
    }
}

/// Batch deadlines are tens of microseconds away; Linux lets a timed sleep overrun by the
/// thread's timer slack (50 µs by default), which would more than double a 100 µs
/// `max_queue_delay`. Consumers that wait on a deadline ask for 1 ns of slack instead.
mod precise_timers {
    #[cfg(target_os = "linux")]
    pub(super) fn enable_for_this_thread() {
        use std::cell::Cell;
        thread_local!(static DONE: Cell<bool> = const { Cell::new(false) });
        DONE.with(|done| {
            if !done.get() {
                // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only changes this
                // thread's timer slack; it touches no memory of ours.
                unsafe {
                    libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
                }
                done.set(true);
            }
        });
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn enable_for_this_thread() {}
}
