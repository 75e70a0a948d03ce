//! A scratch directory under the system temp dir, removed when dropped.

use std::path::PathBuf;

pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `chorus-<tag>-<pid>`, emptied first.
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("chorus-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("CHORUS_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
