//! `chorus bench protocols`: the Hermes paper's comparison (Katsarragakis et al., ASPLOS 2020,
//! §6) of Hermes, CRAQ and ZAB, reproduced on one machine, one invocation, the same store
//! (`chorus node --protocol ...`) and the same load generator (the GET/SET microworkload of
//! `chorus bench kv`):
//!
//! * Figure 5: throughput vs write ratio (0, 1, 5, 20, 50, 100%), uniform and zipfian 0.99;
//! * Figure 6a: median and p99 latency vs throughput at 5% writes (closed loop, a sweep of
//!   client counts);
//! * Figures 6b/6c: read and write latency (median, p99) vs write ratio;
//! * the scalability figure: throughput with 3, 5 and 7 replicas at 5% and 20% writes.
//!
//! Protocols (names of `chorus node --protocol`): `hermes`, `craq`, `zab-local` (ZAB with
//! local, sequentially consistent reads: what the Hermes paper measures) and `zab` (reads after
//! a sync: linearizable); `raftlog` on request. For each replica count, every protocol's
//! cluster runs at once (idle ones cost little), on 127.0.0.1 with data under /dev/shm, and each
//! point measures the protocols back to back in an order that rotates from round to round, so
//! background noise that drifts over minutes hits them alike; a point is the round with the
//! median throughput. Clients spread round-robin over every replica. Results:
//! `protocols.json`, PNG figures and a text summary in `--out`. Nothing asserts on timing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::charts::{draw_grid, palette, Panel, Series};
use crate::client::{Api, ClientConfig, Keyspace};
use crate::compare::{machine, Machine};
use crate::driver::{self, RunOptions};
use crate::generator::Distribution;
use crate::procs::{self, Procs};
use crate::report::Report;
use crate::workload::{KvSpec, OpGen};

#[derive(clap::Args, Clone, Debug)]
pub struct ProtocolsArgs {
    /// A few minutes: 1 s per point, 3 rounds, 10,000 keys, a 3-point latency sweep.
    #[arg(long)]
    pub quick: bool,
    /// Where protocols.json, protocols.md and the PNG figures go.
    #[arg(long, default_value = "bench/results/protocols")]
    pub out: PathBuf,
    /// Protocols, comma separated: hermes, craq, zab-local, zab, raftlog.
    #[arg(long, value_delimiter = ',', default_value = "hermes,craq,zab-local,zab")]
    pub protocols: Vec<String>,
    /// Replicas of the write-ratio and latency experiments (Figures 5 and 6).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Replica counts of the scalability experiment.
    #[arg(long, value_delimiter = ',', default_value = "3,5,7")]
    pub scale_replicas: Vec<usize>,
    /// Closed-loop clients of the throughput points (default 32; 16 with --quick).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Client counts of the latency-vs-throughput sweep at 5% writes (default 1,4,16,64;
    /// 1,8,32 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub sweep_clients: Option<Vec<usize>>,
    /// Seconds per point and round (default 1 with --quick, 5 without).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Rounds per point; the point is the round with the median throughput (default 3).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Keys (default 10,000 with --quick, 100,000 without).
    #[arg(long)]
    pub keys: Option<u64>,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    pub value_bytes: usize,
    /// Measure nothing: redraw the figures and the summary from a saved protocols.json.
    #[arg(long, value_name = "JSON")]
    pub from_json: Option<PathBuf>,
}

const WRITE_PERCENTS: [u32; 6] = [0, 1, 5, 20, 50, 100];
const SCALE_WRITE_PERCENTS: [u32; 2] = [5, 20];

/// One measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProtocolPoint {
    pub protocol: String,
    pub replicas: usize,
    /// "uniform" or "zipfian".
    pub distribution: String,
    pub write_percent: u32,
    pub clients: usize,
    /// "write-ratio" (Figure 5, 6b/6c), "sweep" (Figure 6a) or "scale".
    pub experiment: String,
    pub ops_per_s: f64,
    pub errors: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub read_p50_us: f64,
    pub read_p99_us: f64,
    pub write_p50_us: f64,
    pub write_p99_us: f64,
    pub failure: Option<String>,
    /// Throughput of every round (the point is the median one).
    #[serde(default)]
    pub round_ops_per_s: Vec<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProtocolsReport {
    pub command: String,
    pub quick: bool,
    pub elapsed_s: f64,
    pub machine: Machine,
    pub seconds_per_point: f64,
    #[serde(default)]
    pub rounds: usize,
    pub keys: u64,
    pub value_bytes: usize,
    pub clients: usize,
    pub replicas: usize,
    pub skipped: BTreeMap<String, String>,
    pub points: Vec<ProtocolPoint>,
}

struct Plan {
    protocols: Vec<String>,
    replicas: usize,
    scale_replicas: Vec<usize>,
    clients: usize,
    sweep_clients: Vec<usize>,
    point: Duration,
    rounds: usize,
    keys: u64,
    value_bytes: usize,
}

pub fn protocol_label(protocol: &str) -> String {
    match protocol {
        "hermes" => "Hermes".into(),
        "craq" => "CRAQ".into(),
        "zab-local" => "ZAB (local reads)".into(),
        "zab" => "ZAB (sync reads)".into(),
        "raftlog" => "raftlog".into(),
        other => other.into(),
    }
}

const KNOWN: [&str; 5] = ["hermes", "craq", "zab-local", "zab", "raftlog"];

pub fn run(args: ProtocolsArgs, chorus_exe: &Path) -> anyhow::Result<i32> {
    if let Some(json) = &args.from_json {
        let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
        let report: ProtocolsReport =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
        std::fs::create_dir_all(&args.out)?;
        print!("{}", summary(&report));
        for plot in plot_all(&report, &args.out)? {
            println!("plot: {}", plot.display());
        }
        return Ok(0);
    }
    let started = Instant::now();
    for protocol in &args.protocols {
        anyhow::ensure!(
            KNOWN.contains(&protocol.as_str()),
            "unknown protocol {protocol:?}: one of {KNOWN:?}"
        );
    }
    anyhow::ensure!((1..=9).contains(&args.replicas), "--replicas is 1 to 9");
    anyhow::ensure!(args.scale_replicas.iter().all(|n| (1..=9).contains(n)), "--scale-replicas are 1 to 9");
    let quick = args.quick;
    let plan = Plan {
        protocols: args.protocols.clone(),
        replicas: args.replicas,
        scale_replicas: args.scale_replicas.clone(),
        clients: args.clients.unwrap_or(if quick { 16 } else { 32 }).max(1),
        sweep_clients: args.sweep_clients.clone().unwrap_or_else(|| {
            if quick {
                vec![1, 8, 32]
            } else {
                vec![1, 4, 16, 64]
            }
        }),
        point: Duration::from_secs_f64(args.duration_s.unwrap_or(if quick { 1.0 } else { 5.0 }).max(0.1)),
        rounds: args.rounds.max(1),
        keys: args.keys.unwrap_or(if quick { 10_000 } else { 100_000 }).max(1),
        value_bytes: args.value_bytes,
    };
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let runtime = crate::cli::runtime(None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let root = procs::scratch_root().join("protocols");
    let mut replica_counts = vec![plan.replicas];
    for n in &plan.scale_replicas {
        if !replica_counts.contains(n) {
            replica_counts.push(*n);
        }
    }
    let specs = |n: usize| -> Vec<(&'static str, Distribution, u32, usize)> {
        let mut specs = Vec::new();
        if n == plan.replicas {
            for distribution in [Distribution::Uniform, Distribution::Zipfian] {
                for w in WRITE_PERCENTS {
                    specs.push(("write-ratio", distribution, w, plan.clients));
                }
            }
            for &clients in &plan.sweep_clients {
                specs.push(("sweep", Distribution::Uniform, 5, clients));
            }
        } else {
            for w in SCALE_WRITE_PERCENTS {
                specs.push(("scale", Distribution::Uniform, w, plan.clients));
            }
        }
        specs
    };
    let total: usize =
        replica_counts.iter().map(|n| specs(*n).len()).sum::<usize>() * plan.protocols.len() * plan.rounds;
    let bar = crate::cli::bar(total as u64, "protocols");
    let mut points = Vec::new();
    let mut skipped = BTreeMap::new();
    let mut turn = 0usize;
    for &n in &replica_counts {
        let mut clusters = Vec::new();
        for protocol in &plan.protocols {
            bar.set_message(format!("{protocol} x{n}: start and load"));
            let started = start_cluster(chorus_exe, protocol, n, &root, &stop)
                .and_then(|cluster| load(&cluster, &plan, &runtime).map(|()| cluster));
            match started {
                Ok(cluster) => clusters.push(cluster),
                Err(error) => {
                    bar.suspend(|| eprintln!("chorus bench: {protocol} with {n} replicas: {error:#}"));
                    skipped.insert(format!("{protocol}x{n}"), format!("{error:#}"));
                }
            }
        }
        for (experiment, distribution, write_percent, clients) in specs(n) {
            let mut rounds: Vec<Vec<ProtocolPoint>> = clusters.iter().map(|_| Vec::new()).collect();
            for _ in 0..plan.rounds {
                for k in 0..clusters.len() {
                    let i = (k + turn) % clusters.len();
                    let cluster = &mut clusters[i];
                    bar.set_message(format!(
                        "{} x{n}: {experiment} w={write_percent}% c={clients}",
                        cluster.protocol
                    ));
                    let point = match cluster.procs.check_running() {
                        Err(error) => failed_point(
                            cluster,
                            experiment,
                            distribution,
                            write_percent,
                            clients,
                            format!("{error:#}"),
                        ),
                        Ok(()) => measure(
                            cluster,
                            &plan,
                            &runtime,
                            &stop,
                            experiment,
                            distribution,
                            write_percent,
                            clients,
                        ),
                    };
                    rounds[i].push(point);
                    bar.inc(1);
                }
                turn += 1;
            }
            for rounds in rounds {
                let point = median_round(rounds);
                if let Some(failure) = &point.failure {
                    bar.suspend(|| {
                        eprintln!(
                            "chorus bench: {} x{n} {experiment} w={write_percent}%: {failure}",
                            point.protocol
                        )
                    });
                }
                points.push(point);
            }
        }
        for mut cluster in clusters {
            cluster.procs.stop();
        }
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&root);
    // The per-process scratch root too, unless something else of this process still uses it.
    if let Some(parent) = root.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    let report = ProtocolsReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        quick,
        elapsed_s: started.elapsed().as_secs_f64(),
        machine: machine(),
        seconds_per_point: plan.point.as_secs_f64(),
        rounds: plan.rounds,
        keys: plan.keys,
        value_bytes: plan.value_bytes,
        clients: plan.clients,
        replicas: plan.replicas,
        skipped,
        points,
    };
    let text = summary(&report);
    print!("{text}");
    let json = args.out.join("protocols.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    std::fs::write(args.out.join("protocols.md"), &text)?;
    println!("\nresults: {}", json.display());
    for plot in plot_all(&report, &args.out)? {
        println!("plot: {}", plot.display());
    }
    Ok(if report.skipped.is_empty() { 0 } else { 1 })
}

struct Cluster {
    protocol: String,
    procs: Procs,
    targets: Vec<SocketAddr>,
}

/// The round with the median throughput, carrying every round's throughput.
fn median_round(mut rounds: Vec<ProtocolPoint>) -> ProtocolPoint {
    let all: Vec<f64> = rounds.iter().map(|p| p.ops_per_s).collect();
    let failure = rounds.iter().find_map(|p| p.failure.clone());
    rounds.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    let mut point = rounds.swap_remove(rounds.len() / 2);
    point.round_ops_per_s = all;
    point.failure = point.failure.or(failure);
    point
}

fn failed_point(
    cluster: &Cluster,
    experiment: &str,
    distribution: Distribution,
    write_percent: u32,
    clients: usize,
    failure: String,
) -> ProtocolPoint {
    ProtocolPoint {
        protocol: cluster.protocol.clone(),
        replicas: cluster.targets.len(),
        distribution: distribution_name(distribution),
        write_percent,
        clients,
        experiment: experiment.into(),
        ops_per_s: 0.0,
        errors: 0,
        p50_us: 0.0,
        p99_us: 0.0,
        read_p50_us: 0.0,
        read_p99_us: 0.0,
        write_p50_us: 0.0,
        write_p99_us: 0.0,
        failure: Some(failure),
        round_ops_per_s: Vec::new(),
    }
}

fn distribution_name(distribution: Distribution) -> String {
    match distribution {
        Distribution::Zipfian => "zipfian".into(),
        _ => "uniform".into(),
    }
}

fn start_cluster(
    exe: &Path,
    protocol: &str,
    n: usize,
    root: &Path,
    stop: &AtomicBool,
) -> anyhow::Result<Cluster> {
    let mut procs = Procs::new(&format!("{protocol}-{n}"), root.join(format!("{protocol}-{n}")))?;
    let targets = procs::start_chorus_cluster(&mut procs, exe, protocol, n, &[], stop)?;
    Ok(Cluster { protocol: protocol.to_string(), procs, targets })
}

fn options(cluster: &Cluster, plan: &Plan, clients: usize) -> RunOptions {
    RunOptions {
        targets: cluster.targets.clone(),
        clients,
        pipeline: 1,
        rate: None,
        operations: u64::MAX / 4,
        duration_max: Some(plan.point),
        client: ClientConfig {
            api: Api::Resp,
            keyspace: Keyspace::Kv,
            value_bytes: plan.value_bytes,
            wait: None,
            seed: 1,
        },
    }
}

fn load(cluster: &Cluster, plan: &Plan, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let options = options(cluster, plan, 16);
    runtime
        .block_on(driver::load(&options, plan.keys, 16, &ProgressBar::hidden()))
        .context("loading the keys")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    cluster: &Cluster,
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    stop: &Arc<AtomicBool>,
    experiment: &str,
    distribution: Distribution,
    write_percent: u32,
    clients: usize,
) -> ProtocolPoint {
    let spec = KvSpec {
        write_ratio: write_percent as f64 / 100.0,
        keys: plan.keys,
        operations: u64::MAX / 4,
        value_bytes: plan.value_bytes,
        distribution,
    };
    let generators = OpGen::kv(&spec, 1, clients);
    let options = options(cluster, plan, clients);
    let result = runtime.block_on(driver::run(&options, generators, &ProgressBar::hidden(), stop.clone()));
    let mut point = failed_point(cluster, experiment, distribution, write_percent, clients, String::new());
    point.failure = None;
    match result {
        Err(error) => point.failure = Some(format!("{error:#}")),
        Ok(result) => {
            let report = Report::of(&result);
            point.ops_per_s = report.ops_per_s;
            point.errors = report.errors;
            point.p50_us = report.overall.latency.p50_us;
            point.p99_us = report.overall.latency.p99_us;
            for op in &report.by_operation {
                match op.operation.as_str() {
                    "GET" => (point.read_p50_us, point.read_p99_us) = (op.latency.p50_us, op.latency.p99_us),
                    "SET" => {
                        (point.write_p50_us, point.write_p99_us) = (op.latency.p50_us, op.latency.p99_us)
                    }
                    _ => {}
                }
            }
            point.failure = report.first_error;
        }
    }
    point
}

fn protocols_of(report: &ProtocolsReport) -> Vec<String> {
    let mut protocols: Vec<String> = Vec::new();
    for p in &report.points {
        if !protocols.contains(&p.protocol) {
            protocols.push(p.protocol.clone());
        }
    }
    protocols
}

fn color_of(protocol: &str) -> plotters::style::RGBColor {
    palette(KNOWN.iter().position(|k| *k == protocol).unwrap_or(7))
}

fn write_ratio_point<'a>(
    report: &'a ProtocolsReport,
    protocol: &str,
    distribution: &str,
    w: u32,
) -> Option<&'a ProtocolPoint> {
    report.points.iter().find(|p| {
        p.experiment == "write-ratio"
            && p.protocol == protocol
            && p.distribution == distribution
            && p.write_percent == w
            && p.ops_per_s > 0.0
    })
}

/// Throughput of `protocol` with `n` replicas at `w`% uniform writes (scale or write-ratio run).
fn scale_point<'a>(
    report: &'a ProtocolsReport,
    protocol: &str,
    n: usize,
    w: u32,
) -> Option<&'a ProtocolPoint> {
    report.points.iter().find(|p| {
        p.protocol == protocol
            && p.replicas == n
            && p.write_percent == w
            && p.distribution == "uniform"
            && p.clients == report.clients
            && (p.experiment == "scale" || p.experiment == "write-ratio")
            && p.ops_per_s > 0.0
    })
}

type Pick = fn(&ProtocolPoint) -> f64;

/// Draw the figures into `dir`.
pub fn plot_all(report: &ProtocolsReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let protocols = protocols_of(report);
    let ratios: Vec<String> = WRITE_PERCENTS.iter().map(|w| format!("{w}%")).collect();
    let mut written = Vec::new();
    let by_ratio = |protocol: &str, distribution: &str, pick: Pick| -> Vec<(f64, f64)> {
        WRITE_PERCENTS
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                write_ratio_point(report, protocol, distribution, *w).map(|p| (i as f64, pick(p)))
            })
            .collect()
    };

    // Figure 5.
    let panels: Vec<Panel> = ["uniform", "zipfian"]
        .iter()
        .map(|distribution| Panel {
            title: format!("{distribution}, {} replicas, {} clients", report.replicas, report.clients),
            x_desc: "write ratio".into(),
            y_desc: "ops/s".into(),
            x_categories: Some(ratios.clone()),
            log_y: false,
            series: protocols
                .iter()
                .map(|p| Series {
                    label: protocol_label(p),
                    color: color_of(p),
                    dashed: false,
                    points: by_ratio(p, distribution, |x| x.ops_per_s),
                })
                .collect(),
        })
        .collect();
    let path = dir.join("protocols-fig5-throughput.png");
    draw_grid(&path, "Figure 5 shape: throughput vs write ratio", 2, &panels)?;
    written.push(path);

    // Figure 6a.
    let mut series = Vec::new();
    for p in &protocols {
        let mut sweep: Vec<&ProtocolPoint> = report
            .points
            .iter()
            .filter(|x| x.experiment == "sweep" && &x.protocol == p && x.ops_per_s > 0.0)
            .collect();
        sweep.sort_by_key(|x| x.clients);
        for (stat, dashed, pick) in
            [("p50", false, (|x: &ProtocolPoint| x.p50_us) as Pick), ("p99", true, |x| x.p99_us)]
        {
            series.push(Series {
                label: format!("{} {stat}", protocol_label(p)),
                color: color_of(p),
                dashed,
                points: sweep.iter().map(|x| (x.ops_per_s, pick(x))).collect(),
            });
        }
    }
    let panel = Panel {
        title: format!("5% writes, uniform, {} replicas (client sweep)", report.replicas),
        x_desc: "throughput (ops/s)".into(),
        y_desc: "latency".into(),
        x_categories: None,
        log_y: true,
        series,
    };
    let path = dir.join("protocols-fig6a-latency-vs-throughput.png");
    draw_grid(&path, "Figure 6a shape: median (solid) and p99 (dashed) latency vs throughput", 1, &[panel])?;
    written.push(path);

    // Figures 6b/6c.
    let mut panels = Vec::new();
    for distribution in ["uniform", "zipfian"] {
        for (kind, p50, p99) in [
            (
                "reads",
                (|x: &ProtocolPoint| x.read_p50_us) as Pick,
                (|x: &ProtocolPoint| x.read_p99_us) as Pick,
            ),
            ("writes", |x| x.write_p50_us, |x| x.write_p99_us),
        ] {
            let mut series = Vec::new();
            for p in &protocols {
                series.push(Series {
                    label: format!("{} p50", protocol_label(p)),
                    color: color_of(p),
                    dashed: false,
                    points: by_ratio(p, distribution, p50),
                });
                series.push(Series {
                    label: format!("{} p99", protocol_label(p)),
                    color: color_of(p),
                    dashed: true,
                    points: by_ratio(p, distribution, p99),
                });
            }
            panels.push(Panel {
                title: format!("{kind}, {distribution}"),
                x_desc: "write ratio".into(),
                y_desc: format!("{kind} latency"),
                x_categories: Some(ratios.clone()),
                log_y: true,
                series,
            });
        }
    }
    let path = dir.join("protocols-fig6bc-read-write-latency.png");
    draw_grid(
        &path,
        "Figures 6b/6c shape: read and write latency vs write ratio (p50 solid, p99 dashed)",
        2,
        &panels,
    )?;
    written.push(path);

    // Scalability.
    let mut ns: Vec<usize> = report.points.iter().map(|p| p.replicas).collect();
    ns.sort_unstable();
    ns.dedup();
    let panels: Vec<Panel> = SCALE_WRITE_PERCENTS
        .iter()
        .map(|w| Panel {
            title: format!("{w}% writes, uniform, {} clients", report.clients),
            x_desc: "replicas".into(),
            y_desc: "ops/s".into(),
            x_categories: Some(ns.iter().map(|n| n.to_string()).collect()),
            log_y: false,
            series: protocols
                .iter()
                .map(|p| Series {
                    label: protocol_label(p),
                    color: color_of(p),
                    dashed: false,
                    points: ns
                        .iter()
                        .enumerate()
                        .filter_map(|(i, n)| scale_point(report, p, *n, *w).map(|x| (i as f64, x.ops_per_s)))
                        .collect(),
                })
                .collect(),
        })
        .collect();
    let path = dir.join("protocols-scalability.png");
    draw_grid(&path, "Scalability shape (the paper's Figure 9): throughput vs replicas", 2, &panels)?;
    written.push(path);
    Ok(written)
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

/// Tables of every figure's numbers, with each protocol's ratio to Hermes.
pub fn summary(report: &ProtocolsReport) -> String {
    let protocols = protocols_of(report);
    let mut text = format!(
        "chorus bench protocols: {} replicas, {} clients, {} keys, {:.1} s x {} rounds per point (median), {} cores ({})\n",
        report.replicas,
        report.clients,
        report.keys,
        report.seconds_per_point,
        report.rounds,
        report.machine.nproc,
        report.machine.cpu_model
    );
    for distribution in ["uniform", "zipfian"] {
        let _ = writeln!(
            text,
            "\nFigure 5, {distribution}: throughput (kops/s) by write ratio [ratio to hermes]"
        );
        let _ = writeln!(
            text,
            "  {:<18}{}",
            "",
            WRITE_PERCENTS.map(|w| format!("{:>16}", format!("{w}%"))).join("")
        );
        for p in &protocols {
            let mut line = format!("  {:<18}", protocol_label(p));
            for w in WRITE_PERCENTS {
                let mine = write_ratio_point(report, p, distribution, w).map_or(0.0, |x| x.ops_per_s);
                let hermes =
                    write_ratio_point(report, "hermes", distribution, w).map_or(0.0, |x| x.ops_per_s);
                let _ = write!(line, "{:>16}", format!("{:.1} [{}]", mine / 1000.0, ratio(mine, hermes)));
            }
            let _ = writeln!(text, "{line}");
        }
    }
    let _ = writeln!(text, "\nFigure 6a, 5% writes, uniform: clients -> kops/s, p50 / p99 (us)");
    for p in &protocols {
        let mut sweep: Vec<&ProtocolPoint> =
            report.points.iter().filter(|x| x.experiment == "sweep" && &x.protocol == p).collect();
        sweep.sort_by_key(|x| x.clients);
        let cells: Vec<String> = sweep
            .iter()
            .map(|x| format!("c={}: {:.1}k {:.0}/{:.0}", x.clients, x.ops_per_s / 1000.0, x.p50_us, x.p99_us))
            .collect();
        let _ = writeln!(text, "  {:<18}{}", protocol_label(p), cells.join("   "));
    }
    for distribution in ["uniform", "zipfian"] {
        let _ = writeln!(
            text,
            "\nFigures 6b/6c, {distribution}: read p50/p99 | write p50/p99 (us) by write ratio"
        );
        for p in &protocols {
            let cells: Vec<String> = WRITE_PERCENTS
                .iter()
                .filter_map(|w| write_ratio_point(report, p, distribution, *w))
                .map(|x| {
                    format!(
                        "{}%: {:.0}/{:.0} | {:.0}/{:.0}",
                        x.write_percent, x.read_p50_us, x.read_p99_us, x.write_p50_us, x.write_p99_us
                    )
                })
                .collect();
            let _ = writeln!(text, "  {:<18}{}", protocol_label(p), cells.join("  "));
        }
    }
    let mut ns: Vec<usize> = report.points.iter().map(|p| p.replicas).collect();
    ns.sort_unstable();
    ns.dedup();
    for w in SCALE_WRITE_PERCENTS {
        let _ = writeln!(text, "\nScalability, {w}% writes, uniform: kops/s by replicas [ratio to hermes]");
        for p in &protocols {
            let mut line = format!("  {:<18}", protocol_label(p));
            for &n in &ns {
                let mine = scale_point(report, p, n, w).map_or(0.0, |x| x.ops_per_s);
                let hermes = scale_point(report, "hermes", n, w).map_or(0.0, |x| x.ops_per_s);
                let _ = write!(line, "  n={n}: {:.1}k [{}]", mine / 1000.0, ratio(mine, hermes));
            }
            let _ = writeln!(text, "{line}");
        }
    }
    let errors: u64 = report.points.iter().map(|p| p.errors).sum();
    let _ = writeln!(text, "\nerrors: {errors}; skipped: {:?}", report.skipped);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(
        protocol: &str,
        experiment: &str,
        distribution: &str,
        w: u32,
        clients: usize,
        replicas: usize,
    ) -> ProtocolPoint {
        ProtocolPoint {
            protocol: protocol.into(),
            replicas,
            distribution: distribution.into(),
            write_percent: w,
            clients,
            experiment: experiment.into(),
            ops_per_s: 1000.0 + w as f64 + clients as f64,
            errors: 0,
            p50_us: 100.0,
            p99_us: 900.0,
            read_p50_us: 80.0,
            read_p99_us: 500.0,
            write_p50_us: 300.0,
            write_p99_us: 2000.0,
            failure: None,
            round_ops_per_s: Vec::new(),
        }
    }

    #[test]
    fn a_report_renders_every_figure_and_the_ratios() {
        let mut points = Vec::new();
        for protocol in ["hermes", "craq"] {
            for distribution in ["uniform", "zipfian"] {
                for w in WRITE_PERCENTS {
                    points.push(point(protocol, "write-ratio", distribution, w, 16, 3));
                }
            }
            for c in [1, 8] {
                points.push(point(protocol, "sweep", "uniform", 5, c, 3));
            }
            for w in SCALE_WRITE_PERCENTS {
                points.push(point(protocol, "scale", "uniform", w, 16, 5));
            }
        }
        let report = ProtocolsReport {
            command: "test".into(),
            quick: true,
            elapsed_s: 1.0,
            machine: machine(),
            seconds_per_point: 1.0,
            rounds: 1,
            keys: 10,
            value_bytes: 32,
            clients: 16,
            replicas: 3,
            skipped: BTreeMap::new(),
            points,
        };
        let text = summary(&report);
        assert!(text.contains("CRAQ"), "{text}");
        assert!(text.contains("n=5: 1.0k [1.00]"), "{text}");
        let dir = std::env::temp_dir().join(format!("chorus-protocols-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = plot_all(&report, &dir).unwrap();
        assert_eq!(written.len(), 4);
        for path in written {
            assert!(std::fs::metadata(&path).unwrap().len() > 1000, "{}", path.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
