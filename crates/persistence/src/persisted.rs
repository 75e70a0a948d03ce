//! What a protocol core gives its append-only file, for runtimes that drive the core without
//! the server (the simulator): which keys a message touches, its unkeyed records, how its
//! records load back. The server's `ServedReplica` answers the same questions with the same
//! functions ([`crate::hermes`], [`crate::craq`], [`crate::zab`]).

use chorus_core::{Key, Replica};
use chorus_craq::Craq;
use chorus_hermes::Hermes;
use chorus_zab::Zab;

use crate::Durable;

pub trait Persisted: Durable + Replica + Sized {
    /// Whether a node restarted with its data still rejoins through the membership service
    /// (ZAB: its recovery must run in a new epoch). Hermes and CRAQ come back as the member
    /// they were.
    const REJOINS_WITH_DATA: bool = false;
    /// The keys whose durable state `message` carries or answers for.
    fn message_keys(_message: &Self::Message, _keys: &mut Vec<Key>) {}
    /// Records of unkeyed state changed since the last call (ZAB's history).
    fn take_log_records(&mut self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// Load `records` (oldest first) into a replica that has not started; the number of
    /// keys. `seq_floor`: where a restarted CRAQ or ZAB numbers its updates from (above
    /// every number an earlier run used).
    fn restore_records(&mut self, records: Vec<Vec<u8>>, seq_floor: u64) -> anyhow::Result<usize>;
}

impl Durable for Hermes {
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        crate::hermes::record(self, keys)
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.written_keys()
    }
    fn holds_all_data(&self) -> bool {
        self.is_caught_up()
    }
}

impl Persisted for Hermes {
    fn message_keys(message: &chorus_hermes::Message, keys: &mut Vec<Key>) {
        crate::hermes::message_keys(message, keys);
    }
    fn restore_records(&mut self, records: Vec<Vec<u8>>, _seq_floor: u64) -> anyhow::Result<usize> {
        crate::hermes::restore(self, records)
    }
}

impl Durable for Craq {
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        crate::craq::record(self, keys)
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.written_keys()
    }
    fn holds_all_data(&self) -> bool {
        self.is_caught_up()
    }
}

impl Persisted for Craq {
    fn message_keys(message: &chorus_craq::Message, keys: &mut Vec<Key>) {
        crate::craq::message_keys(message, keys);
    }
    fn restore_records(&mut self, records: Vec<Vec<u8>>, seq_floor: u64) -> anyhow::Result<usize> {
        crate::craq::restore(self, records, seq_floor)
    }
}

/// ZAB's keys are logged through its history, not per key: no keyed records.
impl Durable for Zab {
    fn durable_record(&self, _keys: &[Key]) -> Option<Vec<u8>> {
        None
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.keys().cloned().collect()
    }
    fn holds_all_data(&self) -> bool {
        self.is_caught_up()
    }
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        Zab::snapshot_header(self).iter().map(crate::encode).collect()
    }
    fn snapshot_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        Zab::snapshot_record(self, keys).map(|record| crate::encode(&record))
    }
}

impl Persisted for Zab {
    const REJOINS_WITH_DATA: bool = true;
    fn take_log_records(&mut self) -> Vec<Vec<u8>> {
        self.take_durable().iter().map(crate::encode).collect()
    }
    fn restore_records(&mut self, records: Vec<Vec<u8>>, seq_floor: u64) -> anyhow::Result<usize> {
        crate::zab::restore(self, records, seq_floor)
    }
}
