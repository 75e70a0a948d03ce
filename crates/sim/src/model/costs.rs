//! What things cost in the performance model: CPU time per event ([`CostTable`]) and the
//! network between machines ([`Network`]).
//!
//! The defaults are PLACEHOLDERS, order-of-magnitude figures for a kernel TCP stack on a
//! current x86 server (a syscall and a wake-up per message, a few hundred nanoseconds per key
//! operation, an NVMe flush for a sync), not measurements of this binary: predictions made
//! with them say what shape to expect, not what number. `chorus model --costs FILE` takes a
//! measured table (docs/model.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// CPU time per event, in nanoseconds. Every field is charged on the node that does the work;
/// which stage of the node (any core, or the one protocol thread) is said per field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostTable {
    /// Where the figures come from, printed with every prediction.
    pub source: String,
    /// Reading and parsing one client request and handing it to the protocol thread (any
    /// core).
    pub client_request_ns: u64,
    /// Receiving and decoding one peer frame (a turn's messages to this node; any core).
    pub message_received_ns: u64,
    /// Encoding and sending one peer frame (any core).
    pub message_sent_ns: u64,
    /// Encoding and writing one client reply (any core): a reply goes straight to its
    /// connection, a peer frame through the link's writer, so the two are measured apart.
    pub reply_sent_ns: u64,
    /// Per peer message of a frame, at each end (decoding it on receipt, encoding it on send:
    /// the envelope, the codec, the checks), on top of the frame's own cost and the core's
    /// handler (any core). Measured apart from the frame from two loaded runs whose frames
    /// carry different numbers of messages; tables without it fold it into the frame.
    #[serde(default)]
    pub peer_message_ns: u64,
    /// Per byte received or sent, on top of the per-message costs (copies, checksums; any core).
    pub byte_ps: u64,
    /// The protocol core handling one event: a request or a message of a frame (protocol
    /// thread).
    pub handle_ns: u64,
    /// The event loop's own work per tick, whatever else it does (protocol thread): its timer,
    /// a turn with only the tick in it, the background a tick drives (heartbeats). On top of
    /// `wake_ns` when the tick finds the node asleep.
    pub tick_ns: u64,
    /// Executing one client command against the store (protocol thread).
    pub key_op_ns: u64,
    /// Making one turn's writes durable (protocol thread: the server syncs before the turn's
    /// messages and replies leave).
    pub sync_ns: u64,
    /// The load generator's CPU per operation (encoding the request, reading the reply),
    /// charged only when it shares the host with the nodes (a loopback run).
    #[serde(default)]
    pub client_op_ns: u64,
    /// Waking an idle node (the scheduler switching its thread in, the poller returning, the
    /// runtime unparking): CPU charged when work reaches a node with nothing to do. Under load
    /// a node is never idle and never pays it; at one client it pays it for every event.
    #[serde(default)]
    pub wake_ns: u64,
    /// Waking a sleeping thread of the load generator (a multi-threaded runtime, unlike a
    /// node's); tables without it charge `wake_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_wake_ns: Option<u64>,
    /// Waking an idle node by its tick's timer: on a VM, arming and taking a timer interrupt
    /// costs far more than being woken by a peer's write, so the two are measured apart.
    pub timer_wake_ns: u64,
    /// From a write on loopback to the reader running (the scheduler's wake-up; no CPU of
    /// its own): the one-way latency of the `loopback` network.
    #[serde(default)]
    pub wakeup_ns: u64,
    /// The clock of the CPU the table was measured on (`chorus model calibrate` reads it from
    /// /proc/cpuinfo), so it can be scaled to another ([`CostTable::at_clock`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ghz: Option<f64>,
    /// The protocol thread's figures per protocol (`handle_ns`, `key_op_ns` of that protocol's
    /// own handlers, timed in-process on its real core): a raftlog message runs raft-rs, a
    /// Hermes one a few comparisons. A protocol without an entry pays the table's own
    /// `handle_ns` and `key_op_ns` (Hermes').
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub handlers: BTreeMap<String, ProtocolHandlers>,
}

/// One protocol's handler costs (see [`CostTable::handlers`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtocolHandlers {
    /// Its core handling one event (`on_message`; a client request's share of `on_client`).
    pub handle_ns: u64,
    /// What its `on_client` costs beyond `handle_ns`.
    pub key_op_ns: u64,
}

impl CostTable {
    /// The placeholder table (see the module comment: not a calibration).
    pub fn placeholder() -> CostTable {
        CostTable {
            source: "placeholder defaults (order-of-magnitude guesses, not measured; run with --costs FILE for a measured table)".into(),
            client_request_ns: 4_000,
            message_received_ns: 2_000,
            message_sent_ns: 1_500,
            reply_sent_ns: 1_500,
            peer_message_ns: 0,
            byte_ps: 100,
            handle_ns: 500,
            tick_ns: 500,
            key_op_ns: 300,
            sync_ns: 20_000,
            client_op_ns: 5_000,
            wake_ns: 0,
            client_wake_ns: None,
            timer_wake_ns: 0,
            wakeup_ns: 10_000,
            cpu_ghz: None,
            handlers: BTreeMap::new(),
        }
    }

    /// Every event free: the model then only plays the network.
    pub fn zero() -> CostTable {
        CostTable {
            source: "zero".into(),
            client_request_ns: 0,
            message_received_ns: 0,
            message_sent_ns: 0,
            reply_sent_ns: 0,
            peer_message_ns: 0,
            byte_ps: 0,
            handle_ns: 0,
            tick_ns: 0,
            key_op_ns: 0,
            sync_ns: 0,
            client_op_ns: 0,
            wake_ns: 0,
            client_wake_ns: None,
            timer_wake_ns: 0,
            wakeup_ns: 0,
            cpu_ghz: None,
            handlers: BTreeMap::new(),
        }
    }

    /// This table on a CPU that gives the run only `share` (0 to 1] of each core (a host
    /// busy with other processes): every CPU cost divided by `share`, as processor sharing
    /// stretches each piece of work. `wakeup_ns`, a latency, is left alone.
    pub fn at_cpu_share(&self, share: f64) -> CostTable {
        assert!(share > 0.0 && share <= 1.0, "a CPU share is in (0, 1]");
        let scale = |ns: u64| (ns as f64 / share).round() as u64;
        CostTable {
            source: format!("{} (at a {:.0}% CPU share)", self.source, share * 100.0),
            client_request_ns: scale(self.client_request_ns),
            message_received_ns: scale(self.message_received_ns),
            message_sent_ns: scale(self.message_sent_ns),
            reply_sent_ns: scale(self.reply_sent_ns),
            peer_message_ns: scale(self.peer_message_ns),
            byte_ps: scale(self.byte_ps),
            handle_ns: scale(self.handle_ns),
            tick_ns: scale(self.tick_ns),
            key_op_ns: scale(self.key_op_ns),
            sync_ns: scale(self.sync_ns),
            client_op_ns: scale(self.client_op_ns),
            wake_ns: scale(self.wake_ns),
            client_wake_ns: self.client_wake_ns.map(scale),
            timer_wake_ns: scale(self.timer_wake_ns),
            wakeup_ns: self.wakeup_ns,
            cpu_ghz: self.cpu_ghz,
            handlers: self.scaled_handlers(scale),
        }
    }

    fn scaled_handlers(&self, scale: impl Fn(u64) -> u64) -> BTreeMap<String, ProtocolHandlers> {
        let scaled = |handlers: &ProtocolHandlers| ProtocolHandlers {
            handle_ns: scale(handlers.handle_ns),
            key_op_ns: scale(handlers.key_op_ns),
        };
        self.handlers.iter().map(|(protocol, handlers)| (protocol.clone(), scaled(handlers))).collect()
    }

    /// The table as `protocol`'s nodes pay it: its own handler figures, if the table has them
    /// (`zab-local` runs ZAB's handlers), in `handle_ns` and `key_op_ns`.
    pub fn for_protocol(&self, protocol: &str) -> CostTable {
        let mut costs = self.clone();
        let base = protocol.split('-').next().unwrap_or(protocol);
        if let Some(handlers) = self.handlers.get(protocol).or_else(|| self.handlers.get(base)) {
            costs.handle_ns = handlers.handle_ns;
            costs.key_op_ns = handlers.key_op_ns;
        }
        costs
    }

    /// This table on a CPU of `to_ghz` when it was measured at `from_ghz`: every CPU cost
    /// times `from_ghz / to_ghz` (first order: the same instructions at another clock; the
    /// two cores' instructions per cycle, caches and memory are taken as alike).
    /// `wakeup_ns`, a latency of this host's scheduler, is left alone.
    pub fn at_clock(&self, from_ghz: f64, to_ghz: f64) -> CostTable {
        assert!(from_ghz > 0.0 && to_ghz > 0.0, "clocks are positive");
        let mut scaled = self.at_cpu_share(1.0);
        let factor = from_ghz / to_ghz;
        let scale = |ns: u64| (ns as f64 * factor).round() as u64;
        scaled.source = format!("{} (measured at {from_ghz} GHz, scaled to {to_ghz} GHz)", self.source);
        scaled.client_request_ns = scale(self.client_request_ns);
        scaled.message_received_ns = scale(self.message_received_ns);
        scaled.message_sent_ns = scale(self.message_sent_ns);
        scaled.reply_sent_ns = scale(self.reply_sent_ns);
        scaled.peer_message_ns = scale(self.peer_message_ns);
        scaled.byte_ps = scale(self.byte_ps);
        scaled.handle_ns = scale(self.handle_ns);
        scaled.tick_ns = scale(self.tick_ns);
        scaled.key_op_ns = scale(self.key_op_ns);
        scaled.sync_ns = scale(self.sync_ns);
        scaled.client_op_ns = scale(self.client_op_ns);
        scaled.wake_ns = scale(self.wake_ns);
        scaled.client_wake_ns = self.client_wake_ns.map(scale);
        scaled.timer_wake_ns = scale(self.timer_wake_ns);
        scaled.handlers = self.scaled_handlers(scale);
        scaled.cpu_ghz = Some(to_ghz);
        scaled
    }

    /// This table on a kernel-bypass stack (RDMA verbs as Hermes' Wings and HyperLoop's
    /// Naïve-RDMA, DPDK as Cyclone), polled by threads that never sleep:
    ///
    /// * per message, the kernel TCP path's cost (the calibrated `client_request_ns`,
    ///   `reply_sent_ns`, `message_received_ns`, `message_sent_ns`: system calls, socket
    ///   buffers, the runtime, the codec) is replaced by [`BYPASS_MESSAGE_NS`]: eRPC's measured
    ///   CPU per small RPC on a kernel-bypass NIC, halved (an RPC is a request received and a
    ///   response sent). The ratio of the two is reported as [`CostTable::kernel_to_bypass_ratio`];
    /// * per peer message inside a frame, the codec (`peer_message_ns`) unchanged: the same
    ///   encoder and decoder run on any stack;
    /// * per byte, one copy (into or out of the store) instead of the socket's copies at both
    ///   ends: half the calibrated `byte_ps` (the NIC moves the bytes by DMA);
    /// * no wake-ups (`wake_ns`, `timer_wake_ns` zero): the threads poll their queues;
    /// * the protocol core's handlers, a tick's own work, key operations and syncs unchanged:
    ///   the same code runs whatever the network.
    pub fn kernel_bypass(&self) -> CostTable {
        let mut bypass = self.at_cpu_share(1.0);
        bypass.source =
            format!("{} (kernel bypass: {BYPASS_MESSAGE_NS} ns per message, polling)", self.source);
        bypass.client_request_ns = BYPASS_MESSAGE_NS;
        bypass.reply_sent_ns = BYPASS_MESSAGE_NS;
        bypass.message_received_ns = BYPASS_MESSAGE_NS;
        bypass.message_sent_ns = BYPASS_MESSAGE_NS;
        bypass.byte_ps = self.byte_ps / 2;
        bypass.wake_ns = 0;
        bypass.client_wake_ns = Some(0);
        bypass.timer_wake_ns = 0;
        bypass
    }

    /// What waking a sleeping thread of the load generator costs (`client_wake_ns`, or a
    /// node's `wake_ns` where the table has no figure of its own).
    pub fn load_generator_wake_ns(&self) -> u64 {
        self.client_wake_ns.unwrap_or(self.wake_ns)
    }

    /// How many times a message costs more on this table's stack than on a kernel-bypass one:
    /// the mean of the four per-message costs over [`BYPASS_MESSAGE_NS`].
    pub fn kernel_to_bypass_ratio(&self) -> f64 {
        let kernel =
            (self.client_request_ns + self.reply_sent_ns + self.message_received_ns + self.message_sent_ns)
                as f64
                / 4.0;
        kernel / BYPASS_MESSAGE_NS as f64
    }

    /// CPU time for `bytes` bytes of copying, in nanoseconds (rounded up).
    pub fn bytes_ns(&self, bytes: u64) -> u64 {
        (bytes * self.byte_ps).div_ceil(1_000)
    }
}

/// CPU per message received or sent on a kernel-bypass stack: eRPC (Kalia, Kaminsky and
/// Andersen, "Datacenter RPCs can be General and Fast", NSDI 2019) measures "one CPU core can
/// handle up to 10 million small RPCs per second": 100 ns per RPC, a request received and its
/// response sent, so 50 ns per message. Its machines (Xeon E5 v3/v4, 2-2.6 GHz) are the
/// papers' generation: taken at the papers' clocks, not scaled.
pub const BYPASS_MESSAGE_NS: u64 = 50;

/// The network between machines: every node has one full-duplex NIC of `bandwidth_bits_per_s`
/// (its sends queue for its egress, what it receives for its ingress) and every message
/// crosses one switch hop of `latency_ns`. Clients sit on machines of their own whose NICs are
/// never the bottleneck.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub name: String,
    /// One way, wire and switch, without any host's CPU (that is in the [`CostTable`]).
    pub latency_ns: u64,
    pub bandwidth_bits_per_s: u64,
    /// NIC time per packet on top of its bytes (each message is one packet in the model).
    pub packet_ns: u64,
    /// The hosts reach it through a kernel-bypass stack (RDMA, DPDK): the cost table's
    /// per-message costs are [`CostTable::kernel_bypass`]'s (see [`Network::costs_for`]).
    #[serde(default)]
    pub kernel_bypass: bool,
}

impl Network {
    /// `10gbe`, `25gbe` or `100gbe`: Ethernet in one rack through the kernel's TCP stack,
    /// placeholder latencies (a switch hop and the wire, a few microseconds) and per-packet
    /// costs. `rdma`: the Hermes and HyperLoop testbeds' 56 Gb/s FDR InfiniBand through a
    /// kernel-bypass stack: 1.5 us one way (eRPC replicates a Raft entry in 5.5 us, client to
    /// leader to follower and back, four hops with their CPU; HyperLoop's gCAS through a chain
    /// of 3 takes 10 us on average, Table 2) and 8 ns per packet (a NIC of that generation
    /// handles about 130 million messages per second: Mellanox's Connect-IB announcement).
    pub fn preset(name: &str) -> Option<Network> {
        let (gbits, latency_ns, packet_ns, kernel_bypass) = match name {
            "10gbe" => (10, 5_000, 100, false),
            "25gbe" => (25, 3_000, 60, false),
            "100gbe" => (100, 2_000, 30, false),
            "rdma" => (56, 1_500, 8, true),
            _ => return None,
        };
        Some(Network {
            name: name.into(),
            latency_ns,
            bandwidth_bits_per_s: gbits * 1_000_000_000,
            packet_ns,
            kernel_bypass,
        })
    }

    pub const PRESETS: &'static [&'static str] = &["10gbe", "25gbe", "100gbe", "rdma"];

    /// `costs` as the hosts pay them on this network: [`CostTable::kernel_bypass`] on a
    /// kernel-bypass network, unchanged otherwise.
    pub fn costs_for(&self, costs: &CostTable) -> CostTable {
        if self.kernel_bypass {
            costs.kernel_bypass()
        } else {
            costs.clone()
        }
    }

    /// Loopback on one host: no wire, no NIC; the sender's CPU pays for the copy (the cost
    /// table's `byte_ps`) and the reader runs `wakeup_ns` later.
    pub fn loopback(costs: &CostTable) -> Network {
        Network {
            name: "loopback".into(),
            latency_ns: costs.wakeup_ns,
            bandwidth_bits_per_s: u64::MAX,
            packet_ns: 0,
            kernel_bypass: false,
        }
    }

    /// How long the NIC is busy sending or receiving one packet of `bytes`.
    pub fn wire_ns(&self, bytes: u64) -> u64 {
        assert!(self.bandwidth_bits_per_s > 0);
        let bits_ns = bytes as u128 * 8 * 1_000_000_000;
        let bandwidth = self.bandwidth_bits_per_s as u128;
        // Rounded to the nearest nanosecond, so an unbounded link costs nothing.
        self.packet_ns + ((bits_ns + bandwidth / 2) / bandwidth) as u64
    }
}
