//! Real TCP links on loopback: batching, broadcast, refusal of strangers, garbage, credits,
//! the challenge-response handshake as seen on the wire, silent links, and mutual TLS.
//! No timing assertions: every wait has a generous deadline and only guards against hangs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::WireMessage;
use chorus_core::{Destination, NodeId, NodeSet};
use chorus_net::{start, NetConfig, NetStats, Transport};
use support::{free_addr, mesh, note, towards, Note, DEADLINE, TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

type Node = (Transport<Note>, chorus_net::Inbound<Note>, std::sync::Arc<NetStats>);

async fn start_all(configs: Vec<NetConfig>) -> Vec<Node> {
    let mut nodes = Vec::new();
    for config in configs {
        nodes.push(start::<Note>(config).await.unwrap());
    }
    nodes
}

async fn cluster(n: u8, token_of: impl Fn(u8) -> &'static str) -> Vec<Node> {
    start_all(mesh(n, token_of)).await
}

/// Two nodes that know each other, each config adjusted by `tweak`.
async fn pair(tweak: impl Fn(&mut NetConfig)) -> Vec<Node> {
    let mut configs = mesh(2, |_| TOKEN);
    configs.iter_mut().for_each(tweak);
    start_all(configs).await
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
    let mut nodes = cluster(3, |_| TOKEN).await;
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
    let mut nodes = cluster(2, |me| if me == 1 { "guessed-token-guessed-token" } else { TOKEN }).await;
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
    let mut nodes = cluster(2, |_| TOKEN).await;
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
    let nowhere = free_addr(); // nothing listens there
    let mut config = towards(free_addr(), nowhere);
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
        let mut nodes = pair(|config| config.priority_lane = lane).await;
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

#[tokio::test]
async fn a_short_cluster_token_is_refused_at_start() {
    let config = support::config(0, "short", free_addr(), BTreeMap::new());
    let error = start::<Note>(config).await.err().expect("a 5-byte token must be refused");
    assert!(error.to_string().contains("at least 16"), "{error}");
}

/// What a dialer sends carries neither the token nor the cluster id: a fake acceptor that
/// records every byte of the exchange finds neither.
#[tokio::test]
async fn the_token_and_the_cluster_id_never_travel() {
    use chorus_core::codec::{decode_frame, encode_frame};
    use chorus_net::handshake::{self, Challenge};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = listener.local_addr().unwrap();
    let config = NetConfig::new(
        NodeId(0),
        "cluster-id-secret",
        TOKEN,
        "notes",
        free_addr(),
        BTreeMap::from([(NodeId(1), fake)]),
    );
    let (_transport, _inbound, _stats) = start::<Note>(config).await.unwrap();
    let (mut stream, _) = tokio::time::timeout(DEADLINE, listener.accept()).await.unwrap().unwrap();
    let mut received = BytesMut::new();
    // Read until the HELLO frame is complete.
    loop {
        let mut copy = received.clone();
        if let Some(hello) = decode_frame(&mut copy, 4096).unwrap() {
            assert_eq!(hello.kind, chorus_net::kind::HELLO);
            break;
        }
        assert!(stream.read_buf(&mut received).await.unwrap() > 0, "the dialer hung up");
    }
    let mut payload = BytesMut::new();
    Challenge { nonce: handshake::nonce().unwrap() }.encode(&mut payload);
    let mut out = BytesMut::new();
    encode_frame(chorus_net::kind::CHALLENGE, &payload, &mut out);
    stream.write_all(&out).await.unwrap();
    // Read until the proof (the second frame) is complete.
    loop {
        let mut copy = received.clone();
        let first = decode_frame(&mut copy, 4096).unwrap();
        if first.is_some() && decode_frame(&mut copy, 4096).unwrap().is_some() {
            break;
        }
        assert!(stream.read_buf(&mut received).await.unwrap() > 0, "the dialer hung up");
    }
    let wire = received.to_vec();
    let contains = |needle: &[u8]| wire.windows(needle.len()).any(|window| window == needle);
    assert!(!contains(TOKEN.as_bytes()), "the token went over the wire");
    assert!(!contains(b"cluster-id-secret"), "the cluster id went over the wire");
}

/// A peer that completes the handshake and then sends nothing (not even keepalives) is
/// dropped after the link timeout: a link cut by a partition does not stay open forever.
#[tokio::test]
async fn a_silent_inbound_link_is_closed() {
    let addrs = [free_addr(), free_addr()];
    let mut config = towards(addrs[0], addrs[1]);
    config.link_timeout = Duration::from_millis(300);
    let (_transport, _inbound, stats) = start::<Note>(config).await.unwrap();
    // Node 1's side of the handshake, by hand, then silence.
    let mut stream = tokio::net::TcpStream::connect(addrs[0]).await.unwrap();
    handshake_by_hand(&mut stream, NodeId(1), NodeId(0), "test", "notes").await;
    let mut buf = [0u8; 16];
    let read =
        tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await.expect("the link was never closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(stats.links_timed_out.load(Relaxed), 1);
}

/// An idle but healthy link stays up: keepalives fill the silence.
#[tokio::test]
async fn idle_links_stay_up_through_keepalives() {
    let nodes = pair(|config| config.link_timeout = Duration::from_millis(200)).await;
    wait_connected(&nodes).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    for (_, _, stats) in &nodes {
        assert_eq!(stats.links_timed_out.load(Relaxed), 0, "an idle link was taken for a dead one");
        assert_eq!(stats.peers.values().next().unwrap().connects.load(Relaxed), 1, "no redial");
    }
}

async fn handshake_by_hand(
    stream: &mut tokio::net::TcpStream,
    me: NodeId,
    peer: NodeId,
    cluster: &str,
    protocol: &str,
) {
    use chorus_core::codec::{decode_frame, encode_frame};
    use chorus_net::handshake::{self, Challenge, Hello, Proof, Role, Transcript};
    use chorus_net::kind;
    let hello = Hello { node: me, nonce: handshake::nonce().unwrap() };
    let send = |kind: u8, message: &dyn Fn(&mut BytesMut)| {
        let mut payload = BytesMut::new();
        message(&mut payload);
        let mut out = BytesMut::new();
        encode_frame(kind, &payload, &mut out);
        out
    };
    stream.write_all(&send(kind::HELLO, &|buf| hello.encode(buf))).await.unwrap();
    let mut buf = BytesMut::new();
    let challenge = loop {
        if let Some(frame) = decode_frame(&mut buf, 4096).unwrap() {
            assert_eq!(frame.kind, kind::CHALLENGE);
            break Challenge::decode_exact(frame.payload).unwrap();
        }
        assert!(stream.read_buf(&mut buf).await.unwrap() > 0);
    };
    let transcript = Transcript {
        cluster_id: cluster.as_bytes(),
        dialer: me,
        acceptor: peer,
        dialer_nonce: &hello.nonce,
        acceptor_nonce: &challenge.nonce,
        protocol: protocol.as_bytes(),
    };
    let proof = Proof {
        mac: handshake::mac(TOKEN.as_bytes(), Role::Dialer, &transcript),
        protocol: Bytes::copy_from_slice(protocol.as_bytes()),
    };
    stream.write_all(&send(kind::PROOF, &|buf| proof.encode(buf))).await.unwrap();
    loop {
        if let Some(frame) = decode_frame(&mut buf, 4096).unwrap() {
            assert_eq!(frame.kind, kind::WELCOME, "{:?}", String::from_utf8_lossy(&frame.payload));
            return;
        }
        assert!(stream.read_buf(&mut buf).await.unwrap() > 0);
    }
}

/// Test certificates: a CA and one certificate per node naming 127.0.0.1, made here so no key
/// is ever committed.
struct TestPki {
    dir: std::path::PathBuf,
    ca: rcgen::CertifiedKey,
}

impl TestPki {
    fn new() -> TestPki {
        let dir =
            std::env::temp_dir().join(format!("chorus-net-tls-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "chorus test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
        TestPki { dir, ca: rcgen::CertifiedKey { cert, key_pair: key } }
    }

    /// A certificate for `name` signed by `signer` (this CA unless another is given).
    fn issue(&self, name: &str, signer: Option<&rcgen::CertifiedKey>) -> chorus_net::tls::TlsFiles {
        let signer = signer.unwrap_or(&self.ca);
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &signer.cert, &signer.key_pair).unwrap();
        let (cert_file, key_file) =
            (self.dir.join(format!("{name}.pem")), self.dir.join(format!("{name}.key")));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        chorus_net::tls::TlsFiles { cert_file, key_file, ca_cert_file: Some(self.dir.join("ca.pem")) }
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// Mutual TLS on every peer connection: two nodes with certificates from one CA talk; a node
/// whose certificate another CA signed is refused, although it holds the right token.
#[tokio::test]
async fn tls_links_carry_batches_and_refuse_a_certificate_from_another_ca() {
    let pki = TestPki::new();
    let rogue_ca = {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertifiedKey { cert: params.self_signed(&key).unwrap(), key_pair: key }
    };
    let mut configs = mesh(3, |_| TOKEN);
    for (me, config) in configs.iter_mut().enumerate() {
        let signer = (me == 2).then_some(&rogue_ca);
        let files = pki.issue(&format!("n{me}"), signer);
        config.tls = Some(chorus_net::tls::PeerTls::load(&files).unwrap());
    }
    let node0_addr = configs[0].listen_addr;
    let mut nodes = start_all(configs).await;
    let (stats0, stats1) = (nodes[0].2.clone(), nodes[1].2.clone());
    wait_until(|| {
        stats0.peers[&NodeId(1)].connected.load(Relaxed) && stats1.peers[&NodeId(0)].connected.load(Relaxed)
    })
    .await;
    nodes[0].0.send_turn(&mut vec![(Destination::Node(NodeId(1)), note("over tls"))]);
    let (from, batch) = tokio::time::timeout(DEADLINE, nodes[1].1.recv()).await.unwrap().unwrap();
    assert_eq!((from, batch), (NodeId(0), vec![note("over tls")]));
    // The rogue node 2 gets nowhere, in either direction.
    wait_until(|| stats0.connections_refused.load(Relaxed) >= 1).await;
    assert!(!stats0.peers[&NodeId(2)].connected.load(Relaxed));
    assert!(!nodes[2].2.peers[&NodeId(0)].connected.load(Relaxed));
    // A plain-TCP dialer cannot talk to a TLS acceptor either.
    let mut plain = tokio::net::TcpStream::connect(node0_addr).await.unwrap();
    let _ = plain.write_all(b"CHORUS plain text").await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(DEADLINE, plain.read(&mut buf)).await.unwrap();
    assert!(!matches!(read, Ok(n) if n > 0 && buf[..n].starts_with(b"CHORUS")));
}

/// Pub/Sub frames: broadcast to every peer, handed to the receiving port's callback in the
/// order one sender queued them, never to the event loop; a peer whose link is down loses
/// them (counted) instead of getting them late.
#[tokio::test]
async fn pubsub_frames_reach_every_peer_in_order_and_a_peer_that_is_down_loses_them() {
    use std::sync::{Arc, Mutex};
    type Received = Arc<Mutex<Vec<(NodeId, Bytes)>>>;
    let received: Vec<Received> = (0..3).map(|_| Arc::default()).collect();
    let mut ports = Vec::new();
    let mut configs = mesh(3, |_| TOKEN);
    for (config, sink) in configs.iter_mut().zip(received.iter().cloned()) {
        let port = Arc::new(chorus_net::PubSubPort::new(move |from, payload| {
            sink.lock().unwrap().push((from, payload));
        }));
        config.pubsub = Some(port.clone());
        ports.push(port);
    }
    let mut nodes = start_all(configs).await;
    wait_connected(&nodes).await;
    for i in 0..100 {
        assert_eq!(ports[0].broadcast(format!("m{i}").as_bytes()), 2, "queued for both peers");
    }
    for node in [1, 2] {
        let got = received[node].clone();
        wait_until(move || got.lock().unwrap().len() == 100).await;
        let got = received[node].lock().unwrap().clone();
        let expected: Vec<(NodeId, Bytes)> =
            (0..100).map(|i| (NodeId(0), Bytes::from(format!("m{i}")))).collect();
        assert_eq!(got, expected, "node {node}: every frame, in order");
        assert!(nodes[node].1.try_recv().is_err(), "nothing reached the event loop's queue");
    }
    assert!(received[0].lock().unwrap().is_empty(), "a node does not hear itself");

    // A peer whose link is down loses what is published meanwhile, counted, never queued.
    let mut config = towards(free_addr(), free_addr());
    let lonely = Arc::new(chorus_net::PubSubPort::new(|_, _| {}));
    config.pubsub = Some(lonely.clone());
    let (_transport, _inbound, stats) = start::<Note>(config).await.unwrap();
    assert_eq!(lonely.broadcast(b"into the void"), 0);
    assert_eq!(lonely.dropped.load(Relaxed), 1);
    assert_eq!(stats.peers[&NodeId(1)].queued_bytes.load(Relaxed), 0, "nothing waits for the link");
}
