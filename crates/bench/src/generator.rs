//! Random number and key generators, following YCSB core (`site.ycsb.generator`).
//!
//! * [`Zipfian`]: Gray et al.'s "Quickly generating billion-record synthetic databases"
//!   algorithm as in YCSB's `ZipfianGenerator`, including the incremental zeta update when the
//!   item count grows (used by "latest").
//! * [`ScrambledZipfian`]: YCSB's `ScrambledZipfianGenerator`: a zipfian over 10^10 items
//!   (zeta precomputed for the constant 0.99), hashed with 64-bit FNV-1 and reduced modulo the
//!   item count, so the popular items are spread over the key space.
//! * [`SkewedLatest`]: YCSB's `SkewedLatestGenerator`: the most recently inserted items are the
//!   most popular.
//! * [`AckCounter`]: YCSB's `AcknowledgedCounterGenerator`: insert key numbers are handed out in
//!   order, and readers only choose keys below the highest *contiguously acknowledged* insert.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The zipfian constant of YCSB core.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Items of the underlying zipfian of [`ScrambledZipfian`] (YCSB's `ITEM_COUNT`).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// zeta(10^10, 0.99), as YCSB precomputes it (`ScrambledZipfianGenerator.ZETAN`).
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// SplitMix64: small, fast, and good enough for load generation. Deterministic by seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A seed for stream `index` of a run seeded with `seed` (clients get independent streams).
    pub fn stream(seed: u64, index: u64) -> Rng {
        let mut mixer = Rng(seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407));
        Rng(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, bound); bound > 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }
}

/// YCSB's `Utils.fnvhash64`: FNV-1 over the 8 little-endian bytes, then `Math.abs`.
pub fn fnv_hash64(value: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    let mut value = value;
    for _ in 0..8 {
        hash ^= value & 0xff;
        hash = hash.wrapping_mul(PRIME);
        value >>= 8;
    }
    (hash as i64).wrapping_abs() as u64
}

/// zeta(n, theta) = sum_{i=1..n} 1 / i^theta, continued from `start` items whose sum is `sum`.
pub fn zeta_from(start: u64, n: u64, theta: f64, sum: f64) -> f64 {
    let mut sum = sum;
    for i in start..n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

pub fn zeta(n: u64, theta: f64) -> f64 {
    zeta_from(0, n, theta, 0.0)
}

/// Zipfian over [base, base + items): item `base` is the most popular.
#[derive(Clone, Debug)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    zeta2theta: f64,
    eta: f64,
    half_pow_theta: f64,
}

impl Zipfian {
    /// Computes zeta(items) (O(items)): build once and clone per client.
    pub fn new(base: u64, items: u64, theta: f64) -> Zipfian {
        Zipfian::with_zetan(base, items, theta, zeta(items, theta))
    }

    pub fn with_zetan(base: u64, items: u64, theta: f64, zetan: f64) -> Zipfian {
        assert!(items >= 1, "a zipfian needs at least one item");
        let zeta2theta = zeta(2, theta);
        let mut zipfian = Zipfian {
            base,
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            zeta2theta,
            eta: 0.0,
            half_pow_theta: 0.5f64.powf(theta),
        };
        zipfian.eta = zipfian.eta_for(items);
        zipfian
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan)
    }

    pub fn items(&self) -> u64 {
        self.items
    }

    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The next item of [base, base + items).
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        let items = self.items;
        self.sample(rng, items)
    }

    /// The next item of [base, base + items), growing the distribution first when `items`
    /// grew (YCSB's incremental zeta; the item count never shrinks here).
    pub fn next_of(&mut self, rng: &mut Rng, items: u64) -> u64 {
        if items > self.items {
            self.zetan = zeta_from(self.items, items, self.theta, self.zetan);
            self.items = items;
            self.eta = self.eta_for(items);
        }
        self.sample(rng, items.min(self.items))
    }

    fn sample(&self, rng: &mut Rng, items: u64) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + self.half_pow_theta {
            return self.base + 1.min(items - 1);
        }
        let offset = (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + offset.min(items - 1)
    }
}

/// YCSB's scrambled zipfian over [min, min + items).
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    items: u64,
    zipfian: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: u64, items: u64) -> ScrambledZipfian {
        assert!(items >= 1);
        ScrambledZipfian {
            min,
            items,
            zipfian: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        let raw = self.zipfian.next(rng);
        self.min + fnv_hash64(raw) % self.items
    }

    /// The item the underlying zipfian's most popular value (0) maps to.
    pub fn hottest(&self) -> u64 {
        self.min + fnv_hash64(0) % self.items
    }
}

/// YCSB's `SkewedLatestGenerator`: `latest - zipfian(latest)`.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// `items`: the number of items inserted so far (computes zeta(items): clone per client).
    pub fn new(items: u64) -> SkewedLatest {
        SkewedLatest { zipfian: Zipfian::new(0, items.max(1), ZIPFIAN_CONSTANT) }
    }

    /// An item of [0, latest]: `latest` itself is the most popular, then `latest - 1`, ...
    pub fn next(&mut self, rng: &mut Rng, latest: u64) -> u64 {
        let items = latest.max(1);
        let back = self.zipfian.next_of(rng, items);
        latest - back.min(latest)
    }
}

/// YCSB's `AcknowledgedCounterGenerator`, shared by every client of a run: inserts take the
/// next key number, and [`AckCounter::last`] is the highest key number below which every
/// insert has completed, so reads never choose a key that may not exist yet.
#[derive(Debug)]
pub struct AckCounter {
    next: AtomicU64,
    acked: Mutex<(u64, BTreeSet<u64>)>,
    limit: AtomicU64,
}

impl AckCounter {
    /// `start` items [0, start) exist already.
    pub fn new(start: u64) -> AckCounter {
        AckCounter {
            next: AtomicU64::new(start),
            acked: Mutex::new((start, BTreeSet::new())),
            limit: AtomicU64::new(start),
        }
    }

    /// The key number of the next insert.
    pub fn next_insert(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The insert of `keynum` completed.
    pub fn acknowledge(&self, keynum: u64) {
        let mut guard = self.acked.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (limit, pending) = &mut *guard;
        if keynum == *limit {
            *limit += 1;
            while pending.remove(limit) {
                *limit += 1;
            }
            self.limit.store(*limit, Ordering::Release);
        } else if keynum > *limit {
            pending.insert(keynum);
        }
    }

    /// Items [0, count) are all inserted.
    pub fn count(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }
}

/// A request distribution by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Zipfian,
    Uniform,
    Latest,
}

/// Chooses existing key numbers by a [`Distribution`].
#[derive(Clone, Debug)]
pub enum KeyChooser {
    /// Scrambled zipfian over [0, items): `items` counts the records plus room for the
    /// expected inserts (as YCSB); choices above the inserted count are drawn again.
    Zipfian(ScrambledZipfian),
    Uniform {
        items: u64,
    },
    Latest(SkewedLatest),
}

impl KeyChooser {
    /// `records` exist; about `expected_inserts` more will be inserted during the run.
    pub fn new(distribution: Distribution, records: u64, expected_inserts: u64) -> KeyChooser {
        let records = records.max(1);
        match distribution {
            Distribution::Zipfian => {
                KeyChooser::Zipfian(ScrambledZipfian::new(0, records + expected_inserts))
            }
            Distribution::Uniform => KeyChooser::Uniform { items: records },
            Distribution::Latest => KeyChooser::Latest(SkewedLatest::new(records)),
        }
    }

    /// A key number below `inserted` (the count of items known to exist).
    pub fn next(&mut self, rng: &mut Rng, inserted: u64) -> u64 {
        let inserted = inserted.max(1);
        match self {
            KeyChooser::Zipfian(zipfian) => {
                // As YCSB: draw again while the choice is not inserted yet (bounded, then wrap).
                for _ in 0..64 {
                    let keynum = zipfian.next(rng);
                    if keynum < inserted {
                        return keynum;
                    }
                }
                zipfian.next(rng) % inserted
            }
            KeyChooser::Uniform { items } => rng.below((*items).min(inserted)),
            KeyChooser::Latest(latest) => latest.next(rng, inserted - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_ycsb() {
        // Printed by YCSB's Utils.fnvhash64, compiled and run with OpenJDK 17.
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv_hash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv_hash64(12345), 1_792_800_413_050_876_852);
        assert_eq!(fnv_hash64(9_999_999_999), 3_605_131_173_811_637_474);
    }

    #[test]
    fn scrambled_zetan_constant_is_zeta_of_ten_billion() {
        // zeta(10^10, 0.99) is too slow to sum here; check the constant against a partial
        // sum plus the integral tail: sum_{i>n} i^-theta ~ integral.
        let theta = ZIPFIAN_CONSTANT;
        let n = 1_000_000u64;
        let head = zeta(n, theta);
        let tail = |a: f64, b: f64| (b.powf(1.0 - theta) - a.powf(1.0 - theta)) / (1.0 - theta);
        let approx = head + tail(n as f64 + 0.5, SCRAMBLED_ITEM_COUNT as f64 + 0.5);
        assert!((approx - SCRAMBLED_ZETAN).abs() < 1e-3, "{approx}");
    }
}
