//! The metadata service's runtime on a node: the `chorus_membership::Metadata` core (the slot
//! map agreed through Raft by every node of every group) on its own peer transport at the
//! node's `meta` address, its Raft records in `metadata.log` in the data directory, and the
//! current map published to the connections through a watch channel.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chorus_core::{Destination, Time};
use chorus_membership::metadata::ProposeError;
use chorus_membership::{
    MembershipLog, MembershipMessage, Metadata, MetadataOutbox, SlotChange, METADATA_LOG,
};
use chorus_net::NetConfig;
use chorus_storage::FileStorage;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, info};

use super::gate::SlotGates;
use super::map::SlotMap;

/// The id the metadata service's peer links authenticate under (with the node's
/// `cluster_token`): one service for all groups, whatever their own cluster ids.
pub const METADATA_CLUSTER_ID: &str = "chorus-metadata";

/// How long a proposal may wait to be decided: a lost one (its leader died) is reported
/// as such rather than waited on forever.
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(3);

const TICK: Duration = Duration::from_millis(10);

type Decision = Result<u64, String>;

/// What connections hold: the current map, a way to propose changes, and the slots' gates.
#[derive(Clone)]
pub struct Cluster {
    map: watch::Receiver<Arc<SlotMap>>,
    proposals: mpsc::Sender<(SlotChange, oneshot::Sender<Decision>)>,
    gates: Arc<SlotGates>,
    copies: Arc<SlotGates>,
}

impl Cluster {
    /// The map at the newest epoch this node has applied.
    pub fn map(&self) -> Arc<SlotMap> {
        self.map.borrow().clone()
    }

    /// Propose `change`; the epoch it made once decided, or why not.
    pub async fn propose(&self, change: SlotChange) -> Decision {
        let (reply, decided) = oneshot::channel();
        self.proposals.send((change, reply)).await.map_err(|_| "the metadata service stopped".to_string())?;
        decided.await.map_err(|_| "the metadata service stopped".to_string())?
    }

    /// The commands running per slot at this node (a move's drain).
    pub fn gates(&self) -> &Arc<SlotGates> {
        &self.gates
    }

    /// The copies of moving slots running at this node (a move's seal).
    pub fn copies(&self) -> &Arc<SlotGates> {
        &self.copies
    }

    /// Wait until the map satisfies `done`, at most `timeout`: whether it did.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&SlotMap) -> bool) -> bool {
        let mut map = self.map.clone();
        let wait = map.wait_for(|map| done(map));
        tokio::time::timeout(timeout, wait).await.is_ok_and(|seen| seen.is_ok())
    }

    /// A map nobody changes (unit tests of the connection layer).
    pub fn fixed(map: SlotMap) -> Cluster {
        let (_, map) = watch::channel(Arc::new(map));
        let (proposals, _) = mpsc::channel(1);
        Cluster { map, proposals, gates: Arc::default(), copies: Arc::default() }
    }
}

/// Pub/Sub on the service's links, which reach every node of every group: PUBLISH in a
/// sharded cluster goes to every node, as in Redis Cluster (crate::pubsub).
pub struct PubSubLinks {
    pub port: Option<Arc<chorus_net::PubSubPort>>,
    /// Frames must carry the largest message a client may publish.
    pub frame_payload_bytes_max: usize,
}

/// Open `metadata.log` in `dir`, rebuild the map from it, start the service's transport and
/// task. Returns once the restored map is known, so the node never serves an older one.
pub async fn start(
    config_map: SlotMap,
    cluster_token: &str,
    tls: Option<chorus_net::tls::PeerTls>,
    dir: &Path,
    pubsub: PubSubLinks,
) -> anyhow::Result<Cluster> {
    let storage = FileStorage::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
    let (log, records) = MembershipLog::open_named(storage, METADATA_LOG)?;
    let me = config_map.me().clone();
    let nodes: Vec<_> = config_map.groups().iter().flatten().cloned().collect();
    let members: Vec<_> = nodes.iter().map(|node| node.node).collect();
    let origin = Instant::now();
    let mut meta = Metadata::restore(me.node, &members, config_map.table().clone(), &records, Time::ZERO);
    let mut out = MetadataOutbox::default();
    meta.on_tick(Time::ZERO, &mut out); // Re-applies the restored log.
    let peers: BTreeMap<_, _> =
        nodes.iter().filter(|node| node.node != me.node).map(|node| (node.node, node.meta)).collect();
    let mut net = NetConfig::new(me.node, METADATA_CLUSTER_ID, cluster_token, "metadata", me.meta, peers);
    net.tls = tls;
    net.priority_lane = false; // Its only traffic is Raft (and published messages).
    if let Some(port) = pubsub.port {
        net.pubsub = Some(port);
        net.frame_payload_bytes_max = net.frame_payload_bytes_max.max(pubsub.frame_payload_bytes_max);
    }
    let (transport, inbound, _) = chorus_net::start::<MembershipMessage>(net)
        .await
        .with_context(|| format!("metadata service on {}", me.meta))?;
    if !records.is_empty() {
        info!(epoch = meta.table().epoch(), "slot map restored from {}", log.describe());
    }
    let (publish, map) = watch::channel(Arc::new(config_map.at(meta.table())));
    let (proposals, proposals_rx) = mpsc::channel(64);
    let runtime = Runtime {
        meta,
        log,
        transport,
        publish,
        config_map,
        origin,
        waiting: BTreeMap::new(),
        deferred: Vec::new(),
        next: 0,
    };
    tokio::spawn(runtime.run(inbound, proposals_rx, out));
    let cluster = Cluster { map, proposals, gates: Arc::default(), copies: Arc::default() };
    tokio::spawn(super::migrate::report_drains(cluster.clone()));
    Ok(cluster)
}

const REPROPOSE_PERIOD: Duration = Duration::from_millis(300);

struct Waiting {
    change: SlotChange,
    reply: oneshot::Sender<Decision>,
    until: Instant,
    proposed_at: Instant,
}

struct Runtime {
    meta: Metadata,
    log: MembershipLog<FileStorage>,
    transport: chorus_net::Transport<MembershipMessage>,
    publish: watch::Sender<Arc<SlotMap>>,
    config_map: SlotMap,
    origin: Instant,
    /// Proposals made here and not decided yet, by id. Proposed again every
    /// [`REPROPOSE_PERIOD`]: a forwarded proposal is lost if the link to the leader is not up
    /// yet (the transport drops frames for a peer it is not connected to); the core applies
    /// an id once.
    waiting: BTreeMap<u64, Waiting>,
    /// Proposals made while there was no Raft leader (just after a start, during an
    /// election): tried again every tick until their deadline.
    deferred: Vec<(SlotChange, oneshot::Sender<Decision>, Instant)>,
    next: u64,
}

impl Runtime {
    async fn run(
        mut self,
        mut inbound: chorus_net::Inbound<MembershipMessage>,
        mut proposals: mpsc::Receiver<(SlotChange, oneshot::Sender<Decision>)>,
        first: MetadataOutbox,
    ) {
        self.finish_turn(first);
        let mut tick = tokio::time::interval(TICK);
        loop {
            let mut out = MetadataOutbox::default();
            tokio::select! {
                _ = tick.tick() => {
                    let now = Time::from_nanos(self.origin.elapsed().as_nanos() as u64);
                    self.meta.on_tick(now, &mut out);
                    self.retry_proposals(&mut out);
                }
                Some((from, batch)) = inbound.recv() => {
                    for message in batch {
                        self.meta.on_message(from, message, &mut out);
                    }
                }
                Some((change, reply)) = proposals.recv() => {
                    self.propose(change, reply, Instant::now() + PROPOSAL_TIMEOUT, &mut out);
                }
                else => return,
            }
            self.finish_turn(out);
        }
    }

    fn propose(
        &mut self,
        change: SlotChange,
        reply: oneshot::Sender<Decision>,
        until: Instant,
        out: &mut MetadataOutbox,
    ) {
        // Unique across nodes and restarts: the node id, this start's time, a counter.
        self.next += 1;
        let start = (self.origin.elapsed().as_nanos() as u64) << 8;
        let proposal = (u64::from(self.meta.me().0) << 56) ^ start ^ self.next;
        match self.meta.propose(proposal, change, out) {
            Ok(()) => {
                self.waiting.insert(proposal, Waiting { change, reply, until, proposed_at: Instant::now() });
            }
            Err(ProposeError::NoLeader) if Instant::now() < until => {
                self.deferred.push((change, reply, until))
            }
            Err(error) => {
                let _ = reply.send(Err(error.to_string()));
            }
        }
    }

    /// Propose again what may have been lost; give up on what is past its deadline.
    fn retry_proposals(&mut self, out: &mut MetadataOutbox) {
        for (change, reply, until) in std::mem::take(&mut self.deferred) {
            self.propose(change, reply, until, out);
        }
        let now = Instant::now();
        for (proposal, waiting) in &mut self.waiting {
            if now >= waiting.proposed_at + REPROPOSE_PERIOD && now < waiting.until {
                waiting.proposed_at = now;
                let _ = self.meta.propose(*proposal, waiting.change, out);
            }
        }
        let expired: Vec<u64> =
            self.waiting.iter().filter(|(_, waiting)| waiting.until <= now).map(|(id, _)| *id).collect();
        for proposal in expired {
            self.meta.abandon(proposal);
            if let Some(waiting) = self.waiting.remove(&proposal) {
                let _ = waiting.reply.send(Err(format!(
                    "not decided within {} s (no majority of all nodes, or its leader failed): \
                     check CLUSTER SLOTS before retrying",
                    PROPOSAL_TIMEOUT.as_secs()
                )));
            }
        }
    }

    /// Persist, then send, then answer and publish: Raft's vote and log are on disk before
    /// any message that depends on them leaves, as in the membership service.
    fn finish_turn(&mut self, mut out: MetadataOutbox) {
        if !out.persist.is_empty() {
            if let Err(error) = self.log.append(&out.persist).and_then(|()| self.log.sync()) {
                error!(%error, "cannot persist the metadata service's state; stopping this node");
                std::process::exit(1);
            }
        }
        let mut messages: Vec<_> =
            out.messages.drain(..).map(|(to, message)| (Destination::Node(to), message)).collect();
        self.transport.send_turn(&mut messages);
        if out.changed {
            let map = self.config_map.at(self.meta.table());
            info!(epoch = map.epoch, "slot map changed");
            self.publish.send_replace(Arc::new(map));
        }
        for (proposal, decision) in out.decided {
            if let Some(waiting) = self.waiting.remove(&proposal) {
                let _ = waiting.reply.send(decision.map_err(|refused| refused.to_string()));
            }
        }
    }
}
