//! `chorus bench tenants`: the multi-tenant experiment of HyperLoop §2.2 and §6.2 (run by
//! [`chorus_group::tenants`]), with its figures and the target ratios:
//!
//! * `tenants-latency.png`: update latency (average, p95, p99) vs the number of tenants, one
//!   panel per statistic (the shape of Figure 2(a) and Figures 11-12);
//! * `tenants-cpu.png`: the replicas' CPU time per operation, cores they kept busy and
//!   updates per second vs the number of tenants.
//!
//! Solid lines: no background load; dashed: with stress-ng on every core.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use chorus_group::runtime::HostMode;
use chorus_group::tenants::{target_ratios, TenantsConfig, TenantsReport, TenantsResult};

use crate::charts::{draw_grid, palette, Panel, Series};

/// The tenant count of the target (point 4), under background load.
pub const TARGET_TENANTS: usize = 32;
/// Naïve-Event p99 over the chain's p99, at least.
pub const TARGET_P99_RATIO: f64 = 10.0;
/// Reduction of the (p99 - average) gap, percent, at least (the paper: 81% on MongoDB).
pub const TARGET_GAP_REDUCTION_PCT: f64 = 80.0;

#[derive(clap::Args, Debug)]
pub struct TenantsArgs {
    /// Tenant counts, comma separated (default 1,8,32,100; --quick: 1,8,32).
    #[arg(long, value_delimiter = ',')]
    pub tenants: Option<Vec<usize>>,
    /// Protocols, comma separated: chain (one group host per host serves every tenant),
    /// naive (Naïve-Event: a replica process per tenant per host), naive-polling.
    #[arg(long, value_delimiter = ',', default_value = "chain,naive")]
    pub protocol: Vec<String>,
    /// Also run every point with stress-ng loading every core (installed with apt-get when
    /// missing and running as root).
    #[arg(long)]
    pub background_load: bool,
    /// T = 1, 8, 32 and 2 s per point: about two minutes with --background-load.
    #[arg(long)]
    pub quick: bool,
    /// Measured seconds per point (default 10; --quick: 2).
    #[arg(long)]
    pub measure_s: Option<f64>,
    /// Largest T run for the Naïve protocols (3 processes per tenant); larger T are skipped
    /// and reported as such.
    #[arg(long, default_value_t = 100)]
    pub naive_tenants_max: usize,
    /// Start the host processes (and so the Naïve replicas they fork) with this niceness,
    /// e.g. -10 to rank replication above the background load (negative needs root).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub replica_nice: i32,
    /// Where tenants.json and the PNG figures go.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Measure nothing: print the summary and redraw the figures from a saved tenants.json.
    #[arg(long, value_name = "JSON")]
    pub from_json: Option<PathBuf>,
}

fn parse_protocol(name: &str) -> anyhow::Result<HostMode> {
    match name {
        "chain" | "chorus" => Ok(HostMode::Chorus),
        "naive" | "naive-event" => Ok(HostMode::Naive),
        "naive-polling" => Ok(HostMode::NaivePolling),
        "hermes" => anyhow::bail!(
            "--protocol hermes is not implemented for `bench tenants` (it would need T Hermes clusters of \
             3 `chorus node` processes); use chain, naive or naive-polling"
        ),
        other => anyhow::bail!("unknown protocol {other:?}: expected chain, naive or naive-polling"),
    }
}

/// The configuration `args` ask for. `child_command` starts hosts and Naïve replicas.
pub fn config_of(
    args: &TenantsArgs,
    child_command: Vec<String>,
    background_load_command: Option<Vec<String>>,
) -> anyhow::Result<TenantsConfig> {
    let mut config = if args.quick { TenantsConfig::quick() } else { TenantsConfig::default() };
    config.modes = args.protocol.iter().map(|p| parse_protocol(p.trim())).collect::<anyhow::Result<_>>()?;
    if let Some(tenants) = &args.tenants {
        anyhow::ensure!(tenants.iter().all(|&t| t >= 1), "--tenants are at least 1");
        config.tenants = tenants.clone();
    }
    if let Some(seconds) = args.measure_s {
        anyhow::ensure!(seconds > 0.0 && seconds.is_finite(), "--measure-s must be positive");
        config.measure_s = seconds;
        config.warmup_s = config.warmup_s.min(seconds);
    }
    config.naive_tenants_max = args.naive_tenants_max;
    anyhow::ensure!((-20..=19).contains(&args.replica_nice), "--replica-nice is -20 to 19");
    config.replica_nice = args.replica_nice;
    config.child_command = Some(child_command);
    config.background_load_command = background_load_command;
    Ok(config)
}

/// Run (or reload), save tenants.json, draw, print. `chorus` is the binary hosts run as.
pub fn run(
    args: TenantsArgs,
    chorus: &Path,
    background_load_command: Option<Vec<String>>,
) -> anyhow::Result<i32> {
    let json = args.out.join("tenants.json");
    let report: TenantsReport = match &args.from_json {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => {
            let child = vec![chorus.display().to_string(), "naive-replica".to_string()];
            let config = config_of(&args, child, background_load_command)?;
            let report = chorus_group::tenants::run(config)?;
            std::fs::create_dir_all(&args.out)?;
            std::fs::write(&json, serde_json::to_vec_pretty(&report)?)?;
            report
        }
    };
    print!("{}", report.table());
    print!("{}", summary(&report));
    if args.from_json.is_none() {
        println!("JSON report: {}", json.display());
    }
    let dir = match &args.from_json {
        Some(path) => path.parent().map(Path::to_path_buf).unwrap_or_default(),
        None => args.out.clone(),
    };
    for plot in plot_all(&report, &dir)? {
        println!("plot: {}", plot.display());
    }
    Ok(0)
}

fn mode_color(mode: HostMode) -> plotters::style::RGBColor {
    match mode {
        HostMode::Chorus => palette(0),
        HostMode::Naive => palette(1),
        HostMode::NaivePolling => palette(2),
    }
}

fn label(mode: HostMode, loaded: bool) -> String {
    let name = match mode {
        HostMode::Chorus => "chain",
        HostMode::Naive => "naive-event",
        HostMode::NaivePolling => "naive-polling",
    };
    if loaded {
        format!("{name} +load")
    } else {
        name.to_string()
    }
}

fn tenant_counts(report: &TenantsReport) -> Vec<usize> {
    let mut counts: Vec<usize> = report.results.iter().map(|r| r.tenants).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

type Pick = fn(&TenantsResult) -> f64;

fn series_by_tenants(report: &TenantsReport, counts: &[usize], pick: Pick) -> Vec<Series> {
    let mut modes: Vec<HostMode> = Vec::new();
    for r in &report.results {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
    }
    let mut series = Vec::new();
    for loaded in [false, true] {
        for &mode in &modes {
            let points: Vec<(f64, f64)> = counts
                .iter()
                .enumerate()
                .filter_map(|(i, &t)| report.find(mode, t, loaded).map(|r| (i as f64, pick(r))))
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    label: label(mode, loaded),
                    color: mode_color(mode),
                    dashed: loaded,
                    points,
                });
            }
        }
    }
    series
}

/// Draw the figures into `dir`; returns the files written.
pub fn plot_all(report: &TenantsReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let counts = tenant_counts(report);
    let categories: Vec<String> = counts.iter().map(|t| t.to_string()).collect();
    let panel = |title: &str, y_desc: &str, log_y: bool, pick: Pick| Panel {
        title: title.to_string(),
        x_desc: "tenants (groups of 3 on the same 3 hosts)".into(),
        y_desc: y_desc.into(),
        x_categories: Some(categories.clone()),
        log_y,
        series: series_by_tenants(report, &counts, pick),
    };
    let mut written = Vec::new();
    let latency = [
        panel("update latency, average", "average latency", true, |r| r.update_mean_us),
        panel("update latency, p95", "p95 latency", true, |r| r.update_p95_us),
        panel("update latency, p99", "p99 latency", true, |r| r.update_p99_us),
    ];
    let path = dir.join("tenants-latency.png");
    draw_grid(&path, "Figure 2 / 11-12 shape: YCSB-A update latency vs tenants (log scale)", 3, &latency)?;
    written.push(path);
    let cpu = [
        panel("replica CPU time per operation", "CPU per op (us)", false, |r| {
            r.replica_cpu_us_per_op.unwrap_or(0.0)
        }),
        panel("cores the replicas kept busy", "cores", false, |r| r.replica_cpu_cores.unwrap_or(0.0)),
        panel("updates per second (all tenants)", "updates/s", false, |r| r.updates_per_s),
    ];
    let path = dir.join("tenants-cpu.png");
    draw_grid(&path, "Replica CPU and throughput vs tenants", 3, &cpu)?;
    written.push(path);
    Ok(written)
}

/// The point-4 ratios and whether they are met, plus Naïve/chain ratios per point.
pub fn summary(report: &TenantsReport) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "\nratios to chain (update latency; > 1: chain lower)");
    for loaded in [false, true] {
        for t in tenant_counts(report) {
            let Some(chain) = report.find(HostMode::Chorus, t, loaded) else { continue };
            for mode in [HostMode::Naive, HostMode::NaivePolling] {
                if let Some(r) = report.find(mode, t, loaded) {
                    let _ = writeln!(
                        text,
                        "  T={t:<4}{:<6} {:<14} avg {:.2}x  p95 {:.2}x  p99 {:.2}x  cpu/op {}",
                        if loaded { " +load" } else { "" },
                        label(mode, false),
                        r.update_mean_us / chain.update_mean_us.max(1e-9),
                        r.update_p95_us / chain.update_p95_us.max(1e-9),
                        r.update_p99_us / chain.update_p99_us.max(1e-9),
                        match (r.replica_cpu_us_per_op, chain.replica_cpu_us_per_op) {
                            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
                            _ => "-".to_string(),
                        }
                    );
                }
            }
        }
    }
    match target_ratios(report, TARGET_TENANTS, true) {
        Some((p99_ratio, gap_reduction)) => {
            let met = p99_ratio >= TARGET_P99_RATIO && gap_reduction >= TARGET_GAP_REDUCTION_PCT;
            let _ = writeln!(
                text,
                "target (T={TARGET_TENANTS}, background load): Naïve-Event p99 / chain p99 = {p99_ratio:.2}x \
                 (want >= {TARGET_P99_RATIO}x); reduction of the (p99 - avg) gap {gap_reduction:.0}% \
                 (want >= {TARGET_GAP_REDUCTION_PCT}%; negative: the chain's gap is larger): {}",
                if met { "MET on this machine" } else { "NOT met on this machine" }
            );
        }
        None => {
            let _ = writeln!(
                text,
                "target (T={TARGET_TENANTS}, background load): not measured (needs chain and naive at \
                 T={TARGET_TENANTS} with --background-load)"
            );
        }
    }
    text
}
