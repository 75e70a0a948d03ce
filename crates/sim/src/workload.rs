//! The simulated clients: sequential processes issuing reads, writes and RMWs over a small key
//! space, so that concurrent operations on the same key are the rule.

use bytes::Bytes;
use chorus_core::{Command, Key, RmwOp, Value};

use crate::rng::Rng;

/// The operation mix one seed draws.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkloadPlan {
    pub clients: usize,
    pub keys: usize,
    pub ops_per_client: usize,
    pub read_ratio: f64,
    pub rmw_ratio: f64,
    pub think_max_us: u64,
}

impl WorkloadPlan {
    pub fn draw(rng: &mut Rng) -> WorkloadPlan {
        let read_ratio = rng.range(20, 70) as f64 / 100.0;
        WorkloadPlan {
            clients: rng.range(3, 8) as usize,
            keys: rng.range(1, 4) as usize,
            ops_per_client: rng.range(20, 80) as usize,
            read_ratio,
            rmw_ratio: (1.0 - read_ratio) * rng.range(0, 60) as f64 / 100.0,
            think_max_us: *rng.pick(&[0, 500, 2_000, 5_000]),
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

    pub fn next(&mut self, rng: &mut Rng, plan: &WorkloadPlan) -> Command {
        let key: Key = Bytes::from(format!("k{}", rng.below(plan.keys as u64)));
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
            0 | 1 => RmwOp::IncrementBy(rng.range(1, 3) as i64),
            2 => {
                // Expect what this client saw last, so some CASes succeed and some fail.
                let expected = if rng.chance(0.8) { self.last_seen.clone() } else { None };
                RmwOp::CompareAndSwap { expected, new: Some(self.unique_value()) }
            }
            3 => RmwOp::SetIfAbsent(self.unique_value()),
            _ => RmwOp::Swap(Some(self.unique_value())),
        }
    }
}
