//! Swarm fault plans: every seed draws its own fault mix (Groce et al., "Swarm testing"), so
//! some seeds hammer one fault and others combine them all.

use std::collections::BTreeMap;

use chorus_core::Time;

use crate::rng::Rng;

/// What a plan may contain, from the run's configuration.
#[derive(Clone, Copy, Debug)]
pub struct PlanLimits {
    pub replicas: usize,
    /// Faults happen within a phase of at most this long.
    pub phase_max: Time,
    /// Crashed nodes come back (so more crashes than a minority may happen over a run, at
    /// most a minority down at once).
    pub restarts: bool,
    /// The clock drift the protocols are configured to tolerate, in parts per million of
    /// each node's rate (`SimConfig::clock_drift_max_ppm`). 0: clocks run true.
    pub clock_drift_max_ppm: u32,
    /// Node pauses (a stopped process whose clock runs on) may be drawn.
    pub pauses: bool,
    /// A power loss of every node at once may be drawn (replicas that keep their data on disk).
    pub power_loss: bool,
}

/// The fault rates and events one seed runs with.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FaultPlan {
    /// How long faults are injected and clients issue operations. Drawn per seed and kept
    /// short, so faults land while operations are in flight rather than on an idle cluster.
    #[serde(skip)]
    pub phase: Time,
    pub loss_rate: f64,
    pub duplicate_rate: f64,
    pub delay_min_us: u64,
    pub delay_spread_us: u64,
    /// Chance that a message is held back far longer than the spread (reordering).
    pub reorder_rate: f64,
    pub partitions: Vec<Partition>,
    pub crashes: Vec<Crash>,
    /// How long after a crash the membership service installs the next view: the lease.
    pub lease_us: u64,
    /// How far apart the new view reaches different replicas (the m-update's transient, §3.4).
    pub view_spread_us: u64,
    /// Each node's clock rate error, in parts per million (positive: runs fast), within the
    /// configured bound.
    pub clock_ppm: Vec<i32>,
    pub pauses: Vec<Pause>,
    /// When every node loses power at once, if it does.
    #[serde(skip)]
    pub power_loss: Option<Time>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Partition {
    #[serde(skip)]
    pub start: Time,
    #[serde(skip)]
    pub duration: Time,
    /// Directed links `(from, to)` that drop every message while the partition lasts.
    pub blocked: Vec<(u8, u8)>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Crash {
    #[serde(skip)]
    pub at: Time,
    pub node: u8,
    /// Crash in the middle of a broadcast: from `at`, the node dies while performing its next
    /// outbox that holds protocol messages, after only a random subset of them left.
    pub mid_broadcast: bool,
}

/// A stopped process (a long GC pause, SIGSTOP, a VM migration): it handles nothing while
/// paused, its clock runs on, and what was sent to it waits.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Pause {
    #[serde(skip)]
    pub at: Time,
    #[serde(skip)]
    pub duration: Time,
    pub node: u8,
}

impl FaultPlan {
    /// No faults at all: the baseline run.
    pub fn none(phase: Time, replicas: usize) -> FaultPlan {
        FaultPlan {
            phase,
            loss_rate: 0.0,
            duplicate_rate: 0.0,
            delay_min_us: 50,
            delay_spread_us: 200,
            reorder_rate: 0.0,
            partitions: Vec::new(),
            crashes: Vec::new(),
            lease_us: 10_000,
            view_spread_us: 1_000,
            clock_ppm: vec![0; replicas],
            pauses: Vec::new(),
            power_loss: None,
        }
    }

    /// Draw a plan whose faults happen within a phase of at most `limits.phase_max`. At most a
    /// minority of replicas is down at once, as a majority-based membership service needs.
    pub fn draw(rng: &mut Rng, limits: PlanLimits) -> FaultPlan {
        let replicas = limits.replicas;
        let phase_max = limits.phase_max;
        let fault_phase = Time::from_micros(rng.range(phase_max.as_micros() / 8, phase_max.as_micros()));
        let on = |rng: &mut Rng| rng.chance(0.5);
        let loss_rate = if on(rng) { rng.unit() * 0.15 } else { 0.0 };
        let duplicate_rate = if on(rng) { rng.unit() * 0.1 } else { 0.0 };
        let reorder_rate = if on(rng) { rng.unit() * 0.1 } else { 0.0 };
        let delay_min_us = rng.range(10, 300);
        let delay_spread_us = *rng.pick(&[50, 500, 2_000, 10_000]);
        let phase_us = fault_phase.as_micros();
        // About one partition per 200 ms of fault phase, at least one.
        let partition_count = if on(rng) { rng.range(1, 1 + phase_us / 200_000) } else { 0 };
        let partitions = (0..partition_count).map(|_| draw_partition(rng, replicas, phase_us)).collect();
        let crashes = draw_crashes(rng, replicas, phase_us, limits.restarts);
        let lease_us = rng.range(1_000, phase_us / 4);
        let view_spread_us = rng.range(0, phase_us / 8);
        let clock_ppm = draw_clocks(rng, replicas, limits.clock_drift_max_ppm);
        let pause_count = if limits.pauses && on(rng) { rng.range(1, 3) } else { 0 };
        let pauses = (0..pause_count)
            .map(|_| Pause {
                at: Time::from_micros(rng.below(phase_us)),
                // From a blip to several leases: long ones get the node removed while stopped.
                duration: Time::from_micros(rng.range(1_000, 400_000)),
                node: rng.below(replicas as u64) as u8,
            })
            .collect();
        let power_loss =
            (limits.power_loss && rng.chance(0.25)).then(|| Time::from_micros(rng.below(phase_us)));
        FaultPlan {
            phase: fault_phase,
            loss_rate,
            duplicate_rate,
            delay_min_us,
            delay_spread_us,
            reorder_rate,
            partitions,
            crashes,
            lease_us,
            view_spread_us,
            clock_ppm,
            pauses,
            power_loss,
        }
    }

    /// One message's network delay.
    pub fn delay(&self, rng: &mut Rng) -> Time {
        let mut us = self.delay_min_us + rng.below(self.delay_spread_us + 1);
        if self.reorder_rate > 0.0 && rng.chance(self.reorder_rate) {
            us += rng.below(10 * self.delay_spread_us + 1_000);
        }
        Time::from_micros(us)
    }
}

/// Half the seeds crash nodes. Without restarts, a minority of distinct nodes crash for good;
/// with them, any node may crash, several times, and the simulator skips a crash that would
/// leave fewer than a majority up.
fn draw_crashes(rng: &mut Rng, replicas: usize, phase_us: u64, restarts: bool) -> Vec<Crash> {
    let crash_max = (replicas - 1) / 2;
    if crash_max == 0 || !rng.chance(0.5) {
        return Vec::new();
    }
    let crash = |rng: &mut Rng, node: u8| Crash {
        at: Time::from_micros(rng.below(phase_us)),
        node,
        mid_broadcast: rng.chance(0.5),
    };
    if restarts {
        let count = rng.range(1, replicas as u64);
        return (0..count)
            .map(|_| {
                let node = rng.below(replicas as u64) as u8;
                crash(rng, node)
            })
            .collect();
    }
    let count = rng.range(1, crash_max as u64) as usize;
    let mut nodes: Vec<u8> = (0..replicas as u8).collect();
    (0..count)
        .map(|_| {
            let node = nodes.remove(rng.below(nodes.len() as u64) as usize);
            crash(rng, node)
        })
        .collect()
}

/// Half the seeds (when the protocols tolerate drift at all) run each node's clock at its own
/// rate: on half of those anywhere within the bound, on the other half in the worst case for
/// leases, one node slow at the bound and every other fast at it (the slow node's lease then
/// lasts longest while the others' promises to it run out soonest).
fn draw_clocks(rng: &mut Rng, replicas: usize, drift_max_ppm: u32) -> Vec<i32> {
    if drift_max_ppm == 0 || !rng.chance(0.5) {
        return vec![0; replicas];
    }
    let max = drift_max_ppm as i64;
    if rng.chance(0.5) {
        let slow = rng.below(replicas as u64) as usize;
        return (0..replicas).map(|node| if node == slow { -max as i32 } else { max as i32 }).collect();
    }
    (0..replicas).map(|_| (rng.range(0, 2 * max as u64) as i64 - max) as i32).collect()
}

fn draw_partition(rng: &mut Rng, replicas: usize, phase_us: u64) -> Partition {
    let start = Time::from_micros(rng.below(phase_us));
    let duration = Time::from_micros(rng.range(5_000, 300_000));
    let mut blocked = Vec::new();
    if rng.chance(0.5) {
        // Symmetric: split the nodes in two non-empty sides.
        let side_bits = rng.range(1, (1u64 << replicas) - 2);
        for a in 0..replicas as u8 {
            for b in 0..replicas as u8 {
                let (side_a, side_b) = (side_bits >> a & 1, side_bits >> b & 1);
                if side_a != side_b {
                    blocked.push((a, b));
                }
            }
        }
    } else {
        // One-way: a few directed links only.
        for _ in 0..rng.range(1, replicas as u64) {
            let from = rng.below(replicas as u64) as u8;
            let to = (from + 1 + rng.below(replicas as u64 - 1) as u8) % replicas as u8;
            blocked.push((from, to));
        }
    }
    Partition { start, duration, blocked }
}

/// What a run actually injected, and what its runs went through: a sweep asserts minimums on
/// these so that a change that makes the swarm gentle fails a test instead of passing quietly.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FaultCounts {
    pub messages_lost: u64,
    pub messages_duplicated: u64,
    pub messages_reordered: u64,
    pub messages_blocked_by_partition: u64,
    pub partitions: u64,
    pub crashes: u64,
    pub crashes_mid_broadcast: u64,
    /// Crashes the plan asked for but the simulator skipped: they would have left fewer than
    /// a majority up.
    pub crashes_skipped: u64,
    /// Crashes between a turn's writes and their sync: the writes may be torn, nothing of the
    /// turn left.
    pub crashes_before_sync: u64,
    /// Turns that sent messages before their sync ([`chorus_core::Replica::leaves_before_sync`]),
    /// and crashes before a sync after such messages had left.
    pub turns_sending_before_sync: u64,
    pub crashes_before_sync_after_sends: u64,
    /// Replies completed before their call's sync ([`chorus_core::Replica::replies_before_sync`]).
    pub replies_before_sync: u64,
    /// With syncs on a thread (`SimConfig::sync_latency`): syncs that returned, calls whose
    /// messages or replies waited for one, and crashes while one ran.
    pub syncs_on_thread: u64,
    pub calls_waiting_for_a_sync: u64,
    pub crashes_with_sync_running: u64,
    /// Power losses that struck right after a node answered an update while its sync ran.
    pub power_losses_after_replies_before_a_sync: u64,
    /// Event-loop turns (`SimConfig::turn_max`) that took more than one call.
    pub turns_of_several_calls: u64,
    /// Every node crashed at once.
    pub power_losses: u64,
    /// Crashed nodes brought back (`SimConfig::restart_after`).
    pub restarts: u64,
    /// Nodes whose clock ran fast or slow, and process pauses.
    pub clocks_drifting: u64,
    pub pauses: u64,
    /// New views (epochs) any node installed, nodes they removed, removed nodes that were
    /// still running (a partition or a pause, not a crash), and nodes added back.
    pub views_installed: u64,
    pub nodes_removed: u64,
    pub live_nodes_removed: u64,
    pub nodes_readded: u64,
    /// Storage faults at crashes: files that lost unsynced writes, writes torn partway, and
    /// sectors corrupted on disk.
    pub storage_writes_lost: u64,
    pub storage_writes_torn: u64,
    pub storage_sectors_corrupted: u64,
    /// Restarts refused because a checksum found corruption (the node stays down, or is
    /// repaired from its peers).
    pub storage_corruption_detected: u64,
    /// From the history: operations concurrent with another client's on the same key, and
    /// updates whose outcome the client never learnt (crash, removal mid-update).
    pub ops_overlapping: u64,
    pub updates_interrupted: u64,
    /// The replicas' own counters (`Replica::counters`), summed over every incarnation.
    pub events: BTreeMap<String, u64>,
}

impl FaultCounts {
    /// Injected faults, for the one-line summary.
    pub fn total(&self) -> u64 {
        self.messages_lost
            + self.messages_duplicated
            + self.messages_reordered
            + self.messages_blocked_by_partition
            + self.partitions
            + self.crashes
            + self.power_losses
            + self.pauses
            + self.storage_writes_lost
            + self.storage_writes_torn
            + self.storage_sectors_corrupted
    }

    /// One of the replicas' counters (0 if no replica reported it).
    pub fn event(&self, name: &str) -> u64 {
        self.events.get(name).copied().unwrap_or(0)
    }

    /// A counter by name: a field of this struct, or one of the replicas' `protocol.event`
    /// counters.
    pub fn get(&self, name: &str) -> u64 {
        match name {
            "messages_lost" => self.messages_lost,
            "messages_duplicated" => self.messages_duplicated,
            "messages_reordered" => self.messages_reordered,
            "messages_blocked_by_partition" => self.messages_blocked_by_partition,
            "partitions" => self.partitions,
            "crashes" => self.crashes,
            "crashes_mid_broadcast" => self.crashes_mid_broadcast,
            "crashes_skipped" => self.crashes_skipped,
            "crashes_before_sync" => self.crashes_before_sync,
            "turns_sending_before_sync" => self.turns_sending_before_sync,
            "crashes_before_sync_after_sends" => self.crashes_before_sync_after_sends,
            "replies_before_sync" => self.replies_before_sync,
            "syncs_on_thread" => self.syncs_on_thread,
            "calls_waiting_for_a_sync" => self.calls_waiting_for_a_sync,
            "crashes_with_sync_running" => self.crashes_with_sync_running,
            "power_losses_after_replies_before_a_sync" => self.power_losses_after_replies_before_a_sync,
            "turns_of_several_calls" => self.turns_of_several_calls,
            "power_losses" => self.power_losses,
            "restarts" => self.restarts,
            "clocks_drifting" => self.clocks_drifting,
            "pauses" => self.pauses,
            "views_installed" => self.views_installed,
            "nodes_removed" => self.nodes_removed,
            "live_nodes_removed" => self.live_nodes_removed,
            "nodes_readded" => self.nodes_readded,
            "storage_writes_lost" => self.storage_writes_lost,
            "storage_writes_torn" => self.storage_writes_torn,
            "storage_sectors_corrupted" => self.storage_sectors_corrupted,
            "storage_corruption_detected" => self.storage_corruption_detected,
            "ops_overlapping" => self.ops_overlapping,
            "updates_interrupted" => self.updates_interrupted,
            event => self.event(event),
        }
    }

    pub fn add(&mut self, other: &FaultCounts) {
        self.messages_lost += other.messages_lost;
        self.messages_duplicated += other.messages_duplicated;
        self.messages_reordered += other.messages_reordered;
        self.messages_blocked_by_partition += other.messages_blocked_by_partition;
        self.partitions += other.partitions;
        self.crashes += other.crashes;
        self.crashes_mid_broadcast += other.crashes_mid_broadcast;
        self.crashes_skipped += other.crashes_skipped;
        self.crashes_before_sync += other.crashes_before_sync;
        self.turns_sending_before_sync += other.turns_sending_before_sync;
        self.crashes_before_sync_after_sends += other.crashes_before_sync_after_sends;
        self.replies_before_sync += other.replies_before_sync;
        self.syncs_on_thread += other.syncs_on_thread;
        self.calls_waiting_for_a_sync += other.calls_waiting_for_a_sync;
        self.crashes_with_sync_running += other.crashes_with_sync_running;
        self.power_losses_after_replies_before_a_sync += other.power_losses_after_replies_before_a_sync;
        self.turns_of_several_calls += other.turns_of_several_calls;
        self.power_losses += other.power_losses;
        self.restarts += other.restarts;
        self.clocks_drifting += other.clocks_drifting;
        self.pauses += other.pauses;
        self.views_installed += other.views_installed;
        self.nodes_removed += other.nodes_removed;
        self.live_nodes_removed += other.live_nodes_removed;
        self.nodes_readded += other.nodes_readded;
        self.storage_writes_lost += other.storage_writes_lost;
        self.storage_writes_torn += other.storage_writes_torn;
        self.storage_sectors_corrupted += other.storage_sectors_corrupted;
        self.storage_corruption_detected += other.storage_corruption_detected;
        self.ops_overlapping += other.ops_overlapping;
        self.updates_interrupted += other.updates_interrupted;
        for (name, count) in &other.events {
            *self.events.entry(name.clone()).or_default() += count;
        }
    }
}
