//! What one Pub/Sub frame between nodes carries (the payload of `chorus_net::kind::PUBSUB`):
//!
//! ```text
//! | version u8 = 1 | scope u8 (0: PUBLISH, 1: SPUBLISH) | channel length u32 LE | channel | message |
//! ```
//!
//! The message is the rest of the payload. Decoding bounds every length before using it and
//! returns an error, never panics.

use bytes::{BufMut, Bytes, BytesMut};

const VERSION: u8 = 1;
const HEADER_BYTES: usize = 6;

/// Which subscribers a published message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// PUBLISH: channel and pattern subscribers.
    Global,
    /// SPUBLISH: shard channel subscribers.
    Shard,
}

/// One published message as it travels between nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub scope: Scope,
    pub channel: Bytes,
    pub message: Bytes,
}

/// How many bytes [`encode`] makes of a message.
pub fn encoded_len(channel: &[u8], message: &[u8]) -> usize {
    HEADER_BYTES + channel.len() + message.len()
}

pub fn encode(scope: Scope, channel: &[u8], message: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(encoded_len(channel, message));
    out.put_u8(VERSION);
    out.put_u8(match scope {
        Scope::Global => 0,
        Scope::Shard => 1,
    });
    out.put_u32_le(u32::try_from(channel.len()).expect("a channel name under 4 GiB"));
    out.put_slice(channel);
    out.put_slice(message);
    out
}

pub fn decode(payload: Bytes) -> Result<Published, String> {
    if payload.len() < HEADER_BYTES {
        return Err(format!("{} bytes, shorter than the header", payload.len()));
    }
    if payload[0] != VERSION {
        return Err(format!("version {} (this node reads {VERSION})", payload[0]));
    }
    let scope = match payload[1] {
        0 => Scope::Global,
        1 => Scope::Shard,
        other => return Err(format!("unknown scope {other}")),
    };
    let length = u32::from_le_bytes([payload[2], payload[3], payload[4], payload[5]]) as usize;
    if length > payload.len() - HEADER_BYTES {
        return Err(format!("a channel of {length} bytes in {} bytes", payload.len()));
    }
    let channel = payload.slice(HEADER_BYTES..HEADER_BYTES + length);
    let message = payload.slice(HEADER_BYTES + length..);
    Ok(Published { scope, channel, message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_message_round_trips() {
        for scope in [Scope::Global, Scope::Shard] {
            let payload = encode(scope, b"news", b"hello\r\n\x00").freeze();
            assert_eq!(payload.len(), encoded_len(b"news", b"hello\r\n\x00"));
            let decoded = decode(payload).unwrap();
            assert_eq!(decoded, Published { scope, channel: "news".into(), message: "hello\r\n\x00".into() });
        }
        let empty = decode(encode(Scope::Global, b"", b"").freeze()).unwrap();
        assert!(empty.channel.is_empty() && empty.message.is_empty());
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let good = encode(Scope::Global, b"news", b"m").to_vec();
        let mut bad_version = good.clone();
        bad_version[0] = 2;
        let mut bad_scope = good.clone();
        bad_scope[1] = 7;
        let mut long_channel = good.clone();
        long_channel[2] = 200;
        for bad in [&good[..3], &bad_version[..], &bad_scope[..], &long_channel[..]] {
            assert!(decode(Bytes::copy_from_slice(bad)).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(Bytes::from(junk));
        }
    }
}
