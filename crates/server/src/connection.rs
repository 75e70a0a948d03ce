//! One client connection: read, parse as many commands as have arrived, execute them **in
//! order**, append each reply to the output buffer, and write once the pipeline is drained.
//!
//! Commands of one connection execute one after the other, as in Redis: the next command is
//! submitted only once the previous one completed. A pipelined batch still costs one read and
//! one write, and the event loop batches the commands of *all* connections per turn.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_core::{Command, Outcome};
use chorus_net::NetStats;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Notify};
use tracing::debug;

use crate::command::{self, error_reply, glob_match, ReplyMode, Request, COMMAND_TABLE};
use crate::config::ClientLimits;
use crate::engine::{Done, EngineHandle, WriteMarks};
use crate::memory;
use crate::metrics::Metrics;
use crate::resp::{Limits, Parser, ProtocolError, Reply};

mod multikey;
mod routing;
mod typed;

pub use multikey::COMMANDS as MULTIKEY_COMMANDS;

/// What every connection shares.
pub struct Shared {
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
    pub net: Arc<NetStats>,
    pub settings: Settings,
    pub next_client_id: AtomicU64,
    /// Every connected client, for CLIENT LIST and CLIENT KILL.
    pub clients: crate::clients::Registry,
    /// Turns true when the node stops: connections close once their command is answered.
    pub closing: watch::Receiver<bool>,
    /// SHUTDOWN asks the node to stop through this.
    pub shutdown: Arc<Notify>,
    /// The slot map when the node is one group of a sharded cluster (docs/resp.md, "Cluster").
    pub cluster: Option<crate::cluster::Cluster>,
    /// What CONFIG SET and ACL SETUSER change while the node runs (the password among them).
    pub live: crate::live::Live,
    /// SLOWLOG and LATENCY.
    pub monitor: crate::monitor::Monitor,
    /// CLIENT PAUSE.
    pub pause: crate::pause::Pause,
    /// Who is subscribed to what (crate::pubsub).
    pub pubsub: Arc<crate::pubsub::Hub>,
    /// Where plain clients go when the event loop is a reactor (crate::reactor); unset
    /// otherwise, and then every connection is a task.
    pub reactor: Arc<std::sync::OnceLock<crate::reactor::ClientDoor>>,
}

/// Node settings connections need (INFO, CONFIG GET, limits), fixed at start; the ones
/// CONFIG SET changes are read from [`Shared::live`] instead.
#[derive(Clone, Debug)]
pub struct Settings {
    pub node_id: u8,
    pub protocol: &'static str,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    /// What an authenticated client may send (before AUTH: [`Limits::UNAUTHENTICATED`]).
    pub limits: Limits,
    pub clients: ClientLimits,
}

/// Flush the output buffer once it holds this much, even mid-pipeline.
const WRITE_BUFFER_BYTES_FLUSH: usize = 64 * 1024;

/// One client connection over `S`: a TCP stream, or a TLS stream over one.
pub struct Connection<S> {
    shared: Arc<Shared>,
    stream: S,
    read: BytesMut,
    parser: Parser,
    write: BytesMut,
    /// RESP protocol version: 2 until HELLO 3.
    resp: u8,
    authenticated: bool,
    name: Option<Bytes>,
    id: u64,
    /// Commands queued since MULTI (docs/resp.md, "Transactions").
    multi: Option<Multi>,
    /// Keys WATCHed since the last EXEC/DISCARD/UNWATCH, with the value each held then.
    watched: Vec<(Bytes, Option<Bytes>)>,
    /// Where this connection's writes stand, for WAIT.
    marks: WriteMarks,
    /// When the first byte of the command being received arrived.
    incomplete_since: Option<Instant>,
    /// When bytes last arrived (Redis' `timeout` closes a connection idle for longer).
    last_read: Instant,
    /// Woken by another client's CLIENT KILL.
    kill: Arc<Notify>,
    /// CLIENT REPLY; `Skip` counts the replies still to drop.
    replies: (ReplyMode, u8),
    /// ASKING was the last command: the next one may run on a slot this group is importing.
    asking: bool,
    /// Subscriptions and the pushes waiting to be written (crate::pubsub).
    pubsub: crate::pubsub::Session,
    /// The command running or last run, by its index in the command table (CLIENT LIST).
    last_command: Arc<std::sync::atomic::AtomicUsize>,
    /// A command to run before reading ([`Adopted::first`]).
    first: Option<Vec<Bytes>>,
}

/// A connection the reactor served until a command it does not run in place (crate::reactor):
/// what it had, so the connection carries on here exactly where it stopped.
pub struct Adopted {
    /// Its id, already in the client registry with `kill`.
    pub id: u64,
    pub kill: Arc<Notify>,
    pub marks: WriteMarks,
    /// Bytes received and not yet parsed.
    pub read: BytesMut,
    /// Replies not yet written.
    pub write: BytesMut,
    /// The command to run first (parsed already), if any.
    pub first: Option<Vec<Bytes>>,
    /// Its CLIENT LIST `cmd`, registered with it.
    pub last_command: Arc<std::sync::atomic::AtomicUsize>,
}

/// The connection's two ends, for CLIENT LIST and CLIENT KILL.
#[derive(Clone, Copy, Debug)]
pub struct Addresses {
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

#[derive(Default)]
struct Multi {
    queued: Vec<(chorus_core::Command, command::ReplyShape)>,
    /// Each queued command's typed form (`None`: it has none), for a transaction on one key.
    typed: Vec<Option<Vec<Bytes>>>,
    /// A command was refused while queueing: EXEC discards the transaction (as Redis does).
    aborted: bool,
}

impl<S> Drop for Connection<S> {
    fn drop(&mut self) {
        self.shared.clients.deregister(self.id);
        self.pubsub.forget(&self.shared.pubsub);
    }
}

/// Why a connection stops waiting for input.
enum Expiry {
    /// Redis' `timeout`: closed without a word, as Redis does.
    Idle,
    /// A command started arriving and did not finish in time.
    Incomplete,
}

/// Enter a new client in the registry (CLIENT LIST, CLIENT KILL); its `cmd`, which the
/// connection updates as it runs commands.
pub(crate) fn register_client(
    shared: &Shared,
    id: u64,
    addresses: &Addresses,
    kill: &Arc<Notify>,
) -> Arc<std::sync::atomic::AtomicUsize> {
    let last_command = Arc::new(std::sync::atomic::AtomicUsize::new(command::COMMAND_TABLE.len()));
    shared.clients.register(crate::clients::ClientInfo {
        id,
        addr: addresses.peer,
        laddr: addresses.local,
        name: None,
        resp: 2,
        connected: Instant::now(),
        kill: kill.clone(),
        last_command: last_command.clone(),
        pubsub: None,
    });
    last_command
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Connection<S> {
    pub fn new(shared: Arc<Shared>, stream: S, addresses: Addresses) -> Connection<S> {
        let id = shared.next_client_id.fetch_add(1, Relaxed) + 1;
        let authenticated = shared.live.user().open();
        let kill = Arc::new(Notify::new());
        let last_command = register_client(&shared, id, &addresses, &kill);
        Connection {
            shared,
            stream,
            read: BytesMut::with_capacity(16 * 1024),
            parser: Parser::default(),
            write: BytesMut::with_capacity(16 * 1024),
            resp: 2,
            authenticated,
            name: None,
            id,
            multi: None,
            watched: Vec::new(),
            marks: WriteMarks::default(),
            incomplete_since: None,
            last_read: Instant::now(),
            kill,
            replies: (ReplyMode::On, 0),
            asking: false,
            pubsub: crate::pubsub::Session::default(),
            last_command,
            first: None,
        }
    }

    /// Carry on serving a connection the reactor handed over ([`Adopted`]). It is registered
    /// already; it is RESP2, authenticated, out of MULTI and replying, since the reactor hands
    /// over every connection that leaves that state.
    pub fn adopt(shared: Arc<Shared>, stream: S, adopted: Adopted) -> Connection<S> {
        Connection {
            shared,
            stream,
            read: adopted.read,
            parser: Parser::default(),
            write: adopted.write,
            resp: 2,
            authenticated: true,
            name: None,
            id: adopted.id,
            multi: None,
            watched: Vec::new(),
            marks: adopted.marks,
            incomplete_since: None,
            last_read: Instant::now(),
            kill: adopted.kill,
            replies: (ReplyMode::On, 0),
            first: adopted.first,
            asking: false,
            pubsub: crate::pubsub::Session::default(),
            last_command: adopted.last_command,
        }
    }

    /// Serve until the client leaves, sends QUIT, sends malformed RESP, breaks a limit, or
    /// the node stops.
    pub async fn run(mut self) {
        if let Err(error) = self.serve().await {
            debug!(client = self.id, "connection ended: {error}");
        }
    }

    async fn serve(&mut self) -> std::io::Result<()> {
        let mut closing = self.shared.closing.clone();
        // One wait for the node to stop, kept across requests: a new one per request would
        // register with the watch's waiter list (a lock) on every command.
        let closed = closing.changed();
        tokio::pin!(closed);
        let kill = self.kill.clone();
        let killed = kill.notified();
        tokio::pin!(killed);
        if let Some(args) = self.first.take() {
            let (reply, close) = self.execute(args).await;
            match reply {
                Some(reply) if self.replying() => reply.encode(self.resp, &mut self.write),
                _ => {}
            }
            if close {
                return self.flush().await;
            }
        }
        loop {
            let close = self.run_pipeline().await?;
            if close {
                return self.flush().await;
            }
            if self.pubsub.active() {
                // A subscriber that stops reading is closed at its output buffer limit, even
                // while a write to it is stuck.
                tokio::select! {
                    written = self.flush() => written?,
                    () = &mut killed => return Ok(()),
                }
            } else {
                self.flush().await?;
            }
            let expiry = self.expiry();
            tokio::select! {
                read = self.stream.read_buf(&mut self.read) => {
                    if read? == 0 {
                        return Ok(());
                    }
                    // Kept even while `timeout` is 0: CONFIG SET may turn it on, and must not
                    // then close a busy connection as idle.
                    self.last_read = Instant::now();
                    // Checked as soon as bytes arrive, before they are parsed (as Redis does).
                    let buffered = self.read.len();
                    let limit = self.shared.live.query_buffer_bytes_max.load(Relaxed) as usize;
                    if buffered > limit {
                        let error = ProtocolError(format!(
                            "the query buffer holds {buffered} bytes, over client-query-buffer-limit ({limit})"
                        ));
                        return self.refuse(error).await;
                    }
                }
                () = sleep_until(expiry.as_ref().map(|(at, _)| *at)) => {
                    let incomplete = matches!(expiry, Some((_, Expiry::Incomplete)));
                    if !incomplete {
                        return Ok(());
                    }
                    let timeout_ms = self.shared.settings.clients.incomplete_command_timeout_ms;
                    let error = ProtocolError(format!("a command was not received in full within {timeout_ms} ms"));
                    return self.refuse(error).await;
                }
                () = self.pubsub.woken() => self.pubsub.take(self.resp, &mut self.write),
                _ = &mut closed => return Ok(()),
                () = &mut killed => {
                    debug!(client = self.id, "killed by CLIENT KILL");
                    return Ok(());
                }
            }
        }
    }

    /// Execute every complete command received, in order; `true` when the connection must
    /// close (QUIT, SHUTDOWN, malformed input) after what was written goes out.
    async fn run_pipeline(&mut self) -> std::io::Result<bool> {
        loop {
            let limits =
                if self.authenticated { self.shared.settings.limits } else { Limits::UNAUTHENTICATED };
            match self.parser.parse(&mut self.read, &limits) {
                Ok(Some(args)) => {
                    self.incomplete_since = None;
                    if args.is_empty() {
                        continue;
                    }
                    let (reply, close) = self.execute(args).await;
                    // Pushes queued while it ran go first, as Redis writes them then.
                    self.pubsub.take(self.resp, &mut self.write);
                    match reply {
                        Some(reply) if self.replying() => reply.encode(self.resp, &mut self.write),
                        _ => {}
                    }
                    if close {
                        return Ok(true);
                    }
                    if self.write.len() >= WRITE_BUFFER_BYTES_FLUSH {
                        self.flush().await?;
                    }
                }
                Ok(None) => {
                    if self.parser.in_progress(&self.read) {
                        self.incomplete_since.get_or_insert_with(Instant::now);
                    }
                    return Ok(false);
                }
                Err(error) => {
                    self.refuse_later(error);
                    return Ok(true);
                }
            }
        }
    }

    /// Whether the reply to the command just run is sent (CLIENT REPLY OFF/SKIP drop it).
    fn replying(&mut self) -> bool {
        match &mut self.replies {
            (ReplyMode::On, _) => true,
            (ReplyMode::Off, _) => false,
            (ReplyMode::Skip, left) => {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.replies = (ReplyMode::On, 0);
                }
                false
            }
        }
    }

    /// When this connection stops waiting for input, and why.
    fn expiry(&self) -> Option<(Instant, Expiry)> {
        let clients = &self.shared.settings.clients;
        let idle_timeout_s = self.shared.live.idle_timeout_s.load(Relaxed);
        let idle = (idle_timeout_s > 0)
            .then(|| (self.last_read + Duration::from_secs(idle_timeout_s), Expiry::Idle));
        let incomplete =
            self.incomplete_since.filter(|_| clients.incomplete_command_timeout_ms > 0).map(|since| {
                (since + Duration::from_millis(clients.incomplete_command_timeout_ms), Expiry::Incomplete)
            });
        match (idle, incomplete) {
            (Some(idle), Some(incomplete)) => Some(if idle.0 <= incomplete.0 { idle } else { incomplete }),
            (idle, incomplete) => idle.or(incomplete),
        }
    }

    /// Say why the input is refused after the replies already due; the connection closes.
    fn refuse_later(&mut self, error: ProtocolError) {
        self.shared.metrics.protocol_errors.fetch_add(1, Relaxed);
        Reply::err(&error).encode(self.resp, &mut self.write);
    }

    async fn refuse(&mut self, error: ProtocolError) -> std::io::Result<()> {
        self.refuse_later(error);
        self.flush().await
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.write.is_empty() {
            self.stream.write_all(&self.write).await?;
            // A TLS stream may hold the last record until flushed; TCP's flush is a no-op.
            self.stream.flush().await?;
            self.write.clear();
            self.pubsub.written();
        }
        Ok(())
    }

    /// Execute one command: the reply (none for SHUTDOWN, which answers by closing, as in
    /// Redis) and whether the connection closes after it.
    async fn execute(&mut self, args: Vec<Bytes>) -> (Option<Reply>, bool) {
        let started = Instant::now();
        let (name, parsed) = command::parse(&args);
        let index = command::metric_index(name);
        self.last_command.store(index, Relaxed);
        // The one place keys are routed by slot: before a command is queued (MULTI) or run.
        let admitted = match &parsed {
            Ok(_) if self.authenticated => self.admit(&args),
            _ => routing::Admit::Run(None),
        };
        let (_gate, redirect) = match admitted {
            routing::Admit::Run(gate) => (gate, None),
            routing::Admit::Refuse(reply) => (None, Some(reply)),
            routing::Admit::CheckPresence { slot, ask } => {
                (None, Some(self.presence(&args, slot, ask).await))
            }
        };
        if let Some(reply) = redirect {
            // As Redis: a redirected command inside MULTI makes EXEC fail.
            if let Some(multi) = &mut self.multi {
                multi.aborted = true;
            }
            self.shared.metrics.record(index, true, started);
            return (Some(reply), false);
        }
        let mut close = false;
        let reply = match parsed {
            Err(reply) => {
                if let Some(multi) = &mut self.multi {
                    multi.aborted = true;
                }
                reply
            }
            Ok(request) if !self.authenticated && !request.allowed_unauthenticated() => {
                Reply::error("NOAUTH Authentication required.")
            }
            Ok(_) if self.pubsub.intercepts(name, self.resp) => {
                crate::pubsub::Session::in_context(name, &args)
            }
            Ok(Request::ClientReply(mode)) => {
                // This command's own reply is dropped too, except ON's (as Redis).
                self.replies = (mode, if mode == ReplyMode::Skip { 2 } else { 0 });
                Reply::ok()
            }
            Ok(Request::Quit) => {
                close = true;
                Reply::ok()
            }
            Ok(Request::Shutdown) if self.multi.is_none() => {
                tracing::info!(client = self.id, "SHUTDOWN requested by a client");
                self.shared.shutdown.notify_one();
                self.shared.metrics.record(index, false, started);
                return (None, true);
            }
            Ok(_) if self.over_maxmemory(name) => {
                if let Some(multi) = &mut self.multi {
                    multi.aborted = true;
                }
                command::out_of_memory()
            }
            Ok(Request::Reset) => self.reset(),
            Ok(request) if self.multi.is_some() => self.in_multi(request).await,
            Ok(request) => {
                self.shared.pause.hold(name).await;
                self.run_outside_multi(request).await
            }
        };
        let duration_us = self.shared.metrics.record(index, reply.is_error(), started);
        if crate::monitor::Monitor::is_slow(&self.shared.live, duration_us) {
            self.log_slow(name, &args, duration_us);
        }
        (Some(reply), close)
    }

    fn log_slow(&self, name: &str, args: &[Bytes], duration_us: u64) {
        let me = self.shared.clients.get(self.id);
        let ran = crate::monitor::Ran {
            name,
            args,
            duration_us,
            addr: me.map(|me| me.addr.to_string()).unwrap_or_default(),
            client_name: self.name.clone(),
        };
        self.shared.monitor.observe(&self.shared.live, ran);
    }

    /// A command outside MULTI, once no CLIENT PAUSE holds it.
    async fn run_outside_multi(&mut self, request: Request) -> Reply {
        match request {
            Request::Multi => self.multi_start(),
            Request::Exec => Reply::err("EXEC without MULTI"),
            Request::Discard => Reply::err("DISCARD without MULTI"),
            Request::Watch(keys) => self.watch(keys).await,
            Request::Unwatch => {
                self.watched.clear();
                Reply::ok()
            }
            request => self.run_request(request).await,
        }
    }

    /// Redis' `maxmemory` with `noeviction`: commands that may grow the data set are refused
    /// while the allocator holds more than the limit (sampled every 100 ms).
    fn over_maxmemory(&self, name: &str) -> bool {
        let max = self.shared.live.maxmemory_bytes.load(Relaxed);
        max > 0 && command::has_flag(name, "denyoom") && self.shared.metrics.used_memory.load(Relaxed) > max
    }

    // ------------------------------------------------------------ engine, with WAIT marks

    fn note(&mut self, done: Done) -> Outcome {
        if let Some(mark) = done.mark {
            self.marks.record(mark);
        }
        done.outcome
    }

    async fn run_one(&mut self, command: Command) -> Outcome {
        let done = self.shared.engine.execute(command).await;
        self.note(done)
    }

    async fn run_all(&mut self, commands: Vec<Command>) -> Vec<Outcome> {
        let done = self.shared.engine.execute_all(commands).await;
        done.into_iter().map(|done| self.note(done)).collect()
    }

    async fn run_request(&mut self, request: Request) -> Reply {
        if let Some(plan) = command::single_key_command(&request) {
            return match plan {
                Ok((command, shape)) => {
                    let outcome = self.run_one(command).await;
                    // A deadline, a list, a set...: the typed path decides (connection/typed.rs).
                    // Checked first: the typed form copies the command's words, and nearly
                    // every outcome does not need it.
                    match command::needs_typed(&outcome).then(|| command::as_typed(&request)).flatten() {
                        Some(args) => self.run_data(args).await,
                        None => command::shape_reply(shape, outcome),
                    }
                }
                Err(reply) => reply,
            };
        }
        match request {
            Request::Session { .. } if self.shared.settings.protocol != "raftlog" => Reply::err(format!(
                "at-most-once sessions need protocol raftlog; this node runs {}",
                self.shared.settings.protocol
            )),
            Request::Session { client, seq, request } => match command::single_key_command(&request) {
                Some(Ok((command, shape))) => {
                    let done = self.shared.engine.execute_in_session(client, seq, command).await;
                    command::shape_reply(shape, self.note(done))
                }
                Some(Err(reply)) => reply,
                None => unreachable!("parse_session admits single-key commands only"),
            },
            Request::Ping(None) => Reply::Status("PONG"),
            Request::Ping(Some(message)) | Request::Echo(message) => Reply::Bulk(message),
            Request::Hello { protover, auth, setname } => self.hello(protover, auth, setname),
            Request::Auth { user, password } => self.auth(user.as_deref(), &password),
            Request::Select(0) => Reply::ok(),
            Request::Select(_) => Reply::err("DB index is out of range"),
            Request::Del(keys) => self.del(keys).await,
            Request::Exists(keys) => self.exists(keys).await,
            Request::MGet(keys) => self.mget(keys).await,
            Request::MSet(pairs) => {
                for (_, value) in &pairs {
                    if let Err(reply) = command::check_string_value(value) {
                        return reply;
                    }
                }
                let writes = pairs
                    .into_iter()
                    .map(|(key, value)| Command::Write { key, value: Some(value) })
                    .collect();
                first_error_or(self.run_all(writes).await, Reply::ok())
            }
            Request::HSet { .. } | Request::HDel { .. } => self.update_hash(request).await,
            Request::Data(args) => self.run_data(args).await,
            Request::Admin(args) => self.admin(args).await,
            Request::Persistence(args) => crate::persistence::command(self.engine(), &args).await,
            Request::Keyspace(args) => self.keyspace(args).await,
            Request::Cluster(args) => self.cluster(args).await,
            Request::PubSub(args) => self.pubsub_command(&args),
            Request::DbSize => match self.engine().status().await {
                Some(status) => Reply::Integer(status.keys as i64),
                None => error_reply(&crate::engine::SHUTTING_DOWN),
            },
            Request::FlushAll => {
                let keys = self.engine().keys().await;
                let deletes = keys.into_iter().map(|key| Command::Write { key, value: None }).collect();
                first_error_or(self.run_all(deletes).await, Reply::ok())
            }
            Request::Info(sections) => self.info(&sections).await,
            Request::ConfigGet(patterns) => self.config_get(&patterns),
            Request::CommandCount => Reply::Integer(COMMAND_TABLE.len() as i64),
            Request::CommandList => Reply::Array(COMMAND_TABLE.iter().map(command_info).collect()),
            Request::CommandInfo(names) => Reply::Array(
                names
                    .iter()
                    .map(|name| {
                        let lower = name.to_ascii_lowercase();
                        COMMAND_TABLE
                            .iter()
                            .find(|spec| spec.name.as_bytes() == lower.as_slice())
                            .map_or(Reply::NullArray, command_info)
                    })
                    .collect(),
            ),
            Request::CommandDocs => Reply::Map(Vec::new()),
            Request::ClientSetName(name) => {
                if name.iter().any(|byte| *byte <= b' ' || *byte > b'~') {
                    return Reply::err("Client names cannot contain spaces, newlines or special characters.");
                }
                self.set_name((!name.is_empty()).then_some(name));
                Reply::ok()
            }
            Request::ClientGetName => Reply::optional(self.name.clone()),
            Request::ClientSetInfo => Reply::ok(),
            Request::ClientId => Reply::Integer(self.id as i64),
            Request::Wait { replicas, timeout_ms } => {
                // Every earlier command of this connection has completed: its writes are
                // marked, and the core knows which replicas hold them (docs/resp.md, WAIT).
                let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
                match self.shared.engine.wait_for(self.marks.clone(), replicas, deadline).await {
                    Some(count) => Reply::Integer(count as i64),
                    None => error_reply(&crate::engine::SHUTTING_DOWN),
                }
            }
            Request::WaitAof { local, replicas, timeout_ms } => {
                self.wait_aof(local, replicas, timeout_ms).await
            }
            Request::Quit => Reply::ok(),
            other => Reply::err(format!("internal error: unhandled request {other:?}")),
        }
    }

    /// WAITAOF (Redis 7.2): `[1 if this node's disk holds the connection's writes, how many
    /// other replicas' disks do]`. The local file is synced now; a replica counts when it
    /// holds the writes (as for WAIT) and holding means on disk (docs/resp.md, WAITAOF).
    async fn wait_aof(&mut self, local: bool, replicas: usize, timeout_ms: u64) -> Reply {
        let Some(durability) = self.shared.engine.sync_aof().await else {
            return error_reply(&crate::engine::SHUTTING_DOWN);
        };
        if local && !durability.local {
            return Reply::err("WAITAOF cannot be used when numlocal is set but appendonly is disabled.");
        }
        let on_disk = if durability.replicas {
            let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
            match self.shared.engine.wait_for(self.marks.clone(), replicas, deadline).await {
                Some(count) => count,
                None => return error_reply(&crate::engine::SHUTTING_DOWN),
            }
        } else {
            0 // no replica is known to sync before it acknowledges
        };
        Reply::Array(vec![Reply::Integer(durability.local as i64), Reply::Integer(on_disk as i64)])
    }

    fn multi_start(&mut self) -> Reply {
        self.multi = Some(Multi::default());
        Reply::ok()
    }

    /// WATCH: remember what each key holds now (one linearizable read each); EXEC runs only
    /// if they still hold it.
    async fn watch(&mut self, keys: Vec<Bytes>) -> Reply {
        let outcomes = self.run_all(reads(&keys)).await;
        for (key, outcome) in keys.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Value(value) => self.watched.push((key, value)),
                Outcome::Error(error) => return error_reply(&error),
                other => return unexpected(other),
            }
        }
        Reply::ok()
    }

    /// EXEC: a transaction on one key is one RMW on every protocol (`data::Batch`, with the
    /// WATCH guard if its key was watched); one over several keys runs as raftlog's
    /// multi-key transaction, and is refused elsewhere (docs/resp.md, "Transactions").
    async fn exec(&mut self, multi: Multi, watched: Vec<(Bytes, Option<Bytes>)>) -> Reply {
        let mut keys: Vec<&Bytes> = multi.queued.iter().map(|(command, _)| command.key()).collect();
        keys.extend(watched.iter().map(|(key, _)| key));
        keys.sort();
        keys.dedup();
        let _gates = match self.enter_slots(&keys) {
            Ok(gates) => gates,
            Err(reply) => return reply,
        };
        if multi.queued.is_empty() {
            return self.exec_nothing(&watched).await;
        }
        let typed: Option<Vec<Vec<Bytes>>> = multi.typed.iter().cloned().collect();
        match (keys.as_slice(), typed) {
            ([key], Some(commands)) => {
                let guard = watched.first().map(|(_, value)| value.clone());
                let batch = chorus_core::data::Batch { key: (*key).clone(), guard, commands };
                self.run_data(batch.args()).await
            }
            ([_], None) => Reply::err(format!(
                "CAS cannot be part of a transaction on protocol {}; use WATCH and SET",
                self.shared.settings.protocol
            )),
            _ if !watched.is_empty() => Reply::err(
                "WATCH works with a transaction on the watched key alone (one key); a multi-key transaction cannot be watched",
            ),
            _ if self.shared.settings.protocol != "raftlog" => Reply::err(format!(
                "a MULTI/EXEC over several keys is only atomic with protocol raftlog; this node runs {} (a transaction on one key works on every protocol)",
                self.shared.settings.protocol
            )),
            _ => {
                let (commands, shapes): (Vec<_>, Vec<_>) = multi.queued.into_iter().unzip();
                let done = self.shared.engine.execute_transaction(commands).await;
                Reply::Array(
                    shapes
                        .into_iter()
                        .zip(done)
                        .map(|(shape, done)| command::shape_reply(shape, self.note(done)))
                        .collect(),
                )
            }
        }
    }

    /// An empty EXEC: an empty array, or nil if a watched key changed.
    async fn exec_nothing(&mut self, watched: &[(Bytes, Option<Bytes>)]) -> Reply {
        let keys: Vec<Bytes> = watched.iter().map(|(key, _)| key.clone()).collect();
        let now = self.run_all(reads(&keys)).await;
        let unchanged = watched
            .iter()
            .zip(now)
            .all(|((_, then), now)| matches!(now, Outcome::Value(now) if now == *then));
        if unchanged {
            Reply::Array(Vec::new())
        } else {
            Reply::NullArray
        }
    }

    /// Between MULTI and EXEC: queue single-key commands, run EXEC or DISCARD.
    async fn in_multi(&mut self, request: Request) -> Reply {
        let bytes_max = self.bytes_max();
        let multi = self.multi.as_mut().expect("in MULTI");
        match request {
            Request::Multi => Reply::err("MULTI calls can not be nested"),
            Request::Watch(_) => Reply::err("WATCH inside MULTI is not allowed"),
            Request::Unwatch => Reply::Status("QUEUED"),
            Request::Discard => {
                self.multi = None;
                self.watched.clear();
                Reply::ok()
            }
            Request::Exec => {
                let multi = self.multi.take().expect("in MULTI");
                let watched = std::mem::take(&mut self.watched);
                if multi.aborted {
                    return Reply::error("EXECABORT Transaction discarded because of previous errors.");
                }
                self.exec(multi, watched).await
            }
            request => match command::queued_command(&request, command::wall_clock_ms(), bytes_max) {
                Some(Ok(plan)) => {
                    multi.queued.push(plan);
                    multi.typed.push(command::as_typed(&request));
                    Reply::Status("QUEUED")
                }
                Some(Err(reply)) => {
                    multi.aborted = true;
                    reply
                }
                None => {
                    multi.aborted = true;
                    Reply::err(
                        "only single-key commands (GET, SET, INCR, CAS, HSET, LPUSH, SADD, ZADD, EXPIRE, ...) can be queued in a transaction",
                    )
                }
            },
        }
    }

    fn pubsub_command(&mut self, args: &[Bytes]) -> Reply {
        let reply = self.pubsub.command(&self.shared.pubsub, self.id, &self.kill, args);
        if let Some(mailbox) = self.pubsub.mailbox().filter(|_| reply == Reply::Pushed) {
            let mailbox = mailbox.clone();
            self.shared.clients.update(self.id, |info| info.pubsub = Some(mailbox));
        }
        reply
    }

    fn reset(&mut self) -> Reply {
        self.pubsub.forget(&self.shared.pubsub);
        self.multi = None;
        self.watched.clear();
        self.resp = 2;
        self.shared.clients.update(self.id, |info| info.resp = 2);
        self.set_name(None);
        self.authenticated = self.shared.live.user().open();
        Reply::Status("RESET")
    }

    fn set_name(&mut self, name: Option<Bytes>) {
        self.shared.clients.update(self.id, |info| info.name = name.clone());
        self.name = name;
    }

    fn engine(&self) -> &EngineHandle {
        &self.shared.engine
    }

    fn hello(&mut self, protover: Option<u8>, auth: Option<(Bytes, Bytes)>, setname: Option<Bytes>) -> Reply {
        if let Some((user, password)) = auth {
            let reply = self.auth(Some(&user), &password);
            if reply.is_error() {
                return reply;
            }
        }
        if !self.authenticated {
            return Reply::error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
        }
        if let Some(name) = setname {
            self.set_name(Some(name));
        }
        if let Some(version) = protover {
            self.resp = version;
            self.shared.clients.update(self.id, |info| info.resp = version);
        }
        let text = |s: &str| Reply::text(s);
        Reply::Map(vec![
            (text("server"), text("chorus")),
            (text("version"), text(crate::REDIS_COMPATIBLE_VERSION)),
            (text("proto"), Reply::Integer(self.resp as i64)),
            (text("id"), Reply::Integer(self.id as i64)),
            (text("mode"), text("standalone")),
            (text("role"), text("master")),
            (text("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn auth(&mut self, user: Option<&[u8]>, password: &[u8]) -> Reply {
        let default = self.shared.live.user();
        if user.is_none() && default.open() {
            return Reply::err(
                "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            );
        }
        let user_ok = user.is_none_or(|user| user == b"default");
        if user_ok && default.accepts(password) {
            self.authenticated = true;
            Reply::ok()
        } else {
            Reply::error("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }

    async fn info(&mut self, sections: &[String]) -> Reply {
        let all =
            sections.is_empty() || sections.iter().any(|s| s == "all" || s == "everything" || s == "default");
        let wanted = |name: &str| all || sections.iter().any(|s| s == name);
        let settings = &self.shared.settings;
        let metrics = &self.shared.metrics;
        let status = self.engine().status().await;
        let mut info = InfoText::default();
        if wanted("server") {
            info.section("Server");
            info.field("redis_version", &crate::REDIS_COMPATIBLE_VERSION);
            info.field("chorus_version", &env!("CARGO_PKG_VERSION"));
            info.field("redis_mode", &"standalone");
            info.field("os", &std::env::consts::OS);
            info.field(
                "run_id",
                &format!("{:040x}", settings.node_id as u128 * 0x9e37_79b9 + std::process::id() as u128),
            );
            info.field("arch_bits", &(usize::BITS));
            info.field("process_id", &std::process::id());
            info.field("tcp_port", &settings.client_addr.port());
            info.field("uptime_in_seconds", &metrics.started.elapsed().as_secs());
            info.field("uptime_in_days", &(metrics.started.elapsed().as_secs() / 86_400));
        }
        if wanted("clients") {
            info.section("Clients");
            info.field("connected_clients", &metrics.connections_current.load(Relaxed));
            info.field("maxclients", &self.shared.live.maxclients.load(Relaxed));
        }
        if wanted("memory") {
            // The allocator's figure (memory.rs): keys, values, and everything else the
            // process allocated (connection buffers, peer queues, the protocol's state).
            let used = memory::used_bytes();
            let max = self.shared.live.maxmemory_bytes.load(Relaxed);
            info.section("Memory");
            info.field("used_memory", &used);
            info.field("used_memory_human", &memory::human(used));
            info.field("used_memory_rss", &memory::rss_bytes());
            info.field("maxmemory", &max);
            info.field("maxmemory_human", &memory::human(max));
            info.field("maxmemory_policy", &"noeviction");
            info.field("mem_allocator", &memory::ALLOCATOR);
        }
        if wanted("replication") {
            info.section("Replication");
            info.field("role", &"master");
            info.field("chorus_protocol", &settings.protocol);
            info.field("chorus_node_id", &settings.node_id);
            info.field("chorus_peer_addr", &settings.peer_addr);
            if let Some(status) = &status {
                info.field("chorus_view_epoch", &status.view.epoch.0);
                let live: Vec<String> = status.view.live.iter().map(|node| node.0.to_string()).collect();
                info.field("chorus_view_live", &live.join(","));
                info.field("chorus_operational", &(status.operational as u8));
            }
            info.field("chorus_peers", &self.shared.net.peers.len());
            info.field("chorus_peers_connected", &self.shared.net.connected_peers());
            for peer in self.shared.net.peers.values() {
                let p = peer.snapshot();
                info.field(
                    &format!("peer{}", p.node.0),
                    &format!(
                        "addr={},connected={},queued_bytes={},queued_frames={},frames_sent={},messages_sent={},writes={},frames_dropped={},messages_received={},connects={}",
                        p.addr, p.connected as u8, p.queued_bytes, p.queued_frames, p.frames_sent, p.messages_sent, p.writes, p.frames_dropped, p.messages_received, p.connects
                    ),
                );
            }
        }
        if wanted("stats") {
            info.section("Stats");
            info.field("total_connections_received", &metrics.connections_accepted.load(Relaxed));
            info.field("rejected_connections", &metrics.connections_rejected.load(Relaxed));
            info.field("total_commands_processed", &metrics.total_commands());
            info.field("total_error_replies", &metrics.total_errors());
            info.field("chorus_protocol_errors", &metrics.protocol_errors.load(Relaxed));
            info.field("chorus_peer_connections_refused", &self.shared.net.connections_refused.load(Relaxed));
            info.field("chorus_peer_links_timed_out", &self.shared.net.links_timed_out.load(Relaxed));
            let [channels, patterns, shard_channels] = self.shared.pubsub.totals();
            info.field("pubsub_channels", &channels);
            info.field("pubsub_patterns", &patterns);
            info.field("pubsubshard_channels", &shard_channels);
            let pubsub = &self.shared.pubsub;
            info.field(
                "client_output_buffer_limit_disconnections",
                &pubsub.stats.disconnected_over_limit.load(Relaxed),
            );
            let sum = |count: fn(&chorus_net::PubSubPort) -> u64| {
                pubsub.ports().map(|port| count(port)).sum::<u64>()
            };
            info.field("chorus_pubsub_frames_sent", &sum(|port| port.sent.load(Relaxed)));
            info.field("chorus_pubsub_frames_dropped", &sum(|port| port.dropped.load(Relaxed)));
            info.field("chorus_pubsub_frames_received", &sum(|port| port.received.load(Relaxed)));
            if let Some(status) = &status {
                info.field("chorus_requests_past_deadline", &status.requests_past_deadline);
                info.field("chorus_requests_inline", &status.requests_inline);
                info.field("chorus_requests_in_flight", &status.pending_requests);
                for (name, value) in &status.counters {
                    info.field(&format!("{}_{name}", status.protocol), value);
                }
            }
        }
        if wanted("persistence") {
            info.section("Persistence");
            let persistence = self.engine().persistence(false).await.and_then(Result::ok);
            for (name, value) in crate::persistence::info_fields(persistence.as_ref()) {
                info.field(name, &value);
            }
        }
        if wanted("cluster") {
            // 1 only when sharded: one group holding every key is not a Redis Cluster.
            info.section("Cluster");
            info.field("cluster_enabled", &u8::from(self.shared.cluster.is_some()));
        }
        if wanted("keyspace") {
            info.section("Keyspace");
            if let Some(status) = status.as_ref().filter(|status| status.keys > 0) {
                info.field("db0", &format!("keys={},expires=0,avg_ttl=0", status.keys));
            }
        }
        Reply::Verbatim(info.0)
    }

    fn config_get(&self, patterns: &[Bytes]) -> Reply {
        let settings = &self.shared.settings;
        let clients = &settings.clients;
        let mut parameters: Vec<(&str, String)> = vec![
            ("save", String::new()),
            ("appendonly", "no".into()),
            ("maxmemory-policy", "noeviction".into()),
            ("databases", "1".into()),
            ("tcp-keepalive", clients.tcp_keepalive_s.to_string()),
            ("port", settings.client_addr.port().to_string()),
            ("bind", settings.client_addr.ip().to_string()),
            ("protected-mode", if settings.client_addr.ip().is_loopback() { "yes" } else { "no" }.into()),
            ("proto-max-bulk-len", settings.limits.bulk_bytes_max.to_string()),
            ("cluster-enabled", if self.shared.cluster.is_some() { "yes" } else { "no" }.into()),
            ("io-threads", "1".into()),
            // The thresholds OBJECT ENCODING answers by (chorus_core::data::keys); chorus
            // stores every type the same way, so they change no memory use.
            ("hash-max-listpack-entries", "128".into()),
            ("hash-max-listpack-value", "64".into()),
            ("set-max-intset-entries", "512".into()),
            ("set-max-listpack-entries", "128".into()),
            ("zset-max-listpack-entries", "128".into()),
            ("zset-max-listpack-value", "64".into()),
            ("list-max-listpack-size", "-2".into()),
        ];
        // The ones CONFIG SET changes, as they are now.
        parameters.extend(
            crate::live::SETTABLE.iter().filter_map(|name| Some((*name, self.shared.live.get(name)?))),
        );
        let mut pairs = Vec::new();
        for (name, value) in &parameters {
            if patterns.iter().any(|pattern| glob_match(pattern, name.as_bytes())) {
                pairs.push((Reply::text(name), Reply::text(value)));
            }
        }
        Reply::Map(pairs)
    }
}

/// Sleep until `at`; forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn reads(keys: &[Bytes]) -> Vec<Command> {
    keys.iter().map(|key| Command::Read { key: key.clone() }).collect()
}

/// How many outcomes carry a value (EXISTS, DEL), or the first error.
fn count_values(outcomes: Vec<Outcome>) -> Reply {
    let mut count = 0;
    for outcome in outcomes {
        match outcome {
            Outcome::Value(Some(_)) => count += 1,
            Outcome::Value(None) => {}
            Outcome::Error(error) => return error_reply(&error),
            other => return unexpected(other),
        }
    }
    Reply::Integer(count)
}

fn first_error_or(outcomes: Vec<Outcome>, reply: Reply) -> Reply {
    match outcomes.into_iter().find_map(|outcome| match outcome {
        Outcome::Error(error) => Some(error),
        _ => None,
    }) {
        Some(error) => error_reply(&error),
        None => reply,
    }
}

fn unexpected(outcome: Outcome) -> Reply {
    Reply::err(format!("internal error: unexpected outcome {outcome:?}"))
}

fn command_info(spec: &command::CommandSpec) -> Reply {
    Reply::Array(vec![
        Reply::text(spec.name),
        Reply::Integer(spec.arity),
        Reply::Array(spec.flags.iter().map(|flag| Reply::Status(flag)).collect()),
        Reply::Integer(spec.first_key),
        Reply::Integer(spec.last_key),
        Reply::Integer(spec.step),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

/// INFO's text format: `# Section` headers, `field:value` lines, a blank line between sections.
#[derive(Default)]
struct InfoText(String);

impl InfoText {
    fn section(&mut self, name: &str) {
        if !self.0.is_empty() {
            self.0.push_str("\r\n");
        }
        self.0.push_str("# ");
        self.0.push_str(name);
        self.0.push_str("\r\n");
    }

    fn field(&mut self, key: &str, value: &dyn std::fmt::Display) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{key}:{value}\r\n");
    }
}
