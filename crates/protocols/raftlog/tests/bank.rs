//! Multi-key transactions across logs under faults (issue 8 point 5, Cyclone §4.2): a bank.
//!
//! Accounts live in different logs. Clients transfer money with transactions
//! (`INCRBY a -x; INCRBY b +x`), audit with transactions that read every account, and
//! poke single accounts with plain commands (which a transaction's locks must hold back).
//! Meanwhile the network loses, duplicates and reorders messages, partitions a node away,
//! and nodes crash and restart from their durable records under their old ids. Invariants:
//! every audit sees the same total, transactions that were acknowledged all complete, and
//! once the faults stop everything completes, no lock remains and every copy agrees. With
//! locking, finished transactions' step records are forgotten (`Forget`), so the records
//! left at the end are few, and no late copy of a forgotten step ever runs.
//!
//! Transfers and audits run both ways MULTI/EXEC can: as ganged operations (one copy in each
//! log, run at the rendezvous, the default) and with two-phase locking.
//!
//! The harness is deliberately small (crates/sim's workload has no transactions): seeded,
//! deterministic, one event per millisecond step. On half the seeds a node's calls of a step
//! share one turn and its logs are flushed once, at the turn's end, as the server runs
//! raftlog (`raftlog_flush_per_turn`); on the others every call is flushed on its own.

use bytes::Bytes;
use chorus_core::{ClientRequestId, Command, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time};
use chorus_raftlog::durable::{Record, Recovered};
use chorus_raftlog::{Bug, Message, RaftLog, RaftLogConfig};

const ACCOUNTS: usize = 5;
const INITIAL_BALANCE: i64 = 100;
const TOTAL: i64 = ACCOUNTS as i64 * INITIAL_BALANCE;
const FAULT_MS: u64 = 1_500;
const HEAL_MS: u64 = 3_000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(1_000) < percent * 10
    }
}

fn account(i: usize) -> Bytes {
    Bytes::from(format!("acct:{i}"))
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Transfer,
    Audit,
    Single,
}

struct Client {
    node: u8,
    /// The node's incarnation when the pending operation was sent: a crash since then
    /// closed the connection, and the client gives up on it (outcome unknown).
    incarnation: u32,
    /// The operation waiting for replies: its kind, request ids, when it was sent.
    pending: Option<(Op, Vec<ClientRequestId>, Time)>,
}

struct Bank {
    nodes: Vec<RaftLog>,
    configs: Vec<RaftLogConfig>,
    disk: Vec<Vec<Record>>,
    up: Vec<bool>,
    incarnations: Vec<u32>,
    isolated: Option<u8>,
    /// In flight: (deliver at, from, to, message).
    net: Vec<(Time, u8, u8, Message)>,
    replies: rustc_hash::FxHashMap<ClientRequestId, Outcome>,
    now: Time,
    next_request: u64,
    rng: Rng,
    audits: Vec<i64>,
    transfers_done: usize,
    singles_done: usize,
    /// Transactions answered "outcome unknown" (the origin's copy jumped past them).
    outcomes_unknown: usize,
    /// As the server runs raftlog (`raftlog_flush_per_turn`): a node's calls of one step
    /// share a turn, and its logs are flushed once, at the turn's end. Half the seeds.
    turns: bool,
}

impl Bank {
    fn new(seed: u64, bug: Option<Bug>, ganged: bool) -> Bank {
        let everyone: NodeSet = (0..3).map(NodeId).collect();
        let turns = seed / 2 % 2 == 1;
        let configs: Vec<RaftLogConfig> = (0..3)
            .map(|id| {
                let mut config = RaftLogConfig::new(NodeId(id), everyone);
                config.logs = 8;
                config.durable = true;
                config.snapshot_entries = [30, 20_000][(seed % 2) as usize];
                config.bug = bug;
                config.ganged = ganged;
                config.flush_at_turn_end = turns;
                config
            })
            .collect();
        Bank {
            nodes: configs.iter().map(|config| RaftLog::new(config.clone())).collect(),
            configs,
            disk: vec![Vec::new(); 3],
            up: vec![true; 3],
            incarnations: vec![0; 3],
            isolated: None,
            net: Vec::new(),
            replies: Default::default(),
            now: Time::ZERO,
            next_request: 0,
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            audits: Vec::new(),
            transfers_done: 0,
            singles_done: 0,
            outcomes_unknown: 0,
            turns,
        }
    }

    /// The end of a turn of `node`'s: the core does its once-a-turn work (the flush), and
    /// what the turn asked for is performed.
    fn end_turn(&mut self, node: u8, mut out: Outbox<Message>, faults: bool) {
        self.nodes[node as usize].end_turn(self.now, &mut out);
        self.collect(node, out, faults);
    }

    fn collect(&mut self, node: u8, out: Outbox<Message>, faults: bool) {
        let turn = self.nodes[node as usize].take_durable();
        self.disk[node as usize].extend(turn.records);
        for (destination, message) in out.messages {
            for to in destination.nodes().iter() {
                let delay = Time::from_micros(100 + self.rng.below(2_000));
                if faults && self.rng.chance(2) {
                    continue; // lost
                }
                if faults && self.rng.chance(1) {
                    self.net.push((self.now + delay + delay, node, to.0, message.clone()));
                }
                self.net.push((self.now + delay, node, to.0, message.clone()));
            }
        }
        for (request, outcome) in out.replies {
            assert!(self.replies.insert(request, outcome).is_none(), "{request:?} answered twice");
        }
        if turn.sync {
            // The records are stable at once here: the core hears so in a call of its own.
            let mut synced = Outbox::default();
            self.nodes[node as usize].on_synced(turn.ticket, self.now, &mut synced);
            self.collect(node, synced, faults);
        }
    }

    fn cut(&self, a: u8, b: u8) -> bool {
        !self.up[a as usize]
            || !self.up[b as usize]
            || self.isolated.is_some_and(|node| (node == a) != (node == b))
    }

    fn step(&mut self, faults: bool) {
        self.now = self.now + Time::from_millis(1);
        let now = self.now;
        let (due, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.net).into_iter().partition(|(at, ..)| *at <= now);
        self.net = rest;
        // With turns, each node's calls of the step share one outbox and one turn end.
        let mut turns: Vec<Outbox<Message>> = (0..3).map(|_| Outbox::default()).collect();
        for (_, from, to, message) in due {
            if self.cut(from, to) {
                continue;
            }
            let mut out = std::mem::take(&mut turns[to as usize]);
            self.nodes[to as usize].on_message(now, NodeId(from), message, &mut out);
            self.end_call(to, out, &mut turns, faults);
        }
        for node in 0..3u8 {
            if self.up[node as usize] {
                let mut out = std::mem::take(&mut turns[node as usize]);
                self.nodes[node as usize].on_tick(now, &mut out);
                self.end_call(node, out, &mut turns, faults);
                if self.turns {
                    let out = std::mem::take(&mut turns[node as usize]);
                    self.end_turn(node, out, faults);
                }
            }
        }
    }

    /// A call of `node`'s returned: with turns its outputs wait in the node's turn;
    /// without, the call is a turn of its own.
    fn end_call(&mut self, node: u8, out: Outbox<Message>, turns: &mut [Outbox<Message>], faults: bool) {
        if self.turns {
            turns[node as usize] = out;
        } else {
            self.end_turn(node, out, faults);
        }
    }

    fn crash(&mut self, node: u8) {
        self.up[node as usize] = false;
        self.incarnations[node as usize] += 1;
    }

    fn restart(&mut self, node: u8) {
        let disk = &self.disk[node as usize];
        let recovered = match disk.iter().rposition(|record| matches!(record, Record::Checkpoint(_))) {
            Some(at) => {
                let Record::Checkpoint(checkpoint) = disk[at].clone() else { unreachable!() };
                Recovered { checkpoint: Some(checkpoint), records: disk[at + 1..].to_vec() }
            }
            None => Recovered { checkpoint: None, records: disk.clone() },
        };
        let config = &mut self.configs[node as usize];
        config.session_client_id += 1 << 40;
        self.nodes[node as usize] = RaftLog::restore(config.clone(), recovered).expect("restore");
        self.up[node as usize] = true;
    }

    fn submit(&mut self, client: &mut Client, op: Op) {
        let node = client.node;
        let mut out = Outbox::default();
        let mut ids = Vec::new();
        let mut next_id = || {
            self.next_request += 1;
            ClientRequestId(self.next_request)
        };
        match op {
            Op::Transfer => {
                let from = self.rng.below(ACCOUNTS as u64) as usize;
                let to = (from + 1 + self.rng.below(ACCOUNTS as u64 - 1) as usize) % ACCOUNTS;
                let amount = 1 + self.rng.below(20) as i64;
                let requests = vec![
                    (next_id(), Command::Rmw { key: account(from), op: RmwOp::IncrementBy(-amount) }),
                    (next_id(), Command::Rmw { key: account(to), op: RmwOp::IncrementBy(amount) }),
                ];
                ids = requests.iter().map(|(id, _)| *id).collect();
                self.nodes[node as usize].on_transaction(self.now, requests, &mut out);
            }
            Op::Audit => {
                let requests: Vec<_> =
                    (0..ACCOUNTS).map(|i| (next_id(), Command::Read { key: account(i) })).collect();
                ids = requests.iter().map(|(id, _)| *id).collect();
                self.nodes[node as usize].on_transaction(self.now, requests, &mut out);
            }
            Op::Single => {
                let id = next_id();
                let key = account(self.rng.below(ACCOUNTS as u64) as usize);
                let command = if self.rng.chance(50) {
                    Command::Read { key }
                } else {
                    Command::Rmw { key, op: RmwOp::IncrementBy(0) }
                };
                ids.push(id);
                self.nodes[node as usize].on_client(self.now, id, command, &mut out);
            }
        }
        client.pending = Some((op, ids, self.now));
        client.incarnation = self.incarnations[node as usize];
        self.end_turn(node, out, true);
    }

    /// Take a client's replies if all arrived; check what they say.
    fn poll(&mut self, client: &mut Client) {
        let Some((op, ids, _)) = &client.pending else { return };
        if !ids.iter().all(|id| self.replies.contains_key(id)) {
            return;
        }
        let outcomes: Vec<Outcome> = ids.iter().map(|id| self.replies.remove(id).expect("present")).collect();
        let unknown = Outcome::Error(chorus_core::CommandError::OutcomeUnknown);
        if *op != Op::Single && outcomes.iter().all(|outcome| *outcome == unknown) {
            // Ran or not, the client cannot tell (as when its connection drops).
            self.outcomes_unknown += 1;
            client.pending = None;
            return;
        }
        match op {
            Op::Audit => {
                let sum = outcomes
                    .iter()
                    .map(|outcome| match outcome {
                        Outcome::Value(Some(value)) => {
                            std::str::from_utf8(value).unwrap().parse::<i64>().unwrap()
                        }
                        other => panic!("audit read {other:?}"),
                    })
                    .sum();
                self.audits.push(sum);
            }
            Op::Transfer => {
                assert!(
                    outcomes.iter().all(|outcome| matches!(outcome, Outcome::Integer(_))),
                    "{outcomes:?}"
                );
                self.transfers_done += 1;
            }
            Op::Single => self.singles_done += 1,
        }
        client.pending = None;
    }
}

/// What one seed saw.
#[derive(Debug)]
struct Run {
    audits: Vec<i64>,
    transfers_done: usize,
    singles_done: usize,
    restarts: usize,
    /// Over every replica: gangs a log refused (resubmitted), gang copies proposed by a
    /// replica other than the origin.
    gangs_refused: u64,
    gangs_rescued: u64,
    /// Transactions answered "outcome unknown"; `Forget` copies applied; transaction step
    /// records left at the end over every replica (and the transactions that ran).
    outcomes_unknown: usize,
    forgets_applied: u64,
    step_records_left: usize,
    /// Drivers that stopped because a step of theirs was refused as forgotten.
    drivers_stopped: u64,
}

fn run(seed: u64, bug: Option<Bug>, ganged: bool) -> Result<Run, String> {
    let mut bank = Bank::new(seed, bug, ganged);
    // Open the accounts: one transaction, no faults yet.
    for _ in 0..100 {
        bank.step(false);
    }
    let mut out = Outbox::default();
    let opening: Vec<_> = (0..ACCOUNTS)
        .map(|i| {
            (
                ClientRequestId(1_000_000 + i as u64),
                Command::Write { key: account(i), value: Some(Bytes::from(INITIAL_BALANCE.to_string())) },
            )
        })
        .collect();
    bank.nodes[0].on_transaction(bank.now, opening, &mut out);
    bank.end_turn(0, out, false);
    for _ in 0..300 {
        bank.step(false);
    }
    if bank.replies.len() != ACCOUNTS {
        return Err("the opening transaction did not complete".into());
    }
    bank.replies.clear();

    let mut clients: Vec<Client> =
        (0..4).map(|i| Client { node: (i % 3) as u8, incarnation: 0, pending: None }).collect();
    let mut down_until: Option<(u8, Time)> = None;
    let mut isolated_until = Time::ZERO;
    let mut restarts = 0;
    let total_ms = FAULT_MS + HEAL_MS;
    for ms in 0..total_ms {
        let faults = ms < FAULT_MS;
        if faults {
            if down_until.is_none() && bank.rng.chance(1) {
                let node = bank.rng.below(3) as u8;
                bank.crash(node);
                down_until = Some((node, bank.now + Time::from_millis(50 + bank.rng.below(300))));
            }
            if bank.isolated.is_none() && bank.rng.chance(1) {
                bank.isolated = Some(bank.rng.below(3) as u8);
                isolated_until = bank.now + Time::from_millis(50 + bank.rng.below(250));
            }
        }
        if bank.isolated.is_some() && (bank.now >= isolated_until || !faults) {
            bank.isolated = None;
        }
        if let Some((node, until)) = down_until {
            if bank.now >= until || !faults {
                bank.restart(node);
                restarts += 1;
                down_until = None;
            }
        }
        for client in &mut clients {
            bank.poll(client);
            let stuck = client
                .pending
                .as_ref()
                .is_some_and(|(_, _, sent)| bank.now > *sent + Time::from_millis(1_500));
            let node_down = !bank.up[client.node as usize];
            let reset = client.incarnation != bank.incarnations[client.node as usize];
            if client.pending.is_some() && ((faults && (stuck || node_down)) || reset) {
                // The client gives up (outcome unknown) and moves to another node.
                client.pending = None;
                client.node = (client.node + 1) % 3;
            }
            if client.pending.is_none() && bank.up[client.node as usize] && ms + 1_000 < total_ms {
                let op = match bank.rng.below(10) {
                    0..=5 => Op::Transfer,
                    6..=8 => Op::Audit,
                    _ => Op::Single,
                };
                bank.submit(client, op);
            }
        }
        bank.step(faults);
    }
    // A lock must belong to a transaction in progress somewhere: one whose transaction every
    // replica finished is a late step copy that ran (and would stall the keys forever).
    for (node, replica) in bank.nodes.iter().enumerate() {
        for (key, txn) in replica.locks() {
            if !bank.nodes.iter().any(|other| other.txn_in_progress(&txn)) {
                return Err(format!(
                    "seed {seed}: n{node}'s key {key:?} is locked by {txn:?}, a transaction every replica finished"
                ));
            }
        }
    }
    for client in &mut clients {
        bank.poll(client);
        if let Some((op, _, sent)) = &client.pending {
            let status: Vec<String> = bank.nodes.iter().map(|node| node.debug_txns()).collect();
            return Err(format!(
                "seed {seed}: {op:?} sent at {sent:?} to n{} never completed although the faults stopped at {:?}:\n{}",
                client.node,
                Time::from_millis(400 + FAULT_MS),
                status.join("\n")
            ));
        }
    }
    if let Some(sum) = bank.audits.iter().find(|sum| **sum != TOTAL) {
        return Err(format!("seed {seed}: an audit saw a total of {sum}, not {TOTAL}"));
    }
    for (node, replica) in bank.nodes.iter().enumerate() {
        if replica.locked_keys() != 0 {
            return Err(format!("seed {seed}: n{node} still has {} keys locked", replica.locked_keys()));
        }
        if replica.txns_driven() != 0 {
            return Err(format!("seed {seed}: n{node} still drives {} transactions", replica.txns_driven()));
        }
        if replica.gangs_in_progress() != 0 {
            return Err(format!(
                "seed {seed}: n{node} has {} gangs in progress",
                replica.gangs_in_progress()
            ));
        }
        let total: i64 = (0..ACCOUNTS)
            .map(|i| {
                replica
                    .applied_value(&account(i))
                    .map_or(0, |value| std::str::from_utf8(value).unwrap().parse::<i64>().unwrap())
            })
            .sum();
        if total != TOTAL {
            return Err(format!("seed {seed}: n{node}'s copy totals {total}"));
        }
        for i in 0..ACCOUNTS {
            if replica.applied_value(&account(i)) != bank.nodes[0].applied_value(&account(i)) {
                return Err(format!("seed {seed}: copies differ on account {i}"));
            }
        }
    }
    Ok(Run {
        audits: bank.audits,
        transfers_done: bank.transfers_done,
        singles_done: bank.singles_done,
        restarts,
        gangs_refused: bank.nodes.iter().map(|node| node.stats().gangs_refused).sum(),
        gangs_rescued: bank.nodes.iter().map(|node| node.stats().gangs_rescued).sum(),
        outcomes_unknown: bank.outcomes_unknown,
        forgets_applied: bank.nodes.iter().map(|node| node.stats().txn_forgets_applied).sum(),
        step_records_left: bank.nodes.iter().map(|node| node.step_records()).sum(),
        drivers_stopped: bank.nodes.iter().map(|node| node.stats().txn_drivers_stopped).sum(),
    })
}

/// Runs `seeds` seeds (more on demand: BANK_SEEDS=1000) and checks they exercised enough.
fn sweep(ganged: bool, seeds: u64) {
    let seeds: u64 = std::env::var("BANK_SEEDS").ok().and_then(|text| text.parse().ok()).unwrap_or(seeds);
    let (mut audits, mut transfers, mut singles, mut restarts) = (0, 0, 0, 0);
    let (mut refused, mut rescued) = (0, 0);
    let (mut unknown, mut forgets, mut records_left, mut records_left_max) = (0, 0, 0, 0);
    let mut stopped = 0;
    for seed in 0..seeds {
        let result = run(seed, None, ganged).unwrap_or_else(|failure| panic!("{failure}"));
        unknown += result.outcomes_unknown;
        forgets += result.forgets_applied;
        records_left += result.step_records_left;
        records_left_max = records_left_max.max(result.step_records_left);
        stopped += result.drivers_stopped;
        audits += result.audits.len();
        transfers += result.transfers_done;
        singles += result.singles_done;
        restarts += result.restarts;
        refused += result.gangs_refused;
        rescued += result.gangs_rescued;
    }
    let seeds = seeds as usize;
    eprintln!(
        "{seeds} seeds: {audits} audits, {transfers} transfers, {singles} single-key ops, {restarts} restarts, \
         {refused} gangs refused and resubmitted, {rescued} gang copies proposed by non-origins, \
         {unknown} transactions answered outcome unknown, {forgets} Forget copies applied, \
         {stopped} drivers stopped by a forgotten step, \
         {records_left} step records left at the end (at most {records_left_max} in a seed, over 3 replicas)"
    );
    if !ganged {
        assert!(forgets > 0, "no transaction was forgotten");
        // Without forgetting, every transfer leaves at least 15 records (a Lock and an
        // Update in each of two logs and a Finish, at 3 replicas), every audit more.
        assert!(records_left < transfers, "step records are not bounded: {records_left} left");
        assert!(unknown * 20 < transfers, "too many outcomes unknown: {unknown}");
    }
    assert!(audits > seeds * 10, "too few audits: {audits}");
    assert!(transfers > seeds * 20, "too few transfers: {transfers}");
    assert!(restarts > seeds / 2, "too few restarts: {restarts}");
}

#[test]
fn bank_transfers_across_logs_keep_the_total_under_faults_and_restarts() {
    // BANK_SEEDS=1000 cargo test -p chorus-raftlog --test bank -- --nocapture
    sweep(false, 60);
}

#[test]
fn ganged_bank_transfers_keep_the_total_under_faults_and_restarts() {
    // Each seed completes several times the operations of the locking kind: fewer seeds.
    sweep(true, 30);
}

#[test]
fn transactions_without_locks_are_caught_by_the_bank() {
    let caught = (0..20).find(|seed| run(*seed, Some(Bug::NoTxnLocks), false).is_err());
    assert!(caught.is_some(), "NoTxnLocks survived 20 seeds");
    eprintln!("NoTxnLocks caught at seed {caught:?}");
}

#[test]
fn steps_run_after_their_transaction_was_forgotten_are_caught_by_the_bank() {
    // Caught by an invariant, not by the stall a leftover lock causes later.
    let named = |failure: &String| {
        failure.contains("a transaction every replica finished") || failure.contains("total")
    };
    let caught =
        (0..20).find(|seed| run(*seed, Some(Bug::RunsForgottenSteps), false).is_err_and(|e| named(&e)));
    assert!(caught.is_some(), "RunsForgottenSteps survived 20 seeds");
    eprintln!(
        "RunsForgottenSteps caught at seed {caught:?}: {:?}",
        run(caught.unwrap(), Some(Bug::RunsForgottenSteps), false).err()
    );
}

#[test]
fn gangs_without_the_rendezvous_are_caught_by_the_bank() {
    let caught = (0..20).find(|seed| run(*seed, Some(Bug::GangNoRendezvous), true).is_err());
    assert!(caught.is_some(), "GangNoRendezvous survived 20 seeds");
    eprintln!(
        "GangNoRendezvous caught at seed {caught:?}: {:?}",
        run(caught.unwrap(), Some(Bug::GangNoRendezvous), true).err()
    );
}
