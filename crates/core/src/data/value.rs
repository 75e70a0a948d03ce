//! How a typed value is stored in one register.
//!
//! Strings are stored as their bytes. Every other type starts with a reserved prefix
//! (`\x00\xffchorus-`, which no text or number starts with; the server refuses strings that
//! do), then a type tag and the elements, length-prefixed:
//!
//! * hash: [`crate::hash`]'s encoding (fields sorted);
//! * list: `LIST_MAGIC`, u32 count, the elements in order;
//! * set: `SET_MAGIC`, u32 count, the members sorted;
//! * sorted set: `ZSET_MAGIC`, u32 count, (member, score as f64 bits) sorted by member;
//! * stream: `STREAM_MAGIC`, then [`super::stream`]'s layout.
//!
//! A key with an expiry deadline is wrapped: `TTL_MAGIC`, u64 LE deadline (ms since the Unix
//! epoch), then the value as above. The deadline travels with the value, so every replica
//! and every log holds the same deadline (docs/expiry.md).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};

use super::stream::{self, Stream};
use crate::codec::{Reader, WriteExt};
use crate::hash;

/// Every non-string value, and the expiry envelope, starts with this.
pub const RESERVED_PREFIX: &[u8] = b"\x00\xffchorus-";
pub const LIST_MAGIC: &[u8] = b"\x00\xffchorus-list\x01";
pub const SET_MAGIC: &[u8] = b"\x00\xffchorus-set\x01";
pub const ZSET_MAGIC: &[u8] = b"\x00\xffchorus-zset\x01";
pub const TTL_MAGIC: &[u8] = b"\x00\xffchorus-ttl\x01";
pub const STREAM_MAGIC: &[u8] = b"\x00\xffchorus-stream\x01";

/// Whether a stored value is anything but a plain string without a deadline.
pub fn is_reserved(value: &[u8]) -> bool {
    value.starts_with(RESERVED_PREFIX)
}

/// Whether a stored value carries an expiry deadline.
pub fn has_deadline(value: &[u8]) -> bool {
    value.starts_with(TTL_MAGIC)
}

/// A decoded value.
#[derive(Clone, Debug, PartialEq)]
pub enum Typed {
    String(Bytes),
    Hash(hash::Fields),
    List(Vec<Bytes>),
    Set(BTreeSet<Bytes>),
    ZSet(BTreeMap<Bytes, f64>),
    Stream(Box<Stream>),
}

impl Typed {
    /// Redis' TYPE name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Typed::String(_) => "string",
            Typed::Hash(_) => "hash",
            Typed::List(_) => "list",
            Typed::Set(_) => "set",
            Typed::ZSet(_) => "zset",
            Typed::Stream(_) => "stream",
        }
    }

    /// Redis drops a collection once its last element goes (not a stream: an empty one
    /// keeps its last ID and its groups).
    pub fn is_empty_collection(&self) -> bool {
        match self {
            Typed::String(_) => false,
            Typed::Hash(fields) => fields.is_empty(),
            Typed::List(items) => items.is_empty(),
            Typed::Set(members) => members.is_empty(),
            Typed::ZSet(members) => members.is_empty(),
            Typed::Stream(_) => false,
        }
    }
}

/// A live key: its value and its deadline, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub value: Typed,
    pub deadline_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stored value is corrupt")]
pub struct Corrupt;

/// Split off the expiry envelope: the deadline and the value inside.
pub fn split_deadline(raw: &Bytes) -> Result<(Option<u64>, Bytes), Corrupt> {
    if !has_deadline(raw) {
        return Ok((None, raw.clone()));
    }
    let rest = raw.slice(TTL_MAGIC.len()..);
    if rest.len() < 8 {
        return Err(Corrupt);
    }
    let deadline = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
    Ok((Some(deadline), rest.slice(8..)))
}

/// Decode a stored value (without judging its deadline).
pub fn decode(raw: &Bytes) -> Result<Entry, Corrupt> {
    let (deadline_ms, inner) = split_deadline(raw)?;
    if has_deadline(&inner) {
        return Err(Corrupt);
    }
    let value = if hash::is_hash(&inner) {
        Typed::Hash(hash::decode(Some(&inner)).map_err(|_| Corrupt)?)
    } else if inner.starts_with(LIST_MAGIC) {
        Typed::List(decode_items(inner.slice(LIST_MAGIC.len()..), Reader::bytes)?)
    } else if inner.starts_with(SET_MAGIC) {
        Typed::Set(decode_items(inner.slice(SET_MAGIC.len()..), Reader::bytes)?.into_iter().collect())
    } else if inner.starts_with(ZSET_MAGIC) {
        let pairs = decode_items(inner.slice(ZSET_MAGIC.len()..), |reader| {
            Ok((reader.bytes()?, f64::from_bits(reader.u64()?)))
        })?;
        Typed::ZSet(pairs.into_iter().collect())
    } else if inner.starts_with(STREAM_MAGIC) {
        Typed::Stream(Box::new(stream::decode(inner.slice(STREAM_MAGIC.len()..)).map_err(|_| Corrupt)?))
    } else if is_reserved(&inner) {
        return Err(Corrupt);
    } else {
        Typed::String(inner)
    };
    Ok(Entry { value, deadline_ms })
}

fn decode_items<T>(
    body: Bytes,
    item: impl FnMut(&mut Reader) -> Result<T, crate::codec::DecodeError>,
) -> Result<Vec<T>, Corrupt> {
    let mut reader = Reader::new(body);
    let items = reader.list(item).map_err(|_| Corrupt)?;
    reader.finish().map_err(|_| Corrupt)?;
    Ok(items)
}

/// Encode an entry; an empty collection is the absent key (as in Redis).
pub fn encode(entry: &Entry) -> Option<Bytes> {
    if entry.value.is_empty_collection() {
        return None;
    }
    let mut buf = BytesMut::new();
    if let Some(deadline) = entry.deadline_ms {
        buf.put_slice(TTL_MAGIC);
        buf.put_u64_le(deadline);
    }
    match &entry.value {
        Typed::String(bytes) if entry.deadline_ms.is_none() => return Some(bytes.clone()),
        Typed::String(bytes) => buf.put_slice(bytes),
        Typed::Hash(fields) => buf.put_slice(&hash::encode(fields).expect("not empty")),
        Typed::List(items) => {
            put_items(&mut buf, LIST_MAGIC, items.iter(), |buf, item| buf.put_bytes_prefixed(item))
        }
        Typed::Set(members) => {
            put_items(&mut buf, SET_MAGIC, members.iter(), |buf, member| buf.put_bytes_prefixed(member))
        }
        Typed::ZSet(members) => put_items(&mut buf, ZSET_MAGIC, members.iter(), |buf, (member, score)| {
            buf.put_bytes_prefixed(member);
            buf.put_u64_le(score.to_bits());
        }),
        Typed::Stream(body) => {
            buf.put_slice(STREAM_MAGIC);
            stream::encode(body, &mut buf);
        }
    }
    Some(buf.freeze())
}

fn put_items<T>(
    buf: &mut BytesMut,
    magic: &[u8],
    items: impl ExactSizeIterator<Item = T>,
    mut put: impl FnMut(&mut BytesMut, T),
) {
    buf.put_slice(magic);
    buf.put_u32_le(u32::try_from(items.len()).expect("collection over u32 elements"));
    for item in items {
        put(buf, item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn every_type_round_trips_with_and_without_a_deadline() {
        let values = [
            Typed::String(b("text")),
            Typed::Hash(vec![(b("f"), b("v"))]),
            Typed::List(vec![b("a"), b("b"), b("a")]),
            Typed::Set([b("x"), b("y")].into_iter().collect()),
            Typed::ZSet([(b("m"), 1.5), (b("n"), f64::NEG_INFINITY)].into_iter().collect()),
        ];
        for value in values {
            for deadline_ms in [None, Some(1_700_000_000_000)] {
                let entry = Entry { value: value.clone(), deadline_ms };
                let raw = encode(&entry).unwrap();
                assert_eq!(decode(&raw).unwrap(), entry);
                assert_eq!(has_deadline(&raw), deadline_ms.is_some());
            }
        }
        assert_eq!(encode(&Entry { value: Typed::List(vec![]), deadline_ms: Some(5) }), None);
        assert_eq!(encode(&Entry { value: Typed::String(b("s")), deadline_ms: None }), Some(b("s")));
    }

    proptest! {
        #[test]
        fn arbitrary_stored_bytes_never_panic(
            magic in 0usize..6,
            junk in proptest::collection::vec(any::<u8>(), 0..96),
        ) {
            let magics = [LIST_MAGIC, SET_MAGIC, ZSET_MAGIC, TTL_MAGIC, RESERVED_PREFIX, STREAM_MAGIC];
            let mut raw = magics[magic].to_vec();
            raw.extend_from_slice(&junk);
            let _ = decode(&Bytes::from(raw));
        }
    }
}
