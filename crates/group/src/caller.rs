//! The caller side of a group (HyperLoop's client, the transaction coordinator) as a sans-I/O
//! core: it numbers operations, keeps up to `window_max` in flight to the head, retransmits
//! on timeout, completes each operation when the tail acknowledges it, and turns a silent or
//! failed chain into errors instead of hangs.

use std::collections::{BTreeMap, VecDeque};

use chorus_core::{NodeId, Time};

use crate::message::GroupMessage;
use crate::op::{GroupConfig, GroupError, OpOutcome, Operation, Refusal};
use crate::outbox::{GroupOutbox, RequestId};

#[derive(Clone, Debug)]
pub struct CallerConfig {
    /// Resend an unacknowledged operation to the head after this long.
    pub retransmit_after: Time,
    /// Give up (fail every pending operation with [`GroupError::Unavailable`]) after this many
    /// sends of one operation.
    pub attempts_max: u32,
    /// Operations in flight at most, counted as a span of sequence numbers from the oldest
    /// unacknowledged one; later submissions queue at the caller.
    pub window_max: usize,
}

impl Default for CallerConfig {
    fn default() -> Self {
        CallerConfig { retransmit_after: Time::from_millis(20), attempts_max: 50, window_max: 64 }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallerStats {
    pub submitted: u64,
    pub completed: u64,
    pub retransmits: u64,
    pub failed: u64,
}

struct InFlight {
    request: RequestId,
    operation: Operation,
    sent_at: Time,
    attempts: u32,
}

pub struct GroupCaller {
    group: GroupConfig,
    me: NodeId,
    config: CallerConfig,
    next_seq: u64,
    /// Sent and not yet acknowledged, by sequence number.
    in_flight: BTreeMap<u64, InFlight>,
    /// Numbered, waiting for room in the window.
    queued: VecDeque<(u64, RequestId, Operation)>,
    broken: Option<String>,
    stats: CallerStats,
}

impl GroupCaller {
    pub fn new(group: GroupConfig, me: NodeId, config: CallerConfig) -> Result<GroupCaller, String> {
        group.check()?;
        if group.caller != me {
            return Err(format!("the group's caller is {}, not {me}", group.caller));
        }
        if config.window_max == 0 || config.attempts_max == 0 {
            return Err("window_max and attempts_max must be positive".to_string());
        }
        Ok(GroupCaller {
            next_seq: group.start_seq,
            group,
            me,
            config,
            in_flight: BTreeMap::new(),
            queued: VecDeque::new(),
            broken: None,
            stats: CallerStats::default(),
        })
    }

    pub fn group(&self) -> &GroupConfig {
        &self.group
    }
    pub fn stats(&self) -> CallerStats {
        self.stats
    }
    /// Operations submitted and not completed.
    pub fn pending(&self) -> usize {
        self.in_flight.len() + self.queued.len()
    }
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Every sequence number below this has completed.
    fn acked_through(&self) -> u64 {
        let oldest = self.in_flight.keys().next().copied();
        let oldest = oldest.or(self.queued.front().map(|(seq, _, _)| *seq)).unwrap_or(self.next_seq);
        oldest - 1
    }

    /// Submit an operation. It completes exactly once, through `out.completions`. The head
    /// validates it (a malformed operation completes with [`GroupError::Rejected`]).
    pub fn submit(&mut self, now: Time, request: RequestId, operation: Operation, out: &mut GroupOutbox) {
        self.stats.submitted += 1;
        if let Some(reason) = &self.broken {
            self.stats.failed += 1;
            out.complete(request, Err(GroupError::Broken(reason.clone())));
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queued.push_back((seq, request, operation));
        self.send_queued(now, out);
    }

    /// The window bounds the span of sequence numbers in flight (newest - oldest unacknowledged),
    /// not only their count: a member remembers the results of its last `RING` operations, so
    /// an operation whose acknowledgement was lost must still be among them when it is
    /// retransmitted. Counting alone let the caller run ahead of one lost ACK by thousands
    /// (the kernel path then dropped the retransmission as forgotten, forever).
    fn send_queued(&mut self, now: Time, out: &mut GroupOutbox) {
        while let Some(&(seq, _, _)) = self.queued.front() {
            let oldest = self.in_flight.keys().next().copied().unwrap_or(seq);
            if seq - oldest >= self.config.window_max as u64 {
                break;
            }
            let Some((seq, request, operation)) = self.queued.pop_front() else { break };
            self.in_flight.insert(seq, InFlight { request, operation, sent_at: now, attempts: 0 });
            self.transmit(seq, now, out);
        }
    }

    fn transmit(&mut self, seq: u64, now: Time, out: &mut GroupOutbox) {
        let acked_through = self.acked_through();
        let Some(entry) = self.in_flight.get_mut(&seq) else { return };
        entry.sent_at = now;
        entry.attempts += 1;
        out.send(
            self.group.chain[0],
            GroupMessage::Op {
                group: self.group.group,
                epoch: self.group.epoch,
                token: self.group.token,
                seq,
                acked_through,
                operation: entry.operation.clone(),
                verdict: None,
                results: Vec::new(),
            },
        );
    }

    pub fn on_message(&mut self, now: Time, from: NodeId, message: GroupMessage, out: &mut GroupOutbox) {
        if message.group() != self.group.group {
            return;
        }
        match message {
            GroupMessage::Ack { epoch, seq, outcome, .. } => {
                if epoch != self.group.epoch || from != *self.group.chain.last().unwrap_or(&from) {
                    return;
                }
                let Some(entry) = self.in_flight.remove(&seq) else { return }; // duplicate ack
                let result = match outcome {
                    Ok(result_map) => {
                        if result_map.len() == self.group.chain.len() {
                            Ok(OpOutcome { result_map: result_map_for(&entry.operation, result_map) })
                        } else {
                            // A malformed ack: treat the operation as in doubt.
                            Err(GroupError::MemberFailed {
                                position: (self.group.chain.len() - 1) as u8,
                                reason: "tail sent a result map of the wrong length".to_string(),
                            })
                        }
                    }
                    Err(error) => Err(GroupError::Rejected(error)),
                };
                self.stats.completed += 1;
                out.complete(entry.request, result);
                self.send_queued(now, out);
            }
            GroupMessage::Refused { epoch, refusal, .. } => {
                if epoch != self.group.epoch || !self.group.chain.contains(&from) {
                    return;
                }
                let (error, reason) = match refusal {
                    Refusal::Unauthorized => {
                        (GroupError::Unauthorized, "the chain refused this caller's token".to_string())
                    }
                    Refusal::MemberFailed { position, reason } => {
                        let text = format!("member {position} failed: {reason}");
                        (GroupError::MemberFailed { position, reason }, text)
                    }
                };
                self.fail_all(error, reason, out);
            }
            GroupMessage::Op { .. } => {}
        }
    }

    pub fn on_tick(&mut self, now: Time, out: &mut GroupOutbox) {
        let due: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, entry)| now.saturating_sub(entry.sent_at) >= self.config.retransmit_after)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            let attempts = self.in_flight.get(&seq).map_or(0, |entry| entry.attempts);
            if attempts >= self.config.attempts_max {
                let reason = format!("operation {seq} unacknowledged after {attempts} attempts");
                self.fail_all(GroupError::Unavailable { attempts }, reason, out);
                return;
            }
            self.stats.retransmits += 1;
            self.transmit(seq, now, out);
        }
    }

    /// The runtime lost its connection to a member (closed, reset, unreachable): every
    /// pending operation completes with [`GroupError::Disconnected`] (outcome unknown) and the
    /// group is broken until reconfigured, as when retransmissions run out, only sooner.
    pub fn on_link_lost(&mut self, reason: String, out: &mut GroupOutbox) {
        if self.broken.is_some() && self.pending() == 0 {
            return;
        }
        self.fail_all(GroupError::Disconnected(reason.clone()), reason, out);
    }

    /// Install a new chain configuration (after the application's recovery, §5). Operations
    /// still pending have unknown outcomes and complete with [`GroupError::Reconfigured`].
    pub fn on_config(&mut self, now: Time, config: GroupConfig, out: &mut GroupOutbox) -> Result<(), String> {
        config.check()?;
        if config.epoch <= self.group.epoch || config.caller != self.me {
            return Err(format!(
                "configuration epoch {} is not newer than {}",
                config.epoch, self.group.epoch
            ));
        }
        self.fail_pending(GroupError::Reconfigured, out);
        self.next_seq = config.start_seq;
        self.group = config;
        self.broken = None;
        self.send_queued(now, out);
        Ok(())
    }

    fn fail_pending(&mut self, error: GroupError, out: &mut GroupOutbox) {
        for (_, entry) in std::mem::take(&mut self.in_flight) {
            self.stats.failed += 1;
            out.complete(entry.request, Err(error.clone()));
        }
        for (_, request, _) in std::mem::take(&mut self.queued) {
            self.stats.failed += 1;
            out.complete(request, Err(error.clone()));
        }
    }

    fn fail_all(&mut self, error: GroupError, reason: String, out: &mut GroupOutbox) {
        self.fail_pending(error, out);
        self.broken = Some(reason);
    }
}

/// Only a gCAS reports a result map.
fn result_map_for(operation: &Operation, result_map: Vec<Option<u64>>) -> Vec<Option<u64>> {
    if matches!(operation.primitive, crate::op::Primitive::Cas { .. }) {
        result_map
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{GroupId, Token};
    use chorus_region::TenantId;

    fn caller(window_max: usize) -> GroupCaller {
        let config = GroupConfig {
            group: GroupId(1),
            tenant: TenantId(1),
            token: Token([1; 16]),
            epoch: 1,
            chain: vec![NodeId(1), NodeId(2)],
            caller: NodeId(0),
            region_bytes: 64,
            start_seq: 1,
        };
        let timing = CallerConfig { retransmit_after: Time::from_millis(20), attempts_max: 5, window_max };
        GroupCaller::new(config, NodeId(0), timing).unwrap()
    }

    fn sent_seqs(out: &mut GroupOutbox) -> Vec<u64> {
        out.messages
            .drain(..)
            .filter_map(|(_, message)| match message {
                GroupMessage::Op { seq, .. } => Some(seq),
                _ => None,
            })
            .collect()
    }

    fn ack(seq: u64) -> GroupMessage {
        GroupMessage::Ack { group: GroupId(1), epoch: 1, seq, outcome: Ok(vec![None, None]) }
    }

    /// One lost acknowledgement holds the window's start: later acknowledgements do not let
    /// the caller run more than `window_max` sequence numbers past it.
    #[test]
    fn the_window_is_a_span_from_the_oldest_unacknowledged_operation() {
        let mut caller = caller(4);
        let mut out = GroupOutbox::default();
        for r in 0..10 {
            caller.submit(
                Time::ZERO,
                RequestId(r),
                Operation::write(0, bytes::Bytes::from_static(b"x")),
                &mut out,
            );
        }
        assert_eq!(sent_seqs(&mut out), vec![1, 2, 3, 4]);
        for seq in 2..=4 {
            caller.on_message(Time::ZERO, NodeId(2), ack(seq), &mut out);
        }
        assert_eq!(sent_seqs(&mut out), Vec::<u64>::new(), "seq 1 is still unacknowledged");
        caller.on_tick(Time::from_millis(20), &mut out);
        assert_eq!(sent_seqs(&mut out), vec![1], "only the lost one is retransmitted");
        caller.on_message(Time::from_millis(21), NodeId(2), ack(1), &mut out);
        assert_eq!(sent_seqs(&mut out), vec![5, 6, 7, 8]);
    }
}
