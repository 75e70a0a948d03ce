//! Where a command on a slot runs, given the slot map a node has applied: the one routing
//! rule, shared by the server (cluster/map.rs) and the simulator's migration swarm, and the
//! per-key steps that move a slot's keys (docs/decisions.md, decision 16; the phases are
//! [`crate::metadata::SlotMove`]'s).

use bytes::Bytes;
use chorus_core::slots::{moving_marker, moving_value, Slot, MOVED_TOMBSTONE};
use chorus_core::{Command, Key, Outcome, RmwOp};

use crate::metadata::{MovePhase, SlotTable};

/// What a node does with a command on a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Run it here.
    Serve,
    /// Group `0` owns the slot: `-MOVED`.
    Moved(u16),
    /// The slot is closing here: `-TRYAGAIN` (nothing ran).
    TryAgain,
    /// The slot is moving from this group to group `to`, and the owner has drained: read the
    /// command's keys here; if none is held, `-ASK to`, else `-TRYAGAIN`.
    CheckPresence { to: u16 },
}

/// The route of a command on `slot` at a node of group `me`; `asking` when the client sent
/// `ASKING` just before it.
pub fn route(table: &SlotTable, me: u16, slot: Slot, asking: bool) -> Route {
    let owner = table.owner(slot);
    match table.moving(slot) {
        None if owner == me => Route::Serve,
        None => Route::Moved(owner),
        Some(moving) if owner == me => match moving.phase {
            MovePhase::Closing => Route::TryAgain,
            _ => Route::CheckPresence { to: moving.to },
        },
        // The new group serves what the owner sent on with -ASK, and only once every node of
        // the owner has drained (before that, an owner node that had not heard of the move
        // could still write the key).
        Some(moving) if moving.to == me && moving.phase != MovePhase::Closing && asking => Route::Serve,
        Some(_) => Route::Moved(owner),
    }
}

/// Whether a node of group `me` takes a mover's copy for the move of `slot` that began at
/// `began`: only while that move is copying into `me`. Once it is sealing, a copy that
/// arrives late is refused (a client may have written the key since).
pub fn accepts_copy(table: &SlotTable, me: u16, slot: Slot, began: u64) -> bool {
    table
        .moving(slot)
        .is_some_and(|moving| moving.to == me && moving.began == began && moving.phase == MovePhase::Copying)
}

/// What a presence check found: `-ASK` (as `Moved(to)`) if no key is held, else `-TRYAGAIN`.
pub fn presence_verdict(values: &[Option<Bytes>], to: u16) -> Route {
    if values.iter().all(Option::is_none) {
        Route::Moved(to)
    } else {
        Route::TryAgain
    }
}

/// One key's move from its old group (the source) to the new one (the target), as a small
/// state machine: the caller runs each [`MoveStep`] and feeds the outcome back. While
/// copying: mark the value at the source (a compare-and-swap through the source's protocol),
/// write it at the target, replace the marker by a tombstone. While cleaning: delete whatever
/// the source still holds. Movers may race on a key: every copy of a marked key writes the
/// same bytes, and a copy that arrives after the target sealed is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyMove {
    /// Read the key at the source.
    Read,
    /// Replace `value` by its marker at the source.
    Mark { value: Bytes },
    /// Write `value` at the target (the marker holds it at the source).
    Copy { value: Bytes },
    /// Replace the marker by a tombstone.
    Bury { value: Bytes },
    /// The key is absent at the source, or a tombstone.
    Done,
}

/// What the mover does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveStep {
    /// Run this at the source's core.
    Source(Command),
    /// Write this value at the target (through its protocol).
    Target {
        key: Key,
        value: Bytes,
    },
    Done,
}

fn tombstone() -> Bytes {
    Bytes::from_static(MOVED_TOMBSTONE)
}

impl KeyMove {
    pub fn start() -> KeyMove {
        KeyMove::Read
    }

    pub fn step(&self, key: &Key) -> MoveStep {
        let cas = |expected: Bytes, new: Option<Bytes>| {
            MoveStep::Source(Command::Rmw {
                key: key.clone(),
                op: RmwOp::CompareAndSwap { expected: Some(expected), new },
            })
        };
        match self {
            KeyMove::Read => MoveStep::Source(Command::Read { key: key.clone() }),
            KeyMove::Mark { value } => cas(value.clone(), Some(moving_marker(value))),
            KeyMove::Copy { value } => MoveStep::Target { key: key.clone(), value: value.clone() },
            KeyMove::Bury { value } => cas(moving_marker(value), Some(tombstone())),
            KeyMove::Done => MoveStep::Done,
        }
    }

    /// The next state once the step ran: `outcome` is the source command's, or `Written`
    /// for a write at the target. An error (the source is not serving, the target refused)
    /// repeats the step.
    pub fn next(self, outcome: &Outcome) -> KeyMove {
        match (self, outcome) {
            (KeyMove::Read, Outcome::Value(None)) => KeyMove::Done,
            (KeyMove::Read, Outcome::Value(Some(stored))) if stored[..] == *MOVED_TOMBSTONE => KeyMove::Done,
            (KeyMove::Read, Outcome::Value(Some(stored))) => match moving_value(stored) {
                Some(value) => KeyMove::Copy { value },
                None => KeyMove::Mark { value: stored.clone() },
            },
            (KeyMove::Mark { value }, Outcome::Cas { swapped: true, .. }) => KeyMove::Copy { value },
            // Changed under us (a write that was in flight, or another mover): read again.
            (KeyMove::Mark { .. }, Outcome::Cas { swapped: false, .. }) => KeyMove::Read,
            (KeyMove::Copy { value }, Outcome::Written) => KeyMove::Bury { value },
            (KeyMove::Bury { .. }, Outcome::Cas { .. }) => KeyMove::Read,
            (state, _) => state,
        }
    }
}

/// Deleting what the source still holds of a key once the move is sealed: the command for
/// what was read (`None`: nothing left).
pub fn clean_step(key: &Key, stored: Option<&Bytes>) -> Option<Command> {
    stored.map(|stored| Command::Rmw {
        key: key.clone(),
        op: RmwOp::CompareAndSwap { expected: Some(stored.clone()), new: None },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::SlotChange;
    use chorus_core::slots::SLOT_COUNT;
    use chorus_core::NodeId;

    fn table() -> SlotTable {
        SlotTable::new(vec![0, 0, 1, 1], vec![0; usize::from(SLOT_COUNT)])
    }

    #[test]
    fn a_moving_slot_is_closed_then_asked_then_sealed_then_moved() {
        let mut table = table();
        assert_eq!(route(&table, 0, 5, false), Route::Serve);
        assert_eq!(route(&table, 1, 5, true), Route::Moved(0));
        table.apply(&SlotChange::BeginMove { slot: 5, to: 1 }).unwrap();
        let began = table.moving(5).unwrap().began;
        assert_eq!(route(&table, 0, 5, false), Route::TryAgain);
        assert_eq!(route(&table, 0, 6, false), Route::Serve);
        // The new group serves nothing before the owner has drained, ASKING or not.
        assert_eq!(route(&table, 1, 5, true), Route::Moved(0));
        assert!(!accepts_copy(&table, 1, 5, began));
        table.apply(&SlotChange::Drained { slot: 5, node: NodeId(0), began }).unwrap();
        table.apply(&SlotChange::Drained { slot: 5, node: NodeId(1), began }).unwrap();
        assert_eq!(route(&table, 0, 5, false), Route::CheckPresence { to: 1 });
        assert_eq!(route(&table, 1, 5, true), Route::Serve);
        assert_eq!(route(&table, 1, 5, false), Route::Moved(0));
        assert!(accepts_copy(&table, 1, 5, began));
        assert!(!accepts_copy(&table, 0, 5, began) && !accepts_copy(&table, 1, 5, began + 1));
        table.apply(&SlotChange::Copied { slot: 5, began }).unwrap();
        assert!(!accepts_copy(&table, 1, 5, began));
        assert_eq!(route(&table, 1, 5, true), Route::Serve);
        table.apply(&SlotChange::Sealed { slot: 5, node: NodeId(2), began }).unwrap();
        table.apply(&SlotChange::Sealed { slot: 5, node: NodeId(3), began }).unwrap();
        assert_eq!(route(&table, 0, 5, false), Route::CheckPresence { to: 1 });
        table.apply(&SlotChange::Cleaned { slot: 5, began }).unwrap();
        assert_eq!(route(&table, 0, 5, true), Route::Moved(1));
        assert_eq!(route(&table, 1, 5, false), Route::Serve);
        assert_eq!(presence_verdict(&[None, None], 1), Route::Moved(1));
        assert_eq!(presence_verdict(&[None, Some(Bytes::from_static(b"x"))], 1), Route::TryAgain);
    }

    /// The key's state at the source as `RmwOp::apply` sees it, stepped through a move.
    #[test]
    fn a_key_move_marks_copies_then_buries_and_survives_a_concurrent_change() {
        let key = Key::from_static(b"k");
        let mut stored = Some(Bytes::from_static(b"v1"));
        let mut target = None;
        let mut state = KeyMove::start();
        let mut raced = false;
        for _ in 0..20 {
            let outcome = match state.step(&key) {
                MoveStep::Done => break,
                MoveStep::Target { value, .. } => {
                    target = Some(value);
                    Outcome::Written
                }
                MoveStep::Source(Command::Read { .. }) => Outcome::Value(stored.clone()),
                MoveStep::Source(Command::Rmw { op, .. }) => {
                    // A write that was in flight lands between the read and the mark, once.
                    if !raced && matches!(state, KeyMove::Mark { .. }) {
                        stored = Some(Bytes::from_static(b"v2"));
                        raced = true;
                    }
                    let effect = op.apply(stored.as_ref());
                    if let Some(write) = effect.write {
                        stored = write;
                    }
                    effect.outcome
                }
                other => panic!("{other:?}"),
            };
            state = state.next(&outcome);
        }
        assert_eq!(state, KeyMove::Done);
        assert_eq!(stored.as_deref(), Some(MOVED_TOMBSTONE));
        assert_eq!(target.as_deref(), Some(&b"v2"[..]));
        let clean = clean_step(&key, stored.as_ref()).unwrap();
        let Command::Rmw { op, .. } = clean else { panic!() };
        assert_eq!(op.apply(stored.as_ref()).write, Some(None));
    }

    #[test]
    fn a_typed_value_is_marked_by_its_stored_bytes() {
        let typed = moving_marker(b"x"); // Any reserved-prefixed value stands in for a typed one.
        let mark = KeyMove::Mark { value: typed.clone() };
        let MoveStep::Source(Command::Rmw { op, .. }) = mark.step(&Key::from_static(b"k")) else { panic!() };
        let effect = op.apply(Some(&typed));
        assert_eq!(effect.write, Some(Some(moving_marker(&typed))));
    }
}
