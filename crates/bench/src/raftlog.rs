//! `chorus bench raftlog`: Cyclone's evaluation (§5) on loopback, on real `chorus node`
//! processes: throughput (client commands and Raft entries per second) and latency as the
//! optimisations are added (one log without batching, + batching, + 8 logs), then against
//! the replica count (1, 3, 5) and the payload size (0-512 B); and the latency of one client's
//! ganged operations against the number of logs they span (the paper's "Ganged Operations"
//! figure). Saves JSON and a PNG.
//!
//! The nodes' data directories are on /dev/shm where there is one: the circular log is then
//! msync'd to RAM, the stand-in for Cyclone's NVDIMM (docs/benchmarks.md says so).
//! `--data-root` puts them on a real file system instead, so every point syncs to its disk.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

use crate::procs::{self, Procs};

#[derive(clap::Args, Clone, Debug)]
pub struct RaftlogBenchArgs {
    /// Shorter points (1 s each instead of 3 s).
    #[arg(long)]
    pub quick: bool,
    /// Seconds measured per point (after a short warm-up).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Concurrent clients (one connection each, closed loop), spread over the replicas.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Where the JSON report and the PNG go.
    #[arg(long, default_value = "bench-results/raftlog")]
    pub out: PathBuf,
    /// Which sweeps to run (comma-separated): optimizations, replicas, payload, logs,
    /// checkpoint (write latency without checkpoints and with one every 2,000 entries),
    /// ganged (one client's MULTI/EXEC latency against the logs it spans, ganged and locking).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "optimizations,replicas,payload,logs,checkpoint,ganged"
    )]
    pub sweeps: Vec<String>,
    /// Shards (event loops) per node in the "logs" sweep's second series: 0 = one per core
    /// (as many as divide the point's log count).
    #[arg(long, default_value_t = 0)]
    pub shards: usize,
    /// Extra arguments for every node (repeat it), for A/B runs, e.g.
    /// `--node-arg=--raftlog-execution=coupled`.
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
    /// Where the nodes keep their data (default: /dev/shm). A directory on a real file system
    /// makes every point's syncs go to its disk.
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Where the clients send: "all" (spread over the replicas, which forward writes to their
    /// logs' leaders) or "leader" (every log led by one node, `raftlog_leaders = "together"`,
    /// and every client there, as Cyclone's clients send to the leader replica).
    #[arg(long, default_value = "all", value_parser = ["all", "leader"])]
    pub clients_at: String,
}

/// What every point of one run shares.
struct RunOptions<'a> {
    clients: usize,
    seconds: f64,
    node_args: &'a [String],
    at_leader: bool,
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Which sweep: "optimizations", "replicas" or "payload".
    pub sweep: &'static str,
    pub label: String,
    pub replicas: usize,
    pub logs: usize,
    /// Event loops (threads) per node the logs are split over.
    pub shards: usize,
    pub batch_max: usize,
    pub payload_bytes: usize,
    pub clients: usize,
    pub seconds: f64,
    pub commands_per_s: f64,
    /// Raft entries proposed per second, summed over the leaders.
    pub entries_per_s: f64,
    pub commands_per_entry: f64,
    /// Batches of client commands a node sent to another node's leader, summed over the nodes
    /// (none when every client is at the leader of every log).
    pub batches_forwarded: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Checkpoints the nodes took while the point ran (summed).
    pub checkpoints: u64,
    pub errors: u64,
}

#[derive(Serialize)]
struct Report {
    machine_cpus: usize,
    note: String,
    points: Vec<Point>,
}

struct Setup {
    sweep: &'static str,
    label: String,
    replicas: usize,
    logs: usize,
    shards: usize,
    batch_max: usize,
    payload_bytes: usize,
    /// `--raftlog-snapshot-entries`, if not the node's default.
    snapshot_entries: Option<u64>,
    /// The ganged sweep: one client whose every request is a MULTI/EXEC of one INCRBY per
    /// log over this many logs, run as `--raftlog-transactions` says.
    multi: Option<(usize, &'static str)>,
}

/// Shards per node for `logs` logs when asked for `shards` (0: one per core, as many as
/// divide `logs`).
fn shards_for(logs: usize, shards: usize) -> usize {
    let wanted =
        if shards == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { shards };
    (1..=wanted.min(logs)).rev().find(|count| logs.is_multiple_of(*count)).unwrap_or(1)
}

fn plan(shards: usize) -> Vec<Setup> {
    let setup = |sweep, label: &str, replicas, logs, batch_max, payload_bytes| Setup {
        sweep,
        label: label.to_string(),
        replicas,
        logs,
        shards: 1,
        batch_max,
        payload_bytes,
        snapshot_entries: None,
        multi: None,
    };
    let mut plan = vec![
        setup("optimizations", "1 log, no batching", 3, 1, 1, 64),
        setup("optimizations", "+ batching", 3, 1, 1024, 64),
        setup("optimizations", "+ 8 logs", 3, 8, 1024, 64),
    ];
    for replicas in [1, 3, 5] {
        plan.push(setup("replicas", &format!("{replicas} replicas"), replicas, 8, 1024, 64));
    }
    for payload in [0, 64, 256, 512] {
        plan.push(setup("payload", &format!("{payload} B"), 3, 8, 1024, payload));
    }
    // Throughput against the number of logs at a fixed client count: all logs on one event
    // loop, then split over shards (one event loop and thread each).
    for logs in [1, 2, 4, 8] {
        plan.push(setup("logs", &format!("{logs} logs, 1 loop"), 3, logs, 1024, 64));
    }
    for logs in [1, 2, 4, 8] {
        let shards = shards_for(logs, shards);
        let mut point = setup("logs", &format!("{logs} logs, {shards} loops"), 3, logs, 1024, 64);
        point.shards = shards;
        plan.push(point);
    }
    // Does a checkpoint stall writes? The same load without checkpoints and with one every
    // 2,000 applied entries (each encodes, writes and fsyncs every log's state in the loop).
    for (label, entries) in [("no checkpoints", 0), ("checkpoint / 2000 entries", 2_000)] {
        let mut point = setup("checkpoint", label, 3, 8, 1024, 256);
        point.snapshot_entries = Some(entries);
        plan.push(point);
    }
    // Cyclone's ganged operations: unloaded latency (one client) against the number of logs
    // a multi-key request spans, ganged and with two-phase locking.
    for transactions in ["ganged", "locking"] {
        for spans in [1, 2, 4, 8] {
            let logs = if spans == 1 { "log" } else { "logs" };
            let mut point = setup("ganged", &format!("{transactions}, {spans} {logs}"), 3, 8, 1024, 8);
            point.multi = Some((spans, transactions));
            plan.push(point);
        }
    }
    plan
}

pub fn run(args: RaftlogBenchArgs, chorus: &Path) -> anyhow::Result<i32> {
    let seconds = args.duration_s.unwrap_or(if args.quick { 1.0 } else { 3.0 });
    anyhow::ensure!(seconds > 0.0 && args.clients > 0, "--duration-s and --clients must be positive");
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut points = Vec::new();
    let root = match &args.data_root {
        Some(dir) => dir.join(format!("chorus-bench-{}", std::process::id())),
        None => procs::scratch_root(),
    };
    let run = RunOptions {
        clients: args.clients,
        seconds,
        node_args: &args.node_args,
        at_leader: args.clients_at == "leader",
    };
    let plan =
        plan(args.shards).into_iter().filter(|setup| args.sweeps.iter().any(|sweep| sweep == setup.sweep));
    for (index, setup) in plan.enumerate() {
        eprintln!("chorus bench raftlog: {} / {}", setup.sweep, setup.label);
        let dir = root.join(format!("raftlog-{index}"));
        let point = measure(chorus, &setup, &dir, &run, &stop)
            .with_context(|| format!("{} / {}", setup.sweep, setup.label))?;
        eprintln!(
            "  {:.0} commands/s, {:.0} entries/s ({:.1} commands/entry), p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, {} checkpoints, {} batches forwarded",
            point.commands_per_s,
            point.entries_per_s,
            point.commands_per_entry,
            point.p50_us,
            point.p99_us,
            point.p999_us,
            point.checkpoints,
            point.batches_forwarded
        );
        points.push(point);
    }
    let _ = std::fs::remove_dir(&root); // each point removed its own directory
    let report = Report {
        machine_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        note: format!(
            "loopback, clients and every replica on one machine; data dirs under {}; clients at {}",
            root.parent().unwrap_or(&root).display(),
            if run.at_leader { "the node that leads every log" } else { "every replica" }
        ),
        points,
    };
    let json = args.out.join("raftlog.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    let png = args.out.join("raftlog.png");
    plot(&report.points, &png)?;
    print!("{}", table(&report.points));
    println!("JSON: {}\nPNG: {}", json.display(), png.display());
    Ok(0)
}

/// The table and the ratios the docs quote.
pub fn table(points: &[Point]) -> String {
    let mut text = String::new();
    text.push_str(&format!(
        "{:<14} {:<26} {:>12} {:>12} {:>9} {:>9} {:>9} {:>10} {:>11} {:>9}\n",
        "sweep",
        "configuration",
        "commands/s",
        "entries/s",
        "cmd/entry",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "checkpoints",
        "forwarded"
    ));
    for p in points {
        text.push_str(&format!(
            "{:<14} {:<26} {:>12.0} {:>12.0} {:>9.1} {:>9.0} {:>9.0} {:>10.0} {:>11} {:>9}\n",
            p.sweep,
            p.label,
            p.commands_per_s,
            p.entries_per_s,
            p.commands_per_entry,
            p.p50_us,
            p.p99_us,
            p.p999_us,
            p.checkpoints,
            p.batches_forwarded
        ));
    }
    let ladder: Vec<&Point> = points.iter().filter(|p| p.sweep == "optimizations").collect();
    if let [none, batching, logs] = ladder.as_slice() {
        text.push_str(&format!(
            "ratios: batching x{:.2} over no batching, 8 logs x{:.2} over 1 log (commands/s)\n",
            batching.commands_per_s / none.commands_per_s.max(1.0),
            logs.commands_per_s / batching.commands_per_s.max(1.0)
        ));
    }
    // The checkpoint sweep: tail latency with checkpoints against without.
    let checkpoint: Vec<&Point> = points.iter().filter(|p| p.sweep == "checkpoint").collect();
    if let [without, with] = checkpoint.as_slice() {
        text.push_str(&format!(
            "checkpoints: p99.9 x{:.2}, p99 x{:.2}, commands/s x{:.2} with a checkpoint every 2,000 entries ({} taken)\n",
            with.p999_us / without.p999_us.max(1.0),
            with.p99_us / without.p99_us.max(1.0),
            with.commands_per_s / without.commands_per_s.max(1.0),
            with.checkpoints
        ));
    }
    // The ganged sweep: each point's median latency against one log, ganged.
    let ganged: Vec<&Point> = points.iter().filter(|p| p.sweep == "ganged").collect();
    if let Some(base) = ganged.first() {
        let ratios: Vec<String> =
            ganged.iter().map(|p| format!("{} x{:.2}", p.label, p.p50_us / base.p50_us.max(1.0))).collect();
        text.push_str(&format!("ganged p50 latency vs 1 log: {}\n", ratios.join(", ")));
    }
    // The logs sweep: each point against one log on one loop.
    let logs: Vec<&Point> = points.iter().filter(|p| p.sweep == "logs").collect();
    if let Some(base) = logs.iter().find(|p| p.logs == 1 && p.shards == 1) {
        let ratios: Vec<String> = logs
            .iter()
            .map(|p| format!("{} x{:.2}", p.label, p.commands_per_s / base.commands_per_s.max(1.0)))
            .collect();
        text.push_str(&format!("logs vs 1 log (commands/s): {}\n", ratios.join(", ")));
    }
    text
}

fn measure(
    chorus: &Path,
    setup: &Setup,
    dir: &Path,
    run: &RunOptions,
    stop: &AtomicBool,
) -> anyhow::Result<Point> {
    let mut procs = Procs::new("raftlog", dir.to_path_buf())?;
    let ports = procs::free_ports(2 * setup.replicas)?;
    let client_addrs: Vec<SocketAddr> = (0..setup.replicas).map(|i| procs::localhost(ports[2 * i])).collect();
    for (node, client_addr) in client_addrs.iter().enumerate() {
        let mut command = Command::new(chorus);
        command
            .arg("node")
            .args(["--node-id", &node.to_string()])
            .args(["--protocol", "raftlog"])
            .args(["--client-addr", &client_addr.to_string()])
            .args(["--cluster-token", "bench-raftlog-token-0123"])
            .args(["--data-dir", dir.join(format!("node-{node}")).to_str().expect("utf-8 path")])
            .args(["--raftlog-logs", &setup.logs.to_string()])
            .args(["--raftlog-shards", &setup.shards.to_string()])
            .args(["--raftlog-batch-max", &setup.batch_max.to_string()])
            .args(["--log-level", "warn"])
            .args(run.node_args);
        if run.at_leader {
            command.args(["--raftlog-leaders", "together"]);
        }
        if let Some(entries) = setup.snapshot_entries {
            command.args(["--raftlog-snapshot-entries", &entries.to_string()]);
        }
        if let Some((_, transactions)) = setup.multi {
            command.args(["--raftlog-transactions", transactions]);
        }
        for peer in 0..setup.replicas {
            command.args(["--peer", &format!("{peer}={}", procs::localhost(ports[2 * peer + 1]))]);
        }
        procs.spawn(&format!("node-{node}"), command)?;
    }
    // Ready: every node answers a write (its logs have leaders).
    for (node, addr) in client_addrs.iter().enumerate() {
        let key = format!("ready-{node}");
        procs::wait_until(&mut procs, "raftlog node", stop, || {
            procs::resp_text(*addr, &[b"SET", key.as_bytes(), b"1"])
                .is_ok_and(|reply| reply.starts_with("+OK"))
        })?;
    }
    // With the leaders together, the clients go to the node that leads every log, once one
    // does: elections favour node 0, but another node may win the first ones (it started
    // sooner) and keeps them.
    let mut leader_of_all = 0;
    if run.at_leader {
        procs::wait_until(&mut procs, "one node leading every log", stop, || {
            let led = client_addrs.iter().position(|addr| {
                info_sum(std::slice::from_ref(addr), "raftlog_logs_led") == setup.logs as u64
            });
            leader_of_all = led.unwrap_or(0);
            led.is_some()
        })?;
    }
    let warmup = Duration::from_millis(300);
    let (seconds, measured) = (run.seconds, Duration::from_secs_f64(run.seconds));
    let value = vec![b'v'; setup.payload_bytes];
    let clients = if setup.multi.is_some() { 1 } else { run.clients };
    let targets =
        if run.at_leader { &client_addrs[leader_of_all..=leader_of_all] } else { &client_addrs[..] };
    let keys = setup.multi.map(|(spans, _)| keys_spanning(spans, setup.logs));
    let workers: Vec<_> = (0..clients)
        .map(|client| {
            let addr = targets[client % targets.len()];
            let value = value.clone();
            let keys = keys.clone();
            std::thread::spawn(move || match keys {
                Some(keys) => multi_loop(addr, &keys, warmup, measured),
                None => client_loop(addr, client, &value, warmup, measured),
            })
        })
        .collect();
    let started = Instant::now();
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let mut errors = 0;
    while started.elapsed() < warmup {
        std::thread::sleep(Duration::from_millis(10));
    }
    let entries_at_warmup = info_sum(&client_addrs, "raftlog_entries_proposed");
    let forwarded_at_warmup = info_sum(&client_addrs, "raftlog_batches_forwarded");
    let checkpoints_at_warmup = info_sum(&client_addrs, "raftlog_disk_checkpoints");
    for worker in workers {
        let (h, e) = worker.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        histogram.add(h).expect("same bounds");
        errors += e;
    }
    let entries = info_sum(&client_addrs, "raftlog_entries_proposed").saturating_sub(entries_at_warmup);
    let batches_forwarded =
        info_sum(&client_addrs, "raftlog_batches_forwarded").saturating_sub(forwarded_at_warmup);
    let checkpoints =
        info_sum(&client_addrs, "raftlog_disk_checkpoints").saturating_sub(checkpoints_at_warmup);
    procs.stop();
    let _ = std::fs::remove_dir_all(dir);
    let commands = histogram.len() as f64;
    Ok(Point {
        sweep: setup.sweep,
        label: setup.label.clone(),
        replicas: setup.replicas,
        logs: setup.logs,
        shards: setup.shards,
        batch_max: setup.batch_max,
        payload_bytes: setup.payload_bytes,
        clients,
        seconds,
        commands_per_s: commands / seconds,
        entries_per_s: entries as f64 / seconds,
        commands_per_entry: if entries == 0 { 0.0 } else { commands / entries as f64 },
        batches_forwarded,
        p50_us: histogram.value_at_quantile(0.5) as f64 / 1_000.0,
        p99_us: histogram.value_at_quantile(0.99) as f64 / 1_000.0,
        p999_us: histogram.value_at_quantile(0.999) as f64 / 1_000.0,
        checkpoints,
        errors,
    })
}

/// Sum of the INFO counter `field` over the nodes.
fn info_sum(addrs: &[SocketAddr], field: &str) -> u64 {
    let prefix = format!("{field}:");
    addrs
        .iter()
        .filter_map(|addr| procs::resp_text(*addr, &[b"INFO"]).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|line| line.strip_prefix(prefix.as_str()))
                .filter_map(|value| value.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// One key in each of the first `spans` of `logs` logs (one shard per node).
fn keys_spanning(spans: usize, logs: usize) -> Vec<String> {
    (0..spans)
        .map(|log| {
            (0..)
                .map(|i| format!("gang:{i}"))
                .find(|key| chorus_raftlog::log_of(key.as_bytes(), logs) == log)
                .expect("some key hashes to every log")
        })
        .collect()
}

/// One closed-loop client whose requests are MULTI, INCRBY 1 on each key, EXEC, sent at once;
/// the latency is until EXEC's reply arrives.
fn multi_loop(
    addr: SocketAddr,
    keys: &[String],
    warmup: Duration,
    measured: Duration,
) -> (Histogram<u64>, u64) {
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let Ok(mut stream) = TcpStream::connect(addr) else { return (histogram, 1) };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut request = b"*1\r\n$5\r\nMULTI\r\n".to_vec();
    for key in keys {
        request.extend_from_slice(
            format!("*3\r\n$6\r\nINCRBY\r\n${}\r\n{key}\r\n$1\r\n1\r\n", key.len()).as_bytes(),
        );
    }
    request.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
    // +OK, one +QUEUED per key, then EXEC's array header and one integer per key.
    let lines = 2 * keys.len() + 2;
    let (started, mut errors) = (Instant::now(), 0);
    let mut reply = Vec::with_capacity(256);
    while started.elapsed() < warmup + measured {
        let sent = Instant::now();
        if stream.write_all(&request).is_err() {
            return (histogram, errors + 1);
        }
        reply.clear();
        let mut buf = [0u8; 256];
        while reply.windows(2).filter(|pair| pair == b"\r\n").count() < lines {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return (histogram, errors + 1),
                Ok(read) => reply.extend_from_slice(&buf[..read]),
            }
        }
        if reply.split(|byte| *byte == b'\n').any(|line| line.first() == Some(&b'-')) {
            errors += 1;
            continue;
        }
        if started.elapsed() > warmup {
            let _ = histogram.record(sent.elapsed().as_nanos() as u64);
        }
    }
    (histogram, errors)
}

/// One closed-loop client: SET random keys for `warmup + measured`, recording latencies
/// (in ns) after the warm-up.
fn client_loop(
    addr: SocketAddr,
    client: usize,
    value: &[u8],
    warmup: Duration,
    measured: Duration,
) -> (Histogram<u64>, u64) {
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let mut errors = 0;
    let Ok(mut stream) = TcpStream::connect(addr) else { return (histogram, 1) };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let started = Instant::now();
    let mut state = (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut request = Vec::with_capacity(64 + value.len());
    let mut reply = [0u8; 256];
    while started.elapsed() < warmup + measured {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = format!("key:{}", state % 10_000);
        request.clear();
        request.extend_from_slice(
            format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n", key.len(), value.len()).as_bytes(),
        );
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        let sent = Instant::now();
        if stream.write_all(&request).is_err() {
            errors += 1;
            break;
        }
        // A reply to SET is one short line: "+OK\r\n" or "-ERR ...\r\n".
        let mut got = 0;
        loop {
            match stream.read(&mut reply[got..]) {
                Ok(0) | Err(_) => return (histogram, errors + 1),
                Ok(read) => got += read,
            }
            if reply[..got].ends_with(b"\r\n") || got == reply.len() {
                break;
            }
        }
        if reply[0] != b'+' {
            errors += 1;
            continue;
        }
        if started.elapsed() > warmup {
            let _ = histogram.record(sent.elapsed().as_nanos() as u64);
        }
    }
    (histogram, errors)
}

fn plot(points: &[Point], path: &Path) -> anyhow::Result<()> {
    crate::plot::register_font_for_others();
    let root = BitMapBackend::new(path, (2000, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let sweeps: Vec<(&str, &str)> = [
        ("optimizations", "Optimizations (3 replicas, 64 B)"),
        ("replicas", "Replicas (8 logs, batching, 64 B)"),
        ("payload", "Payload (3 replicas, 8 logs, batching)"),
        ("logs", "Logs and event loops (3 replicas, 64 B)"),
    ]
    .into_iter()
    .filter(|(sweep, _)| points.iter().any(|p| p.sweep == *sweep))
    .collect();
    let panels = root.split_evenly((1, sweeps.len().max(1)));
    for (panel, (sweep, title)) in panels.iter().zip(sweeps) {
        let sweep_points: Vec<&Point> = points.iter().filter(|p| p.sweep == sweep).collect();
        let top = sweep_points.iter().map(|p| p.commands_per_s).fold(1.0, f64::max) * 1.15;
        let labels: Vec<String> = sweep_points.iter().map(|p| p.label.clone()).collect();
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..(sweep_points.len() as f64 - 0.5), 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(sweep_points.len().max(1))
            .x_label_formatter(&|x| labels.get(x.round() as usize).cloned().unwrap_or_default())
            .y_desc("commands/s")
            .draw()?;
        chart.draw_series(sweep_points.iter().enumerate().map(|(i, p)| {
            let x = i as f64;
            Rectangle::new([(x - 0.3, 0.0), (x + 0.3, p.commands_per_s)], RGBColor(31, 119, 180).filled())
        }))?;
        chart.draw_series(sweep_points.iter().enumerate().map(|(i, p)| {
            Text::new(
                format!("p50 {:.0} us", p.p50_us),
                (i as f64 - 0.28, p.commands_per_s + top * 0.03),
                ("sans-serif", 13),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_covers_the_optimizations_replicas_and_payloads_of_the_issue() {
        let plan = plan(2);
        let ladder: Vec<(usize, usize)> =
            plan.iter().filter(|s| s.sweep == "optimizations").map(|s| (s.logs, s.batch_max)).collect();
        assert_eq!(ladder, vec![(1, 1), (1, 1024), (8, 1024)]);
        let replicas: Vec<usize> =
            plan.iter().filter(|s| s.sweep == "replicas").map(|s| s.replicas).collect();
        assert_eq!(replicas, vec![1, 3, 5]);
        let payloads: Vec<usize> =
            plan.iter().filter(|s| s.sweep == "payload").map(|s| s.payload_bytes).collect();
        assert_eq!((payloads.first(), payloads.last()), (Some(&0), Some(&512)));
        let logs: Vec<(usize, usize)> =
            plan.iter().filter(|s| s.sweep == "logs").map(|s| (s.logs, s.shards)).collect();
        assert_eq!(logs, vec![(1, 1), (2, 1), (4, 1), (8, 1), (1, 1), (2, 2), (4, 2), (8, 2)]);
    }

    #[test]
    fn the_ganged_sweep_spans_one_to_eight_logs_with_keys_in_distinct_logs() {
        let plan = plan(1);
        let multi: Vec<(usize, &str)> = plan.iter().filter_map(|s| s.multi).collect();
        assert_eq!(multi.len(), 8);
        assert_eq!(multi[3], (8, "ganged"));
        assert_eq!(multi[7], (8, "locking"));
        for spans in [1, 2, 4, 8] {
            let mut logs: Vec<usize> =
                keys_spanning(spans, 8).iter().map(|key| chorus_raftlog::log_of(key.as_bytes(), 8)).collect();
            logs.dedup();
            assert_eq!(logs, (0..spans).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_table_prints_the_ratios_between_the_steps() {
        let point = |label: &str, commands_per_s| Point {
            sweep: "optimizations",
            label: label.to_string(),
            replicas: 3,
            logs: 1,
            shards: 1,
            batch_max: 1,
            payload_bytes: 64,
            clients: 32,
            seconds: 1.0,
            commands_per_s,
            entries_per_s: 1.0,
            commands_per_entry: 1.0,
            batches_forwarded: 0,
            p50_us: 1.0,
            p99_us: 2.0,
            p999_us: 3.0,
            checkpoints: 0,
            errors: 0,
        };
        let text = table(&[point("a", 100.0), point("b", 300.0), point("c", 150.0)]);
        assert!(text.contains("batching x3.00"), "{text}");
        assert!(text.contains("8 logs x0.50"), "{text}");
    }
}
