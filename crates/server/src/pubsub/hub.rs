//! The node's Pub/Sub hub: who is subscribed to what, and each subscriber's mailbox.
//!
//! One lock guards the subscription tables; each mailbox has its own, taken by the hub to
//! queue a push and by the connection to take what is queued (always in that order: hub,
//! then mailbox). Messages are shared, not copied, between the mailboxes they go to.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::data::glob_match;
use chorus_core::NodeId;
use chorus_net::PubSubPort;
use tokio::sync::Notify;
use tracing::warn;

use super::wire::{self, Scope};

/// What a client subscribes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SUBSCRIBE: a channel by name.
    Channel = 0,
    /// PSUBSCRIBE: every channel matching a glob pattern.
    Pattern = 1,
    /// SSUBSCRIBE: a shard channel (SPUBLISH), by name.
    Shard = 2,
}

impl Kind {
    pub fn subscribe_word(self) -> &'static str {
        ["subscribe", "psubscribe", "ssubscribe"][self as usize]
    }

    pub fn unsubscribe_word(self) -> &'static str {
        ["unsubscribe", "punsubscribe", "sunsubscribe"][self as usize]
    }
}

/// One thing a subscriber's connection writes, in the order the hub queued them.
#[derive(Clone, Debug, PartialEq)]
pub enum Push {
    /// A (un)subscribe confirmation: the word, the channel or pattern (`None`: unsubscribing
    /// while subscribed to nothing), the client's count after it.
    Confirm {
        word: &'static str,
        name: Option<Bytes>,
        count: usize,
    },
    Message {
        channel: Bytes,
        message: Bytes,
    },
    PMessage {
        pattern: Bytes,
        channel: Bytes,
        message: Bytes,
    },
    SMessage {
        channel: Bytes,
        message: Bytes,
    },
}

impl Push {
    /// What the push counts for in the output buffer: about its encoded size.
    fn cost(&self) -> usize {
        const FRAMING: usize = 40;
        FRAMING
            + match self {
                Push::Confirm { name, .. } => name.as_ref().map_or(0, Bytes::len),
                Push::Message { channel, message } | Push::SMessage { channel, message } => {
                    channel.len() + message.len()
                }
                Push::PMessage { pattern, channel, message } => pattern.len() + channel.len() + message.len(),
            }
    }

    /// Redis 7's encoding: a push (`>`) in RESP3, an array in RESP2.
    pub fn encode(&self, resp: u8, out: &mut BytesMut) {
        let header = |out: &mut BytesMut, count: usize| {
            out.put_u8(if resp >= 3 { b'>' } else { b'*' });
            put_line(out, count);
        };
        match self {
            Push::Confirm { word, name, count } => {
                header(out, 3);
                put_bulk(out, word.as_bytes());
                match name {
                    Some(name) => put_bulk(out, name),
                    None if resp >= 3 => out.put_slice(b"_\r\n"),
                    None => out.put_slice(b"$-1\r\n"),
                }
                out.put_u8(b':');
                put_line(out, *count);
            }
            Push::Message { channel, message } => {
                header(out, 3);
                put_bulk(out, b"message");
                put_bulk(out, channel);
                put_bulk(out, message);
            }
            Push::PMessage { pattern, channel, message } => {
                header(out, 4);
                put_bulk(out, b"pmessage");
                put_bulk(out, pattern);
                put_bulk(out, channel);
                put_bulk(out, message);
            }
            Push::SMessage { channel, message } => {
                header(out, 3);
                put_bulk(out, b"smessage");
                put_bulk(out, channel);
                put_bulk(out, message);
            }
        }
    }
}

fn put_line(out: &mut BytesMut, number: usize) {
    out.put_slice(number.to_string().as_bytes());
    out.put_slice(b"\r\n");
}

fn put_bulk(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u8(b'$');
    put_line(out, bytes.len());
    out.put_slice(bytes);
    out.put_slice(b"\r\n");
}

/// Redis' `client-output-buffer-limit pubsub <hard> <soft> <soft seconds>` (default 32mb 8mb
/// 60): a subscriber whose unwritten output reaches `hard` bytes, or stays at `soft` or more
/// for longer than `soft seconds`, is disconnected. 0 turns a limit off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub hard_bytes: u64,
    pub soft_bytes: u64,
    pub soft_seconds: u64,
}

impl Limit {
    pub const REDIS_DEFAULT: Limit = Limit { hard_bytes: 32 << 20, soft_bytes: 8 << 20, soft_seconds: 60 };

    /// Why a buffer of `bytes` is over the limit, if it is; `over_soft_since` keeps when it
    /// first reached the soft limit (Redis' `obuf_soft_limit_reached_time`).
    fn exceeded(&self, bytes: u64, over_soft_since: &mut Option<Instant>, now: Instant) -> Option<String> {
        if self.hard_bytes > 0 && bytes >= self.hard_bytes {
            return Some(format!("{bytes} bytes unwritten, hard limit {}", self.hard_bytes));
        }
        if self.soft_bytes == 0 || bytes < self.soft_bytes {
            *over_soft_since = None;
            return None;
        }
        let since = *over_soft_since.get_or_insert(now);
        let over = now.duration_since(since);
        (over > Duration::from_secs(self.soft_seconds)).then(|| {
            format!(
                "{bytes} bytes unwritten, over the soft limit {} for {} s (limit {} s)",
                self.soft_bytes,
                over.as_secs(),
                self.soft_seconds
            )
        })
    }
}

/// The pubsub class's limit, changed by CONFIG SET while the node runs.
pub struct OutputLimits {
    hard_bytes: AtomicU64,
    soft_bytes: AtomicU64,
    soft_seconds: AtomicU64,
}

impl Default for OutputLimits {
    fn default() -> Self {
        let limit = Limit::REDIS_DEFAULT;
        OutputLimits {
            hard_bytes: AtomicU64::new(limit.hard_bytes),
            soft_bytes: AtomicU64::new(limit.soft_bytes),
            soft_seconds: AtomicU64::new(limit.soft_seconds),
        }
    }
}

impl OutputLimits {
    pub fn get(&self) -> Limit {
        Limit {
            hard_bytes: self.hard_bytes.load(Relaxed),
            soft_bytes: self.soft_bytes.load(Relaxed),
            soft_seconds: self.soft_seconds.load(Relaxed),
        }
    }

    pub fn set(&self, limit: Limit) {
        self.hard_bytes.store(limit.hard_bytes, Relaxed);
        self.soft_bytes.store(limit.soft_bytes, Relaxed);
        self.soft_seconds.store(limit.soft_seconds, Relaxed);
    }
}

/// One subscribed connection's queue of pushes. The hub fills it; the connection takes what
/// is queued, writes it, then releases the bytes it wrote: until then they count against
/// the output buffer limit, so a client that stops reading fills it.
pub struct Mailbox {
    pub client: u64,
    queue: Mutex<Queue>,
    wake: Notify,
    /// The connection's CLIENT KILL wake-up: over its limit, a client is closed the same way.
    kill: Arc<Notify>,
    /// Channels, patterns and shard channels the client is subscribed to (set under the hub's
    /// lock), for Redis' pubsub context and CLIENT LIST.
    counts: [AtomicUsize; 3],
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").field("client", &self.client).field("counts", &self.counts()).finish()
    }
}

#[derive(Default)]
struct Queue {
    pushes: VecDeque<Push>,
    /// Queued, plus taken by the connection and not yet written.
    bytes: u64,
    over_soft_since: Option<Instant>,
    /// Over the limit: the client is being closed and takes nothing more.
    closed: bool,
}

impl Mailbox {
    pub fn new(client: u64, kill: Arc<Notify>) -> Arc<Mailbox> {
        Arc::new(Mailbox {
            client,
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            kill,
            counts: Default::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// [channels, patterns, shard channels] the client is subscribed to.
    pub fn counts(&self) -> [usize; 3] {
        [0, 1, 2].map(|kind| self.counts[kind].load(Relaxed))
    }

    /// Subscribed to anything: in RESP2 only (un)subscribing, PING, QUIT and RESET are allowed.
    pub fn subscribed(&self) -> bool {
        self.counts().iter().any(|count| *count > 0)
    }

    /// Queue a message; `false` if that put the client over `limit` (it is then closed and
    /// its queue dropped) or it was closed already.
    fn deliver(&self, push: Push, limit: &Limit, now: Instant) -> bool {
        let mut queue = self.lock();
        if queue.closed {
            return false;
        }
        queue.bytes += push.cost() as u64;
        let bytes = queue.bytes;
        if let Some(why) = limit.exceeded(bytes, &mut queue.over_soft_since, now) {
            queue.closed = true;
            queue.pushes = VecDeque::new();
            drop(queue);
            warn!(
                client = self.client,
                "closing a Pub/Sub client over client-output-buffer-limit pubsub: {why}"
            );
            self.kill.notify_one();
            return false;
        }
        queue.pushes.push_back(push);
        drop(queue);
        self.wake.notify_one();
        true
    }

    /// Queue a confirmation: counted, never refused (it answers the client's own command).
    fn confirm(&self, push: Push) {
        let mut queue = self.lock();
        queue.bytes += push.cost() as u64;
        queue.pushes.push_back(push);
        drop(queue);
        self.wake.notify_one();
    }

    /// Encode everything queued for protocol `resp` into `out`; how many bytes it counts for
    /// (hand them to [`Mailbox::release`] once written).
    pub fn take(&self, resp: u8, out: &mut BytesMut) -> u64 {
        let mut queue = self.lock();
        let mut taken = 0;
        for push in queue.pushes.drain(..) {
            taken += push.cost() as u64;
            push.encode(resp, out);
        }
        taken
    }

    /// `bytes` taken earlier are written to the client.
    pub fn release(&self, bytes: u64) {
        let mut queue = self.lock();
        queue.bytes = queue.bytes.saturating_sub(bytes);
        if queue.bytes == 0 {
            queue.over_soft_since = None; // caught up
        }
    }

    /// Closed over its output buffer limit.
    pub fn closed(&self) -> bool {
        self.lock().closed
    }

    /// Wait until something may have been queued.
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    #[cfg(test)]
    fn queued(&self) -> Vec<Push> {
        self.lock().pushes.iter().cloned().collect()
    }
}

type Subscribers = BTreeMap<u64, Arc<Mailbox>>;

/// One client's subscriptions.
struct Client {
    mailbox: Arc<Mailbox>,
    names: [BTreeSet<Bytes>; 3],
}

impl Client {
    /// What a confirmation counts: channels and patterns together, shard channels apart
    /// (Redis 7).
    fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Channel | Kind::Pattern => self.names[0].len() + self.names[1].len(),
            Kind::Shard => self.names[2].len(),
        }
    }

    fn publish_counts(&self) {
        for (kind, names) in self.names.iter().enumerate() {
            self.mailbox.counts[kind].store(names.len(), Relaxed);
        }
    }
}

#[derive(Default)]
struct State {
    /// By kind: channel or pattern -> its subscribers.
    subscribers: [HashMap<Bytes, Subscribers>; 3],
    clients: HashMap<u64, Client>,
}

impl State {
    fn remove_client(&mut self, id: u64) {
        let Some(client) = self.clients.remove(&id) else { return };
        for (kind, names) in client.names.iter().enumerate() {
            for name in names {
                unlink(&mut self.subscribers[kind], name, id);
            }
        }
        client.names.iter().enumerate().for_each(|(kind, _)| client.mailbox.counts[kind].store(0, Relaxed));
    }
}

fn unlink(table: &mut HashMap<Bytes, Subscribers>, name: &Bytes, id: u64) {
    if let Some(subscribers) = table.get_mut(name) {
        subscribers.remove(&id);
        if subscribers.is_empty() {
            table.remove(name);
        }
    }
}

/// Counters for INFO.
#[derive(Default)]
pub struct HubStats {
    /// Subscribers closed over `client-output-buffer-limit pubsub`.
    pub disconnected_over_limit: AtomicU64,
    /// Frames from peers that did not decode (a bug or mixed versions; never expected).
    pub malformed: AtomicU64,
}

pub struct Hub {
    state: Mutex<State>,
    pub limits: Arc<OutputLimits>,
    /// This replica group's peer links.
    group: Arc<PubSubPort>,
    /// With shards: the metadata service's links, to every node of every group.
    cluster: Option<Arc<PubSubPort>>,
    pub stats: HubStats,
}

impl Hub {
    /// A hub whose ports go into the group's transport and, when `sharded`, the metadata
    /// service's ([`Hub::group_port`], [`Hub::cluster_port`]).
    pub fn new(sharded: bool) -> Arc<Hub> {
        Arc::new_cyclic(|hub: &Weak<Hub>| {
            let port = || {
                let hub = hub.clone();
                Arc::new(PubSubPort::new(move |from, payload| {
                    if let Some(hub) = hub.upgrade() {
                        hub.receive(from, payload);
                    }
                }))
            };
            Hub {
                state: Mutex::new(State::default()),
                limits: Arc::new(OutputLimits::default()),
                group: port(),
                cluster: sharded.then(port),
                stats: HubStats::default(),
            }
        })
    }

    pub fn group_port(&self) -> Arc<PubSubPort> {
        self.group.clone()
    }

    pub fn cluster_port(&self) -> Option<Arc<PubSubPort>> {
        self.cluster.clone()
    }

    /// Every port, for INFO's counters.
    pub fn ports(&self) -> impl Iterator<Item = &Arc<PubSubPort>> {
        std::iter::once(&self.group).chain(&self.cluster)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// PUBLISH (`Scope::Global`) or SPUBLISH (`Scope::Shard`) at this node: deliver to its
    /// subscribers, and send to the other nodes that have some (PUBLISH in a sharded
    /// cluster: every node of every group; otherwise the nodes of this group). Answers how
    /// many clients of **this node** received it, as PUBLISH does on a Redis Cluster node.
    pub fn publish(&self, scope: Scope, channel: &Bytes, message: &Bytes) -> Result<usize, String> {
        let port = match scope {
            Scope::Global => self.cluster.as_ref().unwrap_or(&self.group),
            Scope::Shard => &self.group,
        };
        let size = wire::encoded_len(channel, message);
        if let Some(max) = port.payload_bytes_max().filter(|max| size > *max) {
            return Err(format!("the message is {size} bytes; peer links carry at most {max}"));
        }
        let receivers = self.deliver(scope, channel, message, Instant::now());
        if port.peers() > 0 {
            port.broadcast(&wire::encode(scope, channel, message));
        }
        Ok(receivers)
    }

    /// A message another node published.
    fn receive(&self, from: NodeId, payload: Bytes) {
        match wire::decode(payload) {
            Ok(published) => {
                self.deliver(published.scope, &published.channel, &published.message, Instant::now());
            }
            Err(why) => {
                self.stats.malformed.fetch_add(1, Relaxed);
                warn!(peer = %from, "dropped a malformed Pub/Sub frame: {why}");
            }
        }
    }

    /// Queue the message for this node's subscribers; how many there were. Subscribers it
    /// puts over their output buffer limit are unsubscribed from everything and closed.
    fn deliver(&self, scope: Scope, channel: &Bytes, message: &Bytes, now: Instant) -> usize {
        let limit = self.limits.get();
        let mut state = self.lock();
        let mut receivers = 0;
        let mut over_limit = Vec::new();
        let mut send = |mailbox: &Arc<Mailbox>, push: Push| {
            receivers += 1;
            if !mailbox.deliver(push, &limit, now) {
                over_limit.push(mailbox.client);
            }
        };
        match scope {
            Scope::Global => {
                for mailbox in state.subscribers[Kind::Channel as usize]
                    .get(channel)
                    .into_iter()
                    .flat_map(|s| s.values())
                {
                    send(mailbox, Push::Message { channel: channel.clone(), message: message.clone() });
                }
                for (pattern, subscribers) in &state.subscribers[Kind::Pattern as usize] {
                    if !glob_match(pattern, channel) {
                        continue;
                    }
                    for mailbox in subscribers.values() {
                        let push = Push::PMessage {
                            pattern: pattern.clone(),
                            channel: channel.clone(),
                            message: message.clone(),
                        };
                        send(mailbox, push);
                    }
                }
            }
            Scope::Shard => {
                for mailbox in
                    state.subscribers[Kind::Shard as usize].get(channel).into_iter().flat_map(|s| s.values())
                {
                    send(mailbox, Push::SMessage { channel: channel.clone(), message: message.clone() });
                }
            }
        }
        for id in over_limit {
            if state.clients.contains_key(&id) {
                state.remove_client(id);
                self.stats.disconnected_over_limit.fetch_add(1, Relaxed);
            }
        }
        receivers
    }

    /// Subscribe the mailbox's client to `names`; one confirmation per name goes to the
    /// mailbox, in order with the messages around it.
    pub fn subscribe(&self, mailbox: &Arc<Mailbox>, kind: Kind, names: &[Bytes]) {
        if mailbox.closed() {
            return; // closed over its limit: its connection is ending
        }
        let mut state = self.lock();
        let state = &mut *state;
        let client = state
            .clients
            .entry(mailbox.client)
            .or_insert_with(|| Client { mailbox: mailbox.clone(), names: Default::default() });
        for name in names {
            if client.names[kind as usize].insert(name.clone()) {
                state.subscribers[kind as usize]
                    .entry(name.clone())
                    .or_default()
                    .insert(mailbox.client, mailbox.clone());
            }
            let count = client.count(kind);
            mailbox.confirm(Push::Confirm { word: kind.subscribe_word(), name: Some(name.clone()), count });
        }
        client.publish_counts();
    }

    /// Unsubscribe from `names`, or from every name of `kind` if none are given; one
    /// confirmation per name (one with no name if there was nothing to leave).
    pub fn unsubscribe(&self, mailbox: &Arc<Mailbox>, kind: Kind, names: &[Bytes]) {
        let mut state = self.lock();
        let state = &mut *state;
        let word = kind.unsubscribe_word();
        let Some(client) = state.clients.get_mut(&mailbox.client) else {
            if names.is_empty() {
                mailbox.confirm(Push::Confirm { word, name: None, count: 0 });
            }
            for name in names {
                mailbox.confirm(Push::Confirm { word, name: Some(name.clone()), count: 0 });
            }
            return;
        };
        let leaving: Vec<Bytes> = if names.is_empty() {
            client.names[kind as usize].iter().cloned().collect()
        } else {
            names.to_vec()
        };
        if leaving.is_empty() {
            mailbox.confirm(Push::Confirm { word, name: None, count: client.count(kind) });
        }
        for name in leaving {
            if client.names[kind as usize].remove(&name) {
                unlink(&mut state.subscribers[kind as usize], &name, mailbox.client);
            }
            mailbox.confirm(Push::Confirm { word, name: Some(name), count: client.count(kind) });
        }
        client.publish_counts();
        if client.names.iter().all(BTreeSet::is_empty) {
            state.clients.remove(&mailbox.client);
        }
    }

    /// Drop every subscription of `client`, without confirmations (RESET, a closed connection).
    pub fn forget(&self, client: u64) {
        self.lock().remove_client(client);
    }

    /// PUBSUB CHANNELS / SHARDCHANNELS: the channels of `kind` with subscribers here,
    /// matching `pattern` if given, sorted.
    pub fn channels(&self, kind: Kind, pattern: Option<&[u8]>) -> Vec<Bytes> {
        let state = self.lock();
        let mut names: Vec<Bytes> = state.subscribers[kind as usize]
            .keys()
            .filter(|name| pattern.is_none_or(|pattern| glob_match(pattern, name)))
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// PUBSUB NUMSUB / SHARDNUMSUB: subscribers here of each name.
    pub fn subscriber_counts(&self, kind: Kind, names: &[Bytes]) -> Vec<usize> {
        let state = self.lock();
        names.iter().map(|name| state.subscribers[kind as usize].get(name).map_or(0, BTreeMap::len)).collect()
    }

    /// How many distinct channels, patterns and shard channels have subscribers here (PUBSUB
    /// NUMPAT is the second; INFO shows all three).
    pub fn totals(&self) -> [usize; 3] {
        let state = self.lock();
        [0, 1, 2].map(|kind| state.subscribers[kind].len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    fn mailbox(hub: &Hub, client: u64) -> Arc<Mailbox> {
        let _ = hub;
        Mailbox::new(client, Arc::new(Notify::new()))
    }

    fn encoded(mailbox: &Mailbox, resp: u8) -> String {
        let mut out = BytesMut::new();
        let taken = mailbox.take(resp, &mut out);
        mailbox.release(taken);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn confirmations_and_messages_are_encoded_as_redis_7_does() {
        let hub = Hub::new(false);
        let a = mailbox(&hub, 1);
        hub.unsubscribe(&a, Kind::Channel, &[]);
        hub.subscribe(&a, Kind::Channel, &[b("ch1"), b("ch2")]);
        hub.subscribe(&a, Kind::Pattern, &[b("c*")]);
        hub.subscribe(&a, Kind::Shard, &[b("s1")]);
        assert_eq!(
            encoded(&a, 2),
            "*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n\
             *3\r\n$9\r\nsubscribe\r\n$3\r\nch1\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$3\r\nch2\r\n:2\r\n\
             *3\r\n$10\r\npsubscribe\r\n$2\r\nc*\r\n:3\r\n*3\r\n$10\r\nssubscribe\r\n$2\r\ns1\r\n:1\r\n"
        );
        assert_eq!(hub.publish(Scope::Global, &b("ch1"), &b("hello")), Ok(2));
        assert_eq!(
            encoded(&a, 2),
            "*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$5\r\nhello\r\n\
             *4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$3\r\nch1\r\n$5\r\nhello\r\n"
        );
        assert_eq!(hub.publish(Scope::Shard, &b("s1"), &b("x")), Ok(1));
        assert_eq!(encoded(&a, 3), ">3\r\n$8\r\nsmessage\r\n$2\r\ns1\r\n$1\r\nx\r\n");
        hub.unsubscribe(&a, Kind::Channel, &[b("ch1")]);
        hub.unsubscribe(&a, Kind::Channel, &[]);
        hub.unsubscribe(&a, Kind::Shard, &[]);
        hub.unsubscribe(&a, Kind::Shard, &[]);
        assert_eq!(
            encoded(&a, 3),
            ">3\r\n$11\r\nunsubscribe\r\n$3\r\nch1\r\n:2\r\n>3\r\n$11\r\nunsubscribe\r\n$3\r\nch2\r\n:1\r\n\
             >3\r\n$12\r\nsunsubscribe\r\n$2\r\ns1\r\n:0\r\n>3\r\n$12\r\nsunsubscribe\r\n_\r\n:0\r\n"
        );
        assert!(a.subscribed(), "still on the pattern");
        assert_eq!(a.counts(), [0, 1, 0]);
    }

    #[test]
    fn patterns_match_as_redis_globs_and_the_tables_forget_what_nobody_wants() {
        let hub = Hub::new(false);
        let (a, b_) = (mailbox(&hub, 1), mailbox(&hub, 2));
        hub.subscribe(&a, Kind::Pattern, &[b("news.[ab]*"), b("x?")]);
        hub.subscribe(&b_, Kind::Channel, &[b("news.art"), b("other")]);
        hub.subscribe(&b_, Kind::Pattern, &[b("x?")]);
        assert_eq!(hub.totals(), [2, 2, 0]);
        assert_eq!(hub.channels(Kind::Channel, None), [b("news.art"), b("other")]);
        assert_eq!(hub.channels(Kind::Channel, Some(b"n*")), [b("news.art")]);
        assert_eq!(hub.subscriber_counts(Kind::Channel, &[b("other"), b("nope")]), [1, 0]);
        assert_eq!(hub.publish(Scope::Global, &b("news.art"), &b("m")), Ok(2));
        assert_eq!(hub.publish(Scope::Global, &b("news.cat"), &b("m")), Ok(0));
        assert_eq!(hub.publish(Scope::Global, &b("xy"), &b("m")), Ok(2));
        assert_eq!(hub.publish(Scope::Global, &b("NEWS.art"), &b("m")), Ok(0), "case matters");
        hub.forget(2);
        assert_eq!(hub.totals(), [0, 2, 0]);
        assert!(!b_.subscribed());
        hub.unsubscribe(&a, Kind::Pattern, &[]);
        assert_eq!(hub.totals(), [0, 0, 0]);
        assert!(hub.lock().clients.is_empty());
    }

    #[test]
    fn a_subscriber_that_does_not_read_is_closed_at_the_hard_limit() {
        let hub = Hub::new(false);
        hub.limits.set(Limit { hard_bytes: 10_000, soft_bytes: 0, soft_seconds: 0 });
        let kill = Arc::new(Notify::new());
        let slow = Mailbox::new(1, kill.clone());
        let fast = mailbox(&hub, 2);
        hub.subscribe(&slow, Kind::Channel, &[b("c")]);
        hub.subscribe(&fast, Kind::Channel, &[b("c")]);
        let message = Bytes::from(vec![b'x'; 1000]);
        let mut published = 0;
        while hub.lock().clients.contains_key(&1) {
            assert_eq!(hub.publish(Scope::Global, &b("c"), &message), Ok(2));
            published += 1;
            let _ = encoded(&fast, 2); // the fast one keeps up
            assert!(published < 20, "never closed");
        }
        assert_eq!(published, 10, "about 10,000 bytes of 1,000-byte messages");
        assert!(slow.queued().is_empty(), "its queue is dropped");
        assert!(!slow.subscribed());
        assert_eq!(hub.stats.disconnected_over_limit.load(Relaxed), 1);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(kill.notified()); // its connection is woken to close
        assert_eq!(hub.publish(Scope::Global, &b("c"), &message), Ok(1));
        // A SUBSCRIBE it sent before it noticed does not bring it back.
        hub.subscribe(&slow, Kind::Channel, &[b("c")]);
        assert_eq!(hub.publish(Scope::Global, &b("c"), &message), Ok(1));
        assert_eq!(hub.stats.disconnected_over_limit.load(Relaxed), 1);
    }

    #[test]
    fn bytes_count_until_written_and_the_soft_limit_needs_its_seconds() {
        let limit = Limit { hard_bytes: 0, soft_bytes: 100, soft_seconds: 60 };
        let push = || Push::Message { channel: b("c"), message: Bytes::from(vec![0; 59]) };
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let mut out = BytesMut::new();

        let mailbox = Mailbox::new(1, Arc::new(Notify::new()));
        assert!(mailbox.deliver(push(), &limit, at(0)), "100 bytes: at the soft limit, its clock starts");
        let taken = mailbox.take(2, &mut out);
        assert_eq!(taken, 100);
        assert!(mailbox.deliver(push(), &limit, at(30)), "taken but not written: still counted");
        assert!(mailbox.deliver(push(), &limit, at(60)), "60 s is not over 60 s");
        assert!(!mailbox.deliver(push(), &limit, at(61)), "over the soft limit for more than 60 s");
        assert!(!mailbox.deliver(push(), &limit, at(61)), "closed");

        // A client that caught up starts the clock again.
        let fresh = Mailbox::new(2, Arc::new(Notify::new()));
        assert!(fresh.deliver(push(), &limit, at(0)));
        let taken = fresh.take(2, &mut out);
        fresh.release(taken);
        assert!(fresh.deliver(push(), &limit, at(100)));
        assert!(fresh.deliver(push(), &limit, at(160)));
        assert!(!fresh.deliver(push(), &limit, at(161)));
    }
}
