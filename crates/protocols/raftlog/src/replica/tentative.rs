//! Decoupled execution (Cyclone §3.1, "Decoupled Replication"), on unless
//! `RaftLogConfig::decoupled` is off: every replica executes an entry as soon as it holds it
//! (the leader when it proposes it, a follower when it appends it), before it commits, as a
//! transaction it can roll back (`LogState::execute_tentatively`). When the entry commits the
//! transaction commits and the results it computed are the replies: nothing runs twice. When
//! the entry is lost (a new leader's entries replace it), the transaction and every later
//! one is rolled back, newest first, and the new entries are executed in their place.
//!
//! Entries are executed strictly in log order, each on the state the entries before it left:
//! so a result computed early is exactly the one the committed execution would compute, and
//! a read, a snapshot or a checkpoint sees only committed state (`LogState::get`,
//! `LogState::encode` look through the undo records). Execution stops at an entry it cannot
//! run early, and the committed execution takes over until that entry is applied:
//! transaction steps and ganged operations (Cyclone runs distributed transactions coupled:
//! "for distributed transactions, we turn off decoupled execution"), configuration changes
//! and entries that do not decode.

use super::*;

/// What executing one proposal of a tentative entry gave: its result and outcomes, the
/// replies once the entry commits.
#[derive(Debug)]
pub(super) struct Executed {
    client: SessionId,
    seq: u64,
    result: ProposalResult,
    outcomes: Vec<Outcome>,
}

/// An entry this replica proposed as leader, with the proposals it encoded into it.
#[derive(Debug)]
pub(super) struct ProposedEntry {
    index: u64,
    term: u64,
    proposals: Vec<Proposal>,
}

/// At most this many proposed entries are kept unexecuted (execution stopped at a gang or a
/// transaction step for long): beyond it, entries are decoded from the log as a follower's are.
const PROPOSED_ENTRIES_MAX: usize = 1024;

/// The proposals `entry` holds, unless it must wait for its commit to run (`None`): `kept`,
/// the proposals this replica encoded into it as leader, if it is that entry (same index and
/// term: the same entry, by Raft's log matching); otherwise decoded from its data.
fn runs_early(entry: &Entry, kept: Option<Vec<Proposal>>) -> Option<Vec<Proposal>> {
    if entry.get_entry_type() != EntryType::EntryNormal {
        return None;
    }
    let proposals = match kept {
        Some(proposals) => proposals,
        None if entry.data.is_empty() => return Some(Vec::new()), // a leader's no-op
        None => EntryBatch::decode_exact(entry.data.clone()).ok()?.proposals,
    };
    proposals.iter().all(|proposal| proposal.step.is_none()).then_some(proposals)
}

/// The kept proposals of entry `(index, term)`, if it is one this replica proposed; kept
/// entries before it (executed otherwise, or replaced) are dropped.
fn take_proposed(kept: &mut VecDeque<ProposedEntry>, index: u64, term: u64) -> Option<Vec<Proposal>> {
    while kept.front().is_some_and(|entry| entry.index < index) {
        kept.pop_front();
    }
    if kept.front().is_some_and(|entry| entry.index == index) {
        let entry = kept.pop_front().expect("checked");
        return (entry.term == term).then_some(entry.proposals);
    }
    None
}

impl RaftLog {
    /// Execute every entry `log` holds beyond what it executed, in order, until one that
    /// must wait for its commit. Nothing runs while committed entries wait (at a gang).
    pub(super) fn execute_held_entries(&mut self, log: usize) {
        if !self.config.decoupled {
            return;
        }
        let group = &mut self.groups[log];
        if !group.pending.is_empty() {
            return;
        }
        loop {
            let next = group.state.last_tentative().map_or(group.applied_index, |(index, _)| index) + 1;
            let Some(entry) = group.raft.store().entry(next) else { return };
            if group.execution_stop == Some((entry.index, entry.term)) {
                return;
            }
            let kept = take_proposed(&mut group.proposed_entries, entry.index, entry.term);
            let Some(proposals) = runs_early(entry, kept) else {
                group.execution_stop = Some((entry.index, entry.term));
                return;
            };
            let term = entry.term;
            let results = group.state.execute_tentatively(next, term, &proposals, self.dedupe);
            self.stats.entries_executed_early += 1;
            group.executed.push_back(
                proposals
                    .iter()
                    .zip(results)
                    .map(|(proposal, (result, outcomes))| Executed {
                        client: proposal.client,
                        seq: proposal.seq,
                        result,
                        outcomes,
                    })
                    .collect(),
            );
        }
    }

    /// As leader, `log` proposed `proposals` as entry `(index, term)`: keep them for its
    /// execution (`execute_held_entries`), which would otherwise decode them again.
    pub(super) fn keep_proposed(&mut self, log: usize, index: u64, term: u64, proposals: Vec<Proposal>) {
        let kept = &mut self.groups[log].proposed_entries;
        if self.config.decoupled && kept.len() < PROPOSED_ENTRIES_MAX {
            kept.push_back(ProposedEntry { index, term, proposals });
        }
    }

    /// `entries` are about to replace whatever `log` holds from their first index on: roll
    /// back the tentative executions of every entry they do not repeat (a leader change lost
    /// them), newest first.
    pub(super) fn abort_replaced(&mut self, log: usize, entries: &[Entry]) {
        let keep_writes = self.config.has_bug(crate::config::Bug::KeepRolledBack);
        let group = &mut self.groups[log];
        let (Some(first), Some((last_executed, _))) = (entries.first(), group.state.last_tentative()) else {
            return;
        };
        if last_executed < first.index {
            return;
        }
        // The first executed entry that the new entries do not repeat (same index and term:
        // the same entry, by Raft's log matching).
        let lost = (first.index.max(group.applied_index + 1)..=last_executed).find(|index| {
            let replacement = entries.get((index - first.index) as usize);
            replacement.map(|entry| entry.term) != group.state.tentative_term(*index)
        });
        if let Some(lost) = lost {
            self.roll_back(log, lost, keep_writes);
        }
    }

    /// Undo the tentative executions of `log` from `index` on.
    fn roll_back(&mut self, log: usize, index: u64, keep_writes: bool) {
        let group = &mut self.groups[log];
        let rolled_back = group.state.roll_back_from(index, keep_writes);
        let kept = group.executed.len() - rolled_back;
        group.executed.truncate(kept);
        group.execution_stop = None;
        group.proposed_entries.clear();
        self.stats.executions_rolled_back += rolled_back as u64;
    }

    /// A snapshot replaces `log`'s state: its tentative executions go with the old state.
    pub(super) fn drop_tentative(&mut self, log: usize) {
        let group = &mut self.groups[log];
        self.stats.executions_rolled_back += group.executed.len() as u64;
        group.executed.clear();
        group.execution_stop = None;
        group.proposed_entries.clear();
    }

    /// `entry` of `log` committed: if it was executed already, its transaction commits and
    /// its results answer the waiting clients, without running anything again. Returns
    /// whether it was (otherwise the committed execution runs it).
    pub(super) fn commit_executed(&mut self, log: usize, entry: &Entry, out: &mut Outbox<Message>) -> bool {
        let group = &mut self.groups[log];
        match group.state.first_tentative() {
            Some((index, term)) if index == entry.index && term == entry.term => {}
            Some((index, _)) if index <= entry.index => {
                // Cannot happen (committed entries are never replaced); recover by running
                // it at commit.
                debug_assert!(false, "log {log}: entry {} committed unlike its execution", entry.index);
                self.roll_back(log, index, false);
                return false;
            }
            _ => return false,
        }
        group.state.commit_tentative();
        let executed = group.executed.pop_front().expect("one result list per tentative entry");
        group.applied_index = entry.index;
        self.applied_since_snapshot += 1;
        self.stats.executions_committed += 1;
        for Executed { client, seq, result, outcomes } in executed {
            self.count_result(result);
            let group = &mut self.groups[log];
            if group.proposed.get(&client).is_some_and(|&proposed| proposed <= seq) {
                group.proposed.remove(&client);
            }
            let Some(waiter) = group.waiters.remove(&(client, seq)) else { continue };
            complete_waiter(
                group,
                waiter,
                result,
                Some(outcomes),
                out,
                &mut self.step_results,
                &mut self.stats,
            );
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(seq: u64) -> Proposal {
        Proposal { client: SessionId::Replica(7), seq, commands: Vec::new(), step: None, sent_at_index: 0 }
    }

    fn kept(entries: &[(u64, u64)]) -> VecDeque<ProposedEntry> {
        entries
            .iter()
            .map(|&(index, term)| ProposedEntry { index, term, proposals: vec![proposal(index)] })
            .collect()
    }

    /// Only the entry proposed at that index and term gives its kept proposals: older ones go,
    /// and one the log replaced (another term at its index) is never executed from the copy.
    #[test]
    fn kept_proposals_are_taken_only_for_their_own_entry() {
        let mut queue = kept(&[(3, 1), (4, 1), (6, 1)]);
        assert_eq!(take_proposed(&mut queue, 4, 1), Some(vec![proposal(4)]), "3 is dropped, 4 taken");
        assert_eq!(take_proposed(&mut queue, 5, 1), None, "5 was not proposed here");
        assert_eq!(queue.len(), 1, "6 is kept for later");
        assert_eq!(take_proposed(&mut queue, 6, 2), None, "entry 6 of term 2 replaced the one of term 1");
        assert!(queue.is_empty());
    }

    /// Kept proposals run early only as a decoded entry would: not a transaction step.
    #[test]
    fn kept_proposals_with_a_step_wait_for_the_commit() {
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryNormal);
        entry.data = EntryBatch { proposals: vec![proposal(1)] }.to_bytes();
        assert_eq!(runs_early(&entry, Some(vec![proposal(1)])), Some(vec![proposal(1)]));
        assert_eq!(runs_early(&entry, None), Some(vec![proposal(1)]), "decoded when not kept");
        let step = Step::Finish { txn: TxnId { origin: 0, number: 1 }, outcomes: vec![], logs: vec![] };
        let with_step = Proposal { step: Some(step), ..proposal(1) };
        assert_eq!(runs_early(&entry, Some(vec![with_step])), None);
        entry.set_entry_type(EntryType::EntryConfChangeV2);
        assert_eq!(runs_early(&entry, Some(vec![proposal(1)])), None);
    }
}
