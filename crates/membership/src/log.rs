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
    /// The frame at byte `at` does not end inside the file, but a whole, valid frame lies
    /// after its start: it is not a torn tail but a damaged length, and cutting there would
    /// drop the records after it (a vote among them).
    #[error("{path}: the record at byte {at} is damaged and records follow it; refusing to start on it")]
    Damaged { path: String, at: usize },
}

/// The log file on some storage.
pub struct MembershipLog<S: Storage> {
    storage: S,
    /// The file: [`MEMBERSHIP_LOG`], or the metadata service's [`crate::METADATA_LOG`].
    name: &'static str,
}

impl<S: Storage> MembershipLog<S> {
    /// Open the log and read back every record a previous incarnation persisted. A torn last
    /// frame (a crash mid-append, never acknowledged) is cut; anything else damaged refuses.
    pub fn open(storage: S) -> Result<(MembershipLog<S>, Vec<PersistRecord>), LogError> {
        MembershipLog::open_named(storage, MEMBERSHIP_LOG)
    }

    /// [`MembershipLog::open`] on the file `name`: another Raft group's records.
    pub fn open_named(
        mut storage: S,
        name: &'static str,
    ) -> Result<(MembershipLog<S>, Vec<PersistRecord>), LogError> {
        let path = storage.describe(name);
        let io = |source| LogError::Io { path: path.clone(), source };
        let Some(bytes) = storage.read(name).map_err(io)? else {
            // Created at once (private, like every data file), not at the first vote.
            storage.append(name, &[]).map_err(io)?;
            storage.sync(name).map_err(io)?;
            return Ok((MembershipLog { storage, name }, Vec::new()));
        };
        let (records, valid_bytes) =
            decode_records(&bytes).map_err(|source| LogError::Corrupt { path: path.clone(), source })?;
        if valid_bytes < bytes.len() && whole_frame_after(&bytes, valid_bytes) {
            return Err(LogError::Damaged { path: path.clone(), at: valid_bytes });
        }
        if valid_bytes < bytes.len() {
            storage.truncate(name, valid_bytes as u64).map_err(io)?;
            storage.sync(name).map_err(io)?;
        }
        Ok((MembershipLog { storage, name }, records))
    }

    /// Append `records` (not durable until [`MembershipLog::sync`]).
    pub fn append(&mut self, records: &[PersistRecord]) -> std::io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut bytes = BytesMut::new();
        encode_records(records, &mut bytes);
        self.storage.append(self.name, &bytes)
    }

    pub fn sync(&mut self) -> std::io::Result<()> {
        self.storage.sync(self.name)
    }

    pub fn describe(&self) -> String {
        self.storage.describe(self.name)
    }
}

/// Whether a whole frame of this log (right kind, checksum matching) starts somewhere after
/// `at`. A torn tail is a prefix of one frame (the frames before it in the same append were
/// whole and have been read), so it holds none; a frame whose length was damaged is followed
/// by the rest of the log. Read only at start-up, and only when the log ends early.
fn whole_frame_after(bytes: &[u8], at: usize) -> bool {
    use chorus_core::codec::{FRAME_HEADER_BYTES, WIRE_VERSION};
    let whole_at = |start: usize| {
        let header = &bytes[start..start + FRAME_HEADER_BYTES];
        let length = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let Some(end) = (start + 4).checked_add(length) else { return false };
        if length < FRAME_HEADER_BYTES - 4 || end > bytes.len() {
            return false;
        }
        let (version, kind) = (header[4], header[5]);
        let expected = u32::from_le_bytes(header[6..10].try_into().expect("4 bytes"));
        version == WIRE_VERSION
            && kind == crate::message::PERSIST_FRAME_KIND
            && chorus_storage::checksum(&[&[version, kind], &bytes[start + FRAME_HEADER_BYTES..end]])
                == expected
    };
    (at + 1..bytes.len().saturating_sub(FRAME_HEADER_BYTES - 1)).any(whole_at)
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

    /// A damaged length makes a frame look longer than the file, as a torn one does; cutting
    /// it would silently drop the votes after it.
    #[test]
    fn a_damaged_length_followed_by_records_refuses_the_start() {
        let disk = SimDisk::new();
        let (mut log, _) = MembershipLog::open(disk.clone()).unwrap();
        log.append(&records()).unwrap();
        log.append(&records()).unwrap();
        log.sync().unwrap();
        let mut bytes = disk.read(MEMBERSHIP_LOG).unwrap().unwrap();
        bytes[2] ^= 0x01; // the first frame's length, now 64 KiB longer than the log
        let mut writer = disk.clone();
        writer.write_at(MEMBERSHIP_LOG, 0, &bytes).unwrap();
        assert!(matches!(MembershipLog::open(disk), Err(LogError::Damaged { at: 0, .. })));
    }
}
