//! Linearizability checker: Wing & Gong's search with Lowe's memoization ("WGL", as in Lowe,
//! "Testing for linearizability", 2017, and as in Porcupine and Knossos).
//!
//! Every command touches exactly one key and keys are independent registers, so a history is
//! linearizable iff each key's sub-history is (P-compositionality). Each key is checked alone
//! against a register model whose read-modify-writes are [`RmwOp::apply`], the same function the
//! replicas run.
//!
//! The model knows time through the operations: a typed command (SET PX, PEXPIRE, GET, PTTL,
//! ...) carries the clock reading `now_ms` of the replica that decided it, stamped by the
//! simulator from that replica's own (drifting) clock exactly where the server reads its wall
//! clock. The register holds the deadline with the value, and an operation linearized where
//! the deadline is at or before its clock reading sees the key absent (and deletes it, as the
//! replicas do), so once an operation saw a key expired, every operation linearized after it
//! sees it absent, whatever its own clock says (docs/expiry.md).
//!
//! The search walks a time-ordered list of call and return events. At each step it tries to
//! linearize a pending operation whose call precedes the first remaining return; reaching a
//! return means the operation that returned could not be placed, so it backtracks. Lowe's
//! memoization skips configurations (linearized set, register value) that were already
//! explored. The search uses an explicit stack, so thousands of operations per key cannot
//! overflow the thread's stack, and a budget of explored configurations turns a pathological
//! key into an [`KeyVerdict::Inconclusive`] verdict instead of a hang.
//!
//! Operations whose outcome is unknown (no completion, or an error saying the outcome is in
//! doubt) may take effect at any point after their invocation, with any outcome, or never. They
//! get no return event: the search may linearize them whenever their call is reachable, and it
//! succeeds once every operation with a known outcome is placed.
//!
//! On top of Lowe's memo, four sound reductions keep refutations (which must explore every
//! reachable configuration) tractable; each is argued where it is implemented, and a test
//! checks the verdicts against a plain brute-force search:
//! * a completed operation that does not write is linearized greedily, without branching;
//! * a configuration dominates one with the same completed set and value but more unknown
//!   operations linearized;
//! * identical unknown operations are linearized in invocation order;
//! * an operation never immediately follows an unknown operation whose effect it erases (a
//!   blind write, an unacknowledged GETSET, ...).

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

/// What an operation does to the register when linearized at some value.
struct Transition {
    value_after: Option<Value>,
    /// Whether it writes at all. A read never does; for most RMWs the recorded outcome says
    /// whether it did (swapped or not, flag set or not, a number or an error), so one that
    /// does not write here writes nowhere its outcome is possible. Not for HSET: see
    /// [`outcome_tells_whether_it_writes`].
    writes: bool,
}

/// Whether a recorded outcome of `command` fixes whether it writes, wherever it is placed.
/// HSET's outcome is the count of *new* fields, so `0` is the answer both when it sets every
/// field to the value it already holds (no write) and when it overwrites one (a write): it may
/// not be linearized greedily where it happens not to write. (HDEL's count of removed fields is
/// `0` exactly when it changes nothing.) Nor for typed commands: a GET answers nil both where
/// the key is absent (no write) and where its deadline passed by the op's clock (it deletes
/// the key), and a later read may need that delete.
fn outcome_tells_whether_it_writes(command: &Command) -> bool {
    !matches!(command, Command::Rmw { op: RmwOp::HashSet { .. } | RmwOp::Exec(_), .. })
}

/// What `command` does at `current`, if the recorded `outcome` (`None`: unknown, anything
/// goes) is what it would return there.
fn transition(command: &Command, outcome: Option<&Outcome>, current: &Option<Value>) -> Option<Transition> {
    match command {
        Command::Read { .. } => match outcome {
            Some(Outcome::Value(seen)) if seen != current => None,
            None | Some(Outcome::Value(_)) => {
                Some(Transition { value_after: current.clone(), writes: false })
            }
            Some(_) => None,
        },
        Command::Write { value, .. } => matches!(outcome, None | Some(Outcome::Written))
            .then(|| Transition { value_after: value.clone(), writes: true }),
        Command::Rmw { op, .. } => {
            let effect = op.apply(current.as_ref());
            if outcome.is_some_and(|recorded| *recorded != effect.outcome) {
                return None;
            }
            let writes = effect.write.is_some();
            Some(Transition { value_after: effect.write.unwrap_or_else(|| current.clone()), writes })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The event lists: calls and returns in time order, as doubly linked lists so that linearizing
// an operation (removing its call and return) and undoing it are O(1). Completed operations and
// unknown ones live in separate lists so the search can try the former first (see `Cursor`).

const HEAD: usize = 0;

#[derive(Clone, Copy, Debug)]
enum Event {
    Head,
    Tail,
    /// `ret`: the node of the operation's return, `None` if its outcome is unknown.
    Call {
        op: usize,
        ret: Option<usize>,
    },
    Return {
        op: usize,
    },
}

struct EventList {
    events: Vec<Event>,
    /// Each event's position in the time order of all events; the tail's is `usize::MAX`.
    ranks: Vec<usize>,
    next: Vec<usize>,
    prev: Vec<usize>,
}

/// The completed operations' calls and returns, and the unknown operations' calls.
fn event_lists(operations: &[&Operation]) -> (EventList, EventList) {
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

    let (mut completed, mut unknown) = (Vec::new(), Vec::new());
    let mut return_node = vec![None; operations.len()];
    for (rank, &(_, is_return, op)) in order.iter().enumerate() {
        if is_return {
            // Node numbers start at 1, after the head sentinel.
            return_node[op] = Some(completed.len() + 1);
            completed.push((rank, Event::Return { op }));
        } else if response_time(operations[op]).is_some() {
            completed.push((rank, Event::Call { op, ret: None }));
        } else {
            unknown.push((rank, Event::Call { op, ret: None }));
        }
    }
    for (_, event) in &mut completed {
        if let Event::Call { op, ret } = event {
            *ret = return_node[*op];
        }
    }
    (EventList::new(completed), EventList::new(unknown))
}

impl EventList {
    fn new(ranked_events: Vec<(usize, Event)>) -> EventList {
        let mut events = vec![Event::Head];
        let mut ranks = vec![0];
        for (rank, event) in ranked_events {
            events.push(event);
            ranks.push(rank);
        }
        events.push(Event::Tail);
        ranks.push(usize::MAX);

        let tail = events.len() - 1;
        let next = (0..=tail).map(|node| (node + 1).min(tail)).collect();
        let prev = (0..=tail).map(|node| node.saturating_sub(1)).collect();
        EventList { events, ranks, next, prev }
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

    fn rank(&self, node: usize) -> usize {
        self.ranks[node]
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

/// Where the scan of the current configuration is. An operation may go next iff its call
/// precedes the first remaining return. The scan tries the completed operations' calls up to
/// that return, then the unknown operations invoked before it. Trying completed ones first
/// means configurations with fewer unknown operations linearized are explored first, so the
/// memo's dominance rule prunes the ones with more.
#[derive(Clone, Copy)]
enum Cursor {
    /// At a node of the completed operations' list.
    Completed(usize),
    /// At a node of the unknown operations' list; `first_return` is the first remaining
    /// return, a node of the completed operations' list.
    Unknown { node: usize, first_return: usize },
}

impl Cursor {
    fn node(self) -> usize {
        match self {
            Cursor::Completed(node) | Cursor::Unknown { node, .. } => node,
        }
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

    fn set(&mut self, bit: usize, present: bool) {
        let mask = 1 << (bit % 64);
        if present {
            self.words[bit / 64] |= mask;
        } else {
            self.words[bit / 64] &= !mask;
        }
    }

    fn contains(&self, bit: usize) -> bool {
        self.words[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// The words up to the last non-zero one; enough to test inclusion.
    fn trimmed(&self) -> &[u64] {
        let len = self.words.iter().rposition(|word| *word != 0).map_or(0, |last| last + 1);
        &self.words[..len]
    }
}

/// The sets of unknown operations a configuration was explored with, none a subset of
/// another, flattened into one allocation as `[len, words..]` records. Nearly always the only
/// set is the empty one, encoded as an empty slice, which allocates nothing.
struct UnknownSets(Box<[u64]>);

impl UnknownSets {
    fn of(sets: &[&[u64]]) -> UnknownSets {
        if sets.iter().any(|set| set.is_empty()) {
            // The empty set dominates every other one.
            return UnknownSets(Box::new([]));
        }
        let mut flat = Vec::with_capacity(sets.iter().map(|set| set.len() + 1).sum());
        for set in sets {
            flat.push(set.len() as u64);
            flat.extend_from_slice(set);
        }
        UnknownSets(flat.into())
    }

    fn sets(&self) -> impl Iterator<Item = &[u64]> {
        let mut rest: &[u64] = &self.0;
        std::iter::from_fn(move || {
            let (&len, after_len) = rest.split_first()?;
            let (set, after_set) = after_len.split_at(len as usize);
            rest = after_set;
            Some(set)
        })
    }

    /// Whether a configuration explored earlier dominates one with the `unknown` set.
    fn dominate(&self, unknown: &[u64]) -> bool {
        self.0.is_empty() || self.sets().any(|earlier| is_subset(earlier, unknown))
    }

    /// Add `unknown`, which no recorded set dominates, dropping the sets it dominates.
    fn add(&mut self, unknown: &[u64]) {
        let mut sets: Vec<&[u64]> = self.sets().filter(|earlier| !is_subset(unknown, earlier)).collect();
        sets.push(unknown);
        *self = UnknownSets::of(&sets);
    }
}

fn is_subset(small: &[u64], large: &[u64]) -> bool {
    small.iter().enumerate().all(|(index, word)| word & !large.get(index).copied().unwrap_or(0) == 0)
}

/// Register values numbered in order of appearance, so that the memo stores a number. The
/// values themselves are kept, not hashes, so two values never share a number.
#[derive(Default)]
struct ValueNumbers {
    numbers: FxHashMap<Option<Value>, u64>,
}

impl ValueNumbers {
    fn number(&mut self, value: &Option<Value>) -> u64 {
        let next = self.numbers.len() as u64;
        *self.numbers.entry(value.clone()).or_insert(next)
    }
}

/// Configurations already explored.
///
/// A configuration is keyed by its register value and its set of linearized completed
/// operations, packed into one slice: `[value number, full words, tail..]`. Operations are
/// indexed in invocation order and the search linearizes old operations first, so real sets
/// are a run of full words followed by a short tail; only the tail is stored.
///
/// Completed and unknown-outcome operations are tracked separately because a configuration
/// with fewer unknown operations linearized dominates one with more (same completed set, same
/// value): the unknown ones need not be linearized at all, so every continuation of the
/// latter is one of the former. Pruning dominated configurations keeps histories with many
/// unknown outcomes from doubling the search per unknown operation.
#[derive(Default)]
struct Memo {
    explored: FxHashMap<Box<[u64]>, UnknownSets>,
    value_numbers: ValueNumbers,
    /// Scratch key for lookups, so that revisits allocate nothing.
    probe: Vec<u64>,
    states: usize,
}

impl Memo {
    /// Record the configuration; `false` if it, or one that dominates it, was seen before.
    fn first_visit(&mut self, completed: &BitSet, unknown: &BitSet, value: &Option<Value>) -> bool {
        self.fill_probe(completed, value);
        let unknown = unknown.trimmed();
        match self.explored.get_mut(self.probe.as_slice()) {
            Some(explored) if explored.dominate(unknown) => return false,
            Some(explored) => explored.add(unknown),
            None => {
                self.explored.insert(self.probe.as_slice().into(), UnknownSets::of(&[unknown]));
            }
        }
        self.states += 1;
        true
    }

    fn fill_probe(&mut self, completed: &BitSet, value: &Option<Value>) {
        let words = completed.trimmed();
        let full_words = words.iter().take_while(|word| **word == u64::MAX).count();
        self.probe.clear();
        self.probe.push(self.value_numbers.number(value));
        self.probe.push(full_words as u64);
        self.probe.extend_from_slice(&words[full_words..]);
    }
}

// ---------------------------------------------------------------------------------------------
// The search.

/// Where an operation's bit lives: completed and unknown operations have separate sets.
#[derive(Clone, Copy)]
enum Slot {
    Completed(usize),
    /// `twin_before`: the previous unknown operation with the very same command, if any.
    Unknown {
        bit: usize,
        twin_before: Option<usize>,
    },
}

/// One linearized operation on the explicit stack, with what is needed to undo it.
struct Frame {
    /// Where the scan was when the operation was linearized; it resumes after it.
    cursor: Cursor,
    op: usize,
    value_before: Option<Value>,
    /// Taken greedily: if it fails, so does the configuration before it.
    greedy: bool,
}

/// What trying one event did to the search.
enum Step {
    Linearized,
    /// The operation cannot go next here; keep scanning.
    Skipped,
    /// No linearization continues from the current configuration.
    DeadConfiguration,
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

/// Number completed and unknown operations separately, in invocation order, and link each
/// unknown operation to its previous identical twin.
fn slots(operations: &[&Operation]) -> Vec<Slot> {
    // `Command` has no `Hash`; its `Debug` form renders every field exactly, so equal forms
    // mean equal commands.
    let mut last_unknown_with: FxHashMap<String, usize> = FxHashMap::default();
    let (mut completed, mut unknown) = (0, 0);
    let mut slots = Vec::with_capacity(operations.len());
    for (index, op) in operations.iter().enumerate() {
        if known_outcome(op).is_some() {
            slots.push(Slot::Completed(completed));
            completed += 1;
        } else {
            let twin_before = last_unknown_with.insert(format!("{:?}", op.command), index);
            slots.push(Slot::Unknown { bit: unknown, twin_before });
            unknown += 1;
        }
    }
    slots
}

struct Search<'a> {
    operations: &'a [&'a Operation],
    slots: Vec<Slot>,
    completed_events: EventList,
    unknown_events: EventList,
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
        let slots = slots(operations);
        let completed_count = slots.iter().filter(|slot| matches!(slot, Slot::Completed(_))).count();
        let unknown_count = slots.len() - completed_count;
        let (completed_events, unknown_events) = event_lists(operations);
        Search {
            operations,
            slots,
            completed_events,
            unknown_events,
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
        let mut cursor = Cursor::Completed(self.completed_events.first());
        while self.completed_left > 0 {
            let step = match cursor {
                Cursor::Completed(node) => match self.completed_events.event(node) {
                    Event::Call { op, .. } => self.try_linearize(cursor, op),
                    Event::Return { .. } => {
                        cursor = Cursor::Unknown { node: self.unknown_events.first(), first_return: node };
                        continue;
                    }
                    // Every node before the cursor is a call, so reaching the tail means no
                    // return, hence no completed operation, is left.
                    Event::Tail => break,
                    Event::Head => unreachable!("the cursor never rests on the head sentinel"),
                },
                Cursor::Unknown { node, first_return } => {
                    if self.unknown_events.rank(node) < self.completed_events.rank(first_return) {
                        self.try_linearize(cursor, self.call_op(&self.unknown_events, node))
                    } else {
                        // Nothing else may go before `first_return`'s operation, which did
                        // not fit: this configuration is dead.
                        let Event::Return { op } = self.completed_events.event(first_return) else {
                            unreachable!("`first_return` is a return")
                        };
                        self.note_dead_end(op);
                        Step::DeadConfiguration
                    }
                }
            };
            cursor = match step {
                Step::Linearized if self.memo.states > states_max => return SearchResult::BudgetExhausted,
                Step::Linearized => Cursor::Completed(self.completed_events.first()),
                Step::Skipped => self.advance(cursor),
                Step::DeadConfiguration => match self.backtrack() {
                    Some(resume) => resume,
                    None => {
                        let dead_end = self.deepest.expect("a configuration only dies at a return");
                        return SearchResult::NotLinearizable(dead_end);
                    }
                },
            };
        }
        debug_assert_eq!(self.completed_left, 0);
        SearchResult::Linearizable
    }

    fn call_op(&self, list: &EventList, node: usize) -> usize {
        match list.event(node) {
            Event::Call { op, .. } => op,
            other => unreachable!("expected a call, found {other:?}"),
        }
    }

    fn advance(&self, cursor: Cursor) -> Cursor {
        match cursor {
            Cursor::Completed(node) => Cursor::Completed(self.completed_events.next(node)),
            Cursor::Unknown { node, first_return } => {
                Cursor::Unknown { node: self.unknown_events.next(node), first_return }
            }
        }
    }

    fn list_mut(&mut self, cursor: Cursor) -> &mut EventList {
        match cursor {
            Cursor::Completed(_) => &mut self.completed_events,
            Cursor::Unknown { .. } => &mut self.unknown_events,
        }
    }

    /// Linearize `op` next if the model allows it and the resulting configuration is new.
    ///
    /// A completed operation that never writes (a read, a CAS that reports no swap, ...) is
    /// taken greedily: moving it to the front of any linearization from here keeps that
    /// linearization valid (everyone else sees the same values, and one fewer pending return
    /// only relaxes the real-time order). So if the configuration after it fails, the current
    /// one fails too, and its other branches need no exploring. A write of the current value
    /// does not qualify: elsewhere in the order it would change the value; nor does an HSET
    /// whose count of new fields is also what an overwriting HSET returns.
    fn try_linearize(&mut self, cursor: Cursor, op: usize) -> Step {
        let operation = self.operations[op];
        if self.waits_for_twin(op) {
            return Step::Skipped;
        }
        let outcome = known_outcome(operation);
        let Some(Transition { value_after, writes }) = transition(&operation.command, outcome, &self.value)
        else {
            return Step::Skipped;
        };
        let greedy = outcome.is_some() && !writes && outcome_tells_whether_it_writes(&operation.command);
        if self.erases_unknown(&operation.command, outcome, &value_after) {
            return if greedy { Step::DeadConfiguration } else { Step::Skipped };
        }
        self.mark(op, true);
        if !self.memo.first_visit(&self.completed, &self.unknown, &value_after) {
            self.mark(op, false);
            // Seen before and not on the stack (the stack only holds smaller sets): it failed.
            return if greedy { Step::DeadConfiguration } else { Step::Skipped };
        }
        let value_before = std::mem::replace(&mut self.value, value_after);
        self.stack.push(Frame { cursor, op, value_before, greedy });
        self.list_mut(cursor).lift(cursor.node());
        Step::Linearized
    }

    /// Leave a dead configuration: take back linearized operations up to the last one that
    /// had alternatives. Returns where the scan resumes, or `None` if nothing is left to try.
    fn backtrack(&mut self) -> Option<Cursor> {
        loop {
            let frame = self.stack.pop()?;
            let greedy = frame.greedy;
            let resume = self.undo(frame);
            if !greedy {
                return Some(resume);
            }
        }
    }

    /// Take back the last linearized operation; returns where the scan resumes.
    fn undo(&mut self, frame: Frame) -> Cursor {
        self.mark(frame.op, false);
        self.value = frame.value_before;
        self.list_mut(frame.cursor).unlift(frame.cursor.node());
        self.advance(frame.cursor)
    }

    /// Whether `command`, about to be linearized right after an unknown operation `u`, would
    /// leave the same value, with the same outcome, had `u` not been linearized at all: a blind
    /// write, or an unacknowledged GETSET, erases what `u` did. Then the configuration without
    /// `u` dominates this one (same completed operations and value, fewer unknown ones), and
    /// the search reaches it too: `u` has no return, so whatever could follow it could go in
    /// its place. Without this, every subset of unacknowledged increments before a GETSET whose
    /// reply was lost would be a configuration of its own.
    fn erases_unknown(
        &self,
        command: &Command,
        outcome: Option<&Outcome>,
        value_after: &Option<Value>,
    ) -> bool {
        let Some(last) = self.stack.last() else {
            return false;
        };
        if !matches!(self.slots[last.op], Slot::Unknown { .. }) {
            return false;
        }
        transition(command, outcome, &last.value_before)
            .is_some_and(|skipped| skipped.value_after == *value_after)
    }

    /// Identical unknown operations are interchangeable, and each is available from its
    /// invocation on, so any linearization can be rewritten to use them in invocation order.
    /// Insisting on that order keeps the search from trying every subset of, say, a hundred
    /// unacknowledged `INCRBY 1`s.
    fn waits_for_twin(&self, op: usize) -> bool {
        match self.slots[op] {
            Slot::Unknown { twin_before: Some(twin), .. } => match self.slots[twin] {
                Slot::Unknown { bit, .. } => !self.unknown.contains(bit),
                Slot::Completed(_) => unreachable!("twins are unknown operations"),
            },
            _ => false,
        }
    }

    fn mark(&mut self, op: usize, linearized: bool) {
        match self.slots[op] {
            Slot::Completed(bit) => {
                self.completed.set(bit, linearized);
                if linearized {
                    self.completed_left -= 1;
                } else {
                    self.completed_left += 1;
                }
            }
            Slot::Unknown { bit, .. } => self.unknown.set(bit, linearized),
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
            RmwOp::HashSet { pairs, .. } => {
                write!(f, "HSET(")?;
                for (i, (field, value)) in pairs.iter().enumerate() {
                    let separator = if i == 0 { "" } else { ", " };
                    write!(f, "{separator}{}={}", BytesDisplay(field), BytesDisplay(value))?;
                }
                write!(f, ")")
            }
            RmwOp::HashDelete(fields) => {
                write!(f, "HDEL(")?;
                for (i, field) in fields.iter().enumerate() {
                    write!(f, "{}{}", if i == 0 { "" } else { ", " }, BytesDisplay(field))?;
                }
                write!(f, ")")
            }
            RmwOp::Exec(exec) => {
                write!(f, "EXEC(now_ms={}", exec.now_ms)?;
                for arg in &exec.args {
                    write!(f, ", {}", BytesDisplay(arg))?;
                }
                write!(f, ")")
            }
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
            Outcome::Data(data) => write!(f, "{data:?}"),
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
        fn op(
            &mut self,
            client: u32,
            command: Command,
            invoke: u64,
            completion: Option<(u64, Outcome)>,
        ) -> &mut Self {
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

        fn read(
            &mut self,
            client: u32,
            key: &str,
            seen: Option<&str>,
            invoke: u64,
            complete: u64,
        ) -> &mut Self {
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
        // Once "b" was seen, "a" can only come back by the one write of "a" taking effect again.
        let violation = assert_violation(&history, "k");
        assert!(violation.explanation.contains("Operation #3"), "{violation}");
    }

    #[test]
    fn unknown_write_cannot_take_effect_before_its_invocation() {
        let history = Builder::default().read(1, "k", Some("b"), 0, 1).unknown_write(2, "k", "b", 2).build();
        assert_violation(&history, "k");
    }

    #[test]
    fn outcome_unknown_errors_may_or_may_not_take_effect() {
        let in_doubt = Some((1, Outcome::Error(CommandError::OutcomeUnknown)));
        let write_b = Command::Write { key: b("k"), value: Some(b("b")) };
        let seen = Builder::default()
            .write(1, "k", "a", 0, 1)
            .op(2, write_b.clone(), 0, in_doubt.clone())
            .read(1, "k", Some("b"), 5, 6)
            .build();
        assert_linearizable(&seen);
        let unseen = Builder::default()
            .write(1, "k", "a", 0, 1)
            .op(2, write_b, 0, in_doubt)
            .read(1, "k", Some("a"), 5, 6)
            .build();
        assert_linearizable(&unseen);
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
        let seen =
            Builder::default().op(1, refused_write, 0, unavailable).read(2, "k", Some("a"), 2, 3).build();
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

    /// The greedy rule relies on it: an RMW that did not write at one value did not write at any
    /// value where it returns the same outcome.
    #[test]
    fn rmw_outcomes_tell_whether_they_wrote() {
        let values =
            [None, Some(b("a")), Some(b("b")), Some(b("0")), Some(b("1")), Some(b(&i64::MAX.to_string()))];
        let ops = values.iter().flat_map(|value| {
            let present = value.clone().unwrap_or_else(|| b("z"));
            [
                RmwOp::CompareAndSwap { expected: value.clone(), new: Some(b("a")) },
                RmwOp::CompareAndSwap { expected: value.clone(), new: value.clone() },
                RmwOp::IncrementBy(1),
                RmwOp::IncrementBy(0),
                RmwOp::SetIfAbsent(present.clone()),
                RmwOp::SetIfPresent(present),
                RmwOp::Swap(value.clone()),
            ]
        });
        let hash = |pairs: &[(&str, &str)]| {
            let fields = pairs.iter().map(|(field, value)| (b(field), b(value))).collect();
            chorus_core::hash::encode(&fields)
        };
        let hash_values =
            [None, Some(b("text")), hash(&[("f", "a")]), hash(&[("f", "b")]), hash(&[("g", "a")])];
        let hash_set =
            |value: &str| RmwOp::HashSet { pairs: vec![(b("f"), b(value))], encoded_bytes_max: 1024 };
        let hash_ops = [hash_set("a"), hash_set("b"), RmwOp::HashDelete(vec![b("f")])];
        let cases =
            ops.map(|op| (op, &values[..])).chain(hash_ops.into_iter().map(|op| (op, &hash_values[..])));
        for (op, values) in cases {
            let command = Command::Rmw { key: b("k"), op: op.clone() };
            let mut ambiguous = false;
            for here in values {
                for there in values {
                    let (at_here, at_there) = (op.apply(here.as_ref()), op.apply(there.as_ref()));
                    if at_here.outcome == at_there.outcome {
                        ambiguous |= at_here.write.is_some() != at_there.write.is_some();
                    }
                }
            }
            // The greedy shortcut relies on this for every RMW it is allowed on.
            if outcome_tells_whether_it_writes(&command) {
                assert!(!ambiguous, "{op:?}: one outcome both with and without a write");
            }
        }
        assert!(!outcome_tells_whether_it_writes(&Command::Rmw { key: b("k"), op: hash_set("a") }));
    }

    /// A typed command as the simulator records it: arguments and the deciding clock reading.
    fn exec(args: &str, now_ms: u64) -> Command {
        let args: Vec<Bytes> = args.split(' ').map(|word| Bytes::copy_from_slice(word.as_bytes())).collect();
        let key = args[1].clone();
        let op = chorus_core::data::ExecOp { now_ms, bytes_max: 1 << 20, args };
        Command::Rmw { key, op: RmwOp::Exec(op) }
    }

    fn data(data: chorus_core::data::Data) -> Outcome {
        Outcome::Data(data)
    }

    /// The model judges deadlines by each operation's clock reading: a GET read at or after
    /// the deadline sees the key absent (and deletes it), and every operation after it does
    /// too, whatever its own clock says; before the deadline the value is there.
    #[test]
    fn an_operation_after_the_deadline_sees_the_key_absent() {
        use chorus_core::data::Data;
        let value = || data(Data::bulk("v"));
        let history = Builder::default()
            .op(1, exec("SET e v PX 10", 100), 0, Some((1, data(Data::ok()))))
            .op(2, exec("GET e", 105), 2, Some((3, value())))
            .op(2, exec("GET e", 110), 4, Some((5, data(Data::Nil))))
            // A replica whose clock lags still sees it absent: the read at 110 deleted it.
            .op(3, exec("GET e", 104), 6, Some((7, data(Data::Nil))))
            .op(3, exec("PTTL e", 104), 8, Some((9, data(Data::Integer(-2)))))
            .build();
        assert_linearizable(&history);

        // The broken server's history: a fast clock answers nil without deleting, and a slow
        // one sees the value afterwards. No order explains it.
        let mut resurrected = history.clone();
        resurrected.operations[3].completion =
            Some(Completion { at: Time::from_millis(7), outcome: value() });
        assert_violation(&resurrected, "e");

        // Before the deadline by its clock, a read that answers nil is a violation too.
        let mut early = history.clone();
        early.operations[1].completion =
            Some(Completion { at: Time::from_millis(3), outcome: data(Data::Nil) });
        assert_violation(&early, "e");
    }

    /// A GET answering nil may have deleted an expired key or found none: taking it greedily
    /// where the key is absent would hide the delete a later read needs (SET, then GET at a
    /// clock past the deadline, then GET at an earlier clock that must see it gone).
    #[test]
    fn a_typed_read_answering_nil_is_not_taken_greedily() {
        use chorus_core::data::Data;
        let history = Builder::default()
            .op(1, exec("GET e", 200), 0, Some((10, data(Data::Nil))))
            .op(2, exec("SET e v PX 50", 100), 1, Some((2, data(Data::ok()))))
            .op(3, exec("GET e", 120), 11, Some((12, data(Data::Nil))))
            .build();
        assert_linearizable(&history);
    }

    /// HSET answers 0 both when it overwrites a field and when it sets the value already there.
    /// Taking the second reading greedily hid the first: the search reported a violation for
    /// this history, which has a linearization (A, B, C, read).
    #[test]
    fn hset_counting_no_new_field_may_still_overwrite() {
        let hset = |value: &str| RmwOp::HashSet { pairs: vec![(b("f"), b(value))], encoded_bytes_max: 1024 };
        let set_a = chorus_core::hash::encode(&vec![(b("f"), b("a"))]).unwrap();
        let history = Builder::default()
            .rmw(1, "h", hset("a"), Outcome::Integer(1), 0, 1)
            .rmw(2, "h", hset("a"), Outcome::Integer(0), 2, 5)
            .rmw(3, "h", hset("b"), Outcome::Integer(0), 3, 5)
            .op(1, Command::Read { key: b("h") }, 6, Some((7, Outcome::Value(Some(set_a.clone())))))
            .build();
        assert_linearizable(&history);
        // With the read seeing `b` after both, the order C, B fits instead; with `a` before
        // either started it is a plain read. Only a value neither can leave is a violation.
        let set_c = chorus_core::hash::encode(&vec![(b("f"), b("c"))]).unwrap();
        let mut stale = history.clone();
        stale.operations[3].completion =
            Some(Completion { at: Time::from_millis(7), outcome: Outcome::Value(Some(set_c)) });
        assert_violation(&stale, "h");
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

    /// The shape of chain seeds 17794 and 35096 (session 15), whose keys ran out of the default
    /// budget: many unacknowledged increments with distinct deltas and unacknowledged GETSETs,
    /// then a read. Every subset of increments placed before a GETSET leaves the same value
    /// with a different set of unknown operations; the GETSET erases them, so those
    /// configurations are dominated and never explored. Without that, refuting a read no order
    /// explains runs out of 200,000 configurations here.
    #[test]
    fn unacknowledged_getsets_erase_the_unknown_operations_before_them() {
        let history = |seen: &str| {
            let mut builder = Builder::default();
            for client in 0..16u32 {
                let op = if client % 4 == 3 {
                    RmwOp::Swap(Some(b(&format!("{}000000", client + 1))))
                } else {
                    RmwOp::IncrementBy(1 << client)
                };
                builder.op(client, Command::Rmw { key: b("k"), op }, u64::from(client), None);
            }
            builder.read(99, "k", Some(seen), 100, 101).build()
        };
        // GETSET of client 11 (12000000), then the increment of client 5 (32).
        let budget = CheckerConfig { states_max_per_key: 20_000 };
        let report = check_history(&history("12000032"), &budget);
        assert!(report.is_linearizable() && report.inconclusive_keys.is_empty(), "{report:?}");
        // No GETSET value plus a subset of the increments makes this one.
        let report = check_history(&history("12000000000"), &CheckerConfig { states_max_per_key: 200_000 });
        assert_eq!(report.violations.len(), 1, "{report:?}");
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
        b(rng.pick(&["a", "b", "c", "0", "1", "7"]))
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
            let completion = outcome.map(|outcome| Completion { at: Time::from_micros(complete), outcome });
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
        eprintln!(
            "checked {} ops on {} keys in {:?}",
            report.ops_checked,
            report.keys_checked,
            started.elapsed()
        );
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

    /// Give a completed operation the outcome it would have had at some random value, so that
    /// small histories are sometimes linearizable and sometimes not.
    fn perturb_outcome(rng: &mut Rng, op: &mut Operation) {
        let Some(completion) = op.completion.as_mut() else { return };
        let elsewhere = (rng.percent() >= 15).then(|| random_value(rng));
        completion.outcome = match &op.command {
            Command::Read { .. } => Outcome::Value(elsewhere),
            Command::Write { .. } => return,
            Command::Rmw { op, .. } => op.apply(elsewhere.as_ref()).outcome,
        };
    }

    /// Whether some order of the operations explains the history: a plain search over every
    /// order, without events lists, memo or pruning, as an independent reference.
    fn brute_force_linearizable(ops: &[&Operation], placed: &mut [bool], value: &Option<Value>) -> bool {
        let pending_completed = |index: &usize| !placed[*index] && known_outcome(ops[*index]).is_some();
        let Some(deadline) =
            (0..ops.len()).filter(pending_completed).filter_map(|i| response_time(ops[i])).min()
        else {
            return true;
        };
        for index in 0..ops.len() {
            if placed[index] || ops[index].invoke > deadline {
                continue;
            }
            let Some(step) = transition(&ops[index].command, known_outcome(ops[index]), value) else {
                continue;
            };
            placed[index] = true;
            let found = brute_force_linearizable(ops, placed, &step.value_after);
            placed[index] = false;
            if found {
                return true;
            }
        }
        false
    }

    #[test]
    fn agrees_with_brute_force_on_small_histories() {
        let mut violations = 0;
        for seed in 0..3_000 {
            let mut rng = Rng(seed);
            let workload = Workload {
                keys: 1,
                clients: 2 + rng.below(3) as usize,
                operations: 3 + rng.below(6) as usize,
                unknown_percent: 20,
                unavailable_percent: 5,
            };
            let mut history = generate(&mut rng, &workload);
            for op in &mut history.operations {
                if rng.percent() < 15 {
                    perturb_outcome(&mut rng, op);
                }
            }
            let relevant: Vec<&Operation> = history.operations.iter().filter(|op| takes_part(op)).collect();
            let expected = brute_force_linearizable(&relevant, &mut vec![false; relevant.len()], &None);
            let report = check(&history);
            assert_eq!(report.is_linearizable(), expected, "seed {seed}: {history:#?}");
            violations += usize::from(!expected);
        }
        // Both verdicts must be exercised for the comparison to mean anything.
        assert!((300..2_700).contains(&violations), "{violations} violations");
    }
}
