//! A chain member: what HyperLoop's NIC does for one group on one replica, as a sans-I/O core.
//!
//! Operations arrive from the caller (at the head) or from the previous member, carry a
//! sequence number, and are applied strictly in sequence order: duplicates are not applied
//! again (they are forwarded again, with this member's remembered gCAS result, so a
//! retransmission can repair a loss further down the chain), operations ahead of a gap wait
//! for it, and an operation with an interleaved gFLUSH is made durable before it leaves this
//! member. The tail acknowledges the caller.

use std::collections::{BTreeMap, VecDeque};

use chorus_core::{NodeId, Time};
use chorus_region::{RegionMemory, TenantId};

use crate::message::GroupMessage;
use crate::op::{GroupConfig, OpError, Operation, Primitive, Refusal, ResultMap};
use crate::outbox::GroupOutbox;

/// Operations buffered ahead of a gap, at most; beyond that they are dropped and the caller's
/// retransmission brings them back.
pub const BUFFERED_OPS_MAX: usize = 4096;
/// gCAS results remembered for retransmissions, at most (normally pruned by `acked_through`).
pub const REMEMBERED_OPS_MAX: usize = 16384;

/// A deliberately broken variant, for tests that show the simulator's checker catches it.
/// Selecting one needs the `broken-variants` feature (or this crate's own tests).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bug {
    /// Forwards an operation with an interleaved gFLUSH before the flush: the flush happens on
    /// the member's next tick, so the caller can see an acknowledgement of data that is not
    /// durable yet at some member.
    ForwardBeforeFlush,
    /// Applies an operation that arrives ahead of a gap immediately instead of waiting.
    SkipGaps,
    /// No validation: writes that overflow the region are clipped and applied.
    ClipOutOfBounds,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub applied: u64,
    pub rejected: u64,
    pub flushes: u64,
    pub duplicates: u64,
    pub buffered: u64,
    pub dropped: u64,
    /// Write-lock gCASes refused because the word held only readers (each attempt).
    pub yielded_to_readers: u64,
}

/// Why `Initialize` refused to create a member.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum InitError {
    #[error("invalid group configuration: {0}")]
    InvalidConfig(String),
    #[error("node {0} is not in the group's chain")]
    NotInChain(NodeId),
    #[error("region belongs to {region_tenant}, not to the group's {group_tenant}")]
    ForeignRegion { region_tenant: TenantId, group_tenant: TenantId },
    #[error("region has {region_bytes} bytes, the group needs {needed}")]
    RegionTooSmall { region_bytes: u64, needed: u64 },
}

/// Why `apply` changed nothing.
enum Unapplied {
    /// A write lock that yields to readers found a reader count in its word.
    ReadersHold,
    /// The region refused a validated operation: the member fails.
    Failed(String),
}

struct Incoming {
    operation: Operation,
    verdict: Option<OpError>,
    results: ResultMap,
}

pub struct ChainMember<M: RegionMemory> {
    config: GroupConfig,
    me: NodeId,
    position: usize,
    region_tenant: TenantId,
    memory: M,
    /// The next sequence number to apply.
    next_seq: u64,
    /// Operations that arrived ahead of a gap.
    buffered: BTreeMap<u64, Incoming>,
    /// This member's gCAS result (or None) for recently applied sequence numbers, oldest
    /// first: `remembered[i]` belongs to `remembered_from + i`.
    remembered: VecDeque<Option<u64>>,
    remembered_from: u64,
    /// The caller has completed every sequence number up to this one.
    acked_through: u64,
    /// Set when this member can no longer guarantee the chain's semantics (a flush or an
    /// apply failed). It refuses everything until reconfigured.
    failed: Option<String>,
    stats: MemberStats,
    #[cfg(any(test, feature = "broken-variants"))]
    bug: Option<Bug>,
    #[cfg(any(test, feature = "broken-variants"))]
    flush_pending: bool,
}

impl<M: RegionMemory> ChainMember<M> {
    /// HyperLoop §5 `Initialize` on one replica: bind the group to this node's `memory`, a
    /// region registered by `region_tenant`. Refused unless the region belongs to the group's
    /// tenant (§7) and is large enough.
    pub fn new(
        config: GroupConfig,
        me: NodeId,
        region_tenant: TenantId,
        memory: M,
    ) -> Result<Self, InitError> {
        config.check().map_err(InitError::InvalidConfig)?;
        let position = config.chain.iter().position(|node| *node == me).ok_or(InitError::NotInChain(me))?;
        if region_tenant != config.tenant {
            return Err(InitError::ForeignRegion { region_tenant, group_tenant: config.tenant });
        }
        if memory.size() < config.region_bytes {
            return Err(InitError::RegionTooSmall {
                region_bytes: memory.size(),
                needed: config.region_bytes,
            });
        }
        Ok(ChainMember {
            next_seq: config.start_seq,
            remembered_from: config.start_seq,
            acked_through: config.start_seq - 1,
            config,
            me,
            position,
            region_tenant,
            memory,
            buffered: BTreeMap::new(),
            remembered: VecDeque::new(),
            failed: None,
            stats: MemberStats::default(),
            #[cfg(any(test, feature = "broken-variants"))]
            bug: None,
            #[cfg(any(test, feature = "broken-variants"))]
            flush_pending: false,
        })
    }

    #[cfg(any(test, feature = "broken-variants"))]
    pub fn with_bug(mut self, bug: Option<Bug>) -> Self {
        self.bug = bug;
        self
    }

    #[cfg(any(test, feature = "broken-variants"))]
    fn has_bug(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
    #[cfg(not(any(test, feature = "broken-variants")))]
    fn has_bug(&self, _bug: Bug) -> bool {
        false
    }

    pub fn memory(&self) -> &M {
        &self.memory
    }
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }
    pub fn position(&self) -> usize {
        self.position
    }
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    pub fn stats(&self) -> MemberStats {
        self.stats
    }
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }
    /// The runtime could not make what this member applied durable (a flush deferred to the end
    /// of its turn failed): nothing the turn produced may leave (the caller drops `out`'s
    /// messages first), and the member refuses everything until reconfigured, as when a flush
    /// of its own fails.
    pub fn fail_turn(&mut self, reason: String, out: &mut GroupOutbox) {
        let seq = self.next_seq.saturating_sub(1);
        self.fail(reason, seq, out);
    }
    /// End a turn of the runtime: the turn's deferred flushes as one (one msync for all its
    /// gFLUSHes). If that fails, nothing the turn produced leaves: `out`'s messages are dropped
    /// and the member fails ([`Self::fail_turn`]), so `out` then holds only its refusals.
    pub fn flush_turn_or_fail(&mut self, out: &mut GroupOutbox) -> Result<(), String> {
        let Err(error) = self.memory.sync_turn(false) else { return Ok(()) };
        let reason = format!("flush failed: {error}");
        out.messages.clear();
        self.fail_turn(reason.clone(), out);
        Err(reason)
    }
    fn is_tail(&self) -> bool {
        self.position + 1 == self.config.chain.len()
    }
    fn upstream(&self) -> NodeId {
        if self.position == 0 {
            self.config.caller
        } else {
            self.config.chain[self.position - 1]
        }
    }

    pub fn on_message(&mut self, _now: Time, from: NodeId, message: GroupMessage, out: &mut GroupOutbox) {
        let GroupMessage::Op { group, epoch, token, seq, acked_through, operation, verdict, results } =
            message
        else {
            self.stats.dropped += 1; // acks and refusals are for callers
            return;
        };
        if group != self.config.group || epoch != self.config.epoch || from != self.upstream() {
            self.stats.dropped += 1;
            return;
        }
        if !token.matches(&self.config.token) {
            // Nothing is consumed: the sequence number stays free for the real caller.
            self.stats.dropped += 1;
            if self.position == 0 {
                let refusal = Refusal::Unauthorized;
                out.send(from, GroupMessage::Refused { group, epoch, seq, refusal });
            }
            return;
        }
        if let Some(reason) = &self.failed {
            let refusal = Refusal::MemberFailed { position: self.position as u8, reason: reason.clone() };
            out.send(self.config.caller, GroupMessage::Refused { group, epoch, seq, refusal });
            return;
        }
        // A well-behaved upstream sends one slot per member; anything else is malformed.
        let chain_len = self.config.chain.len();
        let results = if self.position == 0 { vec![None; chain_len] } else { results };
        if results.len() != chain_len || (self.position == 0 && verdict.is_some()) {
            self.stats.dropped += 1;
            return;
        }
        self.forget_through(acked_through);
        let incoming = Incoming { operation, verdict, results };

        if seq < self.next_seq {
            self.on_duplicate(seq, incoming, out);
        } else if seq == self.next_seq || self.has_bug(Bug::SkipGaps) {
            self.next_seq = seq;
            self.buffered.remove(&seq); // a copy that yielded to readers earlier: this one replaces it
            if self.apply_and_forward(seq, incoming, out) {
                self.apply_buffered(out);
            }
        } else if self.buffered.len() < BUFFERED_OPS_MAX {
            self.stats.buffered += 1;
            self.buffered.insert(seq, incoming);
            // A write lock that yielded to readers waits at `next_seq`: try it again now.
            self.apply_buffered(out);
        } else {
            self.stats.dropped += 1;
        }
    }

    pub fn on_tick(&mut self, _now: Time, out: &mut GroupOutbox) {
        #[cfg(any(test, feature = "broken-variants"))]
        if self.flush_pending {
            self.flush_pending = false;
            let _ = self.memory.flush();
        }
        if self.failed.is_none() {
            self.apply_buffered(out);
        }
    }

    /// Apply what waits in sequence from `next_seq` on, until a gap, a failure, or a write
    /// lock that yields to readers again.
    fn apply_buffered(&mut self, out: &mut GroupOutbox) {
        while self.failed.is_none() {
            let Some(next) = self.buffered.remove(&self.next_seq) else { break };
            if !self.apply_and_forward(self.next_seq, next, out) {
                break;
            }
        }
    }

    /// The group was reconfigured (a member replaced, the chain reordered). Operations of the
    /// old epoch still buffered are dropped; the sequence restarts at `config.start_seq`.
    /// Bringing a new member's region up to date is the recovery protocol's job (§5), done
    /// before the new configuration is installed.
    pub fn on_config(
        &mut self,
        _now: Time,
        config: GroupConfig,
        _out: &mut GroupOutbox,
    ) -> Result<(), InitError> {
        config.check().map_err(InitError::InvalidConfig)?;
        if config.epoch <= self.config.epoch {
            return Ok(()); // stale or repeated
        }
        let position =
            config.chain.iter().position(|node| *node == self.me).ok_or(InitError::NotInChain(self.me))?;
        if self.region_tenant != config.tenant {
            return Err(InitError::ForeignRegion {
                region_tenant: self.region_tenant,
                group_tenant: config.tenant,
            });
        }
        if self.memory.size() < config.region_bytes {
            return Err(InitError::RegionTooSmall {
                region_bytes: self.memory.size(),
                needed: config.region_bytes,
            });
        }
        self.position = position;
        self.next_seq = config.start_seq;
        self.remembered_from = config.start_seq;
        self.acked_through = config.start_seq - 1;
        self.remembered.clear();
        self.buffered.clear();
        self.failed = None;
        self.config = config;
        Ok(())
    }

    fn forget_through(&mut self, acked_through: u64) {
        self.acked_through = self.acked_through.max(acked_through);
        while self.remembered_from <= acked_through && !self.remembered.is_empty() {
            self.remembered.pop_front();
            self.remembered_from += 1;
        }
    }

    fn on_duplicate(&mut self, seq: u64, mut incoming: Incoming, out: &mut GroupOutbox) {
        self.stats.duplicates += 1;
        if seq < self.remembered_from {
            return; // already acknowledged to the caller: a stale copy
        }
        let Some(mine) = self.remembered.get((seq - self.remembered_from) as usize).copied() else {
            return;
        };
        // Recompute the verdict the same way the first copy got it (a pure function).
        let verdict =
            if self.position == 0 { self.validate(&incoming.operation).err() } else { incoming.verdict };
        incoming.verdict = verdict;
        incoming.results[self.position] = mine;
        self.forward(seq, incoming, out);
    }

    fn validate(&self, operation: &Operation) -> Result<(), OpError> {
        if self.has_bug(Bug::ClipOutOfBounds) && matches!(operation.primitive, Primitive::Write { .. }) {
            return Ok(());
        }
        operation.validate(self.config.region_bytes, self.config.chain.len())
    }

    /// Apply the operation with sequence number `self.next_seq`, flush if asked, remember the
    /// result, and pass it on. Returns whether the sequence advanced: not when this member
    /// failed, nor when a write lock yielded to local readers. A yielded lock changed nothing
    /// (its compare failed), consumed nothing and sent nothing; it waits at `next_seq` (in
    /// `buffered`) for the next arrival, tick or retransmission, and everything pipelined
    /// behind it waits with it (HyperLoop §5: the execution runs under `wrLock`, so no part
    /// of it may run where the lock was not taken).
    fn apply_and_forward(&mut self, seq: u64, mut incoming: Incoming, out: &mut GroupOutbox) -> bool {
        debug_assert_eq!(seq, self.next_seq);
        let mine = self.validate(&incoming.operation).err();
        let verdict = if self.position == 0 { mine } else { incoming.verdict };
        if mine != verdict {
            // Validation is a pure function of the operation and the group configuration, so
            // this means corruption or a bug upstream: refuse to diverge silently.
            self.fail(
                format!("verdict mismatch at seq {seq}: upstream {verdict:?}, here {mine:?}"),
                seq,
                out,
            );
            return false;
        }
        let mut result = None;
        if verdict.is_none() {
            match self.apply(&incoming.operation) {
                Ok(original) => result = original,
                Err(Unapplied::ReadersHold) => {
                    self.stats.yielded_to_readers += 1;
                    self.buffered.insert(seq, incoming);
                    return false;
                }
                Err(Unapplied::Failed(reason)) => {
                    self.fail(reason, seq, out);
                    return false;
                }
            }
            if incoming.operation.flushes() {
                if self.has_bug(Bug::ForwardBeforeFlush) {
                    #[cfg(any(test, feature = "broken-variants"))]
                    {
                        self.flush_pending = true;
                    }
                } else if let Err(e) = self.memory.flush() {
                    self.fail(format!("flush failed: {e}"), seq, out);
                    return false;
                }
                self.stats.flushes += 1;
            }
            self.stats.applied += 1;
        } else {
            self.stats.rejected += 1;
        }
        incoming.verdict = verdict;
        incoming.results[self.position] = result;
        if self.remembered.len() >= REMEMBERED_OPS_MAX {
            self.remembered.pop_front();
            self.remembered_from += 1;
        }
        if self.remembered.is_empty() {
            self.remembered_from = seq;
        }
        self.remembered.push_back(result);
        self.next_seq = seq + 1;
        self.forward(seq, incoming, out);
        true
    }

    fn apply(&mut self, operation: &Operation) -> Result<Option<u64>, Unapplied> {
        let result = match &operation.primitive {
            Primitive::Write { offset, data } => {
                if self.has_bug(Bug::ClipOutOfBounds) {
                    let size = self.memory.size();
                    let start = (*offset).min(size);
                    let take = (size - start).min(data.len() as u64) as usize;
                    self.memory.write(start, &data[..take]).map(|_| None)
                } else {
                    self.memory.write(*offset, data).map(|_| None)
                }
            }
            Primitive::Cas { offset, old, new, execute_map } => {
                if execute_map & (1u64 << self.position) != 0 {
                    // One atomic CAS against the readers' own CAS on the word (a host maps the
                    // node's region): if it failed for readers, nothing changed.
                    match self.memory.cas(*offset, *old, *new) {
                        Ok(original) if operation.yields_at(original) => return Err(Unapplied::ReadersHold),
                        other => other.map(Some),
                    }
                } else {
                    Ok(None)
                }
            }
            Primitive::Memcpy { src, dst, len } => self.memory.memcpy(*src, *dst, *len).map(|_| None),
            Primitive::Flush => Ok(None),
        };
        result.map_err(|e| Unapplied::Failed(format!("applying a validated operation failed: {e}")))
    }

    fn forward(&mut self, seq: u64, incoming: Incoming, out: &mut GroupOutbox) {
        let config = &self.config;
        if self.is_tail() {
            let outcome = match incoming.verdict {
                None => Ok(incoming.results),
                Some(error) => Err(error),
            };
            out.send(
                config.caller,
                GroupMessage::Ack { group: config.group, epoch: config.epoch, seq, outcome },
            );
        } else {
            out.send(
                config.chain[self.position + 1],
                GroupMessage::Op {
                    group: config.group,
                    epoch: config.epoch,
                    token: config.token,
                    seq,
                    acked_through: self.acked_through,
                    operation: incoming.operation,
                    verdict: incoming.verdict,
                    results: incoming.results,
                },
            );
        }
    }

    fn fail(&mut self, reason: String, seq: u64, out: &mut GroupOutbox) {
        let refusal = Refusal::MemberFailed { position: self.position as u8, reason: reason.clone() };
        self.failed = Some(reason);
        out.send(
            self.config.caller,
            GroupMessage::Refused { group: self.config.group, epoch: self.config.epoch, seq, refusal },
        );
    }
}
