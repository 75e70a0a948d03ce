//! The caller's side of the kernel data path's datagrams: an operation becomes one datagram
//! (`layout::Header` + a gWRITE's bytes), the tail's acknowledgement comes back as a header.
//! Operations larger than a datagram are split here into consecutive operations that the
//! kernel applies in sequence order, which is what the original means.

use bytes::Bytes;

use super::layout::{
    Header, CHAIN_MAX, CHUNK_BYTES_MAX, FLAG_FLUSH, FLAG_YIELDS_TO_READERS, HEADER_BYTES, KIND_ACK,
    KIND_DATA, KIND_OP, KIND_READ, MAGIC, PRIMITIVE_CAS, PRIMITIVE_FLUSH, PRIMITIVE_MEMCPY, PRIMITIVE_WRITE,
    VERDICT_BY_CALLER,
};
use crate::op::{GroupId, Operation, Primitive, Token};
use chorus_region::TenantId;

/// Who the datagrams of one group belong to.
#[derive(Clone, Copy, Debug)]
pub struct GroupAddress {
    pub tenant: TenantId,
    pub group: GroupId,
    pub epoch: u64,
    pub token: Token,
}

impl GroupAddress {
    /// A header of `kind` for this group, numbered `seq`, everything else zero.
    fn header(&self, kind: u8, seq: u64) -> Header {
        Header {
            magic: MAGIC,
            kind,
            tenant: self.tenant.0,
            group: self.group.0,
            epoch: self.epoch,
            token: self.token.0,
            seq,
            ..Header::default()
        }
    }
}

/// The datagram for operation `seq`. `rejected`: the caller found it malformed (it travels as
/// a no-op so every member's sequence advances, and the tail reports it). A valid operation
/// must fit one datagram ([`split`] first).
pub fn encode_op(to: &GroupAddress, seq: u64, operation: &Operation, rejected: bool, buf: &mut Vec<u8>) {
    let mut header = to.header(KIND_OP, seq);
    header.flags = if operation.flushes() { FLAG_FLUSH } else { 0 };
    if operation.yields_to_readers {
        header.flags |= FLAG_YIELDS_TO_READERS;
    }
    let mut data: &[u8] = &[];
    if rejected {
        header.primitive = PRIMITIVE_FLUSH;
        header.verdict = VERDICT_BY_CALLER;
    } else {
        match &operation.primitive {
            Primitive::Write { offset, data: bytes } => {
                debug_assert!(bytes.len() as u64 <= CHUNK_BYTES_MAX, "split before encoding");
                header.primitive = PRIMITIVE_WRITE;
                header.a = *offset;
                header.c = bytes.len() as u64;
                data = bytes;
            }
            Primitive::Cas { offset, old, new, execute_map } => {
                header.primitive = PRIMITIVE_CAS;
                (header.a, header.b, header.c, header.d) = (*offset, *old, *new, *execute_map);
            }
            Primitive::Memcpy { src, dst, len } => {
                debug_assert!(*len <= CHUNK_BYTES_MAX, "split before encoding");
                header.primitive = PRIMITIVE_MEMCPY;
                (header.a, header.b, header.c) = (*src, *dst, *len);
            }
            Primitive::Flush => header.primitive = PRIMITIVE_FLUSH,
        }
    }
    buf.clear();
    buf.extend_from_slice(header_bytes(&header));
    buf.extend_from_slice(data);
}

/// A one-sided read of `len` (1 to [`CHUNK_BYTES_MAX`]) bytes at `offset`, numbered `id`:
/// padded with `len` bytes that the member overwrites.
pub fn encode_read(to: &GroupAddress, id: u64, offset: u64, len: u64, buf: &mut Vec<u8>) {
    debug_assert!((1..=CHUNK_BYTES_MAX).contains(&len));
    let header = Header { a: offset, c: len, ..to.header(KIND_READ, id) };
    buf.clear();
    buf.extend_from_slice(header_bytes(&header));
    buf.resize(HEADER_BYTES + len as usize, 0);
}

/// What comes back to a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ack(Ack),
    /// The bytes of read `id`.
    Data {
        tenant: TenantId,
        group: GroupId,
        id: u64,
        bytes: Vec<u8>,
    },
}

/// Parse an acknowledgement or a read's answer; anything else is `None`.
pub fn decode_reply(datagram: &[u8], chain_len: usize) -> Option<Reply> {
    if let Some(ack) = decode_ack(datagram, chain_len) {
        return Some(Reply::Ack(ack));
    }
    let header = read_header(datagram)?;
    let len = header.c as usize;
    if header.kind != KIND_DATA || datagram.len() != HEADER_BYTES + len {
        return None;
    }
    Some(Reply::Data {
        tenant: TenantId(header.tenant),
        group: GroupId(header.group),
        id: header.seq,
        bytes: datagram[HEADER_BYTES..].to_vec(),
    })
}

fn read_header(datagram: &[u8]) -> Option<Header> {
    if datagram.len() < HEADER_BYTES {
        return None;
    }
    // SAFETY: at least HEADER_BYTES are there, `Header` accepts any bit pattern, and the read
    // is unaligned-safe.
    let header: Header = unsafe { std::ptr::read_unaligned(datagram.as_ptr().cast::<Header>()) };
    (header.magic == MAGIC).then_some(header)
}

fn header_bytes(header: &Header) -> &[u8] {
    // SAFETY: `Header` is `#[repr(C)]` plain integers with no padding (160 bytes, checked in
    // layout's tests); viewing it as bytes reads only initialized memory.
    unsafe { std::slice::from_raw_parts((header as *const Header).cast::<u8>(), HEADER_BYTES) }
}

/// A tail's acknowledgement, as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub tenant: TenantId,
    pub group: GroupId,
    pub epoch: u64,
    pub seq: u64,
    /// 0: applied everywhere; otherwise why it was rejected (see `layout::VERDICT_*`).
    pub verdict: u8,
    /// The gCAS result map, one slot per member of a chain of `chain_len`.
    pub results: Vec<Option<u64>>,
}

/// Parse an acknowledgement; anything else (short, wrong magic, not an ack) is `None`.
pub fn decode_ack(datagram: &[u8], chain_len: usize) -> Option<Ack> {
    if chain_len > CHAIN_MAX {
        return None;
    }
    let header = read_header(datagram)?;
    if header.kind != KIND_ACK {
        return None;
    }
    let results =
        (0..chain_len).map(|i| (header.present >> i & 1 == 1).then_some(header.results[i])).collect();
    Some(Ack {
        tenant: TenantId(header.tenant),
        group: GroupId(header.group),
        epoch: header.epoch,
        seq: header.seq,
        verdict: header.verdict,
        results,
    })
}

/// Split a valid operation into operations that each fit one datagram and, applied one
/// after another, do what the original does: a gWRITE in consecutive pieces; a gMEMCPY in
/// pieces ordered so that overlapping ranges still behave like memmove (back to front when
/// the destination is above the source: every piece reads its source before any later piece
/// overwrites it). Only the last piece carries the gFLUSH, which covers all earlier ones.
pub fn split(operation: &Operation) -> Vec<Operation> {
    let chunk = CHUNK_BYTES_MAX;
    let mut pieces: Vec<Operation> = match &operation.primitive {
        Primitive::Write { offset, data } if data.len() as u64 > chunk => data
            .chunks(chunk as usize)
            .enumerate()
            .map(|(i, piece)| Operation::write(offset + i as u64 * chunk, Bytes::copy_from_slice(piece)))
            .collect(),
        Primitive::Memcpy { src, dst, len } if *len > chunk => {
            let starts: Vec<u64> = (0..len.div_ceil(chunk)).map(|i| i * chunk).collect();
            let piece = |start: u64| Operation::memcpy(src + start, dst + start, (len - start).min(chunk));
            if dst > src {
                starts.into_iter().rev().map(piece).collect()
            } else {
                starts.into_iter().map(piece).collect()
            }
        }
        _ => return vec![operation.clone()],
    };
    if operation.flush {
        if let Some(last) = pieces.last_mut() {
            last.flush = true;
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::layout::VERDICT_OUT_OF_BOUNDS;

    fn model_apply(memory: &mut [u8], operation: &Operation) {
        match &operation.primitive {
            Primitive::Write { offset, data } => {
                memory[*offset as usize..*offset as usize + data.len()].copy_from_slice(data)
            }
            Primitive::Memcpy { src, dst, len } => {
                memory.copy_within(*src as usize..(*src + *len) as usize, *dst as usize)
            }
            _ => {}
        }
    }

    #[test]
    fn split_pieces_do_what_the_whole_does() {
        for (src, dst, len) in
            [(0u64, 100u64, 5000u64), (100, 0, 5000), (0, 1024, 4096), (7, 7, 3000), (0, 9000, 2048)]
        {
            let mut seed: Vec<u8> = (0..12_000u32).map(|i| (i * 31 % 251) as u8).collect();
            let mut whole = seed.clone();
            let operation = Operation::memcpy(src, dst, len).durable();
            model_apply(&mut whole, &operation);
            let pieces = split(&operation);
            assert!(pieces
                .iter()
                .all(|p| matches!(p.primitive, Primitive::Memcpy { len, .. } if len <= CHUNK_BYTES_MAX)));
            assert_eq!(pieces.iter().filter(|p| p.flush).count(), 1);
            assert!(pieces.last().unwrap().flush);
            for piece in &pieces {
                model_apply(&mut seed, piece);
            }
            assert_eq!(seed, whole, "memcpy {src} -> {dst} of {len}");
        }
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let pieces = split(&Operation::write(10, data.clone()));
        assert_eq!(pieces.len(), 3);
        let mut memory = vec![0u8; 4000];
        for piece in &pieces {
            model_apply(&mut memory, piece);
        }
        assert_eq!(&memory[10..3010], &data[..]);
        assert!(pieces.iter().all(|p| !p.flush));
    }

    #[test]
    fn acks_decode_and_junk_does_not() {
        let to = GroupAddress { tenant: TenantId(3), group: GroupId(9), epoch: 2, token: Token([7; 16]) };
        let mut buf = Vec::new();
        encode_op(&to, 41, &Operation::cas(8, 1, 2, 0b101), false, &mut buf);
        assert_eq!(buf.len(), HEADER_BYTES);
        assert_eq!(decode_ack(&buf, 3), None, "an operation is not an acknowledgement");
        buf[4] = KIND_ACK;
        buf[7] = VERDICT_OUT_OF_BOUNDS;
        buf[88..96].copy_from_slice(&0b100u64.to_le_bytes());
        buf[96 + 16..96 + 24].copy_from_slice(&77u64.to_le_bytes());
        let ack = decode_ack(&buf, 3).unwrap();
        assert_eq!(
            (ack.tenant, ack.group, ack.epoch, ack.seq, ack.verdict),
            (TenantId(3), GroupId(9), 2, 41, 1)
        );
        assert_eq!(ack.results, vec![None, None, Some(77)]);
        assert_eq!(decode_ack(&buf[..100], 3), None);
        assert_eq!(decode_ack(&[0u8; 400], 3), None);
    }
}
