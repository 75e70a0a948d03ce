//! Redis Cluster's hash slots: the key space is split into [`SLOT_COUNT`] slots, a key's slot
//! is CRC16 (XMODEM) of the key, or of its `{hash tag}`, modulo 16384. Exactly Redis'
//! `keyHashSlot` (cluster spec, "Keys distribution model"), so every cluster-aware client
//! routes a key to the same slot as the server does.

/// Slots in the key space (Redis Cluster's 16384).
pub const SLOT_COUNT: u16 = 16_384;

/// A hash slot, `0..SLOT_COUNT`.
pub type Slot = u16;

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection. Redis' `crc16`.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The part of `key` that is hashed: the bytes between the first `{` and the first `}` after
/// it, if that is not empty; otherwise the whole key (Redis' rule, so `{}` and a lone `{`
/// hash the whole key).
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|byte| *byte == b'{') else { return key };
    match key[open + 1..].iter().position(|byte| *byte == b'}') {
        Some(0) | None => key,
        Some(length) => &key[open + 1..open + 1 + length],
    }
}

/// The slot `key` belongs to.
pub fn key_slot(key: &[u8]) -> Slot {
    crc16(hash_tag(key)) & (SLOT_COUNT - 1)
}

/// Split `0..SLOT_COUNT` into `groups` contiguous ranges as `redis-cli --cluster create`
/// does: group `g` gets `[g * 16384 / groups, (g + 1) * 16384 / groups)`.
pub fn even_ranges(groups: u16) -> Vec<(Slot, Slot)> {
    assert!((1..=SLOT_COUNT).contains(&groups), "between 1 and {SLOT_COUNT} groups");
    let count = u32::from(SLOT_COUNT);
    let bound = |g: u16| (u32::from(g) * count / u32::from(groups)) as u16;
    (0..groups).map(|g| (bound(g), (u32::from(bound(g + 1)) - 1) as u16)).collect()
}

/// What a key being moved to another group holds at its old group while its value is copied
/// (docs/decisions.md, decision 16): this prefix, then the stored value. It starts with the
/// prefix typed values reserve ([`crate::data::value::RESERVED_PREFIX`]), so no client can
/// write one; while it is there the key is neither served here nor at the new group.
pub const MOVING_MAGIC: &[u8] = b"\x00\xffchorus-moving\x01";

/// The marker a moving key holds: its stored value (string, typed or with a deadline) wrapped.
pub fn moving_marker(value: &[u8]) -> bytes::Bytes {
    [MOVING_MAGIC, value].concat().into()
}

/// What a key holds at its old group once its value is at the new one, until the move is
/// sealed (docs/decisions.md, decision 16): the old group keeps answering `-TRYAGAIN` for it,
/// not `-ASK`, while a late copy could still land at the new group.
pub const MOVED_TOMBSTONE: &[u8] = b"\x00\xffchorus-moved\x01";

/// The stored value inside a moving marker; `None` if `stored` is not one.
pub fn moving_value(stored: &bytes::Bytes) -> Option<bytes::Bytes> {
    stored.starts_with(MOVING_MAGIC).then(|| stored.slice(MOVING_MAGIC.len()..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_marker_wraps_any_stored_value_and_no_client_value_is_one() {
        for value in [&b"plain"[..], b"", crate::data::value::TTL_MAGIC] {
            let marker = moving_marker(value);
            assert!(crate::data::is_reserved(&marker));
            assert_eq!(moving_value(&marker).as_deref(), Some(value));
        }
        assert_eq!(moving_value(&bytes::Bytes::from_static(b"plain")), None);
    }

    #[test]
    fn crc16_check_value() {
        // The cluster spec's reference: "123456789" -> 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn keyslot_matches_redis_published_values() {
        // CLUSTER KEYSLOT examples from Redis' documentation and test suite.
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"bar{hash_tag}"), 2515);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        // The cluster spec's examples.
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"{"), b"{");
        assert_eq!(hash_tag(b"no tag}{"), b"no tag}{");
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
    }

    #[test]
    fn even_ranges_cover_every_slot_once() {
        for groups in [1, 2, 3, 5, 16] {
            let ranges = even_ranges(groups);
            assert_eq!(ranges.len(), groups as usize);
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges.last().unwrap().1, SLOT_COUNT - 1);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].1 + 1, pair[1].0);
            }
        }
        // As redis-cli --cluster create splits three masters.
        assert_eq!(even_ranges(3), vec![(0, 5460), (5461, 10921), (10922, 16383)]);
    }
}
