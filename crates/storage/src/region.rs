//! A fixed-size memory region kept in a file of some [`Storage`]: reads come from an image in
//! memory, writes go to the image and the storage, a flush is a sync. On a [`crate::SimDisk`]
//! or a [`crate::CrashTestStorage`] a crash then keeps exactly what was flushed.

use chorus_region::{check_range, check_word, RegionError, RegionMemory};

use crate::Storage;

pub struct StorageRegion<S: Storage> {
    storage: S,
    name: String,
    image: Vec<u8>,
}

fn io_error(name: &str, error: std::io::Error) -> RegionError {
    RegionError::Io { context: format!("region file {name}"), source: error }
}

impl<S: Storage> StorageRegion<S> {
    /// The region in file `name`, `size` bytes: the file's contents, or zeros (made durable)
    /// if it is missing or of another size.
    pub fn open(mut storage: S, name: &str, size: u64) -> Result<StorageRegion<S>, RegionError> {
        let existing = storage.read(name).map_err(|error| io_error(name, error))?;
        let image = match existing {
            Some(bytes) if bytes.len() as u64 == size => bytes,
            _ => {
                let zeros = vec![0u8; size as usize];
                storage.replace(name, &zeros).map_err(|error| io_error(name, error))?;
                zeros
            }
        };
        Ok(StorageRegion { storage, name: name.to_string(), image })
    }

    fn store(&mut self, offset: usize, len: usize) -> Result<(), RegionError> {
        let (name, image) = (&self.name, &self.image);
        self.storage
            .write_at(name, offset as u64, &image[offset..offset + len])
            .map_err(|error| io_error(name, error))
    }
}

impl<S: Storage> RegionMemory for StorageRegion<S> {
    fn size(&self) -> u64 {
        self.image.len() as u64
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        let (start, end) = check_range(offset, buf.len() as u64, self.size())?;
        buf.copy_from_slice(&self.image[start..end]);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
        let (start, end) = check_range(offset, data.len() as u64, self.size())?;
        self.image[start..end].copy_from_slice(data);
        self.store(start, data.len())
    }

    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError> {
        let size = self.size();
        let (src_start, src_end) = check_range(src, len, size)?;
        let (dst_start, _) = check_range(dst, len, size)?;
        self.image.copy_within(src_start..src_end, dst_start);
        self.store(dst_start, len as usize)
    }

    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError> {
        let at = check_word(offset, self.size())?;
        let current = u64::from_le_bytes(self.image[at..at + 8].try_into().expect("8 bytes"));
        if current == old {
            self.image[at..at + 8].copy_from_slice(&new.to_le_bytes());
            self.store(at, 8)?;
        }
        Ok(current)
    }

    fn flush(&mut self) -> Result<(), RegionError> {
        self.storage.sync(&self.name).map_err(|error| io_error(&self.name, error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimDisk;

    #[test]
    fn a_crash_keeps_what_was_flushed() {
        let mut lost = 0;
        for seed in 0..50 {
            let disk = SimDisk::new();
            let mut region = StorageRegion::open(disk.clone(), "r", 4096).unwrap();
            region.write(0, b"flushed").unwrap();
            region.flush().unwrap();
            region.write(100, b"not flushed").unwrap();
            disk.crash(seed);
            let reopened = StorageRegion::open(disk, "r", 4096).unwrap();
            assert_eq!(reopened.read_vec(0, 7).unwrap(), b"flushed");
            let tail = reopened.read_vec(100, 11).unwrap();
            let written = tail.iter().take_while(|byte| **byte != 0).count();
            assert_eq!(&tail[..written], &b"not flushed"[..written], "a prefix of the write, then nothing");
            assert!(tail[written..].iter().all(|byte| *byte == 0));
            lost += (written == 0) as u32;
        }
        assert!(lost > 5, "no crash lost the unflushed write");
    }
}
