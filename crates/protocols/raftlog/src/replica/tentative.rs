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

/// Why an entry must wait for its commit to run.
fn runs_only_at_commit(entry: &Entry) -> Option<Vec<Proposal>> {
    if entry.get_entry_type() != EntryType::EntryNormal {
        return None;
    }
    if entry.data.is_empty() {
        return Some(Vec::new()); // a leader's no-op
    }
    let batch = EntryBatch::decode_exact(entry.data.clone()).ok()?;
    batch.proposals.iter().all(|proposal| proposal.step.is_none()).then_some(batch.proposals)
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
            let Some(proposals) = runs_only_at_commit(entry) else {
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
        self.stats.executions_rolled_back += rolled_back as u64;
    }

    /// A snapshot replaces `log`'s state: its tentative executions go with the old state.
    pub(super) fn drop_tentative(&mut self, log: usize) {
        let group = &mut self.groups[log];
        self.stats.executions_rolled_back += group.executed.len() as u64;
        group.executed.clear();
        group.execution_stop = None;
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
