//! Concurrent Redis clients that record what they saw as a history for the linearizability
//! checker: reads, writes and CAS on registers, INCR on counters, over a few hot keys.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_core::{Command, CommandError, Outcome, RmwOp, Time};
use chorus_sim::history::{Completion, History, Operation};

pub struct Workload {
    /// Redis addresses (`host:port`); client `c` talks to `targets[c % targets.len()]`.
    pub targets: Vec<String>,
    pub clients: usize,
    pub ops_per_client: usize,
    /// A reply slower than this makes the outcome unknown and the client reconnect.
    pub reply_timeout: Duration,
    /// Pause between a client's operations, so a run spans the faults injected meanwhile.
    pub think: Duration,
}

const REGISTERS: [&str; 2] = ["reg:0", "reg:1"];
const COUNTERS: [&str; 2] = ["ctr:0", "ctr:1"];

/// A small deterministic PRNG so each client's operation mix is reproducible.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

fn b(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// What an error reply means for the history; `None`: the outcome is unknown.
fn error_outcome(error: &redis::RedisError) -> Option<Outcome> {
    let text = error.to_string();
    if text.contains("not an integer") {
        Some(Outcome::Error(CommandError::NotInteger))
    } else if text.contains("overflow") {
        Some(Outcome::Error(CommandError::Overflow))
    } else if text.contains("not serving") {
        Some(Outcome::Error(CommandError::Unavailable("not serving")))
    } else {
        None // I/O error, timeout, or an explicit "outcome unknown"
    }
}

fn run_op(con: &mut redis::Connection, command: &Command) -> redis::RedisResult<Outcome> {
    Ok(match command {
        Command::Read { key } => Outcome::Value(
            redis::cmd("GET").arg(key.as_ref()).query::<Option<Vec<u8>>>(con)?.map(Bytes::from),
        ),
        Command::Write { key, value: Some(value) } => {
            let _: String = redis::cmd("SET").arg(key.as_ref()).arg(value.as_ref()).query(con)?;
            Outcome::Written
        }
        Command::Rmw { key, op: RmwOp::IncrementBy(1) } => {
            Outcome::Integer(redis::cmd("INCR").arg(key.as_ref()).query::<i64>(con)?)
        }
        Command::Rmw { key, op: RmwOp::CompareAndSwap { expected: Some(expected), new: Some(new) } } => {
            let (swapped, previous): (i64, Option<Vec<u8>>) =
                redis::cmd("CAS").arg(key.as_ref()).arg(expected.as_ref()).arg(new.as_ref()).query(con)?;
            Outcome::Cas { swapped: swapped == 1, previous: previous.map(Bytes::from) }
        }
        other => unreachable!("the workload does not issue {other:?}"),
    })
}

fn connect(target: &str, reply_timeout: Duration) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://{target}/")).ok()?;
    let con = client.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
    con.set_read_timeout(Some(reply_timeout)).ok()?;
    con.set_write_timeout(Some(reply_timeout)).ok()?;
    Some(con)
}

fn next_command(rng: &mut Lcg, client: usize, i: usize, last_seen: &Option<Bytes>) -> Command {
    let register = b(REGISTERS[rng.next(2) as usize]);
    let counter = b(COUNTERS[rng.next(2) as usize]);
    let fresh = || Some(b(&format!("c{client}-{i}")));
    match rng.next(10) {
        0..=2 => Command::Read { key: register },
        3 | 4 => Command::Write { key: register, value: fresh() },
        5 | 6 => Command::Rmw {
            key: register,
            op: RmwOp::CompareAndSwap {
                expected: Some(last_seen.clone().unwrap_or_else(|| b("none"))),
                new: fresh(),
            },
        },
        7 => Command::Read { key: counter },
        _ => Command::Rmw { key: counter, op: RmwOp::IncrementBy(1) },
    }
}

/// What a client remembers as the register's latest value, for its next CAS.
fn observed(command: &Command, outcome: &Option<Outcome>) -> Option<Option<Bytes>> {
    match (command, outcome) {
        (_, Some(Outcome::Value(Some(value)))) => Some(Some(value.clone())),
        (_, Some(Outcome::Cas { previous: Some(value), swapped: false })) => Some(Some(value.clone())),
        (Command::Write { value, .. }, Some(Outcome::Written)) => Some(value.clone()),
        (
            Command::Rmw { op: RmwOp::CompareAndSwap { new, .. }, .. },
            Some(Outcome::Cas { swapped: true, .. }),
        ) => Some(new.clone()),
        _ => None,
    }
}

fn client_loop(
    workload: Arc<Workload>,
    stop: Arc<AtomicBool>,
    client: usize,
    origin: Instant,
) -> Vec<Operation> {
    let target = workload.targets[client % workload.targets.len()].clone();
    let mut con = connect(&target, workload.reply_timeout);
    let mut rng = Lcg(client as u64 + 1);
    let mut last_seen = None;
    let mut operations = Vec::new();
    for i in 0..workload.ops_per_client {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        thread::sleep(workload.think);
        let command = next_command(&mut rng, client, i, &last_seen);
        let invoke = Time::from_nanos(origin.elapsed().as_nanos() as u64);
        let Some(connection) = con.as_mut() else {
            con = connect(&target, workload.reply_timeout);
            continue; // never sent: not part of the history
        };
        let outcome = match run_op(connection, &command) {
            Ok(outcome) => Some(outcome),
            Err(error) => {
                let outcome = error_outcome(&error);
                if outcome.is_none() {
                    con = connect(&target, workload.reply_timeout); // the connection may be broken
                }
                outcome
            }
        };
        let at = Time::from_nanos(origin.elapsed().as_nanos() as u64);
        if let Some(seen) = observed(&command, &outcome) {
            last_seen = seen;
        }
        operations.push(Operation {
            id: 0,
            client: client as u32,
            command,
            invoke,
            completion: outcome.map(|outcome| Completion { at, outcome }),
        });
    }
    operations
}

/// Run every client to completion; the history is in invocation order.
pub fn run(workload: Workload) -> History {
    run_until(workload, Arc::new(AtomicBool::new(false)))
}

/// [`run`] in a thread of its own, while the test injects faults; join it for the history.
pub fn spawn(workload: Workload) -> thread::JoinHandle<History> {
    thread::spawn(move || run(workload))
}

/// Run every client until it has issued `ops_per_client` operations or `stop` is set, so a
/// test can keep clients running until the faults it injects have done what it needs.
pub fn run_until(workload: Workload, stop: Arc<AtomicBool>) -> History {
    let origin = Instant::now();
    let workload = Arc::new(workload);
    let workers: Vec<_> = (0..workload.clients)
        .map(|client| {
            let (workload, stop) = (workload.clone(), stop.clone());
            thread::spawn(move || client_loop(workload, stop, client, origin))
        })
        .collect();
    history_of(workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect())
}

/// The history of operations recorded by several clients: in invocation order, numbered.
pub fn history_of(mut operations: Vec<Operation>) -> History {
    operations.sort_by_key(|op| op.invoke);
    for (id, op) in operations.iter_mut().enumerate() {
        op.id = id;
    }
    History { operations }
}

/// Check a history recorded across crashes: linearizable, every key conclusive, and more than
/// `completed_min` operations completed. Returns what the acknowledged INCRs promise of each
/// counter: (the largest value an INCR returned, how many INCRs were tried).
pub fn check_across_crashes(
    history: &History,
    completed_min: usize,
) -> std::collections::BTreeMap<Vec<u8>, (i64, i64)> {
    let mut promised: std::collections::BTreeMap<Vec<u8>, (i64, i64)> = Default::default();
    for op in &history.operations {
        if let Command::Rmw { key, op: RmwOp::IncrementBy(1) } = &op.command {
            let entry = promised.entry(key.to_vec()).or_default();
            entry.1 += 1;
            if let Some(Outcome::Integer(value)) = op.completion.as_ref().map(|c| &c.outcome) {
                entry.0 = entry.0.max(*value);
            }
        }
    }
    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = chorus_sim::checker::check_history(history, &chorus_sim::checker::CheckerConfig::default());
    eprintln!(
        "{} operations ({completed} completed), {} keys checked, counters {promised:?}",
        history.operations.len(),
        report.keys_checked
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(report.inconclusive_keys.is_empty(), "inconclusive: {:?}", report.inconclusive_keys);
    assert!(completed > completed_min, "too little completed across the crashes: {completed}");
    promised
}

/// Six recording clients over `targets` in a thread, until the returned flag is set (the
/// shape of the crash tests: faults happen while they run); join the handle for the history.
pub fn spawn_until_stopped(targets: Vec<String>) -> (Arc<AtomicBool>, thread::JoinHandle<History>) {
    let stop = Arc::new(AtomicBool::new(false));
    let workload = Workload {
        targets,
        clients: 6,
        ops_per_client: 20_000,
        reply_timeout: Duration::from_secs(3),
        think: Duration::from_millis(3),
    };
    let flag = stop.clone();
    (stop, thread::spawn(move || run_until(workload, flag)))
}
