//! Storage for process-level crash tests: real files, but every write waits in the process's
//! memory until its file is synced. Killing the process (SIGKILL) then loses exactly the
//! unsynced writes, as a power cut would lose what the page cache held, while everything
//! synced is on disk. Selected by a hidden setting (`raftlog_storage = "crash-test"`); never a
//! production choice.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::{FileStorage, Storage};

#[derive(Clone)]
enum Pending {
    Append(Vec<u8>),
    WriteAt(u64, Vec<u8>),
    Truncate(u64),
}

struct Inner {
    files: FileStorage,
    pending: BTreeMap<String, Vec<Pending>>,
}

/// A handle; clones share the pending writes.
#[derive(Clone)]
pub struct CrashTestStorage {
    inner: Arc<Mutex<Inner>>,
}

impl CrashTestStorage {
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<CrashTestStorage> {
        let files = FileStorage::open(dir)?;
        Ok(CrashTestStorage { inner: Arc::new(Mutex::new(Inner { files, pending: BTreeMap::new() })) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("crash-test storage lock")
    }

    fn push(&self, name: &str, write: Pending) {
        self.lock().pending.entry(name.to_string()).or_default().push(write);
    }
}

fn apply(bytes: &mut Vec<u8>, write: &Pending) {
    match write {
        Pending::Append(data) => bytes.extend_from_slice(data),
        Pending::WriteAt(offset, data) => {
            let (start, end) = (*offset as usize, *offset as usize + data.len());
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[start..end].copy_from_slice(data);
        }
        Pending::Truncate(len) => bytes.resize(*len as usize, 0),
    }
}

impl Storage for CrashTestStorage {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let inner = self.lock();
        let on_disk = inner.files.read(name)?;
        let pending = inner.pending.get(name);
        if on_disk.is_none() && pending.is_none() {
            return Ok(None);
        }
        let mut bytes = on_disk.unwrap_or_default();
        for write in pending.into_iter().flatten() {
            apply(&mut bytes, write);
        }
        Ok(Some(bytes))
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.push(name, Pending::Append(data.to_vec()));
        Ok(())
    }

    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        self.push(name, Pending::WriteAt(offset, data.to_vec()));
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.push(name, Pending::Truncate(len));
        Ok(())
    }

    /// Only now do the writes reach the file, followed by a real `fdatasync`.
    fn sync(&mut self, name: &str) -> io::Result<()> {
        let mut inner = self.lock();
        let writes = inner.pending.remove(name).unwrap_or_default();
        for write in &writes {
            match write {
                Pending::Append(data) => inner.files.append(name, data)?,
                Pending::WriteAt(offset, data) => inner.files.write_at(name, *offset, data)?,
                Pending::Truncate(len) => inner.files.truncate(name, *len)?,
            }
        }
        inner.files.sync(name)
    }

    fn replace(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut inner = self.lock();
        inner.pending.remove(name);
        inner.files.replace(name, data)
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        let mut inner = self.lock();
        inner.pending.remove(name);
        inner.files.remove(name)
    }

    fn describe(&self, name: &str) -> String {
        self.lock().files.describe(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_stay_in_memory_until_synced() {
        let dir = std::env::temp_dir().join(format!("chorus-crash-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut storage = CrashTestStorage::open(&dir).unwrap();
        storage.append("log", b"one").unwrap();
        storage.sync("log").unwrap();
        storage.append("log", b"two").unwrap();
        assert_eq!(storage.read("log").unwrap().unwrap(), b"onetwo");
        // What a killed process leaves: the file as synced.
        assert_eq!(std::fs::read(dir.join("log")).unwrap(), b"one");
        drop(storage);
        let reopened = CrashTestStorage::open(&dir).unwrap();
        assert_eq!(reopened.read("log").unwrap().unwrap(), b"one");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
