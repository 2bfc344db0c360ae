//! The gaps between requests of an open-loop load: constant, or drawn from an exponential
//! distribution so that arrivals form a Poisson process.

use std::time::Duration;

/// The next gap, again and again.
#[derive(Debug, Clone)]
pub struct Gaps {
    mean_seconds: f64,
    /// `None` for constant gaps; a xorshift64* state for exponential ones.
    random: Option<u64>,
}

impl Gaps {
    pub fn constant(per_second: f64) -> Gaps {
        Gaps {
            mean_seconds: 1.0 / per_second,
            random: None,
        }
    }

    pub fn poisson(per_second: f64, seed: u64) -> Gaps {
        // xorshift needs a state other than 0.
        Gaps {
            mean_seconds: 1.0 / per_second,
            random: Some(seed | 1),
        }
    }

    pub fn next_gap(&mut self) -> Duration {
        let seconds = match &mut self.random {
            None => self.mean_seconds,
            Some(state) => -self.mean_seconds * (1.0 - uniform(state)).ln(),
        };
        Duration::from_secs_f64(seconds)
    }
}

/// A uniform draw from [0, 1) (xorshift64*: fast, and good enough to space requests).
fn uniform(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    let bits = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
    #[allow(clippy::cast_precision_loss)] // 53 bits: exact in an f64
    let draw = bits as f64 / (1u64 << 53) as f64;
    draw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_gaps_are_the_rates_inverse() {
        let mut gaps = Gaps::constant(250.0);
        assert_eq!(gaps.next_gap(), Duration::from_millis(4));
        assert_eq!(gaps.next_gap(), Duration::from_millis(4));
    }

    #[test]
    fn poisson_gaps_average_the_rates_inverse_and_vary() {
        let mut gaps = Gaps::poisson(1000.0, 42);
        let draws: Vec<f64> = (0..200_000)
            .map(|_| gaps.next_gap().as_secs_f64())
            .collect();
        let count = 200_000.0;
        let mean = draws.iter().sum::<f64>() / count;
        assert!((mean - 0.001).abs() < 0.000_02, "mean gap {mean}");
        // An exponential distribution's standard deviation equals its mean.
        let variance = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / count;
        assert!(
            (variance.sqrt() - 0.001).abs() < 0.000_05,
            "deviation {}",
            variance.sqrt()
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let (mut a, mut b) = (Gaps::poisson(10.0, 7), Gaps::poisson(10.0, 7));
        for _ in 0..100 {
            assert_eq!(a.next_gap(), b.next_gap());
        }
    }
}
