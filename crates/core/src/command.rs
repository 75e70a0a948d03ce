//! Client commands and their outcomes.
//!
//! Every key is an independent register holding `Option<Value>` (`None` = absent). A command
//! touches exactly one key. The meaning of each read-modify-write is defined once, in
//! [`RmwOp::apply`], and used by every protocol and by the linearizability checker's model.

use crate::data::{self, Data, ExecOp};
use crate::hash;
use bytes::Bytes;

pub type Key = Bytes;
pub type Value = Bytes;

/// What a client asks a replica to do.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Command {
    /// Return the key's current value.
    Read { key: Key },
    /// Blind write; `value: None` deletes the key.
    Write { key: Key, value: Option<Value> },
    /// Atomic read-modify-write of one key (Hermes §3.6).
    Rmw { key: Key, op: RmwOp },
}

impl Command {
    pub fn key(&self) -> &Key {
        match self {
            Command::Read { key } | Command::Write { key, .. } | Command::Rmw { key, .. } => key,
        }
    }

    pub fn is_update(&self) -> bool {
        !matches!(self, Command::Read { .. })
    }
}

/// The read-modify-writes Chorus offers. Each maps to one or more Redis commands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RmwOp {
    /// Replace the value with `new` iff it currently equals `expected` (`None` = absent).
    /// Chorus `CAS key expected new`.
    CompareAndSwap { expected: Option<Value>, new: Option<Value> },
    /// Add `delta` to the decimal integer stored at the key (absent counts as 0). `INCRBY`.
    IncrementBy(i64),
    /// Set the value only if the key is absent. `SETNX`, `SET .. NX`.
    SetIfAbsent(Value),
    /// Set the value only if the key is present. `SET .. XX`.
    SetIfPresent(Value),
    /// Set (or delete, with `None`) and return the previous value. `GETSET`, `SET .. GET`.
    Swap(Option<Value>),
    /// Set fields of the hash stored at the key (see [`crate::hash`]); later pairs win. The
    /// outcome is how many fields are new. `HSET`, `HMSET`. Refused, changing nothing, when
    /// the encoded hash would exceed `encoded_bytes_max`.
    HashSet { pairs: Vec<(Value, Value)>, encoded_bytes_max: u32 },
    /// Remove fields of the hash stored at the key; the outcome is how many existed. `HDEL`.
    HashDelete(Vec<Value>),
    /// A typed command (lists, sets, sorted sets, expiry, ...) run by [`data::apply`]; the
    /// outcome is [`Outcome::Data`].
    Exec(ExecOp),
}

/// The result of a command as the client sees it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// A read, or the previous value returned by [`RmwOp::Swap`].
    Value(Option<Value>),
    /// A blind write took effect.
    Written,
    /// A compare-and-swap: whether it swapped, and the value it found.
    Cas { swapped: bool, previous: Option<Value> },
    /// The new value after [`RmwOp::IncrementBy`].
    Integer(i64),
    /// Whether a conditional set ([`RmwOp::SetIfAbsent`], [`RmwOp::SetIfPresent`]) took effect.
    Flag(bool),
    /// The command failed; see [`CommandError`] for whether it could have taken effect.
    Error(CommandError),
    /// The reply of an [`RmwOp::Exec`] (which may itself be an error line).
    Data(Data),
}

#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CommandError {
    /// The stored value is not a decimal 64-bit integer. Deterministic, like a read.
    #[error("value is not an integer or out of range")]
    NotInteger,
    /// The increment would overflow an i64. Deterministic, like a read.
    #[error("increment or decrement would overflow")]
    Overflow,
    /// The replica is not operational (no valid view/lease) and did not execute the command.
    #[error("replica is not serving: {0}")]
    Unavailable(&'static str),
    /// The replica stopped serving while the update was in flight: another replica may still
    /// complete it. The client must treat it as possibly applied.
    #[error("outcome unknown: the replica left the view while the update was in flight")]
    OutcomeUnknown,
    /// A hash operation on a key holding a string. Deterministic, like a read.
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    /// The stored hash does not decode. Deterministic, like a read.
    #[error("stored hash is corrupt")]
    HashCorrupt,
    /// The update would make the value larger than its limit. Deterministic, like a read.
    #[error("the value would exceed the size limit")]
    ValueTooLarge,
    /// An at-most-once session (raftlog, Cyclone §3.4) already executed a newer sequence
    /// number than this request's; its result is gone and the request did not run.
    #[error("stale sequence number: this client session already executed a newer request")]
    StaleSequence,
    /// The key is locked by a multi-key transaction in progress (raftlog); the command did
    /// not run. Replicas retry such commands themselves once the lock is released; only an
    /// external at-most-once session sees this error.
    #[error("key is locked by a transaction in progress; retry")]
    Locked,
    /// A string or hash RMW found a typed value (a list, set, sorted set, or a value with an
    /// expiry deadline) that only [`RmwOp::Exec`] handles; nothing changed, and the server
    /// re-runs the command as an `Exec`. Deterministic, like a read.
    #[error("the key holds a typed value or a deadline; run the command as a typed command")]
    Typed,
}

impl CommandError {
    /// Whether the error is the command's linearizable result (the state was read and the
    /// command decided not to write), as opposed to a refusal before execution.
    pub fn is_deterministic_result(&self) -> bool {
        matches!(
            self,
            CommandError::NotInteger
                | CommandError::Overflow
                | CommandError::WrongType
                | CommandError::HashCorrupt
                | CommandError::ValueTooLarge
                | CommandError::Typed
        )
    }
}

/// What applying an RMW to a value does: the new value to write, if any, and the outcome.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RmwEffect {
    /// `None`: the RMW leaves the key unchanged (it behaves as a read).
    /// `Some(v)`: the key becomes `v` (`Some(None)` deletes it).
    pub write: Option<Option<Value>>,
    pub outcome: Outcome,
}

impl RmwOp {
    /// Apply the operation to `current`. Pure and deterministic.
    pub fn apply(&self, current: Option<&Value>) -> RmwEffect {
        if let RmwOp::Exec(op) = self {
            return data::apply(op, current);
        }
        // A compare-and-swap whose expected value is itself reserved compares stored bytes:
        // only the server sends one (a slot move's markers, `crate::slots::moving_marker`),
        // since clients cannot write reserved values.
        if let RmwOp::CompareAndSwap { expected: Some(expected), new } = self {
            if data::is_reserved(expected) {
                let swapped = current == Some(expected);
                return RmwEffect {
                    write: swapped.then(|| new.clone()),
                    outcome: Outcome::Cas { swapped, previous: current.cloned() },
                };
            }
        }
        // Values only `Exec` understands: a deadline must be judged against the op's clock,
        // and Redis answers WRONGTYPE where these string RMWs would misread a list or a set.
        let plain_hash = matches!(self, RmwOp::HashSet { .. } | RmwOp::HashDelete(_))
            && current.is_some_and(|value| hash::is_hash(value));
        if current.is_some_and(|value| data::is_reserved(value)) && !plain_hash {
            return RmwEffect { write: None, outcome: Outcome::Error(CommandError::Typed) };
        }
        match self {
            RmwOp::CompareAndSwap { expected, new } => {
                let swapped = current == expected.as_ref();
                RmwEffect {
                    write: swapped.then(|| new.clone()),
                    outcome: Outcome::Cas { swapped, previous: current.cloned() },
                }
            }
            RmwOp::IncrementBy(delta) => match parse_integer(current) {
                Err(error) => RmwEffect { write: None, outcome: Outcome::Error(error) },
                Ok(old) => match old.checked_add(*delta) {
                    None => RmwEffect { write: None, outcome: Outcome::Error(CommandError::Overflow) },
                    Some(new) => RmwEffect {
                        write: Some(Some(Bytes::from(new.to_string()))),
                        outcome: Outcome::Integer(new),
                    },
                },
            },
            RmwOp::SetIfAbsent(value) => {
                let set = current.is_none();
                RmwEffect { write: set.then(|| Some(value.clone())), outcome: Outcome::Flag(set) }
            }
            RmwOp::SetIfPresent(value) => {
                let set = current.is_some();
                RmwEffect { write: set.then(|| Some(value.clone())), outcome: Outcome::Flag(set) }
            }
            RmwOp::Swap(value) => {
                RmwEffect { write: Some(value.clone()), outcome: Outcome::Value(current.cloned()) }
            }
            RmwOp::HashSet { pairs, encoded_bytes_max } => {
                update_hash(current, *encoded_bytes_max as usize, |fields| hash::set(fields, pairs))
            }
            RmwOp::HashDelete(names) => {
                update_hash(current, usize::MAX, |fields| hash::remove(fields, names))
            }
            RmwOp::Exec(_) => unreachable!("handled above"),
        }
    }
}

/// Decode the hash at `current`, change it, and write it back if it changed. The outcome is
/// the count `change` returns.
fn update_hash(
    current: Option<&Value>,
    encoded_bytes_max: usize,
    change: impl FnOnce(&mut hash::Fields) -> usize,
) -> RmwEffect {
    let refuse = |error| RmwEffect { write: None, outcome: Outcome::Error(error) };
    let mut fields = match hash::decode(current) {
        Ok(fields) => fields,
        Err(hash::HashError::WrongType) => return refuse(CommandError::WrongType),
        Err(hash::HashError::Corrupt) => return refuse(CommandError::HashCorrupt),
    };
    let count = change(&mut fields) as i64;
    let new = hash::encode(&fields);
    if new.as_ref() == current {
        return RmwEffect { write: None, outcome: Outcome::Integer(count) };
    }
    if new.as_ref().is_some_and(|value| value.len() > encoded_bytes_max) {
        return refuse(CommandError::ValueTooLarge);
    }
    RmwEffect { write: Some(new), outcome: Outcome::Integer(count) }
}

/// Redis integer semantics: absent is 0; otherwise the value must be a canonical decimal i64.
pub fn parse_integer(value: Option<&Value>) -> Result<i64, CommandError> {
    let Some(value) = value else { return Ok(0) };
    let text = std::str::from_utf8(value).map_err(|_| CommandError::NotInteger)?;
    let number: i64 = text.parse().map_err(|_| CommandError::NotInteger)?;
    // Reject "+1", "01", " 1": Redis only treats the canonical form as an integer.
    if number.to_string() != text {
        return Err(CommandError::NotInteger);
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Value {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn compare_and_swap_swaps_only_on_match() {
        let op = RmwOp::CompareAndSwap { expected: Some(b("a")), new: Some(b("b")) };
        assert_eq!(op.apply(Some(&b("a"))).write, Some(Some(b("b"))));
        let miss = op.apply(Some(&b("x")));
        assert_eq!(miss.write, None);
        assert_eq!(miss.outcome, Outcome::Cas { swapped: false, previous: Some(b("x")) });
        let on_absent = RmwOp::CompareAndSwap { expected: None, new: Some(b("b")) };
        assert_eq!(on_absent.apply(None).write, Some(Some(b("b"))));
    }

    #[test]
    fn increment_follows_redis_integer_rules() {
        assert_eq!(RmwOp::IncrementBy(5).apply(None).outcome, Outcome::Integer(5));
        assert_eq!(RmwOp::IncrementBy(-1).apply(Some(&b("10"))).write, Some(Some(b("9"))));
        for bad in ["x", "01", "+1", " 1", ""] {
            let effect = RmwOp::IncrementBy(1).apply(Some(&b(bad)));
            assert_eq!(effect.outcome, Outcome::Error(CommandError::NotInteger), "{bad:?}");
            assert_eq!(effect.write, None);
        }
        let max = i64::MAX.to_string();
        assert_eq!(
            RmwOp::IncrementBy(1).apply(Some(&b(&max))).outcome,
            Outcome::Error(CommandError::Overflow)
        );
    }

    #[test]
    fn hash_updates_count_fields_and_refuse_strings_and_oversize() {
        let set = |pairs: &[(&str, &str)], max: u32| RmwOp::HashSet {
            pairs: pairs.iter().map(|(f, v)| (b(f), b(v))).collect(),
            encoded_bytes_max: max,
        };
        let first = set(&[("a", "1"), ("b", "2")], 1024).apply(None);
        assert_eq!(first.outcome, Outcome::Integer(2));
        let stored = first.write.unwrap().unwrap();
        let again = set(&[("a", "9"), ("c", "3")], 1024).apply(Some(&stored));
        assert_eq!(again.outcome, Outcome::Integer(1), "a existed, c is new");
        let unchanged = set(&[("a", "1")], 1024).apply(Some(&stored));
        assert_eq!(unchanged.write, None, "an update that changes nothing behaves as a read");
        assert_eq!(set(&[("a", "1")], 8).apply(None).outcome, Outcome::Error(CommandError::ValueTooLarge));
        assert_eq!(set(&[("a", "1")], 1024).apply(Some(&b("text"))).write, None);
        assert_eq!(
            set(&[("a", "1")], 1024).apply(Some(&b("text"))).outcome,
            Outcome::Error(CommandError::WrongType)
        );
        let delete = RmwOp::HashDelete(vec![b("a"), b("b"), b("zz")]).apply(Some(&stored));
        assert_eq!(delete.outcome, Outcome::Integer(2));
        assert_eq!(delete.write, Some(None), "the empty hash is the absent key");
        assert_eq!(RmwOp::HashDelete(vec![b("a")]).apply(None).write, None);
    }

    #[test]
    fn conditional_sets_and_swap() {
        assert_eq!(RmwOp::SetIfAbsent(b("v")).apply(None).outcome, Outcome::Flag(true));
        assert_eq!(RmwOp::SetIfAbsent(b("v")).apply(Some(&b("o"))).write, None);
        assert_eq!(RmwOp::SetIfPresent(b("v")).apply(None).write, None);
        assert_eq!(RmwOp::SetIfPresent(b("v")).apply(Some(&b("o"))).write, Some(Some(b("v"))));
        let swap = RmwOp::Swap(None).apply(Some(&b("o")));
        assert_eq!(swap.write, Some(None));
        assert_eq!(swap.outcome, Outcome::Value(Some(b("o"))));
    }
}
