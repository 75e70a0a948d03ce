//! Files in a directory of the real file system.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::Storage;

/// A directory of real files. Open files are kept, so appends and syncs cost no `open`.
#[derive(Debug)]
pub struct FileStorage {
    dir: PathBuf,
    open: Vec<(String, File)>,
}

impl FileStorage {
    /// Use `dir`, creating it (mode 0700) if missing. Files it creates are mode 0600: they
    /// hold votes, logs and data only this user may read.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<FileStorage> {
        let dir = dir.into();
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir)?;
        Ok(FileStorage { dir, open: Vec::new() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&mut self, name: &str) -> io::Result<&mut File> {
        debug_assert!(!name.contains('/'), "plain file names only");
        let index = match self.open.iter().position(|(open, _)| open == name) {
            Some(index) => index,
            None => {
                let file = private().read(true).write(true).truncate(false).open(self.dir.join(name))?;
                self.open.push((name.to_string(), file));
                self.open.len() - 1
            }
        };
        Ok(&mut self.open[index].1)
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

/// Options that create a file readable and writable by this user only.
fn private() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.create(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

impl Storage for FileStorage {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let mut file = match File::open(self.dir.join(name)) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let file = self.file(name)?;
        file.seek(SeekFrom::End(0))?;
        file.write_all(data)
    }

    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file(name)?.write_all_at(data, offset)
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.file(name)?.set_len(len)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.file(name)?.sync_data()
    }

    fn replace(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut file = private().write(true).truncate(true).open(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        // The old handle points at the replaced inode: forget it.
        self.open.retain(|(open, _)| open != name);
        self.sync_dir()
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.open.retain(|(open, _)| open != name);
        match std::fs::remove_file(self.dir.join(name)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        self.sync_dir()
    }

    fn describe(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}
