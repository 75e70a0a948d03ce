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

use std::net::SocketAddr;
use std::time::Duration;

use chorus_chain::replica::{COORDINATOR, TENANT, TOKEN};
use chorus_chain::Member;
use chorus_core::{NodeId, Time};
use chorus_group::runtime::{HostLink, HostedInit};
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
}

impl HostedMember {
    /// Bind to `initial` (the core's first configuration, which it replaces before any
    /// operation: nothing is initialized on the host until then).
    pub fn new(
        me: NodeId,
        initial: GroupConfig,
        region: Region,
        hosts: Vec<SocketAddr>,
        io_timeout: Duration,
    ) -> Result<HostedMember, String> {
        let host = *hosts.get(usize::from(me.0)).ok_or_else(|| format!("no group host for {me:?}"))?;
        let position = position_of(&initial, me)?;
        let link = HostLink::start(host, TENANT, TOKEN, io_timeout);
        Ok(HostedMember { me, config: initial, position, region, hosts, link, received: Vec::new() })
    }

    /// Why the host refused this member's last `Initialize`, or cannot be reached.
    pub fn host_error(&self) -> Option<String> {
        self.link.last_error()
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
    fn on_message(&mut self, _now: Time, _from: NodeId, message: GroupMessage, _out: &mut GroupOutbox) {
        self.link.send(&[message]);
    }
    fn on_tick(&mut self, _now: Time, out: &mut GroupOutbox) {
        self.link.drain(&mut self.received);
        out.messages.extend(self.received.drain(..).map(|message| (COORDINATOR, message)));
    }
    fn on_config(&mut self, _now: Time, config: GroupConfig, _out: &mut GroupOutbox) -> Result<(), String> {
        config.check()?;
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
        self.link.initialize(HostedInit {
            group: config.group,
            epoch: config.epoch,
            start_seq: config.start_seq,
            region: REGION_NAME.to_string(),
            region_bytes: config.region_bytes,
            chain_len: config.chain.len() as u8,
            position: position as u8,
            next,
        });
        self.position = position;
        self.config = config;
        Ok(())
    }
}
