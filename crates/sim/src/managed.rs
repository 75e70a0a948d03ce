//! Protocols under the real membership service (`chorus-membership`), as the main swarms run
//! them: views agreed through Raft, heartbeats, leases that gate local reads, nodes removed
//! while alive (a partition or a pause longer than the lease) rejoining as new members, and
//! crashed nodes restarting from what they kept (the membership's Raft records; the protocol's
//! keys are in memory, so the node joins and copies them from its peers).
//!
//! The membership's timing is scaled to the simulator's partitions (5 to 300 ms): 10 ms
//! heartbeats, suspicion after 5 missed, a 60 ms lease with a 15 ms drift margin. Each node's
//! clock may run fast or slow within the bound that margin covers (10%).

use std::fmt::Debug;
use std::sync::Arc;

use chorus_core::{NodeId, NodeSet, Replica, Time};
use chorus_membership::{Membership, MembershipConfig, WithMembership};

use crate::rng::Rng;
use crate::simulator::{simulate_with_restarts, RestartContext, Restarted, SeedRun, SimConfig};

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
    let mut first = |me: NodeId, replicas: NodeSet, seed: u64| {
        let membership = Membership::new(membership_config(me, replicas), Time::ZERO);
        WithMembership::new((build.borrow_mut())(me, replicas, seed, None), membership)
    };
    let mut restart = |context: RestartContext, crashed: &WithMembership<P>| {
        let records = crashed.membership().durable_records();
        let mut config = membership_config(context.node, context.replicas);
        config.join = Some(context.seed | 1);
        let membership = Membership::restore(config, context.now, &records);
        let protocol =
            (build.borrow_mut())(context.node, context.replicas, context.seed, Some(crashed.protocol()));
        Restarted::up(WithMembership::new(protocol, membership))
    };
    simulate_with_restarts(config, &mut first, &mut restart)
}
