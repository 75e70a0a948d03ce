//! Per-key chain state: the clean version, the dirty versions above it, and this replica's
//! client requests on the key.

use std::collections::{BTreeMap, VecDeque};

use chorus_core::{ClientRequestId, Command, NodeId, Outcome, Time, Value};

/// One version of a key, not yet known to be committed (dirty).
#[derive(Clone, Debug)]
pub struct Version {
    pub version: u64,
    pub value: Option<Value>,
    /// The replica whose client issued the update, and its number there.
    pub origin: NodeId,
    pub seq: u64,
    /// What the client is told once the version is clean (computed at the head for RMWs).
    pub outcome: Outcome,
}

/// Everything a replica knows about one key.
#[derive(Debug, Default)]
pub struct KeyEntry {
    /// The newest version known to be committed, and its value. Version 0 is "never written".
    pub clean_version: u64,
    pub clean_value: Option<Value>,
    /// Versions `clean_version + 1 ..= latest`, contiguous and in order. A replica accepts
    /// version `v` only on top of `v - 1`, so holding a version means holding every earlier
    /// one: an RMW computed at the head on version `v - 1` can never commit without it.
    pub dirty: VecDeque<Version>,
    /// When the dirty versions go down the chain again if no ACK came back.
    pub retransmit_at: Option<Time>,
    /// This replica's client requests on the key that have not started, in arrival order.
    pub waiting: VecDeque<Waiter>,
    /// This replica's updates of the key forwarded and not yet answered.
    pub updates_in_flight: u32,
    /// This replica's reads of the key waiting for the tail's committed version.
    pub reads_in_flight: u32,
}

impl KeyEntry {
    pub fn latest_version(&self) -> u64 {
        self.dirty.back().map_or(self.clean_version, |version| version.version)
    }

    pub fn latest_value(&self) -> Option<&Value> {
        match self.dirty.back() {
            Some(version) => version.value.as_ref(),
            None => self.clean_value.as_ref(),
        }
    }

    pub fn is_clean(&self) -> bool {
        self.dirty.is_empty()
    }

    /// The value of `version`, if this replica still holds it. A version below the clean one
    /// was overwritten by a committed successor and is gone.
    pub fn value_of(&self, version: u64) -> Option<Option<&Value>> {
        if version == self.clean_version {
            return Some(self.clean_value.as_ref());
        }
        let first = self.dirty.front()?.version;
        let index = version.checked_sub(first)? as usize;
        self.dirty.get(index).map(|found| found.value.as_ref())
    }

    /// Nothing dirty, nothing waiting, nothing in flight.
    pub fn is_quiet(&self) -> bool {
        self.dirty.is_empty()
            && self.waiting.is_empty()
            && self.updates_in_flight == 0
            && self.reads_in_flight == 0
    }
}

/// A client request of this replica that has not started (per-key FIFO, like Hermes: a read
/// never overtakes an earlier update of the same key from the same replica, and an update
/// never overtakes an earlier read).
#[derive(Debug)]
pub struct Waiter {
    pub request: ClientRequestId,
    pub command: Command,
}

/// What replicas remember about one origin's updates, so a retransmitted forward is executed
/// once: every `seq` below `done_below` is answered at the origin; `seen` holds the numbers
/// at or above it that this replica has seen in the chain (`answer: None`) or, at the head,
/// answered without a version (`Some(outcome)`, an RMW that decided not to write).
#[derive(Debug, Default)]
pub struct Session {
    pub done_below: u64,
    /// The smallest `seq >= done_below` not in `seen`: the head executes the origin's updates
    /// in `seq` order, so two pipelined updates of one key keep their order.
    pub next: u64,
    pub seen: BTreeMap<u64, Seen>,
}

/// One update of an origin that this replica has seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub answer: Option<Outcome>,
    /// `key_hash` of the update's key: a donor hands a joiner only the entries of the keys in
    /// the chunk it copies, so the joiner never believes it saw an update it does not hold.
    pub key_hash: u64,
}

/// FNV-1a of a key: every replica splits keys into the same copy chunks with it.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    hash
}

/// The copy chunk (of `buckets_total`) a key belongs to.
pub fn key_bucket(key: &[u8], buckets_total: u32) -> u32 {
    bucket_of_hash(key_hash(key), buckets_total)
}

pub fn bucket_of_hash(hash: u64, buckets_total: u32) -> u32 {
    debug_assert!(buckets_total > 0);
    (hash % buckets_total as u64) as u32
}

impl Session {
    pub fn advance_done_below(&mut self, done_below: u64) {
        if done_below > self.done_below {
            self.done_below = done_below;
            self.seen = self.seen.split_off(&done_below);
            self.next = self.next.max(done_below);
            self.skip_seen();
        }
    }

    pub fn record(&mut self, seq: u64, answer: Option<Outcome>, key_hash: u64) {
        if seq >= self.done_below {
            self.seen.insert(seq, Seen { answer, key_hash });
            self.skip_seen();
        }
    }

    pub fn is_duplicate(&self, seq: u64) -> bool {
        seq < self.done_below || self.seen.contains_key(&seq)
    }

    fn skip_seen(&mut self) {
        while self.seen.contains_key(&self.next) {
            self.next += 1;
        }
    }
}
