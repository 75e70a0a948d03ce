//! Real TCP links on loopback: batching, broadcast, refusal of strangers, garbage, credits.
//! No timing assertions: every wait has a generous deadline and only guards against hangs.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Destination, NodeId, NodeSet};
use chorus_net::{start, NetConfig, NetStats, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Debug, PartialEq, Eq)]
struct Note(Bytes);

impl WireMessage for Note {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_bytes_prefixed(&self.0);
    }
    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Note(reader.bytes()?))
    }
}

fn note(text: &str) -> Note {
    Note(Bytes::copy_from_slice(text.as_bytes()))
}

fn free_addr() -> SocketAddr {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

const DEADLINE: Duration = Duration::from_secs(20);

type Node = (Transport<Note>, chorus_net::Inbound<Note>, std::sync::Arc<NetStats>);

async fn cluster(n: u8, token_of: impl Fn(u8) -> &'static str) -> Vec<Node> {
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    let mut nodes = Vec::new();
    for me in 0..n {
        let peers: BTreeMap<NodeId, SocketAddr> =
            (0..n).filter(|p| *p != me).map(|p| (NodeId(p), addrs[p as usize])).collect();
        let config = NetConfig::new(NodeId(me), "test", token_of(me), "notes", addrs[me as usize], peers);
        nodes.push(start::<Note>(config).await.unwrap());
    }
    nodes
}

async fn wait_until(mut condition: impl FnMut() -> bool) {
    tokio::time::timeout(DEADLINE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("condition not reached before the deadline");
}

async fn wait_connected(nodes: &[Node]) {
    for (_, _, stats) in nodes {
        let stats = stats.clone();
        wait_until(move || stats.connected_peers() == stats.peers.len()).await;
    }
}

#[tokio::test]
async fn one_turn_is_one_batch_per_peer_and_broadcasts_reach_everyone() {
    let mut nodes = cluster(3, |_| "secret").await;
    wait_connected(&nodes).await;
    let everyone: NodeSet = [NodeId(1), NodeId(2)].into_iter().collect();
    let mut turn = vec![
        (Destination::Nodes(everyone), note("inv")),
        (Destination::Node(NodeId(1)), note("only-1")),
        (Destination::Node(NodeId(2)), note("only-2")),
        (Destination::Nodes(everyone), note("val")),
    ];
    nodes[0].0.send_turn(&mut turn);
    assert!(turn.is_empty(), "send_turn drains the turn");
    let (from, batch) = tokio::time::timeout(DEADLINE, nodes[1].1.recv()).await.unwrap().unwrap();
    assert_eq!(from, NodeId(0));
    assert_eq!(batch, vec![note("inv"), note("only-1"), note("val")], "one frame, in order");
    let (_, batch) = tokio::time::timeout(DEADLINE, nodes[2].1.recv()).await.unwrap().unwrap();
    assert_eq!(batch, vec![note("inv"), note("only-2"), note("val")]);
    let peer1 = nodes[0].2.peers[&NodeId(1)].clone();
    wait_until(move || peer1.frames_sent.load(Relaxed) == 1).await;
    assert_eq!(nodes[0].2.peers[&NodeId(1)].messages_sent.load(Relaxed), 3);
}

#[tokio::test]
async fn a_node_with_the_wrong_token_is_refused() {
    let mut nodes = cluster(2, |me| if me == 1 { "guessed" } else { "secret" }).await;
    let stats0 = nodes[0].2.clone();
    wait_until(move || stats0.connections_refused.load(Relaxed) >= 1).await;
    let stats1 = nodes[1].2.clone();
    wait_until(move || stats1.connections_refused.load(Relaxed) >= 1).await;
    assert_eq!(nodes[0].2.connected_peers(), 0);
    nodes[1].0.send_turn(&mut vec![(Destination::Node(NodeId(0)), note("let me in"))]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(nodes[0].1.try_recv().is_err(), "nothing from a stranger is delivered");
}

#[tokio::test]
async fn garbage_on_the_peer_port_closes_only_that_connection() {
    let mut nodes = cluster(2, |_| "secret").await;
    wait_connected(&nodes).await;
    // Node 0's peer port, as node 1 knows it.
    let node0_addr: SocketAddr = nodes[1].2.peers[&NodeId(0)].addr.parse().unwrap();
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xff; 64][..], &[0, 0, 0, 0][..]] {
        let mut stream = tokio::net::TcpStream::connect(node0_addr).await.unwrap();
        stream.write_all(junk).await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await.unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "the node closes a connection that sends garbage");
    }
    // The real peer is still served.
    nodes[1].0.send_turn(&mut vec![(Destination::Node(NodeId(0)), note("still here"))]);
    let (_, batch) = tokio::time::timeout(DEADLINE, nodes[0].1.recv()).await.unwrap().unwrap();
    assert_eq!(batch, vec![note("still here")]);
    assert!(nodes[0].2.connections_refused.load(Relaxed) >= 3);
}

#[tokio::test]
async fn an_unreachable_peer_cannot_grow_memory_without_bound() {
    let me = free_addr();
    let nowhere = free_addr(); // nothing listens there
    let mut config =
        NetConfig::new(NodeId(0), "test", "secret", "notes", me, BTreeMap::from([(NodeId(1), nowhere)]));
    config.peer_queue_bytes_max = 4096;
    let (mut transport, _inbound, stats) = start::<Note>(config).await.unwrap();
    let big = Note(Bytes::from(vec![7u8; 1000]));
    for _ in 0..1000 {
        transport.send_turn(&mut vec![(Destination::Node(NodeId(1)), big.clone())]);
        let queued = stats.peers[&NodeId(1)].queued_bytes.load(Relaxed);
        assert!(queued <= 4096 + 2000, "queue grew to {queued} bytes");
    }
    assert!(stats.peers[&NodeId(1)].frames_dropped.load(Relaxed) > 0);
}

/// The priority lane: marked messages travel on their own connection and are read before
/// data that arrived earlier, so a heartbeat never waits behind a backlog.
#[tokio::test]
async fn priority_messages_overtake_queued_data() {
    for lane in [true, false] {
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for me in 0..2u8 {
            let other = 1 - me;
            let peers = BTreeMap::from([(NodeId(other), addrs[other as usize])]);
            let mut config = NetConfig::new(NodeId(me), "test", "secret", "notes", addrs[me as usize], peers);
            config.priority_lane = lane;
            nodes.push(start::<Note>(config).await.unwrap());
        }
        wait_connected(&nodes).await;
        nodes[0].0.set_priority(|note| note.0.starts_with(b"hb"));
        let received = nodes[1].2.peers[&NodeId(0)].clone();
        for i in 0..50 {
            nodes[0].0.send_turn(&mut vec![(Destination::Node(NodeId(1)), note(&format!("data-{i}")))]);
        }
        wait_until(|| received.messages_received.load(Relaxed) == 50).await;
        nodes[0].0.send_turn(&mut vec![(Destination::Node(NodeId(1)), note("hb"))]);
        wait_until(|| received.messages_received.load(Relaxed) == 51).await;
        let (_, first) = tokio::time::timeout(DEADLINE, nodes[1].1.recv()).await.unwrap().unwrap();
        if lane {
            assert_eq!(first, vec![note("hb")], "the heartbeat is read first");
        } else {
            assert_eq!(first, vec![note("data-0")], "without the lane it waits its turn");
        }
    }
}
