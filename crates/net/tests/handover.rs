//! Links handed over to an event loop that polls them itself (`start_handover` + `Links`, the
//! server's reactor): batches arrive whole and in order, one frame per turn and peer; frames
//! for a peer that is down are dropped and counted, and the link comes up once the peer does.
//! No timing assertions: every wait has a generous deadline and only guards against hangs.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::{Destination, NodeId};
use chorus_net::links::Links;
use chorus_net::{start_handover, InboundLink, LinkSink, NetConfig, OutboundLink};
use mio::{Events, Poll, Token, Waker};
use support::{mesh, note, Note, DEADLINE, TOKEN};

mod support;

const WAKER: Token = Token(0);

enum Handed {
    Out(OutboundLink),
    In(InboundLink),
}

struct Sink {
    queue: Mutex<Vec<Handed>>,
    waker: Waker,
}

impl LinkSink for Sink {
    fn outbound(&self, link: OutboundLink) {
        self.queue.lock().unwrap().push(Handed::Out(link));
        self.waker.wake().unwrap();
    }
    fn inbound(&self, link: InboundLink) {
        self.queue.lock().unwrap().push(Handed::In(link));
        self.waker.wake().unwrap();
    }
}

/// One node's event loop, pumped by the test.
struct Side {
    poll: Poll,
    events: Events,
    sink: Arc<Sink>,
    links: Links<Note>,
    received: Vec<(NodeId, Note)>,
}

impl Side {
    fn start(runtime: &tokio::runtime::Runtime, config: NetConfig) -> Side {
        let poll = Poll::new().unwrap();
        let waker = Waker::new(poll.registry(), WAKER).unwrap();
        let sink = Arc::new(Sink { queue: Mutex::new(Vec::new()), waker });
        let stats = runtime.block_on(start_handover::<Note>(config.clone(), sink.clone())).unwrap();
        let links = Links::new(&config, stats, 1);
        Side { poll, events: Events::with_capacity(64), sink, links, received: Vec::new() }
    }

    /// One pass of the loop: take handed links, read what is ready, write what is queued.
    fn pump(&mut self) {
        self.poll.poll(&mut self.events, Some(Duration::from_millis(2))).unwrap();
        let registry = self.poll.registry();
        let received = &mut self.received;
        let mut deliver =
            |from: NodeId, notes: Vec<Note>| received.extend(notes.into_iter().map(|n| (from, n)));
        for event in self.events.iter() {
            if event.token() == WAKER {
                for handed in std::mem::take(&mut *self.sink.queue.lock().unwrap()) {
                    match handed {
                        Handed::Out(link) => self.links.add_outbound(registry, link),
                        Handed::In(link) => self.links.add_inbound(registry, link, &mut deliver),
                    }
                }
            } else {
                let (readable, writable) =
                    (event.is_readable() || event.is_read_closed(), event.is_writable());
                self.links.on_event(registry, event.token(), readable, writable, &mut deliver);
            }
        }
        self.links.read_unfinished(registry, &mut deliver);
        self.links.on_timer(registry);
        self.links.flush(registry);
    }
}

fn configs() -> [NetConfig; 2] {
    let mut configs = mesh(2, |_| TOKEN).into_iter();
    let first = configs.next().expect("the mesh has a first configuration");
    let second = configs.next().expect("the mesh has a second configuration");
    [first, second]
}

fn pump_until(sides: &mut [&mut Side], mut done: impl FnMut(&[&mut Side]) -> bool) {
    let start = Instant::now();
    while !done(sides) {
        assert!(start.elapsed() < DEADLINE, "condition not reached before the deadline");
        for side in sides.iter_mut() {
            side.pump();
        }
    }
}

fn connected(side: &Side) -> bool {
    side.links.stats().peers.values().all(|peer| peer.connected.load(Relaxed))
}

#[test]
fn turns_arrive_in_order_one_frame_per_turn() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let [config0, config1] = configs();
    let mut a = Side::start(&runtime, config0);
    let mut b = Side::start(&runtime, config1);
    // Both directions up: each side dialled the other and accepted the other's link.
    pump_until(&mut [&mut a, &mut b], |sides| sides.iter().all(|side| connected(side)));
    for turn in 0..50 {
        let mut messages: Vec<(Destination, Note)> =
            (0..4).map(|i| (Destination::Node(NodeId(1)), note(&format!("{turn}.{i}")))).collect();
        a.links.send_turn(&mut messages);
        assert!(messages.is_empty(), "a turn's messages are taken");
        a.pump();
    }
    pump_until(&mut [&mut a, &mut b], |sides| sides[1].received.len() == 200);
    let expected: Vec<(NodeId, Note)> =
        (0..50).flat_map(|turn| (0..4).map(move |i| (NodeId(0), note(&format!("{turn}.{i}"))))).collect();
    assert_eq!(b.received, expected, "every message, in the order sent");
    let sent = a.links.stats().peers[&NodeId(1)].snapshot();
    assert_eq!((sent.frames_sent, sent.messages_sent), (50, 200), "one batch frame per turn");
    let heard = b.links.stats().peers[&NodeId(0)].snapshot();
    assert_eq!((heard.frames_received, heard.messages_received), (50, 200));
}

#[test]
fn frames_for_a_peer_not_up_yet_wait_for_its_link_and_go_stale_after_the_link_timeout() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let [config0, config1] = configs();
    let mut a = Side::start(&runtime, config0);
    // Node 1 is not running: a frame waits for its link for the link timeout (1 s, as the
    // writer tasks keep theirs until a dial fails), then is dropped, counted.
    let mut messages = vec![(Destination::Node(NodeId(1)), note("stale"))];
    a.links.send_turn(&mut messages);
    a.pump();
    let stats = a.links.stats().peers[&NodeId(1)].snapshot();
    assert_eq!((stats.frames_dropped, stats.messages_dropped), (0, 0));
    assert!(stats.queued_bytes > 0, "{stats:?}");
    pump_until(&mut [&mut a], |sides| sides[0].links.stats().peers[&NodeId(1)].snapshot().frames_dropped > 0);
    let stats = a.links.stats().peers[&NodeId(1)].snapshot();
    assert_eq!((stats.frames_dropped, stats.messages_dropped, stats.queued_bytes), (1, 1, 0));

    // A frame sent just before node 1 starts waits, and arrives first once the link is up (a
    // node's first messages, raftlog's Hello, are sent before its dialers have connected).
    let mut messages = vec![(Destination::Node(NodeId(1)), note("early"))];
    a.links.send_turn(&mut messages);
    a.pump();
    let mut b = Side::start(&runtime, config1);
    pump_until(&mut [&mut a, &mut b], |sides| connected(sides[0]));
    let mut messages = vec![(Destination::Node(NodeId(1)), note("kept"))];
    a.links.send_turn(&mut messages);
    pump_until(&mut [&mut a, &mut b], |sides| sides[1].received.len() == 2);
    assert_eq!(b.received, vec![(NodeId(0), note("early")), (NodeId(0), note("kept"))]);
}
