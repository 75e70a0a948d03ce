//! Identities and ordering: nodes, epochs, views and logical timestamps.

use std::fmt;

/// A replica's identity within a cluster. Small and dense: node sets are 64-bit masks.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct NodeId(pub u8);

impl NodeId {
    /// Node ids are limited so that a [`NodeSet`] fits in one machine word.
    pub const COUNT_MAX: usize = 64;

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A set of nodes as a bit mask: O(1) membership, union and subset tests with no allocation,
/// which matters because ACK sets are checked on every message of the write path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NodeSet {
    bits: u64,
}

impl NodeSet {
    pub const EMPTY: NodeSet = NodeSet { bits: 0 };

    pub fn from_bits(bits: u64) -> NodeSet {
        NodeSet { bits }
    }
    pub fn bits(self) -> u64 {
        self.bits
    }
    pub fn single(node: NodeId) -> NodeSet {
        let mut set = NodeSet::EMPTY;
        set.insert(node);
        set
    }
    pub fn insert(&mut self, node: NodeId) {
        assert!(node.index() < NodeId::COUNT_MAX, "node id {node} out of range");
        self.bits |= 1u64 << node.index();
    }
    pub fn remove(&mut self, node: NodeId) {
        if node.index() < NodeId::COUNT_MAX {
            self.bits &= !(1u64 << node.index());
        }
    }
    pub fn contains(self, node: NodeId) -> bool {
        node.index() < NodeId::COUNT_MAX && self.bits & (1u64 << node.index()) != 0
    }
    pub fn is_superset_of(self, other: NodeSet) -> bool {
        self.bits & other.bits == other.bits
    }
    pub fn without(self, node: NodeId) -> NodeSet {
        let mut set = self;
        set.remove(node);
        set
    }
    pub fn len(self) -> usize {
        self.bits.count_ones() as usize
    }
    pub fn is_empty(self) -> bool {
        self.bits == 0
    }
    pub fn iter(self) -> impl Iterator<Item = NodeId> {
        (0..NodeId::COUNT_MAX as u8).map(NodeId).filter(move |node| self.contains(*node))
    }
}

impl FromIterator<NodeId> for NodeSet {
    fn from_iter<I: IntoIterator<Item = NodeId>>(iter: I) -> NodeSet {
        let mut set = NodeSet::EMPTY;
        for node in iter {
            set.insert(node);
        }
        set
    }
}

impl fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// A membership epoch (Hermes §2.4: `epoch_id`). Incremented by every membership update;
/// protocol messages carry the sender's epoch and receivers drop messages of another epoch.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Epoch(pub u64);

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// A membership view: the epoch and the set of live (operational) replicas in it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct View {
    pub epoch: Epoch,
    pub live: NodeSet,
}

/// A per-key logical timestamp `[version, cid]` (Hermes §3.1). Ordered lexicographically:
/// `A > B` iff `A.version > B.version`, or the versions are equal and `A.cid > B.cid`. The
/// derived `Ord` compares fields in declaration order, which is exactly that.
///
/// `cid` is the coordinator's (possibly virtual, §3.3 O2) node id, which makes the timestamps
/// of concurrent writes from different coordinators unique.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub version: u64,
    pub cid: u32,
}

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp { version: 0, cid: 0 };

    pub fn new(version: u64, cid: u32) -> Timestamp {
        Timestamp { version, cid }
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{},{}]", self.version, self.cid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_order_by_version_then_cid() {
        // Hermes §3.1, footnote 5.
        assert!(Timestamp::new(2, 0) > Timestamp::new(1, 9));
        assert!(Timestamp::new(1, 3) > Timestamp::new(1, 1));
        assert_eq!(Timestamp::new(1, 3), Timestamp::new(1, 3));
    }

    #[test]
    fn node_set_operations() {
        let set: NodeSet = [NodeId(0), NodeId(2), NodeId(63)].into_iter().collect();
        assert_eq!(set.len(), 3);
        assert!(set.contains(NodeId(63)));
        assert!(!set.contains(NodeId(1)));
        assert!(set.is_superset_of(NodeSet::single(NodeId(2))));
        assert!(!set.without(NodeId(2)).contains(NodeId(2)));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![NodeId(0), NodeId(2), NodeId(63)]);
    }
}
