//! Figures and summary of `chorus bench group` (HyperLoop §6.1, run by
//! [`run`]), shaped like the paper's:
//!
//! * `group-fig8-latency.png`: gWRITE and gMEMCPY latency (average, p95, p99) vs message size,
//!   group of 3 (Figure 8);
//! * `group-table2-gcas.png`: gCAS latency statistics (Table 2);
//! * `group-fig9-throughput.png`: gWRITE throughput vs message size and the replicas' CPU time
//!   per operation and cores kept busy (Figure 9);
//! * `group-fig10-group-size.png`: gWRITE p99 latency vs message size for groups of 3, 5 and 7,
//!   one panel per system (Figure 10).
//!
//! Solid lines: no background load; dashed: with stress-ng on every core.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub mod run;

use chorus_group::runtime::HostMode;
pub use run::{BenchConfig, BenchReport, BenchResult};

use crate::charts::{draw_grid, palette, Panel, Series};

fn mode_color(mode: HostMode) -> plotters::style::RGBColor {
    match mode {
        HostMode::Chorus => palette(0),
        HostMode::Naive => palette(1),
        HostMode::NaivePolling => palette(2),
    }
}

fn modes(report: &BenchReport) -> Vec<HostMode> {
    let mut modes: Vec<HostMode> = Vec::new();
    for r in &report.results {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
    }
    modes
}

fn loads(report: &BenchReport) -> Vec<bool> {
    let mut loads = vec![false];
    if report.results.iter().any(|r| r.background_load) {
        loads.push(true);
    }
    loads
}

fn sizes_of(results: &[&BenchResult]) -> Vec<usize> {
    let mut sizes: Vec<usize> = results.iter().map(|r| r.message_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}K", bytes / 1024)
    } else {
        format!("{bytes}")
    }
}

fn label(mode: HostMode, loaded: bool) -> String {
    if loaded {
        format!("{} +load", mode.name())
    } else {
        mode.name().to_string()
    }
}

/// Latency points of one primitive at one group size, single tenant.
fn latency_points<'a>(report: &'a BenchReport, primitive: &str, group_size: usize) -> Vec<&'a BenchResult> {
    report
        .results
        .iter()
        .filter(|r| {
            r.kind == "latency" && r.primitive == primitive && r.group_size == group_size && r.tenants == 1
        })
        .collect()
}

fn smallest_group(report: &BenchReport) -> usize {
    report.results.iter().map(|r| r.group_size).min().unwrap_or(3)
}

type Pick = fn(&BenchResult) -> f64;

fn by_size_series(
    points: &[&BenchResult],
    sizes: &[usize],
    mode: HostMode,
    loaded: bool,
    pick: Pick,
) -> Vec<(f64, f64)> {
    sizes
        .iter()
        .enumerate()
        .filter_map(|(i, size)| {
            points
                .iter()
                .find(|r| r.mode == mode && r.background_load == loaded && r.message_bytes == *size)
                .map(|r| (i as f64, pick(r)))
        })
        .collect()
}

/// Draw every figure into `dir`; returns the files written.
pub fn plot_all(report: &BenchReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let (modes, loads, n) = (modes(report), loads(report), smallest_group(report));
    let mut written = Vec::new();
    let stats: [(&str, Pick); 3] = [("average", |r| r.mean_us), ("p95", |r| r.p95_us), ("p99", |r| r.p99_us)];

    // Figure 8.
    let mut panels = Vec::new();
    for primitive in ["gWRITE", "gMEMCPY"] {
        let points = latency_points(report, primitive, n);
        let sizes = sizes_of(&points);
        for (stat, pick) in stats {
            let mut series = Vec::new();
            for &loaded in &loads {
                for &mode in &modes {
                    series.push(Series {
                        label: label(mode, loaded),
                        color: mode_color(mode),
                        dashed: loaded,
                        points: by_size_series(&points, &sizes, mode, loaded, pick),
                    });
                }
            }
            panels.push(Panel {
                title: format!("{primitive} {stat}, group of {n}"),
                x_desc: "message size (bytes)".into(),
                y_desc: format!("{stat} latency"),
                x_categories: Some(sizes.iter().map(|s| size_name(*s)).collect()),
                log_y: true,
                series,
            });
        }
    }
    let path = dir.join("group-fig8-latency.png");
    draw_grid(&path, "Figure 8 shape: gWRITE and gMEMCPY latency vs message size (log scale)", 3, &panels)?;
    written.push(path);

    // Table 2 (gCAS).
    let points = latency_points(report, "gCAS", n);
    let mut series = Vec::new();
    for &loaded in &loads {
        for &mode in &modes {
            let Some(r) = points.iter().find(|r| r.mode == mode && r.background_load == loaded) else {
                continue;
            };
            series.push(Series {
                label: label(mode, loaded),
                color: mode_color(mode),
                dashed: loaded,
                points: vec![(0.0, r.mean_us), (1.0, r.p95_us), (2.0, r.p99_us)],
            });
        }
    }
    let panel = Panel {
        title: format!("gCAS, group of {n}"),
        x_desc: "statistic".into(),
        y_desc: "latency".into(),
        x_categories: Some(vec!["average".into(), "p95".into(), "p99".into()]),
        log_y: true,
        series,
    };
    let path = dir.join("group-table2-gcas.png");
    draw_grid(&path, "Table 2 shape: gCAS latency", 1, &[panel])?;
    written.push(path);

    // Figure 9.
    let points: Vec<&BenchResult> =
        report.results.iter().filter(|r| r.kind == "throughput" && r.group_size == n).collect();
    let sizes = sizes_of(&points);
    let figure9: [(&str, &str, Pick); 3] = [
        ("gWRITE throughput", "MiB/s", |r| r.mib_per_s),
        ("replica CPU time per operation", "CPU per op (us)", |r| r.host_cpu_us_per_op.unwrap_or(0.0)),
        ("cores the replicas kept busy", "cores", |r| r.host_cpu_cores.unwrap_or(0.0)),
    ];
    let mut panels = Vec::new();
    for (title, y_desc, pick) in figure9 {
        let mut series = Vec::new();
        for &loaded in &loads {
            for &mode in &modes {
                series.push(Series {
                    label: label(mode, loaded),
                    color: mode_color(mode),
                    dashed: loaded,
                    points: by_size_series(&points, &sizes, mode, loaded, pick),
                });
            }
        }
        panels.push(Panel {
            title: format!("{title}, group of {n}"),
            x_desc: "message size (bytes)".into(),
            y_desc: y_desc.into(),
            x_categories: Some(sizes.iter().map(|s| size_name(*s)).collect()),
            log_y: false,
            series,
        });
    }
    let path = dir.join("group-fig9-throughput.png");
    draw_grid(&path, "Figure 9 shape: gWRITE throughput and the replicas' CPU", 3, &panels)?;
    written.push(path);

    // Figure 10.
    let mut group_sizes: Vec<usize> = report.results.iter().map(|r| r.group_size).collect();
    group_sizes.sort_unstable();
    group_sizes.dedup();
    let mut panels = Vec::new();
    for &mode in &modes {
        let all: Vec<&BenchResult> =
            group_sizes.iter().flat_map(|g| latency_points(report, "gWRITE", *g)).collect();
        let sizes = sizes_of(&all);
        let mut series = Vec::new();
        for &loaded in &loads {
            for (i, &g) in group_sizes.iter().enumerate() {
                let points = latency_points(report, "gWRITE", g);
                series.push(Series {
                    label: format!("{g} members{}", if loaded { " +load" } else { "" }),
                    color: palette(3 + i),
                    dashed: loaded,
                    points: by_size_series(&points, &sizes, mode, loaded, |r| r.p99_us),
                });
            }
        }
        panels.push(Panel {
            title: format!("{}: gWRITE p99", mode.name()),
            x_desc: "message size (bytes)".into(),
            y_desc: "p99 latency".into(),
            x_categories: Some(sizes.iter().map(|s| size_name(*s)).collect()),
            log_y: true,
            series,
        });
    }
    let path = dir.join("group-fig10-group-size.png");
    draw_grid(&path, "Figure 10 shape: gWRITE p99 latency for groups of 3, 5 and 7", 3, &panels)?;
    written.push(path);
    Ok(written)
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

/// The ratios the paper reports, as measured: each Naïve variant over the chain.
pub fn summary(report: &BenchReport) -> String {
    let (modes, loads, n) = (modes(report), loads(report), smallest_group(report));
    let mut text = String::new();
    let find = |kind: &str, primitive: &str, g: usize, size: Option<usize>, mode: HostMode, loaded: bool| {
        report.results.iter().find(|r| {
            r.kind == kind
                && r.primitive == primitive
                && r.group_size == g
                && r.tenants == 1
                && size.is_none_or(|s| r.message_bytes == s)
                && r.mode == mode
                && r.background_load == loaded
        })
    };
    for &loaded in &loads {
        let _ = writeln!(
            text,
            "\n== {} ==",
            if loaded { "with background load (stress-ng on every core)" } else { "no background load" }
        );
        for primitive in ["gWRITE", "gMEMCPY"] {
            let points = latency_points(report, primitive, n);
            let _ = writeln!(text, "{primitive}, group of {n}: p99 (us) per size, and ratio to chorus");
            for size in sizes_of(&points) {
                let mut line = format!("  {:>6}", size_name(size));
                let chain =
                    find("latency", primitive, n, Some(size), HostMode::Chorus, loaded).map(|r| r.p99_us);
                for &mode in &modes {
                    if let Some(r) = find("latency", primitive, n, Some(size), mode, loaded) {
                        let _ = write!(line, "  {} {:.0}", mode.name(), r.p99_us);
                        if mode != HostMode::Chorus {
                            let _ = write!(line, " ({})", ratio(r.p99_us, chain.unwrap_or(0.0)));
                        }
                    }
                }
                let _ = writeln!(text, "{line}");
            }
        }
        let _ = writeln!(text, "gCAS, group of {n} (Table 2): average / p95 / p99 (us), CPU us per op");
        for &mode in &modes {
            if let Some(r) = find("latency", "gCAS", n, None, mode, loaded) {
                let _ = writeln!(
                    text,
                    "  {:<13} {:>8.0} {:>8.0} {:>8.0}   cpu {}",
                    mode.name(),
                    r.mean_us,
                    r.p95_us,
                    r.p99_us,
                    r.host_cpu_us_per_op.map_or("-".into(), |c| format!("{c:.1}"))
                );
            }
        }
        let _ = writeln!(text, "gWRITE throughput, group of {n}: MiB/s, CPU us per op, cores busy");
        let points: Vec<&BenchResult> =
            report.results.iter().filter(|r| r.kind == "throughput" && r.group_size == n).collect();
        for size in sizes_of(&points) {
            let mut line = format!("  {:>6}", size_name(size));
            for &mode in &modes {
                if let Some(r) = find("throughput", "gWRITE", n, Some(size), mode, loaded) {
                    let _ = write!(
                        line,
                        "  {} {:.0} MiB/s cpu {} cores {}{}",
                        mode.name(),
                        r.mib_per_s,
                        r.host_cpu_us_per_op.map_or("-".into(), |c| format!("{c:.1}")),
                        r.host_cpu_cores.map_or("-".into(), |c| format!("{c:.2}")),
                        if r.truncated { " (time cap)" } else { "" }
                    );
                }
            }
            let _ = writeln!(text, "{line}");
        }
        let mut group_sizes: Vec<usize> = report.results.iter().map(|r| r.group_size).collect();
        group_sizes.sort_unstable();
        group_sizes.dedup();
        let _ = writeln!(text, "gWRITE p99 (us) by group size, median over message sizes");
        for &mode in &modes {
            let mut line = format!("  {:<13}", mode.name());
            for &g in &group_sizes {
                let mut p99: Vec<f64> = latency_points(report, "gWRITE", g)
                    .iter()
                    .filter(|r| r.mode == mode && r.background_load == loaded)
                    .map(|r| r.p99_us)
                    .collect();
                p99.sort_by(f64::total_cmp);
                if let Some(m) = p99.get(p99.len() / 2) {
                    let _ = write!(line, "  n={g}: {m:.0}");
                }
            }
            let _ = writeln!(text, "{line}");
        }
    }
    text
}
