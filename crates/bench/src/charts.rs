//! A small grid-of-line-charts helper on plotters, shared by the paper-shaped figures of
//! `chorus bench group` ([`crate::group`]) and `chorus bench protocols` ([`crate::protocols`]).
//! Text uses the bundled DejaVu Sans font (see [`crate::plot`]).

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::plot::log_range;

/// One line of a panel. `dashed` lines are the second condition of a pair (e.g. with
/// background load), drawn in the same color.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub color: RGBColor,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// One chart. With `x_categories`, the x values are indices into it (equally spaced, labelled
/// by the category names: message sizes, group sizes, write ratios).
#[derive(Clone, Debug, Default)]
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub x_categories: Option<Vec<String>>,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// A color per index, from the tab10 palette.
pub fn palette(index: usize) -> RGBColor {
    const TAB10: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = TAB10[index % TAB10.len()];
    RGBColor(r, g, b)
}

/// Human units for a microsecond value.
pub fn format_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.1} s", us / 1_000_000.0)
    } else if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} us")
    }
}

/// Draw `panels` in a `cols`-wide grid under `title` and save a PNG at `path`.
pub fn draw_grid(path: &Path, title: &str, cols: usize, panels: &[Panel]) -> anyhow::Result<()> {
    crate::plot::register_font();
    let cols = cols.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(cols).max(1);
    // Wide enough for the title even with one panel.
    let width = (480 * cols as u32).max(820);
    let root = BitMapBackend::new(path, (width, 360 * rows as u32 + 44)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(44);
    head.titled(title, ("sans-serif", 20))?;
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    panel: &Panel,
) -> anyhow::Result<()> {
    let all: Vec<(f64, f64)> = panel.series.iter().flat_map(|s| s.points.iter().copied()).collect();
    let (x_lo, x_hi) = match &panel.x_categories {
        Some(categories) => (-0.3, categories.len().max(1) as f64 - 0.7),
        None => {
            let hi = all.iter().map(|p| p.0).fold(0.0, f64::max);
            (0.0, if hi > 0.0 { hi * 1.08 } else { 1.0 })
        }
    };
    let mut builder = ChartBuilder::on(area);
    builder.caption(&panel.title, ("sans-serif", 15)).margin(8).x_label_area_size(38).y_label_area_size(62);
    if panel.log_y {
        let (lo, hi) = log_range(all.iter().map(|p| p.1));
        let chart = builder.build_cartesian_2d(x_lo..x_hi, (lo..hi).log_scale())?;
        fill(chart, panel)
    } else {
        let hi = all.iter().map(|p| p.1).fold(0.0, f64::max);
        let chart = builder.build_cartesian_2d(x_lo..x_hi, 0.0..if hi > 0.0 { hi * 1.15 } else { 1.0 })?;
        fill(chart, panel)
    }
}

fn fill<'a, Y>(
    mut chart: ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    panel: &Panel,
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    std::ops::Range<f64>: AsRangedCoord,
{
    let categories = panel.x_categories.clone();
    let x_format = move |x: &f64| match &categories {
        Some(names) => {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        }
        None => format_number(*x),
    };
    let y_is_us = panel.y_desc.contains("latency") || panel.y_desc.ends_with("(us)");
    let y_format = move |y: &f64| if y_is_us { format_us(*y) } else { format_number(*y) };
    let x_labels = panel.x_categories.as_ref().map_or(8, Vec::len);
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .x_desc(panel.x_desc.as_str())
        .y_desc(panel.y_desc.as_str())
        .disable_x_mesh()
        .max_light_lines(1)
        .label_style(("sans-serif", 12))
        .draw()?;
    for series in &panel.series {
        let color = series.color;
        let points: Vec<(f64, f64)> =
            series.points.iter().copied().filter(|p| !panel.log_y || p.1 > 0.0).collect();
        if points.is_empty() {
            continue;
        }
        let style = color.stroke_width(2);
        let drawn = if series.dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))?
        };
        let dashed = series.dashed;
        drawn.label(series.label.as_str()).legend(move |(x, y)| {
            if dashed {
                PathElement::new(vec![(x, y), (x + 6, y)], color.stroke_width(2))
            } else {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            }
        });
        if dashed {
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.stroke_width(1))))?;
        } else {
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

fn format_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_with_log_and_linear_panels_is_written() {
        let dir = std::env::temp_dir().join(format!("chorus-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("grid.png");
        let series = |dashed| Series {
            label: "s".into(),
            color: palette(0),
            dashed,
            points: vec![(0.0, 10.0), (1.0, 200.0), (2.0, 3000.0)],
        };
        let panels = vec![
            Panel {
                title: "log".into(),
                y_desc: "latency".into(),
                x_categories: Some(vec!["a".into(), "b".into(), "c".into()]),
                log_y: true,
                series: vec![series(false), series(true)],
                ..Panel::default()
            },
            Panel { title: "linear".into(), series: vec![series(false)], ..Panel::default() },
        ];
        draw_grid(&path, "test", 2, &panels).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
