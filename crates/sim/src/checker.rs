//! Linearizability checker: Wing & Gong's search with Lowe's memoization ("WGL", as in Lowe,
//! "Testing for linearizability", 2017, and as in Porcupine and Knossos).
//!
//! Every command touches exactly one key and keys are independent registers, so a history is
//! linearizable iff each key's sub-history is (P-compositionality). Each key is checked alone
//! against a register model whose read-modify-writes are [`RmwOp::apply`], the same function the
//! replicas run.
//!
//! The search walks a time-ordered list of call and return events. At each step it tries to
//! linearize a pending operation whose call precedes the first remaining return; reaching a
//! return means the operation that returned could not be placed, so it backtracks. Lowe's
//! memoization skips configurations (linearized set, register value) that were already
//! explored. The search uses an explicit stack, so thousands of operations per key cannot
//! overflow the thread's stack, and a budget of explored configurations turns a pathological
//! key into an [`KeyVerdict::Inconclusive`] verdict instead of a hang.
//!
//! Operations whose outcome is unknown (no completion) may take effect at any point after their
//! invocation, with any outcome, or never. They get no return event: the search may linearize
//! them whenever their call is reachable and succeeds once every *completed* operation is placed.

use std::fmt;

use bytes::Bytes;
use chorus_core::{Command, CommandError, Key, Outcome, RmwOp, Time, Value};
use rustc_hash::FxHashMap;

use crate::history::{Completion, History, Operation};

/// Limits for the search.
#[derive(Clone, Debug)]
pub struct CheckerConfig {
    /// Explored configurations after which a key is reported as inconclusive.
    pub states_max_per_key: usize,
}

impl Default for CheckerConfig {
    fn default() -> Self {
        CheckerConfig { states_max_per_key: 2_000_000 }
    }
}

/// The result of checking one key's sub-history.
#[derive(Clone, Debug)]
pub enum KeyVerdict {
    Linearizable,
    Violation(Violation),
    /// The search budget ran out before an answer was found.
    Inconclusive,
}

/// A key whose sub-history has no linearization.
#[derive(Clone, Debug)]
pub struct Violation {
    pub key: Key,
    /// A readable excerpt of the key's operations, sorted by invocation time: the operation
    /// that could not be placed, the end of the longest linearizable prefix and the operations
    /// concurrent with it.
    pub operations: Vec<Operation>,
    pub explanation: String,
}

/// The result of checking a whole history.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Operations that took part in the check (refused and unknown-outcome reads are left out).
    pub ops_checked: usize,
    /// Keys with at least one operation that took part in the check.
    pub keys_checked: usize,
    pub violations: Vec<Violation>,
    /// Keys whose search ran out of budget; neither proven linearizable nor violating.
    pub inconclusive_keys: Vec<Key>,
}

impl CheckReport {
    /// No key violates linearizability. Inconclusive keys do not count as violations.
    pub fn is_linearizable(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Check every key of `history` independently; keys are reported in byte order.
pub fn check_history(history: &History, config: &CheckerConfig) -> CheckReport {
    let mut report = CheckReport::default();
    for (key, operations) in relevant_operations_by_key(history) {
        report.keys_checked += 1;
        report.ops_checked += operations.len();
        match check_relevant(&key, &operations, config) {
            KeyVerdict::Linearizable => {}
            KeyVerdict::Violation(violation) => report.violations.push(violation),
            KeyVerdict::Inconclusive => report.inconclusive_keys.push(key),
        }
    }
    report
}

/// Check one key's sub-history. Operations on other keys in `operations` are ignored.
pub fn check_key(key: &Key, operations: &[Operation], config: &CheckerConfig) -> KeyVerdict {
    let relevant: Vec<&Operation> =
        operations.iter().filter(|op| op.command.key() == key && takes_part(op)).collect();
    check_relevant(key, &relevant, config)
}

/// Whether the operation constrains the history. A refused command (`Unavailable`) never took
/// effect, and a read whose outcome is unknown changes nothing and reports nothing.
fn takes_part(op: &Operation) -> bool {
    let refused = matches!(
        op.completion,
        Some(Completion { outcome: Outcome::Error(CommandError::Unavailable(_)), .. })
    );
    !refused && (known_outcome(op).is_some() || op.command.is_update())
}

/// The outcome the operation must be linearized with; `None` when it may have taken effect
/// with any outcome, or not at all: no completion, or an error that is neither the command's
/// result nor a refusal before execution (e.g. the replica left the view mid-update).
fn known_outcome(op: &Operation) -> Option<&Outcome> {
    let outcome = &op.completion.as_ref()?.outcome;
    match outcome {
        Outcome::Error(error) if !error.is_deterministic_result() => None,
        _ => Some(outcome),
    }
}

/// When the operation's effect is bounded: its completion, if its outcome is known.
fn response_time(op: &Operation) -> Option<Time> {
    known_outcome(op).and(op.completion.as_ref()).map(|completion| completion.at)
}

fn relevant_operations_by_key(history: &History) -> Vec<(Key, Vec<&Operation>)> {
    let mut by_key: FxHashMap<Key, Vec<&Operation>> = FxHashMap::default();
    for op in history.operations.iter().filter(|op| takes_part(op)) {
        by_key.entry(op.command.key().clone()).or_default().push(op);
    }
    let mut keys: Vec<_> = by_key.into_iter().collect();
    keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    keys
}

fn check_relevant(key: &Key, operations: &[&Operation], config: &CheckerConfig) -> KeyVerdict {
    let mut operations = operations.to_vec();
    operations.sort_by_key(|op| (op.invoke, op.id));
    match Search::new(&operations).run(config.states_max_per_key) {
        SearchResult::Linearizable => KeyVerdict::Linearizable,
        SearchResult::BudgetExhausted => KeyVerdict::Inconclusive,
        SearchResult::NotLinearizable(dead_end) => {
            KeyVerdict::Violation(describe_violation(key, &operations, &dead_end))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The register model.

/// The register's value after `command` takes effect on `current`, if the recorded `outcome`
/// (`None`: unknown, anything goes) is what it would return there.
fn next_value(command: &Command, outcome: Option<&Outcome>, current: &Option<Value>) -> Option<Option<Value>> {
    match command {
        Command::Read { .. } => match outcome {
            None => Some(current.clone()),
            Some(Outcome::Value(seen)) if seen == current => Some(current.clone()),
            Some(_) => None,
        },
        Command::Write { value, .. } => {
            matches!(outcome, None | Some(Outcome::Written)).then(|| value.clone())
        }
        Command::Rmw { op, .. } => {
            let effect = op.apply(current.as_ref());
            if outcome.is_some_and(|recorded| *recorded != effect.outcome) {
                return None;
            }
            Some(effect.write.unwrap_or_else(|| current.clone()))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The event list: calls and returns in time order, as a doubly linked list so that linearizing
// an operation (removing its call and return) and undoing it are O(1).

const HEAD: usize = 0;

#[derive(Clone, Copy, Debug)]
enum Event {
    Head,
    Tail,
    /// `ret`: the node of the operation's return, `None` if its outcome is unknown.
    Call { op: usize, ret: Option<usize> },
    Return { op: usize },
}

struct EventList {
    events: Vec<Event>,
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl EventList {
    fn new(operations: &[&Operation]) -> EventList {
        // At equal times calls sort before returns: touching intervals count as concurrent,
        // which is the permissive reading when the clock cannot tell them apart.
        let mut order: Vec<(Time, bool, usize)> = Vec::with_capacity(operations.len() * 2);
        for (index, op) in operations.iter().enumerate() {
            order.push((op.invoke, false, index));
            if let Some(response) = response_time(op) {
                order.push((response.max(op.invoke), true, index));
            }
        }
        order.sort_unstable();

        let mut return_node = vec![None; operations.len()];
        let mut events = Vec::with_capacity(order.len() + 2);
        events.push(Event::Head);
        for &(_, is_return, op) in &order {
            if is_return {
                return_node[op] = Some(events.len());
                events.push(Event::Return { op });
            } else {
                events.push(Event::Call { op, ret: None });
            }
        }
        events.push(Event::Tail);
        for event in &mut events {
            if let Event::Call { op, ret } = event {
                *ret = return_node[*op];
            }
        }

        let tail = events.len() - 1;
        let next = (0..=tail).map(|node| (node + 1).min(tail)).collect();
        let prev = (0..=tail).map(|node| node.saturating_sub(1)).collect();
        EventList { events, next, prev }
    }

    fn first(&self) -> usize {
        self.next[HEAD]
    }

    fn next(&self, node: usize) -> usize {
        self.next[node]
    }

    fn event(&self, node: usize) -> Event {
        self.events[node]
    }

    /// Remove an operation's call and return (if any) from the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        if let Event::Call { ret: Some(ret), .. } = self.events[call] {
            self.unlink(ret);
        }
    }

    /// Undo [`Self::lift`]; relinking in reverse order restores the list exactly.
    fn unlift(&mut self, call: usize) {
        if let Event::Call { ret: Some(ret), .. } = self.events[call] {
            self.relink(ret);
        }
        self.relink(call);
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        self.prev[next] = prev;
    }

    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        self.prev[next] = node;
    }
}

// ---------------------------------------------------------------------------------------------
// Sets of linearized operations and the memo of explored configurations.

#[derive(Clone, Default)]
struct BitSet {
    words: Vec<u64>,
}

impl BitSet {
    fn with_len(bits: usize) -> BitSet {
        BitSet { words: vec![0; bits.div_ceil(64)] }
    }

    fn insert(&mut self, bit: usize) {
        self.words[bit / 64] |= 1 << (bit % 64);
    }

    fn remove(&mut self, bit: usize) {
        self.words[bit / 64] &= !(1 << (bit % 64));
    }

    /// The words up to the last non-zero one; enough to test inclusion.
    fn trimmed(&self) -> &[u64] {
        let len = self.words.iter().rposition(|word| *word != 0).map_or(0, |last| last + 1);
        &self.words[..len]
    }
}

/// A canonical, compact copy of a set of linearized operations. Operations are indexed in
/// invocation order and the search linearizes old operations first, so real sets are a run of
/// full words followed by a short tail; storing only the tail keeps the memo small.
#[derive(Clone, PartialEq, Eq, Hash)]
struct CompactSet {
    full_words: u32,
    tail: Box<[u64]>,
}

impl CompactSet {
    fn of(set: &BitSet) -> CompactSet {
        let words = set.trimmed();
        let full_words = words.iter().take_while(|word| **word == u64::MAX).count();
        CompactSet { full_words: full_words as u32, tail: words[full_words..].into() }
    }
}

fn is_subset(small: &[u64], large: &[u64]) -> bool {
    small.iter().enumerate().all(|(index, word)| word & !large.get(index).copied().unwrap_or(0) == 0)
}

/// Configurations already explored. The key holds the actual register value, not a hash of
/// it, so a collision can never make an unexplored configuration look explored.
///
/// Completed and unknown-outcome operations are tracked separately because a configuration
/// with fewer unknown operations linearized dominates one with more (same completed set, same
/// value): the unknown ones need not be linearized at all, so every continuation of the
/// latter is one of the former. Pruning dominated configurations keeps histories with many
/// unknown outcomes from doubling the search per unknown operation.
#[derive(Default)]
struct Memo {
    explored: FxHashMap<(CompactSet, Option<Value>), Vec<Box<[u64]>>>,
    states: usize,
}

impl Memo {
    /// Record the configuration; `false` if it, or one that dominates it, was seen before.
    fn first_visit(&mut self, completed: &BitSet, unknown: &BitSet, value: &Option<Value>) -> bool {
        let unknown = unknown.trimmed();
        let seen = self.explored.entry((CompactSet::of(completed), value.clone())).or_default();
        if seen.iter().any(|earlier| is_subset(earlier, unknown)) {
            return false;
        }
        seen.retain(|earlier| !is_subset(unknown, earlier));
        seen.push(unknown.into());
        self.states += 1;
        true
    }
}

// ---------------------------------------------------------------------------------------------
// The search.

/// Where an operation's bit lives: completed and unknown operations have separate sets.
#[derive(Clone, Copy)]
enum Slot {
    Completed(usize),
    Unknown(usize),
}

/// One linearized operation on the explicit stack, with what is needed to undo it.
struct Frame {
    call: usize,
    op: usize,
    value_before: Option<Value>,
}

/// The deepest point the search reached before an operation's return forced a backtrack.
struct DeadEnd {
    /// Operations in the longest linearizable prefix.
    depth: usize,
    /// The last operations of that prefix, in linearization order.
    prefix_end: Vec<usize>,
    /// The register value after the prefix.
    value: Option<Value>,
    /// The completed operation that could not be placed after the prefix.
    stuck: usize,
}

const PREFIX_END_SHOWN: usize = 8;

enum SearchResult {
    Linearizable,
    NotLinearizable(DeadEnd),
    BudgetExhausted,
}

struct Search<'a> {
    operations: &'a [&'a Operation],
    slots: Vec<Slot>,
    events: EventList,
    completed: BitSet,
    unknown: BitSet,
    value: Option<Value>,
    stack: Vec<Frame>,
    memo: Memo,
    /// Completed operations not yet linearized; the search succeeds when none are left.
    completed_left: usize,
    deepest: Option<DeadEnd>,
}

impl<'a> Search<'a> {
    fn new(operations: &'a [&'a Operation]) -> Search<'a> {
        let (mut completed_count, mut unknown_count) = (0, 0);
        let mut slots = Vec::with_capacity(operations.len());
        for op in operations {
            if known_outcome(op).is_some() {
                slots.push(Slot::Completed(completed_count));
                completed_count += 1;
            } else {
                slots.push(Slot::Unknown(unknown_count));
                unknown_count += 1;
            }
        }
        Search {
            operations,
            slots,
            events: EventList::new(operations),
            completed: BitSet::with_len(completed_count),
            unknown: BitSet::with_len(unknown_count),
            value: None,
            stack: Vec::new(),
            memo: Memo::default(),
            completed_left: completed_count,
            deepest: None,
        }
    }

    fn run(mut self, states_max: usize) -> SearchResult {
        self.memo.first_visit(&self.completed, &self.unknown, &self.value);
        let mut cursor = self.events.first();
        while self.completed_left > 0 {
            match self.events.event(cursor) {
                Event::Call { op, .. } => {
                    if self.try_linearize(cursor, op) {
                        if self.memo.states > states_max {
                            return SearchResult::BudgetExhausted;
                        }
                        cursor = self.events.first();
                    } else {
                        cursor = self.events.next(cursor);
                    }
                }
                Event::Return { op } => {
                    // `op` returned without being linearized: this branch is dead.
                    self.note_dead_end(op);
                    match self.stack.pop() {
                        Some(frame) => cursor = self.undo(frame),
                        None => return SearchResult::NotLinearizable(self.deepest.expect("just noted")),
                    }
                }
                // Every node before the cursor is a call, so reaching the tail means no
                // return, hence no completed operation, is left.
                Event::Tail => break,
                Event::Head => unreachable!("the cursor never rests on the head sentinel"),
            }
        }
        debug_assert_eq!(self.completed_left, 0);
        SearchResult::Linearizable
    }

    /// Linearize `op` next if the model allows it and the resulting configuration is new.
    fn try_linearize(&mut self, call: usize, op: usize) -> bool {
        let operation = self.operations[op];
        let outcome = known_outcome(operation);
        let Some(value_after) = next_value(&operation.command, outcome, &self.value) else {
            return false;
        };
        self.mark(op, true);
        if !self.memo.first_visit(&self.completed, &self.unknown, &value_after) {
            self.mark(op, false);
            return false;
        }
        let value_before = std::mem::replace(&mut self.value, value_after);
        self.stack.push(Frame { call, op, value_before });
        self.events.lift(call);
        true
    }

    /// Take back the last linearized operation; returns where the scan resumes.
    fn undo(&mut self, frame: Frame) -> usize {
        self.mark(frame.op, false);
        self.value = frame.value_before;
        self.events.unlift(frame.call);
        self.events.next(frame.call)
    }

    fn mark(&mut self, op: usize, linearized: bool) {
        let (set, bit) = match self.slots[op] {
            Slot::Completed(bit) => (&mut self.completed, bit),
            Slot::Unknown(bit) => (&mut self.unknown, bit),
        };
        if linearized {
            set.insert(bit);
        } else {
            set.remove(bit);
        }
        if let Slot::Completed(_) = self.slots[op] {
            if linearized {
                self.completed_left -= 1;
            } else {
                self.completed_left += 1;
            }
        }
    }

    fn note_dead_end(&mut self, stuck: usize) {
        let depth = self.stack.len();
        if self.deepest.as_ref().is_some_and(|deepest| deepest.depth >= depth) {
            return;
        }
        let prefix_end =
            self.stack[depth.saturating_sub(PREFIX_END_SHOWN)..].iter().map(|frame| frame.op).collect();
        self.deepest = Some(DeadEnd { depth, prefix_end, value: self.value.clone(), stuck });
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting.

/// Operations shown in a violation at most.
const VIOLATION_OPS_SHOWN: usize = 30;

fn describe_violation(key: &Key, operations: &[&Operation], dead_end: &DeadEnd) -> Violation {
    let stuck = operations[dead_end.stuck];
    let prefix_end = if dead_end.prefix_end.is_empty() {
        String::new()
    } else {
        let ids: Vec<String> =
            dead_end.prefix_end.iter().map(|&op| format!("#{}", operations[op].id)).collect();
        format!(" (ending {})", ids.join(", "))
    };
    let explanation = format!(
        "Operation #{id} (client {client}: {command} -> {outcome}) could not be linearized. The longest \
         linearizable prefix places {depth} of {total} operations on key {key}{prefix_end}, leaving the \
         value {value}; from there no order of the pending operations lets #{id} take effect with that \
         outcome before it completed.",
        id = stuck.id,
        client = stuck.client,
        command = CommandDisplay(&stuck.command),
        outcome = OutcomeDisplay(stuck.completion.as_ref().map(|completion| &completion.outcome)),
        depth = dead_end.depth,
        total = operations.len(),
        key = BytesDisplay(key),
        value = ValueDisplay(dead_end.value.as_ref()),
    );
    Violation { key: key.clone(), operations: excerpt(operations, dead_end), explanation }
}

/// The operations worth reading: the stuck one, the end of the prefix before it, then the ones
/// concurrent with the stuck one, closest in time first; sorted by invocation for display.
fn excerpt(operations: &[&Operation], dead_end: &DeadEnd) -> Vec<Operation> {
    let stuck = operations[dead_end.stuck];
    let mut chosen = vec![dead_end.stuck];
    chosen.extend(&dead_end.prefix_end);
    let mut concurrent: Vec<usize> = (0..operations.len())
        .filter(|&op| overlaps(operations[op], stuck) && !chosen.contains(&op))
        .collect();
    concurrent.sort_by_key(|&op| operations[op].invoke.as_nanos().abs_diff(stuck.invoke.as_nanos()));
    let room = VIOLATION_OPS_SHOWN.saturating_sub(chosen.len());
    chosen.extend(concurrent.into_iter().take(room));
    chosen.sort_by_key(|&op| (operations[op].invoke, operations[op].id));
    chosen.dedup();
    chosen.into_iter().map(|op| operations[op].clone()).collect()
}

fn overlaps(op: &Operation, other: &Operation) -> bool {
    let starts_before_other_ends = response_time(other).is_none_or(|other_end| op.invoke <= other_end);
    let ends_after_other_starts = response_time(op).is_none_or(|op_end| op_end >= other.invoke);
    starts_before_other_ends && ends_after_other_starts
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.explanation)?;
        for op in &self.operations {
            writeln!(f, "  {}", OperationDisplay(op))?;
        }
        Ok(())
    }
}

/// `#id client=c [invoke..complete] command -> outcome`.
struct OperationDisplay<'a>(&'a Operation);

impl fmt::Display for OperationDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.0;
        write!(f, "#{} client={} [{}..", op.id, op.client, op.invoke)?;
        match &op.completion {
            Some(completion) => write!(f, "{}]", completion.at)?,
            None => write!(f, "?]")?,
        }
        let outcome = op.completion.as_ref().map(|completion| &completion.outcome);
        write!(f, " {} -> {}", CommandDisplay(&op.command), OutcomeDisplay(outcome))
    }
}

struct CommandDisplay<'a>(&'a Command);

impl fmt::Display for CommandDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Command::Read { key } => write!(f, "READ {}", BytesDisplay(key)),
            Command::Write { key, value: Some(value) } => {
                write!(f, "WRITE {} {}", BytesDisplay(key), BytesDisplay(value))
            }
            Command::Write { key, value: None } => write!(f, "DELETE {}", BytesDisplay(key)),
            Command::Rmw { key, op } => write!(f, "{} {}", RmwDisplay(op), BytesDisplay(key)),
        }
    }
}

/// The RMW's name and arguments except the key, e.g. `CAS(expected="a", new="b")`.
struct RmwDisplay<'a>(&'a RmwOp);

impl fmt::Display for RmwDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            RmwOp::CompareAndSwap { expected, new } => write!(
                f,
                "CAS(expected={}, new={})",
                ValueDisplay(expected.as_ref()),
                ValueDisplay(new.as_ref())
            ),
            RmwOp::IncrementBy(delta) => write!(f, "INCRBY({delta})"),
            RmwOp::SetIfAbsent(value) => write!(f, "SETNX({})", BytesDisplay(value)),
            RmwOp::SetIfPresent(value) => write!(f, "SETXX({})", BytesDisplay(value)),
            RmwOp::Swap(value) => write!(f, "GETSET({})", ValueDisplay(value.as_ref())),
        }
    }
}

/// `None` is an unknown outcome.
struct OutcomeDisplay<'a>(Option<&'a Outcome>);

impl fmt::Display for OutcomeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(outcome) = self.0 else { return write!(f, "?") };
        match outcome {
            Outcome::Value(value) => write!(f, "{}", ValueDisplay(value.as_ref())),
            Outcome::Written => write!(f, "OK"),
            Outcome::Cas { swapped, previous } => {
                write!(f, "swapped={swapped} previous={}", ValueDisplay(previous.as_ref()))
            }
            Outcome::Integer(number) => write!(f, "{number}"),
            Outcome::Flag(flag) => write!(f, "{flag}"),
            Outcome::Error(error) => write!(f, "ERR {error}"),
        }
    }
}

/// A register value: `nil` when absent.
struct ValueDisplay<'a>(Option<&'a Value>);

impl fmt::Display for ValueDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(value) => write!(f, "{}", BytesDisplay(value)),
            None => write!(f, "nil"),
        }
    }
}

/// Bytes as a quoted, escaped, lossy UTF-8 string.
struct BytesDisplay<'a>(&'a Bytes);

impl fmt::Display for BytesDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    fn check(history: &History) -> CheckReport {
        check_history(history, &CheckerConfig::default())
    }

    /// Builds histories with times in milliseconds.
    #[derive(Default)]
    struct Builder {
        history: History,
    }

    impl Builder {
        fn op(&mut self, client: u32, command: Command, invoke: u64, completion: Option<(u64, Outcome)>) -> &mut Self {
            let completion =
                completion.map(|(at, outcome)| Completion { at: Time::from_millis(at), outcome });
            let id = self.history.operations.len();
            self.history.operations.push(Operation {
                id,
                client,
                command,
                invoke: Time::from_millis(invoke),
                completion,
            });
            self
        }

        fn write(&mut self, client: u32, key: &str, value: &str, invoke: u64, complete: u64) -> &mut Self {
            let command = Command::Write { key: b(key), value: Some(b(value)) };
            self.op(client, command, invoke, Some((complete, Outcome::Written)))
        }

        fn unknown_write(&mut self, client: u32, key: &str, value: &str, invoke: u64) -> &mut Self {
            self.op(client, Command::Write { key: b(key), value: Some(b(value)) }, invoke, None)
        }

        fn read(&mut self, client: u32, key: &str, seen: Option<&str>, invoke: u64, complete: u64) -> &mut Self {
            let outcome = Outcome::Value(seen.map(b));
            self.op(client, Command::Read { key: b(key) }, invoke, Some((complete, outcome)))
        }

        fn rmw(
            &mut self,
            client: u32,
            key: &str,
            op: RmwOp,
            outcome: Outcome,
            invoke: u64,
            complete: u64,
        ) -> &mut Self {
            self.op(client, Command::Rmw { key: b(key), op }, invoke, Some((complete, outcome)))
        }

        fn build(&self) -> History {
            self.history.clone()
        }
    }

    fn assert_linearizable(history: &History) {
        let report = check(history);
        let violations: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
        assert!(report.is_linearizable(), "unexpected violation:\n{}", violations.join("\n"));
        assert!(report.inconclusive_keys.is_empty());
    }

    fn assert_violation(history: &History, key: &str) -> Violation {
        let report = check(history);
        assert_eq!(report.violations.len(), 1, "expected exactly one violation: {report:?}");
        let violation = report.violations[0].clone();
        assert_eq!(violation.key, b(key));
        violation
    }

    #[test]
    fn sequential_write_then_read_is_linearizable() {
        let history = Builder::default()
            .read(1, "k", None, 0, 1)
            .write(1, "k", "a", 2, 3)
            .read(2, "k", Some("a"), 4, 5)
            .write(2, "k", "b", 6, 7)
            .read(1, "k", Some("b"), 8, 9)
            .build();
        assert_linearizable(&history);
    }

    #[test]
    fn stale_read_after_a_completed_write_is_a_violation() {
        let history = Builder::default()
            .write(1, "k", "a", 0, 1)
            .write(1, "k", "b", 2, 3)
            .read(2, "k", Some("a"), 4, 5)
            .build();
        let violation = assert_violation(&history, "k");
        assert!(violation.explanation.contains("#2"), "{violation}");
        assert!(violation.explanation.contains("READ \"k\" -> \"a\""), "{violation}");
    }

    #[test]
    fn reads_concurrent_with_two_writes_may_see_either_order() {
        let a_then_b = Builder::default()
            .write(1, "k", "a", 0, 10)
            .write(2, "k", "b", 0, 10)
            .read(3, "k", Some("a"), 2, 3)
            .read(3, "k", Some("b"), 4, 5)
            .read(3, "k", Some("b"), 20, 21)
            .build();
        assert_linearizable(&a_then_b);
        let b_then_a = Builder::default()
            .write(1, "k", "a", 0, 10)
            .write(2, "k", "b", 0, 10)
            .read(3, "k", Some("b"), 2, 3)
            .read(3, "k", Some("a"), 4, 5)
            .read(3, "k", Some("a"), 20, 21)
            .build();
        assert_linearizable(&b_then_a);
    }

    #[test]
    fn value_flipping_after_both_writes_completed_is_a_violation() {
        let history = Builder::default()
            .write(1, "k", "a", 0, 10)
            .write(2, "k", "b", 0, 10)
            .read(3, "k", Some("a"), 20, 21)
            .read(3, "k", Some("b"), 30, 31)
            .build();
        assert_violation(&history, "k");
    }

    #[test]
    fn read_of_a_value_before_its_write_was_invoked_is_a_violation() {
        let history = Builder::default().read(1, "k", Some("a"), 0, 1).write(2, "k", "a", 5, 6).build();
        assert_violation(&history, "k");
    }

    #[test]
    fn unknown_write_seen_later_is_linearizable() {
        let history = Builder::default()
            .write(1, "k", "a", 0, 1)
            .unknown_write(2, "k", "b", 2)
            .read(1, "k", Some("a"), 3, 4)
            .read(1, "k", Some("b"), 100, 101)
            .read(3, "k", Some("b"), 200, 201)
            .build();
        assert_linearizable(&history);
    }

    #[test]
    fn unknown_write_never_seen_is_linearizable() {
        let history = Builder::default()
            .write(1, "k", "a", 0, 1)
            .unknown_write(2, "k", "b", 2)
            .read(1, "k", Some("a"), 3, 4)
            .read(1, "k", Some("a"), 100, 101)
            .build();
        assert_linearizable(&history);
    }

    #[test]
    fn unknown_write_that_appears_disappears_and_reappears_is_a_violation() {
        let history = Builder::default()
            .write(1, "k", "a", 0, 1)
            .unknown_write(2, "k", "b", 2)
            .read(1, "k", Some("b"), 3, 4)
            .read(1, "k", Some("a"), 5, 6)
            .read(1, "k", Some("b"), 7, 8)
            .build();
        let violation = assert_violation(&history, "k");
        assert!(violation.explanation.contains("#4"), "{violation}");
    }

    #[test]
    fn unknown_increment_may_take_effect() {
        let history = Builder::default()
            .op(1, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(1) }, 0, None)
            .read(2, "n", None, 1, 2)
            .read(2, "n", Some("1"), 3, 4)
            .build();
        assert_linearizable(&history);
    }

    #[test]
    fn unavailable_commands_never_take_effect() {
        let unavailable = Some((1, Outcome::Error(CommandError::Unavailable("no lease"))));
        let refused_write = Command::Write { key: b("k"), value: Some(b("a")) };
        let ignored = Builder::default().op(1, refused_write.clone(), 0, unavailable.clone()).build();
        assert_linearizable(&ignored);
        assert_eq!(check(&ignored).ops_checked, 0);
        let seen = Builder::default().op(1, refused_write, 0, unavailable).read(2, "k", Some("a"), 2, 3).build();
        assert_violation(&seen, "k");
    }

    #[test]
    fn two_concurrent_increments_both_returning_one_is_a_violation() {
        let history = Builder::default()
            .rmw(1, "n", RmwOp::IncrementBy(1), Outcome::Integer(1), 0, 10)
            .rmw(2, "n", RmwOp::IncrementBy(1), Outcome::Integer(1), 0, 10)
            .build();
        assert_violation(&history, "n");
    }

    #[test]
    fn concurrent_increments_returning_one_and_two_are_linearizable() {
        let history = Builder::default()
            .rmw(1, "n", RmwOp::IncrementBy(1), Outcome::Integer(2), 0, 10)
            .rmw(2, "n", RmwOp::IncrementBy(1), Outcome::Integer(1), 0, 10)
            .read(1, "n", Some("2"), 11, 12)
            .build();
        assert_linearizable(&history);
    }

    #[test]
    fn cas_that_succeeded_against_a_value_never_written_is_a_violation() {
        let cas = RmwOp::CompareAndSwap { expected: Some(b("x")), new: Some(b("y")) };
        let history = Builder::default()
            .write(1, "k", "a", 0, 1)
            .rmw(2, "k", cas, Outcome::Cas { swapped: true, previous: Some(b("x")) }, 2, 3)
            .build();
        assert_violation(&history, "k");
    }

    #[test]
    fn increment_of_a_non_integer_reporting_not_integer_is_linearizable() {
        let history = Builder::default()
            .write(1, "k", "hello", 0, 1)
            .rmw(2, "k", RmwOp::IncrementBy(1), Outcome::Error(CommandError::NotInteger), 2, 3)
            .read(1, "k", Some("hello"), 4, 5)
            .build();
        assert_linearizable(&history);
    }

    #[test]
    fn only_the_bad_key_is_reported() {
        let history = Builder::default()
            .write(1, "good", "a", 0, 1)
            .write(2, "bad", "a", 0, 1)
            .write(1, "bad", "b", 2, 3)
            .read(2, "good", Some("a"), 4, 5)
            .read(1, "bad", Some("a"), 6, 7)
            .write(3, "other", "z", 0, 10)
            .read(3, "other", Some("z"), 11, 12)
            .build();
        let report = check(&history);
        assert_eq!(report.keys_checked, 3);
        assert_eq!(report.ops_checked, 7);
        assert_violation(&history, "bad");
    }

    #[test]
    fn violation_display_lists_operations() {
        let history = Builder::default()
            .write(1, "k", "a", 0, 1)
            .unknown_write(2, "k", "\u{fffd}b", 2)
            .read(1, "k", Some("c"), 3, 4)
            .build();
        let text = assert_violation(&history, "k").to_string();
        assert!(text.contains("Operation #2 (client 1: READ \"k\" -> \"c\")"), "{text}");
        assert!(text.contains("#0 client=1 [0.000000ms..1.000000ms] WRITE \"k\" \"a\" -> OK"), "{text}");
        assert!(text.contains("#1 client=2 [2.000000ms..?] WRITE \"k\" \"\u{fffd}b\" -> ?"), "{text}");
        assert!(text.contains("#2 client=1 [3.000000ms..4.000000ms] READ \"k\" -> \"c\""), "{text}");
    }

    #[test]
    fn exhausted_budget_is_inconclusive_not_a_violation() {
        // Many concurrent writes, then a read nobody wrote: refuting it explores every subset.
        let mut builder = Builder::default();
        for client in 0..12 {
            builder.write(client, "k", &format!("v{client}"), 0, 100);
        }
        let history = builder.read(99, "k", Some("never"), 200, 201).build();
        let tight = check_history(&history, &CheckerConfig { states_max_per_key: 100 });
        assert!(tight.is_linearizable());
        assert_eq!(tight.inconclusive_keys, vec![b("k")]);
        assert_violation(&history, "k");
    }

    // -----------------------------------------------------------------------------------------
    // Histories generated from a real sequential execution.

    /// SplitMix64: small, seedable, good enough for test generation.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }

        fn percent(&mut self) -> u64 {
            self.below(100)
        }

        fn pick<T: Clone>(&mut self, items: &[T]) -> T {
            items[self.below(items.len() as u64) as usize].clone()
        }
    }

    struct Workload {
        keys: usize,
        clients: usize,
        operations: usize,
        unknown_percent: u64,
        unavailable_percent: u64,
    }

    /// Microseconds an operation's interval may extend on each side of its linearization point.
    const SPREAD: u64 = 50;

    /// Never written by [`random_command`], and not an integer, so no increment produces it.
    const NEVER_WRITTEN: &str = "never-written";

    fn random_value(rng: &mut Rng) -> Value {
        b(&rng.pick(&["a", "b", "c", "0", "1", "7"]))
    }

    fn random_command(rng: &mut Rng, key: Key, current: &Option<Value>) -> Command {
        let roll = rng.percent();
        if roll < 40 {
            return Command::Read { key };
        }
        if roll < 55 {
            let value = (rng.percent() >= 10).then(|| random_value(rng));
            return Command::Write { key, value };
        }
        let op = match roll {
            55..70 => RmwOp::IncrementBy(rng.below(5) as i64 - 1),
            70..80 => {
                let expected = if rng.percent() < 50 { current.clone() } else { Some(random_value(rng)) };
                RmwOp::CompareAndSwap { expected, new: Some(random_value(rng)) }
            }
            80..87 => RmwOp::SetIfAbsent(random_value(rng)),
            87..93 => RmwOp::SetIfPresent(random_value(rng)),
            _ => RmwOp::Swap((rng.percent() >= 20).then(|| random_value(rng))),
        };
        Command::Rmw { key, op }
    }

    /// Apply `command` to the register, exactly as a correct replica would.
    fn execute(command: &Command, register: &mut Option<Value>) -> Outcome {
        match command {
            Command::Read { .. } => Outcome::Value(register.clone()),
            Command::Write { value, .. } => {
                *register = value.clone();
                Outcome::Written
            }
            Command::Rmw { op, .. } => {
                let effect = op.apply(register.as_ref());
                if let Some(write) = effect.write {
                    *register = write;
                }
                effect.outcome
            }
        }
    }

    /// A random idle client at `now`, or the one that becomes idle first.
    fn idle_client(rng: &mut Rng, idle_from: &[u64], now: u64) -> usize {
        let start = rng.below(idle_from.len() as u64) as usize;
        (0..idle_from.len())
            .map(|offset| (start + offset) % idle_from.len())
            .find(|&client| idle_from[client] <= now)
            .unwrap_or_else(|| (0..idle_from.len()).min_by_key(|&client| idle_from[client]).unwrap())
    }

    /// Run a random sequential execution; each operation takes effect at an increasing instant
    /// `now` and its client sees an interval around it, so the history is linearizable by
    /// construction. Unknown outcomes take effect or not, at random; refused ones never do.
    fn generate(rng: &mut Rng, workload: &Workload) -> History {
        let mut registers: Vec<Option<Value>> = vec![None; workload.keys];
        let mut idle_from = vec![0u64; workload.clients];
        let mut history = History::default();
        let mut now = 0;
        for id in 0..workload.operations {
            now += 1 + rng.below(2 * SPREAD / workload.clients as u64 + 1);
            let client = idle_client(rng, &idle_from, now);
            now = now.max(idle_from[client]);
            let invoke = now - rng.below(SPREAD).min(now - idle_from[client]);
            let complete = now + rng.below(SPREAD);
            let key_index = rng.below(workload.keys as u64) as usize;
            let register = &mut registers[key_index];
            let command = random_command(rng, b(&format!("k{key_index}")), register);
            let fate = rng.percent();
            let outcome = if fate < workload.unavailable_percent {
                Some(Outcome::Error(CommandError::Unavailable("test")))
            } else if fate < workload.unavailable_percent + workload.unknown_percent {
                if rng.percent() < 50 {
                    execute(&command, register);
                }
                None
            } else {
                Some(execute(&command, register))
            };
            let completion =
                outcome.map(|outcome| Completion { at: Time::from_micros(complete), outcome });
            idle_from[client] = complete + 1;
            let invoke = Time::from_micros(invoke);
            history.operations.push(Operation { id, client: client as u32, command, invoke, completion });
        }
        history
    }

    /// Make one completed read return a value nobody wrote; returns its key.
    fn corrupt_one_read(rng: &mut Rng, history: &mut History) -> Option<Key> {
        let reads: Vec<usize> = (0..history.operations.len())
            .filter(|&index| {
                let op = &history.operations[index];
                matches!(op.command, Command::Read { .. })
                    && matches!(op.completion, Some(Completion { outcome: Outcome::Value(_), .. }))
            })
            .collect();
        if reads.is_empty() {
            return None;
        }
        let read = &mut history.operations[rng.pick(&reads)];
        read.completion.as_mut()?.outcome = Outcome::Value(Some(b(NEVER_WRITTEN)));
        Some(read.command.key().clone())
    }

    #[test]
    fn large_generated_history_is_linearizable() {
        let mut rng = Rng(0xC0FFEE);
        let workload =
            Workload { keys: 2, clients: 8, operations: 4_000, unknown_percent: 2, unavailable_percent: 1 };
        let history = generate(&mut rng, &workload);
        let started = std::time::Instant::now();
        let report = check(&history);
        eprintln!("checked {} ops on {} keys in {:?}", report.ops_checked, report.keys_checked, started.elapsed());
        assert!(report.ops_checked > 3_800, "{report:?}");
        assert_linearizable(&history);
    }

    #[test]
    fn random_executions_are_linearizable_and_a_corrupted_read_is_caught() {
        for seed in 0..300 {
            let mut rng = Rng(seed);
            let workload = Workload {
                keys: 1 + rng.below(3) as usize,
                clients: 2 + rng.below(5) as usize,
                operations: 20 + rng.below(130) as usize,
                unknown_percent: 10,
                unavailable_percent: 5,
            };
            let mut history = generate(&mut rng, &workload);
            let report = check(&history);
            assert!(report.is_linearizable(), "seed {seed}: {}", report.violations[0]);
            assert!(report.inconclusive_keys.is_empty(), "seed {seed}");

            let Some(key) = corrupt_one_read(&mut rng, &mut history) else { continue };
            let report = check(&history);
            assert_eq!(report.violations.len(), 1, "seed {seed}: {report:?}");
            assert_eq!(report.violations[0].key, key, "seed {seed}");
        }
    }
}
