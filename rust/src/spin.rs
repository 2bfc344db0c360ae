//! How long a waiting thread polls before it sleeps, adapted to how soon what it waits for has
//! been coming.
//!
//! Waking a thread asleep in the kernel takes 15-20 µs on the machines we measure on; polling
//! spares that, but pays only when what it waits for comes within the poll. When it comes
//! later (a loaded server whose producers are busy elsewhere, or one request at a time), the
//! polls burn a core others need. So each wait that ends within the longest poll doubles the
//! poll time (up to it), and each that ends later halves it (down to [`MIN_SPIN`]).

use std::time::Duration;

/// The shortest a waiting thread polls once polling has stopped paying.
pub const MIN_SPIN: Duration = Duration::from_micros(2);

/// A poll time that adapts (see the module's documentation).
#[derive(Debug)]
pub struct Spin {
    window: Duration,
    longest: Duration,
}

impl Spin {
    /// Polls of at most `longest`, starting there.
    pub fn new(longest: Duration) -> Self {
        Self {
            window: longest,
            longest,
        }
    }

    /// How long to poll now.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// A wait ended after `waited`.
    pub fn learn(&mut self, waited: Duration) {
        self.window = if waited <= self.longest {
            (self.window * 2).min(self.longest)
        } else {
            (self.window / 2).max(MIN_SPIN)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_shrinks_when_waits_end_late_and_grows_when_they_end_soon() {
        let longest = Duration::from_micros(50);
        let mut spin = Spin::new(longest);
        assert_eq!(spin.window(), longest);
        let late = longest * 3;
        spin.learn(late);
        assert_eq!(spin.window(), longest / 2);
        for _ in 0..20 {
            spin.learn(late);
        }
        assert_eq!(spin.window(), MIN_SPIN);
        spin.learn(Duration::from_micros(10));
        assert_eq!(spin.window(), MIN_SPIN * 2);
        for _ in 0..20 {
            spin.learn(Duration::ZERO);
        }
        assert_eq!(spin.window(), longest);
    }
}
