//! The record format of the append-only files: `[length u32][crc32 u32][kind u8][payload]`,
//! little-endian, the checksum over kind and payload, `length` = 1 + payload bytes.
//!
//! Reading tells a torn tail (the last record reaches past the end of the file or fails its
//! checksum with nothing after it: a crash cut the last append) from a corrupted record in
//! the middle (a bad record followed by more bytes), which is refused.

use chorus_storage::checksum;

const HEADER_BYTES: usize = 8;
/// Larger than any record the node writes (one turn's keys, each bounded by the value limit).
pub const RECORD_BYTES_MAX: usize = 1 << 31;

/// What a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The protocol's durable state of some keys (its own encoding).
    Data = 1,
    /// Whether the replica holds all the data, and whether every record was synced before
    /// the replica acted on it (`appendfsync always`): payload `[complete u8][always u8]`.
    Complete = 2,
    /// The node stopped cleanly: every record before it is on disk.
    Clean = 3,
}

impl Kind {
    fn from_u8(byte: u8) -> Option<Kind> {
        match byte {
            1 => Some(Kind::Data),
            2 => Some(Kind::Complete),
            3 => Some(Kind::Clean),
            _ => None,
        }
    }
}

/// Append one framed record to `buf`.
pub fn encode(kind: Kind, payload: &[u8], buf: &mut Vec<u8>) {
    let length = u32::try_from(payload.len() + 1).expect("record under 4 GiB");
    buf.extend_from_slice(&length.to_le_bytes());
    buf.extend_from_slice(&checksum(&[&[kind as u8], payload]).to_le_bytes());
    buf.push(kind as u8);
    buf.extend_from_slice(payload);
}

/// The records of one file, and where its valid prefix ends.
#[derive(Debug, Default)]
pub struct Decoded<'a> {
    pub records: Vec<(Kind, &'a [u8])>,
    /// Bytes of whole, valid records; anything after them is a torn tail.
    pub valid_bytes: usize,
}

/// A record in the middle of a file that fails its checksum (or is malformed), with valid
/// bytes after it: not a torn append but damage.
#[derive(Debug, PartialEq, Eq)]
pub struct Corrupted {
    pub offset: usize,
    pub reason: &'static str,
}

pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, Corrupted> {
    let mut decoded = Decoded::default();
    let mut offset = 0;
    while offset < bytes.len() {
        let rest = &bytes[offset..];
        let bad = |reason| Corrupted { offset, reason };
        if rest.len() < HEADER_BYTES {
            break; // A torn header: the tail.
        }
        let length = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if length == 0 || length > RECORD_BYTES_MAX {
            // Zeros at the end are a preallocated or torn tail; anything else is damage.
            if rest.iter().all(|byte| *byte == 0) {
                break;
            }
            return Err(bad("impossible record length"));
        }
        if rest.len() < HEADER_BYTES + length {
            // The last append was cut, unless whole records follow: then a damaged length
            // would pass for a tear and silently cut every record after it.
            if whole_record_within(&rest[1..]) {
                return Err(bad("record length runs past records that follow"));
            }
            break;
        }
        let body = &rest[HEADER_BYTES..HEADER_BYTES + length];
        let is_last = rest.len() == HEADER_BYTES + length;
        if checksum(&[body]) != crc {
            if is_last && !whole_record_within(&rest[1..]) {
                break; // A torn last record (its sectors partly written).
            }
            return Err(bad("checksum mismatch"));
        }
        let Some(kind) = Kind::from_u8(body[0]) else {
            return Err(bad("unknown record kind"));
        };
        decoded.records.push((kind, &body[1..]));
        offset += HEADER_BYTES + length;
        decoded.valid_bytes = offset;
    }
    Ok(decoded)
}

/// Whether a whole, valid record starts anywhere in `bytes`. A crash's tear ends the file's
/// data, so none follows a torn tail; one that does means damage. (A tear that wrote a later
/// sector of an append and not an earlier one is refused too: the node then copies from a
/// peer, which is safe.) Only run on the damaged path: it tries every offset.
fn whole_record_within(bytes: &[u8]) -> bool {
    (0..bytes.len().saturating_sub(HEADER_BYTES)).any(|offset| {
        let rest = &bytes[offset..];
        let length = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        let fits = length > 0 && length <= rest.len() - HEADER_BYTES;
        fits && Kind::from_u8(rest[HEADER_BYTES]).is_some()
            && checksum(&[&rest[HEADER_BYTES..HEADER_BYTES + length]]) == crc
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(records: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        for payload in records {
            encode(Kind::Data, payload, &mut buf);
        }
        buf
    }

    #[test]
    fn round_trip() {
        let bytes = file(&[b"one", b"", b"three"]);
        let decoded = decode(&bytes).unwrap();
        let payloads: Vec<&[u8]> = decoded.records.iter().map(|(_, payload)| *payload).collect();
        assert_eq!(payloads, vec![&b"one"[..], b"", b"three"]);
        assert_eq!(decoded.valid_bytes, bytes.len());
    }

    #[test]
    fn a_torn_tail_is_cut() {
        let whole = file(&[b"one", b"two"]);
        let first = file(&[b"one"]).len();
        for cut in first..whole.len() {
            let decoded = decode(&whole[..cut]).unwrap();
            assert_eq!(decoded.records.len(), 1, "cut at {cut}");
            assert_eq!(decoded.valid_bytes, first);
        }
        // The last record's bytes scrambled (a torn sector): cut too.
        let mut torn = whole.clone();
        *torn.last_mut().unwrap() ^= 0xFF;
        assert_eq!(decode(&torn).unwrap().valid_bytes, first);
        // Zeros after the last record (a file extended but not written).
        let mut zeros = whole.clone();
        zeros.extend_from_slice(&[0; 100]);
        assert_eq!(decode(&zeros).unwrap().valid_bytes, whole.len());
    }

    #[test]
    fn a_corrupted_record_in_the_middle_is_refused() {
        let mut bytes = file(&[b"one", b"two", b"three"]);
        bytes[HEADER_BYTES + 1] ^= 0x01; // inside the first record's payload
        assert_eq!(decode(&bytes).unwrap_err(), Corrupted { offset: 0, reason: "checksum mismatch" });
        // A damaged length that runs past the end is not taken for a torn tail.
        let mut bytes = file(&[b"one", b"two", b"three"]);
        bytes[2] = 0x10;
        assert_eq!(decode(&bytes).unwrap_err().reason, "record length runs past records that follow");
        // Nor is a damaged last record of a whole append when more records follow it.
        let mut bytes = file(&[b"one", b"two"]);
        let second = file(&[b"one"]).len();
        bytes[second + HEADER_BYTES + 2] ^= 0x01;
        bytes.extend_from_slice(&file(&[b"three"]));
        assert!(decode(&bytes).is_err());
    }
}
