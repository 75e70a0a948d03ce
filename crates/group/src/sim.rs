//! A deterministic simulator for one group: a caller and a chain of members over a network
//! that loses, duplicates, delays and reorders messages, and may crash a member; plus a
//! checker against a reference model.
//!
//! The reference model applies the workload's operations in submission (= sequence) order to
//! one byte vector per member (a gCAS with a partial execute map makes members differ, so
//! there is one model per member), skipping the operations that validation rejects. The
//! checker requires:
//!
//! * every operation completes (no hang), within a liveness window after the faults stop;
//! * an acknowledged operation's result equals the model's: the same gCAS result map, the
//!   same rejection error for a malformed operation;
//! * when an operation with a gFLUSH is acknowledged, every live member's *durable* image (what
//!   [`SimMemory`] keeps across a crash: the bytes at its last flush) equals the model's state
//!   after that operation or a later one;
//! * at the end, every member's region equals the model's final state (with a crash: every
//!   live member's region equals the model after the last acknowledged operation or later).
//!
//! Each seed draws its own fault mix (swarm testing), chain length, region size, window and
//! workload, from [`chorus_sim::rng::Rng`], so any seed replays exactly.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use bytes::Bytes;
use chorus_core::{NodeId, Time};
use chorus_region::{check_range, check_word, RegionError, RegionMemory, TenantId};
use chorus_sim::rng::Rng;

use crate::caller::{CallerConfig, GroupCaller};
use crate::member::ChainMember;
use crate::message::GroupMessage;
use crate::op::{
    GroupConfig, GroupError, GroupId, OpError, OpOutcome, Operation, Primitive, ResultMap, Token,
};
use crate::outbox::{GroupOutbox, RequestId};

pub use crate::member::Bug;

/// A region model that remembers what a crash would keep: the bytes as of the last flush.
#[derive(Clone, Debug)]
pub struct SimMemory {
    bytes: Vec<u8>,
    durable: Vec<u8>,
    flushes: u64,
}

impl SimMemory {
    pub fn new(size: usize) -> SimMemory {
        SimMemory { bytes: vec![0; size], durable: vec![0; size], flushes: 0 }
    }
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// What survives a crash.
    pub fn durable(&self) -> &[u8] {
        &self.durable
    }
    pub fn flushes(&self) -> u64 {
        self.flushes
    }
}

impl RegionMemory for SimMemory {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        let (start, end) = check_range(offset, buf.len() as u64, self.size())?;
        buf.copy_from_slice(&self.bytes[start..end]);
        Ok(())
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
        let (start, end) = check_range(offset, data.len() as u64, self.size())?;
        self.bytes[start..end].copy_from_slice(data);
        Ok(())
    }
    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError> {
        let (s, e) = check_range(src, len, self.size())?;
        let (d, _) = check_range(dst, len, self.size())?;
        self.bytes.copy_within(s..e, d);
        Ok(())
    }
    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError> {
        let at = check_word(offset, self.size())?;
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.bytes[at..at + 8]);
        let current = u64::from_le_bytes(word);
        if current == old {
            self.bytes[at..at + 8].copy_from_slice(&new.to_le_bytes());
        }
        Ok(current)
    }
    fn flush(&mut self) -> Result<(), RegionError> {
        self.durable.copy_from_slice(&self.bytes);
        self.flushes += 1;
        Ok(())
    }
}

/// Network faults of one run.
#[derive(Clone, Debug, Default)]
pub struct NetFaults {
    pub loss: f64,
    pub duplicate: f64,
    /// Chance that a message is held back up to ten times the delay spread.
    pub reorder: f64,
    pub delay_min_us: u64,
    pub delay_spread_us: u64,
}

impl NetFaults {
    /// A perfect network with a small fixed delay.
    pub fn none() -> NetFaults {
        NetFaults { delay_min_us: 50, ..NetFaults::default() }
    }

    /// Swarm testing: each fault on or off, with its own rate.
    pub fn draw(rng: &mut Rng) -> NetFaults {
        let mut rate = |max: f64| if rng.chance(0.5) { rng.unit() * max } else { 0.0 };
        let (loss, duplicate, reorder) = (rate(0.25), rate(0.25), rate(0.4));
        NetFaults {
            loss,
            duplicate,
            reorder,
            delay_min_us: rng.range(10, 200),
            delay_spread_us: if rng.chance(0.7) { rng.range(0, 800) } else { 0 },
        }
    }
}

/// Everything one seeded run uses, drawn from the seed.
#[derive(Clone, Debug)]
pub struct SimParams {
    pub seed: u64,
    pub members: usize,
    pub region_bytes: u64,
    pub faults: NetFaults,
    /// Crash this member (chain position) at this time, if any.
    pub crash: Option<(usize, Time)>,
    pub caller: CallerConfig,
    pub ops: usize,
    /// Mean gap between submissions.
    pub submit_gap_us: u64,
    #[cfg(any(test, feature = "broken-variants"))]
    pub bug: Option<Bug>,
}

impl SimParams {
    pub fn draw(seed: u64) -> SimParams {
        let mut rng = Rng::new(seed ^ 0x4859_5045_524c_4f4f);
        let members = rng.range(1, 5) as usize;
        let region_bytes = *rng.pick(&[64u64, 128, 256, 512]);
        let faults = if rng.chance(0.9) { NetFaults::draw(&mut rng) } else { NetFaults::none() };
        let crash = rng
            .chance(0.15)
            .then(|| (rng.below(members as u64) as usize, Time::from_micros(rng.range(0, 60_000))));
        let caller = CallerConfig {
            retransmit_after: Time::from_millis(rng.range(2, 20)),
            attempts_max: if crash.is_some() { 10 } else { 10_000 },
            window_max: rng.range(1, 24) as usize,
        };
        SimParams {
            seed,
            members,
            region_bytes,
            faults,
            crash,
            caller,
            ops: rng.range(20, 120) as usize,
            submit_gap_us: rng.range(0, 1_000),
            #[cfg(any(test, feature = "broken-variants"))]
            bug: None,
        }
    }
}

/// Draw a workload over a region of `region_bytes` for `members` members: mostly valid
/// operations that collide on a few bytes, and about one in seven malformed.
pub fn draw_workload(rng: &mut Rng, ops: usize, members: usize, region_bytes: u64) -> Vec<Operation> {
    let all = if members >= 64 { u64::MAX } else { (1u64 << members) - 1 };
    let offset = |rng: &mut Rng, len: u64| -> u64 {
        if rng.chance(0.07) {
            *rng.pick(&[region_bytes - len.min(region_bytes) + 1, region_bytes, u64::MAX - 3, u64::MAX / 2])
        } else {
            rng.below(region_bytes - len.min(region_bytes) + 1)
        }
    };
    (0..ops)
        .map(|i| {
            let kind = rng.below(100);
            let mut operation = if kind < 35 {
                let len = rng.range(0, 24);
                let data: Vec<u8> =
                    (0..len).map(|j| (i as u8).wrapping_mul(31).wrapping_add(j as u8) | 1).collect();
                let at = offset(rng, len);
                Operation::write(at, Bytes::from(data))
            } else if kind < 60 {
                let words = region_bytes / 8;
                let at =
                    if rng.chance(0.06) { rng.below(region_bytes + 16) } else { rng.below(words.min(4)) * 8 };
                let map = if rng.chance(0.04) { all + 1 + rng.below(4) } else { rng.below(all + 1) };
                let small = |rng: &mut Rng| rng.below(3);
                Operation::cas(at, small(rng), small(rng) + i as u64 % 5, map)
            } else if kind < 85 {
                let len = rng.range(0, 32);
                let src = offset(rng, len);
                let dst = offset(rng, len);
                Operation::memcpy(src, dst, len)
            } else {
                Operation::flush()
            };
            if kind < 85 && rng.chance(0.35) {
                operation.flush = true;
            }
            operation
        })
        .collect()
}

/// The reference model: the expected outcome of every operation and every member's state
/// after each one.
pub struct Reference {
    pub outcomes: Vec<Result<ResultMap, OpError>>,
    /// `states[m][k]`: member m's region after operations 0..k (`states[m][0]` is all zeroes).
    pub states: Vec<Vec<Vec<u8>>>,
    hashes: Vec<Vec<u64>>,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl Reference {
    pub fn build(operations: &[Operation], members: usize, region_bytes: u64) -> Reference {
        let mut current: Vec<SimMemory> =
            (0..members).map(|_| SimMemory::new(region_bytes as usize)).collect();
        let mut states: Vec<Vec<Vec<u8>>> = (0..members).map(|m| vec![current[m].bytes.clone()]).collect();
        let mut outcomes = Vec::with_capacity(operations.len());
        for operation in operations {
            let outcome = match operation.validate(region_bytes, members) {
                Err(error) => Err(error),
                Ok(()) => {
                    let mut map = vec![None; members];
                    for (m, memory) in current.iter_mut().enumerate() {
                        // Validated above, so these cannot fail.
                        match &operation.primitive {
                            Primitive::Write { offset, data } => {
                                memory.write(*offset, data).ok().unwrap_or(())
                            }
                            Primitive::Cas { offset, old, new, execute_map } => {
                                if execute_map & (1 << m) != 0 {
                                    map[m] = memory.cas(*offset, *old, *new).ok();
                                }
                            }
                            Primitive::Memcpy { src, dst, len } => {
                                memory.memcpy(*src, *dst, *len).ok().unwrap_or(())
                            }
                            Primitive::Flush => {}
                        }
                    }
                    Ok(if matches!(operation.primitive, Primitive::Cas { .. }) { map } else { Vec::new() })
                }
            };
            outcomes.push(outcome);
            for (m, memory) in current.iter().enumerate() {
                states[m].push(memory.bytes.clone());
            }
        }
        let hashes = states.iter().map(|per| per.iter().map(|s| fnv(s)).collect()).collect();
        Reference { outcomes, states, hashes }
    }

    /// Does `image` equal member m's state after some operation index `k..`?
    pub fn matches_some_state_from(&self, m: usize, k: usize, image: &[u8]) -> bool {
        let h = fnv(image);
        (k..self.states[m].len()).any(|t| self.hashes[m][t] == h && self.states[m][t] == image)
    }
}

enum Event {
    Deliver { from: NodeId, to: NodeId, message: GroupMessage },
    Tick,
    Submit(usize),
    Crash(usize),
}

struct Scheduled {
    at: Time,
    order: u64,
    event: Event,
}
impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// A caller and a chain of simulated members on a simulated network.
pub struct SimCluster {
    pub now: Time,
    rng: Rng,
    queue: BinaryHeap<Scheduled>,
    order: u64,
    pub caller: GroupCaller,
    pub members: Vec<ChainMember<SimMemory>>,
    pub crashed: Vec<bool>,
    pub faults: NetFaults,
    /// Completed requests, by request id.
    pub completions: BTreeMap<RequestId, Result<OpOutcome, GroupError>>,
    next_request: u64,
    tick_period: Time,
    ticking: bool,
    pub trace: Option<Vec<String>>,
    pub messages_sent: u64,
    pub messages_lost: u64,
    pub messages_duplicated: u64,
}

/// The token the simulated tenant uses.
pub const SIM_TOKEN: Token = Token(*b"simulated-tenant");
pub const SIM_TENANT: TenantId = TenantId(1);

impl SimCluster {
    pub fn new(
        seed: u64,
        members: usize,
        region_bytes: u64,
        caller: CallerConfig,
        faults: NetFaults,
    ) -> SimCluster {
        assert!((1..=63).contains(&members), "1..=63 members");
        let config = GroupConfig {
            group: GroupId(seed),
            tenant: SIM_TENANT,
            token: SIM_TOKEN,
            epoch: 1,
            chain: (0..members as u8).map(NodeId).collect(),
            caller: NodeId(members as u8),
            region_bytes,
            start_seq: 1,
        };
        let members_cores = (0..members)
            .map(|m| {
                ChainMember::new(
                    config.clone(),
                    NodeId(m as u8),
                    SIM_TENANT,
                    SimMemory::new(region_bytes as usize),
                )
                .expect("valid simulated group")
            })
            .collect();
        let caller_core = GroupCaller::new(config.clone(), config.caller, caller).expect("valid caller");
        let mut cluster = SimCluster {
            now: Time::ZERO,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            order: 0,
            caller: caller_core,
            members: members_cores,
            crashed: vec![false; members],
            faults,
            completions: BTreeMap::new(),
            next_request: 0,
            tick_period: Time::from_millis(1),
            ticking: false,
            trace: None,
            messages_sent: 0,
            messages_lost: 0,
            messages_duplicated: 0,
        };
        cluster.ensure_ticking();
        cluster
    }

    #[cfg(any(test, feature = "broken-variants"))]
    pub fn set_bug(&mut self, bug: Option<Bug>) {
        let members = std::mem::take(&mut self.members);
        self.members = members.into_iter().map(|m| m.with_bug(bug)).collect();
    }

    fn schedule(&mut self, at: Time, event: Event) {
        self.order += 1;
        self.queue.push(Scheduled { at, order: self.order, event });
    }

    fn ensure_ticking(&mut self) {
        if !self.ticking {
            self.ticking = true;
            self.schedule(self.now + self.tick_period, Event::Tick);
        }
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(format!("{} {}", self.now, line()));
        }
    }

    fn caller_node(&self) -> NodeId {
        NodeId(self.members.len() as u8)
    }

    fn dispatch(&mut self, from: NodeId, out: &mut GroupOutbox) {
        for (request, result) in out.completions.drain(..) {
            let now = self.now;
            if let Some(trace) = &mut self.trace {
                trace.push(format!("{now} complete {request:?}: {result:?}"));
            }
            self.completions.insert(request, result);
        }
        for (to, message) in std::mem::take(&mut out.messages) {
            self.messages_sent += 1;
            if self.rng.chance(self.faults.loss) {
                self.messages_lost += 1;
                self.log(|| format!("lost {from}->{to} seq {}", message.seq()));
                continue;
            }
            let copies = if self.rng.chance(self.faults.duplicate) { 2 } else { 1 };
            self.messages_duplicated += copies - 1;
            for _ in 0..copies {
                let mut delay = self.faults.delay_min_us + self.rng.range(0, self.faults.delay_spread_us);
                if self.rng.chance(self.faults.reorder) {
                    delay += self.rng.range(0, 10 * self.faults.delay_spread_us.max(100));
                }
                let at = self.now + Time::from_micros(delay);
                self.schedule(at, Event::Deliver { from, to, message: message.clone() });
            }
        }
    }

    /// Submit one operation now; returns its request id.
    pub fn submit(&mut self, operation: Operation) -> RequestId {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        let mut out = GroupOutbox::default();
        let op_text = self.trace.is_some().then(|| format!("{operation:?}"));
        self.log(|| format!("submit {request:?} {}", op_text.unwrap_or_default()));
        self.caller.submit(self.now, request, operation, &mut out);
        let me = self.caller_node();
        self.dispatch(me, &mut out);
        self.ensure_ticking();
        request
    }

    /// Process one event. Returns false when nothing is scheduled.
    fn step(&mut self, workload: Option<&[Operation]>) -> bool {
        let Some(Scheduled { at, event, .. }) = self.queue.pop() else { return false };
        self.now = at;
        let mut out = GroupOutbox::default();
        match event {
            Event::Deliver { from, to, message } => {
                if to == self.caller_node() {
                    self.caller.on_message(self.now, from, message, &mut out);
                } else if let Some(member) = self.members.get_mut(to.index()) {
                    if self.crashed[to.index()] {
                        return true;
                    }
                    member.on_message(self.now, from, message, &mut out);
                }
                self.dispatch(to, &mut out);
            }
            Event::Tick => {
                self.ticking = false;
                let now = self.now;
                self.caller.on_tick(now, &mut out);
                let me = self.caller_node();
                self.dispatch(me, &mut out);
                for m in 0..self.members.len() {
                    if !self.crashed[m] {
                        self.members[m].on_tick(now, &mut out);
                        self.dispatch(NodeId(m as u8), &mut out);
                    }
                }
                if self.caller.pending() > 0 || !self.queue.is_empty() {
                    self.ensure_ticking();
                }
            }
            Event::Submit(k) => {
                if let Some(operation) = workload.and_then(|w| w.get(k)) {
                    self.submit(operation.clone());
                }
            }
            Event::Crash(m) => {
                self.log(|| format!("crash member {m}"));
                self.crashed[m] = true;
            }
        }
        true
    }

    /// Run until `request` completes (or `deadline` of virtual time passes).
    pub fn run_until_complete(&mut self, requests: &[RequestId], deadline: Time) -> bool {
        let end = self.now + deadline;
        while !requests.iter().all(|r| self.completions.contains_key(r)) {
            if self.queue.peek().is_none_or(|next| next.at > end) || !self.step(None) {
                return false;
            }
        }
        true
    }

    /// Submit `operations` pipelined and wait for all of them (used by the transaction API).
    pub fn execute(&mut self, operations: Vec<Operation>) -> Vec<Result<OpOutcome, GroupError>> {
        let requests: Vec<RequestId> = operations.into_iter().map(|op| self.submit(op)).collect();
        self.run_until_complete(&requests, Time::from_millis(60_000));
        requests
            .iter()
            .map(|r| self.completions.remove(r).unwrap_or(Err(GroupError::Unavailable { attempts: 0 })))
            .collect()
    }
}

/// What one seed found.
#[derive(Debug)]
pub struct SeedReport {
    pub seed: u64,
    pub params: SimParams,
    pub violations: Vec<String>,
    pub ops_ok: usize,
    pub ops_rejected: usize,
    pub ops_failed: usize,
    pub messages_sent: u64,
    pub messages_lost: u64,
    pub messages_duplicated: u64,
    pub trace: Vec<String>,
}

/// Run one seed with the parameters it draws.
pub fn run_seed(seed: u64, trace: bool) -> SeedReport {
    run_params(SimParams::draw(seed), trace)
}

/// Run one seed with explicit parameters (the broken-variant tests set `bug`).
pub fn run_params(params: SimParams, trace: bool) -> SeedReport {
    let mut rng = Rng::new(params.seed);
    let workload = draw_workload(&mut rng, params.ops, params.members, params.region_bytes);
    let reference = Reference::build(&workload, params.members, params.region_bytes);
    let mut cluster = SimCluster::new(
        params.seed,
        params.members,
        params.region_bytes,
        params.caller.clone(),
        params.faults.clone(),
    );
    #[cfg(any(test, feature = "broken-variants"))]
    cluster.set_bug(params.bug);
    if trace {
        cluster.trace = Some(vec![format!("params: {params:?}")]);
    }
    let mut at = Time::ZERO;
    for k in 0..workload.len() {
        at = at + Time::from_micros(rng.range(0, 2 * params.submit_gap_us));
        cluster.schedule(at, Event::Submit(k));
    }
    if let Some((m, when)) = params.crash {
        cluster.schedule(when, Event::Crash(m));
    }
    let fault_phase_end = at + Time::from_millis(5);
    let deadline = fault_phase_end + Time::from_millis(30_000);

    let mut violations = Vec::new();
    let (mut ok, mut rejected, mut failed) = (0, 0, 0);
    let mut last_ok: Option<usize> = None;
    let mut checked = 0usize;
    let healed = params.crash.is_none();
    loop {
        if cluster.now >= fault_phase_end && cluster.faults.loss + cluster.faults.duplicate > 0.0 {
            cluster.faults.loss = 0.0;
            cluster.faults.duplicate = 0.0;
            cluster.faults.reorder = 0.0;
        }
        let done = checked == workload.len();
        if done || cluster.now > deadline || !cluster.step(Some(&workload)) {
            break;
        }
        // Check completions as they arrive: request k is operation k (ids are dense).
        while let Some(result) = cluster.completions.get(&RequestId(checked as u64)) {
            let k = checked;
            match result {
                Ok(outcome) => {
                    ok += 1;
                    last_ok = Some(k);
                    match &reference.outcomes[k] {
                        Ok(map) if *map == outcome.result_map => {}
                        expected => violations
                            .push(format!("op {k}: acknowledged {outcome:?}, model says {expected:?}")),
                    }
                    if workload[k].flushes() {
                        for (m, member) in cluster.members.iter().enumerate() {
                            if !cluster.crashed[m]
                                && !reference.matches_some_state_from(m, k + 1, member.memory().durable())
                            {
                                violations.push(format!(
                                    "op {k} (gFLUSH) acknowledged but member {m}'s durable image is older"
                                ));
                            }
                        }
                    }
                }
                Err(GroupError::Rejected(error)) => {
                    rejected += 1;
                    if reference.outcomes[k] != Err(*error) {
                        violations.push(format!(
                            "op {k}: rejected with {error:?}, model says {:?}",
                            reference.outcomes[k]
                        ));
                    }
                }
                Err(error) => {
                    failed += 1;
                    if healed {
                        violations.push(format!("op {k}: failed with `{error}` on a network that heals"));
                    }
                }
            }
            checked += 1;
        }
        if violations.len() > 20 {
            break;
        }
    }
    if checked < workload.len() {
        violations.push(format!(
            "liveness: {} of {} operations never completed (caller has {} pending)",
            workload.len() - checked,
            workload.len(),
            cluster.caller.pending()
        ));
    }
    // Final states.
    let from = last_ok.map_or(0, |k| k + 1);
    for (m, member) in cluster.members.iter().enumerate() {
        if cluster.crashed[m] {
            continue;
        }
        let image = member.memory().bytes();
        let good = if healed {
            image == &reference.states[m][workload.len()][..]
        } else {
            reference.matches_some_state_from(m, from, image)
        };
        if !good {
            violations.push(format!("member {m}'s region differs from the model's final state"));
        }
    }
    SeedReport {
        seed: params.seed,
        params,
        violations,
        ops_ok: ok,
        ops_rejected: rejected,
        ops_failed: failed,
        messages_sent: cluster.messages_sent,
        messages_lost: cluster.messages_lost,
        messages_duplicated: cluster.messages_duplicated,
        trace: cluster.trace.take().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
