//! The peer wire format.
//!
//! A frame is
//!
//! ```text
//! | length: u32 LE | version: u8 | kind: u8 | crc32: u32 LE | payload: length - 6 bytes |
//! ```
//!
//! `length` counts every byte after itself; the CRC-32 covers `version`, `kind` and `payload`.
//! `kind` tells the transport what the payload is (a batch of one protocol's messages, a
//! handshake, a credit update...). Decoding never trusts a length it has not bounded, never
//! panics, and reports every problem as a [`DecodeError`]: a peer that sends garbage gets its
//! connection closed, nothing more.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::command::{Command, CommandError, Outcome, RmwOp};
use crate::data::{Data, ExecOp};
use crate::ids::{Epoch, Timestamp};

/// The wire format version this build speaks.
pub const WIRE_VERSION: u8 = 1;
/// Bytes before the payload: length (4) + version (1) + kind (1) + crc (4).
pub const FRAME_HEADER_BYTES: usize = 10;
/// Default bound on one frame's payload. Large values are legal, unbounded ones are not.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 64 * 1024 * 1024;

#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame declares {declared} bytes, more than the limit of {limit}")]
    FrameTooLarge { declared: usize, limit: usize },
    #[error("frame length {0} is shorter than the header")]
    FrameTooShort(usize),
    #[error("unsupported wire version {0} (this build speaks {WIRE_VERSION})")]
    UnsupportedVersion(u8),
    #[error("checksum mismatch: frame says {expected:#010x}, payload hashes to {actual:#010x}")]
    ChecksumMismatch { expected: u32, actual: u32 },
    #[error("message truncated: needed {needed} more bytes, {remaining} left")]
    Truncated { needed: usize, remaining: usize },
    #[error("unknown {what} tag {tag}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("{0} trailing bytes after message")]
    TrailingBytes(usize),
    #[error("invalid field: {0}")]
    Invalid(&'static str),
}

/// One decoded frame.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Frame {
    pub kind: u8,
    pub payload: Bytes,
}

/// Append one frame holding `payload` to `buf`.
pub fn encode_frame(kind: u8, payload: &[u8], buf: &mut BytesMut) {
    let length = u32::try_from(payload.len() + FRAME_HEADER_BYTES - 4).expect("frame over 4 GiB");
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[WIRE_VERSION, kind]);
    hasher.update(payload);
    buf.reserve(FRAME_HEADER_BYTES + payload.len());
    buf.put_u32_le(length);
    buf.put_u8(WIRE_VERSION);
    buf.put_u8(kind);
    buf.put_u32_le(hasher.finalize());
    buf.put_slice(payload);
}

/// Take one complete frame off the front of `buf`. `Ok(None)` means more bytes are needed;
/// nothing is consumed in that case. An error means the stream is corrupt and must be closed.
pub fn decode_frame(buf: &mut BytesMut, payload_bytes_max: usize) -> Result<Option<Frame>, DecodeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let length = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if length < FRAME_HEADER_BYTES - 4 {
        return Err(DecodeError::FrameTooShort(length));
    }
    let payload_bytes = length - (FRAME_HEADER_BYTES - 4);
    if payload_bytes > payload_bytes_max {
        return Err(DecodeError::FrameTooLarge { declared: payload_bytes, limit: payload_bytes_max });
    }
    if buf.len() < 4 + length {
        buf.reserve(4 + length - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + length).freeze();
    frame.advance(4);
    let version = frame.get_u8();
    let kind = frame.get_u8();
    let expected = frame.get_u32_le();
    if version != WIRE_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[version, kind]);
    hasher.update(&frame);
    let actual = hasher.finalize();
    if actual != expected {
        return Err(DecodeError::ChecksumMismatch { expected, actual });
    }
    Ok(Some(Frame { kind, payload: frame }))
}

/// A type that travels between peers.
pub trait WireMessage: Sized {
    fn encode(&self, buf: &mut BytesMut);
    fn decode(reader: &mut Reader) -> Result<Self, DecodeError>;

    /// Decode exactly one message from `bytes`, rejecting trailing garbage.
    fn decode_exact(bytes: Bytes) -> Result<Self, DecodeError> {
        let mut reader = Reader::new(bytes);
        let message = Self::decode(&mut reader)?;
        reader.finish()?;
        Ok(message)
    }
}

/// Encode `messages` as one batch payload: a count followed by the messages.
pub fn encode_batch<'a, M: WireMessage + 'a>(
    messages: impl ExactSizeIterator<Item = &'a M>,
    buf: &mut BytesMut,
) {
    buf.put_u32_le(u32::try_from(messages.len()).expect("batch count over u32"));
    for message in messages {
        message.encode(buf);
    }
}

/// Decode a batch payload produced by [`encode_batch`].
pub fn decode_batch<M: WireMessage>(payload: Bytes) -> Result<Vec<M>, DecodeError> {
    let mut reader = Reader::new(payload);
    let count = reader.u32()? as usize;
    // Every message takes at least one byte: a count larger than the payload is a lie, and
    // believing it would let a peer make us allocate gigabytes.
    if count > reader.remaining() {
        return Err(DecodeError::Invalid("batch count exceeds payload"));
    }
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        messages.push(M::decode(&mut reader)?);
    }
    reader.finish()?;
    Ok(messages)
}

/// A peer message tagged with the event loop (raftlog: the shard) it is for on the receiving
/// node, so one connection per peer carries every loop's batches and one task splits them.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopMessage<M> {
    pub event_loop: u16,
    pub message: M,
}

impl<M: WireMessage> WireMessage for LoopMessage<M> {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_u16_le(self.event_loop);
        self.message.encode(buf);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let event_loop = reader.u16()?;
        let message = M::decode(reader)?;
        Ok(LoopMessage { event_loop, message })
    }
}

/// A bounds-checked, zero-copy reader over a payload.
pub struct Reader {
    bytes: Bytes,
}

impl Reader {
    pub fn new(bytes: Bytes) -> Reader {
        Reader { bytes }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn need(&self, needed: usize) -> Result<(), DecodeError> {
        if self.bytes.len() < needed {
            return Err(DecodeError::Truncated { needed, remaining: self.bytes.len() });
        }
        Ok(())
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.bytes.get_u8())
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.bytes.get_u16_le())
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.bytes.get_u32_le())
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        Ok(self.bytes.get_u64_le())
    }
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        self.need(8)?;
        Ok(self.bytes.get_i64_le())
    }
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid("boolean is neither 0 nor 1")),
        }
    }
    /// A u32-length-prefixed byte string, returned without copying.
    pub fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let length = self.u32()? as usize;
        self.need(length)?;
        Ok(self.bytes.split_to(length))
    }
    pub fn optional_bytes(&mut self) -> Result<Option<Bytes>, DecodeError> {
        if self.bool()? {
            Ok(Some(self.bytes()?))
        } else {
            Ok(None)
        }
    }
    pub fn epoch(&mut self) -> Result<Epoch, DecodeError> {
        Ok(Epoch(self.u64()?))
    }
    pub fn timestamp(&mut self) -> Result<Timestamp, DecodeError> {
        Ok(Timestamp { version: self.u64()?, cid: self.u32()? })
    }
    /// A u32 count, then that many items. Every item takes at least 4 bytes, so a count the
    /// payload cannot hold is refused before anything is allocated for it.
    pub fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Reader) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        let count = self.u32()? as usize;
        self.need(count.saturating_mul(4))?;
        (0..count).map(|_| item(self)).collect()
    }
    /// Fails if anything is left: a message must account for every byte.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.bytes.len()))
        }
    }
}

/// Writers matching the [`Reader`] methods.
pub trait WriteExt {
    fn put_bytes_prefixed(&mut self, bytes: &[u8]);
    fn put_optional_bytes(&mut self, bytes: Option<&Bytes>);
    fn put_bool(&mut self, value: bool);
    fn put_epoch(&mut self, epoch: Epoch);
    fn put_timestamp(&mut self, ts: Timestamp);
}

impl WriteExt for BytesMut {
    fn put_bytes_prefixed(&mut self, bytes: &[u8]) {
        self.put_u32_le(u32::try_from(bytes.len()).expect("byte string over 4 GiB"));
        self.put_slice(bytes);
    }
    fn put_optional_bytes(&mut self, bytes: Option<&Bytes>) {
        self.put_bool(bytes.is_some());
        if let Some(bytes) = bytes {
            self.put_bytes_prefixed(bytes);
        }
    }
    fn put_bool(&mut self, value: bool) {
        self.put_u8(value as u8);
    }
    fn put_epoch(&mut self, epoch: Epoch) {
        self.put_u64_le(epoch.0);
    }
    fn put_timestamp(&mut self, ts: Timestamp) {
        self.put_u64_le(ts.version);
        self.put_u32_le(ts.cid);
    }
}

// Commands and outcomes travel between replicas too (forwarded requests, log entries).

impl WireMessage for RmwOp {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            RmwOp::CompareAndSwap { expected, new } => {
                buf.put_u8(0);
                buf.put_optional_bytes(expected.as_ref());
                buf.put_optional_bytes(new.as_ref());
            }
            RmwOp::IncrementBy(delta) => {
                buf.put_u8(1);
                buf.put_i64_le(*delta);
            }
            RmwOp::SetIfAbsent(value) => {
                buf.put_u8(2);
                buf.put_bytes_prefixed(value);
            }
            RmwOp::SetIfPresent(value) => {
                buf.put_u8(3);
                buf.put_bytes_prefixed(value);
            }
            RmwOp::Swap(value) => {
                buf.put_u8(4);
                buf.put_optional_bytes(value.as_ref());
            }
            RmwOp::HashSet { pairs, encoded_bytes_max } => {
                buf.put_u8(5);
                buf.put_u32_le(*encoded_bytes_max);
                buf.put_u32_le(pairs.len() as u32);
                for (field, value) in pairs {
                    buf.put_bytes_prefixed(field);
                    buf.put_bytes_prefixed(value);
                }
            }
            RmwOp::HashDelete(fields) => {
                buf.put_u8(6);
                buf.put_u32_le(fields.len() as u32);
                for field in fields {
                    buf.put_bytes_prefixed(field);
                }
            }
            RmwOp::Exec(op) => {
                buf.put_u8(7);
                buf.put_u64_le(op.now_ms);
                buf.put_u32_le(op.bytes_max);
                buf.put_u32_le(op.args.len() as u32);
                for arg in &op.args {
                    buf.put_bytes_prefixed(arg);
                }
            }
        }
    }
    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            0 => RmwOp::CompareAndSwap { expected: reader.optional_bytes()?, new: reader.optional_bytes()? },
            1 => RmwOp::IncrementBy(reader.i64()?),
            2 => RmwOp::SetIfAbsent(reader.bytes()?),
            3 => RmwOp::SetIfPresent(reader.bytes()?),
            4 => RmwOp::Swap(reader.optional_bytes()?),
            5 => {
                let encoded_bytes_max = reader.u32()?;
                let pairs = reader.list(|reader| Ok((reader.bytes()?, reader.bytes()?)))?;
                RmwOp::HashSet { pairs, encoded_bytes_max }
            }
            6 => RmwOp::HashDelete(reader.list(Reader::bytes)?),
            7 => RmwOp::Exec(ExecOp {
                now_ms: reader.u64()?,
                bytes_max: reader.u32()?,
                args: reader.list(Reader::bytes)?,
            }),
            tag => return Err(DecodeError::UnknownTag { what: "rmw op", tag }),
        })
    }
}

impl WireMessage for Command {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Command::Read { key } => {
                buf.put_u8(0);
                buf.put_bytes_prefixed(key);
            }
            Command::Write { key, value } => {
                buf.put_u8(1);
                buf.put_bytes_prefixed(key);
                buf.put_optional_bytes(value.as_ref());
            }
            Command::Rmw { key, op } => {
                buf.put_u8(2);
                buf.put_bytes_prefixed(key);
                op.encode(buf);
            }
        }
    }
    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            0 => Command::Read { key: reader.bytes()? },
            1 => Command::Write { key: reader.bytes()?, value: reader.optional_bytes()? },
            2 => Command::Rmw { key: reader.bytes()?, op: RmwOp::decode(reader)? },
            tag => return Err(DecodeError::UnknownTag { what: "command", tag }),
        })
    }
}

impl WireMessage for Outcome {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Outcome::Value(value) => {
                buf.put_u8(0);
                buf.put_optional_bytes(value.as_ref());
            }
            Outcome::Written => buf.put_u8(1),
            Outcome::Cas { swapped, previous } => {
                buf.put_u8(2);
                buf.put_bool(*swapped);
                buf.put_optional_bytes(previous.as_ref());
            }
            Outcome::Integer(value) => {
                buf.put_u8(3);
                buf.put_i64_le(*value);
            }
            Outcome::Flag(flag) => {
                buf.put_u8(4);
                buf.put_bool(*flag);
            }
            Outcome::Error(error) => {
                buf.put_u8(5);
                buf.put_u8(match error {
                    CommandError::NotInteger => 0,
                    CommandError::Overflow => 1,
                    CommandError::Unavailable(_) => 2,
                    CommandError::OutcomeUnknown => 3,
                    CommandError::StaleSequence => 4,
                    CommandError::Locked => 5,
                    CommandError::WrongType => 6,
                    CommandError::HashCorrupt => 7,
                    CommandError::ValueTooLarge => 8,
                    CommandError::Typed => 9,
                });
            }
            Outcome::Data(data) => {
                buf.put_u8(6);
                encode_data(data, buf);
            }
        }
    }
    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            0 => Outcome::Value(reader.optional_bytes()?),
            1 => Outcome::Written,
            2 => Outcome::Cas { swapped: reader.bool()?, previous: reader.optional_bytes()? },
            3 => Outcome::Integer(reader.i64()?),
            4 => Outcome::Flag(reader.bool()?),
            5 => Outcome::Error(match reader.u8()? {
                0 => CommandError::NotInteger,
                1 => CommandError::Overflow,
                2 => CommandError::Unavailable("remote replica is not serving"),
                3 => CommandError::OutcomeUnknown,
                4 => CommandError::StaleSequence,
                5 => CommandError::Locked,
                6 => CommandError::WrongType,
                7 => CommandError::HashCorrupt,
                8 => CommandError::ValueTooLarge,
                9 => CommandError::Typed,
                tag => return Err(DecodeError::UnknownTag { what: "command error", tag }),
            }),
            6 => Outcome::Data(decode_data(reader, DATA_DEPTH_MAX)?),
            tag => return Err(DecodeError::UnknownTag { what: "outcome", tag }),
        })
    }
}

/// How deeply a peer may nest [`Data`] arrays: replies nest at most twice (SCAN's cursor and
/// page); a bound keeps a hostile peer from exhausting the stack.
const DATA_DEPTH_MAX: usize = 8;

fn encode_data(data: &Data, buf: &mut BytesMut) {
    match data {
        Data::Nil => buf.put_u8(0),
        Data::NilArray => buf.put_u8(1),
        Data::Integer(value) => {
            buf.put_u8(2);
            buf.put_i64_le(*value);
        }
        Data::Bulk(bytes) => {
            buf.put_u8(3);
            buf.put_bytes_prefixed(bytes);
        }
        Data::Status(text) => {
            buf.put_u8(4);
            buf.put_bytes_prefixed(text.as_bytes());
        }
        Data::Error(text) => {
            buf.put_u8(5);
            buf.put_bytes_prefixed(text.as_bytes());
        }
        Data::Array(items) => {
            buf.put_u8(6);
            buf.put_u32_le(items.len() as u32);
            items.iter().for_each(|item| encode_data(item, buf));
        }
        Data::Map(pairs) => {
            buf.put_u8(7);
            buf.put_u32_le(pairs.len() as u32);
            for (key, value) in pairs {
                encode_data(key, buf);
                encode_data(value, buf);
            }
        }
    }
}

/// An element count; every element takes at least one byte, so a count the payload cannot
/// hold is refused before anything is allocated for it.
fn count_of(reader: &mut Reader) -> Result<usize, DecodeError> {
    let count = reader.u32()? as usize;
    if count > reader.remaining() {
        return Err(DecodeError::Invalid("reply element count exceeds payload"));
    }
    Ok(count)
}

fn decode_data(reader: &mut Reader, depth: usize) -> Result<Data, DecodeError> {
    let text = |reader: &mut Reader| {
        String::from_utf8(reader.bytes()?.to_vec())
            .map_err(|_| DecodeError::Invalid("reply text is not UTF-8"))
    };
    let deeper = || depth.checked_sub(1).ok_or(DecodeError::Invalid("reply nested too deeply"));
    Ok(match reader.u8()? {
        0 => Data::Nil,
        1 => Data::NilArray,
        2 => Data::Integer(reader.i64()?),
        3 => Data::Bulk(reader.bytes()?),
        4 => Data::Status(text(reader)?),
        5 => Data::Error(text(reader)?),
        6 => {
            deeper()?;
            let count = count_of(reader)?;
            Data::Array((0..count).map(|_| decode_data(reader, depth - 1)).collect::<Result<_, _>>()?)
        }
        7 => {
            deeper()?;
            let count = count_of(reader)?;
            let pair =
                |reader: &mut Reader| Ok((decode_data(reader, depth - 1)?, decode_data(reader, depth - 1)?));
            Data::Map((0..count).map(|_| pair(reader)).collect::<Result<_, DecodeError>>()?)
        }
        tag => return Err(DecodeError::UnknownTag { what: "reply", tag }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
    }

    fn arb_rmw() -> impl Strategy<Value = RmwOp> {
        prop_oneof![
            (proptest::option::of(arb_bytes()), proptest::option::of(arb_bytes()))
                .prop_map(|(expected, new)| RmwOp::CompareAndSwap { expected, new }),
            any::<i64>().prop_map(RmwOp::IncrementBy),
            arb_bytes().prop_map(RmwOp::SetIfAbsent),
            arb_bytes().prop_map(RmwOp::SetIfPresent),
            proptest::option::of(arb_bytes()).prop_map(RmwOp::Swap),
            (proptest::collection::vec((arb_bytes(), arb_bytes()), 0..4), any::<u32>())
                .prop_map(|(pairs, encoded_bytes_max)| RmwOp::HashSet { pairs, encoded_bytes_max }),
            proptest::collection::vec(arb_bytes(), 0..4).prop_map(RmwOp::HashDelete),
            (any::<u64>(), any::<u32>(), proptest::collection::vec(arb_bytes(), 0..4))
                .prop_map(|(now_ms, bytes_max, args)| RmwOp::Exec(ExecOp { now_ms, bytes_max, args })),
        ]
    }

    fn arb_command() -> impl Strategy<Value = Command> {
        prop_oneof![
            arb_bytes().prop_map(|key| Command::Read { key }),
            (arb_bytes(), proptest::option::of(arb_bytes()))
                .prop_map(|(key, value)| Command::Write { key, value }),
            (arb_bytes(), arb_rmw()).prop_map(|(key, op)| Command::Rmw { key, op }),
        ]
    }

    proptest! {
        #[test]
        fn commands_round_trip_through_frames(commands in proptest::collection::vec(arb_command(), 0..8)) {
            let mut payload = BytesMut::new();
            encode_batch(commands.iter(), &mut payload);
            let mut stream = BytesMut::new();
            encode_frame(7, &payload, &mut stream);
            let frame = decode_frame(&mut stream, FRAME_PAYLOAD_BYTES_MAX).unwrap().unwrap();
            prop_assert!(stream.is_empty());
            prop_assert_eq!(frame.kind, 7);
            prop_assert_eq!(decode_batch::<Command>(frame.payload).unwrap(), commands);
        }

        #[test]
        fn arbitrary_bytes_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut stream = BytesMut::from(&junk[..]);
            // Whatever happens, it must be a value, not a panic.
            let _ = decode_frame(&mut stream, 1024);
            let _ = decode_batch::<Command>(Bytes::from(junk.clone()));
            let _ = Outcome::decode_exact(Bytes::from(junk));
        }

        #[test]
        fn corrupting_any_byte_of_a_frame_is_detected(
            command in arb_command(),
            position in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let mut payload = BytesMut::new();
            command.encode(&mut payload);
            let mut stream = BytesMut::new();
            encode_frame(1, &payload, &mut stream);
            let at = position.index(stream.len());
            stream[at] ^= flip;
            // A flipped length may make the frame look incomplete; anything else must fail.
            match decode_frame(&mut stream, FRAME_PAYLOAD_BYTES_MAX) {
                Ok(Some(frame)) => prop_assert!(false, "corruption at byte {} went unnoticed: {:?}", at, frame),
                Ok(None) => prop_assert!(at < 4),
                Err(_) => {}
            }
        }
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut stream = BytesMut::new();
        encode_frame(3, b"hello", &mut stream);
        let full = stream.clone();
        for cut in 0..full.len() {
            let mut partial = BytesMut::from(&full[..cut]);
            assert_eq!(decode_frame(&mut partial, 1024).unwrap(), None);
            assert_eq!(partial.len(), cut, "nothing is consumed from an incomplete frame");
        }
    }

    #[test]
    fn oversized_and_foreign_frames_are_refused() {
        let mut stream = BytesMut::new();
        encode_frame(3, &[0u8; 100], &mut stream);
        assert!(matches!(decode_frame(&mut stream.clone(), 10), Err(DecodeError::FrameTooLarge { .. })));
        stream[4] = 99;
        assert_eq!(decode_frame(&mut stream, 1024), Err(DecodeError::UnsupportedVersion(99)));
    }

    #[test]
    fn a_lying_batch_count_is_refused_without_allocating() {
        let mut payload = BytesMut::new();
        payload.put_u32_le(u32::MAX);
        assert!(decode_batch::<Command>(payload.freeze()).is_err());
    }
}
