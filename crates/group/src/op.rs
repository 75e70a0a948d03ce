//! Group operations (HyperLoop Table 1), their validation, and what the caller gets back.

use std::fmt;

use bytes::Bytes;
use chorus_core::NodeId;
use chorus_region::{check_range, check_word, RegionError, TenantId};

/// The longest chain: the execute map and result map have one bit / one slot per member.
pub const CHAIN_MEMBERS_MAX: usize = 64;
/// The largest gWRITE payload or gMEMCPY length accepted in one operation.
pub const OP_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// A group, unique per caller deployment (chosen by whoever runs `Initialize`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct GroupId(pub u64);

/// The per-tenant secret every operation carries (HyperLoop §7: each remotely accessible queue
/// is registered with a token known only to the tenant). Compared in constant time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub [u8; 16]);

impl Token {
    pub fn matches(&self, other: &Token) -> bool {
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            diff |= a ^ b;
        }
        diff == 0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// One group memory primitive.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Primitive {
    /// gWRITE: the bytes land at `offset` of every member's region.
    Write { offset: u64, data: Bytes },
    /// gCAS: each member whose bit is set in `execute_map` (bit i = chain position i) compares
    /// the 8-byte little-endian word at `offset` with `old`, swaps in `new` if equal, and
    /// reports the original value in its slot of the result map.
    Cas { offset: u64, old: u64, new: u64, execute_map: u64 },
    /// gMEMCPY: copy `len` bytes from `src` to `dst` within every member's region (ranges may
    /// overlap: memmove semantics).
    Memcpy { src: u64, dst: u64, len: u64 },
    /// gFLUSH by itself: make every preceding operation durable at every member.
    Flush,
}

/// A primitive plus two flags. With `flush` (the interleaved gFLUSH), a member makes this
/// operation and every one before it durable before it forwards (or acknowledges) it. With
/// `yields_to_readers` (a gCAS only), the operation is a write-lock acquisition over a word
/// that local readers may hold (the transaction API's lock word, HyperLoop §5: `rdLock` is a
/// reader count at one replica, `wrLock` a gCAS on every replica): at a member whose compare
/// fails because the word holds only a reader count, it is not applied and does not consume
/// its sequence number, so nothing behind it is applied either until the readers have left
/// (see [`holds_only_readers`] and `ChainMember`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Operation {
    pub primitive: Primitive,
    pub flush: bool,
    pub yields_to_readers: bool,
}

/// Does a lock word hold only local readers: a reader count, no writer? (The transaction
/// API's convention: `txn::WRITER_BIT | owner` for a writer, a count of readers otherwise.)
pub fn holds_only_readers(word: u64) -> bool {
    word != 0 && word & crate::txn::WRITER_BIT == 0
}

impl Operation {
    pub fn write(offset: u64, data: impl Into<Bytes>) -> Operation {
        Operation::of(Primitive::Write { offset, data: data.into() })
    }
    pub fn cas(offset: u64, old: u64, new: u64, execute_map: u64) -> Operation {
        Operation::of(Primitive::Cas { offset, old, new, execute_map })
    }
    pub fn memcpy(src: u64, dst: u64, len: u64) -> Operation {
        Operation::of(Primitive::Memcpy { src, dst, len })
    }
    pub fn flush() -> Operation {
        Operation { flush: true, ..Operation::of(Primitive::Flush) }
    }
    fn of(primitive: Primitive) -> Operation {
        Operation { primitive, flush: false, yields_to_readers: false }
    }
    /// The same gCAS as a write-lock acquisition that waits for local readers: refused (not
    /// applied, its sequence number not consumed) at a member whose compare fails because the
    /// word holds only a reader count ([`holds_only_readers`]). Only for a word that readers
    /// hold briefly and never through the group itself: a reader whose unlock is a later
    /// operation of the same group would wait behind the refused lock forever.
    pub fn yielding_to_readers(mut self) -> Operation {
        debug_assert!(matches!(self.primitive, Primitive::Cas { .. }), "only a gCAS yields to readers");
        self.yields_to_readers = true;
        self
    }
    /// Is this gCAS refused at a member where it found `original` instead of its `old`?
    pub fn yields_at(&self, original: u64) -> bool {
        match self.primitive {
            Primitive::Cas { old, .. } => {
                self.yields_to_readers && original != old && holds_only_readers(original)
            }
            _ => false,
        }
    }
    /// The same operation with an interleaved gFLUSH.
    pub fn durable(mut self) -> Operation {
        self.flush = true;
        self
    }
    /// Does a member flush after applying it?
    pub fn flushes(&self) -> bool {
        self.flush || matches!(self.primitive, Primitive::Flush)
    }

    /// Is this operation well-formed for a group of `chain_len` members over regions of
    /// `region_bytes`? A pure function of its arguments, so the head and every member reach
    /// the same verdict, and a rejected operation changes nothing anywhere.
    pub fn validate(&self, region_bytes: u64, chain_len: usize) -> Result<(), OpError> {
        let region = |e: RegionError| match e {
            RegionError::OutOfBounds { offset, len, .. } => {
                OpError::OutOfBounds { offset, len, region_bytes }
            }
            RegionError::Misaligned { offset } => OpError::Misaligned { offset },
            _ => OpError::OutOfBounds { offset: 0, len: 0, region_bytes },
        };
        match &self.primitive {
            Primitive::Write { offset, data } => {
                let len = data.len() as u64;
                if len > OP_BYTES_MAX {
                    return Err(OpError::TooLarge { len });
                }
                check_range(*offset, len, region_bytes).map_err(region)?;
            }
            Primitive::Cas { offset, execute_map, .. } => {
                check_word(*offset, region_bytes).map_err(region)?;
                let members_mask = if chain_len >= 64 { u64::MAX } else { (1u64 << chain_len) - 1 };
                if execute_map & !members_mask != 0 {
                    return Err(OpError::ExecuteMapBeyondChain { execute_map: *execute_map, chain_len });
                }
            }
            Primitive::Memcpy { src, dst, len } => {
                if *len > OP_BYTES_MAX {
                    return Err(OpError::TooLarge { len: *len });
                }
                check_range(*src, *len, region_bytes).map_err(region)?;
                check_range(*dst, *len, region_bytes).map_err(region)?;
            }
            Primitive::Flush => {}
        }
        Ok(())
    }
}

/// Why an operation was rejected. Rejected operations change nothing at any member.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum OpError {
    #[error("range of {len} bytes at offset {offset} is outside the group's {region_bytes}-byte regions")]
    OutOfBounds { offset: u64, len: u64, region_bytes: u64 },
    #[error("gCAS offset {offset} is not 8-byte aligned")]
    Misaligned { offset: u64 },
    #[error("execute map {execute_map:#x} names members beyond the chain of {chain_len}")]
    ExecuteMapBeyondChain { execute_map: u64, chain_len: usize },
    #[error("operation of {len} bytes is larger than the limit of {OP_BYTES_MAX}")]
    TooLarge { len: u64 },
}

/// The result map of a gCAS: slot i holds member i's original value if its bit was set.
pub type ResultMap = Vec<Option<u64>>;

/// What a completed operation returns.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct OpOutcome {
    /// For gCAS, one slot per member; empty for the other primitives.
    pub result_map: ResultMap,
}

impl OpOutcome {
    /// For a gCAS: the execute map of the members whose compare succeeded (original == old).
    pub fn swapped_map(&self, old: u64) -> u64 {
        self.result_map
            .iter()
            .enumerate()
            .filter(|(_, slot)| **slot == Some(old))
            .fold(0u64, |map, (position, _)| map | (1u64 << position))
    }
}

/// Why a refused message was refused by a member.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the token does not belong to the group's tenant")]
    Unauthorized,
    #[error("member at chain position {position} has failed: {reason}")]
    MemberFailed { position: u8, reason: String },
}

/// What the caller of a group operation can get instead of an [`OpOutcome`].
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum GroupError {
    /// Malformed or out of bounds: rejected, nothing changed at any member.
    #[error("operation rejected: {0}")]
    Rejected(OpError),
    #[error("refused: the token does not belong to the group's tenant")]
    Unauthorized,
    /// A member reported a failure (e.g. its flush failed). The operation may have been
    /// applied at the members before it; the group needs reconfiguration (recovery).
    #[error("member at chain position {position} failed: {reason}")]
    MemberFailed { position: u8, reason: String },
    /// No acknowledgement after every retransmission: a member is down or unreachable. The
    /// outcome is unknown (the operation may have been applied by a prefix of the chain).
    #[error("no acknowledgement from the chain after {attempts} attempts; outcome unknown")]
    Unavailable { attempts: u32 },
    /// The connection to a member was lost (a real-I/O runtime noticed it before any
    /// retransmission ran out). The outcome is unknown, as for [`GroupError::Unavailable`].
    #[error("connection to the chain lost: {0}; outcome unknown")]
    Disconnected(String),
    /// The group failed earlier and has not been reconfigured.
    #[error("the group is broken until it is reconfigured: {0}")]
    Broken(String),
    /// The chain was reconfigured while the operation was in flight; outcome unknown.
    #[error("the chain was reconfigured while the operation was in flight; outcome unknown")]
    Reconfigured,
}

/// A group's configuration, identical at the caller and every member (HyperLoop §5:
/// `Initialize`). `epoch` increases with every reconfiguration.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GroupConfig {
    pub group: GroupId,
    pub tenant: TenantId,
    pub token: Token,
    pub epoch: u64,
    /// The chain, head first: the host node of each member.
    pub chain: Vec<NodeId>,
    /// The node of the caller (transaction coordinator) that the tail acknowledges.
    pub caller: NodeId,
    /// Every member's region has at least this many bytes; operations are validated against it.
    pub region_bytes: u64,
    /// The first sequence number of this epoch.
    pub start_seq: u64,
}

impl GroupConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.chain.is_empty() || self.chain.len() > CHAIN_MEMBERS_MAX {
            return Err(format!("a chain has 1 to {CHAIN_MEMBERS_MAX} members, not {}", self.chain.len()));
        }
        let mut seen = self.chain.clone();
        seen.sort();
        seen.dedup();
        if seen.len() != self.chain.len() {
            return Err("a node appears twice in the chain".to_string());
        }
        if self.chain.contains(&self.caller) {
            return Err("the caller cannot be a member of its own chain".to_string());
        }
        if self.region_bytes == 0 {
            return Err("region_bytes must be positive".to_string());
        }
        if self.start_seq == 0 {
            return Err("start_seq must be at least 1".to_string());
        }
        Ok(())
    }

    /// The execute map naming every member.
    pub fn all_members(&self) -> u64 {
        let n = self.chain.len();
        if n >= 64 {
            u64::MAX
        } else {
            (1u64 << n) - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_is_bounds_and_alignment() {
        let ok = |op: Operation| op.validate(64, 3);
        assert_eq!(ok(Operation::write(60, &b"1234"[..])), Ok(()));
        assert!(matches!(ok(Operation::write(61, &b"1234"[..])), Err(OpError::OutOfBounds { .. })));
        assert!(matches!(ok(Operation::write(u64::MAX, &b"1"[..])), Err(OpError::OutOfBounds { .. })));
        assert_eq!(ok(Operation::cas(56, 0, 1, 0b111)), Ok(()));
        assert_eq!(ok(Operation::cas(12, 0, 1, 1)), Err(OpError::Misaligned { offset: 12 }));
        assert!(matches!(ok(Operation::cas(64, 0, 1, 1)), Err(OpError::OutOfBounds { .. })));
        assert!(matches!(ok(Operation::cas(0, 0, 1, 0b1000)), Err(OpError::ExecuteMapBeyondChain { .. })));
        assert_eq!(ok(Operation::memcpy(0, 32, 32)), Ok(()));
        assert!(ok(Operation::memcpy(0, 33, 32)).is_err());
        assert!(ok(Operation::memcpy(u64::MAX, 0, 2)).is_err());
        assert!(matches!(ok(Operation::memcpy(0, 0, OP_BYTES_MAX + 1)), Err(OpError::TooLarge { .. })));
        assert_eq!(ok(Operation::flush()), Ok(()));
        assert_eq!(Operation::cas(0, 0, 1, u64::MAX).validate(64, 64), Ok(()));
    }

    #[test]
    fn swapped_map_marks_members_whose_compare_succeeded() {
        let outcome = OpOutcome { result_map: vec![Some(0), Some(5), None, Some(0)] };
        assert_eq!(outcome.swapped_map(0), 0b1001);
    }

    #[test]
    fn tokens_compare_by_value() {
        assert!(Token([1; 16]).matches(&Token([1; 16])));
        assert!(!Token([1; 16]).matches(&Token([2; 16])));
    }
}
