//! `membership.log`: the membership node's Raft records (hard state, entries) as checksummed
//! frames appended to one file of a [`Storage`], synced before the turn's messages leave.
//! The server keeps it in the data directory; the simulator on its disk, which tears what was
//! not synced at a crash and corrupts synced sectors.

use bytes::BytesMut;
use chorus_core::codec::DecodeError;
use chorus_storage::Storage;

use crate::message::{decode_records, encode_records};
use crate::node::PersistRecord;

pub const MEMBERSHIP_LOG: &str = "membership.log";

/// Why a membership log cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A frame that fails its checksum or does not decode, other than a torn last one: the
    /// node must not start on a log that may have lost a vote.
    #[error("{path} is corrupt ({source}); refusing to start on it")]
    Corrupt { path: String, source: DecodeError },
}

/// The log file on some storage.
pub struct MembershipLog<S: Storage> {
    storage: S,
}

impl<S: Storage> MembershipLog<S> {
    /// Open the log and read back every record a previous incarnation persisted. A torn last
    /// frame (a crash mid-append, never acknowledged) is cut; anything else damaged refuses.
    pub fn open(mut storage: S) -> Result<(MembershipLog<S>, Vec<PersistRecord>), LogError> {
        let path = storage.describe(MEMBERSHIP_LOG);
        let io = |source| LogError::Io { path: path.clone(), source };
        let bytes = storage.read(MEMBERSHIP_LOG).map_err(io)?.unwrap_or_default();
        let (records, valid_bytes) =
            decode_records(&bytes).map_err(|source| LogError::Corrupt { path: path.clone(), source })?;
        if valid_bytes < bytes.len() {
            storage.truncate(MEMBERSHIP_LOG, valid_bytes as u64).map_err(io)?;
            storage.sync(MEMBERSHIP_LOG).map_err(io)?;
        }
        Ok((MembershipLog { storage }, records))
    }

    /// Append `records` (not durable until [`MembershipLog::sync`]).
    pub fn append(&mut self, records: &[PersistRecord]) -> std::io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut bytes = BytesMut::new();
        encode_records(records, &mut bytes);
        self.storage.append(MEMBERSHIP_LOG, &bytes)
    }

    pub fn sync(&mut self) -> std::io::Result<()> {
        self.storage.sync(MEMBERSHIP_LOG)
    }

    pub fn describe(&self) -> String {
        self.storage.describe(MEMBERSHIP_LOG)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_storage::SimDisk;

    fn records() -> Vec<PersistRecord> {
        vec![
            PersistRecord::HardState { term: 2, vote: 1, commit: 0 },
            PersistRecord::HardState { term: 3, vote: 2, commit: 1 },
        ]
    }

    #[test]
    fn synced_records_survive_a_crash_and_a_torn_tail_is_cut() {
        let mut torn_or_lost = 0;
        for seed in 0..40 {
            let disk = SimDisk::new();
            let (mut log, _) = MembershipLog::open(disk.clone()).unwrap();
            log.append(&records()).unwrap();
            log.sync().unwrap();
            log.append(&records()).unwrap(); // Not synced: the crash may lose or tear it.
            disk.crash(seed);
            let (_, recovered) = MembershipLog::open(disk.clone()).unwrap();
            assert!(recovered.len() >= 2 && recovered.len() <= 4, "seed {seed}: {recovered:?}");
            assert_eq!(recovered[..2], records()[..]);
            torn_or_lost += (recovered.len() < 4) as u32;
            // The cut tail is gone for good: appends continue after the valid records.
            let (mut log, _) = MembershipLog::open(disk.clone()).unwrap();
            log.append(&records()).unwrap();
            log.sync().unwrap();
            let (_, again) = MembershipLog::open(disk).unwrap();
            assert_eq!(again.len(), recovered.len() + 2, "seed {seed}");
        }
        assert!(torn_or_lost > 10);
    }

    #[test]
    fn a_damaged_record_followed_by_others_refuses_the_start() {
        let disk = SimDisk::new();
        let (mut log, _) = MembershipLog::open(disk.clone()).unwrap();
        log.append(&records()).unwrap();
        log.append(&records()).unwrap();
        log.sync().unwrap();
        let mut bytes = disk.read(MEMBERSHIP_LOG).unwrap().unwrap();
        bytes[12] ^= 0x10;
        let mut writer = disk.clone();
        writer.write_at(MEMBERSHIP_LOG, 0, &bytes).unwrap();
        assert!(matches!(MembershipLog::open(disk), Err(LogError::Corrupt { .. })));
    }
}
