//! The reactor (issue 23): one thread per node that owns the event loop's core, the client
//! sockets and the peer links, as Redis' event loop does. One `epoll_wait` (through mio)
//! reports every ready socket; the thread reads each, parses, runs what arrived through the
//! core ([`EventLoop::submit_local`], [`EventLoop::on_messages`]), performs the turn's outbox
//! once (one batch frame per peer and lane, the same persistence ordering as the task-based
//! loop), and writes every reply, then every peer frame, of the pass before it sleeps again.
//! No task, channel, oneshot or waker stands between a socket and the core on this path.
//!
//! What stays on tokio (the node's runtime, another thread): accepting clients and handing
//! them over ([`ClientDoor`]), dialling, accepting and authenticating peer links
//! ([`chorus_net::start_handover`]) and redialling them, and every command the reactor does not
//! run in place. A connection is served here while it sends single-key commands (GET, SET,
//! INCR, ...; [`command::single_key_command`]) and a few trivial ones (PING, ECHO, SELECT 0,
//! CLIENT SETINFO, QUIT) as a RESP2 client outside MULTI (only clients that need no AUTH
//! come here: with a password set the listener starts them on a task); the first other
//! command (or a CLIENT PAUSE in force, or a typed value) hands the connection over to a
//! [`Connection`] task for the rest of its life, with its unparsed bytes, unwritten replies
//! and WAIT marks ([`Adopted`]); that command runs there first. So every command behaves as
//! before, and the hot path pays no hand-off.
//!
//! Used when the node has one event loop on the connections' thread (`worker_threads = 1`,
//! `event_loops = 1`, not raftlog shards), plain TCP peer links (no `tls_cluster`) and no
//! `[cluster]` slot map, no chain members on group hosts (`chain_hosts`); `reactor = false`
//! keeps the task-based loop (docs/architecture.md).

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_core::codec::WireMessage;
use chorus_core::{Command, NodeId};
use chorus_net::links::Links;
use chorus_net::{InboundLink, LinkSink, NetConfig, NetStats, OutboundLink};
use mio::{Events, Interest, Poll, Token, Waker};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::{debug, info, warn};

use crate::command::{self, ReplyShape, Request};
use crate::connection::{Addresses, Adopted, Connection, Shared};
use crate::engine::{
    Done, EngineRequest, EventLoop, LocalClient, NodeDisk, PeerSender, ServedReplica, WriteMarks,
};
use crate::listener::ClientSlot;
use crate::resp::{Parser, ProtocolError, Reply};

const WAKER: Token = Token(0);
/// Client tokens are `CLIENT_TOKEN_BASE + slot`; peer links' start at `LINK_TOKEN_BASE`.
const CLIENT_TOKEN_BASE: usize = 1;
const LINK_TOKEN_BASE: usize = 1 << 40;
/// Requests from connection tasks taken per pass (as the task-based loop's per-turn bound).
const REQUESTS_PER_PASS_MAX: usize = 512;
/// Read at most this much from one client per pass, so one pipeline cannot starve the rest.
const CLIENT_READ_BYTES_PER_PASS_MAX: usize = 256 * 1024;
/// Stop parsing a client's pipeline while this many reply bytes wait for it to read them.
const CLIENT_WRITE_BACKLOG_BYTES_MAX: usize = 1024 * 1024;
/// How often idle and incomplete-command timeouts are checked.
const HOUSEKEEPING: Duration = Duration::from_millis(100);

/// What tokio hands the reactor.
enum Handover {
    Client(ClientHandover),
    Outbound(OutboundLink),
    Inbound(InboundLink),
    /// CLIENT KILL of the connection with this id.
    Kill(u64),
}

struct ClientHandover {
    shared: Arc<Shared>,
    slot: ClientSlot,
    stream: std::net::TcpStream,
    addresses: Addresses,
}

/// The reactor's mailbox: handovers from tokio, and the waker that interrupts its poll.
struct Inbox {
    queue: Mutex<Vec<Handover>>,
    waker: Arc<Waker>,
    /// The reactor has stopped: handovers are refused (and so dropped).
    closed: AtomicBool,
}

impl Inbox {
    /// Queue `handover`; `Err` gives it back when the reactor is gone.
    fn push(&self, handover: Handover) -> Result<(), Handover> {
        {
            let mut queue = self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.closed.load(Relaxed) {
                return Err(handover);
            }
            queue.push(handover);
        }
        if let Err(error) = self.waker.wake() {
            warn!("cannot wake the reactor: {error}");
        }
        Ok(())
    }

    fn take(&self, into: &mut Vec<Handover>) {
        let mut queue = self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        into.append(&mut queue);
    }

    fn close(&self) -> Vec<Handover> {
        let mut queue = self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.closed.store(true, Relaxed);
        std::mem::take(&mut *queue)
    }
}

struct Sink(Arc<Inbox>);

impl LinkSink for Sink {
    fn outbound(&self, link: OutboundLink) {
        if let Err(Handover::Outbound(link)) = self.0.push(Handover::Outbound(link)) {
            let _ = link.closed.send(false);
        }
    }

    fn inbound(&self, link: InboundLink) {
        let _ = self.0.push(Handover::Inbound(link));
    }
}

/// How the client listener hands a connection to the reactor.
#[derive(Clone)]
pub struct ClientDoor {
    inbox: Arc<Inbox>,
}

impl ClientDoor {
    /// Hand `stream` over; `Err` gives it back if the reactor is gone (the node is stopping).
    pub fn enter(
        &self,
        shared: Arc<Shared>,
        slot: ClientSlot,
        stream: tokio::net::TcpStream,
        addresses: Addresses,
    ) -> io::Result<()> {
        let stream = stream.into_std()?;
        match self.inbox.push(Handover::Client(ClientHandover { shared, slot, stream, addresses })) {
            Ok(()) => Ok(()),
            Err(_) => Err(io::Error::new(io::ErrorKind::NotConnected, "the node is stopping")),
        }
    }
}

/// Whether a node with this configuration runs its event loop as a reactor.
pub fn applies(config: &crate::config::NodeConfig) -> bool {
    config.reactor
        && config.worker_threads == 1
        && config.event_loops == 1
        && !(config.protocol == crate::config::Protocol::Raftlog && config.raftlog.shards > 1)
        && !config.tls.as_ref().is_some_and(|tls| tls.cluster)
        && config.cluster.is_none()
        && std::env::var_os("CHORUS_REACTOR").is_none_or(|value| value != "off")
}

/// What the reactor runs.
pub(crate) struct Parts<R> {
    pub replica: R,
    pub disk: NodeDisk,
    pub requests: mpsc::Receiver<EngineRequest>,
    pub shutdown: watch::Receiver<bool>,
    pub request_deadline: Duration,
    pub net: NetConfig,
    /// Where the reactor publishes its waker for connection tasks' requests.
    pub wake: Arc<[crate::engine::WakeSlot]>,
    /// Completed when the loop has stopped (its last turn durable, its clients closed).
    pub stopped: oneshot::Sender<()>,
}

/// Start the peer links' dialers and acceptor on this runtime and the reactor on a thread of
/// its own; the door for clients and the links' counters.
pub(crate) async fn start<R>(parts: Parts<R>) -> anyhow::Result<(ClientDoor, Arc<NetStats>)>
where
    R: ServedReplica,
    R::Message: WireMessage + Send + 'static,
{
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let _ = parts.wake[0].set(waker.clone());
    let inbox = Arc::new(Inbox {
        queue: Mutex::new(Vec::new()),
        waker: waker.clone(),
        closed: AtomicBool::new(false),
    });
    let stats =
        chorus_net::start_handover::<R::Message>(parts.net.clone(), Arc::new(Sink(inbox.clone()))).await?;
    if let Some(port) = &parts.net.pubsub {
        // Published messages wait in the port until this loop's next turn moves them.
        let waker = waker.clone();
        port.attach_polled(
            stats.peers.len(),
            parts.net.frame_payload_bytes_max,
            parts.net.peer_queue_bytes_max as u64,
            move || {
                let _ = waker.wake();
            },
        );
    }
    let mut links = Links::new(&parts.net, stats.clone(), LINK_TOKEN_BASE);
    links.set_priority(R::is_priority);
    let sender = PeerSender::Links(links, poll.registry().try_clone()?);
    let mut state = EventLoop::new(parts.replica, parts.request_deadline, sender, parts.disk);
    let sync_waker = waker.clone();
    state.start_sync_thread(Box::new(move || {
        let _ = sync_waker.wake();
    }));
    let reactor = Reactor {
        poll,
        state,
        inbox: inbox.clone(),
        runtime: tokio::runtime::Handle::current(),
        requests: parts.requests,
        shutdown: parts.shutdown,
        clients: Vec::new(),
        free: Vec::new(),
        ready: Vec::new(),
        dirty: Vec::new(),
        read_more: Vec::new(),
        done: Vec::new(),
        batches: Vec::new(),
        handovers: Vec::new(),
        generations: Vec::new(),
        last_housekeeping: Instant::now(),
    };
    let stopped = parts.stopped;
    std::thread::Builder::new().name("chorus-reactor".into()).spawn(move || {
        // The core may start tasks of its own (a chain member's link to its group host).
        let _runtime = reactor.runtime.clone();
        let _entered = _runtime.enter();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reactor.run()));
        if run.is_err() {
            // Nothing else serves this node's clients or links: a live process that answers
            // nobody would only hide the failure from the membership service.
            tracing::error!("the reactor thread panicked; stopping this node");
            std::process::exit(1);
        }
        let _ = stopped.send(());
    })?;
    info!("event loop runs as a reactor: client sockets and peer links on its own thread");
    Ok((ClientDoor { inbox }, stats))
}

/// One client served in place.
struct Client {
    stream: mio::net::TcpStream,
    generation: u32,
    shared: Arc<Shared>,
    slot: Option<ClientSlot>,
    addresses: Addresses,
    id: u64,
    kill: Arc<Notify>,
    kill_watch: tokio::task::JoinHandle<()>,
    /// The command running or last run, by its index in the command table (CLIENT LIST).
    last_command: Arc<std::sync::atomic::AtomicUsize>,
    read: BytesMut,
    parser: Parser,
    write: BytesMut,
    in_flight: Option<InFlight>,
    marks: WriteMarks,
    last_read: Instant,
    incomplete_since: Option<Instant>,
    /// The peer closed its side: close once the command in flight is answered and written.
    eof: bool,
    /// Close once the write buffer is written (QUIT, a protocol error).
    closing: bool,
    /// The socket took less than offered: wait for a writable event.
    write_blocked: bool,
    /// Queued in `dirty`.
    is_dirty: bool,
}

/// The command a client waits for.
struct InFlight {
    shape: ReplyShape,
    args: Vec<Bytes>,
    name: &'static str,
    metric: usize,
    started: Instant,
}

struct Reactor<R: ServedReplica>
where
    R::Message: WireMessage + Send + 'static,
{
    poll: Poll,
    state: EventLoop<R>,
    inbox: Arc<Inbox>,
    runtime: tokio::runtime::Handle,
    requests: mpsc::Receiver<EngineRequest>,
    shutdown: watch::Receiver<bool>,
    clients: Vec<Option<Client>>,
    /// Free client slots, and each slot's next generation.
    free: Vec<usize>,
    /// Clients whose pipeline may advance (bytes read, an answer delivered).
    ready: Vec<usize>,
    /// Clients with replies to write.
    dirty: Vec<usize>,
    /// Clients whose read budget ran out with bytes left: read on next pass (their socket
    /// raises no new edge for them).
    read_more: Vec<usize>,
    done: Vec<(LocalClient, Done)>,
    batches: Vec<(NodeId, Vec<R::Message>)>,
    handovers: Vec<Handover>,
    /// Each client slot's last generation.
    generations: Vec<u32>,
    last_housekeeping: Instant,
}

impl<R: ServedReplica> Reactor<R>
where
    R::Message: WireMessage + Send + 'static,
{
    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut stopping = false;
        loop {
            let busy = self.links().has_unfinished_reads() || !self.read_more.is_empty();
            let timeout = if busy { Duration::ZERO } else { self.state.next_tick_in() };
            if let Err(error) = self.poll.poll(&mut events, Some(timeout)) {
                if error.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("the reactor's poll failed: {error}; stopping this node");
                    std::process::exit(1);
                }
            }
            for event in events.iter() {
                self.on_event(
                    event.token(),
                    event.is_readable() || event.is_read_closed(),
                    event.is_writable(),
                );
            }
            self.read_unfinished();
            self.deliver_batches();
            if !self.take_requests() {
                break; // every request sender is gone
            }
            if !stopping && self.shutdown_requested() {
                self.state.start_stopping();
                stopping = true;
            }
            self.state.take_synced();
            self.state.maybe_tick();
            self.settle();
            self.state.answer_overdue();
            self.state.answer_waiters();
            self.settle();
            // Replies before peer frames: the pass that completes a write also sends its VALs,
            // and the client's wake-up should not wait behind the followers' (each send to a
            // sleeping process runs its wake-up in the sender's context; docs/benchmarks.md,
            // "Session 18").
            self.write_clients();
            self.flush_links();
            if self.last_housekeeping.elapsed() >= HOUSEKEEPING {
                self.last_housekeeping = Instant::now();
                self.expire_clients();
            }
            if self.state.done_stopping() {
                break;
            }
            self.state.log_view_changes();
        }
        self.stop();
    }

    /// Write the pass's peer frames (and keepalives, Pub/Sub).
    fn flush_links(&mut self) {
        let registry = self.poll.registry();
        if let PeerSender::Links(links, _) = self.state.sender_mut() {
            links.on_timer(registry);
            links.send_pubsub();
            links.flush(registry);
        }
    }

    /// The node asked the loop to stop (or is gone).
    fn shutdown_requested(&mut self) -> bool {
        match self.shutdown.has_changed() {
            Ok(false) => false,
            Ok(true) => *self.shutdown.borrow_and_update(),
            Err(_) => true,
        }
    }

    fn links(&mut self) -> &mut Links<R::Message> {
        self.state.links().expect("the reactor's loop sends through its links")
    }

    /// The loop stops: the last answers written, every client closed, the dialers told.
    fn stop(mut self) {
        self.state.finish();
        self.settle_answers();
        self.write_clients();
        for slot in 0..self.clients.len() {
            if self.clients[slot].is_some() {
                self.close(slot);
            }
        }
        // Refused from now on; what was queued is dropped (clients close, dialers stop).
        for handover in self.inbox.close() {
            if let Handover::Outbound(link) = handover {
                let _ = link.closed.send(false);
            }
        }
        // Dropping the state drops the links: their dialers stop.
    }

    fn on_event(&mut self, token: Token, readable: bool, writable: bool) {
        if token == WAKER {
            self.take_handovers();
            return;
        }
        if token.0 >= LINK_TOKEN_BASE {
            let registry = self.poll.registry();
            let batches = &mut self.batches;
            if let PeerSender::Links(links, _) = self.state.sender_mut() {
                links.on_event(registry, token, readable, writable, &mut |from, messages| {
                    batches.push((from, messages))
                });
            }
            return;
        }
        let slot = token.0 - CLIENT_TOKEN_BASE;
        if writable {
            if let Some(client) = self.client_mut(slot) {
                client.write_blocked = false;
                if !client.write.is_empty() {
                    self.mark_dirty(slot);
                }
                self.ready.push(slot);
            }
        }
        if readable {
            self.read_client(slot);
        }
    }

    fn read_unfinished(&mut self) {
        let registry = self.poll.registry();
        let batches = &mut self.batches;
        if let PeerSender::Links(links, _) = self.state.sender_mut() {
            if links.has_unfinished_reads() {
                links.read_unfinished(registry, &mut |from, messages| batches.push((from, messages)));
            }
        }
        for slot in std::mem::take(&mut self.read_more) {
            self.read_client(slot);
        }
    }

    /// Peer messages read this pass, to the core in arrival order.
    fn deliver_batches(&mut self) {
        for (from, messages) in self.batches.drain(..) {
            self.state.on_messages(from, messages);
        }
    }

    /// Requests from connection tasks; `false` once every sender is gone.
    fn take_requests(&mut self) -> bool {
        for _ in 0..REQUESTS_PER_PASS_MAX {
            match self.requests.try_recv() {
                Ok(request) => self.state.on_request(request),
                Err(mpsc::error::TryRecvError::Empty) => return true,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
        true
    }

    fn take_handovers(&mut self) {
        let mut handovers = std::mem::take(&mut self.handovers);
        self.inbox.take(&mut handovers);
        for handover in handovers.drain(..) {
            match handover {
                Handover::Client(client) => self.add_client(client),
                Handover::Outbound(link) => {
                    let registry = self.poll.registry();
                    if let PeerSender::Links(links, _) = self.state.sender_mut() {
                        links.add_outbound(registry, link);
                    }
                }
                Handover::Inbound(link) => {
                    let registry = self.poll.registry();
                    let batches = &mut self.batches;
                    if let PeerSender::Links(links, _) = self.state.sender_mut() {
                        links.add_inbound(registry, link, &mut |from, messages| {
                            batches.push((from, messages))
                        });
                    }
                }
                Handover::Kill(id) => {
                    let slot =
                        self.clients.iter().position(|client| client.as_ref().is_some_and(|c| c.id == id));
                    if let Some(slot) = slot {
                        debug!(client = id, "killed by CLIENT KILL");
                        self.close(slot);
                    }
                }
            }
        }
        self.handovers = handovers;
    }

    // ------------------------------------------------------------------------------ clients

    fn client_mut(&mut self, slot: usize) -> Option<&mut Client> {
        self.clients.get_mut(slot).and_then(Option::as_mut)
    }

    fn add_client(&mut self, handover: ClientHandover) {
        let ClientHandover { shared, slot: client_slot, stream, addresses } = handover;
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.clients.push(None);
                self.clients.len() - 1
            }
        };
        if self.generations.len() <= slot {
            self.generations.resize(slot + 1, 0);
        }
        // A slot's generation outlives its clients, so a late answer finds no one.
        self.generations[slot] = self.generations[slot].wrapping_add(1);
        let generation = self.generations[slot];
        let mut stream = mio::net::TcpStream::from_std(stream);
        let token = Token(CLIENT_TOKEN_BASE + slot);
        if let Err(error) =
            self.poll.registry().register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
        {
            warn!("cannot watch a client connection: {error}");
            self.free.push(slot);
            return;
        }
        let id = shared.next_client_id.fetch_add(1, Relaxed) + 1;
        let kill = Arc::new(Notify::new());
        let last_command = crate::connection::register_client(&shared, id, &addresses, &kill);
        let kill_watch = self.runtime.spawn({
            let (kill, inbox) = (kill.clone(), self.inbox.clone());
            async move {
                kill.notified().await;
                let _ = inbox.push(Handover::Kill(id));
            }
        });
        self.clients[slot] = Some(Client {
            stream,
            generation,
            shared,
            slot: Some(client_slot),
            addresses,
            id,
            kill,
            kill_watch,
            last_command,
            read: BytesMut::with_capacity(16 * 1024),
            parser: Parser::default(),
            write: BytesMut::with_capacity(16 * 1024),
            in_flight: None,
            marks: WriteMarks::default(),
            last_read: Instant::now(),
            incomplete_since: None,
            eof: false,
            closing: false,
            write_blocked: false,
            is_dirty: false,
        });
        // Bytes that arrived before the registration raise no new edge: read now.
        self.read_client(slot);
    }

    fn read_client(&mut self, slot: usize) {
        let Some(client) = self.clients.get_mut(slot).and_then(Option::as_mut) else { return };
        let mut total = 0usize;
        let mut failed = false;
        loop {
            if total >= CLIENT_READ_BYTES_PER_PASS_MAX {
                self.read_more.push(slot);
                break;
            }
            if client.read.capacity() - client.read.len() < 4096 {
                client.read.reserve(16 * 1024);
            }
            let spare = client.read.capacity() - client.read.len();
            match read_into(&mut client.stream, &mut client.read) {
                Ok(0) => {
                    client.eof = true;
                    break;
                }
                Ok(n) => {
                    total += n;
                    if n < spare {
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    debug!(client = client.id, "connection ended: {error}");
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.close(slot);
            return;
        }
        if total > 0 {
            client.last_read = Instant::now();
            let limit = client.shared.live.query_buffer_bytes_max.load(Relaxed) as usize;
            let buffered = client.read.len();
            if buffered > limit {
                let error = ProtocolError(format!(
                    "the query buffer holds {buffered} bytes, over client-query-buffer-limit ({limit})"
                ));
                self.refuse(slot, error);
                return;
            }
        }
        self.ready.push(slot);
    }

    /// Answer `error` after the replies already due, then close.
    fn refuse(&mut self, slot: usize, error: ProtocolError) {
        let Some(client) = self.client_mut(slot) else { return };
        client.shared.metrics.protocol_errors.fetch_add(1, Relaxed);
        Reply::err(&error).encode(2, &mut client.write);
        client.closing = true;
        self.mark_dirty(slot);
    }

    fn mark_dirty(&mut self, slot: usize) {
        if let Some(client) = self.client_mut(slot) {
            if !client.is_dirty {
                client.is_dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    /// Run clients' pipelines and perform the core's outbox until nothing moves: answers
    /// delivered let pipelines go on, which may produce more work.
    fn settle(&mut self) {
        loop {
            while let Some(slot) = self.ready.pop() {
                self.advance(slot);
            }
            if self.state.perform_outbox_until_sync() {
                // The turn syncs: the answers that need not wait for it go to their clients
                // first, as its early peer frames went, so they do not wait behind the msync.
                self.settle_answers();
                self.write_clients();
                self.state.finish_turn();
            }
            self.settle_answers();
            if self.ready.is_empty() && !self.state.has_outbox() {
                return;
            }
        }
    }

    /// Deliver the core's answers to their clients.
    fn settle_answers(&mut self) {
        let mut done = std::mem::take(&mut self.done);
        self.state.take_local_done(&mut done);
        for (to, answer) in done.drain(..) {
            self.deliver(to, answer);
        }
        self.done = done;
    }

    fn deliver(&mut self, to: LocalClient, done: Done) {
        let slot = to.slot as usize;
        let Some(client) = self.client_mut(slot).filter(|client| client.generation == to.generation) else {
            return; // the client left; the command still took effect
        };
        let Some(in_flight) = client.in_flight.take() else { return };
        if let Some(mark) = done.mark {
            client.marks.record(mark);
        }
        if command::needs_typed(&done.outcome) {
            // A deadline, a list, a set...: the connection's typed path decides; it runs the
            // command again from its words (a read, or an update the core refused).
            self.hand_over(slot, Some(in_flight.args));
            return;
        }
        let reply = command::shape_reply(in_flight.shape, done.outcome);
        self.finish_command(
            slot,
            &in_flight.args,
            in_flight.name,
            in_flight.metric,
            in_flight.started,
            reply,
        );
        self.ready.push(slot);
    }

    /// Count a command, log it if slow, and queue its reply.
    fn finish_command(
        &mut self,
        slot: usize,
        args: &[Bytes],
        name: &'static str,
        metric: usize,
        started: Instant,
        reply: Reply,
    ) {
        let Some(client) = self.client_mut(slot) else { return };
        let shared = &client.shared;
        let duration_us = shared.metrics.record(metric, reply.is_error(), started);
        if crate::monitor::Monitor::is_slow(&shared.live, duration_us) {
            let ran = crate::monitor::Ran {
                name,
                args,
                duration_us,
                addr: client.addresses.peer.to_string(),
                client_name: None,
            };
            shared.monitor.observe(&shared.live, ran);
        }
        reply.encode(2, &mut client.write);
        self.mark_dirty(slot);
    }

    /// Run the client's pipeline while its commands can run in place and answer at once.
    fn advance(&mut self, slot: usize) {
        loop {
            let Some(client) = self.client_mut(slot) else { return };
            if client.in_flight.is_some() || client.closing {
                return;
            }
            if client.write.len() >= CLIENT_WRITE_BACKLOG_BYTES_MAX && client.write_blocked {
                return; // resumed when the socket takes the replies
            }
            let limits = client.shared.settings.limits;
            let args = match client.parser.parse(&mut client.read, &limits) {
                Ok(Some(args)) => args,
                Ok(None) => {
                    if client.eof {
                        // Whatever was answered is written first; a command cut short by
                        // the close is dropped, as Redis drops it.
                        client.closing = true;
                        self.mark_dirty(slot);
                    } else if client.parser.in_progress(&client.read) {
                        client.incomplete_since.get_or_insert_with(Instant::now);
                    }
                    return;
                }
                Err(error) => {
                    self.refuse(slot, error);
                    return;
                }
            };
            client.incomplete_since = None;
            if args.is_empty() {
                continue;
            }
            let started = Instant::now();
            let (name, parsed) = command::parse(&args);
            let metric = command::metric_index(name);
            client.last_command.store(metric, Relaxed);
            let request = match parsed {
                Ok(request) => request,
                Err(reply) => {
                    self.finish_command(slot, &args, name, metric, started, reply);
                    continue;
                }
            };
            let plan = match command::single_key_command(&request) {
                Some(Ok(plan)) => plan,
                Some(Err(reply)) => {
                    self.finish_command(slot, &args, name, metric, started, reply);
                    continue;
                }
                None => {
                    let reply = match request {
                        Request::Ping(None) => Reply::Status("PONG"),
                        Request::Ping(Some(message)) | Request::Echo(message) => Reply::Bulk(message),
                        Request::Select(0) | Request::ClientSetInfo => Reply::ok(),
                        Request::Quit => {
                            self.finish_command(slot, &args, name, metric, started, Reply::ok());
                            if let Some(client) = self.client_mut(slot) {
                                client.closing = true;
                            }
                            return;
                        }
                        _ => {
                            self.hand_over(slot, Some(args));
                            return;
                        }
                    };
                    self.finish_command(slot, &args, name, metric, started, reply);
                    continue;
                }
            };
            let shared = &client.shared;
            let paused = shared.pause.is_active();
            let max = shared.live.maxmemory_bytes.load(Relaxed);
            let over_maxmemory = max > 0
                && command::has_flag(name, "denyoom")
                && shared.metrics.used_memory.load(Relaxed) > max;
            if paused || over_maxmemory {
                self.hand_over(slot, Some(args));
                return;
            }
            let (command, shape) = plan;
            let to = LocalClient { slot: slot as u32, generation: client.generation };
            client.in_flight = Some(InFlight { shape, args, name, metric, started });
            self.submit(command, to);
        }
    }

    fn submit(&mut self, command: Command, to: LocalClient) {
        self.state.submit_local(command, to);
        // A read answered in the call goes back to its client in this same pass.
        self.settle_answers();
    }

    /// Write every client's replies, one `write` each.
    fn write_clients(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for slot in dirty.drain(..) {
            let Some(client) = self.client_mut(slot) else { continue };
            client.is_dirty = false;
            let mut failed = false;
            while !client.write.is_empty() && !client.write_blocked {
                match client.stream.write(&client.write) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => {
                        let _ = client.write.split_to(n);
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => client.write_blocked = true,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        debug!(client = client.id, "connection ended: {error}");
                        failed = true;
                        break;
                    }
                }
            }
            let finished = client.write.is_empty() && client.closing;
            if client.write.is_empty() && client.write.capacity() > 1024 * 1024 {
                client.write = BytesMut::with_capacity(16 * 1024);
            }
            if failed || finished {
                self.close(slot);
            }
        }
        self.dirty = dirty;
    }

    /// Close idle clients (`timeout`) and ones whose command did not arrive in full in time.
    fn expire_clients(&mut self) {
        let now = Instant::now();
        for slot in 0..self.clients.len() {
            let Some(client) = self.clients[slot].as_ref() else { continue };
            let clients = &client.shared.settings.clients;
            let idle_timeout_s = client.shared.live.idle_timeout_s.load(Relaxed);
            if idle_timeout_s > 0
                && client.in_flight.is_none()
                && now.duration_since(client.last_read) >= Duration::from_secs(idle_timeout_s)
            {
                self.close(slot);
                continue;
            }
            let timeout_ms = clients.incomplete_command_timeout_ms;
            let late = client.incomplete_since.is_some_and(|since| {
                timeout_ms > 0 && now.duration_since(since) >= Duration::from_millis(timeout_ms)
            });
            if late {
                let error =
                    ProtocolError(format!("a command was not received in full within {timeout_ms} ms"));
                self.refuse(slot, error);
            }
        }
    }

    fn remove(&mut self, slot: usize) -> Option<Client> {
        let mut client = self.clients.get_mut(slot)?.take()?;
        let _ = self.poll.registry().deregister(&mut client.stream);
        self.free.push(slot);
        Some(client)
    }

    fn close(&mut self, slot: usize) {
        let Some(client) = self.remove(slot) else { return };
        client.kill_watch.abort();
        client.shared.clients.deregister(client.id);
        // Dropping the client closes the socket and frees its slot in `connected_clients`.
    }

    /// Hand the client to a connection task for the rest of its life (module docs), `first`
    /// to run there before anything else.
    fn hand_over(&mut self, slot: usize, first: Option<Vec<Bytes>>) {
        let Some(mut client) = self.remove(slot) else { return };
        client.kill_watch.abort();
        let stream: std::net::TcpStream = client.stream.into();
        let shared = client.shared.clone();
        let adopted = Adopted {
            id: client.id,
            kill: client.kill.clone(),
            marks: std::mem::take(&mut client.marks),
            read: std::mem::take(&mut client.read),
            write: std::mem::take(&mut client.write),
            first,
            last_command: client.last_command.clone(),
        };
        let slot_guard = client.slot.take();
        self.runtime.spawn(async move {
            let _slot = slot_guard;
            match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => Connection::adopt(shared, stream, adopted).run().await,
                Err(error) => {
                    shared.clients.deregister(adopted.id);
                    debug!("cannot hand a client connection over: {error}");
                }
            }
        });
    }
}

/// Read into the spare capacity of `buf`.
fn read_into(stream: &mut mio::net::TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: `read` only writes into the slice, and only the bytes it reports are exposed.
    let slice = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), spare.len()) };
    let n = stream.read(slice)?;
    // SAFETY: the kernel initialised `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}
