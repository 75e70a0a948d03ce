//! A key-value map whose clone costs a few hundred pointer copies, whatever its size: the
//! state a checkpoint captures inside the event loop before a writer thread encodes it.
//!
//! The map is split into [`BUCKETS`] sub-maps behind `Arc`s. Cloning clones the `Arc`s; the
//! first write to a bucket that a clone still shares copies that bucket alone (`Arc::make_mut`),
//! so after a checkpoint the loop pays for the buckets it writes, a few at a time, and nothing
//! once the writer thread has dropped its clone.

use std::sync::Arc;

use chorus_core::{Key, Value};
use rustc_hash::FxHashMap;

/// Enough buckets that copying one is cheap (1/256 of the keys), few enough that cloning the
/// map stays in the microseconds.
pub const BUCKETS: usize = 256;

#[derive(Clone, Debug)]
pub struct CowMap {
    buckets: Vec<Arc<FxHashMap<Key, Value>>>,
    len: usize,
}

impl Default for CowMap {
    fn default() -> Self {
        CowMap { buckets: (0..BUCKETS).map(|_| Arc::default()).collect(), len: 0 }
    }
}

/// The bucket of `key`: FNV-1a's high bits, independent of the bits the buckets' own hash
/// tables index by (FxHash) and of the log choice (FNV-1a modulo the log count).
fn bucket_of(key: &[u8]) -> usize {
    (crate::replica::fnv1a64(key) >> 56) as usize % BUCKETS
}

impl CowMap {
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.buckets[bucket_of(key)].get(key)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.buckets.iter().flat_map(|bucket| bucket.keys())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.buckets.iter().flat_map(|bucket| bucket.iter())
    }

    /// Returns the value `key` had, so a caller that must remember it needs no lookup first.
    pub fn insert(&mut self, key: Key, value: Value) -> Option<Value> {
        let bucket = Arc::make_mut(&mut self.buckets[bucket_of(&key)]);
        let previous = bucket.insert(key, value);
        if previous.is_none() {
            self.len += 1;
        }
        previous
    }

    /// Returns the value `key` had.
    pub fn remove(&mut self, key: &[u8]) -> Option<Value> {
        let bucket = &mut self.buckets[bucket_of(key)];
        if !bucket.contains_key(key) {
            return None; // no copy of a shared bucket for nothing
        }
        let previous = Arc::make_mut(bucket).remove(key);
        self.len -= 1;
        previous
    }

    /// How many buckets this map shares with a clone.
    #[cfg(test)]
    pub fn buckets_shared(&self) -> usize {
        self.buckets.iter().filter(|bucket| Arc::strong_count(bucket) > 1).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn key(i: u32) -> Key {
        Bytes::from(format!("key:{i}"))
    }

    #[test]
    fn a_clone_keeps_its_contents_while_the_original_changes_and_copies_only_written_buckets() {
        let mut map = CowMap::default();
        for i in 0..2_000 {
            map.insert(key(i), Bytes::from(vec![1u8; 8]));
        }
        let image = map.clone();
        assert_eq!(map.buckets_shared(), BUCKETS);
        map.insert(key(7), Bytes::from_static(b"new"));
        map.remove(&key(8));
        map.remove(b"absent");
        map.insert(key(5_000), Bytes::from_static(b"added"));
        // At most three buckets were copied; the rest are still shared with the image.
        assert!(map.buckets_shared() >= BUCKETS - 3, "{} shared", map.buckets_shared());
        assert_eq!((image.len(), map.len()), (2_000, 2_000));
        assert_eq!(image.get(&key(7)).unwrap().as_ref(), &[1u8; 8]);
        assert!(image.get(&key(8)).is_some() && image.get(&key(5_000)).is_none());
        assert_eq!(map.get(&key(7)).unwrap().as_ref(), b"new");
        assert!(map.get(&key(8)).is_none() && map.get(&key(5_000)).is_some());
        assert_eq!(map.iter().count(), 2_000);
        drop(image);
        assert_eq!(map.buckets_shared(), 0);
    }
}
