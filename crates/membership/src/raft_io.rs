//! The raft-rs plumbing the membership node and the metadata service share: restoring an
//! in-memory Raft log from the records a previous incarnation persisted, the Ready cycle
//! (what to send, what to persist, what was committed), and what a crash would leave on disk.

use raft::prelude::{ConfState, Entry, HardState, Message};
use raft::storage::MemStorage;
use raft::{Config, RawNode};

use crate::node::PersistRecord;

/// A Raft node whose voters are `voters` (Raft ids, non-zero), its log and hard state
/// rebuilt from `records` (all of them, in order). Committed entries are delivered again by
/// the first Ready, so the state machine is rebuilt by applying them.
pub(crate) fn restore(
    me: u64,
    index: usize,
    voters: Vec<u64>,
    records: &[PersistRecord],
) -> RawNode<MemStorage> {
    let storage = MemStorage::new_with_conf_state(ConfState::from((voters, vec![])));
    for record in records {
        match record {
            PersistRecord::HardState { term, vote, commit } => {
                let hard_state =
                    HardState { term: *term, vote: *vote, commit: *commit, ..Default::default() };
                storage.wl().set_hardstate(hard_state);
            }
            PersistRecord::Entries(entries) => {
                storage.wl().append(entries).expect("persisted entries are contiguous");
            }
        }
    }
    // raft-rs draws election timeouts from a thread-local RNG, which would make the
    // simulator non-deterministic. A fixed, per-node timeout (min = max - 1) keeps it
    // deterministic, and staggering it by node index avoids endless split votes.
    let election_tick = 10 + 3 * index;
    let raft_config = Config {
        id: me,
        election_tick,
        heartbeat_tick: 3,
        min_election_tick: election_tick,
        max_election_tick: election_tick + 1,
        pre_vote: true,
        check_quorum: true,
        ..Default::default()
    };
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    RawNode::new(&raft_config, storage, &logger).expect("valid raft config")
}

/// What one Ready cycle produced besides the records to persist.
#[derive(Default)]
pub(crate) struct Readied {
    /// To send once `persist` is durable, in order.
    pub messages: Vec<Message>,
    /// Newly committed entries, in log order, to apply.
    pub committed: Vec<Entry>,
}

/// The raft-rs 0.7 Ready cycle: send, persist, apply, advance, then the light ready.
pub(crate) fn drive(raft: &mut RawNode<MemStorage>, persist: &mut Vec<PersistRecord>) -> Readied {
    let mut out = Readied::default();
    if !raft.has_ready() {
        return out;
    }
    let mut ready = raft.ready();
    out.messages.extend(ready.take_messages());
    out.committed.extend(ready.take_committed_entries());
    let store = raft.raft.raft_log.store.clone();
    if !ready.entries().is_empty() {
        store.wl().append(ready.entries()).expect("append to the in-memory log");
        persist.push(PersistRecord::Entries(ready.entries().clone()));
    }
    if let Some(hard_state) = ready.hs() {
        store.wl().set_hardstate(hard_state.clone());
        persist.push(hard_state_record(hard_state));
    }
    out.messages.extend(ready.take_persisted_messages());
    let mut light = raft.advance(ready);
    if let Some(commit) = light.commit_index() {
        store.wl().mut_hard_state().set_commit(commit);
        persist.push(hard_state_record(store.rl().hard_state()));
    }
    out.messages.extend(light.take_messages());
    out.committed.extend(light.take_committed_entries());
    raft.advance_apply();
    out
}

fn hard_state_record(hard_state: &HardState) -> PersistRecord {
    PersistRecord::HardState { term: hard_state.term, vote: hard_state.vote, commit: hard_state.commit }
}

/// What this node would find on disk if it crashed now: the Raft hard state and log.
pub(crate) fn durable_records(raft: &RawNode<MemStorage>) -> Vec<PersistRecord> {
    use raft::Storage as _;
    let store = &raft.raft.raft_log.store;
    let hard_state = store.rl().hard_state().clone();
    let first = store.first_index().expect("in-memory storage");
    let last = store.last_index().expect("in-memory storage");
    let entries = if last >= first {
        store.entries(first, last + 1, None, raft::GetEntriesContext::empty(false)).expect("stored entries")
    } else {
        Vec::new()
    };
    vec![PersistRecord::Entries(entries), hard_state_record(&hard_state)]
}
