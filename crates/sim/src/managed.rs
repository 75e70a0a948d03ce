//! Protocols under the real membership service (`chorus-membership`), as the main swarms run
//! them: views agreed through Raft, heartbeats, leases that gate local reads, nodes removed
//! while alive (a partition or a pause longer than the lease) rejoining as new members, and
//! crashed nodes restarting from what they kept (the membership's Raft records; the protocol's
//! keys are in memory, so the node joins and copies them from its peers).
//!
//! Each node's `membership.log` lives on its own simulated disk (`chorus_storage::SimDisk`):
//! a crash between a turn's write and its sync tears it, and on a quarter of the seeds one
//! restart finds a corrupted sector, which the log's checksums must catch (the node then
//! refuses to start and stays down).
//!
//! The membership's timing is scaled to the simulator's partitions (5 to 300 ms): 10 ms
//! heartbeats, suspicion after 5 missed, a 60 ms lease with a 15 ms drift margin. Each node's
//! clock may run fast or slow within the bound that margin covers (10%).

use std::fmt::Debug;
use std::sync::Arc;

use chorus_core::{ClientRequestId, Command, NodeId, NodeSet, Outbox, Replica, Time, View};
use chorus_membership::{Membership, MembershipConfig, MembershipLog, WithMembership};
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
/// within the bound the membership's drift margin covers, and processes pause.
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
        let disk = crashed.disk.clone();
        let mut storage = StorageFaults::crash(&disk, context.seed, std::mem::take(&mut corrupt_one_restart));
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
        // Refused: a checksum caught the damage to `membership.log` (the node stays down).
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
    fn new(node: WithMembership<P>, disk: SimDisk) -> Result<OnDisk<P>, String> {
        let (log, _) = MembershipLog::open(disk.clone()).map_err(|error| error.to_string())?;
        Ok(OnDisk { node, log, disk })
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
