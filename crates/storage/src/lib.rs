//! The storage under everything durable in Chorus: a directory of named files, written by
//! appending or at an offset, made durable by [`Storage::sync`], replaced whole and atomically
//! by [`Storage::replace`].
//!
//! Three implementations share the one contract:
//!
//! | type | what it is for | what a crash keeps |
//! |---|---|---|
//! | [`FileStorage`] | production | what was synced (`fdatasync`, or `fsync` of a rename's directory), and whatever the kernel happened to write back |
//! | [`SimDisk`] | the simulator | exactly what was synced; each file's unsynced writes are lost or torn at a crash, and a sector of synced data can be corrupted on demand |
//! | [`CrashTestStorage`] | process tests (`raftlog_storage = "crash-test"`, hidden) | only what was synced: unsynced writes live in the process's memory and die with it |
//!
//! [`StorageRegion`] puts a fixed-size memory region (`chorus_region::RegionMemory`) on a file of
//! any of them, so a region's flush is a sync and its crash behaviour is the storage's.

mod crash;
mod file;
mod region;
mod sim;

use std::io;

pub use crash::CrashTestStorage;
pub use file::FileStorage;
pub use region::StorageRegion;
pub use sim::{CrashReport, SimDisk, SECTOR_BYTES, SPARED_WRITES};

/// A directory of named files. Names are plain file names (no separators).
pub trait Storage {
    /// The whole file, or `None` if it does not exist.
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Append to the file, creating it if missing. Not durable until [`Storage::sync`].
    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Write at `offset`, extending the file (with zeros) if it is shorter. Not durable until
    /// [`Storage::sync`].
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Cut (or extend with zeros) the file to `len` bytes. Not durable until [`Storage::sync`].
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Make every write to the file so far durable (`fdatasync`).
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// Replace the file's contents with `data`, atomically and durably: after a crash it holds
    /// either the old contents or `data`, never a mix (temporary file, sync, rename, sync of
    /// the directory).
    fn replace(&mut self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Delete the file, durably (a missing file is no error): what a log rewrite leaves behind.
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// Where the file lives, for error messages.
    fn describe(&self, name: &str) -> String;
}

/// A boxed storage (a runtime choosing it at start) is one too.
impl<S: Storage + ?Sized> Storage for Box<S> {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        (**self).read(name)
    }
    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        (**self).append(name, data)
    }
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        (**self).write_at(name, offset, data)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        (**self).truncate(name, len)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        (**self).sync(name)
    }
    fn replace(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        (**self).replace(name, data)
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        (**self).remove(name)
    }
    fn describe(&self, name: &str) -> String {
        (**self).describe(name)
    }
}

/// The checksum durable records carry: CRC-32, as the wire format's frames do.
pub fn checksum(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksum_is_crc32_ieee() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(super::checksum(&[b"123456789"]), 0xCBF4_3926);
        assert_eq!(super::checksum(&[b"1234", b"56789"]), 0xCBF4_3926);
    }
}
