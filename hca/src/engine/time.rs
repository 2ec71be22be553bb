//! Time as the engine sees it: instants handed in by the caller.
//!
//! The engine owns no clock (it is sans-I/O): every input that depends on time carries the current
//! [`Instant`], and the engine reports when it next needs to be woken up
//! ([`crate::engine::SoftHca::poll_timeout`]). The caller may use any monotonic clock, a virtual
//! clock in simulation, or the wall clock in production; only differences between instants matter.
//! Durations are [`core::time::Duration`]s.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time: nanoseconds since an origin chosen by the caller (the start of the
/// simulation, the boot of the host...). Monotonic by contract: the caller never passes an
/// instant earlier than one it passed before (the engine copes if it does: time then stands
/// still, nothing fires early).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The origin, 0 ns.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant (about 584 years after the origin).
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// The instant `micros` microseconds after the origin (saturating).
    pub const fn from_micros(micros: u64) -> Instant {
        Instant(micros.saturating_mul(1_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The instant `d` later, or `None` past [`Instant::MAX`].
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let nanos = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(nanos).map(Instant)
    }

    /// The instant `d` later, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, d: Duration) -> Instant {
        self.checked_add(d).unwrap_or(Instant::MAX)
    }

    /// The instant `nanos` nanoseconds later, saturating at [`Instant::MAX`].
    pub const fn saturating_add_nanos(self, nanos: u64) -> Instant {
        Instant(self.0.saturating_add(nanos))
    }

    /// Time from `earlier` to `self`; zero if `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating: never overflows.
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: an earlier minus a later instant is zero.
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Display for Instant {
    /// Seconds with nanosecond precision, e.g. `1.000004096s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_micros(5);
        assert_eq!(t.as_nanos(), 5_000);
        assert_eq!(t + Duration::from_nanos(7), Instant::from_nanos(5_007));
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_micros(5));
        assert_eq!(Instant::ZERO.checked_add(Duration::MAX), None);
        assert_eq!(
            std::format!("{}", Instant::from_nanos(1_000_004_096)),
            "1.000004096s"
        );
    }
}
