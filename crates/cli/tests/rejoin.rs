//! A node killed with SIGKILL and restarted with `chorus node --join` (Hermes §3.4
//! Recovery): it rejoins (Hermes: as a shadow; CRAQ: linked back into the chain), copies the
//! data in chunks from a live replica while clients keep writing, then serves; the recorded
//! history stays linearizable, and the cluster survives losing another node afterwards. Real
//! processes on loopback; waits have generous deadlines that only guard against hangs,
//! nothing asserts a duration.

use std::thread;
use std::time::Duration;

use chorus_sim::checker::{check_history, CheckerConfig};
use support::loopback::{background_clients, Bulk, Cluster};

mod support;

const BULK: Bulk = Bulk { keys: 300 };

#[test]
fn a_killed_node_rejoins_with_join_catches_up_serves_and_the_cluster_survives_another_failure() {
    kill_rejoin_and_survive("hermes", 2);
}

/// CRAQ's middle replica: it copies from its predecessor n0, and after n0 dies it is the head.
#[test]
fn a_killed_craq_node_rejoins_the_chain_catches_up_serves_and_the_cluster_survives_another_failure() {
    kill_rejoin_and_survive("craq", 1);
}

fn kill_rejoin_and_survive(protocol: &str, victim: usize) {
    assert!(victim != 0, "n0 dies second");
    let survivor = 3 - victim; // The node other than n0 and the victim.
    let mut cluster = Cluster::start(3, &["--protocol", protocol]);
    BULK.write_initial(&cluster, 0);
    let clients = background_clients(&cluster, 400, Duration::from_secs(5), Duration::from_millis(8));

    thread::sleep(Duration::from_millis(500));
    cluster.sigkill(victim);
    cluster.wait_until("survivors remove the victim", 0, |c| {
        c.info_number(0, "chorus_view_epoch").is_some_and(|epoch| epoch >= 2)
    });
    // Writes made while the victim is down, which it must copy.
    BULK.overwrite_while_down(&cluster, survivor);
    let donor = cluster.nodes[0].peer.to_string();
    cluster.restart(victim, &["--join", &donor]);
    cluster.wait_ready(victim, 2);
    let recoveries = cluster.info_number(victim, &format!("{protocol}_recoveries_completed"));
    assert_eq!(recoveries, Some(1), "{}", cluster.log(victim));
    let copied = cluster.info_number(victim, &format!("{protocol}_keys_copied")).unwrap();
    assert!(copied >= BULK.keys as u64, "the victim copied {copied} keys");
    BULK.assert_latest_at(&cluster, victim);

    // The rejoined node counts as a full member: losing n0 leaves it and the survivor serving.
    cluster.sigkill(0);
    let history = clients.join().unwrap();
    let mut con = cluster.client(victim);
    let _: () = redis::cmd("SET").arg("after").arg("both-failures").query(&mut con).unwrap();
    let mut con = cluster.client(survivor);
    let value: Option<String> = redis::cmd("GET").arg("after").query(&mut con).unwrap();
    assert_eq!(value.as_deref(), Some("both-failures"));
    let live = cluster.info_number(survivor, "chorus_view_epoch").unwrap();
    assert!(live >= 4, "views: remove the victim, add it back, remove n0 (epoch {live})");

    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!(
        "{protocol}: {} operations, {completed} completed, inconclusive keys: {:?}",
        history.operations.len(),
        report.inconclusive_keys
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(completed > 500, "too few operations completed: {completed}");
}

/// ZAB (ZooKeeper's SNAP, docs/protocols/zab.md "Joining"): the leader n0 is killed, n1 leads
/// and commits more; n0 restarts empty with `--join` and, as the lowest id, leads the next
/// view. The followers forgot the early entries (they compact what every live replica
/// applied), so n0 takes a snapshot from the best follower plus the history after it before
/// it counts in a quorum or serves. Then n1 dies and {n0, n2} carry on.
#[test]
fn a_killed_zab_leader_rejoins_through_a_snapshot_serves_and_the_cluster_survives_another_failure() {
    let mut cluster = Cluster::start(3, &["--protocol", "zab"]);
    BULK.write_initial(&cluster, 0);
    let clients = background_clients(&cluster, 300, Duration::from_secs(5), Duration::from_millis(8));

    thread::sleep(Duration::from_millis(500));
    cluster.sigkill(0);
    cluster.wait_until("survivors remove n0", 1, |c| {
        c.info_number(1, "chorus_view_epoch").is_some_and(|epoch| epoch >= 2)
    });
    BULK.overwrite_while_down(&cluster, 1);
    let donor = cluster.nodes[1].peer.to_string();
    cluster.restart(0, &["--join", &donor]);
    cluster.wait_ready(0, 2);
    assert_eq!(cluster.info_number(0, "zab_complete"), Some(1), "{}", cluster.log(0));
    let installed = cluster.info_number(0, "zab_snapshots_installed").unwrap();
    assert!(installed >= 1, "n0 installed no snapshot:\n{}", cluster.log(0));
    BULK.assert_latest_at(&cluster, 0);

    // The rejoined node counts in quorums: losing n1 leaves {n0, n2}, a majority of 3.
    cluster.sigkill(1);
    let history = clients.join().unwrap();
    let mut con = cluster.client(2);
    let _: () = redis::cmd("SET").arg("after").arg("both-failures").query(&mut con).unwrap();
    let mut con = cluster.client(0);
    let value: Option<String> = redis::cmd("GET").arg("after").query(&mut con).unwrap();
    assert_eq!(value.as_deref(), Some("both-failures"));

    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!("zab: {} operations, {completed} completed", history.operations.len());
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(completed > 400, "too few operations completed: {completed}");
}
