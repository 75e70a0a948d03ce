//! What a chain member keeps beside its region so that it can restart as the member it was
//! (issue 24; docs/decisions.md, "The chain's durable state"): the region file holds the log
//! and the database, and this small record says where the region stands in the chain.
//!
//! The runtime appends a record every time it changes (a new view, a configuration installed,
//! linked or unlinked, a copy begun) to the node's append-only file, and with `appendfsync
//! always` syncs it before the turn's messages leave: a member's `Configured`, `LinkedAck` or
//! acknowledgement never precedes the state it reports. The last record wins at restart.

use chorus_core::{NodeId, NodeSet};

/// A chain member's place in the chain, as last recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainState {
    /// The view this was recorded in, and its live members: a node restarted as the member it
    /// was resumes in it (the views before it, which the membership service hands it again
    /// at restart, are history its order already reflects).
    pub view_epoch: u64,
    pub view_live: NodeSet,
    /// The highest configuration generation this node's coordinator used in that view: a
    /// coordinator restarted in the same view starts above it, so members take its
    /// configurations for newer ones.
    pub generation: u64,
    /// The linked members in chain order, as last configured (empty while joining).
    pub order: Vec<NodeId>,
    /// Linked and holding all the data (the core's `caught_up`).
    pub linked: bool,
    /// The region is a whole, consistent image of the chain's state at some point: executed
    /// records up to its last-executed word, not a partial copy. A joiner offers such a region
    /// for a catch-up of only the records it missed.
    pub region_complete: bool,
}

const VERSION: u8 = 1;
/// Version, view epoch, view members, generation, flags, order length.
const HEADER_BYTES: usize = 27;
const NODES_MAX: usize = 64;

impl ChainState {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(20 + self.order.len());
        bytes.push(VERSION);
        bytes.extend_from_slice(&self.view_epoch.to_le_bytes());
        bytes.extend_from_slice(&self.view_live.bits().to_le_bytes());
        bytes.extend_from_slice(&self.generation.to_le_bytes());
        bytes.push(self.linked as u8 | (self.region_complete as u8) << 1);
        bytes.push(self.order.len() as u8);
        bytes.extend(self.order.iter().map(|node| node.0));
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<ChainState, String> {
        let malformed = || format!("a chain state record of {} bytes does not parse", bytes.len());
        if bytes.first() != Some(&VERSION) || bytes.len() < HEADER_BYTES {
            return Err(malformed());
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let flags = bytes[25];
        let len = bytes[26] as usize;
        if flags > 3 || len > NODES_MAX || bytes.len() != HEADER_BYTES + len {
            return Err(malformed());
        }
        Ok(ChainState {
            view_epoch: word(1),
            view_live: NodeSet::from_bits(word(9)),
            generation: word(17),
            linked: flags & 1 != 0,
            region_complete: flags & 2 != 0,
            order: bytes[HEADER_BYTES..].iter().map(|id| NodeId(*id)).collect(),
        })
    }

    /// The state the last of `records` (oldest first) describes; records that are not chain
    /// states are an error (the files belong to another protocol).
    pub fn last_of(records: &[Vec<u8>]) -> Result<Option<ChainState>, String> {
        let mut last = None;
        for (index, record) in records.iter().enumerate() {
            last = Some(ChainState::decode(record).map_err(|error| format!("record {index}: {error}"))?);
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_garbage_is_refused() {
        let state = ChainState {
            view_epoch: 7,
            view_live: NodeSet::from_bits(0b101),
            generation: 3,
            order: vec![NodeId(2), NodeId(0)],
            linked: true,
            region_complete: true,
        };
        assert_eq!(ChainState::decode(&state.encode()), Ok(state.clone()));
        let mut bad = state.encode();
        bad.push(1);
        assert!(ChainState::decode(&bad).is_err());
        assert!(ChainState::decode(&[]).is_err());
        let other = ChainState { linked: false, order: Vec::new(), ..state.clone() };
        assert_eq!(ChainState::last_of(&[state.encode(), other.encode()]), Ok(Some(other)));
    }
}
