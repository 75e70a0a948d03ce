//! What the model's clients ask for: the operation mix (reads, updates, inserts, scans,
//! read-modify-writes, as YCSB's core workloads and the Hermes paper's write ratios) and which
//! keys (uniform, YCSB's scrambled zipfian, or skewed to the latest inserts).

use bytes::Bytes;
use chorus_core::Command;
use serde::Serialize;

use crate::rng::Rng;

/// How keys are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Distribution {
    Uniform,
    /// YCSB's scrambled zipfian: rank `r` with probability proportional to `1 / r^theta`
    /// (YCSB's constant is 0.99), ranks scattered over the key space by a hash.
    Zipfian {
        theta: f64,
    },
    /// YCSB's skewed-latest (workload D): zipfian over how recently a key was inserted.
    Latest {
        theta: f64,
    },
}

/// The share of each operation kind, in percent (they sum to 100).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Mix {
    pub read: u32,
    /// A blind write of one value (SET; YCSB's update of one field).
    pub update: u32,
    /// A write of a new key (YCSB's insert of a record).
    pub insert: u32,
    /// A read of 1 to `scan_length_max` consecutive records, pipelined in one round trip (as
    /// `chorus bench ycsb` emulates YCSB's scan on RESP).
    pub scan: u32,
    /// A read, then a write of the same key once the read is answered (YCSB F).
    pub read_modify_write: u32,
}

/// The operation mix over a key space.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Workload {
    pub name: String,
    pub mix: Mix,
    /// Percent of operations that write (updates, inserts, read-modify-writes).
    pub write_percent: u32,
    pub keys: u64,
    /// The bytes an update or insert writes.
    pub value_bytes: usize,
    /// The bytes a read of a loaded record returns (the model loads nothing: a read of a key
    /// no write of the run reached is sized as a loaded record).
    pub record_bytes: usize,
    pub distribution: Distribution,
    pub scan_length_max: u64,
}

/// YCSB's zipfian constant.
pub const YCSB_THETA: f64 = 0.99;

impl Workload {
    /// `kv-wX` (X% blind writes, the rest reads, uniform keys, 32-byte values: the Hermes
    /// paper's microworkload), or YCSB's core workloads `ycsb-a` to `ycsb-f` (zipfian keys,
    /// `latest` for D; records of 10 fields x 100 bytes, an update writes one field).
    pub fn named(name: &str) -> Option<Workload> {
        let mix = |read, update, insert, scan, read_modify_write| Mix {
            read,
            update,
            insert,
            scan,
            read_modify_write,
        };
        let zipfian = Distribution::Zipfian { theta: YCSB_THETA };
        let (mix, distribution, value_bytes, record_bytes) = match name {
            "ycsb-a" => (mix(50, 50, 0, 0, 0), zipfian, 100, 1000),
            "ycsb-b" => (mix(95, 5, 0, 0, 0), zipfian, 100, 1000),
            "ycsb-c" => (mix(100, 0, 0, 0, 0), zipfian, 100, 1000),
            "ycsb-d" => (mix(95, 0, 5, 0, 0), Distribution::Latest { theta: YCSB_THETA }, 1000, 1000),
            "ycsb-e" => (mix(0, 0, 5, 95, 0), zipfian, 1000, 1000),
            "ycsb-f" => (mix(50, 0, 0, 0, 50), zipfian, 100, 1000),
            _ => {
                let writes: u32 =
                    name.strip_prefix("kv-w")?.parse().ok().filter(|percent| *percent <= 100)?;
                (mix(100 - writes, writes, 0, 0, 0), Distribution::Uniform, 32, 32)
            }
        };
        Some(Workload {
            name: name.into(),
            write_percent: mix.update + mix.insert + mix.read_modify_write,
            mix,
            keys: 100_000,
            value_bytes,
            record_bytes,
            distribution,
            scan_length_max: 100,
        })
    }

    /// The names [`Workload::named`] knows, for messages.
    pub const NAMES: &'static str =
        "kv-wX (X% writes, 0 to 100), ycsb-a, ycsb-b, ycsb-c, ycsb-d, ycsb-e, ycsb-f";
}

/// The kind of an operation, for latency by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl OpKind {
    pub fn writes(self) -> bool {
        matches!(self, OpKind::Update | OpKind::Insert | OpKind::ReadModifyWrite)
    }
}

/// An operation: its kind and its steps, each a set of commands sent together.
pub struct Operation {
    pub kind: OpKind,
    pub steps: Vec<Vec<Command>>,
}

/// Draws operations of a workload.
pub struct Generator {
    workload: Workload,
    rng: Rng,
    zipf: Option<Zipfian>,
    value: Bytes,
    /// Keys inserted so far (beyond the loaded `keys`).
    inserted: u64,
}

impl Generator {
    pub fn new(workload: &Workload, seed: u64) -> Generator {
        let zipf = match workload.distribution {
            Distribution::Uniform => None,
            Distribution::Zipfian { theta } | Distribution::Latest { theta } => {
                Some(Zipfian::new(workload.keys.max(1), theta))
            }
        };
        Generator {
            workload: workload.clone(),
            rng: Rng::new(seed),
            zipf,
            value: Bytes::from(vec![b'v'; workload.value_bytes]),
            inserted: 0,
        }
    }

    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    pub fn next_operation(&mut self) -> Operation {
        let mix = self.workload.mix;
        let mut draw = self.rng.below(100) as u32;
        let mut kind = OpKind::Read;
        for (share, candidate) in [
            (mix.read, OpKind::Read),
            (mix.update, OpKind::Update),
            (mix.insert, OpKind::Insert),
            (mix.scan, OpKind::Scan),
            (mix.read_modify_write, OpKind::ReadModifyWrite),
        ] {
            if draw < share {
                kind = candidate;
                break;
            }
            draw -= share;
        }
        let read = |key| Command::Read { key };
        let steps = match kind {
            OpKind::Read => {
                let index = self.pick();
                vec![vec![read(self.key_name(index))]]
            }
            OpKind::Update => {
                let index = self.pick();
                vec![vec![self.write(index)]]
            }
            OpKind::Insert => {
                let index = self.workload.keys + self.inserted;
                self.inserted += 1;
                vec![vec![self.write(index)]]
            }
            OpKind::Scan => {
                let start = self.pick();
                let length = self.rng.range(1, self.workload.scan_length_max.max(1) + 1);
                let known = self.workload.keys + self.inserted;
                vec![(0..length).map(|offset| read(self.key_name((start + offset) % known))).collect()]
            }
            OpKind::ReadModifyWrite => {
                let index = self.pick();
                vec![vec![read(self.key_name(index))], vec![self.write(index)]]
            }
        };
        Operation { kind, steps }
    }

    /// A key index under the workload's distribution.
    fn pick(&mut self) -> u64 {
        let keys = self.workload.keys.max(1);
        match (self.workload.distribution, &self.zipf) {
            (Distribution::Zipfian { .. }, Some(zipf)) => scramble(zipf.rank(self.rng.unit()), keys),
            (Distribution::Latest { .. }, Some(zipf)) => {
                // The most recent insert is rank 0; older keys follow.
                let newest = keys + self.inserted - 1;
                newest - zipf.rank(self.rng.unit()).min(newest)
            }
            _ => self.rng.below(keys),
        }
    }

    fn key_name(&self, index: u64) -> Bytes {
        Bytes::from(format!("key:{index:012}"))
    }

    fn write(&self, index: u64) -> Command {
        Command::Write { key: self.key_name(index), value: Some(self.value.clone()) }
    }
}

/// Scatter rank `rank` over `keys` keys as YCSB's scrambled zipfian does (FNV-1a 64 of the
/// rank, modulo the key count), so the hottest keys are not neighbours.
pub fn scramble(rank: u64, keys: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in rank.to_le_bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % keys
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases", SIGMOD 1994): ranks `0..n`, rank `r` with probability `1 / (r+1)^theta / zeta(n)`.
#[derive(Clone, Debug)]
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
}

impl Zipfian {
    pub fn new(n: u64, theta: f64) -> Zipfian {
        assert!(
            n >= 1 && theta > 0.0 && theta != 1.0,
            "a zipfian needs n >= 1 and theta in (0, 1) or above 1"
        );
        let zeta = |count: u64| (1..=count).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zeta_n = zeta(n);
        let zeta_2 = zeta(2.min(n));
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n);
        Zipfian { n, theta, alpha: 1.0 / (1.0 - theta), zeta_n, eta }
    }

    /// The rank for a uniform draw `unit` in [0, 1).
    pub fn rank(&self, unit: f64) -> u64 {
        let uz = unit * self.zeta_n;
        if uz < 1.0 || self.n == 1 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let rank = (self.n as f64 * (self.eta * unit - self.eta + 1.0).powf(self.alpha)) as u64;
        rank.min(self.n - 1)
    }

    /// The probability of rank 0 (the hottest key): `1 / zeta(n)`.
    pub fn top_probability(&self) -> f64 {
        1.0 / self.zeta_n
    }
}
