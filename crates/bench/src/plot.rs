//! PNG plots of a comparison (plotters, bitmap backend). Text is drawn with DejaVu Sans from
//! the `dejavu` crate, so no system font is needed.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;

use crate::compare::{Comparison, Point, SystemKind};

pub(crate) fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_err() {
            eprintln!("chorus bench: cannot load the bundled font; plots will lack text");
        }
    });
}

/// The bundled font, for plots drawn by other modules (`raftlog`).
pub fn register_font_for_others() {
    register_font();
}

fn color(system: SystemKind) -> RGBColor {
    match system {
        SystemKind::Chorus => RGBColor(31, 119, 180),
        SystemKind::RedisWait => RGBColor(255, 127, 14),
        SystemKind::Redis => RGBColor(44, 160, 44),
        SystemKind::Etcd => RGBColor(214, 39, 40),
        SystemKind::Raftlog => RGBColor(148, 103, 189),
        SystemKind::EtcdHttp => RGBColor(140, 86, 75),
    }
}

struct Axes {
    workloads: Vec<String>,
    clients: Vec<usize>,
    systems: Vec<SystemKind>,
}

fn axes(points: &[Point]) -> Axes {
    let mut workloads: Vec<String> = Vec::new();
    for p in points {
        if !workloads.contains(&p.workload) {
            workloads.push(p.workload.clone());
        }
    }
    let mut clients: Vec<usize> = points.iter().map(|p| p.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut systems: Vec<SystemKind> = points.iter().map(|p| p.system).collect();
    systems.sort();
    systems.dedup();
    Axes { workloads, clients, systems }
}

fn grid_shape(n: usize) -> (usize, usize) {
    match n {
        0 | 1 => (1, 1),
        2 => (1, 2),
        3 | 4 => (2, 2),
        5 | 6 => (2, 3),
        n => (n.div_ceil(3), 3),
    }
}

/// Draws every plot; returns their paths.
pub fn plot_all(comparison: &Comparison, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let points: Vec<Point> = comparison.points.iter().filter(|p| p.ops_per_s > 0.0).cloned().collect();
    if points.is_empty() {
        return Ok(Vec::new());
    }
    let axes = axes(&points);
    let throughput = out.join("throughput.png");
    plot_throughput(&points, &axes, &throughput)?;
    let latency = out.join("latency.png");
    plot_latency(&points, &axes, &latency)?;
    let percentiles = out.join("percentiles.png");
    plot_percentiles(&points, &axes, &percentiles)?;
    Ok(vec![throughput, latency, percentiles])
}

fn x_label(clients: &[usize]) -> impl Fn(&f64) -> String + '_ {
    move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < clients.len() {
            clients[i as usize].to_string()
        } else {
            String::new()
        }
    }
}

fn plot_throughput(points: &[Point], axes: &Axes, path: &Path) -> anyhow::Result<()> {
    let (rows, cols) = grid_shape(axes.workloads.len());
    let root = BitMapBackend::new(path, (520 * cols as u32, 360 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled("Throughput vs clients (closed loop)", ("sans-serif", 22))?;
    let n = axes.clients.len();
    for (area, workload) in body.split_evenly((rows, cols)).iter().zip(&axes.workloads) {
        let mine: Vec<&Point> = points.iter().filter(|p| &p.workload == workload).collect();
        let top = mine.iter().map(|p| p.ops_per_s).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(workload, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..top)?;
        let formatter = x_label(&axes.clients);
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&formatter)
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .x_desc("clients")
            .y_desc("ops/s")
            .disable_x_mesh()
            .max_light_lines(1)
            .label_style(("sans-serif", 13))
            .draw()?;
        for &system in &axes.systems {
            let series: Vec<(f64, f64)> = axes
                .clients
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    mine.iter()
                        .find(|p| p.system == system && p.clients == *c)
                        .map(|p| (i as f64, p.ops_per_s))
                })
                .collect();
            let c = color(system);
            chart
                .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))?
                .label(system.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
            chart.draw_series(series.iter().map(|(x, y)| Circle::new((*x, *y), 3, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// A log axis range covering every positive value, widened to whole decades.
pub fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi <= 0.0 {
        return (1.0, 10.0);
    }
    (10f64.powf(lo.log10().floor()), 10f64.powf(hi.log10().ceil()).max(lo * 10.0))
}

fn plot_latency(points: &[Point], axes: &Axes, path: &Path) -> anyhow::Result<()> {
    let cols = axes.workloads.len();
    let root = BitMapBackend::new(path, (400 * cols as u32, 700 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled("Latency vs clients: p50 (top) and p99 (bottom), log scale", ("sans-serif", 22))?;
    let n = axes.clients.len();
    let areas = body.split_evenly((2, cols));
    for (row, (label, pick)) in
        [("p50", (|p: &Point| p.p50_us) as fn(&Point) -> f64), ("p99", |p: &Point| p.p99_us)]
            .into_iter()
            .enumerate()
    {
        for (col, workload) in axes.workloads.iter().enumerate() {
            let area = &areas[row * cols + col];
            let mine: Vec<&Point> = points.iter().filter(|p| &p.workload == workload).collect();
            let (lo, hi) = log_range(mine.iter().map(|p| pick(p)));
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{workload} {label}"), ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(35)
                .y_label_area_size(60)
                .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), (lo..hi).log_scale())?;
            let formatter = x_label(&axes.clients);
            chart
                .configure_mesh()
                .x_labels(n)
                .x_label_formatter(&formatter)
                .y_label_formatter(&|y| format_us(*y))
                .x_desc("clients")
                .y_desc(format!("{label} latency"))
                .disable_x_mesh()
                .max_light_lines(1)
                .label_style(("sans-serif", 12))
                .draw()?;
            for &system in &axes.systems {
                let series: Vec<(f64, f64)> = axes
                    .clients
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| {
                        mine.iter()
                            .find(|p| p.system == system && p.clients == *c)
                            .map(|p| (i as f64, pick(p)))
                    })
                    .collect();
                let c = color(system);
                chart
                    .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))?
                    .label(system.name())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
                chart.draw_series(series.iter().map(|(x, y)| Circle::new((*x, *y), 3, c.filled())))?;
            }
            if row == 0 && col == 0 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .label_font(("sans-serif", 12))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK.mix(0.4))
                    .draw()?;
            }
        }
    }
    root.present()?;
    Ok(())
}

fn format_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.0} ms", us / 1000.0)
    } else {
        format!("{us:.0} us")
    }
}

fn plot_percentiles(points: &[Point], axes: &Axes, path: &Path) -> anyhow::Result<()> {
    // The client count closest to 64.
    let Some(&clients) = axes.clients.iter().min_by_key(|c| c.abs_diff(64)) else { return Ok(()) };
    let (rows, cols) = grid_shape(axes.workloads.len());
    let root = BitMapBackend::new(path, (520 * cols as u32, 360 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(&format!("Latency percentiles at {clients} clients, log scale"), ("sans-serif", 22))?;
    let names = ["p50", "p95", "p99", "p99.9", "max"];
    let values = |p: &Point| [p.p50_us, p.p95_us, p.p99_us, p.p99_9_us, p.max_us];
    for (area, workload) in body.split_evenly((rows, cols)).iter().zip(&axes.workloads) {
        let mine: Vec<&Point> =
            points.iter().filter(|p| &p.workload == workload && p.clients == clients).collect();
        let (lo, hi) = log_range(mine.iter().flat_map(|p| values(p)));
        let mut chart = ChartBuilder::on(area)
            .caption(workload, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.3f64..4.3f64, (lo..hi).log_scale())?;
        let formatter = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && (0.0..5.0).contains(&i) {
                names[i as usize].to_string()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_labels(5)
            .x_label_formatter(&formatter)
            .y_label_formatter(&|y| format_us(*y))
            .y_desc("latency")
            .disable_x_mesh()
            .max_light_lines(1)
            .label_style(("sans-serif", 13))
            .draw()?;
        for &system in &axes.systems {
            let Some(point) = mine.iter().find(|p| p.system == system) else { continue };
            let series: Vec<(f64, f64)> =
                values(point).iter().enumerate().map(|(i, v)| (i as f64, *v)).collect();
            let c = color(system);
            chart
                .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))?
                .label(system.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
            chart.draw_series(series.iter().map(|(x, y)| Circle::new((*x, *y), 3, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
