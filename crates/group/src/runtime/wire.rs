//! What travels on a group-host connection besides [`GroupMessage`] batches: the handshake
//! (carrying the tenant's token, HyperLoop §7) and control requests (Initialize, one-sided
//! read, ping). Everything is framed with the core codec (length, version, kind, CRC-32) and
//! decoded without trusting any length, never panicking.
//!
//! ```text
//! HELLO   = magic "CHGRP1" | role u8 | tenant u32 | token [16]
//!           role 1 (caller): nothing more
//!           role 2 (link from the previous member): group u64 | epoch u64 | from_position u8
//! WELCOME = (empty)          REFUSE = reason: UTF-8
//! CONTROL = request (below)  REPLY  = reply (below)
//! GROUP   = a batch of GroupMessage (kind 0x20, `FRAME_KIND_GROUP`)
//! ```

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::codec::{
    self, decode_frame, encode_frame, DecodeError, Frame, Reader, WireMessage, WriteExt,
};
use chorus_region::TenantId;
use tokio::io::AsyncReadExt;

use crate::message::{GroupMessage, FRAME_KIND_GROUP};
use crate::op::{GroupId, Token};

pub const FRAME_KIND_HELLO: u8 = 0x21;
pub const FRAME_KIND_WELCOME: u8 = 0x22;
pub const FRAME_KIND_REFUSE: u8 = 0x23;
pub const FRAME_KIND_CONTROL: u8 = 0x24;
pub const FRAME_KIND_REPLY: u8 = 0x25;

/// Largest handshake frame accepted before the peer is authenticated.
pub const HELLO_BYTES_MAX: usize = 1024;
/// Largest frame payload: one operation is at most 16 MiB (`OP_BYTES_MAX`), batches are split
/// well below this.
pub const FRAME_BYTES_MAX: usize = codec::FRAME_PAYLOAD_BYTES_MAX;
/// Batches of group messages are split into frames of about this size.
pub const BATCH_BYTES_TARGET: usize = 1024 * 1024;

const MAGIC: &[u8] = b"CHGRP1";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// A tenant's client: control requests, operations (at the head), acknowledgements back.
    Caller,
    /// The previous member of a group's chain forwarding operations.
    Link { group: GroupId, epoch: u64, from_position: u8 },
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hello {
    pub role: Role,
    pub tenant: TenantId,
    pub token: Token,
}

impl WireMessage for Hello {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_slice(MAGIC);
        match self.role {
            Role::Caller => buf.put_u8(1),
            Role::Link { .. } => buf.put_u8(2),
        }
        buf.put_u32_le(self.tenant.0);
        buf.put_slice(&self.token.0);
        if let Role::Link { group, epoch, from_position } = self.role {
            buf.put_u64_le(group.0);
            buf.put_u64_le(epoch);
            buf.put_u8(from_position);
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        for expected in MAGIC {
            if reader.u8()? != *expected {
                return Err(DecodeError::Invalid("not a chorus group handshake"));
            }
        }
        let role = reader.u8()?;
        let tenant = TenantId(reader.u32()?);
        let token = read_token(reader)?;
        let role = match role {
            1 => Role::Caller,
            2 => Role::Link {
                group: GroupId(reader.u64()?),
                epoch: reader.u64()?,
                from_position: reader.u8()?,
            },
            tag => return Err(DecodeError::UnknownTag { what: "group connection role", tag }),
        };
        Ok(Hello { role, tenant, token })
    }
}

fn read_token(reader: &mut Reader) -> Result<Token, DecodeError> {
    let mut token = [0u8; 16];
    for byte in token.iter_mut() {
        *byte = reader.u8()?;
    }
    Ok(Token(token))
}

/// Control requests from a caller to a host.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ControlRequest {
    /// HyperLoop §5 `Initialize` on one member: register (or reopen) the tenant's region and
    /// bind the group's member at `position` to it; a non-tail member connects to `next`.
    Initialize {
        id: u64,
        group: GroupId,
        epoch: u64,
        start_seq: u64,
        region: String,
        region_bytes: u64,
        chain_len: u8,
        position: u8,
        /// The data address of the member at `position + 1` (absent at the tail).
        next: Option<String>,
        /// The caller's UDP port for the kernel data path's acknowledgements (0: the caller
        /// uses the user-space path over this connection).
        caller_port: u16,
    },
    /// A one-sided read of the member's region (HyperLoop's lock-free read at head or tail).
    Read {
        id: u64,
        group: GroupId,
        offset: u64,
        len: u64,
    },
    Ping {
        id: u64,
    },
    /// Register (or find again) the tenant's region on the host's kernel data path and say
    /// where it is, so that the caller (on the same machine, as root) maps it: the chain
    /// store's node reads the region its member's host writes.
    KernelRegion {
        id: u64,
        region: String,
        region_bytes: u64,
    },
}

impl ControlRequest {
    pub fn id(&self) -> u64 {
        match self {
            ControlRequest::Initialize { id, .. }
            | ControlRequest::Read { id, .. }
            | ControlRequest::Ping { id }
            | ControlRequest::KernelRegion { id, .. } => *id,
        }
    }
}

impl WireMessage for ControlRequest {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            ControlRequest::Initialize {
                id,
                group,
                epoch,
                start_seq,
                region,
                region_bytes,
                chain_len,
                position,
                next,
                caller_port,
            } => {
                buf.put_u8(1);
                buf.put_u64_le(*id);
                buf.put_u64_le(group.0);
                buf.put_u64_le(*epoch);
                buf.put_u64_le(*start_seq);
                buf.put_bytes_prefixed(region.as_bytes());
                buf.put_u64_le(*region_bytes);
                buf.put_u8(*chain_len);
                buf.put_u8(*position);
                buf.put_optional_bytes(next.as_ref().map(|n| Bytes::copy_from_slice(n.as_bytes())).as_ref());
                buf.put_u16_le(*caller_port);
            }
            ControlRequest::Read { id, group, offset, len } => {
                buf.put_u8(2);
                buf.put_u64_le(*id);
                buf.put_u64_le(group.0);
                buf.put_u64_le(*offset);
                buf.put_u64_le(*len);
            }
            ControlRequest::Ping { id } => {
                buf.put_u8(3);
                buf.put_u64_le(*id);
            }
            ControlRequest::KernelRegion { id, region, region_bytes } => {
                buf.put_u8(4);
                buf.put_u64_le(*id);
                buf.put_bytes_prefixed(region.as_bytes());
                buf.put_u64_le(*region_bytes);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            1 => ControlRequest::Initialize {
                id: reader.u64()?,
                group: GroupId(reader.u64()?),
                epoch: reader.u64()?,
                start_seq: reader.u64()?,
                region: utf8(reader.bytes()?)?,
                region_bytes: reader.u64()?,
                chain_len: reader.u8()?,
                position: reader.u8()?,
                next: reader.optional_bytes()?.map(utf8).transpose()?,
                caller_port: reader.u16()?,
            },
            2 => ControlRequest::Read {
                id: reader.u64()?,
                group: GroupId(reader.u64()?),
                offset: reader.u64()?,
                len: reader.u64()?,
            },
            3 => ControlRequest::Ping { id: reader.u64()? },
            4 => ControlRequest::KernelRegion {
                id: reader.u64()?,
                region: utf8(reader.bytes()?)?,
                region_bytes: reader.u64()?,
            },
            tag => return Err(DecodeError::UnknownTag { what: "group control request", tag }),
        })
    }
}

fn utf8(bytes: Bytes) -> Result<String, DecodeError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Invalid("string is not UTF-8"))
}

/// A host's answers to control requests.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ControlReply {
    /// The member is bound; its region file is at `region_path` on that host (the tenant's
    /// process there maps it read-only).
    Initialized {
        id: u64,
        region_path: String,
    },
    /// Naïve mode: this host started a replica process for the tenant; initialize it there.
    Redirect {
        id: u64,
        addr: String,
    },
    Data {
        id: u64,
        bytes: Bytes,
    },
    Pong {
        id: u64,
    },
    Error {
        id: u64,
        message: String,
    },
    /// The member is bound on the kernel data path: operations go as UDP datagrams to this
    /// host's `data_port`; the region is a slot of the host's BPF regions map.
    InitializedKernel {
        id: u64,
        region_path: String,
        data_port: u16,
    },
    /// The region is slot `slot` of BPF map `map_id` (an mmapable array of
    /// `kernel::layout::SLOT_BYTES` slots); operations go as datagrams to `data_port`.
    KernelRegion {
        id: u64,
        map_id: u32,
        slot: u32,
        data_port: u16,
    },
}

impl ControlReply {
    pub fn id(&self) -> u64 {
        match self {
            ControlReply::Initialized { id, .. }
            | ControlReply::Redirect { id, .. }
            | ControlReply::Data { id, .. }
            | ControlReply::Pong { id }
            | ControlReply::Error { id, .. }
            | ControlReply::InitializedKernel { id, .. }
            | ControlReply::KernelRegion { id, .. } => *id,
        }
    }
}

impl WireMessage for ControlReply {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            ControlReply::Initialized { id, region_path } => {
                buf.put_u8(1);
                buf.put_u64_le(*id);
                buf.put_bytes_prefixed(region_path.as_bytes());
            }
            ControlReply::Redirect { id, addr } => {
                buf.put_u8(2);
                buf.put_u64_le(*id);
                buf.put_bytes_prefixed(addr.as_bytes());
            }
            ControlReply::Data { id, bytes } => {
                buf.put_u8(3);
                buf.put_u64_le(*id);
                buf.put_bytes_prefixed(bytes);
            }
            ControlReply::Pong { id } => {
                buf.put_u8(4);
                buf.put_u64_le(*id);
            }
            ControlReply::Error { id, message } => {
                buf.put_u8(5);
                buf.put_u64_le(*id);
                buf.put_bytes_prefixed(message.as_bytes());
            }
            ControlReply::InitializedKernel { id, region_path, data_port } => {
                buf.put_u8(6);
                buf.put_u64_le(*id);
                buf.put_bytes_prefixed(region_path.as_bytes());
                buf.put_u16_le(*data_port);
            }
            ControlReply::KernelRegion { id, map_id, slot, data_port } => {
                buf.put_u8(7);
                buf.put_u64_le(*id);
                buf.put_u32_le(*map_id);
                buf.put_u32_le(*slot);
                buf.put_u16_le(*data_port);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            1 => ControlReply::Initialized { id: reader.u64()?, region_path: utf8(reader.bytes()?)? },
            2 => ControlReply::Redirect { id: reader.u64()?, addr: utf8(reader.bytes()?)? },
            3 => ControlReply::Data { id: reader.u64()?, bytes: reader.bytes()? },
            4 => ControlReply::Pong { id: reader.u64()? },
            5 => ControlReply::Error {
                id: reader.u64()?,
                message: String::from_utf8_lossy(&reader.bytes()?).into_owned(),
            },
            6 => ControlReply::InitializedKernel {
                id: reader.u64()?,
                region_path: utf8(reader.bytes()?)?,
                data_port: reader.u16()?,
            },
            7 => ControlReply::KernelRegion {
                id: reader.u64()?,
                map_id: reader.u32()?,
                slot: reader.u32()?,
                data_port: reader.u16()?,
            },
            tag => return Err(DecodeError::UnknownTag { what: "group control reply", tag }),
        })
    }
}

/// One frame holding one message.
pub fn frame_of<M: WireMessage>(kind: u8, message: &M) -> Bytes {
    let mut payload = BytesMut::new();
    message.encode(&mut payload);
    let mut frame = BytesMut::with_capacity(payload.len() + codec::FRAME_HEADER_BYTES);
    encode_frame(kind, &payload, &mut frame);
    frame.freeze()
}

/// Frames carrying `messages` as batches (kind [`FRAME_KIND_GROUP`]), each message encoded
/// once, split at about [`BATCH_BYTES_TARGET`]. One turn's messages for one destination.
pub fn group_frames(messages: &[GroupMessage]) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut payload = BytesMut::new();
    let mut count = 0u32;
    let mut flush = |payload: &mut BytesMut, count: &mut u32| {
        if *count == 0 {
            return;
        }
        payload[..4].copy_from_slice(&count.to_le_bytes());
        let mut frame = BytesMut::with_capacity(payload.len() + codec::FRAME_HEADER_BYTES);
        encode_frame(FRAME_KIND_GROUP, payload, &mut frame);
        frames.push(frame.freeze());
        payload.clear();
        *count = 0;
    };
    for message in messages {
        if count == 0 {
            payload.put_u32_le(0);
        }
        message.encode(&mut payload);
        count += 1;
        if payload.len() >= BATCH_BYTES_TARGET {
            flush(&mut payload, &mut count);
        }
    }
    flush(&mut payload, &mut count);
    frames
}

/// Read one whole frame, keeping any following bytes in `buf`. `Ok(None)`: the peer closed
/// the connection cleanly between frames.
pub async fn read_frame<R: AsyncReadExt + Unpin>(
    stream: &mut R,
    buf: &mut BytesMut,
    payload_bytes_max: usize,
) -> io::Result<Option<Frame>> {
    loop {
        match decode_frame(buf, payload_bytes_max) {
            Ok(Some(frame)) => return Ok(Some(frame)),
            Ok(None) => {}
            Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error.to_string())),
        }
        if stream.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-frame"))
            };
        }
    }
}

/// A token as 32 hexadecimal digits (how configurations and the CLI spell it).
pub fn parse_token(text: &str) -> Result<Token, String> {
    let text = text.trim();
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("a tenant token is 32 hexadecimal digits".to_string());
    }
    let mut token = [0u8; 16];
    for (i, byte) in token.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(Token(token))
}

pub fn format_token(token: &Token) -> String {
    token.0.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_and_control_messages_round_trip() {
        let token = Token([7; 16]);
        for role in [Role::Caller, Role::Link { group: GroupId(9), epoch: 3, from_position: 1 }] {
            let hello = Hello { role, tenant: TenantId(4), token };
            let mut buf = BytesMut::new();
            hello.encode(&mut buf);
            assert_eq!(Hello::decode_exact(buf.freeze()).unwrap(), hello);
        }
        let requests = [
            ControlRequest::Initialize {
                id: 1,
                group: GroupId(2),
                epoch: 1,
                start_seq: 1,
                region: "log".into(),
                region_bytes: 4096,
                chain_len: 3,
                position: 1,
                next: Some("127.0.0.1:9".into()),
                caller_port: 4242,
            },
            ControlRequest::Read { id: 2, group: GroupId(2), offset: 8, len: 16 },
            ControlRequest::Ping { id: 3 },
            ControlRequest::KernelRegion { id: 4, region: "chain".into(), region_bytes: 1 << 20 },
        ];
        for request in requests {
            let mut buf = BytesMut::new();
            request.encode(&mut buf);
            assert_eq!(ControlRequest::decode_exact(buf.freeze()).unwrap(), request);
        }
        let replies = [
            ControlReply::Initialized { id: 1, region_path: "/dev/shm/x".into() },
            ControlReply::Redirect { id: 1, addr: "127.0.0.1:1".into() },
            ControlReply::Data { id: 2, bytes: Bytes::from_static(b"abc") },
            ControlReply::Pong { id: 3 },
            ControlReply::Error { id: 4, message: "no".into() },
            ControlReply::InitializedKernel { id: 5, region_path: "bpf slot 3".into(), data_port: 7000 },
            ControlReply::KernelRegion { id: 6, map_id: 41, slot: 3, data_port: 7001 },
        ];
        for reply in replies {
            let mut buf = BytesMut::new();
            reply.encode(&mut buf);
            assert_eq!(ControlReply::decode_exact(buf.freeze()).unwrap(), reply);
        }
    }

    #[test]
    fn garbage_never_panics() {
        for junk in [
            &b""[..],
            b"CHGRP1",
            b"CHGRP1\x02\x00",
            b"\x01\x00\x00",
            b"\x05\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ] {
            let _ = Hello::decode_exact(Bytes::copy_from_slice(junk));
            let _ = ControlRequest::decode_exact(Bytes::copy_from_slice(junk));
            let _ = ControlReply::decode_exact(Bytes::copy_from_slice(junk));
        }
    }

    #[test]
    fn tokens_parse_from_hex() {
        let token = parse_token("000102030405060708090a0b0c0d0e0f").unwrap();
        assert_eq!(token.0[15], 15);
        assert_eq!(format_token(&token), "000102030405060708090a0b0c0d0e0f");
        assert!(parse_token("xyz").is_err());
        assert!(parse_token("000102030405060708090a0b0c0d0e0g").is_err());
    }

    #[test]
    fn batches_split_and_decode() {
        let messages: Vec<GroupMessage> = (0..40)
            .map(|seq| GroupMessage::Ack { group: GroupId(1), epoch: 1, seq, outcome: Ok(vec![]) })
            .collect();
        let frames = group_frames(&messages);
        assert_eq!(frames.len(), 1);
        let mut buf = BytesMut::from(&frames[0][..]);
        let frame = decode_frame(&mut buf, FRAME_BYTES_MAX).unwrap().unwrap();
        assert_eq!(codec::decode_batch::<GroupMessage>(frame.payload).unwrap(), messages);
    }
}
