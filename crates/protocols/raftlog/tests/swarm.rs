//! Raftlog under the simulator's swarm: seeds with faults (loss, duplication, reordering,
//! symmetric and one-way partitions, crashes of leaders and followers, half of them in the
//! middle of a broadcast), scripted membership (a view without the crashed node reaches the
//! survivors; informational for raftlog), every history checked for linearizability and
//! every operation required to complete once the network heals. The broken variants must
//! be caught.
//!
//! This runs the core without touching crates/sim: `simulate` takes a build closure.

use chorus_core::{NodeId, NodeSet};
use chorus_raftlog::{LeaderPlacement, RaftLog, RaftLogConfig};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::faults::FaultCounts;
use chorus_sim::simulator::{simulate, SeedRun, SimConfig};

/// What a sweep saw.
#[derive(Default, Debug)]
struct Sweep {
    failing: Vec<String>,
    ops_checked: usize,
    inconclusive_keys: usize,
    faults: FaultCounts,
}

fn config_for(me: NodeId, replicas: NodeSet, seed: u64) -> RaftLogConfig {
    let mut config = RaftLogConfig::new(me, replicas);
    // Each seed draws the number of logs, so both one busy log and many quiet ones run.
    config.logs = [1, 2, 8][(seed % 3) as usize];
    // ... and how often logs are compacted: often enough that a follower cut off by a
    // partition comes back behind the compaction and must install the leader's snapshot
    // (state machine and session table) instead of entries.
    config.snapshot_entries = [10, 40, 20_000][(seed / 3 % 3) as usize];
    // ... and how many trailing entries a compaction keeps: none (every lagging follower
    // needs a snapshot), a few (most do), or many (a briefly lagging one catches up from
    // the log).
    config.trailing_entries = [0, 4, 1_000][(seed / 9 % 3) as usize];
    // ... and, on half the seeds, sessions that expire after 20 entries of their log, so
    // retries that arrive after the expiry are refused (never run twice).
    config.session_expiry_entries = [100_000, 20][(seed / 27 % 2) as usize];
    // ... and, on a quarter of the seeds, coupled execution (entries run once committed);
    // the others execute every entry on arrival and roll back lost ones (the default).
    config.decoupled = seed % 4 != 3;
    // ... and, on alternate runs of 54 seeds (the first 54 as before), every log's leader
    // preferred on the first node rather than spread over the nodes.
    config.leaders = [LeaderPlacement::Spread, LeaderPlacement::Together][(seed / 54 % 2) as usize];
    config
}

fn run_seed(seed: u64, replicas: usize, tweak: &dyn Fn(&mut RaftLogConfig)) -> SeedRun {
    let config = SimConfig::new(seed, replicas);
    simulate(&config, &mut |me, members, _| {
        let mut config = config_for(me, members, seed);
        tweak(&mut config);
        RaftLog::new(config)
    })
}

fn sweep(replicas: usize, seeds: std::ops::Range<u64>, tweak: &dyn Fn(&mut RaftLogConfig)) -> Sweep {
    let mut sweep = Sweep::default();
    for seed in seeds {
        let run = run_seed(seed, replicas, tweak);
        let report = check_history(&run.history, &CheckerConfig::default());
        sweep.ops_checked += report.ops_checked;
        sweep.inconclusive_keys += report.inconclusive_keys.len();
        sweep.faults.add(&run.faults);
        if !report.violations.is_empty() || !run.liveness_failures.is_empty() {
            let mut text = format!("seed {seed}");
            if let Some(violation) = report.violations.first() {
                text.push_str(&format!("\n{violation}"));
            }
            for failure in run.liveness_failures.iter().take(3) {
                text.push_str(&format!("\nliveness: {failure}"));
            }
            sweep.failing.push(text);
        }
    }
    sweep
}

fn assert_clean(replicas: usize, seeds: u64) {
    let result = sweep(replicas, 0..seeds, &|_| {});
    assert!(
        result.failing.is_empty(),
        "{} of {seeds} seeds failed at {replicas} replicas; first:\n{}",
        result.failing.len(),
        result.failing[0]
    );
    // The sweep must actually exercise faults, or "no violation" means nothing.
    let faults = result.faults;
    assert!(faults.crashes > seeds / 10, "too few crashes: {faults:?}");
    assert!(faults.crashes_mid_broadcast > seeds / 40, "too few mid-broadcast crashes: {faults:?}");
    assert!(faults.partitions > seeds / 10, "too few partitions: {faults:?}");
    assert!(faults.messages_lost > seeds, "too few losses: {faults:?}");
    assert!(faults.messages_duplicated > seeds, "too few duplicates: {faults:?}");
    assert!(result.ops_checked as u64 > seeds * 50, "too few operations: {}", result.ops_checked);
    assert_eq!(result.inconclusive_keys, 0, "the checker gave up on some keys");
}

#[test]
fn raftlog_is_linearizable_and_live_under_faults_with_3_replicas() {
    assert_clean(3, 1_000);
}

#[test]
fn raftlog_is_linearizable_and_live_under_faults_with_5_replicas() {
    assert_clean(5, 500);
}

/// A longer sweep on demand: `RAFTLOG_SEEDS=20000 cargo test -p chorus-raftlog --test swarm
/// long_sweep -- --ignored --nocapture`.
#[test]
#[ignore]
fn long_sweep() {
    let seeds: u64 = std::env::var("RAFTLOG_SEEDS").ok().and_then(|text| text.parse().ok()).unwrap_or(10_000);
    for replicas in [3, 5, 7] {
        let result = sweep(replicas, 0..seeds, &|_| {});
        eprintln!(
            "{replicas} replicas: {} of {seeds} seeds failed, {} ops checked, {:?}",
            result.failing.len(),
            result.ops_checked,
            result.faults
        );
        for failure in result.failing.iter().take(3) {
            eprintln!("{failure}");
        }
    }
}

#[test]
fn a_raftlog_seed_replays_exactly() {
    let (first, second) = (run_seed(42, 5, &|_| {}), run_seed(42, 5, &|_| {}));
    assert_eq!(format!("{:?}", first.history), format!("{:?}", second.history));
    assert_eq!(first.events, second.events);
}

/// Totals of every replica's counters over a sweep, gathered when the simulator drops them.
mod counted {
    use std::cell::RefCell;
    use std::rc::Rc;

    use chorus_core::{ClientRequestId, Command, NodeId, Outbox, Replica, Time, View};
    use chorus_raftlog::{Message, RaftLog, RaftLogStats};

    pub struct Counted {
        pub inner: RaftLog,
        pub totals: Rc<RefCell<Vec<RaftLogStats>>>,
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.totals.borrow_mut().push(self.inner.stats());
        }
    }

    impl Replica for Counted {
        type Message = Message;
        fn id(&self) -> NodeId {
            self.inner.id()
        }
        fn on_client(
            &mut self,
            now: Time,
            request: ClientRequestId,
            command: Command,
            out: &mut Outbox<Message>,
        ) {
            self.inner.on_client(now, request, command, out)
        }
        fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
            self.inner.on_message(now, from, message, out)
        }
        fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
            self.inner.on_tick(now, out)
        }
        fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
            self.inner.on_view(now, view, out)
        }
    }
}

#[test]
fn the_sweep_exercises_retries_duplicates_and_leader_changes() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let totals = Rc::new(RefCell::new(Vec::new()));
    let (mut unknown, mut completed) = (0, 0);
    for seed in 0..300 {
        let config = SimConfig::new(seed, 3);
        let run = simulate(&config, &mut |me, members, _| counted::Counted {
            inner: RaftLog::new(config_for(me, members, seed)),
            totals: totals.clone(),
        });
        for operation in &run.history.operations {
            if operation.completion.is_some() {
                completed += 1;
            } else {
                unknown += 1;
            }
        }
    }
    let totals = totals.borrow();
    let sum = |field: fn(&chorus_raftlog::RaftLogStats) -> u64| totals.iter().map(field).sum::<u64>();
    let (snapshots_taken, snapshots_installed) = (sum(|s| s.snapshots_taken), sum(|s| s.snapshots_installed));
    let (resent, duplicates, relayed, retried_reads, forwarded, proposed, commands) = (
        sum(|s| s.batches_resent),
        sum(|s| s.proposals_duplicate),
        sum(|s| s.forwards_relayed),
        sum(|s| s.read_rounds_retried),
        sum(|s| s.batches_forwarded),
        sum(|s| s.entries_proposed),
        sum(|s| s.commands_proposed),
    );
    eprintln!(
        "completed {completed}, unknown {unknown}; forwarded {forwarded}, resent {resent}, relayed {relayed}, \
         duplicates applied {duplicates}, read rounds retried {retried_reads}, entries {proposed}, commands {commands}"
    );
    assert!(completed > 300 * 50, "too few operations completed: {completed}");
    assert!(resent > 100, "retries were not exercised: {resent}");
    // (Rarer than with coupled execution: a decoupled leader knows what its log executed.)
    assert!(duplicates > 0, "no retry ever reached the log twice: {duplicates}");
    assert!(retried_reads > 100, "read retries were not exercised: {retried_reads}");
    assert!(commands > proposed, "no entry ever carried more than one command");
    eprintln!("snapshots taken {snapshots_taken}, installed from a leader {snapshots_installed}");
    assert!(snapshots_installed > 10, "lagging followers never installed a snapshot: {snapshots_installed}");
    // Decoupled execution (three quarters of the seeds): entries executed on arrival commit,
    // and entries lost to a leader change are rolled back.
    let (early, committed, rolled_back) = (
        sum(|s| s.entries_executed_early),
        sum(|s| s.executions_committed),
        sum(|s| s.executions_rolled_back),
    );
    eprintln!("executed early {early}, committed {committed}, rolled back {rolled_back}");
    assert!(committed > 300 * 20, "too few early executions committed: {committed}");
    assert!(rolled_back > 5, "lost entries were rarely rolled back: {rolled_back}");
}

/// The first seed (from 0) at which the checker reports a violation, if any below `bound`.
fn first_caught(replicas: usize, bound: u64, bug: chorus_raftlog::Bug) -> Option<u64> {
    (0..bound).find(|&seed| {
        let run = run_seed(seed, replicas, &|config| config.bug = Some(bug));
        !check_history(&run.history, &CheckerConfig::default()).violations.is_empty()
    })
}

#[test]
fn reads_without_read_index_are_caught() {
    for replicas in [3, 5] {
        let caught = first_caught(replicas, 20, chorus_raftlog::Bug::LocalReads);
        assert!(caught.is_some(), "LocalReads survived 20 seeds at {replicas} replicas");
        eprintln!("LocalReads caught at seed {caught:?} with {replicas} replicas");
    }
}

#[test]
fn execution_without_sessions_is_caught() {
    for replicas in [3, 5] {
        let caught = first_caught(replicas, 200, chorus_raftlog::Bug::NoSessions);
        assert!(caught.is_some(), "NoSessions survived 200 seeds at {replicas} replicas");
        eprintln!("NoSessions caught at seed {caught:?} with {replicas} replicas");
    }
}
