//! Decoupled execution (Cyclone §3.1), an option (`RaftLogConfig::decoupled`): the leader
//! executes each client command when it proposes it, on a speculative copy (an overlay of
//! the writes of its entries in flight over its applied state), and holds the result until
//! the entry commits; losing leadership (or the term) rolls the overlay back.
//!
//! The state machine stays the source of truth: every replica, the leader included, still
//! applies committed entries in order, and the leader releases a speculative result only if
//! the committed execution produced the same outcomes (counted as confirmed; a mismatch
//! would be a bug and is counted and answered from the committed execution instead). In a
//! key-value map execution is cheap, so the point here is the mechanism (execute early,
//! release at commit, roll back on a lost leadership), not a speedup.
//!
//! Speculation needs the leader to know every entry ahead of its own: it starts only when
//! the leader has applied everything in its log and committed an entry of its term, and
//! stops (until the pipeline drains again) at an entry it cannot predict: a transaction
//! step, which Cyclone also runs coupled ("for distributed transactions, we turn off
//! decoupled execution").

use chorus_core::{Command, CommandError, Key, Outcome, Value};
use rustc_hash::FxHashMap;

use crate::message::{Proposal, SessionId};
use crate::state::LogState;

#[derive(Debug, Default)]
pub(crate) struct Speculation {
    pub term: u64,
    /// Writes of entries proposed and not yet applied: `None` value = deleted.
    overlay: FxHashMap<Key, Option<Value>>,
    /// The last sequence number speculated per client.
    sessions: FxHashMap<SessionId, u64>,
    /// Outcomes computed at proposal time, by `(client, seq)`.
    results: FxHashMap<(SessionId, u64), Vec<Outcome>>,
}

impl Speculation {
    pub(crate) fn new(term: u64) -> Speculation {
        Speculation { term, ..Speculation::default() }
    }

    /// Speculative results not yet confirmed by a commit: what a rollback throws away.
    pub(crate) fn pending(&self) -> usize {
        self.results.len()
    }

    /// Whether `proposal`, to be applied at `index` at the latest, can be speculated:
    /// transaction steps cannot, nor a proposal whose session may expire before `index`.
    pub(crate) fn predictable(state: &LogState, proposal: &Proposal, index: u64) -> bool {
        proposal.step.is_none() && state.clear_of_expiry(proposal, index)
    }

    /// Execute `proposal` on the overlay, exactly as `LogState::apply` will at commit.
    pub(crate) fn execute(&mut self, state: &LogState, proposal: &Proposal) {
        let last_seq =
            self.sessions.get(&proposal.client).copied().unwrap_or(0).max(state.last_seq(proposal.client));
        if proposal.seq <= last_seq {
            return; // a retry: the committed execution answers it from the session table
        }
        let mut outcomes = Vec::with_capacity(proposal.commands.len());
        for command in &proposal.commands {
            let key = command.key();
            if state.is_locked(key) {
                outcomes.push(Outcome::Error(CommandError::Locked));
                continue;
            }
            let current = match self.overlay.get(key) {
                Some(value) => value.clone(),
                None => state.get(key).cloned(),
            };
            let outcome = match command {
                Command::Read { .. } => Outcome::Value(current),
                Command::Write { value, .. } => {
                    self.overlay.insert(key.clone(), value.clone());
                    Outcome::Written
                }
                Command::Rmw { op, .. } => {
                    let effect = op.apply(current.as_ref());
                    if let Some(write) = effect.write {
                        self.overlay.insert(key.clone(), write);
                    }
                    effect.outcome
                }
            };
            outcomes.push(outcome);
        }
        self.sessions.insert(proposal.client, proposal.seq);
        self.results.insert((proposal.client, proposal.seq), outcomes);
    }

    /// The speculative outcomes of `(client, seq)`, now that it committed.
    pub(crate) fn take(&mut self, client: SessionId, seq: u64) -> Option<Vec<Outcome>> {
        self.results.remove(&(client, seq))
    }

    /// Everything in flight applied: the overlay is now the applied state.
    pub(crate) fn drained(&mut self) {
        self.overlay.clear();
        self.results.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::RmwOp;

    #[test]
    fn speculation_sees_earlier_entries_in_flight_and_matches_the_commit() {
        let key = Bytes::from_static(b"k");
        let incr = |seq| Proposal {
            client: SessionId::Replica(5),
            seq,
            commands: vec![Command::Rmw { key: key.clone(), op: RmwOp::IncrementBy(2) }],
            step: None,
            sent_at_index: 0,
        };
        let mut state = LogState::default();
        let mut spec = Speculation::new(3);
        spec.execute(&state, &incr(1));
        spec.execute(&state, &incr(2));
        spec.execute(&state, &incr(2)); // a retry is not speculated twice
        for seq in 1..=2 {
            state.apply(&incr(seq), true);
            assert_eq!(
                spec.take(SessionId::Replica(5), seq),
                Some(state.session(SessionId::Replica(5)).unwrap().outcomes.clone())
            );
        }
        assert_eq!(spec.pending(), 0);
    }
}
