//! `chorus model calibrate` and `chorus model compare` (issue 21, point 2): measure the cost
//! table on this machine, then put the model's predictions next to real 3-replica loopback
//! runs of the same binary.
//!
//! Calibration measures, never fits: every figure comes from one measurement that isolates it,
//! and none of them is chosen to make a prediction match a benchmark.
//!
//! * `handlers`: each compared protocol's real core as the model runs it, every `on_message`
//!   and `on_client` timed in-process (chorus_sim::model::timing); `handle_ns`, `key_op_ns`
//!   are Hermes' entry;
//! * `wake_ns`, `wakeup_ns`: two threads, each on a tokio current-thread runtime as a node
//!   runs, bounce one byte over loopback TCP; the same four syscalls run in ONE thread
//!   (nothing sleeps). The ping-pong's extra CPU per voluntary sleep is a wake's CPU; its wall
//!   time less its CPU, halved, is what a reader waits for the scheduler;
//! * `byte_ps`: CPU per byte streaming 64 MiB through a loopback socket;
//! * `sync_ns`: the median `fdatasync` of a 4 KiB append where the benchmarks keep their data;
//! * the rest from a real 3-node Hermes cluster (`chorus node`, loopback), from the nodes'
//!   CPU, voluntary sleeps and peer counters (INFO replication). Idle, the nodes only tick:
//!   their CPU less their wakes x `wake_ns`, per tick, is `tick_ns`. A node's (and the load
//!   generator's) wake is their extra CPU per GET at one client over 16 clients, per extra
//!   sleep. At 16 clients, GETs: the nodes' CPU per GET less its wakes and handler is a
//!   request's receive and reply, split evenly into `client_request_ns` and `reply_sent_ns`.
//!   SETs at 16 and at 64 clients: the extra CPU of a SET over a GET at the same load, less
//!   its extra wakes and its messages' handlers, is its peer frames' and their messages'
//!   encoding, sending, receiving and decoding; the two loads pack different numbers of
//!   messages per frame, which tells a frame's cost (split evenly into `message_sent_ns` and
//!   `message_received_ns`) from a message's (`peer_message_ns`, at each end). The load
//!   generator's own CPU per GET at 16 clients, less its wakes, is `client_op_ns`.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use chorus_bench::client::{Api, ClientConfig, Keyspace};
use chorus_bench::driver::{self, RunOptions};
use chorus_bench::generator::Distribution;
use chorus_bench::procs::{self, Procs};
use chorus_bench::report::Report;
use chorus_bench::workload::{KvSpec, OpGen};
use chorus_core::Time;
use chorus_sim::model::timing::{self, HandlerTiming};
use chorus_sim::model::{predict, CostTable, ModelConfig, Network, ProtocolHandlers, Workload};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

const KEYS: u64 = 10_000;
/// The replicas of every calibration and comparison cluster.
const NODES: usize = 3;
/// A node's event loop ticks every millisecond (crates/server/src/engine.rs, `TICK`; the
/// model's `tick_period`).
const TICKS_PER_S: f64 = 1_000.0;
const VALUE_BYTES: usize = 32;
/// The protocols `compare` runs by default, whose handlers calibration times apart.
const COMPARED: [&str; 4] = ["hermes", "craq", "zab", "raftlog"];
/// The clients of the loaded calibration runs: enough that few requests find a node or the
/// load generator asleep, as in the comparison's 16- and 64-client rows.
const LOADED_CLIENTS: usize = 16;
/// The clients of the second pair of loaded runs: a SET's frames carry more messages than at
/// `LOADED_CLIENTS`, which tells a frame's cost from its messages'.
const PACKED_CLIENTS: usize = 64;
/// How much more messages per frame the packed runs must carry than the loaded ones for the
/// two costs to be told apart.
const MIN_PACKING_APART: f64 = 1.25;
/// The sleeps per operation two runs must differ by for their CPU difference to be a wake's.
const MIN_WAKES_APART: f64 = 0.2;

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// Seconds per measured run of the real cluster.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Runs per measurement; the median is kept (the machine may be busy).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where to write the cost table (`chorus model --costs` reads it); the measurements
    /// behind it go next to it as `<name>.runs.json`.
    #[arg(long, default_value = "bench-results/model-costs.json")]
    out: PathBuf,
    /// Only time the protocols' handlers (in-process, no cluster, seconds) and add them to
    /// this existing table, the rest of it as it was.
    #[arg(long, conflicts_with = "out")]
    handlers_into: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CompareArgs {
    /// The cost table `chorus model calibrate` wrote.
    #[arg(long, default_value = "bench-results/model-costs.json")]
    costs: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "hermes,craq,zab,raftlog")]
    protocols: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Percent of writes (SET), the rest reads (GET), uniform over 10 000 keys.
    #[arg(long, default_value_t = 20)]
    write_percent: u32,
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The comparison as JSON.
    #[arg(long, default_value = "bench-results/model-compare.json")]
    json: PathBuf,
    /// Run no cluster: model again the real rows of a comparison this command wrote (its
    /// JSON), with the cost table of `--costs` (the model is deterministic, the real runs are
    /// not: this reproduces a saved table without a quiet machine).
    #[arg(long)]
    against: Option<PathBuf>,
    /// Model each node's replies and peer frames leaving one by one, as each write is made,
    /// instead of at the end of its send stage (docs/model.md, "Writes one by one").
    #[arg(long)]
    writes_one_by_one: bool,
}

/// What the real cluster did over one measured run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct RunCounters {
    ops: u64,
    ops_per_s: f64,
    p50_us: f64,
    /// The three nodes' CPU (user + system), per operation, in microseconds, idle CPU removed.
    server_cpu_us_per_op: f64,
    /// The same with everything the nodes did meanwhile (ticks included), as the model counts.
    server_cpu_raw_us_per_op: f64,
    /// This process's CPU (the load generator), per operation.
    client_cpu_us_per_op: f64,
    /// Times one of this process's threads went to sleep (voluntary context switches), per
    /// operation: the load generator's wakes.
    #[serde(default)]
    client_wakes_per_op: f64,
    /// Peer frames the nodes sent, and peer messages they received, per operation.
    frames_per_op: f64,
    messages_per_op: f64,
    /// Times a node thread went to sleep (voluntary context switches), per operation: each
    /// is one wake-up. Idle wakes removed, then all of them.
    wakes_per_op: f64,
    wakes_raw_per_op: f64,
    /// The nodes' ticks per operation (each node ticks every millisecond).
    ticks_per_op: f64,
    /// The nodes' and the load generator's CPU over the run, in cores.
    cores_used: f64,
    /// The cores other processes (and the hypervisor's steal) used meanwhile, from /proc/stat.
    others_cores: f64,
    /// The share of CPU the run's threads got while they wanted it, counting only the waits
    /// others caused: run / (run + runqueue wait x others' share of the host), from
    /// /proc/<pid>/task/<tid>/schedstat of the nodes and the load generator. 1 on a quiet host
    /// (waiting for one's own threads is what the model already queues).
    cpu_share: f64,
}

#[derive(Serialize)]
struct CalibrationRuns {
    machine: chorus_bench::compare::Machine,
    handlers: chorus_sim::model::timing::HandlerTiming,
    ping_pong: PingPong,
    /// The same write-read-write-read in one thread, where nothing sleeps.
    syscalls_cpu_ns_per_round_trip: f64,
    timer_sleeps_per_tick: f64,
    /// An idle tick's CPU beyond its timer's wake, before negative noise is cut to zero.
    tick_work_ns: f64,
    idle_server_cpu_us_per_s: f64,
    idle_frames_per_s: f64,
    idle_messages_per_s: f64,
    idle_wakes_per_s: f64,
    get_one_client: RunCounters,
    set_one_client: RunCounters,
    /// The same at `LOADED_CLIENTS` clients, where few requests find a node asleep.
    get_loaded: RunCounters,
    set_loaded: RunCounters,
    /// The same at `PACKED_CLIENTS` clients, whose SET frames carry more messages each.
    get_packed: RunCounters,
    set_packed: RunCounters,
    rounds: usize,
    costs: CostTable,
}

pub fn calibrate(args: CalibrateArgs) -> anyhow::Result<i32> {
    if args.seconds <= 0.0 || args.rounds == 0 {
        bail!("--seconds and --rounds must be positive");
    }
    if let Some(path) = &args.handlers_into {
        return add_protocol_handlers(path);
    }
    let handlers = chorus_sim::model::timing::time_hermes_handlers(200_000, KEYS, VALUE_BYTES);
    println!(
        "Hermes' handlers alone: on_message {:.0} ns, on_client {:.0} ns (in-process, {} + {} calls; kept for the record)",
        handlers.message_ns_mean, handlers.client_ns_mean, handlers.message_calls, handlers.client_calls
    );
    // The table's own handler figures are Hermes' as the model runs it, the same figure the
    // Hermes rows pay and the one taken out of the cluster's CPU below.
    let protocol_handlers = protocol_handlers()?;
    let ProtocolHandlers { handle_ns, key_op_ns } =
        protocol_handlers.get("hermes").cloned().context("Hermes' handlers timed")?;
    let ping_pong = tokio_ping_pong(20_000)?;
    let syscalls_ns = syscalls_cpu_ns_per_round_trip(20_000)?;
    println!(
        "loopback ping-pong (tokio, two threads): {:.0} ns per round trip, {:.0} ns of CPU, {:.2} sleeps; the same syscalls in one thread: {syscalls_ns:.0} ns of CPU",
        ping_pong.wall_ns, ping_pong.cpu_ns, ping_pong.sleeps
    );
    if ping_pong.sleeps < 0.5 || ping_pong.cpu_ns <= syscalls_ns {
        bail!("the ping-pong's threads did not sleep ({ping_pong:?}, one thread {syscalls_ns:.0} ns): cannot measure a wake on this machine now");
    }
    let ping_pong_wake_ns = (ping_pong.cpu_ns - syscalls_ns) / ping_pong.sleeps;
    let wakeup_ns = ((ping_pong.wall_ns - ping_pong.cpu_ns) / 2.0).max(0.0).round() as u64;
    println!("a wake (ping-pong): {ping_pong_wake_ns:.0} ns of CPU; loopback wake-up latency {wakeup_ns} ns");
    let byte_ps = stream_cpu_ps_per_byte(64 << 20)?;
    println!("loopback stream: {byte_ps} ps of CPU per byte");
    // Every directory straight under the scratch root, so that the last one removed takes
    // the (then empty) root with it (Procs' drop).
    let probe = procs::scratch_root().join("model-calibrate-sync");
    let sync_ns = median_sync_ns(&probe, 200);
    let _ = std::fs::remove_dir_all(&probe);
    let sync_ns = sync_ns?;
    println!("fdatasync of a 4 KiB append under {}: {sync_ns} ns (median)", probe.display());

    let exe = std::env::current_exe()?;
    let runtime = chorus_bench::cli::runtime(None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut procs = Procs::new("calibrate", procs::scratch_root().join("model-calibrate"))?;
    let targets = procs::start_chorus_cluster(&mut procs, &exe, "hermes", NODES, &[], &stop)?;
    load_keys(&targets, &runtime)?;
    let idle = idle_rates(&procs, &targets, Duration::from_secs(2))?;
    println!(
        "idle: {:.0} us of node CPU per second, {:.0} wakes/s, {:.0} frames/s, {:.0} messages/s",
        idle.cpu_us_per_s, idle.wakes_per_s, idle.frames_per_s, idle.messages_per_s
    );
    let (timer_wake_ns, timer_sleeps_per_tick) = timer_wake(1_000)?;
    println!(
        "a timer's wake (tokio interval of 1 ms, nothing else): {timer_wake_ns:.0} ns of CPU, {timer_sleeps_per_tick:.2} sleeps per tick"
    );
    // An idle node sleeps between ticks (and the odd heartbeat): what it spends beyond its
    // timers' wakes is the tick's own work. Within noise of zero it is taken as zero.
    let ticks_per_s = NODES as f64 * TICKS_PER_S;
    let tick_work_ns = (idle.cpu_us_per_s * 1e3 - idle.wakes_per_s * timer_wake_ns) / ticks_per_s;
    let tick_ns = tick_work_ns.max(0.0);
    println!("a tick's own work: {tick_work_ns:.0} ns of CPU beyond its wake ({ticks_per_s:.0} ticks/s), {tick_ns:.0} ns kept");
    let duration = Duration::from_secs_f64(args.seconds);
    let median_of = |write_percent, clients| -> anyhow::Result<RunCounters> {
        let rounds = (0..args.rounds)
            .map(|_| measure(&procs, &targets, &runtime, &stop, write_percent, clients, duration, &idle))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(median_run(rounds))
    };
    let get = median_of(0, 1)?;
    let set = median_of(100, 1)?;
    let loaded_get = median_of(0, LOADED_CLIENTS)?;
    let loaded_set = median_of(100, LOADED_CLIENTS)?;
    let packed_get = median_of(0, PACKED_CLIENTS)?;
    let packed_set = median_of(100, PACKED_CLIENTS)?;
    drop(procs);
    println!("GET, 1 client: {get:?}");
    println!("SET, 1 client: {set:?}");
    println!("GET, {LOADED_CLIENTS} clients: {loaded_get:?}");
    println!("SET, {LOADED_CLIENTS} clients: {loaded_set:?}");
    println!("GET, {PACKED_CLIENTS} clients: {packed_get:?}");
    println!("SET, {PACKED_CLIENTS} clients: {packed_set:?}");

    // A wake is measured inside the real cluster: the nodes' CPU per GET at one client
    // (almost every request finds its node asleep) against the same at LOADED_CLIENTS
    // (almost none does), per wake of difference. The ping-pong's figure is kept for the
    // record only: on this VM it moved 7-46 us within a day while the nodes' own did not
    // follow it (docs/model.md, "Calibration").
    let wake_ns = wake_between(
        "a node",
        (get.server_cpu_us_per_op, get.wakes_per_op),
        (loaded_get.server_cpu_us_per_op, loaded_get.wakes_per_op),
    )
    .unwrap_or_else(|why| fall_back_to_ping_pong(&why, ping_pong_wake_ns));
    let client_wake_ns = wake_between(
        "the load generator",
        (get.client_cpu_us_per_op, get.client_wakes_per_op),
        (loaded_get.client_cpu_us_per_op, loaded_get.client_wakes_per_op),
    )
    .unwrap_or_else(|why| fall_back_to_ping_pong(&why, ping_pong_wake_ns));
    println!(
        "a wake: {wake_ns:.0} ns of a node's CPU, {client_wake_ns:.0} ns of the load generator's (the ping-pong's: {ping_pong_wake_ns:.0} ns)"
    );

    // Per operation, the loaded runs, where wakes are few: a GET is receiving the request,
    // its handler, sending the reply (and what wakes are left); a SET adds peer frames (sent
    // and received), their messages' handlers and wake-ups. Everything the nodes did counts
    // (ticks included), as the model charges it under load.
    let background_us = |run: &RunCounters| run.wakes_raw_per_op * wake_ns / 1e3;
    let peer_work = |set: &RunCounters, get: &RunCounters| {
        let messages = (set.messages_per_op - get.messages_per_op).max(0.0);
        PeerWork {
            cpu_us: set.server_cpu_raw_us_per_op
                - get.server_cpu_raw_us_per_op
                - (background_us(set) - background_us(get))
                - messages * handle_ns as f64 / 1e3,
            frames: (set.frames_per_op - get.frames_per_op).max(f64::MIN_POSITIVE),
            messages,
        }
    };
    let loaded_work = peer_work(&loaded_set, &loaded_get);
    let packed_work = peer_work(&packed_set, &packed_get);
    if loaded_work.cpu_us <= 0.0 {
        bail!("a SET's frames cost no CPU beyond their wake-ups ({loaded_set:?} vs {loaded_get:?}): the machine is too busy to calibrate, try again with more --rounds");
    }
    let (frame_us, message_us) = frame_and_message_us(&loaded_work, &packed_work).unwrap_or_else(|why| {
        println!(
            "{why}: a frame's messages are charged with the frame, as measured at {LOADED_CLIENTS} clients"
        );
        (loaded_work.cpu_us / loaded_work.frames, 0.0)
    });
    println!(
        "a peer frame: {frame_us:.2} us of CPU (both ends), and {message_us:.2} us per message in it (both ends, beyond the handler)"
    );
    let half_frame_ns = (frame_us * 1e3 / 2.0).round() as u64;
    let peer_message_ns = (message_us * 1e3 / 2.0).round() as u64;
    let handler_us = (handle_ns + key_op_ns) as f64 / 1e3;
    let request_us = loaded_get.server_cpu_raw_us_per_op - background_us(&loaded_get) - handler_us;
    if request_us <= 0.0 {
        bail!(
            "a GET at {LOADED_CLIENTS} clients cost less node CPU ({:.1} us) than its wake-ups and handler ({:.1} us): the machine is too busy to calibrate",
            loaded_get.server_cpu_raw_us_per_op,
            background_us(&loaded_get) + handler_us
        );
    }
    let half_request_ns = (request_us * 1e3 / 2.0).round() as u64;
    let client_op_ns =
        (loaded_get.client_cpu_us_per_op * 1e3 - loaded_get.client_wakes_per_op * client_wake_ns).max(0.0);
    let machine = chorus_bench::compare::machine();
    let costs = CostTable {
        source: format!(
            "chorus model calibrate on {} ({} cores), {} rounds of {:.0} s, median",
            machine.cpu_model, machine.nproc, args.rounds, args.seconds
        ),
        client_request_ns: half_request_ns,
        message_received_ns: half_frame_ns,
        message_sent_ns: half_frame_ns,
        reply_sent_ns: half_request_ns,
        peer_message_ns,
        byte_ps,
        handle_ns,
        tick_ns: tick_ns.round() as u64,
        key_op_ns,
        sync_ns,
        client_op_ns: client_op_ns.round() as u64,
        wake_ns: wake_ns.round() as u64,
        client_wake_ns: Some(client_wake_ns.round() as u64),
        timer_wake_ns: timer_wake_ns.round() as u64,
        wakeup_ns,
        cpu_ghz: cpu_ghz(),
        handlers: protocol_handlers,
    };
    println!("{}", serde_json::to_string_pretty(&costs)?);
    let runs = CalibrationRuns {
        machine,
        handlers,
        ping_pong,
        syscalls_cpu_ns_per_round_trip: syscalls_ns,
        timer_sleeps_per_tick,
        tick_work_ns,
        idle_server_cpu_us_per_s: idle.cpu_us_per_s,
        idle_frames_per_s: idle.frames_per_s,
        idle_messages_per_s: idle.messages_per_s,
        idle_wakes_per_s: idle.wakes_per_s,
        get_one_client: get,
        set_one_client: set,
        get_loaded: loaded_get,
        set_loaded: loaded_set,
        get_packed: packed_get,
        set_packed: packed_set,
        rounds: args.rounds,
        costs: costs.clone(),
    };
    write_json(&args.out, &costs)?;
    let runs_path = args.out.with_extension("runs.json");
    write_json(&runs_path, &runs)?;
    println!("cost table: {} (measurements: {})", args.out.display(), runs_path.display());
    Ok(0)
}

/// Each compared protocol's own handlers, timed in-process on its real core as the model
/// runs it (chorus_sim::model::timing::time_protocol_handlers): the median of three runs'
/// means, as `handle_ns` (a message) and `key_op_ns` (a client request's call beyond that).
fn protocol_handlers() -> anyhow::Result<BTreeMap<String, ProtocolHandlers>> {
    let mut handlers = BTreeMap::new();
    for protocol in chorus_sim::model::PROTOCOLS.iter().filter(|name| COMPARED.contains(name)) {
        let mut runs = (0..3)
            .map(|_| timing::time_protocol_handlers(protocol, KEYS, VALUE_BYTES).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<_>>>()?;
        runs.sort_by(|a, b| a.message_ns_mean.total_cmp(&b.message_ns_mean));
        let timing = &runs[runs.len() / 2];
        println!(
            "{protocol}'s handlers: on_message {:.0} ns, on_client {:.0} ns (in the model's run, {} + {} calls)",
            timing.message_ns_mean, timing.client_ns_mean, timing.message_calls, timing.client_calls
        );
        handlers.insert(protocol.to_string(), handlers_of(timing));
    }
    Ok(handlers)
}

/// A message's handler is `handle_ns`; a client request's call beyond it is `key_op_ns`.
fn handlers_of(timing: &HandlerTiming) -> ProtocolHandlers {
    ProtocolHandlers {
        handle_ns: timing.message_ns_mean.round() as u64,
        key_op_ns: (timing.client_ns_mean - timing.message_ns_mean).max(0.0).round() as u64,
    }
}

/// `calibrate --handlers-into FILE`: the table in FILE with the protocols' handlers timed now.
fn add_protocol_handlers(path: &Path) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut costs: CostTable =
        serde_json::from_str(&text).with_context(|| format!("{} is not a cost table", path.display()))?;
    costs.handlers = protocol_handlers()?;
    costs.source = format!("{} (protocols' handlers timed again on their own)", costs.source);
    write_json(path, &costs)?;
    println!("{}: the protocols' handlers added", path.display());
    Ok(0)
}

/// The CPU one wake costs a process, from two real runs of the same requests: one where
/// almost every request finds it asleep (one client) and one where few do (`loaded`), as
/// (CPU per operation, sleeps per operation). What differs between them per operation is
/// the wakes; the rest of a request's work is the same.
fn wake_between(who: &str, one: (f64, f64), loaded: (f64, f64)) -> Result<f64, String> {
    let (cpu_us, wakes) = one;
    let (loaded_cpu_us, loaded_wakes) = loaded;
    if wakes - loaded_wakes < MIN_WAKES_APART {
        return Err(format!(
            "{who} slept {wakes:.2} times per GET at one client and {loaded_wakes:.2} at {LOADED_CLIENTS}: too close to tell a wake's CPU apart"
        ));
    }
    let wake_ns = (cpu_us - loaded_cpu_us) * 1e3 / (wakes - loaded_wakes);
    if wake_ns <= 0.0 {
        return Err(format!(
            "{who}'s CPU per GET was no higher at one client ({cpu_us:.1} us) than at {LOADED_CLIENTS} ({loaded_cpu_us:.1} us)"
        ));
    }
    Ok(wake_ns)
}

/// What a SET's peer traffic cost the nodes beyond a GET's, per operation, at one load: CPU
/// (wakes and handlers taken out), frames and messages.
#[derive(Clone, Copy, Debug)]
struct PeerWork {
    cpu_us: f64,
    frames: f64,
    messages: f64,
}

/// A frame's cost and a message's, from two loads whose frames carry different numbers of
/// messages: `cpu = frames x frame + messages x message` at each, solved for the two. Refused
/// where the loads pack frames too alike to tell the two apart, or where the solution is
/// negative (noise larger than the difference).
fn frame_and_message_us(loaded: &PeerWork, packed: &PeerWork) -> Result<(f64, f64), String> {
    let per_frame = |work: &PeerWork| work.messages / work.frames;
    if per_frame(packed) < per_frame(loaded) * MIN_PACKING_APART {
        return Err(format!(
            "a SET's frames carried {:.2} messages at {LOADED_CLIENTS} clients and {:.2} at {PACKED_CLIENTS}: too alike to tell a message's cost from its frame's",
            per_frame(loaded),
            per_frame(packed)
        ));
    }
    let determinant = loaded.frames * packed.messages - packed.frames * loaded.messages;
    let frame_us = (loaded.cpu_us * packed.messages - packed.cpu_us * loaded.messages) / determinant;
    let message_us = (loaded.frames * packed.cpu_us - packed.frames * loaded.cpu_us) / determinant;
    if frame_us <= 0.0 || message_us < 0.0 {
        return Err(format!(
            "the two loads give a frame {frame_us:.2} us and a message {message_us:.2} us ({loaded:?}, {packed:?}): the difference is within noise"
        ));
    }
    Ok((frame_us, message_us))
}

/// Where the real runs cannot tell a wake apart (a busy host, or a process that seldom
/// sleeps even at one client), the ping-pong's wake stands in, and calibrate says so.
fn fall_back_to_ping_pong(why: &str, ping_pong_wake_ns: f64) -> f64 {
    println!("{why}: charging the ping-pong's wake ({ping_pong_wake_ns:.0} ns) instead");
    ping_pong_wake_ns
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// One row of the comparison: the median of the real rounds next to the model, given the
/// whole host and given the CPU share the real run had.
#[derive(Serialize, Deserialize)]
struct CompareRow {
    protocol: String,
    clients: usize,
    real_ops_per_s: f64,
    real_p50_us: f64,
    real_rounds_ops_per_s: Vec<f64>,
    /// The nodes' CPU per operation, everything they did in the run (ticks included), as the
    /// model counts it: a busy host moves it far less than throughput.
    real_cpu_us_per_op: f64,
    /// CPU the nodes and the load generator used, in cores.
    real_cores_used: f64,
    /// The load generator's CPU and wakes per operation.
    #[serde(default)]
    real_client_cpu_us_per_op: f64,
    #[serde(default)]
    real_client_wakes_per_op: f64,
    /// Peer frames the nodes sent per operation, and the messages they received (INFO
    /// replication): how much the real turns batched.
    #[serde(default)]
    real_frames_per_op: f64,
    #[serde(default)]
    real_messages_per_op: f64,
    /// Times a node thread went to sleep, per operation (voluntary context switches, idle
    /// ones included): each is a later wake.
    #[serde(default)]
    real_wakes_per_op: f64,
    /// Cores other processes used meanwhile, and the share of CPU the run got.
    real_others_cores: f64,
    real_cpu_share: f64,
    /// The model on the whole host.
    model: ModelColumns,
    /// The model with every CPU cost divided by the share (`CostTable::at_cpu_share`).
    model_at_share: ModelColumns,
}

#[derive(Default, Serialize, Deserialize)]
struct ModelColumns {
    ops_per_s: f64,
    p50_us: f64,
    cpu_us_per_op: f64,
    /// The load generator's CPU and wakes per operation.
    #[serde(default)]
    client_cpu_us_per_op: f64,
    #[serde(default)]
    client_wakes_per_op: f64,
    /// Peer frames and messages per operation in the model.
    #[serde(default)]
    frames_per_op: f64,
    #[serde(default)]
    messages_per_op: f64,
    /// The nodes' wakes and turns (one-thread nodes: reactor passes) per operation.
    #[serde(default)]
    wakes_per_op: f64,
    #[serde(default)]
    turns_per_op: f64,
    /// (model - real) / real.
    throughput_error: f64,
    p50_error: f64,
    cpu_error: f64,
}

impl ModelColumns {
    /// `real`: the real run's throughput, p50 and nodes' CPU per operation.
    fn of(model: &chorus_sim::model::ModelReport, real: (f64, f64, f64), cpu_share: f64) -> ModelColumns {
        let (real_ops_per_s, real_p50_us, real_cpu_us_per_op) = real;
        // CPU per operation in the table's own units: a stretched cost is not more work.
        let cpu_us_per_op = model.nodes_cpu_us_per_op * cpu_share;
        ModelColumns {
            ops_per_s: model.throughput_ops_per_s,
            p50_us: model.latency.p50_us,
            cpu_us_per_op,
            client_cpu_us_per_op: model.client_cpu_us_per_op * cpu_share,
            client_wakes_per_op: model.client_wakes_per_op,
            frames_per_op: model.frames_per_op,
            messages_per_op: model.messages_per_op,
            wakes_per_op: model.nodes_wakes_per_op,
            turns_per_op: model.turns_per_op,
            throughput_error: model.throughput_ops_per_s / real_ops_per_s - 1.0,
            p50_error: model.latency.p50_us / real_p50_us - 1.0,
            cpu_error: cpu_us_per_op / real_cpu_us_per_op - 1.0,
        }
    }

    fn within(&self, tolerance: f64) -> bool {
        self.throughput_error.abs() <= tolerance && self.p50_error.abs() <= tolerance
    }
}

#[derive(Serialize, Deserialize)]
struct Comparison {
    machine: chorus_bench::compare::Machine,
    /// The load average when the comparison started (1, 5, 15 minutes).
    load_average: String,
    costs: CostTable,
    write_percent: u32,
    rounds: usize,
    seconds: f64,
    host_cores: u32,
    rows: Vec<CompareRow>,
}

pub fn compare(args: CompareArgs) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(&args.costs)
        .with_context(|| format!("cannot read {}", args.costs.display()))?;
    let costs: CostTable = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a cost table", args.costs.display()))?;
    if args.seconds <= 0.0 || args.rounds == 0 || args.clients.contains(&0) || args.write_percent > 100 {
        bail!("--seconds, --rounds and every --clients must be positive, --write-percent at most 100");
    }
    for protocol in &args.protocols {
        if !chorus_sim::model::PROTOCOLS.contains(&protocol.as_str()) {
            bail!("unknown protocol '{protocol}'");
        }
    }
    if let Some(saved) = args.against.clone() {
        return compare_against(&saved, args, costs);
    }
    let exe = std::env::current_exe()?;
    let runtime = chorus_bench::cli::runtime(None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let host_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_average = load_average.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    println!("costs: {}", costs.source);
    println!("host: {host_cores} cores, load average {load_average}");
    let duration = Duration::from_secs_f64(args.seconds);
    let mut rows = Vec::new();
    for protocol in &args.protocols {
        let mut procs =
            Procs::new(protocol, procs::scratch_root().join(format!("model-compare-{protocol}")))?;
        let targets = procs::start_chorus_cluster(&mut procs, &exe, protocol, NODES, &[], &stop)?;
        load_keys(&targets, &runtime)?;
        let idle = idle_rates(&procs, &targets, Duration::from_millis(500))?;
        for &clients in &args.clients {
            let rounds = (0..args.rounds)
                .map(|_| {
                    measure(&procs, &targets, &runtime, &stop, args.write_percent, clients, duration, &idle)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let real_rounds_ops_per_s = rounds.iter().map(|run| run.ops_per_s).collect();
            let real = median_run(rounds);
            let mut row = CompareRow {
                protocol: protocol.clone(),
                clients,
                real_ops_per_s: real.ops_per_s,
                real_p50_us: real.p50_us,
                real_rounds_ops_per_s,
                real_cpu_us_per_op: real.server_cpu_raw_us_per_op,
                real_cores_used: real.cores_used,
                real_client_cpu_us_per_op: real.client_cpu_us_per_op,
                real_client_wakes_per_op: real.client_wakes_per_op,
                real_frames_per_op: real.frames_per_op,
                real_messages_per_op: real.messages_per_op,
                real_wakes_per_op: real.wakes_raw_per_op,
                real_others_cores: real.others_cores,
                real_cpu_share: real.cpu_share,
                model: ModelColumns::default(),
                model_at_share: ModelColumns::default(),
            };
            model_row(&mut row, args.write_percent, host_cores, &costs, args.writes_one_by_one)?;
            print_row(&row, rows.is_empty());
            rows.push(row);
        }
        drop(procs);
    }
    let saved = Saved { machine: chorus_bench::compare::machine(), host_cores, load_average };
    summarise(rows, args, costs, saved)
}

/// Model `row`'s run (on the whole host and at the real run's CPU share) with `costs`.
fn model_row(
    row: &mut CompareRow,
    write_percent: u32,
    host_cores: u32,
    costs: &CostTable,
    writes_one_by_one: bool,
) -> anyhow::Result<()> {
    let run = Loopback {
        protocol: &row.protocol,
        clients: row.clients,
        write_percent,
        host_cores,
        writes_one_by_one,
    };
    let predict = |costs: &CostTable| predict_loopback(&run, costs);
    let model = predict(costs)?;
    let at_share = predict(&costs.at_cpu_share(row.real_cpu_share))?;
    let real = (row.real_ops_per_s, row.real_p50_us, row.real_cpu_us_per_op);
    row.model = ModelColumns::of(&model, real, 1.0);
    row.model_at_share = ModelColumns::of(&at_share, real, row.real_cpu_share);
    Ok(())
}

/// `compare --against`: the real rows of a saved comparison, modelled again with `costs`.
fn compare_against(saved: &Path, args: CompareArgs, costs: CostTable) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(saved).with_context(|| format!("cannot read {}", saved.display()))?;
    let comparison: Comparison = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a comparison `chorus model compare` wrote", saved.display()))?;
    println!("costs: {}", costs.source);
    println!(
        "real runs: {} ({} cores, load average {} when they ran; no cluster started now)",
        saved.display(),
        comparison.host_cores,
        comparison.load_average
    );
    let mut rows = Vec::new();
    for mut row in comparison.rows {
        let wanted = args.protocols.contains(&row.protocol) && args.clients.contains(&row.clients);
        if !wanted {
            continue;
        }
        if row.real_client_cpu_us_per_op == 0.0 {
            // A comparison written before the load generator's CPU was saved: what the run
            // used beyond the nodes' CPU.
            row.real_client_cpu_us_per_op =
                (row.real_cores_used * 1e6 / row.real_ops_per_s - row.real_cpu_us_per_op).max(0.0);
        }
        model_row(&mut row, comparison.write_percent, comparison.host_cores, &costs, args.writes_one_by_one)?;
        print_row(&row, rows.is_empty());
        rows.push(row);
    }
    let args = CompareArgs {
        write_percent: comparison.write_percent,
        rounds: comparison.rounds,
        seconds: comparison.seconds,
        ..args
    };
    let saved = Saved {
        machine: comparison.machine,
        host_cores: comparison.host_cores,
        load_average: comparison.load_average,
    };
    summarise(rows, args, costs, saved)
}

/// Where the real runs ran.
struct Saved {
    machine: chorus_bench::compare::Machine,
    host_cores: u32,
    load_average: String,
}

/// How much the real turns and the model's batched: peer frames and messages per operation,
/// and how often the nodes slept. Where the model's nodes are charged too little or too much,
/// this says whether it sends what the server sends and wakes as often (a saved comparison
/// from before session 18 has no real traffic, one from before session 20 no real wakes).
fn print_traffic(rows: &[CompareRow]) {
    println!("per operation, real | model: peer frames, messages, the nodes' wakes; the model's turns:");
    for row in rows {
        println!(
            "{:>8} {:>7} | {:>6.3} {:>6.2} {:>6.3} | {:>6.3} {:>6.2} {:>6.3} {:>6.3}",
            row.protocol,
            row.clients,
            row.real_frames_per_op,
            row.real_messages_per_op,
            row.real_wakes_per_op,
            row.model.frames_per_op,
            row.model.messages_per_op,
            row.model.wakes_per_op,
            row.model.turns_per_op,
        );
    }
}

/// Each row is the round of median throughput; how far its rounds were apart says how much
/// of an error is the real runs' own noise (two runs minutes apart moved 36% in session 19).
fn print_round_spread(rows: &[CompareRow]) {
    println!("real throughput over the rounds (the row is the median round): lowest .. highest");
    for row in rows {
        let rounds = &row.real_rounds_ops_per_s;
        if rounds.is_empty() {
            continue;
        }
        let low = rounds.iter().copied().fold(f64::INFINITY, f64::min);
        let high = rounds.iter().copied().fold(0.0, f64::max);
        println!(
            "{:>8} {:>7} | {:>9.0} .. {:>9.0} ({:+.0}% .. {:+.0}% of the median)",
            row.protocol,
            row.clients,
            low,
            high,
            (low / row.real_ops_per_s - 1.0) * 100.0,
            (high / row.real_ops_per_s - 1.0) * 100.0
        );
    }
}

fn summarise(
    rows: Vec<CompareRow>,
    args: CompareArgs,
    costs: CostTable,
    saved: Saved,
) -> anyhow::Result<i32> {
    let Saved { machine, host_cores, load_average } = saved;
    let count = |within: &dyn Fn(&CompareRow) -> bool| rows.iter().filter(|row| within(row)).count();
    let whole = count(&|row| row.model.within(0.2));
    let shared = count(&|row| row.model_at_share.within(0.2));
    let cpu = count(&|row| row.model.cpu_error.abs() <= 0.2);
    println!(
        "within 20% on both throughput and p50: {whole} of {} rows with the whole host, {shared} at the run's CPU share; {cpu} on the nodes' CPU per operation",
        rows.len()
    );
    print_traffic(&rows);
    print_round_spread(&rows);
    println!(
        "(`used`: cores the run used; `other`: cores other processes used meanwhile (/proc/stat); `share`: run / (run + runqueue wait x other / {host_cores}) of the run's threads (schedstat); the model at the share divides every CPU cost by it)"
    );
    let comparison = Comparison {
        machine,
        load_average,
        costs,
        write_percent: args.write_percent,
        rounds: args.rounds,
        seconds: args.seconds,
        host_cores,
        rows,
    };
    write_json(&args.json, &comparison)?;
    println!("JSON: {}", args.json.display());
    Ok(0)
}

fn print_row(row: &CompareRow, header: bool) {
    if header {
        println!(
            "{:>8} {:>7} | {:>9} {:>9} {:>6} {:>12} | {:>8} {:>8} {:>6} {:>12} | {:>7} {:>7} {:>6} | {:>7} {:>7} | {:>5} {:>5} {:>5}",
            "protocol",
            "clients",
            "real op/s",
            "model",
            "err",
            "at share",
            "real p50",
            "model",
            "err",
            "at share",
            "real cpu",
            "model",
            "err",
            "gen cpu",
            "model",
            "used",
            "other",
            "share",
        );
    }
    let percent = |error: f64| format!("{:+.0}%", error * 100.0);
    let share = &row.model_at_share;
    println!(
        "{:>8} {:>7} | {:>9.0} {:>9.0} {:>6} {:>12} | {:>8.1} {:>8.1} {:>6} {:>12} | {:>7.1} {:>7.1} {:>6} | {:>7.1} {:>7.1} | {:>5.2} {:>5.2} {:>5.2}",
        row.protocol,
        row.clients,
        row.real_ops_per_s,
        row.model.ops_per_s,
        percent(row.model.throughput_error),
        format!("{:.0} {}", share.ops_per_s, percent(share.throughput_error)),
        row.real_p50_us,
        row.model.p50_us,
        percent(row.model.p50_error),
        format!("{:.0} {}", share.p50_us, percent(share.p50_error)),
        row.real_cpu_us_per_op,
        row.model.cpu_us_per_op,
        percent(row.model.cpu_error),
        row.real_client_cpu_us_per_op,
        row.model.client_cpu_us_per_op,
        row.real_cores_used,
        row.real_others_cores,
        row.real_cpu_share,
    );
}

/// This machine's CPU clock, from the first `cpu MHz` line of /proc/cpuinfo (what
/// `chorus model paper` scales a table from).
fn cpu_ghz() -> Option<f64> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = cpuinfo.lines().find(|line| line.starts_with("cpu MHz"))?;
    let mhz: f64 = line.split(':').nth(1)?.trim().parse().ok()?;
    (mhz > 0.0).then(|| (mhz / 1e3 * 100.0).round() / 100.0)
}

/// One compared run, as the model takes it.
struct Loopback<'a> {
    protocol: &'a str,
    clients: usize,
    write_percent: u32,
    host_cores: u32,
    writes_one_by_one: bool,
}

/// The model of what `compare` runs: 3 one-thread nodes (the server's default
/// `worker_threads = 1`) and the load generator sharing this machine's cores over loopback.
fn predict_loopback(run: &Loopback, costs: &CostTable) -> anyhow::Result<chorus_sim::model::ModelReport> {
    let Loopback { protocol, clients, write_percent, host_cores, writes_one_by_one } = *run;
    let mut config = ModelConfig::new(protocol, NODES, 1, Network::loopback(costs), clients as u32);
    config.writes_one_by_one = writes_one_by_one;
    config.host_cores = Some(host_cores);
    config.costs = costs.clone();
    let mut workload = Workload::named(&format!("kv-w{write_percent}")).context("a workload")?;
    workload.keys = KEYS;
    workload.value_bytes = VALUE_BYTES;
    config.workload = workload;
    config.duration = Time::from_millis(300);
    predict(&config).map_err(anyhow::Error::msg)
}

fn options(targets: &[SocketAddr], clients: usize, duration: Option<Duration>) -> RunOptions {
    RunOptions {
        targets: targets.to_vec(),
        clients,
        pipeline: 1,
        rate: None,
        operations: u64::MAX / 4,
        duration_max: duration,
        client: ClientConfig {
            api: Api::Resp,
            keyspace: Keyspace::Kv,
            value_bytes: VALUE_BYTES,
            wait: None,
            seed: 1,
        },
    }
}

fn load_keys(targets: &[SocketAddr], runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let options = options(targets, 16, None);
    runtime.block_on(driver::load(&options, KEYS, 16, &ProgressBar::hidden())).context("loading the keys")?;
    Ok(())
}

/// The nodes' background: CPU (ticks, heartbeats) and peer traffic per second with no clients.
struct Idle {
    cpu_us_per_s: f64,
    frames_per_s: f64,
    messages_per_s: f64,
    wakes_per_s: f64,
}

fn idle_rates(procs: &Procs, targets: &[SocketAddr], period: Duration) -> anyhow::Result<Idle> {
    let before = snapshot(procs, targets)?;
    std::thread::sleep(period);
    let after = snapshot(procs, targets)?;
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    Ok(Idle {
        cpu_us_per_s: (after.cpu_us - before.cpu_us) as f64 / seconds,
        frames_per_s: (after.frames - before.frames) as f64 / seconds,
        messages_per_s: (after.messages - before.messages) as f64 / seconds,
        wakes_per_s: (after.wakes - before.wakes) as f64 / seconds,
    })
}

struct Snapshot {
    at: Instant,
    cpu_us: u64,
    self_cpu_us: u64,
    /// Every CPU of the host, busy (steal included), from /proc/stat.
    host_busy_us: u64,
    /// The nodes' and this process's threads: time run and time runnable but waiting.
    sched_run_ns: u64,
    sched_wait_ns: u64,
    frames: u64,
    messages: u64,
    wakes: u64,
    /// This process's (the load generator's) voluntary sleeps.
    self_wakes: u64,
}

fn snapshot(procs: &Procs, targets: &[SocketAddr]) -> anyhow::Result<Snapshot> {
    let cpu_us =
        chorus_bench::group::run::tree_cpu_us(&procs.pids()).context("cannot read the nodes' CPU time")?;
    let (mut frames, mut messages) = (0, 0);
    for &target in targets {
        let info = procs::resp_text(target, &[b"INFO", b"replication"])?;
        frames += peer_counter(&info, "frames_sent");
        messages += peer_counter(&info, "messages_received");
    }
    let wakes = procs.pids().iter().map(|pid| voluntary_switches(*pid)).sum();
    let self_wakes = voluntary_switches(std::process::id());
    let mut pids = procs.pids();
    pids.push(std::process::id());
    let (sched_run_ns, sched_wait_ns) =
        pids.iter().map(|pid| schedstat(*pid)).fold((0, 0), |sum, (run, wait)| (sum.0 + run, sum.1 + wait));
    Ok(Snapshot {
        at: Instant::now(),
        sched_run_ns,
        sched_wait_ns,
        cpu_us,
        self_cpu_us: self_cpu_us(),
        host_busy_us: host_busy_us().context("cannot read /proc/stat")?,
        frames,
        messages,
        wakes,
        self_wakes,
    })
}

/// The host's busy CPU time since boot, all CPUs: user, nice, system, irq, softirq and steal
/// (the hypervisor's, which the run could not have either).
fn host_busy_us() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    host_busy_us_of(&stat, clock_ticks_per_s())
}

fn host_busy_us_of(stat: &str, ticks_per_s: u64) -> anyhow::Result<u64> {
    let line = stat.lines().find(|line| line.starts_with("cpu ")).context("no cpu line")?;
    let fields: Vec<u64> =
        line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>().context("a cpu field")?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = fields[..] else {
        bail!("a cpu line of {} fields", fields.len());
    };
    Ok((user + nice + system + irq + softirq + steal) * 1_000_000 / ticks_per_s.max(1))
}

fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// Time every thread of `pid` ran and waited on a runqueue, in nanoseconds (schedstat).
fn schedstat(pid: u32) -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|line| {
            let mut fields = line.split_whitespace().map(|field| field.parse::<u64>().ok());
            Some((fields.next()??, fields.next()??))
        })
        .fold((0, 0), |sum, (run, wait)| (sum.0 + run, sum.1 + wait))
}

/// The share of CPU a run's threads got: see [`RunCounters::cpu_share`].
fn cpu_share(run_ns: u64, wait_ns: u64, others_cores: f64, host_cores: f64) -> f64 {
    let others = (others_cores / host_cores).clamp(0.0, 1.0);
    let share = run_ns as f64 / (run_ns as f64 + wait_ns as f64 * others).max(1.0);
    share.clamp(0.05, 1.0)
}

/// Voluntary context switches of the calling thread so far.
fn thread_sleeps() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status_sleeps(&status)
}

fn status_sleeps(status: &str) -> u64 {
    let line = status.lines().find(|line| line.starts_with("voluntary_ctxt_switches:"));
    line.and_then(|line| line.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// Voluntary context switches of every thread of `pid` (each one a sleep, so a later wake).
fn voluntary_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .map(|status| status_sleeps(&status))
        .sum()
}

/// Sum of `name=<n>` over the `peerN:` lines of INFO replication.
fn peer_counter(info: &str, name: &str) -> u64 {
    let prefix = format!("{name}=");
    info.lines()
        .filter(|line| line.starts_with("peer"))
        .flat_map(|line| line.split([':', ',']))
        .filter_map(|field| field.trim().strip_prefix(&prefix)?.parse::<u64>().ok())
        .sum()
}

fn self_cpu_us() -> u64 {
    // SAFETY: getrusage writes into the struct we pass and has no other effects.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let us = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// One measured run of `clients` closed-loop clients, with the nodes' background removed.
#[allow(clippy::too_many_arguments)]
fn measure(
    procs: &Procs,
    targets: &[SocketAddr],
    runtime: &tokio::runtime::Runtime,
    stop: &Arc<AtomicBool>,
    write_percent: u32,
    clients: usize,
    duration: Duration,
    idle: &Idle,
) -> anyhow::Result<RunCounters> {
    let spec = KvSpec {
        write_ratio: write_percent as f64 / 100.0,
        keys: KEYS,
        operations: u64::MAX / 4,
        value_bytes: VALUE_BYTES,
        distribution: Distribution::Uniform,
    };
    let options = options(targets, clients, Some(duration));
    let before = snapshot(procs, targets)?;
    let result = runtime.block_on(driver::run(
        &options,
        OpGen::kv(&spec, 1, clients),
        &ProgressBar::hidden(),
        stop.clone(),
    ))?;
    let after = snapshot(procs, targets)?;
    let report = Report::of(&result);
    if report.errors > 0 || report.operations == 0 {
        bail!(
            "the run failed: {} errors, {} operations ({:?})",
            report.errors,
            report.operations,
            report.first_error
        );
    }
    let ops = report.operations as f64;
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    let per_op = |delta: u64, idle_per_s: f64| (delta as f64 - idle_per_s * seconds).max(0.0) / ops;
    let cpu_us = after.cpu_us - before.cpu_us;
    let self_us = after.self_cpu_us - before.self_cpu_us;
    let host_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let others_cores =
        (after.host_busy_us.saturating_sub(before.host_busy_us) as f64 - (cpu_us + self_us) as f64).max(0.0)
            / 1e6
            / seconds;
    Ok(RunCounters {
        ops: report.operations,
        ops_per_s: report.ops_per_s,
        p50_us: report.overall.latency.p50_us,
        server_cpu_us_per_op: per_op(cpu_us, idle.cpu_us_per_s),
        server_cpu_raw_us_per_op: cpu_us as f64 / ops,
        client_cpu_us_per_op: (after.self_cpu_us - before.self_cpu_us) as f64 / ops,
        client_wakes_per_op: (after.self_wakes - before.self_wakes) as f64 / ops,
        frames_per_op: per_op(after.frames - before.frames, idle.frames_per_s),
        messages_per_op: per_op(after.messages - before.messages, idle.messages_per_s),
        wakes_per_op: per_op(after.wakes - before.wakes, idle.wakes_per_s),
        wakes_raw_per_op: (after.wakes - before.wakes) as f64 / ops,
        ticks_per_op: NODES as f64 * TICKS_PER_S * seconds / ops,
        cores_used: (cpu_us + self_us) as f64 / 1e6 / seconds,
        others_cores,
        cpu_share: cpu_share(
            after.sched_run_ns - before.sched_run_ns,
            after.sched_wait_ns - before.sched_wait_ns,
            others_cores,
            host_cores,
        ),
    })
}

/// The round with the median throughput (a whole round, so its figures stay consistent).
fn median_run(mut rounds: Vec<RunCounters>) -> RunCounters {
    assert!(!rounds.is_empty());
    rounds.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    rounds.swap_remove(rounds.len() / 2)
}

/// A ping-pong over loopback TCP, per round trip: wall time, CPU of both threads, and their
/// voluntary sleeps.
#[derive(Clone, Debug, Serialize)]
struct PingPong {
    wall_ns: f64,
    cpu_ns: f64,
    sleeps: f64,
}

/// Two threads, each on a tokio current-thread runtime as a node runs, bounce one byte over
/// loopback TCP `round_trips` times: each read finds nothing and parks the runtime, each
/// write wakes the other side.
fn tokio_ping_pong(round_trips: u32) -> anyhow::Result<PingPong> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<(u64, u64)> {
        let (stream, _) = listener.accept()?;
        bounce_on_node_runtime(stream, round_trips, false)
    });
    let stream = TcpStream::connect(addr)?;
    let started = Instant::now();
    let (cpu_ns, sleeps) = bounce_on_node_runtime(stream, round_trips, true)?;
    let wall_ns = started.elapsed().as_nanos() as f64;
    let (echo_cpu_ns, echo_sleeps) =
        echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    let per_round_trip = |total: u64| total as f64 / round_trips as f64;
    Ok(PingPong {
        wall_ns: wall_ns / round_trips as f64,
        cpu_ns: per_round_trip(cpu_ns + echo_cpu_ns),
        sleeps: per_round_trip(sleeps + echo_sleeps),
    })
}

/// One end of the ping-pong (`serve`: it writes first): its thread's CPU and sleeps.
fn bounce_on_node_runtime(stream: TcpStream, round_trips: u32, serve: bool) -> std::io::Result<(u64, u64)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    let (cpu_started, sleeps_started) = (thread_cpu_ns(), thread_sleeps());
    runtime.block_on(async move {
        let mut stream = tokio::net::TcpStream::from_std(stream)?;
        let mut byte = [7u8; 1];
        for _ in 0..round_trips {
            if serve {
                stream.write_all(&byte).await?;
            }
            stream.read_exact(&mut byte).await?;
            if !serve {
                stream.write_all(&byte).await?;
            }
        }
        Ok::<_, std::io::Error>(())
    })?;
    Ok((thread_cpu_ns() - cpu_started, thread_sleeps() - sleeps_started))
}

/// A tokio current-thread runtime, as a node runs, waits for a 1 ms interval `ticks` times
/// with nothing else to do: its thread's CPU per sleep (each a timer's wake), and sleeps per
/// tick.
fn timer_wake(ticks: u32) -> anyhow::Result<(f64, f64)> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (cpu_started, sleeps_started) = (thread_cpu_ns(), thread_sleeps());
    runtime.block_on(async {
        let mut interval = tokio::time::interval(Duration::from_millis(1));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        for _ in 0..ticks {
            interval.tick().await;
        }
    });
    let sleeps = thread_sleeps() - sleeps_started;
    if sleeps == 0 {
        bail!("a runtime waiting for its timer never slept: cannot measure a timer's wake");
    }
    Ok(((thread_cpu_ns() - cpu_started) as f64 / sleeps as f64, sleeps as f64 / ticks as f64))
}

/// The ping-pong's four syscalls per round trip (write, read, write, read) in ONE thread on a
/// loopback pair: every read finds its byte, nothing sleeps. CPU per round trip.
fn syscalls_cpu_ns_per_round_trip(round_trips: u32) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut a = TcpStream::connect(listener.local_addr()?)?;
    let (mut b, _) = listener.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    let started = thread_cpu_ns();
    let mut byte = [7u8; 1];
    for _ in 0..round_trips {
        a.write_all(&byte)?;
        b.read_exact(&mut byte)?;
        b.write_all(&byte)?;
        a.read_exact(&mut byte)?;
    }
    Ok((thread_cpu_ns() - started) as f64 / round_trips as f64)
}

/// CPU of both ends per byte streamed through loopback, in picoseconds.
fn stream_cpu_ps_per_byte(bytes: usize) -> anyhow::Result<u64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut stream, _) = listener.accept()?;
        let started = thread_cpu_ns();
        let mut buffer = vec![0u8; 64 << 10];
        while stream.read(&mut buffer)? > 0 {}
        Ok(thread_cpu_ns() - started)
    });
    let mut stream = TcpStream::connect(addr)?;
    let started = thread_cpu_ns();
    let chunk = vec![1u8; 64 << 10];
    for _ in 0..bytes / chunk.len() {
        stream.write_all(&chunk)?;
    }
    drop(stream);
    let writer_cpu = thread_cpu_ns() - started;
    let reader_cpu = reader.join().map_err(|_| anyhow::anyhow!("the reader thread panicked"))??;
    Ok(((writer_cpu + reader_cpu) as f64 * 1e3 / bytes as f64).round() as u64)
}

fn thread_cpu_ns() -> u64 {
    // SAFETY: clock_gettime writes into the struct we pass and has no other effects.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time);
        time
    };
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

/// The median time of appending 4 KiB to a file in `dir` (created; the caller removes it)
/// and `fdatasync`ing it.
fn median_sync_ns(dir: &Path, syncs: usize) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut file = std::fs::File::create(dir.join("sync-probe"))?;
    let block = vec![0u8; 4096];
    let mut samples = Vec::with_capacity(syncs);
    for _ in 0..syncs {
        file.write_all(&block)?;
        let started = Instant::now();
        file.sync_data()?;
        samples.push(started.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_is_the_cpu_difference_of_two_runs_per_sleep_of_difference() {
        // 30 us per GET asleep 0.9 times, 10 us at 0.1: (30 - 10) us / 0.8 sleeps = 25 us.
        let wake_ns = wake_between("a node", (30.0, 0.9), (10.0, 0.1)).expect("apart");
        assert!((wake_ns - 25_000.0).abs() < 1e-6, "{wake_ns}");
    }

    #[test]
    fn a_protocols_handlers_are_its_message_and_its_request_beyond_it() {
        let timing = |client_ns_mean, message_ns_mean| HandlerTiming {
            protocol: "raftlog".into(),
            client_calls: 10,
            client_ns_mean,
            message_calls: 10,
            message_ns_mean,
        };
        assert_eq!(
            handlers_of(&timing(1_500.4, 1_200.0)),
            ProtocolHandlers { handle_ns: 1_200, key_op_ns: 300 }
        );
        // A request cheaper than a message (raftlog's followers batch requests) costs the
        // message's handler, nothing beyond.
        assert_eq!(handlers_of(&timing(900.0, 1_200.0)), ProtocolHandlers { handle_ns: 1_200, key_op_ns: 0 });
    }

    #[test]
    fn a_frame_and_a_message_are_told_apart_by_two_packings() {
        // 2 us per frame and 0.5 us per message: 6 messages in 1.5 frames, then in 0.5.
        let work =
            |frames: f64, messages: f64| PeerWork { cpu_us: frames * 2.0 + messages * 0.5, frames, messages };
        let (frame_us, message_us) = frame_and_message_us(&work(1.5, 6.0), &work(0.5, 6.0)).expect("apart");
        assert!((frame_us - 2.0).abs() < 1e-9 && (message_us - 0.5).abs() < 1e-9, "{frame_us} {message_us}");
    }

    #[test]
    fn packings_too_alike_or_a_negative_cost_are_refused() {
        let alike = PeerWork { cpu_us: 10.0, frames: 1.2, messages: 6.0 };
        let packed = PeerWork { cpu_us: 9.9, frames: 1.1, messages: 6.0 };
        assert!(frame_and_message_us(&alike, &packed).is_err(), "5.0 and 5.5 messages per frame");
        // Fewer frames cost MORE: the solution's frame cost is negative.
        let upside_down = PeerWork { cpu_us: 12.0, frames: 0.5, messages: 6.0 };
        assert!(frame_and_message_us(&alike, &upside_down).is_err());
    }

    #[test]
    fn runs_too_alike_or_upside_down_give_no_wake() {
        assert!(wake_between("a node", (30.0, 0.5), (10.0, 0.4)).is_err(), "0.1 sleeps apart");
        assert!(wake_between("a node", (10.0, 0.9), (12.0, 0.1)).is_err(), "cheaper asleep");
    }

    #[test]
    fn peer_counters_are_summed_over_the_peer_lines() {
        let info = "# Replication\r\nrole:master\r\npeer1:addr=127.0.0.1:1,connected=1,frames_sent=10,messages_sent=12,writes=9,frames_dropped=0,messages_received=7,connects=1\r\npeer2:addr=127.0.0.1:2,connected=1,frames_sent=5,messages_sent=5,writes=5,frames_dropped=0,messages_received=3,connects=1\r\n";
        assert_eq!(peer_counter(info, "frames_sent"), 15);
        assert_eq!(peer_counter(info, "messages_received"), 10);
        assert_eq!(peer_counter(info, "connects"), 2);
    }

    /// Busy is everything but idle and iowait, steal included, in the kernel's clock ticks.
    #[test]
    fn host_busy_time_counts_steal_and_leaves_idle_out() {
        let stat = "cpu  100 5 20 900 40 3 2 10 0 0\ncpu0 50 2 10 450 20 1 1 5 0 0\n";
        assert_eq!(host_busy_us_of(stat, 100).expect("parsed"), (100 + 5 + 20 + 3 + 2 + 10) * 10_000);
        assert!(host_busy_us_of("cpu  1 2 3\n", 100).is_err());
    }

    /// Only the waits others caused count: on a quiet host the share is 1 however long the
    /// run's own threads queued for each other.
    #[test]
    fn the_cpu_share_counts_the_waits_others_caused() {
        assert_eq!(cpu_share(1_000, 3_000, 0.0, 2.0), 1.0);
        assert_eq!(cpu_share(1_000, 1_000, 2.0, 2.0), 0.5);
        assert_eq!(cpu_share(1_000, 2_000, 1.0, 2.0), 0.5);
        assert_eq!(cpu_share(0, 1_000, 2.0, 2.0), 0.05);
    }

    #[test]
    fn sleeps_are_the_voluntary_switches() {
        let status = "Name:\tchorus\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(status_sleeps(status), 42);
    }

    #[test]
    fn the_median_run_is_a_whole_round() {
        let run = |ops_per_s: f64, p50_us: f64| RunCounters { ops_per_s, p50_us, ..Default::default() };
        let median = median_run(vec![run(3.0, 30.0), run(1.0, 10.0), run(2.0, 20.0)]);
        assert_eq!((median.ops_per_s, median.p50_us), (2.0, 20.0));
    }
}
