//! Virtual or real time as seen by a protocol core. Cores never read a clock: the runtime (the
//! simulator or the server's event loop) passes `now` into every call.

use std::fmt;
use std::ops::{Add, Sub};

/// A point in time, in nanoseconds since an arbitrary origin chosen by the runtime.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time {
    nanos: u64,
}

impl Time {
    pub const ZERO: Time = Time { nanos: 0 };

    pub const fn from_nanos(nanos: u64) -> Time {
        Time { nanos }
    }
    pub const fn from_micros(micros: u64) -> Time {
        Time { nanos: micros * 1_000 }
    }
    pub const fn from_millis(millis: u64) -> Time {
        Time { nanos: millis * 1_000_000 }
    }
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }
    pub const fn as_micros(self) -> u64 {
        self.nanos / 1_000
    }
    pub const fn as_millis(self) -> u64 {
        self.nanos / 1_000_000
    }
    pub fn saturating_sub(self, other: Time) -> Time {
        Time { nanos: self.nanos.saturating_sub(other.nanos) }
    }
}

impl Add for Time {
    type Output = Time;
    fn add(self, other: Time) -> Time {
        Time { nanos: self.nanos + other.nanos }
    }
}

impl Sub for Time {
    type Output = Time;
    fn sub(self, other: Time) -> Time {
        Time { nanos: self.nanos - other.nanos }
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}ms", self.nanos / 1_000_000, self.nanos % 1_000_000)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
