//! Workloads: YCSB core workloads A-F and the GET/SET microworkload, as streams of [`Op`]s.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::generator::{AckCounter, Distribution, KeyChooser, Rng};

/// What an operation is, for reporting (names as YCSB prints them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OpKind {
    #[serde(rename = "READ")]
    Read,
    #[serde(rename = "UPDATE")]
    Update,
    #[serde(rename = "INSERT")]
    Insert,
    #[serde(rename = "SCAN")]
    Scan,
    #[serde(rename = "READ-MODIFY-WRITE")]
    ReadModifyWrite,
    #[serde(rename = "GET")]
    Get,
    #[serde(rename = "SET")]
    Set,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::Scan,
        OpKind::ReadModifyWrite,
        OpKind::Get,
        OpKind::Set,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Insert => "INSERT",
            OpKind::Scan => "SCAN",
            OpKind::ReadModifyWrite => "READ-MODIFY-WRITE",
            OpKind::Get => "GET",
            OpKind::Set => "SET",
        }
    }

    /// Does the operation write (and so, with `--wait-replicas`, get a WAIT after it)?
    pub fn writes(self) -> bool {
        matches!(self, OpKind::Update | OpKind::Insert | OpKind::ReadModifyWrite | OpKind::Set)
    }
}

/// One operation to perform. Key numbers are turned into key names by the executor
/// ([`ycsb_key`], [`kv_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read a record: HGETALL (or HMGET of one field).
    Read {
        keynum: u64,
        field: Option<u32>,
    },
    /// Update one field of a record: HSET key field value.
    Update {
        keynum: u64,
        field: u32,
    },
    /// Insert a whole record: HSET key f0 v0 ... f(n-1) v(n-1).
    Insert {
        keynum: u64,
    },
    /// Read `len` records with consecutive key numbers from `start` (HGETALL each, pipelined).
    Scan {
        start: u64,
        len: u32,
    },
    /// Read a record, then update one field of it (one operation for latency).
    ReadModifyWrite {
        keynum: u64,
        field: u32,
    },
    Get {
        keynum: u64,
    },
    Set {
        keynum: u64,
    },
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Read { .. } => OpKind::Read,
            Op::Update { .. } => OpKind::Update,
            Op::Insert { .. } => OpKind::Insert,
            Op::Scan { .. } => OpKind::Scan,
            Op::ReadModifyWrite { .. } => OpKind::ReadModifyWrite,
            Op::Get { .. } => OpKind::Get,
            Op::Set { .. } => OpKind::Set,
        }
    }
}

/// YCSB's key name: "user" followed by the FNV hash of the key number (`insertorder=hashed`).
pub fn ycsb_key(keynum: u64, out: &mut Vec<u8>) {
    use std::io::Write as _;
    out.clear();
    let _ = write!(out, "user{}", crate::generator::fnv_hash64(keynum));
}

/// The microworkload's key name.
pub fn kv_key(keynum: u64, out: &mut Vec<u8>) {
    use std::io::Write as _;
    out.clear();
    let _ = write!(out, "key:{keynum:010}");
}

/// YCSB field names: field0 .. field9.
pub fn field_name(field: u32, out: &mut Vec<u8>) {
    use std::io::Write as _;
    out.clear();
    let _ = write!(out, "field{field}");
}

/// A YCSB core workload: proportions and distributions as in `workloads/workload[a-f]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct YcsbSpec {
    pub workload: char,
    pub records: u64,
    pub operations: u64,
    pub field_count: u32,
    pub field_bytes: usize,
    pub distribution: Distribution,
    /// readallfields (true in YCSB core): HGETALL; false: HMGET of one random field.
    pub read_all_fields: bool,
    pub read_proportion: f64,
    pub update_proportion: f64,
    pub insert_proportion: f64,
    pub scan_proportion: f64,
    pub read_modify_write_proportion: f64,
    /// Scan lengths are uniform in [1, max_scan_length].
    pub max_scan_length: u32,
}

impl YcsbSpec {
    /// YCSB core workload `letter` (a-f) with its default request distribution.
    pub fn core(letter: char, records: u64, operations: u64) -> anyhow::Result<YcsbSpec> {
        let letter = letter.to_ascii_lowercase();
        let (read, update, insert, scan, rmw, distribution) = match letter {
            'a' => (0.5, 0.5, 0.0, 0.0, 0.0, Distribution::Zipfian),
            'b' => (0.95, 0.05, 0.0, 0.0, 0.0, Distribution::Zipfian),
            'c' => (1.0, 0.0, 0.0, 0.0, 0.0, Distribution::Zipfian),
            'd' => (0.95, 0.0, 0.05, 0.0, 0.0, Distribution::Latest),
            'e' => (0.0, 0.0, 0.05, 0.95, 0.0, Distribution::Zipfian),
            'f' => (0.5, 0.0, 0.0, 0.0, 0.5, Distribution::Zipfian),
            other => anyhow::bail!("unknown YCSB workload {other:?} (a, b, c, d, e or f)"),
        };
        Ok(YcsbSpec {
            workload: letter,
            records,
            operations,
            field_count: 10,
            field_bytes: 100,
            distribution,
            read_all_fields: true,
            read_proportion: read,
            update_proportion: update,
            insert_proportion: insert,
            scan_proportion: scan,
            read_modify_write_proportion: rmw,
            max_scan_length: 100,
        })
    }

    fn mix(&self) -> Vec<(OpKind, f64)> {
        [
            (OpKind::Read, self.read_proportion),
            (OpKind::Update, self.update_proportion),
            (OpKind::Insert, self.insert_proportion),
            (OpKind::Scan, self.scan_proportion),
            (OpKind::ReadModifyWrite, self.read_modify_write_proportion),
        ]
        .into_iter()
        .filter(|(_, p)| *p > 0.0)
        .collect()
    }
}

/// The GET/SET microworkload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvSpec {
    pub write_ratio: f64,
    pub keys: u64,
    pub operations: u64,
    pub value_bytes: usize,
    pub distribution: Distribution,
}

/// YCSB's `DiscreteGenerator`: picks an operation by weight.
#[derive(Clone, Debug)]
pub struct Mix {
    choices: Vec<(OpKind, f64)>,
    total: f64,
}

impl Mix {
    pub fn new(choices: Vec<(OpKind, f64)>) -> Mix {
        let total = choices.iter().map(|(_, w)| w).sum();
        Mix { choices, total }
    }

    pub fn next(&self, rng: &mut Rng) -> OpKind {
        let mut x = rng.next_f64() * self.total;
        for (kind, weight) in &self.choices {
            if x < *weight {
                return *kind;
            }
            x -= weight;
        }
        self.choices.last().map(|(kind, _)| *kind).unwrap_or(OpKind::Read)
    }
}

/// State shared by every client of one YCSB run.
#[derive(Debug)]
pub struct Shared {
    pub inserts: AckCounter,
}

/// One client's stream of operations.
#[derive(Clone, Debug)]
pub struct OpGen {
    rng: Rng,
    mix: Mix,
    keys: KeyChooser,
    shared: Arc<Shared>,
    field_count: u32,
    read_all_fields: bool,
    max_scan_length: u32,
}

impl OpGen {
    /// Generators for `clients` clients of a YCSB run (built once: zeta is computed once).
    pub fn ycsb(spec: &YcsbSpec, seed: u64, clients: usize) -> Vec<OpGen> {
        let expected_inserts = (spec.operations as f64 * spec.insert_proportion * 2.0) as u64;
        let keys = KeyChooser::new(spec.distribution, spec.records, expected_inserts);
        let shared = Arc::new(Shared { inserts: AckCounter::new(spec.records) });
        (0..clients)
            .map(|i| OpGen {
                rng: Rng::stream(seed, i as u64),
                mix: Mix::new(spec.mix()),
                keys: keys.clone(),
                shared: shared.clone(),
                field_count: spec.field_count,
                read_all_fields: spec.read_all_fields,
                max_scan_length: spec.max_scan_length,
            })
            .collect()
    }

    pub fn kv(spec: &KvSpec, seed: u64, clients: usize) -> Vec<OpGen> {
        let keys = KeyChooser::new(spec.distribution, spec.keys, 0);
        let shared = Arc::new(Shared { inserts: AckCounter::new(spec.keys) });
        let mix = Mix::new(vec![(OpKind::Set, spec.write_ratio), (OpKind::Get, 1.0 - spec.write_ratio)]);
        (0..clients)
            .map(|i| OpGen {
                rng: Rng::stream(seed, i as u64),
                mix: mix.clone(),
                keys: keys.clone(),
                shared: shared.clone(),
                field_count: 1,
                read_all_fields: true,
                max_scan_length: 1,
            })
            .collect()
    }

    pub fn next_op(&mut self) -> Op {
        let inserted = self.shared.inserts.count();
        match self.mix.next(&mut self.rng) {
            OpKind::Read => {
                let keynum = self.keys.next(&mut self.rng, inserted);
                let field = (!self.read_all_fields).then(|| self.rng.below(self.field_count as u64) as u32);
                Op::Read { keynum, field }
            }
            OpKind::Update => Op::Update {
                keynum: self.keys.next(&mut self.rng, inserted),
                field: self.rng.below(self.field_count as u64) as u32,
            },
            OpKind::Insert => Op::Insert { keynum: self.shared.inserts.next_insert() },
            OpKind::Scan => {
                let start = self.keys.next(&mut self.rng, inserted);
                let len = 1 + self.rng.below(self.max_scan_length as u64) as u32;
                // Stay below the inserted records (YCSB's scan simply returns fewer).
                let len = len.min((inserted - start).max(1) as u32);
                Op::Scan { start, len }
            }
            OpKind::ReadModifyWrite => Op::ReadModifyWrite {
                keynum: self.keys.next(&mut self.rng, inserted),
                field: self.rng.below(self.field_count as u64) as u32,
            },
            OpKind::Get => Op::Get { keynum: self.keys.next(&mut self.rng, inserted) },
            OpKind::Set => Op::Set { keynum: self.keys.next(&mut self.rng, inserted) },
        }
    }

    /// `op` completed (successfully or not: YCSB acknowledges failed inserts too, so readers
    /// never stall behind them).
    pub fn done(&self, op: &Op) {
        if let Op::Insert { keynum } = op {
            self.shared.inserts.acknowledge(*keynum);
        }
    }
}
