//! `chorus bench failover`: throughput over time across a replica failure (Hermes §6.6,
//! Figure 9). Starts `--replicas` Chorus nodes, runs closed-loop GET/SET clients on every
//! node but the victim, SIGKILLs the victim after `--kill-after-s`, and counts completed
//! operations in `--bucket-ms` buckets. One run per write ratio; JSON and a PNG plot.
//!
//! Nothing here asserts on timing: the command prints what it measured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use plotters::prelude::*;
use serde::Serialize;

use crate::client::{Api, Client, ClientConfig, Executor, Keyspace};
use crate::driver::{self, RunOptions};
use crate::generator::Distribution;
use crate::procs::{free_ports, localhost, resp_text};
use crate::workload::{KvSpec, OpGen};

#[derive(clap::Args, Clone, Debug)]
pub struct FailoverArgs {
    /// Cluster size (the paper uses 5).
    #[arg(long, default_value_t = 5)]
    pub replicas: usize,
    /// Write ratios, one run each.
    #[arg(long, value_delimiter = ',', default_value = "0.01,0.05,0.2")]
    pub write_ratios: Vec<f64>,
    /// Protocol of the nodes.
    #[arg(long, default_value = "hermes")]
    pub protocol: String,
    /// SIGKILL the last replica this long into the measurement.
    #[arg(long, default_value_t = 3.0)]
    pub kill_after_s: f64,
    /// Length of the measurement.
    #[arg(long, default_value_t = 8.0)]
    pub duration_s: f64,
    /// Width of a throughput bucket.
    #[arg(long, default_value_t = 50)]
    pub bucket_ms: u64,
    /// Closed-loop clients, spread over the survivors.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    #[arg(long, default_value_t = 32)]
    pub value_bytes: usize,
    /// Where the JSON report and the PNG plot go.
    #[arg(long, default_value = "bench-results/failover")]
    pub out: PathBuf,
}

#[derive(Serialize)]
struct RunReport {
    write_ratio: f64,
    kill_at_s: f64,
    bucket_ms: u64,
    /// Completed operations per second in each bucket, from the start of the measurement.
    ops_per_s: Vec<f64>,
    /// Medians over the second before the kill and over the last two seconds.
    before_ops_per_s: f64,
    after_ops_per_s: f64,
    /// From the kill to the first bucket back at half the after-failure median.
    recovered_after_ms: Option<u64>,
    /// Buckets after the kill with no operation completed.
    zero_buckets_after_kill: usize,
    errors: u64,
}

#[derive(Serialize)]
struct Report<'a> {
    command: &'static str,
    protocol: &'a str,
    replicas: usize,
    clients: usize,
    keys: u64,
    value_bytes: usize,
    runs: Vec<RunReport>,
}

/// Node processes, killed when dropped.
struct Cluster {
    children: Vec<Option<Child>>,
    clients: Vec<SocketAddr>,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_cluster(chorus: &Path, args: &FailoverArgs, run: usize) -> anyhow::Result<Cluster> {
    let ports = free_ports(2 * args.replicas)?;
    let dir = crate::procs::scratch_root().join(format!("failover-{run}"));
    std::fs::create_dir_all(&dir)?;
    let mut cluster = Cluster { children: Vec::new(), clients: Vec::new(), dir: dir.clone() };
    for node in 0..args.replicas {
        let client = localhost(ports[2 * node]);
        let mut command = Command::new(chorus);
        command
            .arg("node")
            .args(["--node-id", &node.to_string(), "--protocol", &args.protocol])
            .args(["--client-addr", &client.to_string(), "--cluster-token", "failover-bench-token-0123"])
            .args(["--data-dir", dir.join(format!("node-{node}")).to_str().context("utf-8 path")?])
            .args(["--log-level", "warn"]);
        for peer in 0..args.replicas {
            command.args(["--peer", &format!("{peer}=127.0.0.1:{}", ports[2 * peer + 1])]);
        }
        let log = std::fs::File::create(dir.join(format!("node-{node}.log")))?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cluster.children.push(Some(command.spawn().context("start chorus node")?));
        cluster.clients.push(client);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for (node, addr) in cluster.clients.iter().enumerate() {
        loop {
            let info = resp_text(*addr, &[b"INFO", b"replication"]).unwrap_or_default();
            if info.contains("chorus_operational:1") {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "node {node} not serving after 60 s (logs in {})",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(cluster)
}

/// One closed-loop client: counts completions per bucket, reconnects on errors.
#[allow(clippy::too_many_arguments)]
async fn client_loop(
    addr: SocketAddr,
    config: ClientConfig,
    index: u64,
    mut generator: OpGen,
    origin: Instant,
    end: Instant,
    buckets: Arc<Vec<AtomicU64>>,
    bucket: Duration,
    errors: Arc<AtomicU64>,
) {
    let mut client = None;
    let mut failed: Vec<Option<String>> = Vec::new();
    while Instant::now() < end {
        if client.is_none() {
            client = Client::connect(addr, config.clone(), index).await.ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let op = generator.next_op();
        let ops = [op];
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            client.as_mut().expect("connected").execute(&ops, &mut failed),
        )
        .await;
        let ok = matches!(result, Ok(Ok(()))) && failed.iter().all(Option::is_none);
        failed.clear();
        generator.done(&ops[0]);
        if ok {
            let slot = (origin.elapsed().as_nanos() / bucket.as_nanos()) as usize;
            if let Some(counter) = buckets.get(slot) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            errors.fetch_add(1, Ordering::Relaxed);
            if !matches!(result, Ok(Ok(()))) {
                client = None;
            }
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

fn measure(chorus: &Path, args: &FailoverArgs, run: usize, write_ratio: f64) -> anyhow::Result<RunReport> {
    let mut cluster = start_cluster(chorus, args, run)?;
    let victim = args.replicas - 1;
    let survivors: Vec<SocketAddr> = cluster.clients[..victim].to_vec();
    let spec = KvSpec {
        write_ratio,
        keys: args.keys,
        operations: u64::MAX / 2,
        value_bytes: args.value_bytes,
        distribution: Distribution::Uniform,
    };
    let config = ClientConfig {
        api: Api::Resp,
        keyspace: Keyspace::Kv,
        value_bytes: args.value_bytes,
        wait: None,
        seed: 1,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let options = RunOptions {
        targets: survivors.clone(),
        clients: args.clients,
        pipeline: 1,
        rate: None,
        operations: args.keys,
        duration_max: None,
        client: config.clone(),
    };
    runtime.block_on(driver::load(&options, args.keys, 16, &indicatif::ProgressBar::hidden()))?;

    let bucket = Duration::from_millis(args.bucket_ms.max(1));
    let duration = Duration::from_secs_f64(args.duration_s);
    let slots = (duration.as_nanos() / bucket.as_nanos()) as usize;
    let buckets: Arc<Vec<AtomicU64>> = Arc::new((0..slots).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let origin = Instant::now();
    let end = origin + duration;
    let generators = OpGen::kv(&spec, 7 + run as u64, args.clients);
    let tasks: Vec<_> = generators
        .into_iter()
        .enumerate()
        .map(|(i, generator)| {
            let addr = survivors[i % survivors.len()];
            let (config, buckets, errors) = (config.clone(), buckets.clone(), errors.clone());
            runtime
                .spawn(client_loop(addr, config, i as u64, generator, origin, end, buckets, bucket, errors))
        })
        .collect();
    let kill_at = Duration::from_secs_f64(args.kill_after_s);
    std::thread::sleep(kill_at.saturating_sub(origin.elapsed()));
    let killed_at = origin.elapsed();
    if let Some(mut child) = cluster.children[victim].take() {
        child.kill()?;
        child.wait()?;
    }
    runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });
    let per_s = 1e9 / bucket.as_nanos() as f64;
    let ops_per_s: Vec<f64> =
        buckets.iter().map(|count| count.load(Ordering::Relaxed) as f64 * per_s).collect();
    let kill_slot = (killed_at.as_nanos() / bucket.as_nanos()) as usize;
    let per_second = (1e9 / bucket.as_nanos() as f64) as usize;
    let before = median(&ops_per_s[kill_slot.saturating_sub(per_second)..kill_slot]);
    let after = median(&ops_per_s[slots.saturating_sub(2 * per_second).max(kill_slot)..]);
    let recovered =
        ops_per_s[kill_slot..].iter().enumerate().skip(1).find(|(_, rate)| **rate >= after / 2.0).map(
            |(i, _)| {
                (i as u64 * bucket.as_millis() as u64)
                    .saturating_sub((killed_at.as_millis() as u64) % bucket.as_millis() as u64)
            },
        );
    let zero_buckets = ops_per_s[kill_slot..].iter().filter(|rate| **rate == 0.0).count();
    Ok(RunReport {
        write_ratio,
        kill_at_s: killed_at.as_secs_f64(),
        bucket_ms: args.bucket_ms,
        ops_per_s,
        before_ops_per_s: before,
        after_ops_per_s: after,
        recovered_after_ms: recovered,
        zero_buckets_after_kill: zero_buckets,
        errors: errors.load(Ordering::Relaxed),
    })
}

pub fn run(args: FailoverArgs, chorus: &Path) -> anyhow::Result<i32> {
    anyhow::ensure!(args.replicas >= 3, "--replicas must be at least 3");
    anyhow::ensure!(
        args.kill_after_s > 1.0 && args.kill_after_s + 2.0 < args.duration_s,
        "--kill-after-s must leave a second before and two after"
    );
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let stop = AtomicBool::new(false);
    let mut runs = Vec::new();
    for (i, write_ratio) in args.write_ratios.iter().enumerate() {
        anyhow::ensure!((0.0..=1.0).contains(write_ratio), "write ratios must be between 0 and 1");
        eprintln!("failover: {} replicas, {:.0}% writes ...", args.replicas, write_ratio * 100.0);
        let report = measure(chorus, &args, i, *write_ratio)?;
        println!(
            "{:>5.1}% writes: {:>8.0} ops/s before the kill, {:>8.0} after ({:.2}x); back to half of that {} after the kill; {} empty {} ms buckets",
            write_ratio * 100.0,
            report.before_ops_per_s,
            report.after_ops_per_s,
            report.after_ops_per_s / report.before_ops_per_s.max(1.0),
            report.recovered_after_ms.map_or("never".to_string(), |ms| format!("{ms} ms")),
            report.zero_buckets_after_kill,
            args.bucket_ms,
        );
        runs.push(report);
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    let report = Report {
        command: "failover",
        protocol: &args.protocol,
        replicas: args.replicas,
        clients: args.clients,
        keys: args.keys,
        value_bytes: args.value_bytes,
        runs,
    };
    let json = args.out.join("failover.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    let png = args.out.join("failover.png");
    plot(&report, &png)?;
    println!("JSON: {}\nplot: {}", json.display(), png.display());
    Ok(0)
}

fn plot(report: &Report, path: &Path) -> anyhow::Result<()> {
    crate::plot::register_font();
    let root = BitMapBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let duration = report
        .runs
        .iter()
        .map(|run| run.ops_per_s.len() as f64 * run.bucket_ms as f64 / 1000.0)
        .fold(1.0, f64::max);
    let top = report.runs.iter().flat_map(|run| run.ops_per_s.iter().copied()).fold(1.0, f64::max) * 1.1;
    let caption =
        format!("{} replicas ({}), one SIGKILLed: throughput over time", report.replicas, report.protocol);
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..duration, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("completed ops/s")
        .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
        .label_style(("sans-serif", 13))
        .draw()?;
    let colors =
        [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(214, 39, 40), RGBColor(44, 160, 44)];
    for (i, run) in report.runs.iter().enumerate() {
        let color = colors[i % colors.len()];
        let width = run.bucket_ms as f64 / 1000.0;
        let series: Vec<(f64, f64)> =
            run.ops_per_s.iter().enumerate().map(|(k, rate)| (k as f64 * width, *rate)).collect();
        chart
            .draw_series(LineSeries::new(series, color.stroke_width(2)))?
            .label(format!("{:.0}% writes", run.write_ratio * 100.0))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        let kill = run.kill_at_s;
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(kill, 0.0), (kill, top)], BLACK.mix(0.4))))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    root.present()?;
    Ok(())
}
