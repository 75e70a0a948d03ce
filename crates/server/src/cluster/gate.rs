//! The per-slot gate a slot move's drain is measured by (docs/decisions.md, decision 16):
//! every command that runs on a slot's keys holds the slot's gate from before its route is
//! decided until its reply is made, so "no command on the slot is running on this node" is
//! one atomic load.
//!
//! Why a check at dispatch is enough with it: a command enters (a SeqCst increment), then
//! reads the slot map. The drain reporter reads the map, sees the slot closing, then reads
//! the count. If a command saw the map before the change was published, its increment came
//! before the publication, so before the reporter's read: the reporter sees it running and
//! waits. If it saw the change, its route is not `Serve` and it leaves without running. So
//! once the reporter reads zero after the change, nothing this node started on the slot is
//! still running, and nothing will start.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;

use chorus_core::slots::{Slot, SLOT_COUNT};

/// One counter per slot: the commands on it running at this node.
pub struct SlotGates {
    running: Box<[AtomicU32]>,
}

impl Default for SlotGates {
    fn default() -> Self {
        SlotGates { running: (0..SLOT_COUNT).map(|_| AtomicU32::new(0)).collect() }
    }
}

impl SlotGates {
    /// Count a command on `slot` as running until the guard drops (its reply is made, or its
    /// connection went away: then its client gets no answer either).
    pub fn enter(self: &Arc<Self>, slot: Slot) -> GateGuard {
        self.running[usize::from(slot)].fetch_add(1, SeqCst);
        GateGuard { gates: self.clone(), slot }
    }

    /// Commands on `slot` running now.
    pub fn running(&self, slot: Slot) -> u32 {
        self.running[usize::from(slot)].load(SeqCst)
    }
}

/// A command holding its slot's gate.
pub struct GateGuard {
    gates: Arc<SlotGates>,
    slot: Slot,
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        self.gates.running[usize::from(self.slot)].fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_counts_until_it_drops() {
        let gates = Arc::new(SlotGates::default());
        let first = gates.enter(5);
        let second = gates.enter(5);
        assert_eq!((gates.running(5), gates.running(6)), (2, 0));
        drop(first);
        assert_eq!(gates.running(5), 1);
        drop(second);
        assert_eq!(gates.running(5), 0);
    }
}
