//! Seeds in, verdicts out: run a protocol under the simulator and check what clients saw.
//!
//! Hermes, CRAQ and ZAB run with the real membership service ([`crate::managed`]): leases,
//! removals of live nodes, rejoins and restarts. Raftlog runs its own Raft groups (views are
//! informational to it) under the scripted membership. The chain store brings its own runner
//! ([`ProtocolSetup::Custom`], `chorus_chain::sim::setup`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chorus_core::{NodeId, NodeSet, Time};
use chorus_craq::{Craq, CraqConfig};
use chorus_hermes::{Hermes, HermesConfig, Optimizations};
use chorus_raftlog::disk::{DiskOptions, DurableRaftLog};
use chorus_raftlog::RaftLogConfig;
use chorus_storage::{SimDisk, StorageRegion};
pub use chorus_zab::ReadMode;
use chorus_zab::{Zab, ZabConfig};

use crate::checker::{check_history, CheckerConfig, Violation};
use crate::faults::FaultCounts;
use crate::managed::{
    managed_sim_config, simulate_managed, simulate_managed_appendonly, AppendOnly, MembershipTweak,
};
use crate::rng::Rng;
use crate::simulator::{
    simulate_with_restarts, swarm_turn_max, RestartContext, Restarted, SeedRun, SimConfig, StorageFaults,
};

/// A change applied to every replica's configuration, e.g. to select a broken variant.
pub type HermesTweak = Arc<dyn Fn(&mut HermesConfig) + Send + Sync>;

/// A change applied to every CRAQ replica's configuration.
pub type CraqTweak = Arc<dyn Fn(&mut CraqConfig) + Send + Sync>;

/// A change applied to every ZAB replica's configuration.
pub type ZabTweak = Arc<dyn Fn(&mut ZabConfig) + Send + Sync>;

/// A change applied to every raftlog replica's configuration.
pub type RaftlogTweak = Arc<dyn Fn(&mut RaftLogConfig) + Send + Sync>;

/// Runs one seed of a protocol this crate cannot depend on (its crate depends on chorus-sim,
/// e.g. chorus-chain through chorus-group): it builds its replicas and calls
/// [`simulate`] itself, returning the run and a description of the seed's options.
pub type CustomSimulate = Arc<dyn Fn(&SimConfig) -> (SeedRun, String) + Send + Sync>;

/// Which protocol core to simulate, and how.
#[derive(Clone)]
pub enum ProtocolSetup {
    Hermes {
        tweak: Option<HermesTweak>,
        membership: Option<MembershipTweak>,
    },
    Craq {
        tweak: Option<CraqTweak>,
        membership: Option<MembershipTweak>,
    },
    Zab {
        read_mode: ReadMode,
        tweak: Option<ZabTweak>,
        membership: Option<MembershipTweak>,
    },
    Raftlog {
        tweak: Option<RaftlogTweak>,
    },
    /// A protocol that brings its own seed runner (`chorus_chain::sim::setup`, feature `sim`).
    Custom {
        name: &'static str,
        simulate: CustomSimulate,
    },
}

impl ProtocolSetup {
    pub fn hermes() -> ProtocolSetup {
        ProtocolSetup::Hermes { tweak: None, membership: None }
    }

    pub fn craq() -> ProtocolSetup {
        ProtocolSetup::Craq { tweak: None, membership: None }
    }

    pub fn zab(read_mode: ReadMode) -> ProtocolSetup {
        ProtocolSetup::Zab { read_mode, tweak: None, membership: None }
    }

    pub fn raftlog() -> ProtocolSetup {
        ProtocolSetup::Raftlog { tweak: None }
    }

    /// The setup `chorus sim --protocol NAME` runs, for the protocols this crate knows.
    pub fn named(name: &str) -> Option<ProtocolSetup> {
        Some(match name {
            "hermes" => ProtocolSetup::hermes(),
            "craq" => ProtocolSetup::craq(),
            "zab" => ProtocolSetup::zab(ReadMode::Sync),
            "zab-local" => ProtocolSetup::zab(ReadMode::Local),
            "raftlog" => ProtocolSetup::raftlog(),
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            ProtocolSetup::Hermes { .. } => "hermes",
            ProtocolSetup::Craq { .. } => "craq",
            ProtocolSetup::Zab { read_mode: ReadMode::Sync, .. } => "zab",
            ProtocolSetup::Zab { read_mode: ReadMode::Local, .. } => "zab-local",
            ProtocolSetup::Raftlog { .. } => "raftlog",
            ProtocolSetup::Custom { name, .. } => name,
        }
    }

    /// Run one seed of this protocol.
    pub fn simulate(&self, config: &SimConfig) -> (SeedRun, String) {
        match self {
            ProtocolSetup::Hermes { tweak, membership } => {
                simulate_hermes(config, tweak.as_ref(), membership.as_ref())
            }
            ProtocolSetup::Craq { tweak, membership } => {
                simulate_craq(config, tweak.as_ref(), membership.as_ref())
            }
            ProtocolSetup::Zab { read_mode, tweak, membership } => {
                simulate_zab(config, *read_mode, tweak.as_ref(), membership.as_ref())
            }
            ProtocolSetup::Raftlog { tweak } => simulate_raftlog(config, tweak.as_ref()),
            ProtocolSetup::Custom { simulate, .. } => simulate(config),
        }
    }
}

/// `setup` (Hermes, CRAQ or ZAB) with its keys in the server's append-only file on each
/// node's simulated disk: crashed nodes, and every node after a power loss, restart from what
/// their disk kept (`chorus sim --appendonly`).
pub fn appendonly(setup: ProtocolSetup, mode: AppendOnly) -> ProtocolSetup {
    let name = setup.name();
    let simulate =
        move |config: &SimConfig| setup.simulate(&SimConfig { appendonly: mode, ..config.clone() });
    ProtocolSetup::Custom { name, simulate: Arc::new(simulate) }
}

/// Each seed also draws the Hermes options (O2, O3 and the message-loss timeout) and how
/// finely a joiner's copy is chunked, so the sweep covers every combination.
fn simulate_hermes(
    config: &SimConfig,
    tweak: Option<&HermesTweak>,
    membership: Option<&MembershipTweak>,
) -> (SeedRun, String) {
    let mut options_rng = Rng::new(config.seed ^ 0x4845_524D_4553);
    let optimizations = Optimizations {
        virtual_ids_per_node: if options_rng.chance(0.5) { 1 } else { 4 },
        broadcast_acks: options_rng.chance(0.5),
    };
    let message_loss_timeout = Time::from_millis(options_rng.range(3, 30));
    let chunk_bytes_target = *options_rng.pick(&[64, 4096]);
    let description =
        format!("{optimizations:?}, mlt {message_loss_timeout:?}, chunks {chunk_bytes_target} B");
    let build = |me: NodeId, replicas: NodeSet, seed: u64, recovering: bool| {
        let mut hermes_config = HermesConfig::new(me, replicas);
        hermes_config.optimizations = optimizations;
        hermes_config.message_loss_timeout = message_loss_timeout;
        hermes_config.chunk_bytes_target = chunk_bytes_target;
        hermes_config.recovering = recovering;
        hermes_config.seed = seed;
        if let Some(tweak) = tweak {
            tweak(&mut hermes_config);
        }
        Hermes::new(hermes_config)
    };
    (simulate_managed_either(config, membership, &build), description)
}

/// Each seed draws the retransmission timeout, so some seeds retransmit eagerly (duplicates
/// everywhere) and others wait long (a lost message stalls its key for a while).
fn simulate_craq(
    config: &SimConfig,
    tweak: Option<&CraqTweak>,
    membership: Option<&MembershipTweak>,
) -> (SeedRun, String) {
    let mut options_rng = Rng::new(config.seed ^ 0x4352_4151);
    let retransmit_timeout = Time::from_millis(options_rng.range(3, 30));
    let chunk_bytes_target = *options_rng.pick(&[64, 4096]);
    let description = format!("retransmit {retransmit_timeout:?}, chunks {chunk_bytes_target} B");
    let build = |me: NodeId, replicas: NodeSet, _seed: u64, recovering: bool| {
        let mut craq_config = CraqConfig::new(me, replicas);
        craq_config.retransmit_timeout = retransmit_timeout;
        craq_config.chunk_bytes_target = chunk_bytes_target;
        craq_config.recovering = recovering;
        if let Some(tweak) = tweak {
            tweak(&mut craq_config);
        }
        Craq::new(craq_config)
    };
    // A chain's traffic is one message down the chain: a crash strikes in any turn that sends
    // one, so crashes between a turn's writes and their sync happen for CRAQ too.
    let config = SimConfig { crash_turn_destinations_min: 1, ..config.clone() };
    (simulate_managed_either(&config, membership, &build), description)
}

/// Each seed draws the retransmission timeout and how many entries a catch-up message carries
/// (1 makes a lagging follower catch up entry by entry).
fn simulate_zab(
    config: &SimConfig,
    read_mode: ReadMode,
    tweak: Option<&ZabTweak>,
    membership: Option<&MembershipTweak>,
) -> (SeedRun, String) {
    let mut options_rng = Rng::new(config.seed ^ 0x005A_4142);
    let retransmit_timeout = Time::from_millis(options_rng.range(3, 30));
    let catch_up_entries_max = if options_rng.chance(0.5) { 1 } else { 64 };
    let snapshot_chunk_bytes_target = *options_rng.pick(&[24, 4096]);
    let description = format!(
        "{} reads, retransmit {retransmit_timeout:?}, catch-up batch {catch_up_entries_max}, snapshot chunks {snapshot_chunk_bytes_target} B",
        read_mode.name()
    );
    let build = |me: NodeId, replicas: NodeSet, _seed: u64, recovering: bool| {
        let mut zab_config = ZabConfig::new(me, replicas);
        zab_config.read_mode = read_mode;
        zab_config.retransmit_timeout = retransmit_timeout;
        zab_config.catch_up_entries_max = catch_up_entries_max;
        zab_config.snapshot_chunk_bytes_target = snapshot_chunk_bytes_target;
        zab_config.recovering = recovering;
        if let Some(tweak) = tweak {
            tweak(&mut zab_config);
        }
        let persisting = config.appendonly != AppendOnly::Off;
        if persisting {
            // As `chorus node` with an append-only file: a node back from its files takes
            // only the entries it missed while they are still held.
            zab_config.history_retained_entries = ZAB_HISTORY_RETAINED_ENTRIES;
        }
        let mut zab = Zab::new(zab_config);
        if persisting {
            zab.enable_persistence();
        }
        zab
    };
    (simulate_managed_either(config, membership, &build), description)
}

/// What a persisting ZAB node keeps of its history after every replica applied it (the
/// server's `ZAB_HISTORY_RETAINED_ENTRIES`).
const ZAB_HISTORY_RETAINED_ENTRIES: u64 = 20_000;

/// Run a managed protocol built by `build(me, replicas, seed, recovering)`, its keys in memory
/// or in the append-only file as `config.appendonly` says.
fn simulate_managed_either<P>(
    config: &SimConfig,
    membership: Option<&MembershipTweak>,
    build: &dyn Fn(NodeId, NodeSet, u64, bool) -> P,
) -> SeedRun
where
    P: chorus_persistence::Persisted,
    P::Message: std::fmt::Debug,
{
    let managed = managed_sim_config(config);
    match config.appendonly {
        AppendOnly::Off => {
            let mut build =
                |me, replicas, seed, crashed: Option<&P>| build(me, replicas, seed, crashed.is_some());
            simulate_managed(&managed, membership, &mut build)
        }
        mode => {
            simulate_managed_appendonly(&managed, membership, mode, &mut |me, replicas, seed, joining| {
                build(me, replicas, seed, joining)
            })
        }
    }
}

/// Raftlog runs its own Raft groups (views are informational to it), so no membership service:
/// each node keeps its two-level log and checkpoints on its own simulated disk, crashed nodes
/// (and, on some seeds, every node at once: a power loss) restart from what the disk kept
/// (unsynced writes lost or torn, and on some seeds a sector of one restart corrupted), and
/// clocks drift and processes pause. Each seed draws the number of Raft logs (one busy log or
/// many quiet ones), how often logs are compacted (so lagging followers install snapshots) and
/// how small the circular log is (so it drains into the file often).
fn simulate_raftlog(config: &SimConfig, tweak: Option<&RaftlogTweak>) -> (SeedRun, String) {
    let mut options_rng = Rng::new(config.seed ^ 0x5241_4654);
    let logs = *options_rng.pick(&[1, 2, 8]);
    let snapshot_entries = *options_rng.pick(&[10, 40, 20_000]);
    let circular_bytes = *options_rng.pick(&[128 + 4096, 128 + 16_384]);
    let mut corrupt_one_restart = options_rng.chance(0.25);
    // Drawn from the seed, not the RNG, so the other draws stay what they were.
    // Half the seeds keep none, so lagging followers still install snapshots often.
    let trailing_entries = [0, 4, 0, 1_000][(config.seed / 5 % 4) as usize];
    // On a quarter of the seeds without a corrupted restart, one restart finds an empty disk
    // and comes back as a replacement (a new Raft member of every log; docs/protocols/
    // raftlog.md, "Replacing a node"). Only one: two nodes of three without their data lose
    // committed entries, whatever the protocol.
    // Half the seeds sync as the server's sync thread does (`raftlog_sync`): a sync takes
    // time while the node goes on.
    let sync_latency =
        (config.seed / 3 % 2 == 1).then_some((Time::from_micros(20), Time::from_micros(3_000)));
    // With syncs taking time a power loss can tear an unsynced record of the circular log
    // while later ones survive; recovery ends the log there (docs/protocols/raftlog.md, "A
    // power loss during a sync") instead of refusing, so these seeds may replace a node too.
    let mut replace_one_restart = !corrupt_one_restart && config.seed / 7 % 4 == 1;
    // Three seeds in four run the server's event loop's turns (`swarm_turn_max`), and, on
    // three in four, the logs are flushed once at a turn's end (`raftlog_flush_per_turn`,
    // the server's default).
    let turn_max = swarm_turn_max(config.seed);
    let flush_at_turn_end = !(config.seed / 13).is_multiple_of(4);
    let description = format!(
        "{logs} logs, snapshot every {snapshot_entries} keeping {trailing_entries} trailing entries, \
         circular log {circular_bytes} B{}{}{}{}{}",
        if corrupt_one_restart { ", one restart finds a corrupted sector" } else { "" },
        if replace_one_restart { ", one restart replaces the node (empty disk, --join)" } else { "" },
        if sync_latency.is_some() { ", syncs on a thread taking 20 us to 3 ms" } else { "" },
        turn_max.map(|max| format!(", turns of up to {} us", max.as_micros())).unwrap_or_default(),
        if flush_at_turn_end { ", flushed once a turn" } else { "" },
    );
    let raftlog_config = |me: NodeId, replicas: NodeSet| {
        let mut raftlog_config = RaftLogConfig::new(me, replicas);
        raftlog_config.logs = logs;
        raftlog_config.snapshot_entries = snapshot_entries;
        raftlog_config.trailing_entries = trailing_entries;
        raftlog_config.flush_at_turn_end = flush_at_turn_end;
        if let Some(tweak) = tweak {
            tweak(&mut raftlog_config);
        }
        raftlog_config
    };
    // `replacing`: the disk is empty and the node joins as a replacement with this seed.
    let open = |me: NodeId, replicas: NodeSet, disk: SimDisk, replacing: Option<u64>| {
        let region = StorageRegion::open(disk.clone(), "circular.region", circular_bytes)
            .map_err(|error| error.to_string())?;
        let options = DiskOptions { circular_bytes, ..DiskOptions::default() };
        let mut raftlog_config = raftlog_config(me, replicas);
        // Only a fresh disk takes these (it keeps them): identity checks are on.
        let fresh_randomness = replacing.unwrap_or(config.seed ^ 0x1D);
        raftlog_config.identity = Rng::new(fresh_randomness ^ me.0 as u64).next_u64() | 1;
        if let Some(seed) = replacing {
            raftlog_config.joining = true;
            raftlog_config.incarnation = (Rng::new(seed).next_u64() & chorus_raftlog::INCARNATION_MAX).max(1);
        }
        DurableRaftLog::open_on(raftlog_config, Box::new(disk), Box::new(region), options)
            .map_err(|error| error.to_string())
    };
    // Each node's disk, kept apart from its incarnations: a restart opens what it kept.
    let disks: std::cell::RefCell<Vec<SimDisk>> = Default::default();
    let mut build = |me: NodeId, replicas: NodeSet, _seed: u64| {
        let disk = SimDisk::new();
        disks.borrow_mut().push(disk.clone());
        debug_assert_eq!(disks.borrow().len(), me.index() + 1, "nodes are built in order");
        open(me, replicas, disk, None).expect("an empty disk opens")
    };
    let mut restart = |context: RestartContext, _crashed: &DurableRaftLog| {
        if std::mem::take(&mut replace_one_restart) {
            let disk = SimDisk::new();
            disks.borrow_mut()[context.node.index()] = disk.clone();
            let replica = open(context.node, context.replicas, disk, Some(context.seed));
            return Restarted { replica, storage: StorageFaults::default() };
        }
        let disk = disks.borrow()[context.node.index()].clone();
        let mut storage = StorageFaults::crash(&disk, context.seed, std::mem::take(&mut corrupt_one_restart));
        let replica = open(context.node, context.replicas, disk, None);
        // Refused: a checksum caught the damage (the node stays down).
        storage.corruption_detected += replica.is_err() as u64;
        Restarted { replica, storage }
    };
    let mut sim = config.clone();
    sim.scripted_membership = false;
    sim.fault_phase_max = Time::from_millis(1_500);
    sim.restart_after = Some(Time::from_millis(*options_rng.pick(&[40, 100, 300])));
    // Raft elections and ReadIndex lean on no clock bound: any drift within 10% is fine.
    sim.clock_drift_max_ppm = 100_000;
    sim.pauses = true;
    sim.power_loss = true;
    sim.sync_latency = sync_latency;
    sim.turn_max = turn_max;
    (simulate_with_restarts(&sim, &mut build, &mut restart), description)
}

/// The verdict on one seed.
#[derive(Debug)]
pub struct SeedVerdict {
    pub seed: u64,
    pub ops_checked: usize,
    pub faults: FaultCounts,
    pub violations: Vec<Violation>,
    pub liveness_failures: Vec<String>,
    pub inconclusive_keys: usize,
    pub protocol_options: String,
    pub run: SeedRun,
}

impl SeedVerdict {
    /// No violation, no liveness failure, and no key the checker gave up on: a key it could
    /// not decide may hide a violation, so it fails the seed like one.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.liveness_failures.is_empty() && self.inconclusive_keys == 0
    }
}

pub fn check_seed(setup: &ProtocolSetup, config: &SimConfig) -> SeedVerdict {
    let (run, protocol_options) = setup.simulate(config);
    let report = check_history(&run.history, &CheckerConfig::default());
    SeedVerdict {
        seed: config.seed,
        ops_checked: report.ops_checked,
        faults: run.faults.clone(),
        violations: report.violations,
        liveness_failures: run.liveness_failures.clone(),
        inconclusive_keys: report.inconclusive_keys.len(),
        protocol_options,
        run,
    }
}

/// Totals over a sweep of seeds.
#[derive(Debug, Default, serde::Serialize)]
pub struct SweepSummary {
    pub protocol: String,
    /// The broken variant the sweep ran, if any (kebab-case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
    pub replicas: usize,
    pub seeds: usize,
    pub ops_checked: usize,
    pub faults_injected: u64,
    pub faults: FaultCounts,
    pub violations: usize,
    pub liveness_failures: usize,
    /// Keys the checker's search gave up on. Each fails its seed: it may hide a violation.
    pub inconclusive_keys: usize,
    pub failing_seeds: Vec<u64>,
    /// Seeds whose run panicked (a replica's assertion, usually a broken variant breaking an
    /// invariant the core checks), with the panic message. They count as failing seeds.
    pub panicked_seeds: Vec<(u64, String)>,
}

/// Run `seeds` on `threads` threads. `on_seed` sees every verdict (in completion order) and
/// may stop the sweep early by returning `false`; which other seeds ran before the stop then
/// depends on thread timing, but never whether a failure is reported. A seed whose run panics
/// is a failing seed too (in `panicked_seeds`); the sweep goes on.
pub fn sweep(
    setup: &ProtocolSetup,
    replicas: usize,
    seeds: &[u64],
    threads: usize,
    on_seed: &(dyn Fn(&SeedVerdict) -> bool + Sync),
) -> SweepSummary {
    let next = AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let summary =
        Mutex::new(SweepSummary { protocol: setup.name().to_string(), replicas, ..SweepSummary::default() });
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= seeds.len() || stop.load(Ordering::Relaxed) {
                    break;
                }
                let config = SimConfig::new(seeds[index], replicas);
                let run =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_seed(setup, &config)));
                let verdict = match run {
                    Ok(verdict) => verdict,
                    Err(panic) => {
                        let mut summary = summary.lock().expect("summary lock");
                        summary.seeds += 1;
                        summary.failing_seeds.push(config.seed);
                        summary.panicked_seeds.push((config.seed, panic_message(panic.as_ref())));
                        continue;
                    }
                };
                let keep_going = on_seed(&verdict);
                summary.lock().expect("summary lock").add(&verdict);
                if !keep_going {
                    stop.store(true, Ordering::Relaxed);
                }
            });
        }
    });
    let mut summary = summary.into_inner().expect("summary lock");
    summary.failing_seeds.sort();
    summary.panicked_seeds.sort();
    summary
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(message), _) => message.to_string(),
        (_, Some(message)) => message.clone(),
        _ => "a panic without a message".to_string(),
    }
}

impl SweepSummary {
    fn add(&mut self, verdict: &SeedVerdict) {
        self.seeds += 1;
        self.ops_checked += verdict.ops_checked;
        self.faults.add(&verdict.faults);
        self.faults_injected = self.faults.total();
        self.violations += verdict.violations.len();
        self.liveness_failures += verdict.liveness_failures.len();
        self.inconclusive_keys += verdict.inconclusive_keys;
        if !verdict.passed() {
            self.failing_seeds.push(verdict.seed);
        }
    }
}

/// One failing seed, ready to print: options, violations, the first liveness failures.
pub fn describe_failure(verdict: &SeedVerdict) -> String {
    let mut text = format!("seed {} ({})", verdict.seed, verdict.protocol_options);
    for violation in &verdict.violations {
        text.push_str(&format!("\n{violation}"));
    }
    for failure in verdict.liveness_failures.iter().take(3) {
        text.push_str(&format!("\nliveness: {failure}"));
    }
    if verdict.inconclusive_keys > 0 {
        text.push_str(&format!(
            "\n{} keys inconclusive: the checker's search budget ran out",
            verdict.inconclusive_keys
        ));
    }
    text
}

/// A coverage floor: a sweep of `seeds` seeds must count at least `per_1000_seeds * seeds /
/// 1000` of `counter` (a [`FaultCounts::get`] name), or it has gone soft.
#[derive(Clone, Copy, Debug)]
pub struct Minimum {
    pub counter: &'static str,
    pub per_1000_seeds: u64,
}

/// The floors every swarm of the main shape must reach, whatever the protocol: faults of
/// every kind, membership changes of live nodes, restarts, drifting clocks and pauses, and
/// concurrency in the history. Each protocol adds its own (replays, RMW aborts, crashes in
/// the middle of its broadcasts, ...).
pub const MANAGED_MINIMUMS: &[Minimum] = &[
    Minimum { counter: "messages_lost", per_1000_seeds: 1_000 },
    Minimum { counter: "messages_duplicated", per_1000_seeds: 1_000 },
    Minimum { counter: "messages_reordered", per_1000_seeds: 1_000 },
    Minimum { counter: "partitions", per_1000_seeds: 500 },
    Minimum { counter: "crashes", per_1000_seeds: 300 },
    Minimum { counter: "restarts", per_1000_seeds: 300 },
    Minimum { counter: "views_installed", per_1000_seeds: 1_000 },
    Minimum { counter: "live_nodes_removed", per_1000_seeds: 300 },
    Minimum { counter: "nodes_readded", per_1000_seeds: 300 },
    Minimum { counter: "clocks_drifting", per_1000_seeds: 500 },
    Minimum { counter: "pauses", per_1000_seeds: 300 },
    // Typed reads that found their key's deadline passed and ran the replicated delete.
    Minimum { counter: "expiry.reads_found_expired", per_1000_seeds: 1_000 },
    Minimum { counter: "ops_overlapping", per_1000_seeds: 50_000 },
    Minimum { counter: "updates_interrupted", per_1000_seeds: 300 },
    // Three seeds in four run the event loop's turns (`swarm_turn_max`): turns that took
    // several calls (351,000-443,000 per 1,000 seeds for Hermes, CRAQ and ZAB when the floor
    // was set).
    Minimum { counter: "turns_of_several_calls", per_1000_seeds: 150_000 },
    // Sectors of `membership.log` corrupted at a restart, each caught by its checksums. Rare
    // (a short log's newest writes are spared: see `chorus_storage::SimDisk::corrupt`), but
    // never none.
    Minimum { counter: "storage_sectors_corrupted", per_1000_seeds: 2 },
    Minimum { counter: "storage_corruption_detected", per_1000_seeds: 2 },
];

/// Floors per 1,000 seeds for swarms whose nodes keep their keys in the append-only file
/// ([`appendonly`]): restarts from the files, power losses, every kind of storage fault and
/// its detection, crashes between a turn's write and its sync, and rewrites.
pub const APPENDONLY_MINIMUMS: &[Minimum] = &[
    Minimum { counter: "appendonly.restarts_from_disk", per_1000_seeds: 300 },
    Minimum { counter: "appendonly.rewrites", per_1000_seeds: 5_000 },
    Minimum { counter: "power_losses", per_1000_seeds: 100 },
    Minimum { counter: "crashes_before_sync", per_1000_seeds: 10 },
    // Files whose unsynced writes a crash lost, and whose writes it tore partway.
    Minimum { counter: "storage_writes_lost", per_1000_seeds: 4 },
    Minimum { counter: "storage_writes_torn", per_1000_seeds: 3 },
    Minimum { counter: "storage_sectors_corrupted", per_1000_seeds: 50 },
    Minimum { counter: "storage_corruption_detected", per_1000_seeds: 50 },
];

/// Every floor `counts` misses over `seeds` seeds, as readable lines.
pub fn coverage_shortfalls(counts: &FaultCounts, seeds: u64, minimums: &[Minimum]) -> Vec<String> {
    minimums
        .iter()
        .filter_map(|minimum| {
            let floor = minimum.per_1000_seeds * seeds / 1_000;
            let seen = counts.get(minimum.counter);
            (seen < floor).then(|| format!("{}: {seen} < {floor}", minimum.counter))
        })
        .collect()
}

/// The tests' swarm check: seeds `0..seeds` at `replicas` must all pass (no violation, no
/// liveness failure, no key the checker gave up on, no panic), and the sweep must have
/// reached every coverage floor in `minimums` (else "no violation" would mean less than it
/// says). Panics with the first failure and the command that replays it.
pub fn assert_swarm_passes(
    setup: &ProtocolSetup,
    replicas: usize,
    seeds: u64,
    minimums: &[Minimum],
) -> SweepSummary {
    let seed_list: Vec<u64> = (0..seeds).collect();
    let failures = Mutex::new(Vec::new());
    let summary = sweep(setup, replicas, &seed_list, 2, &|verdict| {
        if !verdict.passed() {
            failures.lock().expect("failures lock").push(describe_failure(verdict));
        }
        true
    });
    let failures = failures.into_inner().expect("failures lock");
    if let Some((seed, message)) = summary.panicked_seeds.first() {
        panic!(
            "seed {seed} panicked at {replicas} replicas: {message}\nreplay: chorus sim --protocol {} --replicas {replicas} --seed {seed} --seeds 1 --trace",
            setup.name()
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds failed at {replicas} replicas; first:\n{}\nreplay: chorus sim --protocol {} --replicas {replicas} --seed <seed> --seeds 1 --trace",
        failures.len(),
        failures[0],
        setup.name()
    );
    assert_eq!(summary.seeds as u64, seeds);
    assert!(summary.ops_checked as u64 > seeds * 50, "too few operations: {}", summary.ops_checked);
    let shortfalls = coverage_shortfalls(&summary.faults, seeds, minimums);
    assert!(shortfalls.is_empty(), "the swarm went soft: {shortfalls:?}\n{:?}", summary.faults);
    summary
}

/// How a broken variant fared: the first seed whose history broke linearizability (or the
/// run's named invariant), and what else happened on the way, which does not count.
#[derive(Debug, Default)]
pub struct Catch {
    pub violation_seed: Option<u64>,
    pub seeds_run: usize,
    pub panicked_seeds: Vec<(u64, String)>,
    /// Seeds that stalled without a violation.
    pub liveness_only_seeds: Vec<u64>,
}

/// Run seeds `0..seeds_max` of `setup` until one shows a linearizability violation.
pub fn first_violation(setup: &ProtocolSetup, replicas: usize, seeds_max: u64, threads: usize) -> Catch {
    let seeds: Vec<u64> = (0..seeds_max).collect();
    let found = Mutex::new(Vec::new());
    let stalled = Mutex::new(Vec::new());
    let summary = sweep(setup, replicas, &seeds, threads, &|verdict| {
        if !verdict.violations.is_empty() {
            found.lock().expect("lock").push(verdict.seed);
            return false;
        }
        if !verdict.liveness_failures.is_empty() {
            stalled.lock().expect("lock").push(verdict.seed);
        }
        true
    });
    let mut liveness_only_seeds = stalled.into_inner().expect("lock");
    liveness_only_seeds.sort();
    Catch {
        violation_seed: found.into_inner().expect("lock").into_iter().min(),
        seeds_run: summary.seeds,
        panicked_seeds: summary.panicked_seeds,
        liveness_only_seeds,
    }
}
