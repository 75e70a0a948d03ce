//! The performance model's laws: each test compares a prediction with what the model's own
//! parameters say it must be (never with wall-clock timings).

use bytes::Bytes;
use chorus_core::{Command, Time};
use chorus_sim::model::{
    predict, predict_with, resp_request_bytes, CostTable, Load, ModelConfig, ModelReport, Network,
    ProtocolHandlers, Workload, Zipfian,
};

/// A network that costs only its latency.
fn latency_only(latency_ns: u64) -> Network {
    Network {
        name: "test".into(),
        latency_ns,
        bandwidth_bits_per_s: u64::MAX,
        packet_ns: 0,
        kernel_bypass: false,
    }
}

fn config(
    protocol: &str,
    nodes: usize,
    cores: u32,
    network: Network,
    clients: u32,
    writes: u32,
) -> ModelConfig {
    let mut config = ModelConfig::new(protocol, nodes, cores, network, clients);
    config.costs = CostTable::zero();
    // Hermes elects nothing: a short warm-up keeps the tests fast.
    config.warmup = Time::from_millis(20);
    config.duration = Time::from_millis(100);
    config.workload = Workload::named(&format!("kv-w{writes}")).expect("a workload");
    config
}

/// 64 clients on a loopback host of 2 cores shared by 3 nodes and the load generator, with
/// per-event costs of this machine's order (the comparison's setting, issue 21 point 2).
fn loaded_loopback(protocol: &str, writes: u32, handle_ns: u64) -> ModelConfig {
    let mut config = config(protocol, 3, 1, latency_only(10_000), 64, writes);
    config.host_cores = Some(2);
    config.costs.client_request_ns = 4_600;
    config.costs.reply_sent_ns = 4_600;
    config.costs.message_received_ns = 5_800;
    config.costs.message_sent_ns = 5_800;
    config.costs.handle_ns = handle_ns;
    config.costs.client_op_ns = 11_300;
    config
}

fn run(config: &ModelConfig) -> ModelReport {
    let report = predict(config).expect("a valid configuration");
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(report.ops_measured > 0, "{report:?}");
    report
}

fn assert_close(actual: f64, expected: f64, tolerance: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= expected * tolerance,
        "{what}: {actual:.1}, expected {expected:.1} within {:.0}%",
        tolerance * 100.0
    );
}

/// With every CPU cost zero and unbounded links, only the latency remains: a Hermes write is
/// the client's hop, INV, ACK and the reply's hop (4 one-way latencies), a read the two
/// client hops; what the correctness simulator would give on a network of fixed delay.
#[test]
fn zero_costs_leave_the_protocol_round_trips() {
    let latency_ns = 10_000;
    let writes = run(&config("hermes", 3, 1, latency_only(latency_ns), 1, 100));
    assert_eq!(writes.latency.p50_us, 4.0 * latency_ns as f64 / 1e3, "{writes:?}");
    assert_eq!(writes.latency.p99_us, writes.latency.p50_us, "{writes:?}");
    let reads = run(&config("hermes", 3, 1, latency_only(latency_ns), 1, 0));
    assert_eq!(reads.latency.p99_us, 2.0 * latency_ns as f64 / 1e3, "{reads:?}");
    // One closed-loop client completes one operation per round trip.
    assert_close(reads.throughput_ops_per_s, 1e9 / (2 * latency_ns) as f64, 0.01, "1-client reads/s");
}

/// One node of `cores` serving 64 clients' reads, where `charge` sets the only cost.
fn read_throughput(cores: u32, charge: fn(&mut CostTable)) -> f64 {
    let mut config = config("hermes", 1, cores, latency_only(1_000), 64, 0);
    charge(&mut config.costs);
    run(&config).throughput_ops_per_s
}

/// Receiving a client request runs on any core: with that the only cost, a node's
/// throughput is cores / cost, so doubling the cores doubles it.
#[test]
fn doubling_the_cores_doubles_a_parallel_cpu_bound_throughput() {
    let cost_ns = 10_000;
    let throughput = |cores| read_throughput(cores, |costs| costs.client_request_ns = 10_000);
    let (one, two, four) = (throughput(1), throughput(2), throughput(4));
    assert_close(one, 1e9 / cost_ns as f64, 0.02, "1 core");
    assert_close(two, 2.0 * one, 0.02, "2 cores");
    assert_close(four, 4.0 * one, 0.02, "4 cores");
}

/// The protocol core runs on one thread, as in the server: when handling is the cost, more
/// cores do not help.
#[test]
fn the_protocol_thread_is_serial_whatever_the_cores() {
    let cost_ns = 10_000;
    let throughput = |cores| read_throughput(cores, |costs| costs.key_op_ns = 10_000);
    let one = throughput(1);
    assert_close(one, 1e9 / cost_ns as f64, 0.02, "1 core");
    assert_close(throughput(4), one, 0.02, "4 cores");
}

/// Requests of 100 KB on a 1 Gb/s link: the node's ingress NIC admits one request per
/// `wire_ns(request bytes)`, and nothing else costs anything.
#[test]
fn a_saturated_link_caps_throughput_at_bandwidth_over_message_size() {
    let network = Network {
        name: "1gbe".into(),
        latency_ns: 5_000,
        bandwidth_bits_per_s: 1_000_000_000,
        packet_ns: 1_000,
        kernel_bypass: false,
    };
    let mut config = config("hermes", 1, 1, network.clone(), 16, 100);
    config.workload.value_bytes = 100_000;
    let report = run(&config);
    let request =
        Command::Write { key: Bytes::from("key:000000000000"), value: Some(Bytes::from(vec![0; 100_000])) };
    let expected = 1e9 / network.wire_ns(resp_request_bytes(&request)) as f64;
    assert_close(report.throughput_ops_per_s, expected, 0.02, "link-bound writes/s");
    assert!(report.nic_utilisation_max > 0.9, "{report:?}");
    // Ten times the bandwidth: ten times the throughput, still link-bound.
    config.network.bandwidth_bits_per_s *= 10;
    let faster = run(&config);
    let expected = 1e9 / config.network.wire_ns(resp_request_bytes(&request)) as f64;
    assert_close(faster.throughput_ops_per_s, expected, 0.02, "10x link");
}

/// An open loop below capacity completes what it offers.
#[test]
fn an_open_loop_below_capacity_completes_its_offered_rate() {
    let mut config = config("hermes", 3, 2, latency_only(5_000), 16, 20);
    config.load = Load::Open { ops_per_s: 50_000 };
    config.duration = Time::from_millis(400);
    let report = run(&config);
    // 20,000 Poisson arrivals in the window: 5% is about 7 standard deviations.
    assert_close(report.throughput_ops_per_s, 50_000.0, 0.05, "open loop");
}

/// Every protocol serves a 3-node cluster with the placeholder costs, without errors once
/// warmed up (Raft and ZAB leaders elected), and a run is deterministic.
#[test]
fn every_protocol_serves_and_replays_exactly() {
    for protocol in chorus_sim::model::PROTOCOLS {
        let mut config = ModelConfig::new(protocol, 3, 4, Network::preset("25gbe").expect("preset"), 4);
        // Raftlog's leaders are elected after 100-160 ms.
        config.warmup = Time::from_millis(250);
        config.duration = Time::from_millis(20);
        let report = run(&config);
        assert!(report.throughput_ops_per_s > 10_000.0, "{report:?}");
        let again = predict(&config).expect("valid");
        assert_eq!(
            serde_json::to_string(&report).expect("json"),
            serde_json::to_string(&again).expect("json"),
            "{protocol} is not deterministic"
        );
    }
}

/// A turn takes every event waiting and sends its messages to one peer as ONE frame, as the
/// server does. With only a per-frame receive cost, 3 one-core Hermes nodes under 64 writing
/// clients would admit 1 s / (2 frames per node per write x 10 us) = 50 000 writes/s if each
/// message were its own frame; batched, a frame carries many INVs, ACKs and VALs.
#[test]
fn a_turn_sends_one_frame_per_peer() {
    let mut config = config("hermes", 3, 1, latency_only(5_000), 64, 100);
    config.costs.message_received_ns = 10_000;
    let report = run(&config);
    let unbatched_ops_per_s = 1e9 / (2.0 * 10_000.0);
    assert!(report.throughput_ops_per_s > 2.0 * unbatched_ops_per_s, "{report:?}");
}

/// A one-thread node runs as the server's reactor, in passes: a poll, the requests that had
/// arrived by then, one turn, the replies. Two closed-loop clients on one node, a request
/// costing 10 us to receive and everything 3 us away, do not arrive together (they start at
/// random in the first millisecond): each arrives while the node receives the other's, so
/// each waits for the next pass and every turn answers one request, the node always busy
/// (100 000 reads/s). Receiving until nothing is left before a turn would merge the two into
/// one turn for good (half a turn per read).
#[test]
fn a_one_thread_node_answers_in_a_turn_what_its_poll_found() {
    let mut config = config("hermes", 1, 1, latency_only(3_000), 2, 0);
    config.costs.client_request_ns = 10_000;
    let report = run(&config);
    assert_close(report.throughput_ops_per_s, 100_000.0, 0.02, "a busy node");
    // Ticks take a few turns of their own (1 000 per second).
    assert_close(report.turns_per_op, 1.0, 0.03, "turns per read");
}

/// A table's per-protocol handler figures replace its own `handle_ns` and `key_op_ns` for
/// that protocol only (`zab-local` takes ZAB's), and scale with the table: one node whose
/// only cost is the handler serves 1 s / handler reads.
#[test]
fn a_protocols_own_handlers_replace_the_tables() {
    let reads = |protocol: &str, costs: &CostTable| {
        let mut config = config(protocol, 1, 1, latency_only(1_000), 64, 0);
        config.warmup = Time::from_millis(300);
        config.costs = costs.clone();
        run(&config).throughput_ops_per_s
    };
    let mut costs = CostTable::zero();
    costs.handle_ns = 5_000;
    assert_close(reads("hermes", &costs), 200_000.0, 0.03, "the table's handler");
    let own = |handle_ns| ProtocolHandlers { handle_ns, key_op_ns: 0 };
    costs.handlers.insert("hermes".into(), own(10_000));
    costs.handlers.insert("zab".into(), own(20_000));
    assert_close(reads("hermes", &costs), 100_000.0, 0.03, "Hermes' own handler");
    assert_close(reads("craq", &costs), 200_000.0, 0.03, "CRAQ has none of its own");
    assert_close(reads("zab-local", &costs), 50_000.0, 0.03, "ZAB's, for its local reads");
    assert_close(reads("hermes", &costs.at_cpu_share(0.5)), 50_000.0, 0.03, "at half the CPU");
}

/// Timing the handlers (for calibration) reads the wall clock around every call and
/// changes nothing of the prediction.
#[test]
fn timing_the_handlers_leaves_the_prediction_alone() {
    let mut config = config("hermes", 3, 1, latency_only(1_000), 16, 20);
    config.costs = CostTable::placeholder();
    let plain = run(&config);
    config.time_handlers = true;
    let timed = run(&config);
    let handlers = timed.handlers.clone().expect("timed");
    assert!(handlers.client_calls > 0 && handlers.message_calls > 0, "{handlers:?}");
    assert!(handlers.client_ns_mean > 0.0 && handlers.message_ns_mean > 0.0, "{handlers:?}");
    assert_eq!(plain.throughput_ops_per_s, timed.throughput_ops_per_s);
    assert_eq!(plain.latency, timed.latency);
    assert!(plain.handlers.is_none());
}

/// Raftlog syncs once per turn, not once per write: with a 100 us sync the only cost, one
/// client gets at most 10 000 writes/s out of the leader, 64 clients many times that.
#[test]
fn a_turn_syncs_once_whatever_it_holds() {
    let mut config = config("raftlog", 3, 1, latency_only(5_000), 1, 100);
    config.warmup = Time::from_millis(300);
    config.costs.sync_ns = 100_000;
    let one = run(&config);
    assert!(one.throughput_ops_per_s < 10_000.0, "{one:?}");
    config.clients = 64;
    let many = run(&config);
    assert!(many.throughput_ops_per_s > 4.0 * one.throughput_ops_per_s, "{one:?} {many:?}");
}

/// Only a turn that syncs pays `sync_ns`: raftlog leaves a turn that only moves commit
/// indexes written but unsynced (the leader taking acknowledgements, the origin told of the
/// commit). One client's write, with syncs the only cost, waits for the leader's append and
/// the followers' (in parallel): two syncs, not the three or four a sync per written turn
/// would make it.
#[test]
fn only_a_turn_that_syncs_pays_for_it() {
    let mut config = config("raftlog", 3, 1, latency_only(0), 1, 100);
    config.warmup = Time::from_millis(300);
    config.costs.sync_ns = 1_000_000;
    let report = run(&config);
    assert_close(report.write_latency.p50_us, 2_000.0, 0.1, "a write's p50 in us");
}

/// The model runs raftlog as the server does: its logs flushed once per event-loop turn
/// (`raftlog_flush_per_turn`), so under load an entry carries what a whole turn collected and
/// fewer Raft messages go per operation than when every call flushes (the real server sent
/// 3.98 per operation at 64 clients in session 24; the model flushing per call sent 5.06,
/// per turn 3.91). And a turn that syncs writes what may leave before its sync (a leader's
/// appends, a follower's forwards) in frames of their own, ahead of its others, as the
/// server's `send_before_sync`: with clients at every node a follower's syncing turn sends
/// its leader two frames, forwards then answers (real 0.97 frames per operation at 64
/// clients, the model 0.59 without the split and 0.89 with it).
#[test]
fn raftlog_flushes_once_a_turn_and_sends_its_early_messages_in_frames_of_their_own() {
    let mut config = loaded_loopback("raftlog", 20, 1_400);
    let server_like = run(&config);
    config.split_frames_at_sync = false;
    let one_frame_a_turn = run(&config);
    assert_close(server_like.messages_per_op, one_frame_a_turn.messages_per_op, 0.05, "messages per op");
    assert!(
        server_like.frames_per_op > 1.15 * one_frame_a_turn.frames_per_op,
        "early frames apart: {} frames per op, together: {}",
        server_like.frames_per_op,
        one_frame_a_turn.frames_per_op
    );
    config.split_frames_at_sync = true;
    config.raftlog_flush_per_turn = false;
    let flush_per_call = run(&config);
    eprintln!(
        "per op: server-like {:.3} messages {:.3} frames; early frames together {:.3} frames; flushed per call {:.3} messages",
        server_like.messages_per_op,
        server_like.frames_per_op,
        one_frame_a_turn.frames_per_op,
        flush_per_call.messages_per_op
    );
    assert!(
        flush_per_call.messages_per_op > 1.1 * server_like.messages_per_op,
        "flushing per call: {} messages per op, per turn: {}",
        flush_per_call.messages_per_op,
        server_like.messages_per_op
    );
}

/// With `writes_one_by_one` a send stage's replies leave as each is written. One node that
/// only pays `reply_sent_ns` (10 us) serves 150 clients 1 ms away (three quarters busy).
/// With the replies at the stage's end, a turn's replies reach their clients together, come
/// back together and make the next turn as big: a convoy, every read waiting for a whole
/// turn's replies (hundreds of us). One by one, the replies leave 10 us apart, the requests
/// come back 10 us apart, and each read takes its two hops and its own reply (2 010 us).
#[test]
fn replies_written_one_by_one_leave_before_the_stage_ends() {
    let mut config = config("hermes", 1, 1, latency_only(1_000_000), 150, 0);
    config.costs.reply_sent_ns = 10_000;
    let at_the_end = run(&config);
    config.writes_one_by_one = true;
    let one_by_one = run(&config);
    assert!(at_the_end.latency.p50_us > 2_200.0, "{at_the_end:?}");
    assert_close(one_by_one.latency.p50_us, 2_010.0, 0.002, "p50 in us, replies one by one");
}

/// On a loopback host the load generator writes a node's clients' next requests while the
/// node still writes its replies: with each reply leaving as it is written, the requests
/// reach the node over several polls instead of in one burst, so its turns are smaller and
/// more frequent and it sends more frames per write (the real server sends 1.3-1.9x the
/// model's at 64 clients; docs/benchmarks.md, "Session 20").
#[test]
fn replies_one_by_one_spread_requests_over_more_smaller_turns() {
    let mut config = loaded_loopback("hermes", 100, 400);
    let at_the_end = run(&config);
    config.writes_one_by_one = true;
    let one_by_one = run(&config);
    assert!(one_by_one.frames_per_op > 1.15 * at_the_end.frames_per_op, "{one_by_one:?} {at_the_end:?}");
    assert!(one_by_one.turns_per_op > at_the_end.turns_per_op, "{one_by_one:?} {at_the_end:?}");
}

/// On a shared host (a loopback run) the nodes and the load generator draw on the same
/// cores: three one-thread nodes with a 10 us receive cost serve 100 000 reads/s on one
/// core, 300 000 on three; the load generator's own cost takes its share of the same cores.
#[test]
fn a_shared_host_divides_its_cores_among_nodes_and_clients() {
    let reads = |host_cores: u32, client_op_ns: u64| {
        let mut config = config("hermes", 3, 1, latency_only(1_000), 64, 0);
        config.host_cores = Some(host_cores);
        config.costs.client_request_ns = 10_000;
        config.costs.client_op_ns = client_op_ns;
        run(&config).throughput_ops_per_s
    };
    assert_close(reads(1, 0), 100_000.0, 0.03, "1 shared core");
    assert_close(reads(3, 0), 300_000.0, 0.03, "3 shared cores");
    // 10 us of the server and 10 us of the load generator per read, on one core.
    assert_close(reads(1, 10_000), 50_000.0, 0.03, "1 shared core with the client's cost");
}

/// The load generator on a shared host is a runtime of one thread per core, and a thread
/// that finds nothing to do sleeps: a request that finds none of them running pays `wake_ns`
/// before its `client_op_ns`. One client wakes it for every operation (the generator's wake,
/// its cost, a hop, the node's wake, a hop); 64 clients keep its threads busy, so they go from
/// one reply to the next without sleeping and the generator's CPU per operation falls towards
/// `client_op_ns`.
#[test]
fn the_load_generator_wakes_when_idle_and_not_under_load() {
    let mut config = config("hermes", 3, 1, latency_only(1_000), 1, 0);
    config.host_cores = Some(2);
    config.costs.client_request_ns = 5_000;
    config.costs.client_op_ns = 2_000;
    config.costs.wake_ns = 20_000;
    let one = run(&config);
    assert_eq!(one.latency.p50_us, 20.0 + 2.0 + 1.0 + 20.0 + 5.0 + 1.0, "{one:?}");
    assert_close(one.client_wakes_per_op, 1.0, 0.01, "the generator's wakes per operation, one client");
    assert_close(one.client_cpu_us_per_op, 22.0, 0.01, "the generator's CPU per operation, one client");
    config.clients = 64;
    let busy = run(&config);
    assert!(busy.client_wakes_per_op < 0.1, "{busy:?}");
    assert!(busy.client_cpu_us_per_op < 4.0, "{busy:?}");
}

/// A node with nothing to do sleeps, and the work that reaches it pays `wake_ns` first: one
/// client's reads each wake their node, while 64 clients keep the node busy and pay almost
/// none.
#[test]
fn an_idle_node_pays_to_wake() {
    let mut config = config("hermes", 1, 1, latency_only(1_000), 1, 0);
    config.costs.wake_ns = 10_000;
    let one = run(&config);
    // Two 1 us hops and the wake-up.
    assert_eq!(one.latency.p50_us, 12.0, "{one:?}");
    config.costs.key_op_ns = 10_000;
    config.clients = 64;
    let busy = run(&config);
    // Almost every read then costs only its 10 us of handling.
    assert_close(busy.nodes_cpu_us_per_op, 10.0, 0.05, "CPU per read under load");
}

/// A tick costs the event loop `tick_ns` whatever else happens, plus a timer's wake when it
/// finds the node asleep: a node that only ticks (one read every 10 ms) keeps its protocol thread busy
/// (tick + wake) / tick period of the time.
#[test]
fn an_idle_node_pays_its_ticks_and_their_wakes() {
    let mut config = config("hermes", 1, 1, latency_only(1_000), 1, 0);
    config.load = Load::Open { ops_per_s: 100 };
    config.costs.tick_ns = 100_000;
    let ticking = predict(&config).expect("a valid configuration");
    assert_close(ticking.protocol_thread_utilisation_max, 0.10, 0.03, "ticks alone");
    // A tick is woken by its timer, not by a peer's write.
    config.costs.wake_ns = 50_000;
    let socket_wakes = predict(&config).expect("a valid configuration");
    assert_close(socket_wakes.protocol_thread_utilisation_max, 0.10, 0.03, "ticks, socket wakes");
    config.costs.timer_wake_ns = 50_000;
    let waking = predict(&config).expect("a valid configuration");
    assert_close(waking.protocol_thread_utilisation_max, 0.15, 0.03, "ticks and their wakes");
}

/// A client reply costs `reply_sent_ns` on the node, a peer frame `message_sent_ns`: a read
/// (no peer message) pays only the former, a Hermes write on 3 nodes both.
#[test]
fn replies_and_peer_frames_are_charged_apart() {
    let mut config = config("hermes", 3, 1, latency_only(1_000), 1, 0);
    config.costs.reply_sent_ns = 10_000;
    let reads = run(&config);
    // Two 1 us hops and the reply's send.
    assert_eq!(reads.latency.p50_us, 12.0, "{reads:?}");
    config.costs.reply_sent_ns = 0;
    config.costs.message_sent_ns = 10_000;
    let reads = run(&config);
    assert_eq!(reads.latency.p50_us, 2.0, "{reads:?}");
    config.workload = Workload::named("kv-w100").expect("a workload");
    let writes = run(&config);
    // The client's hop; two INV frames sent (20 us) and a hop; an ACK sent (10 us) and a hop;
    // two VAL frames sent in the same stage as the reply (20 us); the reply's hop.
    assert_eq!(writes.latency.p50_us, 54.0, "{writes:?}");
}

/// `peer_message_ns` is charged per message of a frame, at both ends. At one client every
/// Hermes frame holds one message, so it costs what the same figure per frame costs; at 64
/// clients a turn packs many messages into a frame, and only the per-message charge grows with
/// them. Reads send no peer messages and never pay it.
#[test]
fn peer_messages_are_charged_per_message_and_frames_per_frame() {
    let per_frame = |config: &mut ModelConfig| {
        config.costs.message_sent_ns = 5_000;
        config.costs.message_received_ns = 5_000;
    };
    let per_message = |config: &mut ModelConfig| config.costs.peer_message_ns = 5_000;

    let mut reads = config("hermes", 3, 1, latency_only(1_000), 1, 0);
    per_message(&mut reads);
    assert_eq!(run(&reads).latency.p50_us, 2.0, "a read's two hops only");

    let one_client = |charge: &dyn Fn(&mut ModelConfig)| {
        let mut config = config("hermes", 3, 1, latency_only(1_000), 1, 100);
        charge(&mut config);
        run(&config)
    };
    let (framed, messaged) = (one_client(&per_frame), one_client(&per_message));
    assert_eq!(framed.latency.p50_us, messaged.latency.p50_us, "one message per frame");
    assert_close(messaged.nodes_cpu_us_per_op, framed.nodes_cpu_us_per_op, 0.01, "one message per frame");

    // A busy protocol thread (its handler costs) makes turns take many events, so a turn's
    // messages to a peer share a frame.
    let loaded = |charge: &dyn Fn(&mut ModelConfig)| {
        let mut config = config("hermes", 3, 4, latency_only(1_000), 64, 100);
        config.costs.handle_ns = 3_000;
        charge(&mut config);
        run(&config).nodes_cpu_us_per_op
    };
    let handlers_us = loaded(&|_: &mut ModelConfig| {});
    let framed_us = loaded(&per_frame) - handlers_us;
    let messaged_us = loaded(&per_message) - handlers_us;
    // Six messages per write (two INVs, two ACKs, two VALs), each paid at both ends.
    assert_close(messaged_us, 60.0, 0.02, "6 messages x 2 ends x 5 us");
    assert!(framed_us < 30.0, "packed frames: {framed_us:.1} us per operation charged per frame");
}

/// At a CPU share of one half, every CPU cost doubles: a CPU-bound node serves half as many
/// reads, while a latency (the loopback wake-up) stays what it was.
#[test]
fn half_the_cpu_share_halves_a_cpu_bound_throughput() {
    let mut config = config("hermes", 1, 1, latency_only(1_000), 64, 0);
    config.costs.client_request_ns = 10_000;
    config.costs.wakeup_ns = 7_000;
    let full = run(&config).throughput_ops_per_s;
    assert_close(full, 100_000.0, 0.02, "the whole core");
    config.costs = config.costs.at_cpu_share(0.5);
    assert_eq!((config.costs.client_request_ns, config.costs.wakeup_ns), (20_000, 7_000));
    assert_close(run(&config).throughput_ops_per_s, 50_000.0, 0.02, "half the core");
}

/// One node of `cores` cores and `loops` event loops serving 64 clients' reads, where only
/// the protocol thread's `key_op_ns` costs: each loop is a protocol thread of its own, so
/// loops multiply what one serial thread admits (the server's `event_loops`).
#[test]
fn event_loops_multiply_a_protocol_thread_bound_throughput() {
    let throughput = |loops| {
        let mut config = config("hermes", 1, 4, latency_only(1_000), 64, 0);
        config.loops = loops;
        config.costs.key_op_ns = 10_000;
        run(&config).throughput_ops_per_s
    };
    let (one, four) = (throughput(1), throughput(4));
    assert_close(one, 100_000.0, 0.02, "one loop");
    assert_close(four, 4.0 * one, 0.05, "four loops");
}

/// Groups on machines of their own share nothing: three groups with three times the clients
/// serve three times what one does (two-core machines: a one-thread node drains every
/// request waiting before its turn, and the bursts of replies it then sends leave other
/// machines momentarily idle when clients pick machines by key, a few percent). Groups
/// sharing the same machines share their cores: three groups serve what one does.
#[test]
fn groups_multiply_throughput_on_their_own_machines_and_share_shared_ones() {
    let throughput = |groups: usize, share: bool| {
        let mut config = config("hermes", 3, 2, latency_only(1_000), 256 * groups as u32, 0);
        config.groups = groups;
        config.groups_share_machines = share;
        config.costs.client_request_ns = 10_000;
        run(&config).throughput_ops_per_s
    };
    let one = throughput(1, false);
    // Three two-core machines, each receiving a request in 10 us on either core.
    assert_close(one, 600_000.0, 0.03, "one group");
    assert_close(throughput(3, false), 3.0 * one, 0.03, "three groups apart");
    assert_close(throughput(3, true), one, 0.03, "three groups on the same machines");
}

/// Messages the receiving NIC handles cost no CPU and wake nothing (HyperLoop's offloaded
/// hops): with every Hermes message NIC-handled, a write's peer messages cost nothing however
/// expensive a received frame is, and a write takes exactly its four one-way latencies.
#[test]
fn nic_handled_messages_cost_no_cpu() {
    let mut config = config("hermes", 3, 1, latency_only(10_000), 1, 100);
    config.costs.message_received_ns = 50_000;
    config.costs.handle_ns = 50_000;
    config.costs.wake_ns = 50_000;
    let all: chorus_core::NodeSet = (0..3u8).map(chorus_core::NodeId).collect();
    let build = |me, _| chorus_hermes::Hermes::new(chorus_hermes::HermesConfig::new(me, all));
    let on_cpu = predict_with(&config, build, None).expect("valid");
    assert!(on_cpu.latency.p50_us > 100.0, "{on_cpu:?}");
    // The coordinator still handles its client's request (a wake and a handler): only the
    // peers' messages move to the NIC.
    config.costs.handle_ns = 0;
    config.costs.wake_ns = 0;
    let on_nic = predict_with(&config, build, Some(|_: &chorus_hermes::Message| true)).expect("valid");
    assert_eq!(on_nic.latency.p50_us, 40.0, "{on_nic:?}");
    assert_eq!(on_nic.nodes_cpu_us_per_op, 0.0, "{on_nic:?}");
}

/// A machine whose cores run a background load gives a woken replica the first core whose
/// slice ends: one client on one core completes one operation per slice, on four cores
/// (their slices staggered) four.
#[test]
fn a_busy_machine_serves_woken_work_at_slice_ends() {
    let throughput = |cores: u32| {
        let mut config = config("hermes", 1, cores, latency_only(1_000), 1, 0);
        config.background_slice = Some(Time::from_millis(1));
        config.duration = Time::from_millis(400);
        run(&config).throughput_ops_per_s
    };
    assert_close(throughput(1), 1_000.0, 0.05, "one core");
    assert_close(throughput(4), 4_000.0, 0.10, "four cores");
}

/// YCSB's operations as steps: with zero costs a read takes two one-way latencies, a Hermes
/// write four, a scan (its reads pipelined in one round trip) two, a read-modify-write (a
/// read, then a write) six.
#[test]
fn ycsb_operations_take_their_round_trips() {
    let latency_ns = 10_000;
    let hops = |workload: &str| {
        let mut config = config("hermes", 3, 1, latency_only(latency_ns), 1, 0);
        config.workload = Workload::named(workload).expect("a YCSB workload");
        let report = run(&config);
        (report.read_latency.p50_us, report.write_latency.p50_us)
    };
    let hop_us = latency_ns as f64 / 1e3;
    assert_eq!(hops("ycsb-c"), (2.0 * hop_us, 0.0));
    assert_eq!(hops("ycsb-a"), (2.0 * hop_us, 4.0 * hop_us));
    // E: 95% scans (reads of up to 100 keys in one round trip), 5% inserts.
    assert_eq!(hops("ycsb-e"), (2.0 * hop_us, 4.0 * hop_us));
    // F: the read-modify-writes are the writes.
    assert_eq!(hops("ycsb-f"), (2.0 * hop_us, 6.0 * hop_us));
}

/// YCSB's zipfian: the hottest rank comes up with probability 1 / zeta(n); scrambled ranks
/// stay in the key space.
#[test]
fn the_zipfian_generator_follows_its_law() {
    let zipf = Zipfian::new(1_000, 0.99);
    let mut rng = chorus_sim::rng::Rng::new(3);
    let draws = 200_000;
    let top = (0..draws).filter(|_| zipf.rank(rng.unit()) == 0).count() as f64 / draws as f64;
    // 1 / zeta(1000, 0.99) = 0.129; 200 000 draws put 3 standard deviations at 0.2%.
    assert_close(top, zipf.top_probability(), 0.03, "rank 0's share");
    assert!((0..10_000).all(|rank| chorus_sim::model::workload::scramble(rank, 1_000) < 1_000));
}

/// The cost table's scalings: at twice the clock every CPU cost halves, so a CPU-bound node
/// serves twice as much; on a kernel-bypass stack every per-message cost is eRPC's, wakes are
/// gone, and the ratio reported is the calibrated per-message mean over it.
#[test]
fn clock_and_kernel_bypass_scalings_follow_their_definitions() {
    let mut config = config("hermes", 1, 1, latency_only(1_000), 64, 0);
    config.costs.client_request_ns = 10_000;
    let base = run(&config).throughput_ops_per_s;
    config.costs = config.costs.at_clock(2.0, 4.0);
    assert_eq!(config.costs.client_request_ns, 5_000);
    assert_close(run(&config).throughput_ops_per_s, 2.0 * base, 0.02, "twice the clock");
    let mut kernel = CostTable::zero();
    (kernel.client_request_ns, kernel.reply_sent_ns) = (4_000, 2_000);
    (kernel.message_received_ns, kernel.message_sent_ns) = (6_000, 4_000);
    (kernel.wake_ns, kernel.timer_wake_ns, kernel.handle_ns, kernel.byte_ps) = (7_000, 20_000, 900, 300);
    let bypass = kernel.kernel_bypass();
    let message = chorus_sim::model::costs::BYPASS_MESSAGE_NS;
    assert_eq!((bypass.client_request_ns, bypass.message_sent_ns), (message, message));
    assert_eq!((bypass.wake_ns, bypass.timer_wake_ns, bypass.handle_ns, bypass.byte_ps), (0, 0, 900, 150));
    assert_eq!(kernel.kernel_to_bypass_ratio(), 4_000.0 / message as f64);
    assert!(Network::preset("rdma").expect("a preset").kernel_bypass);
}
