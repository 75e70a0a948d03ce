//! Swarm fault plans: every seed draws its own fault mix (Groce et al., "Swarm testing"), so
//! some seeds hammer one fault and others combine them all.

use chorus_core::Time;

use crate::rng::Rng;

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
    /// outbox that holds messages, after only a random subset of them left.
    pub mid_broadcast: bool,
}

impl FaultPlan {
    /// No faults at all: the baseline run.
    pub fn none(phase: Time) -> FaultPlan {
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
        }
    }

    /// Draw a plan for `replicas` nodes whose faults happen within a phase of at most
    /// `phase_max`. At most a minority of replicas crash, as a majority-based membership
    /// service needs.
    pub fn draw(rng: &mut Rng, replicas: usize, phase_max: Time) -> FaultPlan {
        let fault_phase = Time::from_micros(rng.range(phase_max.as_micros() / 8, phase_max.as_micros()));
        let on = |rng: &mut Rng| rng.chance(0.5);
        let loss_rate = if on(rng) { rng.unit() * 0.15 } else { 0.0 };
        let duplicate_rate = if on(rng) { rng.unit() * 0.1 } else { 0.0 };
        let reorder_rate = if on(rng) { rng.unit() * 0.1 } else { 0.0 };
        let delay_min_us = rng.range(10, 300);
        let delay_spread_us = *rng.pick(&[50, 500, 2_000, 10_000]);
        let phase_us = fault_phase.as_micros();
        let partition_count = if on(rng) { rng.range(1, 4) } else { 0 };
        let partitions = (0..partition_count).map(|_| draw_partition(rng, replicas, phase_us)).collect();
        let crash_max = (replicas - 1) / 2;
        let crash_count = if on(rng) { rng.range(1, crash_max as u64) as usize } else { 0 };
        let mut nodes: Vec<u8> = (0..replicas as u8).collect();
        let crashes = (0..crash_count)
            .map(|_| {
                let node = nodes.remove(rng.below(nodes.len() as u64) as usize);
                Crash { at: Time::from_micros(rng.below(phase_us)), node, mid_broadcast: rng.chance(0.5) }
            })
            .collect();
        FaultPlan {
            phase: fault_phase,
            loss_rate,
            duplicate_rate,
            delay_min_us,
            delay_spread_us,
            reorder_rate,
            partitions,
            crashes,
            lease_us: rng.range(1_000, phase_us / 4),
            view_spread_us: rng.range(0, phase_us / 8),
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

/// What a run actually injected.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct FaultCounts {
    pub messages_lost: u64,
    pub messages_duplicated: u64,
    pub messages_reordered: u64,
    pub messages_blocked_by_partition: u64,
    pub partitions: u64,
    pub crashes: u64,
    pub crashes_mid_broadcast: u64,
    pub views_installed: u64,
    /// Crashed nodes brought back (`SimConfig::restart_after`).
    pub restarts: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.messages_lost
            + self.messages_duplicated
            + self.messages_reordered
            + self.messages_blocked_by_partition
            + self.partitions
            + self.crashes
    }

    pub fn add(&mut self, other: &FaultCounts) {
        self.messages_lost += other.messages_lost;
        self.messages_duplicated += other.messages_duplicated;
        self.messages_reordered += other.messages_reordered;
        self.messages_blocked_by_partition += other.messages_blocked_by_partition;
        self.partitions += other.partitions;
        self.crashes += other.crashes;
        self.crashes_mid_broadcast += other.crashes_mid_broadcast;
        self.views_installed += other.views_installed;
        self.restarts += other.restarts;
    }
}
