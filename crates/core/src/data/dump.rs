//! DUMP and RESTORE: a key's value as an opaque payload, and back.
//!
//! Redis clients treat the payload as opaque bytes, so it is Chorus' own encoding, not RDB:
//! the value's stored encoding ([`super::value`], without the expiry envelope: RESTORE takes
//! the TTL as an argument), then a trailer of `TRAILER_MAGIC`, a u16 LE format version and a
//! CRC-32 of everything before it. A payload whose trailer or checksum does not match (a
//! truncated or altered payload, or one made by Redis) is refused with Redis' own line, and
//! a payload that passes the check is decoded and re-encoded, so RESTORE can only store a
//! well-formed value.
//!
//! RESTORE is a typed write: it runs as one RMW of its key like every other command here, so
//! it is replicated, and its relative TTL counts from the op's clock reading.

use bytes::{BufMut, Bytes, BytesMut};

use super::value::{self, Entry, Typed};
use super::{Args, Data, Fail, Reply, Slot};

/// Marks the trailer as Chorus' (Redis' trailer is an RDB version and a CRC-64 instead).
const TRAILER_MAGIC: &[u8] = b"chorus";
/// The payload format; bump it when [`value`]'s encoding changes incompatibly.
const FORMAT_VERSION: u16 = 1;
const TRAILER_BYTES: usize = TRAILER_MAGIC.len() + 2 + 4;

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "dump" => Ok(slot.entry().map_or(Data::Nil, |entry| Data::Bulk(payload(&entry.value)))),
        "restore" => restore(args, slot),
        _ => return None,
    })
}

/// The DUMP payload of a value.
pub fn payload(value: &Typed) -> Bytes {
    let body = value::encode(&Entry { value: value.clone(), deadline_ms: None }).unwrap_or_default();
    let mut buf = BytesMut::with_capacity(body.len() + TRAILER_BYTES);
    buf.put_slice(&body);
    buf.put_slice(TRAILER_MAGIC);
    buf.put_u16_le(FORMAT_VERSION);
    let checksum = crc32fast::hash(&buf);
    buf.put_u32_le(checksum);
    buf.freeze()
}

/// Why a payload is refused: Redis' two lines.
#[derive(Debug, PartialEq, Eq)]
pub enum PayloadError {
    /// The trailer, version or checksum does not match.
    VersionOrChecksum,
    /// The checksum matched but the body is not a value Chorus could have dumped.
    BadFormat,
}

impl PayloadError {
    fn line(&self) -> Fail {
        match self {
            PayloadError::VersionOrChecksum => "ERR DUMP payload version or checksum are wrong".into(),
            PayloadError::BadFormat => "ERR Bad data format".into(),
        }
    }
}

/// The value a payload holds.
pub fn decode_payload(payload: &Bytes) -> Result<Typed, PayloadError> {
    let Some(body_bytes) = payload.len().checked_sub(TRAILER_BYTES) else {
        return Err(PayloadError::VersionOrChecksum);
    };
    let (checked, checksum) = payload.split_at(payload.len() - 4);
    let trailer = &checked[body_bytes..];
    let version = u16::from_le_bytes([trailer[TRAILER_MAGIC.len()], trailer[TRAILER_MAGIC.len() + 1]]);
    if !trailer.starts_with(TRAILER_MAGIC)
        || version != FORMAT_VERSION
        || crc32fast::hash(checked).to_le_bytes() != checksum
    {
        return Err(PayloadError::VersionOrChecksum);
    }
    let body = payload.slice(..body_bytes);
    // A dumped value never carries a deadline, and is never an empty collection.
    let entry = value::decode(&body).map_err(|_| PayloadError::BadFormat)?;
    if entry.deadline_ms.is_some() || entry.value.is_empty_collection() || !well_formed(&entry.value) {
        return Err(PayloadError::BadFormat);
    }
    Ok(entry.value)
}

/// What decoding alone does not check: a hash's fields sorted and unique (lookups binary
/// search them) and sorted-set scores that are numbers.
fn well_formed(value: &Typed) -> bool {
    match value {
        Typed::Hash(fields) => fields.windows(2).all(|pair| pair[0].0 < pair[1].0),
        Typed::ZSet(members) => members.values().all(|score| !score.is_nan()),
        _ => true,
    }
}

/// `RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ f]`, checked in Redis'
/// order. IDLETIME and FREQ are accepted and ignored: Chorus keeps no access statistics.
fn restore(args: &Args, slot: &mut Slot) -> Reply {
    let (mut replace, mut absolute, mut idle, mut freq) = (false, false, false, false);
    let mut at = 4;
    while at < args.len() {
        let has_operand = at + 1 < args.len();
        match args.word(at).as_str() {
            "REPLACE" => replace = true,
            "ABSTTL" => absolute = true,
            "IDLETIME" if has_operand && !freq => {
                if args.int(at + 1)? < 0 {
                    return Err("ERR Invalid IDLETIME value, must be >= 0".into());
                }
                idle = true;
                at += 1;
            }
            "FREQ" if has_operand && !idle => {
                if !(0..=255).contains(&args.int(at + 1)?) {
                    return Err("ERR Invalid FREQ value, must be >= 0 and <= 255".into());
                }
                freq = true;
                at += 1;
            }
            _ => return Err(super::syntax_error()),
        }
        at += 1;
    }
    if !replace && slot.exists() {
        return Err("BUSYKEY Target key name already exists.".into());
    }
    let ttl_ms = args.int(2)?;
    if ttl_ms < 0 {
        return Err("ERR Invalid TTL value, must be >= 0".into());
    }
    let value = decode_payload(args.get(3)).map_err(|error| error.line())?;
    let deadline_ms = match ttl_ms {
        0 => None,
        _ if absolute => Some(ttl_ms as u64),
        _ => Some(slot.now_ms().saturating_add(ttl_ms as u64)),
    };
    // As in Redis: a deadline already passed leaves the key absent (deleted with REPLACE).
    let expired = deadline_ms.is_some_and(|deadline| deadline <= slot.now_ms());
    slot.put((!expired).then_some(Entry { value, deadline_ms }));
    Ok(Data::ok())
}
