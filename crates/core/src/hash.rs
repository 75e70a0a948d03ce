//! Redis hashes on top of single-key registers.
//!
//! A hash is stored as **one value** under its key: a reserved magic prefix, then the
//! field/value pairs, each length-prefixed, sorted by field. Reads of a hash (HGET, HMGET,
//! HGETALL) are one linearizable read of that value. Updates (HSET, HMSET, HDEL) are the
//! read-modify-writes [`RmwOp::HashSet`](crate::RmwOp::HashSet) and
//! [`RmwOp::HashDelete`](crate::RmwOp::HashDelete): every protocol runs them like INCRBY, as
//! one atomic update at the coordinator (Hermes §3.6 RMWs; a log entry elsewhere), so hashes
//! are linearizable per key and a contended hash costs no client-side retries.
//!
//! Strings that start with the magic prefix would be indistinguishable from hashes, so the
//! server refuses to store such strings (`-ERR value starts with a reserved prefix`).

use crate::codec::{Reader, WriteExt};
use bytes::{BufMut, Bytes, BytesMut};

/// Begins every encoded hash. Starts with bytes no text or integer value starts with.
pub const MAGIC: &[u8] = b"\x00\xffchorus-hash\x01";

/// Whether a stored value is a hash.
pub fn is_hash(value: &[u8]) -> bool {
    value.starts_with(MAGIC)
}

/// Field -> value, sorted by field.
pub type Fields = Vec<(Bytes, Bytes)>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    #[error("ERR stored hash is corrupt")]
    Corrupt,
}

/// Decode a stored value: `None` (absent key) is the empty hash; a string is `WrongType`.
pub fn decode(value: Option<&Bytes>) -> Result<Fields, HashError> {
    let Some(value) = value else { return Ok(Vec::new()) };
    if !is_hash(value) {
        return Err(HashError::WrongType);
    }
    let mut reader = Reader::new(value.slice(MAGIC.len()..));
    let count = reader.u32().map_err(|_| HashError::Corrupt)? as usize;
    if count > reader.remaining() {
        return Err(HashError::Corrupt);
    }
    let mut fields = Vec::with_capacity(count);
    for _ in 0..count {
        let field = reader.bytes().map_err(|_| HashError::Corrupt)?;
        let value = reader.bytes().map_err(|_| HashError::Corrupt)?;
        fields.push((field, value));
    }
    reader.finish().map_err(|_| HashError::Corrupt)?;
    Ok(fields)
}

/// Encode `fields` (sorted, unique); the empty hash is the absent key.
pub fn encode(fields: &Fields) -> Option<Bytes> {
    if fields.is_empty() {
        return None;
    }
    let size = MAGIC.len() + 4 + fields.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>();
    let mut buf = BytesMut::with_capacity(size);
    buf.put_slice(MAGIC);
    buf.put_u32_le(fields.len() as u32);
    for (field, value) in fields {
        buf.put_bytes_prefixed(field);
        buf.put_bytes_prefixed(value);
    }
    Some(buf.freeze())
}

pub fn get<'a>(fields: &'a Fields, field: &[u8]) -> Option<&'a Bytes> {
    fields.binary_search_by(|(f, _)| f.as_ref().cmp(field)).ok().map(|at| &fields[at].1)
}

/// Set `pairs` (later pairs win); returns how many fields were new.
pub fn set(fields: &mut Fields, pairs: &[(Bytes, Bytes)]) -> usize {
    let mut added = 0;
    for (field, value) in pairs {
        match fields.binary_search_by(|(f, _)| f.cmp(field)) {
            Ok(at) => fields[at].1 = value.clone(),
            Err(at) => {
                fields.insert(at, (field.clone(), value.clone()));
                added += 1;
            }
        }
    }
    added
}

/// Remove `names`; returns how many existed.
pub fn remove(fields: &mut Fields, names: &[Bytes]) -> usize {
    let before = fields.len();
    fields.retain(|(field, _)| !names.contains(field));
    before - fields.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn set_get_remove_round_trip() {
        let mut fields = decode(None).unwrap();
        assert_eq!(set(&mut fields, &[(b("b"), b("2")), (b("a"), b("1")), (b("b"), b("3"))]), 2);
        let stored = encode(&fields).unwrap();
        assert!(is_hash(&stored));
        let mut fields = decode(Some(&stored)).unwrap();
        assert_eq!(fields, vec![(b("a"), b("1")), (b("b"), b("3"))]);
        assert_eq!(get(&fields, b"b"), Some(&b("3")));
        assert_eq!(remove(&mut fields, &[b("a"), b("zz")]), 1);
        assert_eq!(remove(&mut fields, &[b("b")]), 1);
        assert_eq!(encode(&fields), None, "an empty hash is an absent key");
    }

    #[test]
    fn strings_are_the_wrong_type() {
        assert_eq!(decode(Some(&b("plain"))), Err(HashError::WrongType));
        assert_eq!(decode(Some(&b("12"))), Err(HashError::WrongType));
    }

    proptest! {
        #[test]
        fn arbitrary_stored_bytes_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut value = MAGIC.to_vec();
            value.extend_from_slice(&junk);
            let _ = decode(Some(&Bytes::from(value)));
        }
    }
}
