//! Timing the real protocol cores' handlers on this machine, for `chorus model calibrate`:
//! the protocol-thread part of the cost table (`handle_ns`, `key_op_ns`), measured on the
//! same code the server runs, without its I/O.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use chorus_core::{ClientRequestId, Command, NodeId, NodeSet, Outbox, Replica, Time};
use chorus_hermes::{Hermes, HermesConfig};
use serde::Serialize;

use crate::rng::Rng;

/// Mean wall time per handler call, in nanoseconds, and how many calls were timed.
#[derive(Clone, Debug, Serialize)]
pub struct HandlerTiming {
    pub protocol: String,
    pub client_calls: u64,
    pub client_ns_mean: f64,
    pub message_calls: u64,
    pub message_ns_mean: f64,
}

/// Drive three Hermes replicas through `operations` client commands (half writes, uniform
/// over `keys` keys of `value_bytes` values), delivering every message at once, and time each
/// `on_client` and `on_message` call. Hermes is the calibration's protocol: the cost table is
/// one per machine, and Hermes' handlers are the middle of the four protocols' (a write is
/// one INV and one ACK per follower, a read a local lookup).
pub fn time_hermes_handlers(operations: u64, keys: u64, value_bytes: usize) -> HandlerTiming {
    assert!(operations > 0 && keys > 0);
    let all: NodeSet = (0..3u8).map(NodeId).collect();
    let mut replicas: Vec<Hermes> =
        (0..3u8).map(|node| Hermes::new(HermesConfig::new(NodeId(node), all))).collect();
    let mut timing = Totals::default();
    let mut rng = Rng::new(7);
    let value = Bytes::from(vec![b'v'; value_bytes]);
    let mut outbox = Outbox::default();
    let mut queue = VecDeque::new();
    for operation in 0..operations {
        let now = Time::from_nanos(operation * 1_000);
        let node = (operation % 3) as usize;
        let key = Bytes::from(format!("key:{:010}", rng.below(keys)));
        let command = if rng.below(2) == 0 {
            Command::Write { key, value: Some(value.clone()) }
        } else {
            Command::Read { key }
        };
        let started = Instant::now();
        replicas[node].on_client(now, ClientRequestId(operation), command, &mut outbox);
        timing.client(started);
        deliver(&mut replicas, NodeId(node as u8), &mut outbox, &mut queue, now, &mut timing);
    }
    timing.timing("hermes")
}

/// Time `protocol`'s own handlers: the model runs its real cores (3 one-core nodes, 16
/// closed-loop clients, 20% writes over `keys` keys of `value_bytes` values, as `chorus model
/// compare` loads a cluster), every `on_client` and `on_message` timed in wall-clock time. The
/// messages and their batching are the protocol's own, as the server's turns give them.
pub fn time_protocol_handlers(
    protocol: &str,
    keys: u64,
    value_bytes: usize,
) -> Result<HandlerTiming, String> {
    let network = super::Network::preset("10gbe").expect("a preset");
    let mut config = super::ModelConfig::new(protocol, 3, 1, network, 16);
    let mut workload = super::Workload::named("kv-w20").expect("a workload");
    workload.keys = keys;
    workload.value_bytes = value_bytes;
    config.workload = workload;
    config.time_handlers = true;
    let report = super::predict(&config)?;
    report.handlers.ok_or_else(|| "the model timed no handler".to_string())
}

/// Wall time spent in the cores' handlers, and their calls.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Totals {
    client_calls: u64,
    client_ns: u64,
    message_calls: u64,
    message_ns: u64,
}

impl Totals {
    pub(super) fn timing(&self, protocol: &str) -> HandlerTiming {
        HandlerTiming {
            protocol: protocol.into(),
            client_calls: self.client_calls,
            client_ns_mean: self.client_ns as f64 / self.client_calls.max(1) as f64,
            message_calls: self.message_calls,
            message_ns_mean: self.message_ns as f64 / self.message_calls.max(1) as f64,
        }
    }

    pub(super) fn client(&mut self, started: Instant) {
        self.client_calls += 1;
        self.client_ns += started.elapsed().as_nanos() as u64;
    }

    pub(super) fn message(&mut self, started: Instant) {
        self.message_calls += 1;
        self.message_ns += started.elapsed().as_nanos() as u64;
    }

    /// The end of a turn: its work counts with the turn's messages (no call of its own).
    pub(super) fn turn_end(&mut self, started: Instant) {
        self.message_ns += started.elapsed().as_nanos() as u64;
    }
}

/// Deliver `from`'s outbox and everything it causes, in order, timing each handler.
fn deliver<P: Replica>(
    replicas: &mut [P],
    from: NodeId,
    outbox: &mut Outbox<P::Message>,
    queue: &mut VecDeque<(NodeId, NodeId, P::Message)>,
    now: Time,
    timing: &mut Totals,
) where
    P::Message: Clone,
{
    let enqueue = |from: NodeId, outbox: &mut Outbox<P::Message>, queue: &mut VecDeque<_>| {
        outbox.replies.clear();
        for (destination, message) in outbox.messages.drain(..) {
            for to in destination.nodes().iter() {
                queue.push_back((from, to, message.clone()));
            }
        }
    };
    enqueue(from, outbox, queue);
    while let Some((from, to, message)) = queue.pop_front() {
        let started = Instant::now();
        replicas[to.index()].on_message(now, from, message, outbox);
        timing.message(started);
        enqueue(to, outbox, queue);
    }
}
