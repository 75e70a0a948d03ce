//! The chain store replica: one HyperLoop group member (its region) on every node, and on the
//! head's node the coordinator that drives the group (the paper's MongoDB front end, §5.2).
//!
//! Write path, per batch of client updates (HyperLoop §5):
//! 1. gCAS the group write lock on every member, pipelined with `Append`: one gWRITE+gFLUSH
//!    of the redo record into every member's log;
//! 2. once both are acknowledged by the tail, `ExecuteAndAdvance`: one gMEMCPY+gFLUSH per
//!    entry from the log to the database, then gWRITE+gFLUSH of the log head;
//! 3. once the tail acknowledges that, every member has executed the batch: the clients get
//!    their answers, and the unlock gCAS goes out ahead of the next batch's lock and append.
//!
//! Reads are served from the replica's own region (never from in-memory state): at the tail
//! without a lock; at any other replica, and at a tail whose member applies outside this
//! event loop (a group host), under a read lock (a reader count in its own lock word, refused
//! while the group write lock is held, so the read waits for the unlock).
//!
//! Failures (§5.1): the membership service's view decides the chain. On every new view the
//! head's node becomes (or stays) the coordinator and recovers before serving writes: it
//! fences reads everywhere, redoes from its own log the last executed record and the pending
//! one (re-appended verbatim, then executed), and unlocks. Upstream members have applied a
//! superset of what downstream ones did, so the head's log holds everything any survivor has.
//!
//! Joins (§5.1, "a new member in the chain copies the log and the database ... writes are
//! paused for a short duration of catch-up phase. Only then does it formally join the
//! chain"): the chain is not the view's live set but the *linked* members, in the order they
//! were linked, as the coordinator configured them (`Message::Configure`). A live node that is
//! not linked gets the head's whole region (log, index, heap, header words) by gWRITE in
//! chunks + gFLUSH through a one-member copy group while batches wait, is then configured as
//! the new tail, and serves (and counts as caught up) only once every member installed that.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time,
    Value, View,
};
use chorus_group::txn::WRITER_BIT;
use chorus_group::{
    CallerConfig, ChainMember, GroupCaller, GroupConfig, GroupError, GroupId, GroupMessage, GroupOutbox,
    OpOutcome, Operation, RequestId, Token,
};
use chorus_region::{Region, RegionMemory, TenantId};
use rustc_hash::FxHashMap;

use crate::config::{Bug, ChainConfig};
use crate::durable::ChainState;
use crate::layout::{
    encode_record, lookup, parse_record, record_crc, record_start, summary, ChainLayout, Record,
    RegionSummary, HEAD_OFFSET, LAST_EXECUTED_OFFSET, LOCK_OFFSET, MAGIC_OFFSET, RECORD_ENTRY_HEADER_BYTES,
    RECORD_HEADER_BYTES, RECOVERING, REDOING, REDO_FROM_OFFSET,
};
use crate::member::Member;
use crate::message::Message;
use crate::mirror::Mirror;

/// The coordinator is not a chain member (`GroupConfig::check`), so it gets an id no replica
/// has; its messages never cross the network: it lives on the head's node.
pub const COORDINATOR: NodeId = NodeId(u8::MAX);
const GROUP: GroupId = GroupId(1);
/// The one-member group through which the coordinator copies its region to a joiner.
const COPY_GROUP: GroupId = GroupId(2);
/// Group epochs carry the view epoch in the high bits and the coordinator's configuration
/// generation within the view in the low ones, so a reconfiguration inside one view (a copy,
/// a link) still raises the epoch every member checks.
const GENERATION_BITS: u32 = 24;
/// Copy chunks in flight at most (each is `copy_chunk_bytes`).
const COPY_WINDOW: usize = 16;
/// Why a member without the data refuses clients.
const JOINING: &str = "joining: the log and the database are being copied from the head";
/// Why a member restarted on its data refuses clients until the head has configured it.
const RESTARTING: &str = "restarting: waiting for the head to configure the chain with this node";
pub const TENANT: TenantId = TenantId(0);
/// Peer links are already authenticated with the cluster token; the group token only keeps
/// the group core's §7 check meaningful within one cluster.
pub const TOKEN: Token = Token(*b"chorus-chain-grp");
/// The owner id in the write-lock word.
const OWNER: u64 = 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainStats {
    pub reads_tail: u64,
    pub reads_locked: u64,
    pub reads_parked: u64,
    pub batches: u64,
    pub records_appended: u64,
    pub updates_executed: u64,
    pub recoveries: u64,
    pub lock_failures: u64,
    pub forward_retransmits: u64,
    pub views_installed: u64,
    /// Chain configurations this node installed as coordinator (recovery, copy, link).
    pub configurations: u64,
    /// Members this node copied its region to and linked as coordinator.
    pub joins_linked: u64,
    /// Region bytes sent to joiners as coordinator.
    pub copy_bytes_sent: u64,
    /// Copies of the region this node received as a joiner.
    pub copies_received: u64,
    /// How long writes paused for the last join this node coordinated: from the copy's
    /// configuration to the link's acknowledgement by every member.
    pub last_join_pause_us: u64,
    /// Joins this node coordinated by sending only the records the joiner's region lacked
    /// (it restarted on a region that is a prefix of this one's), not the whole region.
    pub catch_ups: u64,
    /// Members that restarted on their data and were configured back into the chain by this
    /// node as coordinator, without any copy.
    pub restarts_rejoined: u64,
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    Local(ClientRequestId),
    Remote { node: NodeId, seq: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Recovery,
    Lock,
    Undo,
    Append,
    Execute,
    Unlock,
    Copy,
}

enum Phase {
    /// Waiting for every member of a new configuration to install it.
    Configuring,
    /// Copying the region to a joiner; batches wait (§5.1: writes pause).
    Copying,
    /// Waiting for `waiting` recovery operations.
    Recovering {
        waiting: usize,
    },
    Idle,
    /// Lock and append in flight.
    Appending {
        waiting: usize,
    },
    Executing {
        waiting: usize,
    },
    /// A group operation failed in a way only a new view can repair.
    Broken,
}

struct Batch {
    items: Vec<(Origin, Outcome)>,
    record: Option<Record>,
}

/// What the coordinator does once every member installed a configuration.
#[derive(Clone, Copy, Debug)]
enum AfterConfig {
    Recover,
    Copy { joiner: NodeId },
    Link { joiner: NodeId },
}

struct Configuring {
    group_epoch: u64,
    copy: bool,
    catch_up: bool,
    /// The oldest last-executed record any member reported (this node's own included): the
    /// recovery that follows redoes every record from it.
    redo_from: u64,
    chain: Vec<NodeId>,
    /// Members that have not acknowledged it yet.
    missing: NodeSet,
    sent_at: Time,
    then: AfterConfig,
}

struct CopyProgress {
    joiner: NodeId,
    /// A catch-up: the operations still to send (the records the joiner lacks, executed,
    /// then the header words). `None`: a copy of the whole region.
    catch_up: Option<VecDeque<Operation>>,
    /// The next region offset to send (the lock word at 0 is not copied: readers at the head
    /// count themselves in it).
    next_offset: u64,
    in_flight: usize,
    /// The final gWRITE of the joiner's lock word with gFLUSH was submitted.
    flush_sent: bool,
}

struct Coordinator {
    /// The data path's caller, once its first configuration is installed everywhere.
    caller: Option<GroupCaller>,
    /// The copy group's caller while a joiner is being copied to.
    copier: Option<GroupCaller>,
    configuring: Option<Configuring>,
    copy: Option<CopyProgress>,
    /// Members of the installed data configuration `linked_epoch` that have not acknowledged
    /// `Linked` yet.
    unlinked: NodeSet,
    linked_epoch: u64,
    linked_sent_at: Time,
    /// When the join in progress paused writes.
    join_started_at: Option<Time>,
    /// The catch-up planned for the joiner being configured (see [`CopyProgress::catch_up`]).
    planned_catch_up: Option<VecDeque<Operation>>,
    mirror: Option<Mirror>,
    phase: Phase,
    queue: VecDeque<(Origin, Command)>,
    batch: Option<Batch>,
    ops: FxHashMap<RequestId, OpKind>,
    next_request: u64,
    /// The log sequence number after the last executed record (the next append goes there).
    log_tail: u64,
    /// The data path carries datagrams: operations larger than one are split.
    splits: bool,
    split: Split,
}

/// Operations split into pieces for a data path that carries less than the whole (the kernel
/// path's datagrams; `chorus_group::kernel::packet::split`): the pieces get consecutive
/// sequence numbers, so every member applies them in order, which is what the whole means.
#[derive(Default)]
struct Split {
    /// The whole's request, per piece.
    pieces: FxHashMap<RequestId, RequestId>,
    /// Per whole: pieces not completed yet, and its result so far (the first error, else the
    /// first piece's outcome).
    wholes: FxHashMap<RequestId, (usize, Option<Result<OpOutcome, GroupError>>)>,
}

impl Split {
    /// A completion as the coordinator sees it: the whole's, once its last piece completed;
    /// `None` while pieces are left. Completions of unsplit operations pass through.
    fn complete(
        &mut self,
        request: RequestId,
        result: Result<OpOutcome, GroupError>,
    ) -> Option<(RequestId, Result<OpOutcome, GroupError>)> {
        let Some(whole) = self.pieces.remove(&request) else { return Some((request, result)) };
        let (left, so_far) = self.wholes.get_mut(&whole)?;
        match (&so_far, &result) {
            (None, _) | (Some(Ok(_)), Err(_)) => *so_far = Some(result),
            _ => {}
        }
        *left -= 1;
        if *left > 0 {
            return None;
        }
        let (_, result) = self.wholes.remove(&whole)?;
        Some((whole, result?))
    }
}

/// Submit `operation` as `request`, in datagram-sized pieces if the data path `splits`.
fn submit_split(
    caller: &mut GroupCaller,
    splits: bool,
    split: &mut Split,
    now: Time,
    request: RequestId,
    operation: Operation,
    gout: &mut GroupOutbox,
) {
    let pieces = if splits { chorus_group::kernel::packet::split(&operation) } else { Vec::new() };
    if pieces.len() <= 1 {
        caller.submit(now, request, operation, gout);
        return;
    }
    split.wholes.insert(request, (pieces.len(), None));
    for (i, piece) in pieces.into_iter().enumerate() {
        // Pieces get requests the coordinator never issues (the top bit set).
        let piece_request = RequestId(request.0 | 1 << 63 | (i as u64) << 40);
        split.pieces.insert(piece_request, request);
        caller.submit(now, piece_request, piece, gout);
    }
}

#[derive(Default)]
struct Session {
    /// Every update of the origin below this was answered and is forgotten: a late copy of
    /// its forward is a duplicate.
    done_below: u64,
    accepted: BTreeSet<u64>,
    done: BTreeMap<u64, Outcome>,
}

struct Outstanding {
    request: ClientRequestId,
    command: Command,
    sent_at: Time,
    /// The coordinator incarnation it was sent to (`None`: not sent yet, no head known).
    head: Option<u64>,
}

/// The chain store's replica over its group member `M`: by default the local member core
/// over a region ([`crate::member`]).
pub struct Chain<M: Member = ChainMember<Region>> {
    config: ChainConfig,
    view: View,
    /// This node's group member over its region; `None` only when the region is unusable.
    member: Option<M>,
    /// The linked members in chain order as last configured (empty while joining). Members
    /// are appended when linked, so any two members' orders agree on who comes first: the
    /// head is the first one that is live.
    order: Vec<NodeId>,
    /// This node holds all the data and is linked into the chain: it may serve.
    caught_up: bool,
    /// The view in which this (joining) node accepted a copy of the head's region.
    copied_in: Option<Epoch>,
    /// The node of the coordinator whose configuration this node installed last: where the
    /// group acknowledgements go.
    configured_by: Option<NodeId>,
    /// The last configuration generation this node used as coordinator in the current view.
    generation: u64,
    joining_sent_at: Option<Time>,
    /// Live nodes heard announcing `Joining` in this view: ready to be copied to (a joiner
    /// that has not installed its join view yet would ignore the copy while writes wait).
    joiners_heard: NodeSet,
    /// Set when the region could not be used; the replica serves nothing.
    region_error: Option<String>,
    coordinator: Option<Coordinator>,
    sessions: FxHashMap<NodeId, Session>,
    next_seq: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    parked_reads: VecDeque<(ClientRequestId, Key)>,
    /// `None`: no membership service (serve as if the lease never expires).
    lease: Option<Option<Time>>,
    now: Time,
    stats: ChainStats,
    /// The coordinator incarnation whose data configuration this node installed last in this
    /// view: where its forwards go. `None` until one is installed.
    head_incarnation: Option<u64>,
    /// Restarted on its data as a linked member: it serves nothing until a configuration that
    /// includes it was installed by every member (it hears `Linked`), or it coordinates one.
    awaiting_configuration: bool,
    /// The region is a whole image of the chain at some point (not a partial copy).
    region_complete: bool,
    /// The view epoch and configuration generation an earlier start of this node used last.
    generation_floor: (u64, u64),
    /// The durable state last handed to the runtime ([`Chain::take_state_record`]).
    recorded: Option<ChainState>,
    restarted_sent_at: Option<Time>,
    /// As coordinator, in this view: the `Restarted` incarnation handled per node.
    restarts_handled: FxHashMap<NodeId, u64>,
    /// Regions offered by joiners in this view.
    offers: FxHashMap<NodeId, RegionSummary>,
}

fn group_config(group: GroupId, epoch: u64, chain: Vec<NodeId>, layout: &ChainLayout) -> GroupConfig {
    GroupConfig {
        group,
        tenant: TENANT,
        token: TOKEN,
        epoch,
        chain,
        caller: COORDINATOR,
        region_bytes: layout.region_bytes(),
        start_seq: 1,
    }
}

fn group_epoch(view: Epoch, generation: u64) -> u64 {
    debug_assert!(generation < 1 << GENERATION_BITS);
    (view.0 << GENERATION_BITS) | generation
}

fn view_of(group_epoch: u64) -> u64 {
    group_epoch >> GENERATION_BITS
}

impl Chain {
    /// A replica over a fresh in-memory region (simulator, tests).
    pub fn new(config: ChainConfig) -> Chain {
        let region =
            Region::volatile(TENANT, "chain", config.layout.region_bytes()).expect("layout fits in memory");
        Chain::with_region(config, region)
    }

    /// A replica over `region` (the server's mmap'd file, possibly holding an earlier run's
    /// data), with the local member core. A region of another layout is refused: the replica
    /// then serves nothing and says why in every error.
    pub fn with_region(config: ChainConfig, region: Region) -> Chain {
        let me = config.me;
        Chain::with_member(config, move |initial| {
            ChainMember::new(initial, me, TENANT, region).map_err(|error| error.to_string())
        })
    }
}

impl<M: Member> Chain<M> {
    /// A replica over the member `make` binds to the group's first configuration (§5
    /// `Initialize`). A member whose region has another layout is refused: the replica then
    /// serves nothing and says why in every error.
    pub fn with_member(config: ChainConfig, make: impl FnOnce(GroupConfig) -> Result<M, String>) -> Chain<M> {
        assert!(config.retransmit_timeout > Time::ZERO, "retransmit_timeout must be positive");
        assert!(config.window_max > 0, "window_max must be positive");
        let me = config.me;
        // Back as the member it was: linked when it stopped, and the membership service did
        // not make it join (its data is trusted).
        let restored_linked = config
            .restored
            .as_ref()
            .filter(|state| state.linked && !config.joining && state.order.contains(&me));
        let joining = restored_linked.is_none() && (config.joining || !config.initial_view.live.contains(me));
        // A joiner acts in no view before the one the membership service hands it (its join
        // view), and its region is stale until copied to: it starts unconfigured.
        let view = match restored_linked {
            // It resumes in the view it recorded: earlier ones are history its order reflects.
            Some(state) if state.view_epoch > 0 => {
                View { epoch: Epoch(state.view_epoch), live: state.view_live }
            }
            _ if joining => View { epoch: Epoch(0), live: NodeSet::EMPTY },
            _ => config.initial_view,
        };
        let order: Vec<NodeId> = match restored_linked {
            Some(state) => state.order.clone(),
            None if joining => Vec::new(),
            None => view.live.iter().collect(),
        };
        let awaiting_configuration = restored_linked.is_some();
        // A fresh region is whole; a restored one as recorded.
        let region_complete = config.restored.as_ref().map_or(!joining, |state| state.region_complete);
        let generation_floor =
            config.restored.as_ref().map_or((0, 0), |state| (state.view_epoch, state.generation));
        let initial = if joining {
            group_config(GROUP, 0, vec![me], &config.layout)
        } else {
            group_config(GROUP, group_epoch(view.epoch, 0), order.clone(), &config.layout)
        };
        let (member, region_error) = match make(initial) {
            Ok(member) => match config.layout.check_region(member.memory()) {
                Ok(()) => (Some(member), None),
                Err(error) => (None, Some(error)),
            },
            Err(error) => (None, Some(error)),
        };
        let next_seq = config.seq_floor;
        let generation = if generation_floor.0 == view.epoch.0 { generation_floor.1 } else { 0 };
        Chain {
            config,
            view,
            member,
            order,
            caught_up: !joining,
            copied_in: None,
            configured_by: None,
            generation,
            joining_sent_at: None,
            joiners_heard: NodeSet::EMPTY,
            region_error,
            coordinator: None,
            sessions: FxHashMap::default(),
            next_seq,
            outstanding: BTreeMap::new(),
            parked_reads: VecDeque::new(),
            lease: None,
            now: Time::ZERO,
            stats: ChainStats::default(),
            head_incarnation: None,
            awaiting_configuration,
            region_complete,
            generation_floor,
            recorded: None,
            restarted_sent_at: None,
            restarts_handled: FxHashMap::default(),
            offers: FxHashMap::default(),
        }
    }

    /// The durable state (`crate::durable`) if it changed since the last call: the runtime
    /// appends it to the node's append-only file and syncs it before the turn's messages
    /// leave.
    pub fn take_state_record(&mut self) -> Option<Vec<u8>> {
        let state = self.durable_state();
        if self.recorded.as_ref() == Some(&state) {
            return None;
        }
        let record = state.encode();
        self.recorded = Some(state);
        Some(record)
    }

    /// Where this node stands in the chain, as a restart would need it.
    pub fn durable_state(&self) -> ChainState {
        ChainState {
            view_epoch: self.view.epoch.0,
            view_live: self.view.live,
            generation: self.generation,
            order: self.order.clone(),
            linked: self.caught_up,
            region_complete: self.region_complete,
        }
    }

    /// Restarted on its data and not yet configured back into the chain.
    pub fn is_awaiting_configuration(&self) -> bool {
        self.awaiting_configuration
    }

    pub fn view(&self) -> View {
        self.view
    }
    pub fn stats(&self) -> ChainStats {
        self.stats
    }
    pub fn layout(&self) -> ChainLayout {
        self.config.layout
    }
    /// Serves clients: its region is usable, it is in the view and linked into the chain.
    pub fn is_operational(&self) -> bool {
        self.member.is_some()
            && self.caught_up
            && !self.awaiting_configuration
            && self.view.live.contains(self.config.me)
    }
    /// Whether the coordinator (on the head) has recovered and accepts batches.
    pub fn is_coordinating(&self) -> bool {
        self.coordinator.as_ref().is_some_and(|c| c.mirror.is_some())
    }
    /// What this node does as coordinator, coarsely (batches in flight count as serving):
    /// `None` when it is not the coordinator. For the runtime's log of state changes.
    pub fn coordinator_state(&self) -> Option<&'static str> {
        let coordinator = self.coordinator.as_ref()?;
        Some(match coordinator.phase {
            Phase::Configuring => "configuring",
            Phase::Copying => "copying",
            Phase::Recovering { .. } => "recovering",
            Phase::Idle | Phase::Appending { .. } | Phase::Executing { .. } => "serving",
            Phase::Broken => "broken",
        })
    }
    /// The group epoch this node's member last installed (`None`: no usable region).
    pub fn group_epoch(&self) -> Option<u64> {
        self.member.as_ref().map(|member| member.config().epoch)
    }
    /// The linked members in chain order, as this node last learned them.
    pub fn chain_order(&self) -> &[NodeId] {
        &self.order
    }
    pub fn region(&self) -> Option<&M::Memory> {
        self.member.as_ref().map(|member| member.memory())
    }
    /// The runtime's end of a turn: flush the region once for the turn's operations
    /// ([`Member::sync_turn`]). An error must stop the node.
    pub fn sync_turn(&mut self, force: bool) -> Result<(), String> {
        match self.member.as_mut() {
            Some(member) => member.sync_turn(force),
            None => Ok(()),
        }
    }

    /// Whether [`Chain::sync_turn`] has something to do.
    pub fn sync_pending(&self) -> bool {
        self.member.as_ref().is_some_and(|member| member.sync_pending())
    }

    /// The lsn of the oldest record a recovery must redo for this node's region: the last
    /// record it executed (0 if none), or, if a recovery's redo was cut short here, the record
    /// that redo started from ([`REDO_FROM_OFFSET`]).
    fn last_executed(&self) -> u64 {
        let Some(region) = self.region() else { return 0 };
        let last = region.load_u64(LAST_EXECUTED_OFFSET).unwrap_or(0);
        match self.redo_cut_short() {
            Some(from) => from.min(last),
            None => last,
        }
    }

    /// Where the recovery whose redo was cut short in this region had started.
    fn redo_cut_short(&self) -> Option<u64> {
        let word = self.region()?.load_u64(REDO_FROM_OFFSET).ok()?;
        (word & REDOING != 0).then_some(word & !REDOING)
    }

    /// The number this node's next forwarded update gets (a restart continues above it).
    pub fn next_update_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn region_error(&self) -> Option<&str> {
        self.region_error.as_deref()
    }

    /// The value this replica's region holds for `key` (no lock: for inspection).
    pub fn stored_value(&self, key: &[u8]) -> Option<Value> {
        let region = self.region()?;
        lookup(region, &self.config.layout, key).ok().flatten()
    }

    /// Every key with a value in this replica's region.
    pub fn stored_keys(&self) -> Vec<Key> {
        let Some(region) = self.region() else { return Vec::new() };
        Mirror::rebuild(region, self.config.layout).map(|mirror| mirror.keys()).unwrap_or_default()
    }

    /// The first live linked member. Orders only ever differ by members appended at their
    /// end (a link some members did not hear of), so every linked member names the same head.
    fn head(&self) -> Option<NodeId> {
        self.order.iter().copied().find(|node| self.view.live.contains(*node))
    }
    fn live_order(&self) -> Vec<NodeId> {
        self.order.iter().copied().filter(|node| self.view.live.contains(*node)).collect()
    }
    /// The tail of the data path's configuration installed in this view.
    fn is_tail(&self) -> bool {
        self.member.as_ref().is_some_and(|member| {
            let group = member.config();
            group.group == GROUP
                && view_of(group.epoch) == self.view.epoch.0
                && group.chain.last() == Some(&self.config.me)
        })
    }

    #[inline(always)]
    fn has_bug(&self, _bug: Bug) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.config.bug == Some(_bug);
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    fn leased(&self, now: Time) -> bool {
        match self.lease {
            None => true,
            Some(until) => until.is_some_and(|until| now < until),
        }
    }

    // ------------------------------------------------------------------ reads

    /// Serve a read from this replica's own region, or say it must wait.
    fn try_read(&mut self, now: Time, key: &Key) -> Option<Outcome> {
        if !self.leased(now) {
            return None;
        }
        let tail = self.is_tail();
        let without_lock = self.has_bug(Bug::ReadWithoutLock);
        let layout = self.config.layout;
        let member = self.member.as_mut()?;
        // HyperLoop §5: lock-free reads at the tail, since everything the tail has executed is
        // executed everywhere. That also needs the lookup not to overlap the tail's own
        // execution, which holds only where the member applies inside this event loop: a
        // member on a group host (its process or its XDP program) overwrites index slots and
        // reuses freed heap entries while the lookup walks them, so its tail reads under the
        // read lock like any member (docs/protocols/chain.md, "Tail reads").
        let lock_free = (tail && !member.applies_concurrently()) || without_lock;
        let region = member.memory_mut();
        let word = region.load_u64(LOCK_OFFSET).ok()?;
        let result = if lock_free && word != RECOVERING {
            lookup(region, &layout, key)
        } else {
            // rdLock: a reader count in this replica's lock word, refused while the group
            // write lock (or recovery) holds it. Not group-wide (§5).
            if word & WRITER_BIT != 0 {
                return None;
            }
            let original = region.cas(LOCK_OFFSET, word, word + 1).ok()?;
            if original != word {
                // Only a group host writes this region besides the core (`--datapath`: it maps
                // the same memory and takes the group write lock as operations arrive), so
                // the word changed under us: the write lock was taken (or another reader came
                // or went); wait as for any writer. The reverse race, a write lock arriving
                // while this count is held, is the member's: the lock yields to readers.
                return None;
            }
            let value = lookup(region, &layout, key);
            let _ = region.cas(LOCK_OFFSET, word + 1, word);
            value
        };
        if tail {
            self.stats.reads_tail += 1;
        } else {
            self.stats.reads_locked += 1;
        }
        Some(match result {
            Ok(value) => Outcome::Value(value),
            Err(_) => Outcome::Error(CommandError::Unavailable("the chain region is corrupt")),
        })
    }

    fn retry_parked_reads(&mut self, now: Time, out: &mut Outbox<Message>) {
        for _ in 0..self.parked_reads.len() {
            let Some((request, key)) = self.parked_reads.pop_front() else { break };
            match self.try_read(now, &key) {
                Some(outcome) => out.reply(request, outcome),
                None => self.parked_reads.push_back((request, key)),
            }
        }
    }

    // ------------------------------------------------------------------ updates

    fn done_below(&self) -> u64 {
        self.outstanding.keys().next().copied().unwrap_or(self.next_seq)
    }

    /// Send (or resend) an update to the coordinator, once this node knows which incarnation
    /// coordinates (it installed its configuration): a forward is only ever taken by the
    /// incarnation it was first sent to.
    fn send_forward(&mut self, seq: u64, out: &mut Outbox<Message>) {
        let (Some(head), Some(incarnation)) = (self.head(), self.head_incarnation) else { return };
        let done_below = self.done_below();
        let Some(pending) = self.outstanding.get_mut(&seq) else { return };
        if *pending.head.get_or_insert(incarnation) != incarnation {
            return; // answered "outcome unknown" when the head changed; never re-sent
        }
        let command = pending.command.clone();
        out.send(
            head,
            Message::Forward { epoch: self.view.epoch, head: incarnation, seq, done_below, command },
        );
    }

    /// A data configuration from coordinator incarnation `incarnation` was installed. If that
    /// is a new coordinator (the head restarted, or another node took over within the view),
    /// the updates sent to the previous one have an unknown outcome: it may have executed
    /// them and the new one cannot tell. Updates not sent yet go to the new one.
    fn adopt_head(&mut self, incarnation: u64, out: &mut Outbox<Message>) {
        if self.head_incarnation == Some(incarnation) {
            return;
        }
        self.head_incarnation = Some(incarnation);
        let sent: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, pending)| pending.head.is_some())
            .map(|(seq, _)| *seq)
            .collect();
        for seq in sent {
            if let Some(pending) = self.outstanding.remove(&seq) {
                out.reply(pending.request, Outcome::Error(CommandError::OutcomeUnknown));
            }
        }
        let unsent: Vec<u64> = self.outstanding.keys().copied().collect();
        for seq in unsent {
            self.send_forward(seq, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_forward(
        &mut self,
        now: Time,
        from: NodeId,
        head: u64,
        seq: u64,
        done_below: u64,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        if self.coordinator.is_none() || head != self.config.incarnation {
            return;
        }
        let epoch = self.view.epoch;
        let session = self.sessions.entry(from).or_default();
        session.done_below = session.done_below.max(done_below);
        session.done = session.done.split_off(&session.done_below);
        if let Some(outcome) = session.done.get(&seq) {
            out.send(from, Message::Done { epoch, seq, outcome: outcome.clone() });
            return;
        }
        if seq < session.done_below || !session.accepted.insert(seq) {
            return;
        }
        let coordinator = self.coordinator.as_mut().expect("checked");
        coordinator.queue.push_back((Origin::Remote { node: from, seq }, command));
        self.drive(now, GroupOutbox::default(), out);
    }

    fn answer(&mut self, origin: Origin, outcome: Outcome, out: &mut Outbox<Message>) {
        match origin {
            Origin::Local(request) => out.reply(request, outcome),
            Origin::Remote { node, seq } => {
                let session = self.sessions.entry(node).or_default();
                session.accepted.remove(&seq);
                session.done.insert(seq, outcome.clone());
                out.send(node, Message::Done { epoch: self.view.epoch, seq, outcome });
            }
        }
    }

    // ------------------------------------------------------------------ the coordinator

    fn become_coordinator_if_head(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.become_coordinator_with(now, VecDeque::new(), out);
    }

    /// Take over as coordinator if this node is the head (keeping `queue`, updates not yet
    /// in any record), or answer the queued updates if it is not.
    fn become_coordinator_with(
        &mut self,
        now: Time,
        queue: VecDeque<(Origin, Command)>,
        out: &mut Outbox<Message>,
    ) {
        let is_head = self.head() == Some(self.config.me) && self.caught_up && self.member.is_some();
        if self.coordinator.is_some() || !is_head || !self.view.live.contains(self.config.me) {
            for (origin, _) in queue {
                self.answer(origin, Outcome::Error(CommandError::OutcomeUnknown), out);
            }
            return;
        }
        // Updates this node forwarded to the previous head of this view (a node that turned
        // out to be joining, so it coordinated nothing) are answered, not re-sent to itself.
        for (_, pending) in std::mem::take(&mut self.outstanding) {
            out.reply(pending.request, Outcome::Error(CommandError::OutcomeUnknown));
        }
        self.coordinator = Some(Coordinator {
            caller: None,
            copier: None,
            configuring: None,
            copy: None,
            unlinked: NodeSet::EMPTY,
            linked_epoch: 0,
            linked_sent_at: now,
            join_started_at: None,
            planned_catch_up: None,
            mirror: None,
            phase: Phase::Configuring,
            queue,
            batch: None,
            ops: FxHashMap::default(),
            next_request: 0,
            log_tail: 0,
            splits: self.member.as_ref().is_some_and(|member| member.carries_datagrams()),
            split: Split::default(),
        });
        let chain = self.live_order();
        self.start_configuring(now, false, chain, AfterConfig::Recover, out);
    }

    fn configure_message(&self, configuring: &Configuring) -> Message {
        Message::Configure {
            epoch: self.view.epoch,
            group_epoch: configuring.group_epoch,
            copy: configuring.copy,
            catch_up: configuring.catch_up,
            chain: configuring.chain.clone(),
            coordinator: self.config.incarnation,
        }
    }

    /// Start over as coordinator within the view (a member turned out to need a copy): the
    /// batch in flight has an unknown outcome (the recovery redoes it if it was appended),
    /// queued updates wait for the new configuration.
    fn restart_coordinator(&mut self, now: Time, out: &mut Outbox<Message>) {
        let Some(old) = self.coordinator.take() else { return };
        if let Some(batch) = old.batch {
            for (origin, _) in batch.items {
                self.answer(origin, Outcome::Error(CommandError::OutcomeUnknown), out);
            }
        }
        self.become_coordinator_with(now, old.queue, out);
    }

    fn caller_config(&self) -> CallerConfig {
        CallerConfig {
            retransmit_after: self.config.retransmit_timeout,
            // Never give up: a dead member is the membership service's to remove (§5.1), and
            // the next view reconfigures the chain.
            attempts_max: u32::MAX,
            window_max: self.config.window_max,
        }
    }

    /// Send a new configuration to every member of `chain` (this node installs its own at
    /// once) and wait for all of them before going on with `then`.
    fn start_configuring(
        &mut self,
        now: Time,
        copy: bool,
        chain: Vec<NodeId>,
        then: AfterConfig,
        out: &mut Outbox<Message>,
    ) {
        assert!(!chain.is_empty(), "a configuration has a member");
        self.generation += 1;
        let group_epoch = group_epoch(self.view.epoch, self.generation);
        self.stats.configurations += 1;
        let me = self.config.me;
        let missing: NodeSet = chain.iter().copied().filter(|node| *node != me).collect();
        let catch_up = self.coordinator.as_ref().is_some_and(|c| copy && c.planned_catch_up.is_some());
        let redo_from = self.last_executed();
        let configuring = Configuring {
            group_epoch,
            copy,
            catch_up,
            redo_from,
            chain: chain.clone(),
            missing,
            sent_at: now,
            then,
        };
        let message = self.configure_message(&configuring);
        for node in missing.iter() {
            out.send(node, message.clone());
        }
        if chain.contains(&me) {
            debug_assert!(!copy, "the coordinator never copies to itself");
            let incarnation = self.config.incarnation;
            self.install_configuration(me, group_epoch, false, chain, incarnation, out);
        }
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        coordinator.phase = Phase::Configuring;
        coordinator.configuring = Some(configuring);
        self.configured_if_complete(now, out);
    }

    /// A member's `ChainMember` takes the configuration of coordinator incarnation
    /// `coordinator`. Returns whether it is installed now.
    fn install_configuration(
        &mut self,
        from: NodeId,
        group_epoch: u64,
        copy: bool,
        chain: Vec<NodeId>,
        coordinator: u64,
        out: &mut Outbox<Message>,
    ) -> bool {
        let Some(member) = self.member.as_mut() else { return false };
        if group_epoch < member.config().epoch {
            return false; // an older configuration, overtaken
        }
        let group = if copy { COPY_GROUP } else { GROUP };
        let config = group_config(group, group_epoch, chain.clone(), &self.config.layout);
        if group_epoch > member.config().epoch {
            member.coordinated_by(from);
            if let Err(error) = member.on_config(self.now, config, &mut GroupOutbox::default()) {
                debug_assert!(false, "a coordinator's configuration is valid: {error}");
                return false;
            }
            if !copy {
                self.order = chain;
            }
        }
        self.configured_by = Some(from);
        if !copy {
            self.adopt_head(coordinator, out);
        }
        true
    }

    fn configured_if_complete(&mut self, now: Time, out: &mut Outbox<Message>) {
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        if coordinator.configuring.as_ref().is_none_or(|configuring| !configuring.missing.is_empty()) {
            return;
        }
        let configuring = coordinator.configuring.take().expect("checked");
        let layout = self.config.layout;
        let caller_config = self.caller_config();
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let group_epoch = configuring.group_epoch;
        match configuring.then {
            AfterConfig::Recover | AfterConfig::Link { .. } => {
                let config = group_config(GROUP, group_epoch, configuring.chain.clone(), &layout);
                let mut gout = GroupOutbox::default();
                match coordinator.caller.as_mut() {
                    Some(caller) => {
                        caller.on_config(now, config, &mut gout).expect("a newer configuration");
                    }
                    None => {
                        coordinator.caller = Some(
                            GroupCaller::new(config, COORDINATOR, caller_config)
                                .expect("a valid configuration"),
                        );
                    }
                }
                debug_assert!(gout.is_empty(), "nothing was pending at the caller");
                coordinator.copier = None;
                coordinator.copy = None;
                // Every member installed it: a joiner in it is linked and may serve, and so may
                // this node if it restarted on its data.
                self.awaiting_configuration = false;
                coordinator.unlinked =
                    configuring.chain.iter().copied().filter(|node| *node != self.config.me).collect();
                coordinator.linked_epoch = group_epoch;
                self.send_linked(now, out);
                match configuring.then {
                    AfterConfig::Recover => self.start_recovery(now, configuring.redo_from, out),
                    AfterConfig::Copy { .. } => unreachable!("handled below"),
                    AfterConfig::Link { joiner } => {
                        debug_assert_eq!(
                            configuring.chain.last(),
                            Some(&joiner),
                            "a joiner becomes the tail"
                        );
                        self.stats.joins_linked += 1;
                        let coordinator = self.coordinator.as_mut().expect("coordinating");
                        if let Some(started) = coordinator.join_started_at.take() {
                            self.stats.last_join_pause_us = now.saturating_sub(started).as_micros();
                        }
                        coordinator.phase = Phase::Idle;
                        self.drive(now, GroupOutbox::default(), out);
                    }
                }
            }
            AfterConfig::Copy { joiner } => {
                let config = group_config(COPY_GROUP, group_epoch, vec![joiner], &layout);
                coordinator.copier = Some(
                    GroupCaller::new(config, COORDINATOR, caller_config).expect("a valid configuration"),
                );
                let catch_up = coordinator.planned_catch_up.take();
                coordinator.copy =
                    Some(CopyProgress { joiner, catch_up, next_offset: 8, in_flight: 0, flush_sent: false });
                coordinator.phase = Phase::Copying;
                let mut gout = GroupOutbox::default();
                self.pump_copy(now, &mut gout, out);
                self.drive(now, gout, out);
            }
        }
    }

    fn retransmit_configuration(&mut self, now: Time, out: &mut Outbox<Message>) {
        let timeout = self.config.retransmit_timeout;
        let Some(coordinator) = self.coordinator.as_ref() else { return };
        if let Some(configuring) = coordinator.configuring.as_ref() {
            if now.saturating_sub(configuring.sent_at) >= timeout {
                let message = self.configure_message(configuring);
                for node in configuring.missing.iter() {
                    out.send(node, message.clone());
                }
                let coordinator = self.coordinator.as_mut().expect("checked");
                coordinator.configuring.as_mut().expect("checked").sent_at = now;
            }
        }
        let coordinator = self.coordinator.as_ref().expect("checked");
        if !coordinator.unlinked.is_empty() && now.saturating_sub(coordinator.linked_sent_at) >= timeout {
            self.send_linked(now, out);
        }
    }

    fn send_linked(&mut self, now: Time, out: &mut Outbox<Message>) {
        let epoch = self.view.epoch;
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        coordinator.linked_sent_at = now;
        let group_epoch = coordinator.linked_epoch;
        for node in coordinator.unlinked.iter() {
            out.send(node, Message::Linked { epoch, group_epoch });
        }
    }

    /// A live node that is not linked, if the coordinator is free to copy to it: idle, with
    /// nothing in flight (the head's region is then exactly what every member executed).
    fn joiner_to_copy(&self) -> Option<NodeId> {
        let coordinator = self.coordinator.as_ref()?;
        let idle = matches!(coordinator.phase, Phase::Idle)
            && coordinator.batch.is_none()
            && coordinator.caller.as_ref().is_some_and(|caller| caller.pending() == 0);
        if !idle {
            return None;
        }
        let chain = coordinator.caller_chain();
        self.view.live.iter().find(|node| !chain.contains(node) && self.joiners_heard.contains(*node))
    }

    /// §5.1 catch-up: keep up to `COPY_WINDOW` chunks of the head's region in flight to the
    /// joiner, then its lock word (0) with gFLUSH, then link it.
    fn pump_copy(&mut self, now: Time, gout: &mut GroupOutbox, out: &mut Outbox<Message>) {
        let early_link = self.has_bug(Bug::LinkBeforeCopyCompletes);
        if early_link {
            // The broken variant: link at once, as if the copy had been acknowledged.
            let coordinator = self.coordinator.as_mut().expect("coordinating");
            let joiner = coordinator.copy.as_ref().expect("copying").joiner;
            let mut chain = coordinator.caller_chain();
            chain.push(joiner);
            self.start_configuring(now, false, chain, AfterConfig::Link { joiner }, out);
            return;
        }
        let chunk_bytes = self.config.copy_chunk_bytes.max(8);
        let region_bytes = self.config.layout.region_bytes();
        let region = self.member.as_ref().expect("the coordinator is a member").memory();
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let copier = coordinator.copier.as_mut().expect("copying");
        let copy = coordinator.copy.as_mut().expect("copying");
        let pieces = &mut coordinator.split;
        if let Some(operations) = copy.catch_up.as_mut() {
            // A catch-up: the records the joiner lacks, then their execution and the header.
            while copy.in_flight < COPY_WINDOW {
                let Some(operation) = operations.pop_front() else { break };
                if let chorus_group::Primitive::Write { data, .. } = &operation.primitive {
                    self.stats.copy_bytes_sent += data.len() as u64;
                }
                let request = RequestId(coordinator.next_request);
                coordinator.next_request += 1;
                coordinator.ops.insert(request, OpKind::Copy);
                submit_split(copier, coordinator.splits, pieces, now, request, operation, gout);
                copy.in_flight += 1;
            }
            // The final lock-word write below goes out once these are acknowledged.
            copy.next_offset = if operations.is_empty() { region_bytes } else { 8 };
        }
        while copy.catch_up.is_none() && copy.in_flight < COPY_WINDOW && copy.next_offset < region_bytes {
            let len = chunk_bytes.min(region_bytes - copy.next_offset);
            let data = region.read_vec(copy.next_offset, len).expect("within the region");
            let request = RequestId(coordinator.next_request);
            coordinator.next_request += 1;
            coordinator.ops.insert(request, OpKind::Copy);
            let operation = Operation::write(copy.next_offset, data);
            submit_split(copier, coordinator.splits, pieces, now, request, operation, gout);
            self.stats.copy_bytes_sent += len;
            copy.next_offset += len;
            copy.in_flight += 1;
        }
        let sent = copy.next_offset == region_bytes;
        if sent && !copy.flush_sent && copy.in_flight == 0 {
            // The joiner's lock word starts free; the gFLUSH makes the whole copy durable.
            let request = RequestId(coordinator.next_request);
            coordinator.next_request += 1;
            coordinator.ops.insert(request, OpKind::Copy);
            let unlock = Operation::write(LOCK_OFFSET, 0u64.to_le_bytes().to_vec()).durable();
            submit_split(copier, coordinator.splits, pieces, now, request, unlock, gout);
            copy.flush_sent = true;
            copy.in_flight += 1;
        }
        if copy.flush_sent && copy.in_flight == 0 {
            let joiner = copy.joiner;
            if copy.catch_up.is_some() {
                self.stats.catch_ups += 1;
            }
            let mut chain = coordinator.caller_chain();
            chain.push(joiner);
            self.start_configuring(now, false, chain, AfterConfig::Link { joiner }, out);
        }
    }

    /// The operations that bring `joiner`'s region to this (the head's) one without copying it
    /// whole, if the joiner offered a region that is provably a prefix of this one: its last
    /// executed record is the one this log holds at that lsn (same bytes), and this log still
    /// holds every record after it. Then it lacks exactly those records: a record executed
    /// anywhere had been appended to every member of its configuration first, so every later
    /// head's log has it (docs/decisions.md, "The chain's durable state"). `None`: copy it all.
    fn catch_up_plan(&self, joiner: NodeId) -> Option<VecDeque<Operation>> {
        let offer = *self.offers.get(&joiner)?;
        let layout = self.config.layout;
        let region = self.member.as_ref()?.memory();
        let head_tail = region.load_u64(HEAD_OFFSET).ok()?;
        // Its last record is sent again too (a crash may have cut its execution short at the
        // joiner), so nothing from it on may have been overwritten by a later lap.
        let first = if offer == RegionSummary::EMPTY { 0 } else { offer.last_lsn };
        let span = head_tail.checked_sub(first)?;
        if offer.log_head > head_tail || span > layout.txn.log_bytes - layout.record_bytes_max() {
            return None;
        }
        if offer != RegionSummary::EMPTY {
            let record = parse_record(region, &layout, offer.last_lsn).filter(|r| r.end == offer.log_head)?;
            if record_crc(&record) != offer.last_crc {
                return None;
            }
        }
        let mut records = Vec::new();
        let mut lsn = first;
        while lsn < head_tail {
            let record = parse_record(region, &layout, lsn)?;
            lsn = record.end;
            records.push(record);
        }
        let last_executed = region.load_u64(LAST_EXECUTED_OFFSET).ok()?;
        if lsn != head_tail || records.last().is_some_and(|record| record.lsn != last_executed) {
            return None;
        }
        let mut operations: VecDeque<Operation> = records
            .iter()
            .map(|record| Operation::write(record.base, record.bytes.to_vec()).durable())
            .collect();
        for record in &records {
            operations.extend(execute_operations(record));
        }
        operations.push_back(Operation::write(MAGIC_OFFSET, layout.magic_words()).durable());
        Some(operations)
    }

    /// §5.1: fence reads at every member, redo the last executed and the pending record from
    /// this (the head's) log, and, once the tail acknowledged all that, unlock.
    fn start_recovery(&mut self, now: Time, redo_from: u64, out: &mut Outbox<Message>) {
        self.stats.recoveries += 1;
        let layout = self.config.layout;
        let region = self.member.as_ref().expect("the coordinator's node is a member").memory();
        let head = region.load_u64(HEAD_OFFSET).unwrap_or(0);
        let last = region.load_u64(HEAD_OFFSET + 8).unwrap_or(0);
        // Every record from the oldest any member last executed (a member may have missed the
        // end of an interrupted recovery, or restarted), or else the last executed one.
        let mut records = records_between(region, &layout, redo_from, head).unwrap_or_default();
        if records.is_empty() && last < head {
            if let Some(record) = parse_record(region, &layout, last).filter(|r| r.end == head) {
                records.push(record);
            }
        }
        if let Some(record) = parse_record(region, &layout, head) {
            records.push(record);
        }
        // The fence. With members beside the nodes (group hosts, the XDP program) a node's
        // reader may be inside its lookup: the gCAS from 0 waits for it at the member, as the
        // write lock does (it yields to readers); the gWRITE then covers a word that a dead
        // coordinator's lock (or an interrupted recovery) still holds, where that gCAS failed.
        let all = self.coordinator.as_ref().expect("recovering coordinator").all_members();
        let mut operations = vec![
            Operation::cas(LOCK_OFFSET, 0, RECOVERING, all).yielding_to_readers(),
            Operation::write(LOCK_OFFSET, RECOVERING.to_le_bytes().to_vec()).durable(),
        ];
        // Before anything is redone: until the last operation clears it, a later recovery
        // redoes from this record too (a member's database is a mixture meanwhile).
        if let Some(first) = records.first() {
            let redoing = REDOING | first.lsn;
            operations.push(Operation::write(REDO_FROM_OFFSET, redoing.to_le_bytes().to_vec()).durable());
        }
        for record in &records {
            operations.push(Operation::write(record.base, record.bytes.clone()).durable());
        }
        for record in &records {
            operations.extend(execute_operations(record));
        }
        operations.push(Operation::write(MAGIC_OFFSET, layout.magic_words()).durable());
        operations.push(Operation::write(REDO_FROM_OFFSET, 0u64.to_le_bytes().to_vec()).durable());
        // The unlock goes out only once the tail has acknowledged all of this: a replica
        // upstream must not serve the redone state before the tail has it.
        let coordinator = self.coordinator.as_mut().expect("recovering coordinator");
        coordinator.phase = Phase::Recovering { waiting: operations.len() };
        let mut gout = GroupOutbox::default();
        for operation in operations {
            coordinator.submit(now, OpKind::Recovery, operation, &mut gout);
        }
        self.drive(now, gout, out);
    }

    /// Route group messages (locally to this node's member or coordinator, or to peers) and
    /// handle completions until nothing is left.
    fn drive(&mut self, now: Time, mut gout: GroupOutbox, out: &mut Outbox<Message>) {
        let me = self.config.me;
        let mut applied = false;
        loop {
            if gout.messages.is_empty() && gout.completions.is_empty() {
                if let Some(joiner) = self.joiner_to_copy() {
                    // §5.1: writes pause while the joiner catches up.
                    let plan = self.catch_up_plan(joiner);
                    if let Some(coordinator) = self.coordinator.as_mut() {
                        coordinator.join_started_at.get_or_insert(now);
                        coordinator.planned_catch_up = plan;
                    }
                    self.start_configuring(now, true, vec![joiner], AfterConfig::Copy { joiner }, out);
                    continue;
                }
                let joiner_waits = self.coordinator.as_ref().is_some_and(|c| {
                    let chain = c.caller_chain();
                    self.view
                        .live
                        .iter()
                        .any(|node| !chain.contains(&node) && self.joiners_heard.contains(node))
                });
                // Planning reads this node's state (RMWs; one that writes nothing is answered
                // at once), which is the chain's only while no view without this node can be
                // installed: a deposed head still in its old view would answer from stale state.
                let leased = self.leased(now);
                if leased
                    && self.coordinator.as_ref().is_some_and(|c| {
                        matches!(c.phase, Phase::Idle) && !c.queue.is_empty() && !joiner_waits
                    })
                {
                    self.start_batch(now, &mut gout, out);
                    if gout.is_empty() {
                        continue;
                    }
                } else {
                    break;
                }
            }
            let messages = std::mem::take(&mut gout.messages);
            for (to, message) in messages {
                let for_caller = !matches!(message, GroupMessage::Op { .. });
                if for_caller {
                    // The tail's ack or a refusal, addressed to the coordinator whose
                    // configuration this member runs.
                    match self.configured_by {
                        Some(node) if node == me => {
                            if let Some(coordinator) = self.coordinator.as_mut() {
                                coordinator.on_local_caller_message(now, me, message, &mut gout);
                            }
                        }
                        Some(node) => out.send(node, Message::Group(message)),
                        None => {}
                    }
                } else if to == me {
                    if let Some(member) = self.member.as_mut() {
                        member.on_message(now, COORDINATOR, message, &mut gout);
                        applied = true;
                    }
                } else {
                    out.send(to, Message::Group(message));
                }
            }
            let completions = std::mem::take(&mut gout.completions);
            for (request, result) in completions {
                self.on_completion(now, request, result, &mut gout, out);
            }
        }
        if applied {
            self.retry_parked_reads(now, out);
        }
    }

    fn on_completion(
        &mut self,
        now: Time,
        request: RequestId,
        result: Result<OpOutcome, GroupError>,
        gout: &mut GroupOutbox,
        out: &mut Outbox<Message>,
    ) {
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        let Some((request, result)) = coordinator.split.complete(request, result) else { return };
        let Some(kind) = coordinator.ops.remove(&request) else { return };
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(GroupError::Reconfigured) => return, // the new view's recovery takes over
            Err(_) => {
                // Only a new view repairs the group; the batch's outcome is unknown.
                coordinator.phase = Phase::Broken;
                self.fail_batch(out);
                return;
            }
        };
        if kind == OpKind::Copy {
            if let (Some(copy), Phase::Copying) = (coordinator.copy.as_mut(), &coordinator.phase) {
                copy.in_flight -= 1;
                self.pump_copy(now, gout, out);
            }
            return;
        }
        let all = coordinator.all_members();
        match (kind, &mut coordinator.phase) {
            (OpKind::Recovery, Phase::Recovering { waiting }) => {
                *waiting -= 1;
                if *waiting == 0 {
                    let unlock = Operation::write(LOCK_OFFSET, 0u64.to_le_bytes().to_vec()).durable();
                    coordinator.submit(now, OpKind::Unlock, unlock, gout);
                    self.finish_recovery(out);
                }
            }
            (OpKind::Lock, Phase::Executing { waiting }) => {
                let swapped = outcome.swapped_map(0);
                if swapped != all {
                    // Cannot happen with one coordinator per epoch: the lock yields to readers
                    // (it waits at a member whose node holds a read lock), so only another
                    // writer could refuse it. If it does, the batch ran without isolation
                    // somewhere. Undo the partial success (§4.2) and stop writing
                    // until a new view's recovery re-establishes one state.
                    self.stats.lock_failures += 1;
                    if swapped != 0 {
                        let undo = Operation::cas(LOCK_OFFSET, WRITER_BIT | OWNER, 0, swapped);
                        coordinator.submit(now, OpKind::Undo, undo, gout);
                    }
                    coordinator.phase = Phase::Broken;
                    self.fail_batch(out);
                    return;
                }
                *waiting -= 1;
                if *waiting == 0 {
                    self.finish_batch(now, gout, out);
                }
            }
            (OpKind::Append, Phase::Appending { waiting }) => {
                *waiting -= 1;
                if *waiting == 0 {
                    self.execute(now, gout);
                }
            }
            (OpKind::Execute, Phase::Executing { waiting }) => {
                *waiting -= 1;
                if *waiting == 0 {
                    self.finish_batch(now, gout, out);
                }
            }
            (OpKind::Undo | OpKind::Unlock, _) => {}
            // The rest of a batch that failed (only a new configuration repairs the group).
            (_, Phase::Broken) => {}
            (kind, _) => debug_assert!(false, "completion of {kind:?} in an unexpected phase"),
        }
    }

    fn finish_recovery(&mut self, out: &mut Outbox<Message>) {
        let layout = self.config.layout;
        let region = self.member.as_ref().expect("coordinator is a member").memory();
        let head = region.load_u64(HEAD_OFFSET).unwrap_or(0);
        let coordinator = self.coordinator.as_mut().expect("recovering");
        match Mirror::rebuild(region, layout) {
            Ok(mirror) => {
                coordinator.mirror = Some(mirror);
                coordinator.log_tail = head;
                coordinator.phase = Phase::Idle;
            }
            Err(error) => {
                self.region_error = Some(error.to_string());
                coordinator.phase = Phase::Broken;
                let queued: Vec<Origin> = coordinator.queue.drain(..).map(|(origin, _)| origin).collect();
                for origin in queued {
                    self.answer(
                        origin,
                        Outcome::Error(CommandError::Unavailable("the chain region is corrupt")),
                        out,
                    );
                }
            }
        }
    }

    /// Plan the queued updates into one redo record, against the state every member has
    /// executed (the previous batch is done), and send lock + append.
    fn start_batch(&mut self, now: Time, gout: &mut GroupOutbox, out: &mut Outbox<Message>) {
        let layout = self.config.layout;
        let region = self.member.as_ref().expect("coordinator is a member").memory();
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let mirror = coordinator.mirror.as_mut().expect("recovered");
        let cap = layout.record_bytes_max();
        let mut used = RECORD_HEADER_BYTES;
        let mut entries: Vec<(u64, Bytes)> = Vec::new();
        let mut items = Vec::new();
        let mut overlay: FxHashMap<Key, Option<Value>> = FxHashMap::default();
        while let Some((_, command)) = coordinator.queue.front() {
            // A hash update's new value is the current hash plus its pairs; only hash updates
            // need the current value's size, so only they read it here.
            let is_hash_update = matches!(
                command,
                Command::Rmw {
                    op: chorus_core::RmwOp::HashSet { .. } | chorus_core::RmwOp::HashDelete(_),
                    ..
                }
            );
            let current_bytes = if !is_hash_update {
                0
            } else if let Some(value) = overlay.get(command.key()) {
                value.as_ref().map_or(0, |v| v.len())
            } else {
                mirror.value(region, command.key()).ok().flatten().map_or(0, |v| v.len())
            };
            let bound = update_bytes_bound(command, current_bytes);
            if !items.is_empty() && used + bound > cap {
                break;
            }
            let (origin, command) = coordinator.queue.pop_front().expect("front exists");
            let (key, write, outcome) = match command {
                Command::Write { key, value } => (key, Some(value), Outcome::Written),
                Command::Rmw { key, op } => {
                    let current = match overlay.get(&key) {
                        Some(value) => value.clone(),
                        None => match mirror.value(region, &key) {
                            Ok(value) => value,
                            Err(_) => {
                                let error = CommandError::Unavailable("the chain region is corrupt");
                                items.push((origin, Outcome::Error(error)));
                                continue;
                            }
                        },
                    };
                    let effect = op.apply(current.as_ref());
                    (key, effect.write, effect.outcome)
                }
                Command::Read { .. } => unreachable!("reads never reach the coordinator"),
            };
            let Some(value) = write else {
                items.push((origin, outcome));
                continue;
            };
            match mirror.plan(&key, value.as_ref()) {
                Ok(planned) => {
                    used +=
                        planned.iter().map(|(_, d)| RECORD_ENTRY_HEADER_BYTES + d.len() as u64).sum::<u64>();
                    entries.extend(planned);
                    overlay.insert(key, value);
                    items.push((origin, outcome));
                }
                Err(error) => {
                    items.push((origin, Outcome::Error(CommandError::Unavailable(error.message()))))
                }
            }
        }
        mirror.end_batch();
        self.stats.batches += 1;
        if entries.is_empty() {
            // Nothing to write (reads-only RMWs, deletes of absent keys, refusals): the state
            // they saw is executed everywhere, so they are answered now.
            for (origin, outcome) in items {
                self.answer(origin, outcome, out);
            }
            return;
        }
        let len = encode_record(&layout, 0, &entries).bytes.len() as u64;
        debug_assert!(len <= cap);
        let lsn = record_start(coordinator.log_tail, len, layout.txn.log_bytes);
        let record = encode_record(&layout, lsn, &entries);
        coordinator.submit(
            now,
            OpKind::Append,
            Operation::write(record.base, record.bytes.clone()).durable(),
            gout,
        );
        coordinator.phase = Phase::Appending { waiting: 1 };
        coordinator.batch = Some(Batch { items, record: Some(record) });
        self.stats.records_appended += 1;
    }

    /// ExecuteAndAdvance under the group write lock: the lock gCAS goes first in the pipeline,
    /// so every member takes it before it copies anything.
    fn execute(&mut self, now: Time, gout: &mut GroupOutbox) {
        let no_lock = self.has_bug(Bug::NoWriteLock);
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let record = coordinator.batch.as_ref().and_then(|b| b.record.clone()).expect("batch has a record");
        let mut operations = execute_operations(&record);
        let mut kinds = vec![OpKind::Execute; operations.len()];
        if !no_lock {
            let all = coordinator.all_members();
            // It yields to readers: a member whose node holds a read lock at that instant (a
            // group host or the XDP program runs beside the node) neither takes it nor applies
            // anything pipelined behind it until the readers have left (docs/protocols/chain.md,
            // "The read lock and the group write lock").
            let lock = Operation::cas(LOCK_OFFSET, 0, WRITER_BIT | OWNER, all).yielding_to_readers();
            operations.insert(0, lock);
            kinds.insert(0, OpKind::Lock);
        }
        coordinator.phase = Phase::Executing { waiting: operations.len() };
        for (kind, operation) in kinds.into_iter().zip(operations) {
            coordinator.submit(now, kind, operation, gout);
        }
    }

    fn finish_batch(&mut self, now: Time, gout: &mut GroupOutbox, out: &mut Outbox<Message>) {
        let no_lock = self.has_bug(Bug::NoWriteLock);
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let batch = coordinator.batch.take().expect("executing a batch");
        if let Some(record) = &batch.record {
            coordinator.log_tail = record.end;
        }
        if !no_lock {
            let all = coordinator.all_members();
            coordinator.submit(
                now,
                OpKind::Unlock,
                Operation::cas(LOCK_OFFSET, WRITER_BIT | OWNER, 0, all),
                gout,
            );
        }
        coordinator.phase = Phase::Idle;
        self.stats.updates_executed += batch.items.len() as u64;
        for (origin, outcome) in batch.items {
            self.answer(origin, outcome, out);
        }
    }

    fn fail_batch(&mut self, out: &mut Outbox<Message>) {
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        let Some(batch) = coordinator.batch.take() else { return };
        for (origin, _) in batch.items {
            if let Origin::Local(request) = origin {
                out.reply(request, Outcome::Error(CommandError::OutcomeUnknown));
            }
            // Remote origins fail their forwards themselves when the view changes.
        }
    }

    // ------------------------------------------------------------------ views

    fn install_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        self.view = view;
        self.stats.views_installed += 1;
        // Whatever was in flight has an unknown outcome; the new coordinator redoes the log.
        self.fail_batch(out);
        if let Some(coordinator) = self.coordinator.take() {
            for (origin, _) in coordinator.queue {
                if let Origin::Local(request) = origin {
                    out.reply(request, Outcome::Error(CommandError::OutcomeUnknown));
                }
            }
        }
        self.sessions.clear();
        for (_, pending) in std::mem::take(&mut self.outstanding) {
            out.reply(pending.request, Outcome::Error(CommandError::OutcomeUnknown));
        }
        self.generation = if self.generation_floor.0 == view.epoch.0 { self.generation_floor.1 } else { 0 };
        self.configured_by = None;
        self.joining_sent_at = None;
        self.restarted_sent_at = None;
        self.joiners_heard = NodeSet::EMPTY;
        self.head_incarnation = None;
        self.restarts_handled.clear();
        self.offers.clear();
        if !view.live.contains(self.config.me) {
            // Removed: whatever this node holds may go stale from now on. If it comes back
            // (a join view), it is copied to like a new node, or caught up if its region is a
            // prefix of the head's.
            self.caught_up = false;
            self.awaiting_configuration = false;
            self.order.clear();
            self.copied_in = None;
            for (request, _) in std::mem::take(&mut self.parked_reads) {
                out.reply(request, Outcome::Error(CommandError::Unavailable("not in the current view")));
            }
            return;
        }
        if self.caught_up {
            self.order.retain(|node| view.live.contains(*node));
        } else {
            self.order.clear();
            self.announce_joining(now, out);
        }
        self.become_coordinator_if_head(now, out);
        self.retry_parked_reads(now, out);
    }

    /// A node without the data tells every member it is joining in this view, until the
    /// coordinator starts copying to it.
    fn announce_joining(&mut self, now: Time, out: &mut Outbox<Message>) {
        let me = self.config.me;
        if self.caught_up || self.copied_in == Some(self.view.epoch) || !self.view.live.contains(me) {
            return;
        }
        if self.joining_sent_at.is_some_and(|at| now.saturating_sub(at) < self.config.retransmit_timeout) {
            return;
        }
        self.joining_sent_at = Some(now);
        let offer = self.offer();
        out.broadcast(self.view.live.without(me), Message::Joining { epoch: self.view.epoch, offer });
    }

    /// Where this joiner's region stands, if it is a whole image of the chain at some point
    /// (so the coordinator may send only what it lacks).
    fn offer(&self) -> Option<RegionSummary> {
        // A region whose recovery was cut short is a mixture of records: copy it whole.
        if !self.region_complete || self.redo_cut_short().is_some() {
            return None;
        }
        summary(self.member.as_ref()?.memory(), &self.config.layout).ok()
    }

    /// A node restarted on its data, still linked, asks the coordinator to configure the
    /// chain again (its member lost its place in the operation sequence), until it is.
    fn announce_restarted(&mut self, now: Time, out: &mut Outbox<Message>) {
        let me = self.config.me;
        let configured = self.configured_by.is_some();
        if !self.awaiting_configuration || configured || !self.caught_up || !self.view.live.contains(me) {
            return;
        }
        if self.head() == Some(me)
            || self
                .restarted_sent_at
                .is_some_and(|at| now.saturating_sub(at) < self.config.retransmit_timeout)
        {
            return;
        }
        self.restarted_sent_at = Some(now);
        let message = Message::Restarted { epoch: self.view.epoch, incarnation: self.config.incarnation };
        out.broadcast(self.view.live.without(me), message);
    }

    /// `from` restarted on its data and is still in the chain: configure the chain again, with
    /// it (the recovery that follows redoes the records it may lack: at most the batch in
    /// flight, since none completes without its acknowledgement).
    fn on_restarted(&mut self, now: Time, from: NodeId, incarnation: u64, out: &mut Outbox<Message>) {
        let Some(coordinator) = self.coordinator.as_ref() else { return };
        if self.restarts_handled.get(&from) == Some(&incarnation) {
            return;
        }
        let configuring_with = coordinator
            .configuring
            .as_ref()
            .is_some_and(|c| !c.copy && c.chain.contains(&from) && c.missing.contains(from));
        if !self.order.contains(&from) {
            return;
        }
        self.restarts_handled.insert(from, incarnation);
        // Its updates are numbered from above anything it used before (`seq_floor`): its
        // session stays, so no forward it already sent is taken again.
        self.stats.restarts_rejoined += 1;
        if !configuring_with {
            self.restart_coordinator(now, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_configure(
        &mut self,
        from: NodeId,
        group_epoch: u64,
        copy: bool,
        catch_up: bool,
        chain: Vec<NodeId>,
        coordinator: u64,
        out: &mut Outbox<Message>,
    ) {
        let me = self.config.me;
        let epoch = self.view.epoch;
        if view_of(group_epoch) != epoch.0 || !chain.contains(&me) || self.coordinator.is_some() {
            return;
        }
        if self.caught_up {
            // A linked member follows the head; it is never copied to (its region is whole).
            if copy || Some(from) != self.head() {
                return;
            }
        } else if copy {
            if chain != [me] {
                return;
            }
            self.copied_in = Some(epoch);
            if self.member.as_ref().is_some_and(|member| member.config().epoch < group_epoch) {
                self.stats.copies_received += 1; // not a retransmitted configuration
            }
            // A whole copy overwrites the region piecemeal: it is whole again once linked. A
            // catch-up only executes records in order, so it stays a consistent image.
            if !catch_up {
                self.region_complete = false;
            }
        } else if self.copied_in != Some(epoch) && !self.has_bug(Bug::LinkBeforeCopyCompletes) {
            // Listed as linked (it restarted before the others noticed), but its region is
            // stale: it must be copied to first.
            out.send(from, Message::NeedCopy { epoch, group_epoch });
            return;
        }
        if self.install_configuration(from, group_epoch, copy, chain, coordinator, out) {
            let last_executed = self.last_executed();
            out.send(from, Message::Configured { epoch, group_epoch, last_executed });
        }
    }

    fn on_configured(
        &mut self,
        now: Time,
        from: NodeId,
        group_epoch: u64,
        last_executed: u64,
        out: &mut Outbox<Message>,
    ) {
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        let Some(configuring) = coordinator.configuring.as_mut() else { return };
        if configuring.group_epoch != group_epoch {
            return;
        }
        if configuring.missing.contains(from) {
            configuring.redo_from = configuring.redo_from.min(last_executed);
        }
        configuring.missing.remove(from);
        self.configured_if_complete(now, out);
    }

    /// `from` needs a copy before it can be in the chain: drop it and configure again; it is
    /// copied to once the chain without it has recovered.
    fn on_need_copy(&mut self, now: Time, from: NodeId, group_epoch: u64, out: &mut Outbox<Message>) {
        let Some(coordinator) = self.coordinator.as_ref() else { return };
        let current =
            coordinator.configuring.as_ref().is_some_and(|c| c.group_epoch == group_epoch && !c.copy);
        if !current {
            return;
        }
        self.order.retain(|node| *node != from);
        self.restart_coordinator(now, out);
    }

    /// `from` is joining in this view: if this node still lists it as linked (it restarted
    /// before anyone noticed), it is not any more.
    fn on_joining(
        &mut self,
        now: Time,
        from: NodeId,
        offer: Option<RegionSummary>,
        out: &mut Outbox<Message>,
    ) {
        self.joiners_heard.insert(from);
        match offer {
            Some(offer) => self.offers.insert(from, offer),
            None => self.offers.remove(&from),
        };
        // Its forward session is kept: a restarted origin numbers its updates above anything
        // it used before (`seq_floor`), and this may be a late copy of an announcement from
        // before it was linked, after which it forwards again (sweep seed 38564).
        if !self.caught_up || !self.order.contains(&from) {
            // Not listed as linked here: a coordinator may copy to it now.
            self.drive(now, GroupOutbox::default(), out);
            return;
        }
        // A configuration of this view that includes `from` was acknowledged by it after a
        // copy in this view: the announcement is an old duplicate.
        let configured_with = self.member.as_ref().is_some_and(|member| {
            let group = member.config();
            view_of(group.epoch) == self.view.epoch.0 && group.chain.contains(&from)
        });
        if configured_with {
            return;
        }
        self.order.retain(|node| *node != from);
        if self.coordinator.is_some() {
            self.restart_coordinator(now, out);
        } else {
            self.become_coordinator_if_head(now, out);
        }
    }

    fn on_linked(&mut self, from: NodeId, group_epoch: u64, out: &mut Outbox<Message>) {
        let me = self.config.me;
        let installed = self.member.as_ref().is_some_and(|member| {
            let group = member.config();
            group.group == GROUP && group.epoch == group_epoch && group.chain.contains(&me)
        });
        if !installed || Some(from) != self.configured_by {
            return;
        }
        if !self.caught_up {
            debug_assert!(
                self.copied_in == Some(self.view.epoch) || self.has_bug(Bug::LinkBeforeCopyCompletes)
            );
            self.caught_up = true;
            self.joining_sent_at = None;
        }
        // Every member installed a configuration with this node: its region is whole and
        // the chain's, and it may serve.
        self.region_complete = true;
        self.awaiting_configuration = false;
        out.send(from, Message::LinkedAck { epoch: self.view.epoch, group_epoch });
    }
}

impl Coordinator {
    fn submit(&mut self, now: Time, kind: OpKind, operation: Operation, gout: &mut GroupOutbox) {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        self.ops.insert(request, kind);
        let caller = self.caller.as_mut().expect("the data path is configured");
        submit_split(caller, self.splits, &mut self.split, now, request, operation, gout);
    }

    fn all_members(&self) -> u64 {
        self.caller.as_ref().expect("the data path is configured").group().all_members()
    }

    /// The data path's chain as installed everywhere (empty before the first configuration).
    fn caller_chain(&self) -> Vec<NodeId> {
        self.caller.as_ref().map(|caller| caller.group().chain.clone()).unwrap_or_default()
    }

    /// What this node's own member hands over for the coordinator: an acknowledgement came
    /// from the group's tail (this node's member core is the tail, or, on the kernel path, the
    /// tail's host acknowledged straight to this node, with a result map of the datagram's
    /// width, cut here to the chain's).
    fn on_local_caller_message(
        &mut self,
        now: Time,
        me: NodeId,
        mut message: GroupMessage,
        gout: &mut GroupOutbox,
    ) {
        let caller = if message.group() == COPY_GROUP { self.copier.as_ref() } else { self.caller.as_ref() };
        let Some(chain) = caller.map(|caller| caller.group().chain.clone()) else { return };
        let from = match &mut message {
            GroupMessage::Ack { outcome, .. } => {
                if let Ok(map) = outcome {
                    while map.len() > chain.len() && map.last() == Some(&None) {
                        map.pop();
                    }
                }
                chain.last().copied().unwrap_or(me)
            }
            _ => me,
        };
        self.on_caller_message(now, from, message, gout);
    }

    fn on_caller_message(&mut self, now: Time, from: NodeId, message: GroupMessage, gout: &mut GroupOutbox) {
        let caller = if message.group() == COPY_GROUP { self.copier.as_mut() } else { self.caller.as_mut() };
        if let Some(caller) = caller {
            caller.on_message(now, from, message, gout);
        }
    }

    fn on_tick(&mut self, now: Time, gout: &mut GroupOutbox) {
        for caller in [self.caller.as_mut(), self.copier.as_mut()].into_iter().flatten() {
            caller.on_tick(now, gout);
        }
    }
}

/// The records of `region`'s log from `from` (inclusive) up to `to`, if it still holds every
/// one of them (none overwritten by a later lap).
fn records_between(
    region: &impl RegionMemory,
    layout: &ChainLayout,
    from: u64,
    to: u64,
) -> Option<Vec<Record>> {
    if from > to || to - from > layout.txn.log_bytes - layout.record_bytes_max() {
        return None;
    }
    let mut records = Vec::new();
    let mut lsn = from;
    while lsn < to {
        let record = parse_record(region, layout, lsn)?;
        lsn = record.end;
        records.push(record);
    }
    (lsn == to).then_some(records)
}

/// ExecuteAndAdvance for one record (§5): gMEMCPY+gFLUSH per entry, then the log head (and
/// the last executed record, for recovery) with gWRITE+gFLUSH.
fn execute_operations(record: &Record) -> Vec<Operation> {
    let mut operations: Vec<Operation> =
        record.copies.iter().map(|&(src, dst, len)| Operation::memcpy(src, dst, len).durable()).collect();
    let mut header = Vec::with_capacity(16);
    header.extend_from_slice(&record.end.to_le_bytes());
    header.extend_from_slice(&record.lsn.to_le_bytes());
    operations.push(Operation::write(HEAD_OFFSET, header).durable());
    operations
}

/// At most how many record bytes an update adds (heap entry + index slot + entry headers),
/// given the size of the key's current value.
fn update_bytes_bound(command: &Command, current_bytes: usize) -> u64 {
    use chorus_core::RmwOp;
    let value_len = match command {
        Command::Write { value, .. } => value.as_ref().map_or(0, |v| v.len()),
        Command::Rmw { op, .. } => match op {
            RmwOp::CompareAndSwap { new, .. } => new.as_ref().map_or(0, |v| v.len()),
            RmwOp::IncrementBy(_) => 20,
            RmwOp::SetIfAbsent(v) | RmwOp::SetIfPresent(v) => v.len(),
            RmwOp::Swap(v) => v.as_ref().map_or(0, |v| v.len()),
            RmwOp::HashSet { pairs, .. } => {
                let added: usize = pairs.iter().map(|(field, value)| 8 + field.len() + value.len()).sum();
                current_bytes.max(chorus_core::hash::MAGIC.len() + 4) + added
            }
            RmwOp::HashDelete(_) => current_bytes,
            RmwOp::Exec(exec) => chorus_core::data::bytes_bound(exec, current_bytes),
        },
        Command::Read { .. } => 0,
    };
    crate::layout::entry_bytes(command.key().len(), value_len) + 16 + 2 * RECORD_ENTRY_HEADER_BYTES
}

impl<M: Member> Replica for Chain<M> {
    type Message = Message;

    fn id(&self) -> NodeId {
        self.config.me
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        self.now = now;
        self.become_coordinator_if_head(now, out);
        let reason = if self.member.is_none() {
            Some("the chain region is unusable")
        } else if !self.view.live.contains(self.config.me) {
            Some("not in the current view")
        } else if !self.caught_up {
            Some(JOINING)
        } else if self.awaiting_configuration {
            Some(RESTARTING)
        } else {
            None
        };
        if let Some(reason) = reason {
            out.reply(request, Outcome::Error(CommandError::Unavailable(reason)));
            return;
        }
        if let Command::Read { key } = command {
            match self.try_read(now, &key) {
                Some(outcome) => out.reply(request, outcome),
                None => {
                    self.stats.reads_parked += 1;
                    self.parked_reads.push_back((request, key));
                }
            }
            return;
        }
        if let Some(coordinator) = self.coordinator.as_mut() {
            coordinator.queue.push_back((Origin::Local(request), command));
            self.drive(now, GroupOutbox::default(), out);
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.outstanding.insert(seq, Outstanding { request, command, sent_at: now, head: None });
        self.send_forward(seq, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        self.now = now;
        self.become_coordinator_if_head(now, out);
        match message {
            Message::Group(message) => {
                let mut gout = GroupOutbox::default();
                match message {
                    GroupMessage::Op { .. } => {
                        if let Some(member) = self.member.as_mut() {
                            // The head of a group hears from the coordinator, which lives on
                            // another node only for the copy group (its one member is the
                            // joiner).
                            let from = if member.position() == 0 && Some(from) == self.configured_by {
                                COORDINATOR
                            } else {
                                from
                            };
                            member.on_message(now, from, message, &mut gout);
                        }
                        self.drive(now, gout, out);
                        self.retry_parked_reads(now, out);
                    }
                    _ => {
                        if let Some(coordinator) = self.coordinator.as_mut() {
                            coordinator.on_caller_message(now, from, message, &mut gout);
                            self.drive(now, gout, out);
                        }
                    }
                }
            }
            Message::Configure { epoch, group_epoch, copy, catch_up, chain, coordinator } => {
                if epoch == self.view.epoch {
                    self.on_configure(from, group_epoch, copy, catch_up, chain, coordinator, out);
                }
            }
            Message::Configured { epoch, group_epoch, last_executed } => {
                if epoch == self.view.epoch {
                    self.on_configured(now, from, group_epoch, last_executed, out);
                }
            }
            Message::NeedCopy { epoch, group_epoch } => {
                if epoch == self.view.epoch {
                    self.on_need_copy(now, from, group_epoch, out);
                }
            }
            Message::Joining { epoch, offer } => {
                if epoch == self.view.epoch && self.view.live.contains(from) {
                    self.on_joining(now, from, offer, out);
                }
            }
            Message::Restarted { epoch, incarnation } => {
                if epoch == self.view.epoch && self.view.live.contains(from) {
                    self.on_restarted(now, from, incarnation, out);
                }
            }
            Message::Linked { epoch, group_epoch } => {
                if epoch == self.view.epoch {
                    self.on_linked(from, group_epoch, out);
                }
            }
            Message::LinkedAck { epoch, group_epoch } => {
                if let Some(coordinator) = self.coordinator.as_mut() {
                    if epoch == self.view.epoch && group_epoch == coordinator.linked_epoch {
                        coordinator.unlinked.remove(from);
                    }
                }
            }
            Message::Forward { epoch, head, seq, done_below, command } => {
                if !command.is_update() || epoch != self.view.epoch {
                    return; // another epoch's, or malformed: reads are never forwarded
                }
                self.on_forward(now, from, head, seq, done_below, command, out);
            }
            Message::Done { epoch, seq, outcome } => {
                if epoch != self.view.epoch || Some(from) != self.head() {
                    return;
                }
                if let Some(pending) = self.outstanding.remove(&seq) {
                    out.reply(pending.request, outcome);
                }
            }
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.now = now;
        let mut gout = GroupOutbox::default();
        if let Some(member) = self.member.as_mut() {
            member.on_tick(now, &mut gout);
        }
        self.become_coordinator_if_head(now, out);
        self.announce_joining(now, out);
        self.announce_restarted(now, out);
        if let Some(coordinator) = self.coordinator.as_mut() {
            coordinator.on_tick(now, &mut gout);
        }
        self.retransmit_configuration(now, out);
        self.drive(now, gout, out);
        let due: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, pending)| now.saturating_sub(pending.sent_at) >= self.config.retransmit_timeout)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            self.stats.forward_retransmits += 1;
            if let Some(pending) = self.outstanding.get_mut(&seq) {
                pending.sent_at = now;
            }
            self.send_forward(seq, out);
        }
        self.retry_parked_reads(now, out);
    }

    fn installed_view(&self) -> Option<View> {
        Some(self.view)
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        let stats = &self.stats;
        report("chain.recoveries", stats.recoveries);
        report("chain.lock_failures", stats.lock_failures);
        report("chain.forward_retransmits", stats.forward_retransmits);
        report("chain.joins_linked", stats.joins_linked);
        report("chain.catch_ups", stats.catch_ups);
        report("chain.restarts_rejoined", stats.restarts_rejoined);
    }

    /// A joiner is caught up once it is linked into the chain (§5.1): the membership service
    /// then counts it as holding all the data.
    fn is_caught_up(&self) -> bool {
        self.caught_up
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        if view.epoch <= self.view.epoch {
            return;
        }
        self.now = now;
        self.install_view(now, view, out);
    }

    fn on_lease(&mut self, now: Time, valid_until: Option<Time>, out: &mut Outbox<Message>) {
        self.lease = Some(valid_until);
        self.retry_parked_reads(now, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_word(chain: &mut Chain, offset: u64, word: u64) {
        let region = chain.member.as_mut().expect("a usable region").memory_mut();
        region.write(offset, &word.to_le_bytes()).expect("within the region");
    }

    /// Sweep seed 14580: a recovery redoing records 0 and 416 was cut short at the head after
    /// it had redone part of record 0, over a database that had executed record 416. The
    /// region's last executed record (416) no longer describes it: the next recovery must redo
    /// from 0, and the region is no consistent image to offer as a joiner.
    #[test]
    fn a_recovery_cut_short_is_redone_from_where_it_started() {
        let mut chain = Chain::new(ChainConfig::new(NodeId(0), NodeSet::single(NodeId(0))));
        assert_eq!(chain.offer(), Some(RegionSummary::EMPTY), "a fresh region is whole");
        write_word(&mut chain, REDO_FROM_OFFSET, REDOING);
        assert_eq!(chain.offer(), None, "a region whose redo was cut short is copied whole");
        write_word(&mut chain, HEAD_OFFSET, 512);
        write_word(&mut chain, LAST_EXECUTED_OFFSET, 416);
        assert_eq!(chain.last_executed(), 0, "the redo started at lsn 0");
        write_word(&mut chain, REDO_FROM_OFFSET, 0);
        assert_eq!(chain.last_executed(), 416, "a completed recovery clears the word");
    }

    /// A one-node chain (node 0), ticked until it coordinates.
    fn coordinating_single_node_chain() -> (Chain, Outbox<Message>) {
        let me = NodeId(0);
        let mut chain = Chain::new(ChainConfig::new(me, NodeSet::single(me)));
        let mut out = Outbox::default();
        chain.on_tick(Time::from_millis(1), &mut out);
        while !chain.is_coordinating() {
            let now = chain.now + Time::from_millis(1);
            chain.on_tick(now, &mut out);
        }
        (chain, out)
    }

    /// Sweep seed 13083: a head cut off in its old view kept coordinating and answered a CAS
    /// that wrote nothing from its stale region. It plans nothing without a lease.
    #[test]
    fn a_coordinator_without_a_lease_answers_no_cas_from_its_state() {
        let (mut chain, mut out) = coordinating_single_node_chain();
        let expired = chain.now;
        chain.on_lease(expired, Some(expired), &mut out);
        let cas = chorus_core::RmwOp::CompareAndSwap { expected: Some(Bytes::from_static(b"x")), new: None };
        let command = Command::Rmw { key: Bytes::from_static(b"k"), op: cas };
        let mut out = Outbox::default();
        chain.on_client(expired, ClientRequestId(7), command, &mut out);
        chain.on_tick(expired + Time::from_millis(1), &mut out);
        assert!(out.replies.is_empty(), "answered without a lease: {:?}", out.replies);
        let later = expired + Time::from_millis(2);
        chain.on_lease(later, Some(later + Time::from_millis(100)), &mut out);
        chain.on_tick(later, &mut out);
        assert_eq!(out.replies.len(), 1, "answered once the lease is back");
    }

    /// Issue 17 (docs/protocols/chain.md, "The read lock and the group write lock"): with the
    /// member beside the node (a group host, the XDP program), the node's reader can hold the
    /// lock word (a reader count) when the coordinator's write-lock gCAS arrives. The lock
    /// waits for the reader: the coordinator neither counts a lock failure nor goes broken,
    /// nothing of the batch is executed while the reader holds the word, and once it has left
    /// the write completes. (Before: `lock_failures` 1, `Phase::Broken` until the next view,
    /// and the batch's copies applied under the reader.)
    #[test]
    fn a_write_lock_waits_for_a_reader_instead_of_breaking_the_coordinator() {
        let me = NodeId(0);
        let mut chain = Chain::new(ChainConfig::new(me, NodeSet::single(me)));
        let mut out = Outbox::default();
        chain.on_tick(Time::from_millis(1), &mut out);
        while chain.coordinator_state() != Some("serving") {
            let now = chain.now + Time::from_millis(1);
            chain.on_tick(now, &mut out);
        }
        let layout = chain.config.layout;
        let word =
            |chain: &mut Chain| chain.member.as_mut().unwrap().memory_mut().load_u64(LOCK_OFFSET).unwrap();
        assert_eq!(word(&mut chain), 0, "recovered and unlocked");
        let key = Bytes::from_static(b"k");
        let value =
            |chain: &mut Chain| lookup(chain.member.as_mut().unwrap().memory_mut(), &layout, &key).unwrap();

        write_word(&mut chain, LOCK_OFFSET, 1); // a reader mid-lookup at this node
        let now = chain.now + Time::from_millis(1);
        let command = Command::Write { key: key.clone(), value: Some(Bytes::from_static(b"v")) };
        chain.on_client(now, ClientRequestId(1), command, &mut out);
        for tick in 1..=3 * chain.config.retransmit_timeout.as_millis() {
            chain.on_tick(now + Time::from_millis(tick), &mut out);
        }
        assert!(out.replies.is_empty(), "answered while the reader held the lock: {:?}", out.replies);
        assert_eq!(chain.stats.lock_failures, 0, "a reader is not a failed lock");
        assert_eq!(chain.coordinator_state(), Some("serving"), "the coordinator is not broken");
        assert_eq!(word(&mut chain), 1, "the reader's count is intact");
        assert_eq!(value(&mut chain), None, "nothing of the batch executed under the reader");

        write_word(&mut chain, LOCK_OFFSET, 0); // the reader leaves
        let later = chain.now + Time::from_millis(1);
        for tick in 0..=chain.config.retransmit_timeout.as_millis() {
            chain.on_tick(later + Time::from_millis(tick), &mut out);
        }
        assert_eq!(out.replies, vec![(ClientRequestId(1), Outcome::Written)]);
        assert_eq!(value(&mut chain), Some(Bytes::from_static(b"v")));
        assert_eq!(word(&mut chain), 0, "unlocked after the batch");
        assert_eq!((chain.stats.lock_failures, chain.coordinator_state()), (0, Some("serving")));
    }

    /// The recovery fence waits for a reader too: a node's reader inside its lookup when a
    /// recovery starts (members on hosts) keeps its count, and nothing is redone or fenced over
    /// it until it has left; then the recovery completes. (Before: the fence's gWRITE replaced
    /// the count with `RECOVERING` under the reader.)
    #[test]
    fn the_recovery_fence_waits_for_a_reader() {
        let (mut chain, mut out) = coordinating_single_node_chain();
        let mut now = chain.now;
        while chain.coordinator_state() != Some("serving") {
            now = now + Time::from_millis(1);
            chain.on_tick(now, &mut out);
        }
        let word =
            |chain: &mut Chain| chain.member.as_mut().unwrap().memory_mut().load_u64(LOCK_OFFSET).unwrap();
        write_word(&mut chain, LOCK_OFFSET, 1); // a reader mid-lookup at this node
        let view = chain.view();
        let next = View { epoch: Epoch(view.epoch.0 + 1), live: view.live };
        chain.on_view(now, next, &mut out);
        for _ in 0..3 * chain.config.retransmit_timeout.as_millis() {
            now = now + Time::from_millis(1);
            chain.on_tick(now, &mut out);
        }
        assert_eq!(chain.coordinator_state(), Some("recovering"), "recovered under the reader");
        assert_eq!(word(&mut chain), 1, "the reader's count is intact");
        write_word(&mut chain, LOCK_OFFSET, 0); // the reader leaves
        for _ in 0..=2 * chain.config.retransmit_timeout.as_millis() {
            now = now + Time::from_millis(1);
            chain.on_tick(now, &mut out);
        }
        assert_eq!(chain.coordinator_state(), Some("serving"));
        assert_eq!(word(&mut chain), 0, "unlocked after the recovery");
    }

    /// Sweep seed 38564: a restarted node was copied to and linked, then forwarded a GETSET;
    /// a copy of a `Joining` it had broadcast before the copy reached the coordinator late,
    /// which forgot the node's forward session, so the forward's next retransmission was
    /// taken again and the batch executed the GETSET twice (answered with its own value).
    #[test]
    fn a_late_joining_announcement_does_not_let_a_forward_in_twice() {
        let origin = NodeId(1);
        let (mut chain, mut out) = coordinating_single_node_chain();
        // Without a lease nothing is planned, so what was taken stays in the queue.
        let now = chain.now;
        chain.on_lease(now, Some(now), &mut out);
        let head = chain.config.incarnation;
        let swap = chorus_core::RmwOp::Swap(Some(Bytes::from_static(b"v")));
        let command = Command::Rmw { key: Bytes::from_static(b"k"), op: swap };
        chain.on_forward(now, origin, head, 0, 0, command.clone(), &mut out);
        chain.on_joining(now, origin, Some(RegionSummary::EMPTY), &mut out);
        chain.on_forward(now, origin, head, 0, 0, command, &mut out);
        let queued = chain.coordinator.as_ref().expect("coordinating").queue.len();
        assert_eq!(queued, 1, "the retransmitted forward was taken a second time");
    }
}
