//! Files a node creates: private directories, unpredictable temporary ones, and secrets.
//!
//! A node's data directory holds its Raft vote and log and, for the chain store, the whole
//! database: it is created (or tightened) to mode 0700, so only the node's user can read it.
//! Temporary directories get a random name and are created exclusively (never followed
//! through a symlink someone planted in /tmp).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use tracing::info;

/// Create `dir` (and its parents) if missing and make it private to this user (0700).
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let metadata = std::fs::metadata(dir).with_context(|| format!("cannot stat {}", dir.display()))?;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} private (mode {mode:o})", dir.display()))?;
            info!(dir = %dir.display(), "data directory was mode {mode:o}; made it 0700");
        }
    }
    Ok(())
}

/// A new directory under the system temp dir, `<prefix>-<128 random bits>`, mode 0700,
/// created exclusively: it did not exist before, so nobody else chose it.
pub fn create_temp_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    create_temp_dir_in(&std::env::temp_dir(), prefix)
}

/// [`create_temp_dir`] under `base` (e.g. /dev/shm).
pub fn create_temp_dir_in(base: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    for _ in 0..8 {
        let dir = base.join(format!("{prefix}-{}", random_hex(16)?));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error).with_context(|| format!("cannot create {}", dir.display())),
        }
    }
    anyhow::bail!("cannot create a fresh temporary directory under {}", base.display())
}

/// `bytes` random bytes from the operating system, as lowercase hex.
pub fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut buf))
        .context("cannot read random bytes from /dev/urandom")?;
    Ok(buf.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Open `path` for appending, creating it readable and writable by this user only (0600).
pub fn open_private_append(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_are_private_and_temporary_ones_unpredictable() {
        let first = create_temp_dir("chorus-files-test").unwrap();
        let second = create_temp_dir("chorus-files-test").unwrap();
        assert_ne!(first, second);
        assert_eq!(mode(&first), 0o700);
        let nested = first.join("a/b");
        create_private_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o700);
        std::fs::set_permissions(&nested, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o700, "an existing open directory is tightened");
        let file = nested.join("membership.log");
        drop(open_private_append(&file).unwrap());
        assert_eq!(mode(&file), 0o600);
        std::fs::remove_dir_all(&first).unwrap();
        std::fs::remove_dir_all(&second).unwrap();
    }
}
