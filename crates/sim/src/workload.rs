//! The simulated clients: sequential processes issuing reads, writes and RMWs over a small key
//! space, so that concurrent operations on the same key are the rule.
//!
//! Every value a client writes is unique, and every INCRBY adds a delta drawn from a wide
//! range, so two updates that a bug lets cancel out (one lost increment hidden behind an
//! equal one, a stale value equal to the fresh one) almost never look alike: the checker sees
//! the anomaly. Hash keys (`h0`, `h1`) take HSET and HDEL, whose outcome (a count of fields)
//! does not always say whether they wrote. Expiring keys (`e0`, `e1`) take Redis' expiry
//! commands (SET PX, SET NX PX, PEXPIRE with its flags, PERSIST) and typed reads (GET, PTTL):
//! deadlines a few milliseconds out, the scale at which drifting clocks disagree.

use bytes::Bytes;
use chorus_core::data::ExecOp;
use chorus_core::{Command, Key, RmwOp, Value};

use crate::rng::Rng;

/// The largest INCRBY delta: wide enough that two concurrent increments differ.
const INCREMENT_MAX: u64 = 1_000_000;
/// Operations one key receives before its slot moves on to a fresh key (Jepsen's independent
/// keys): the checker's search grows steeply with the length of a key's history when slow
/// updates and unknown outcomes pile up, and a few hundred operations on one key could
/// exhaust it. Long enough that a key's history spans view changes.
pub const OPS_PER_KEY_MAX: u32 = 64;
/// Hash fields a client picks from: few, so fields collide and HSET overwrites.
const HASH_FIELDS: u64 = 3;
/// Encoded hashes stay far below this; the limit only exists for the server.
const HASH_BYTES_MAX: u32 = 1 << 20;
/// Relative deadlines (SET PX, PEXPIRE) an expiring key's commands draw from, in ms: around
/// the tens of milliseconds by which drifting clocks come apart during a run, so replicas
/// whose clocks disagree about a deadline are common.
const EXPIRY_MS: [u64; 5] = [2, 5, 10, 25, 60];

/// The operation mix one seed draws.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkloadPlan {
    pub clients: usize,
    /// String keys `k0..`: reads, writes, deletes, INCRBY, CAS, SETNX, GETSET.
    pub keys: usize,
    /// Hash keys `h0..`: reads, HSET, HDEL, deletes. 0 on some seeds.
    pub hash_keys: usize,
    /// Expiring keys `e0..`: SET PX, PEXPIRE, PERSIST, typed GET and PTTL. 0 on some seeds.
    pub expiry_keys: usize,
    pub ops_per_client: usize,
    pub read_ratio: f64,
    pub rmw_ratio: f64,
    pub think_max_us: u64,
    /// Chance that a client sends its next request to the replica it used last (a client
    /// holds a connection, as Redis clients do) rather than to a random one. 0 on half the
    /// seeds, high on the others: sticky clients keep asking a replica that is cut off.
    pub stickiness: f64,
}

impl WorkloadPlan {
    pub fn draw(rng: &mut Rng) -> WorkloadPlan {
        let read_ratio = rng.range(20, 70) as f64 / 100.0;
        // Half the seeds are RMW-heavy: conflicting RMWs (INCRBY, CAS, HSET) from different
        // coordinators are what RMW aborts, replays and epoch changes must keep apart.
        let rmw_percent = if rng.chance(0.5) { rng.range(0, 60) } else { rng.range(60, 100) };
        WorkloadPlan {
            clients: rng.range(3, 8) as usize,
            keys: rng.range(1, 4) as usize,
            hash_keys: rng.below(3) as usize,
            ops_per_client: rng.range(20, 80) as usize,
            read_ratio,
            rmw_ratio: (1.0 - read_ratio) * rmw_percent as f64 / 100.0,
            think_max_us: *rng.pick(&[0, 500, 2_000, 5_000]),
            stickiness: if rng.chance(0.5) { 0.0 } else { 0.9 },
            // Drawn last, so the seeds without expiring keys run as they did before.
            expiry_keys: rng.below(3) as usize,
        }
    }
}

/// Which key each slot currently names: slot `i` starts as `k{i}` (or `h{i}`) and moves to
/// `k{i}-1`, `k{i}-2`, ... every [`OPS_PER_KEY_MAX`] operations. Shared by every client, so
/// they keep colliding on the same keys.
#[derive(Default)]
pub struct KeySpace {
    issued: Vec<u32>,
}

impl KeySpace {
    fn key(&mut self, prefix: char, slot: usize) -> Key {
        if self.issued.len() <= slot {
            self.issued.resize(slot + 1, 0);
        }
        let generation = self.issued[slot] / OPS_PER_KEY_MAX;
        self.issued[slot] += 1;
        if generation == 0 {
            Bytes::from(format!("{prefix}{slot}"))
        } else {
            Bytes::from(format!("{prefix}{slot}-{generation}"))
        }
    }
}

/// Generates one client's next command. Written values are unique integers (client, counter),
/// so the checker can tell every write apart and INCR still has integers to add to.
pub struct CommandGenerator {
    client: u32,
    counter: u64,
    last_seen: Option<Value>,
}

impl CommandGenerator {
    pub fn new(client: u32) -> CommandGenerator {
        CommandGenerator { client, counter: 0, last_seen: None }
    }

    fn unique_value(&mut self) -> Value {
        self.counter += 1;
        Bytes::from(((self.client as u64 + 1) * 1_000_000 + self.counter).to_string())
    }

    pub fn observe(&mut self, value: Option<Value>) {
        self.last_seen = value;
    }

    pub fn next(&mut self, rng: &mut Rng, plan: &WorkloadPlan, keys: &mut KeySpace) -> Command {
        let key_slots = (plan.keys + plan.hash_keys + plan.expiry_keys) as u64;
        let slot = rng.below(key_slots) as usize;
        if slot >= plan.keys + plan.hash_keys {
            let key = keys.key('e', slot);
            return self.next_expiry(rng, plan, key);
        }
        if slot >= plan.keys {
            let key = keys.key('h', slot);
            return self.next_hash(rng, plan, key);
        }
        let key = keys.key('k', slot);
        let roll = rng.unit();
        if roll < plan.read_ratio {
            return Command::Read { key };
        }
        if roll < plan.read_ratio + plan.rmw_ratio {
            let op = self.next_rmw(rng);
            return Command::Rmw { key, op };
        }
        let value = if rng.chance(0.05) { None } else { Some(self.unique_value()) };
        Command::Write { key, value }
    }

    fn next_rmw(&mut self, rng: &mut Rng) -> RmwOp {
        match rng.below(5) {
            // Distinct deltas: equal ones would let a lost increment hide behind another.
            0 | 1 => RmwOp::IncrementBy(rng.range(1, INCREMENT_MAX) as i64),
            2 => {
                // Expect what this client saw last, so some CASes succeed and some fail.
                let expected = if rng.chance(0.8) { self.last_seen.clone() } else { None };
                RmwOp::CompareAndSwap { expected, new: Some(self.unique_value()) }
            }
            3 => RmwOp::SetIfAbsent(self.unique_value()),
            _ => RmwOp::Swap(Some(self.unique_value())),
        }
    }

    /// A hash key's command: reads and HSETs mostly, some HDELs, a rare DEL. Half the HSETs
    /// write a value from a two-letter alphabet, so some set a field to what it already
    /// holds (no write) while others with the same outcome overwrite it.
    fn next_hash(&mut self, rng: &mut Rng, plan: &WorkloadPlan, key: Key) -> Command {
        let field = |rng: &mut Rng| Bytes::from(format!("f{}", rng.below(HASH_FIELDS)));
        let roll = rng.unit();
        if roll < plan.read_ratio {
            return Command::Read { key };
        }
        let op = match rng.below(10) {
            0..=5 => {
                let pairs = (0..rng.range(1, 2))
                    .map(|_| {
                        let value = if rng.chance(0.5) {
                            Bytes::from(*rng.pick(&["a", "b"]))
                        } else {
                            self.unique_value()
                        };
                        (field(rng), value)
                    })
                    .collect();
                RmwOp::HashSet { pairs, encoded_bytes_max: HASH_BYTES_MAX }
            }
            6..=8 => RmwOp::HashDelete((0..rng.range(1, 2)).map(|_| field(rng)).collect()),
            _ => return Command::Write { key, value: None },
        };
        Command::Rmw { key, op }
    }

    /// An expiring key's command, as the typed command a Redis client would send. Its clock
    /// reading (`now_ms`) is left 0: the simulator stamps it from the clock of the replica
    /// that decides it, as the server does (see `Engine::client_arrives`).
    fn next_expiry(&mut self, rng: &mut Rng, plan: &WorkloadPlan, key: Key) -> Command {
        let ms = |rng: &mut Rng| Bytes::from(rng.pick(&EXPIRY_MS).to_string());
        let word = |text: &'static str| Bytes::from_static(text.as_bytes());
        let mut args = if rng.unit() < plan.read_ratio {
            vec![word(if rng.chance(0.6) { "GET" } else { "PTTL" }), key]
        } else {
            match rng.below(10) {
                0..=3 => vec![word("SET"), key, self.unique_value(), word("PX"), ms(rng)],
                // A lock: set only if absent, with a deadline.
                4 => vec![word("SET"), key, self.unique_value(), word("NX"), word("PX"), ms(rng)],
                5 => vec![word("SET"), key, self.unique_value()],
                6..=8 => vec![word("PEXPIRE"), key, ms(rng)],
                _ => vec![word("PERSIST"), key],
            }
        };
        if args[0] == "PEXPIRE" && rng.chance(0.4) {
            let flag = *rng.pick(&["NX", "XX", "GT", "LT"]);
            args.push(word(flag));
        }
        let key = args[1].clone();
        Command::Rmw { key, op: RmwOp::Exec(ExecOp { now_ms: 0, bytes_max: HASH_BYTES_MAX, args }) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(seed: u64, count: usize) -> Vec<Command> {
        let mut rng = Rng::new(seed);
        let plan = WorkloadPlan { hash_keys: 2, rmw_ratio: 0.5, ..WorkloadPlan::draw(&mut rng) };
        let mut generator = CommandGenerator::new(0);
        let mut keys = KeySpace::default();
        (0..count).map(|_| generator.next(&mut rng, &plan, &mut keys)).collect()
    }

    #[test]
    fn increments_are_distinct() {
        let deltas: Vec<i64> = (0..20)
            .flat_map(|seed| commands(seed, 200))
            .filter_map(|command| match command {
                Command::Rmw { op: RmwOp::IncrementBy(delta), .. } => Some(delta),
                _ => None,
            })
            .collect();
        let mut unique = deltas.clone();
        unique.sort_unstable();
        unique.dedup();
        assert!(deltas.len() > 100, "too few increments drawn: {}", deltas.len());
        assert!(unique.len() * 100 >= deltas.len() * 99, "increments repeat: {deltas:?}");
    }

    #[test]
    fn hash_keys_get_hset_and_hdel() {
        let all: Vec<Command> = (0..10).flat_map(|seed| commands(seed, 200)).collect();
        let hset = all.iter().filter(|c| matches!(c, Command::Rmw { op: RmwOp::HashSet { .. }, .. })).count();
        let hdel = all.iter().filter(|c| matches!(c, Command::Rmw { op: RmwOp::HashDelete(_), .. })).count();
        assert!(hset > 50 && hdel > 20, "hset {hset}, hdel {hdel}");
        assert!(all
            .iter()
            .filter(|c| matches!(c, Command::Rmw { op: RmwOp::HashSet { .. } | RmwOp::HashDelete(_), .. }))
            .all(|c| c.key().starts_with(b"h")));
    }

    #[test]
    fn expiring_keys_get_deadlines_persist_and_typed_reads() {
        let mut names = std::collections::BTreeMap::<String, usize>::new();
        for seed in 0..10 {
            let mut rng = Rng::new(seed);
            let plan = WorkloadPlan { expiry_keys: 2, ..WorkloadPlan::draw(&mut rng) };
            let (mut generator, mut keys) = (CommandGenerator::new(0), KeySpace::default());
            for _ in 0..200 {
                if let Command::Rmw { key, op: RmwOp::Exec(op) } = generator.next(&mut rng, &plan, &mut keys)
                {
                    assert!(key.starts_with(b"e"), "{key:?}");
                    assert_eq!(op.now_ms, 0, "the simulator stamps the clock");
                    let name = String::from_utf8_lossy(&op.args[0]).to_string();
                    let px = op.args.iter().any(|arg| arg == "PX");
                    *names.entry(if px { format!("{name} PX") } else { name }).or_default() += 1;
                }
            }
        }
        for name in ["SET PX", "SET", "PEXPIRE", "PERSIST", "GET", "PTTL"] {
            assert!(names.get(name).is_some_and(|count| *count > 10), "{name}: {names:?}");
        }
    }

    #[test]
    fn a_key_slot_moves_to_a_fresh_key_after_its_quota() {
        let mut keys = KeySpace::default();
        let names: Vec<Key> = (0..OPS_PER_KEY_MAX * 2 + 1).map(|_| keys.key('k', 1)).collect();
        assert_eq!(names[0], "k1");
        assert_eq!(names[OPS_PER_KEY_MAX as usize - 1], "k1");
        assert_eq!(names[OPS_PER_KEY_MAX as usize], "k1-1");
        assert_eq!(names[2 * OPS_PER_KEY_MAX as usize], "k1-2");
    }
}
