//! One physical log's state machine: the keys it owns and its at-most-once session table.
//!
//! Every replica applies the same committed entries in the same order to its copy, so every
//! copy holds the same keys and the same session table (Cyclone §3.4: "each execution core
//! independently enforces that accepted RPC calls from the same client bear increasing
//! sequence numbers", remembering the last sequence number and its result per client).

use chorus_core::{Command, Key, Outcome, Value};
use rustc_hash::FxHashMap;

use crate::message::Proposal;

/// What one client session last executed in this log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    pub last_seq: u64,
    /// The outcomes of `last_seq`'s commands, returned again to a retry.
    pub outcomes: Vec<Outcome>,
}

/// What applying a proposal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposalResult {
    /// First time this sequence number reached the log: its commands ran.
    Executed,
    /// A retry of the last executed sequence number: nothing ran; its saved outcomes stand.
    Duplicate,
    /// Older than the last executed sequence number of its client: nothing ran and the
    /// outcome is gone (Cyclone keeps only the last one per client).
    Stale { last_seq: u64 },
}

#[derive(Default, Debug)]
pub struct LogState {
    store: FxHashMap<Key, Value>,
    sessions: FxHashMap<u64, SessionRecord>,
}

impl LogState {
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.store.get(key)
    }

    pub fn key_count(&self) -> usize {
        self.store.len()
    }

    /// Every key present in this copy, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.store.keys()
    }

    pub fn session(&self, client: u64) -> Option<&SessionRecord> {
        self.sessions.get(&client)
    }

    /// The last sequence number `client` executed here (0: none).
    pub fn last_seq(&self, client: u64) -> u64 {
        self.sessions.get(&client).map_or(0, |record| record.last_seq)
    }

    /// Apply a committed proposal, at most once per `(client, seq)`. `dedupe: false` is the
    /// broken variant that executes every copy.
    pub fn apply(&mut self, proposal: &Proposal, dedupe: bool) -> ProposalResult {
        let last_seq = self.last_seq(proposal.client);
        if dedupe && proposal.seq == last_seq {
            return ProposalResult::Duplicate;
        }
        if dedupe && proposal.seq < last_seq {
            return ProposalResult::Stale { last_seq };
        }
        let outcomes = proposal.commands.iter().map(|command| self.execute(command)).collect();
        let seq = if dedupe { proposal.seq } else { proposal.seq.max(last_seq) };
        self.sessions.insert(proposal.client, SessionRecord { last_seq: seq, outcomes });
        ProposalResult::Executed
    }

    /// Run one command. Deterministic: RMWs go through `RmwOp::apply`, the only definition
    /// of their semantics.
    pub fn execute(&mut self, command: &Command) -> Outcome {
        match command {
            Command::Read { key } => Outcome::Value(self.store.get(key).cloned()),
            Command::Write { key, value } => {
                self.put(key, value.clone());
                Outcome::Written
            }
            Command::Rmw { key, op } => {
                let effect = op.apply(self.store.get(key));
                if let Some(write) = effect.write {
                    self.put(key, write);
                }
                effect.outcome
            }
        }
    }

    fn put(&mut self, key: &Key, value: Option<Value>) {
        match value {
            Some(value) => {
                self.store.insert(key.clone(), value);
            }
            None => {
                self.store.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::RmwOp;

    fn incr(client: u64, seq: u64) -> Proposal {
        Proposal {
            client,
            seq,
            commands: vec![Command::Rmw { key: Bytes::from_static(b"k"), op: RmwOp::IncrementBy(1) }],
        }
    }

    #[test]
    fn a_retried_sequence_number_returns_the_saved_result_without_running_again() {
        let mut state = LogState::default();
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Executed);
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Duplicate);
        assert_eq!(state.session(7).unwrap().outcomes, vec![Outcome::Integer(1)]);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"1")), "the retry did not run");
        // Another client's first request runs.
        assert_eq!(state.apply(&incr(8, 1), true), ProposalResult::Executed);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
    }

    #[test]
    fn a_stale_sequence_number_is_refused() {
        let mut state = LogState::default();
        state.apply(&incr(7, 1), true);
        state.apply(&incr(7, 2), true);
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Stale { last_seq: 2 });
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
        assert_eq!(state.session(7).unwrap().last_seq, 2, "a stale request changes nothing");
    }

    #[test]
    fn without_dedupe_a_retry_runs_twice() {
        let mut state = LogState::default();
        state.apply(&incr(7, 1), false);
        state.apply(&incr(7, 1), false);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
    }

    #[test]
    fn writes_deletes_and_rmws_share_one_register_per_key() {
        let mut state = LogState::default();
        let key = Bytes::from_static(b"k");
        assert_eq!(
            state.execute(&Command::Write { key: key.clone(), value: Some(Bytes::from_static(b"9")) }),
            Outcome::Written
        );
        assert_eq!(
            state.execute(&Command::Rmw { key: key.clone(), op: RmwOp::Swap(None) }),
            Outcome::Value(Some(Bytes::from_static(b"9")))
        );
        assert_eq!(state.execute(&Command::Read { key }), Outcome::Value(None));
        assert_eq!(state.key_count(), 0);
    }
}
