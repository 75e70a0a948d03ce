//! What the join swarms share: membership timing scaled to the simulator's partitions, and a
//! restarted node's membership (its Raft records survive, as `membership.log` does).

use chorus_core::{NodeId, NodeSet, Replica, Time};
use chorus_membership::{Membership, MembershipConfig, WithMembership};

/// The membership of a join swarm's node. `fast`: timing scaled to the simulator's partitions
/// (5 to 300 ms), so partitions remove live nodes, which then rejoin on their own.
pub fn swarm_membership_config(me: NodeId, replicas: NodeSet, fast: bool) -> MembershipConfig {
    let mut config = MembershipConfig::new(me, replicas);
    if fast {
        config.heartbeat_period = Time::from_millis(10);
        config.missed_heartbeats_max = 5;
        config.lease = Time::from_millis(60);
        config.drift_margin = Time::from_millis(5);
    }
    // Nodes removed while alive (partitions) come back through a join too.
    config.rejoin = true;
    config
}

/// The membership of `crashed`'s restart: its Raft records, and a join request under a new
/// incarnation.
pub fn restarted_membership<P: Replica>(
    crashed: &WithMembership<P>,
    mut config: MembershipConfig,
    seed: u64,
    now: Time,
) -> Membership {
    let records = crashed.membership().durable_records();
    config.join = Some(seed | 1);
    Membership::restore(config, now, &records)
}
