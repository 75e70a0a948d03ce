//! The chain store's member on the node's group host (issue 17 point 5): the hosted form of
//! `chorus_chain::Member`, for `chain_hosts` (docs/protocols/chain.md, "Where the members
//! run").
//!
//! The host process (`chorus group-host`, HyperLoop's NIC) holds the member core and applies
//! and forwards every group operation, host to host; this node only configures it and reads
//! the region the host writes:
//!
//! * `on_config` is an `Initialize` of this node's host (the group, its epoch, this member's
//!   position, the next member's host). Hosts dial their next hop until it accepts
//!   (docs/decisions.md, "members on group hosts"), so every node initializes its own host
//!   when the coordinator's `Configure` reaches it, in any order.
//! * `on_message` gets operations only as the head (from the coordinator on this node, or for
//!   the copy group, over the peer link): they go to the host on this member's caller
//!   connection.
//! * The host sends a group's acknowledgements and refusals on the caller connection of the
//!   tail's initializer: this node's, when it is the tail. `on_tick` hands them to the core,
//!   addressed to the coordinator, and the core routes them to the node that configured it.
//! * `memory` is this node's own shared mapping of the region file the host maps
//!   (`<data_dir>/regions/tenant-0/chain.region`): reads see the host's writes, and the read
//!   lock's CAS and the host's gCAS are atomic operations on the same word.
//!
//! On the kernel path (`chain_datapath = "kernel"`, [`KernelPath`]) the host's XDP program is
//! the member: the region is a slot of the host's BPF regions map, which this node maps too
//! (`memory`; the read lock's CAS and the program's gCAS are both atomic on that word); the
//! operations of a group this member heads leave as datagrams to the host
//! (`MemberDatagrams`), and the tail's program acknowledges straight to the datagram port of
//! the coordinator's node (`coordinated_by`; each node's port is its peer port, on UDP), where
//! `on_tick` hands them to the core. No process on the path in between is woken.

use std::net::SocketAddr;
use std::time::Duration;

use chorus_chain::replica::{COORDINATOR, TENANT, TOKEN};
use chorus_chain::Member;
use chorus_core::{NodeId, Time};
use chorus_group::runtime::{HostLink, HostedInit, MemberDatagrams};
use chorus_group::{GroupConfig, GroupMessage, GroupOutbox};
use chorus_region::Region;

/// The region's name on the host: the file the node's own `RegionStore` registers too.
pub const REGION_NAME: &str = "chain";

pub struct HostedMember {
    me: NodeId,
    config: GroupConfig,
    position: usize,
    region: Region,
    /// The group host of every node, by node id.
    hosts: Vec<SocketAddr>,
    link: HostLink,
    received: Vec<GroupMessage>,
    /// User path: the turn's operations, sent to the host as one frame at the end of the turn
    /// (`sync_turn`), so the host applies them in one turn of its own with one flush.
    turn_ops: Vec<GroupMessage>,
    kernel: Option<KernelPath>,
    /// The node of the coordinator whose configuration is installed next or last.
    coordinator: NodeId,
}

/// The member on its host's kernel data path.
pub struct KernelPath {
    pub datagrams: MemberDatagrams,
    /// Every node's datagram port, by node id (the tail acknowledges to the coordinator's).
    pub ports: Vec<u16>,
}

impl HostedMember {
    /// Bind to `initial` (the core's first configuration, which it replaces before any
    /// operation: nothing is initialized on the host until then).
    /// `kernel`: the host serves this member on its kernel data path, and `region` is this
    /// node's mapping of the host's BPF region slot.
    pub fn new(
        me: NodeId,
        initial: GroupConfig,
        region: Region,
        hosts: Vec<SocketAddr>,
        kernel: Option<KernelPath>,
        io_timeout: Duration,
    ) -> Result<HostedMember, String> {
        let host = *hosts.get(usize::from(me.0)).ok_or_else(|| format!("no group host for {me:?}"))?;
        let position = position_of(&initial, me)?;
        if let Some(kernel) = &kernel {
            if kernel.ports.len() < hosts.len() {
                return Err(format!("{} datagram ports for {} nodes", kernel.ports.len(), hosts.len()));
            }
        }
        // On the kernel path the region lives in the host process: a host that went away took
        // it along, and a new one would serve an empty region under the same name.
        let link = HostLink::start_with(host, TENANT, TOKEN, io_timeout, kernel.is_none());
        Ok(HostedMember {
            me,
            config: initial,
            position,
            region,
            hosts,
            link,
            received: Vec::new(),
            turn_ops: Vec::new(),
            kernel,
            coordinator: me,
        })
    }

    /// Why the host refused this member's last `Initialize`, or cannot be reached.
    pub fn host_error(&self) -> Option<String> {
        self.link.last_error()
    }

    /// Call `wake` whenever the host sends this node something (see [`HostLink::wake_with`]).
    pub fn wake_with(&self, wake: chorus_group::runtime::Wake) {
        self.link.wake_with(wake);
    }

    /// What the host sent (refusals, user-path acknowledgements) and the kernel path's
    /// acknowledgements that reached this node, for the coordinator.
    fn drain(&mut self, out: &mut GroupOutbox) {
        if self.kernel.is_some() && self.link.lost() {
            // This member's region is gone with its host, and nothing in the core can serve
            // without it: the node stops, the membership service removes it, and restarted
            // (once its host is back) it joins and is copied to (§5.1).
            tracing::error!(
                "the group host's kernel data path is lost, and this member's region with it \
                 ({}); stopping: restart this node once its host runs again",
                self.link.last_error().unwrap_or_default()
            );
            std::process::exit(70);
        }
        self.link.drain(&mut self.received);
        if let Some(kernel) = &mut self.kernel {
            kernel.datagrams.drain(&mut self.received);
        }
        out.messages.extend(self.received.drain(..).map(|message| (COORDINATOR, message)));
    }

    /// The turn's operations to the host as one frame: one host turn and one flush for a
    /// batch's lock, copies and log-head write.
    fn send_turn_ops(&mut self) {
        if !self.turn_ops.is_empty() {
            self.link.send(&self.turn_ops);
            self.turn_ops.clear();
        }
    }
}

fn position_of(config: &GroupConfig, me: NodeId) -> Result<usize, String> {
    config.chain.iter().position(|node| *node == me).ok_or_else(|| format!("{me:?} is not in the chain"))
}

impl Member for HostedMember {
    type Memory = Region;

    fn config(&self) -> &GroupConfig {
        &self.config
    }
    fn position(&self) -> usize {
        self.position
    }
    fn memory(&self) -> &Region {
        &self.region
    }
    fn memory_mut(&mut self) -> &mut Region {
        &mut self.region
    }
    fn on_message(&mut self, _now: Time, _from: NodeId, message: GroupMessage, out: &mut GroupOutbox) {
        match &mut self.kernel {
            Some(kernel) => {
                let chain_len = self.config.chain.len();
                kernel.datagrams.send(&message, self.config.region_bytes, chain_len);
                // The whole chain ran in this send's softirq: its acknowledgement may be here.
                self.drain(out);
            }
            None => self.turn_ops.push(message),
        }
    }
    fn on_tick(&mut self, _now: Time, out: &mut GroupOutbox) {
        // Operations of a call that ended no turn (none is expected) leave at the tick.
        self.send_turn_ops();
        self.drain(out);
    }
    fn coordinated_by(&mut self, coordinator: NodeId) {
        if coordinator != self.coordinator {
            tracing::debug!(%coordinator, "the chain's coordinator changed");
        }
        self.coordinator = coordinator;
    }
    /// The host flushes what its member applied by the nodes' `appendfsync` (`chorus
    /// group-host --sync`), not per turn of this node; at a clean stop (`force`) this node
    /// flushes the whole shared file itself, so a region recorded as synced at the stop is.
    fn sync_turn(&mut self, force: bool) -> Result<(), String> {
        self.send_turn_ops();
        if !force || self.kernel.is_some() {
            return Ok(());
        }
        self.region.flush_all().map_err(|error| format!("cannot flush the chain region: {error}"))
    }
    fn carries_datagrams(&self) -> bool {
        self.kernel.is_some()
    }
    /// The host (its thread or its XDP program) writes the shared region while this node reads.
    fn applies_concurrently(&self) -> bool {
        true
    }
    fn on_config(&mut self, _now: Time, config: GroupConfig, _out: &mut GroupOutbox) -> Result<(), String> {
        config.check()?;
        // What the previous configuration sent goes before the new `Initialize`.
        self.send_turn_ops();
        if config.epoch <= self.config.epoch {
            return Ok(()); // stale or repeated
        }
        let position = position_of(&config, self.me)?;
        let next = match config.chain.get(position + 1) {
            None => None,
            Some(node) => Some(
                *self.hosts.get(usize::from(node.0)).ok_or_else(|| format!("no group host for {node:?}"))?,
            ),
        };
        tracing::info!(
            group = config.group.0,
            epoch = config.epoch,
            chain = ?config.chain,
            position,
            next = ?next,
            coordinator = %self.coordinator,
            "configuring this node's member on its group host"
        );
        self.link.initialize(HostedInit {
            group: config.group,
            epoch: config.epoch,
            start_seq: config.start_seq,
            region: REGION_NAME.to_string(),
            region_bytes: config.region_bytes,
            chain_len: config.chain.len() as u8,
            position: position as u8,
            next,
            // The kernel path's tail acknowledges to the coordinator's node.
            caller_port: match &self.kernel {
                Some(kernel) => kernel.ports.get(usize::from(self.coordinator.0)).copied().unwrap_or(0),
                None => 0,
            },
        });
        self.position = position;
        self.config = config;
        Ok(())
    }
}
