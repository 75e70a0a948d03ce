//! Protocols under the real membership service (`chorus-membership`), as the main swarms run
//! them: views agreed through Raft, heartbeats, leases that gate local reads, nodes removed
//! while alive (a partition or a pause longer than the lease) rejoining as new members, and
//! crashed nodes restarting from what they kept (the membership's Raft records; the protocol's
//! keys are in memory, so the node joins and copies them from its peers).
//!
//! Each node's `membership.log` lives on its own simulated disk (`chorus_storage::SimDisk`):
//! a crash between a turn's write and its sync tears it, and on a quarter of the seeds one
//! restart finds a corrupted sector, which the log's checksums must catch (the node then
//! refuses to start; a while later it is replaced, as an operator would: it comes back on a
//! new, empty disk and joins).
//!
//! The membership's timing is scaled to the simulator's partitions (5 to 300 ms): 10 ms
//! heartbeats, suspicion after 5 missed, a 60 ms lease with a 15 ms drift margin. Each node's
//! clock may run fast or slow within the bound that margin covers (10%).

use std::fmt::Debug;
use std::sync::Arc;

use chorus_core::{ClientRequestId, Command, Key, NodeId, NodeSet, Outbox, Replica, Time, View};
use chorus_membership::{Membership, MembershipConfig, MembershipLog, Wire, WithMembership};
use chorus_persistence::Persisted;
use chorus_storage::SimDisk;

use crate::rng::Rng;
use crate::simulator::{
    simulate_with_restarts, RestartContext, Restarted, SeedRun, SimConfig, StorageFaults,
};

/// A change applied to every node's membership configuration (a broken variant).
pub type MembershipTweak = Arc<dyn Fn(&mut MembershipConfig) + Send + Sync>;

/// Builds a protocol core: `(me, replicas, seed, crashed)`, `crashed` being the crashed
/// incarnation when the node restarts.
pub type BuildProtocol<'a, P> = dyn FnMut(NodeId, NodeSet, u64, Option<&P>) -> P + 'a;

/// The membership of a swarm's node: partition-scale timing, and nodes removed while alive
/// ask to come back.
pub fn swarm_membership_config(me: NodeId, replicas: NodeSet) -> MembershipConfig {
    let mut config = MembershipConfig::new(me, replicas);
    config.heartbeat_period = Time::from_millis(10);
    config.missed_heartbeats_max = 5;
    config.lease = Time::from_millis(60);
    // A wide margin, so the clocks may drift a lot (10%) and a lease that forgot the margin
    // outlives a promise by milliseconds, not microseconds.
    config.drift_margin = Time::from_millis(15);
    config.rejoin = true;
    config
}

/// The clock-rate error (parts per million, per node) a membership configuration's leases
/// tolerate. A lease granted for a heartbeat sent at `t` (on the holder's clock) must end
/// before every promise made on receiving it (`r + lease + margin` on the promiser's clock).
/// With one clock slow by `rho` and another fast by `rho`, that holds while
/// `(1 + rho) / (1 - rho) <= 1 + margin / lease`, i.e. `rho <= m / (2 + m)` with
/// `m = margin / lease`. The simulator stays at nine tenths of that.
pub fn tolerated_drift_ppm(config: &MembershipConfig) -> u32 {
    let m = config.drift_margin.as_nanos() as f64 / config.lease.as_nanos() as f64;
    (m / (2.0 + m) * 0.9 * 1e6) as u32
}

/// The main swarm's run shape: the replicas' membership decides views (scripted membership
/// off), faults last long enough for removals and rejoins to happen while clients run, crashed
/// nodes restart (each seed draws how soon: before or after their removal), clocks drift
/// within the bound the membership's drift margin covers, processes pause, and most seeds run
/// turns of several calls, as the server's event loop does.
pub fn managed_sim_config(base: &SimConfig) -> SimConfig {
    managed_sim_config_for(base, &swarm_membership_config(NodeId(0), NodeSet::single(NodeId(0))))
}

/// [`managed_sim_config`] for replicas whose membership runs with `membership`'s timing.
pub fn managed_sim_config_for(base: &SimConfig, membership: &MembershipConfig) -> SimConfig {
    let mut config = base.clone();
    config.scripted_membership = false;
    config.fault_phase_max = Time::from_millis(1_500);
    let mut draw = Rng::new(base.seed ^ 0x4D45_4D42);
    config.restart_after = Some(Time::from_millis(*draw.pick(&[40, 100, 300])));
    config.clock_drift_max_ppm = tolerated_drift_ppm(membership);
    config.pauses = true;
    config.turn_max = crate::simulator::swarm_turn_max(base.seed);
    config
}

/// Run one seed of a protocol paired with the membership service. `build(me, replicas, seed,
/// crashed)` makes the protocol core: `crashed` is the crashed incarnation when a node
/// restarts, so the builder decides what survived (nothing for protocols that keep their data
/// in memory: the node joins and copies it). A restarted node keeps its Raft records
/// (`membership.log`) and asks to join.
pub fn simulate_managed<P>(
    config: &SimConfig,
    membership_tweak: Option<&MembershipTweak>,
    build: &mut BuildProtocol<'_, P>,
) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
    simulate_managed_with(config, &swarm_membership_config, membership_tweak, build)
}

/// [`simulate_managed`] with the membership configured by `membership(me, replicas)`.
pub fn simulate_managed_with<P>(
    config: &SimConfig,
    membership: &dyn Fn(NodeId, NodeSet) -> MembershipConfig,
    membership_tweak: Option<&MembershipTweak>,
    build: &mut BuildProtocol<'_, P>,
) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
    let membership_config = |me: NodeId, replicas: NodeSet| {
        let mut config = membership(me, replicas);
        if let Some(tweak) = membership_tweak {
            tweak(&mut config);
        }
        config
    };
    let build = std::cell::RefCell::new(build);
    let mut corrupt_one_restart = Rng::new(config.seed ^ 0x4C4F_4753).chance(0.25);
    let mut first = |me: NodeId, replicas: NodeSet, seed: u64| {
        let membership = Membership::new(membership_config(me, replicas), Time::ZERO);
        let node = WithMembership::new((build.borrow_mut())(me, replicas, seed, None), membership);
        OnDisk::new(node, SimDisk::new()).expect("an empty disk opens")
    };
    let mut restart = |context: RestartContext, crashed: &OnDisk<P>| {
        let (disk, mut storage) = if context.replace {
            (SimDisk::new(), StorageFaults::default())
        } else {
            let disk = crashed.disk.clone();
            let storage = StorageFaults::crash(&disk, context.seed, corrupt_one_restart);
            // Until a restart finds a sector it can damage (a short log may hold only the newest
            // writes, which corruption spares).
            corrupt_one_restart &= storage.sectors_corrupted == 0;
            (disk, storage)
        };
        let replica =
            MembershipLog::open(disk.clone()).map_err(|error| error.to_string()).map(|(log, records)| {
                let mut config = membership_config(context.node, context.replicas);
                config.join = Some(context.seed | 1);
                let membership = Membership::restore(config, context.now, &records);
                let protocol = (build.borrow_mut())(
                    context.node,
                    context.replicas,
                    context.seed,
                    Some(crashed.node.protocol()),
                );
                OnDisk { node: WithMembership::new(protocol, membership), log, disk }
            });
        // Refused: a checksum caught the damage to `membership.log` (the node is replaced later).
        storage.corruption_detected += replica.is_err() as u64;
        Restarted { replica, storage }
    };
    simulate_with_restarts(config, &mut first, &mut restart)
}

/// A node with the membership service whose `membership.log` is on its simulated disk: the
/// Raft records of each turn are written, then synced before the turn's messages leave, and a
/// restart reads back what the disk kept.
pub struct OnDisk<P: Replica> {
    node: WithMembership<P>,
    log: MembershipLog<SimDisk>,
    disk: SimDisk,
}

impl<P: Replica> OnDisk<P> {
    /// A fresh node on an empty (or any) disk: its `membership.log` starts there.
    pub fn new(node: WithMembership<P>, disk: SimDisk) -> Result<OnDisk<P>, String> {
        let (log, _) = MembershipLog::open(disk.clone()).map_err(|error| error.to_string())?;
        Ok(OnDisk { node, log, disk })
    }

    /// A restarted node: the membership log it reopened on `disk`. For protocol crates that
    /// keep more on the node's disk than this module knows (the chain store's region).
    pub fn from_parts(node: WithMembership<P>, log: MembershipLog<SimDisk>, disk: SimDisk) -> OnDisk<P> {
        OnDisk { node, log, disk }
    }

    pub fn node(&self) -> &WithMembership<P> {
        &self.node
    }
    pub fn node_mut(&mut self) -> &mut WithMembership<P> {
        &mut self.node
    }
    pub fn disk(&self) -> &SimDisk {
        &self.disk
    }
}

impl<P: Replica> Replica for OnDisk<P> {
    type Message = <WithMembership<P> as Replica>::Message;

    fn id(&self) -> NodeId {
        self.node.id()
    }
    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Self::Message>,
    ) {
        self.node.on_client(now, request, command, out);
    }
    fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: Self::Message,
        out: &mut Outbox<Self::Message>,
    ) {
        self.node.on_message(now, from, message, out);
    }
    fn on_tick(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.node.on_tick(now, out);
    }
    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Self::Message>) {
        self.node.on_view(now, view, out);
    }
    fn end_turn(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.node.end_turn(now, out);
    }
    fn is_caught_up(&self) -> bool {
        self.node.is_caught_up()
    }
    fn is_control(message: &Self::Message) -> bool {
        WithMembership::<P>::is_control(message)
    }
    fn installed_view(&self) -> Option<View> {
        self.node.installed_view()
    }
    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.node.event_counts(report);
    }
    fn write_durable(&mut self) -> bool {
        let records = self.node.take_persist_records();
        self.log.append(&records).expect("the simulated disk never fails a write");
        !records.is_empty()
    }
    fn sync_durable(&mut self) {
        self.log.sync().expect("the simulated disk never fails a sync");
    }
}

/// How the main swarm's Hermes, CRAQ and ZAB keep their keys (`SimConfig::appendonly`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AppendOnly {
    /// In memory: a restarted node joins and copies every key from its peers.
    #[default]
    Off,
    /// The server's append-only file (`chorus_persistence`, `appendonly yes`, `appendfsync
    /// always`) on the node's simulated disk: a restarted node loads it and comes back as the
    /// member it was (ZAB rejoins with its history); damaged files are refused and the node
    /// copies from a peer.
    Always,
    /// Broken (`ack-before-sync`): a turn's messages and replies leave before its records are
    /// synced, which happens every [`ACK_BEFORE_SYNC_PERIOD`] (`appendfsync everysec` with
    /// replies and ACKs not waiting, at the swarm's time scale), so a crash can lose what a
    /// replica acknowledged while its files still say every record was synced first.
    AckBeforeSync,
}

/// How often [`AppendOnly::AckBeforeSync`] syncs: longer than a lease (60 ms), as a second is
/// longer than the server's.
pub const ACK_BEFORE_SYNC_PERIOD: Time = Time::from_millis(100);

/// Builds a protocol core for [`simulate_managed_appendonly`]: `(me, replicas, seed, joining)`,
/// `joining` when the node starts empty and copies from its peers.
pub type BuildPersisted<'a, P> = dyn FnMut(NodeId, NodeSet, u64, bool) -> P + 'a;

/// The append-only file's settings in the swarm: `appendfsync always`, no time-based save
/// rule (the simulator's clock is not the wall clock), and a rewrite once the incremental file
/// passes `rewrite_bytes_min`, small on some seeds so snapshots and rewrites run while clients do.
pub fn appendonly_options(rewrite_bytes_min: u64) -> chorus_persistence::PersistenceOptions {
    chorus_persistence::PersistenceOptions {
        appendonly: true,
        appendfsync: chorus_persistence::AppendFsync::Always,
        save: Vec::new(),
        rewrite_bytes_min,
        ..chorus_persistence::PersistenceOptions::default()
    }
}

/// [`simulate_managed`] with the protocol's keys in the server's append-only file on each
/// node's simulated disk, beside its `membership.log`. A crash loses, keeps or tears each
/// file's unsynced writes and on a quarter of the seeds one restart finds a corrupted sector;
/// the restarted node then does what `chorus node` does (crates/server/src/lib.rs,
/// `Managed::open`): with trusted files it loads them and comes back as the member it was (ZAB
/// rejoins with its history), with damaged ones it refuses them and joins to copy from a peer,
/// and a damaged `membership.log` keeps it down.
pub fn simulate_managed_appendonly<P>(
    config: &SimConfig,
    membership_tweak: Option<&MembershipTweak>,
    mode: AppendOnly,
    build: &mut BuildPersisted<'_, P>,
) -> SeedRun
where
    P: Persisted,
    P::Message: Debug,
{
    assert_ne!(mode, AppendOnly::Off, "use simulate_managed for nodes without an append-only file");
    let membership_config = |me: NodeId, replicas: NodeSet| {
        let mut config = swarm_membership_config(me, replicas);
        if let Some(tweak) = membership_tweak {
            tweak(&mut config);
        }
        config
    };
    let mut draw = Rng::new(config.seed ^ 0x414F_4621);
    let options = appendonly_options(*draw.pick(&[1 << 10, 16 << 10, 64 << 20]));
    let build = std::cell::RefCell::new(build);
    let mut corrupt_one_restart = draw.chance(0.25);
    let mut first = |me: NodeId, replicas: NodeSet, seed: u64| {
        let membership = Membership::new(membership_config(me, replicas), Time::ZERO);
        let node = WithMembership::new((build.borrow_mut())(me, replicas, seed, false), membership);
        let disk = SimDisk::new();
        let on_disk = OnDisk::new(node, disk.clone()).expect("an empty disk opens");
        let (aof, _) = chorus_persistence::Persistence::open_on(
            Box::new(disk),
            std::path::Path::new("appendonly"),
            options.clone(),
        )
        .expect("an empty disk opens");
        KeysOnDisk::new(on_disk, aof, mode, false, TouchedKeys::default())
    };
    let mut restart = |context: RestartContext, crashed: &KeysOnDisk<P>| {
        let (disk, mut storage) = if context.replace {
            (SimDisk::new(), StorageFaults::default())
        } else {
            let disk = crashed.on_disk().disk.clone();
            let storage = StorageFaults::crash(&disk, context.seed, corrupt_one_restart);
            corrupt_one_restart &= storage.sectors_corrupted == 0;
            (disk, storage)
        };
        let replica =
            restart_from_disk(&context, &disk, &options, mode, &membership_config, &build, &mut storage);
        Restarted { replica, storage }
    };
    simulate_with_restarts(&SimConfig { power_loss: true, ..config.clone() }, &mut first, &mut restart)
}

/// What `chorus node` does on a restart (crates/server/src/lib.rs, `LoopSetup::open` and
/// `Managed::open`): load the append-only file, decide whether to rejoin, restore the keys.
fn restart_from_disk<P: Persisted>(
    context: &RestartContext,
    disk: &SimDisk,
    options: &chorus_persistence::PersistenceOptions,
    mode: AppendOnly,
    membership_config: &dyn Fn(NodeId, NodeSet) -> MembershipConfig,
    build: &std::cell::RefCell<&mut BuildPersisted<'_, P>>,
    storage: &mut StorageFaults,
) -> Result<KeysOnDisk<P>, String> {
    let opened = MembershipLog::open(disk.clone());
    // Refused: a checksum caught the damage to `membership.log` (the node is replaced later).
    storage.corruption_detected += opened.is_err() as u64;
    let (log, records) = opened.map_err(|error| error.to_string())?;
    let (mut aof, restored) = chorus_persistence::Persistence::open_on(
        Box::new(disk.clone()),
        std::path::Path::new("appendonly"),
        options.clone(),
    )
    .map_err(|error| format!("{error:#}"))?;
    aof.stop_clock();
    // Refused: the node copies every key from a peer instead (repaired, never served).
    storage.corruption_detected += restored.refused as u64;
    let data_restored = restored.trusted && !P::REJOINS_WITH_DATA;
    let mut config = membership_config(context.node, context.replicas);
    let restarted = !records.is_empty() || !restored.fresh;
    // A replacement starts empty and joins, as `chorus node --join` on a new machine.
    if (restarted && !data_restored) || context.replace {
        config.join = Some(context.seed | 1);
    }
    let membership = Membership::restore(config, context.now, &records);
    let joining = membership.is_joining();
    let mut protocol = (build.borrow_mut())(context.node, context.replicas, context.seed, joining);
    let from_disk = restored.trusted && (!joining || P::REJOINS_WITH_DATA);
    if from_disk {
        // Above every update number the crashed incarnation used (it ran for less than the
        // node's clock shows, at fewer than 2^16 updates a microsecond), and, as the server's
        // wall-clock floor is, above every joiner's numbering (CRAQ's `epoch << 40`): a
        // restart replays its own old join into the epoch it had, and a floor below that
        // numbering gave the new run the numbers of the old one, which its peers dropped as
        // done (CRAQ append-only seeds 563, 1185, 1637, 1639 stalled).
        let seq_floor = (1 << 56) + ((context.now.as_micros() + 1) << 16);
        protocol
            .restore_records(restored.records, seq_floor)
            .map_err(|error| format!("a checksummed append-only record does not load: {error:#}"))?;
    }
    let on_disk = OnDisk { node: WithMembership::new(protocol, membership), log, disk: disk.clone() };
    Ok(KeysOnDisk::new(on_disk, aof, mode, from_disk, TouchedKeys::default()))
}

/// A managed node whose protocol keeps its keys in the server's append-only file
/// (`chorus_persistence::Persistence`) on the node's simulated disk: each turn logs the state
/// of the keys its messages and client updates touched, as the server's event loop does
/// (crates/server/src/engine.rs, `persist_keys`), and syncs it before the turn's messages and
/// replies leave.
pub type KeysOnDisk<P> = AppendOnlyNode<P, TouchedKeys>;

/// A managed node ([`OnDisk`]) with the server's append-only file on its simulated disk: it
/// passes every event to the node, counts the file's work (`appendonly.*`), and leaves what
/// a turn appends of the protocol, and when the file is synced, to `R` ([`TurnRecord`]).
pub struct AppendOnlyNode<P: Replica, R> {
    file: AppendOnlyFile<P>,
    record: R,
}

/// The node and its append-only file, as a [`TurnRecord`] writes and syncs them.
pub struct AppendOnlyFile<P: Replica> {
    pub inner: OnDisk<P>,
    pub aof: chorus_persistence::Persistence,
    pub mode: AppendOnly,
    /// This incarnation started from its files (counted as `appendonly.restarts_from_disk`).
    from_disk: bool,
    /// The node's clock at its latest event, and at its latest sync ([`AppendOnly::AckBeforeSync`]).
    pub now: Time,
    pub synced_at: Time,
}

/// What a protocol keeps in the append-only file, and when it is synced.
pub trait TurnRecord<P: Replica> {
    /// Before the node handles `command`.
    fn before_client(&mut self, _request: ClientRequestId, _command: &Command) {}
    /// Before the node handles `message`.
    fn before_message(&mut self, _message: &<WithMembership<P> as Replica>::Message) {}
    /// After any event: `out` from `sent` (messages) and `answered` (replies) on is what it did.
    fn after_event(
        &mut self,
        _out: &Outbox<<WithMembership<P> as Replica>::Message>,
        _sent: usize,
        _answered: usize,
    ) {
    }
    /// Append the turn's records (the membership's are written already); whether the turn
    /// wrote anything that must be synced before its messages leave.
    fn write_durable(&mut self, file: &mut AppendOnlyFile<P>) -> bool;
    /// Sync the file (the membership's log is synced already).
    fn sync_durable(&mut self, file: &mut AppendOnlyFile<P>);
}

impl<P: Replica, R: TurnRecord<P>> AppendOnlyNode<P, R> {
    pub fn new(
        inner: OnDisk<P>,
        mut aof: chorus_persistence::Persistence,
        mode: AppendOnly,
        from_disk: bool,
        record: R,
    ) -> AppendOnlyNode<P, R> {
        aof.stop_clock();
        let (now, synced_at) = (Time::ZERO, Time::ZERO);
        AppendOnlyNode { file: AppendOnlyFile { inner, aof, mode, from_disk, now, synced_at }, record }
    }

    /// The same node, its file synced as `mode` says.
    pub fn with_mode(mut self, mode: AppendOnly) -> AppendOnlyNode<P, R> {
        self.file.mode = mode;
        self
    }

    pub fn on_disk(&self) -> &OnDisk<P> {
        &self.file.inner
    }
}

impl<P: Replica, R: TurnRecord<P>> Replica for AppendOnlyNode<P, R> {
    type Message = <WithMembership<P> as Replica>::Message;

    fn id(&self) -> NodeId {
        self.file.inner.id()
    }
    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Self::Message>,
    ) {
        self.file.now = now;
        let (sent, answered) = (out.messages.len(), out.replies.len());
        self.record.before_client(request, &command);
        self.file.inner.on_client(now, request, command, out);
        self.record.after_event(out, sent, answered);
    }
    fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: Self::Message,
        out: &mut Outbox<Self::Message>,
    ) {
        self.file.now = now;
        let (sent, answered) = (out.messages.len(), out.replies.len());
        self.record.before_message(&message);
        self.file.inner.on_message(now, from, message, out);
        self.record.after_event(out, sent, answered);
    }
    fn on_tick(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.file.now = now;
        let (sent, answered) = (out.messages.len(), out.replies.len());
        self.file.inner.on_tick(now, out);
        self.record.after_event(out, sent, answered);
    }
    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Self::Message>) {
        let (sent, answered) = (out.messages.len(), out.replies.len());
        self.file.inner.on_view(now, view, out);
        self.record.after_event(out, sent, answered);
    }
    fn end_turn(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        let (sent, answered) = (out.messages.len(), out.replies.len());
        self.file.inner.end_turn(now, out);
        self.record.after_event(out, sent, answered);
    }
    fn is_caught_up(&self) -> bool {
        self.file.inner.is_caught_up()
    }
    fn is_control(message: &Self::Message) -> bool {
        OnDisk::<P>::is_control(message)
    }
    fn installed_view(&self) -> Option<View> {
        self.file.inner.installed_view()
    }
    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.file.inner.event_counts(report);
        let info = self.file.aof.info();
        report("appendonly.restarts_from_disk", self.file.from_disk as u64);
        report("appendonly.records_restored", info.restored_records);
        report("appendonly.rewrites", info.snapshots);
        report("appendonly.syncs", info.syncs);
    }
    /// The membership's records, then the protocol's.
    fn write_durable(&mut self) -> bool {
        let membership = self.file.inner.write_durable();
        let protocol = self.record.write_durable(&mut self.file);
        membership || protocol
    }
    fn sync_durable(&mut self) {
        self.file.inner.sync_durable();
        self.record.sync_durable(&mut self.file);
    }
}

/// The keys a turn touched, for [`KeysOnDisk`]: those of its client updates (logged with
/// their answers) and of the messages it handled and sent.
#[derive(Default)]
pub struct TouchedKeys {
    touched: Vec<Key>,
    /// Updates admitted and not yet answered: their key is logged with the answer.
    updates: rustc_hash::FxHashMap<ClientRequestId, Key>,
}

impl<P: Persisted> TurnRecord<P> for TouchedKeys {
    fn before_client(&mut self, request: ClientRequestId, command: &Command) {
        if command.is_update() {
            self.touched.push(command.key().clone());
            self.updates.insert(request, command.key().clone());
        }
    }
    fn before_message(&mut self, message: &<WithMembership<P> as Replica>::Message) {
        if let Wire::Protocol(message) = message {
            P::message_keys(message, &mut self.touched);
        }
    }
    fn after_event(
        &mut self,
        out: &Outbox<<WithMembership<P> as Replica>::Message>,
        sent: usize,
        answered: usize,
    ) {
        for (_, message) in &out.messages[sent..] {
            if let Wire::Protocol(message) = message {
                P::message_keys(message, &mut self.touched);
            }
        }
        for (request, _) in &out.replies[answered..] {
            if let Some(key) = self.updates.remove(request) {
                self.touched.push(key);
            }
        }
    }
    /// The turn's keys (ZAB: its history), appended; with [`AppendOnly::AckBeforeSync`]
    /// synced only once a period, after messages that depended on them left.
    fn write_durable(&mut self, file: &mut AppendOnlyFile<P>) -> bool {
        if file.mode == AppendOnly::AckBeforeSync && file.now >= file.synced_at + ACK_BEFORE_SYNC_PERIOD {
            file.aof.sync_now().expect("the simulated disk never fails a sync");
            file.synced_at = file.now;
        }
        let protocol = file.inner.node.protocol_mut();
        let log_records = protocol.take_log_records();
        let keys = !self.touched.is_empty() || !log_records.is_empty();
        file.aof.log_records(log_records);
        file.aof
            .end_turn(file.inner.node.protocol(), &mut self.touched, true)
            .expect("the simulated disk never fails a write");
        keys
    }
    fn sync_durable(&mut self, file: &mut AppendOnlyFile<P>) {
        if file.mode == AppendOnly::Always {
            file.aof.sync_now().expect("the simulated disk never fails a sync");
        }
    }
}
