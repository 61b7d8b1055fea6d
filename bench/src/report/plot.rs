//! SVG plots (plotters, SVG backend only; text is laid out with plotters' built-in
//! estimate, so no font files are needed). Large series are thinned by a fixed stride,
//! never randomly, so the same run always draws the same picture.

use std::path::Path;

use plotters::prelude::*;

use super::document::{PolicyReport, Report, ReportError};

/// Most points drawn per series.
const MAX_POINTS: usize = 4_000;

fn err(path: &Path) -> impl Fn(String) -> ReportError + '_ {
    move |message| ReportError::Plot {
        path: path.to_path_buf(),
        message,
    }
}

fn thin<T: Copy>(v: &[T], max: usize) -> Vec<T> {
    let stride = v.len().div_ceil(max.max(1)).max(1);
    v.iter().step_by(stride).copied().collect()
}

/// Axis label without spurious decimals: 1000 → "1000", 0.25 → "0.25".
fn short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn color(i: usize) -> RGBColor {
    let c = Palette99::pick(i).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

/// Attainment against rate scale, one line per policy with a capacity search, and
/// the target as a dashed line.
pub(crate) fn attainment_vs_rate(path: &Path, report: &Report) -> Result<(), ReportError> {
    let e = err(path);
    let with: Vec<&PolicyReport> = report
        .policies
        .iter()
        .filter(|p| p.capacity.is_some())
        .collect();
    let x_max = with
        .iter()
        .filter_map(|p| p.capacity.as_ref())
        .flat_map(|c| c.probes.iter().map(|q| q.rate_scale))
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.05;
    let target = with
        .iter()
        .filter_map(|p| p.capacity.as_ref())
        .map(|c| c.target)
        .next()
        .unwrap_or(0.9);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("SLO attainment against rate scale", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..1.02)
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("rate scale (× workload rate)")
        .y_desc("attainment (both SLOs)")
        .draw()
        .map_err(|x| e(x.to_string()))?;
    chart
        .draw_series(DashedLineSeries::new(
            vec![(0.0, target), (x_max, target)],
            6,
            4,
            BLACK.mix(0.6).into(),
        ))
        .map_err(|x| e(x.to_string()))?
        .label(format!("target {target}"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.6)));
    for (i, p) in with.iter().enumerate() {
        let Some(c) = &p.capacity else { continue };
        let pts: Vec<(f64, f64)> = c
            .curve()
            .iter()
            .map(|q| (q.rate_scale, q.attainment))
            .collect();
        let col = color(i);
        chart
            .draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
            .map_err(|x| e(x.to_string()))?
            .label(format!("{} (capacity {:.3}×)", p.name, c.capacity))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&pt| Circle::new(pt, 4, col.filled())))
            .map_err(|x| e(x.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
}

/// Predicted (mean) against actual TTFT, log–log, with the y = x diagonal.
pub(crate) fn ttft_forecast(path: &Path, p: &PolicyReport) -> Result<(), ReportError> {
    let e = err(path);
    let all: Vec<(f64, f64)> = p
        .run
        .records
        .iter()
        .filter_map(|r| Some((r.ttft_s? * 1e3, r.predicted_ttft_ms?)))
        .filter(|&(a, b)| a.is_finite() && b.is_finite() && a > 0.0 && b > 0.0)
        .collect();
    let pts = thin(&all, MAX_POINTS);
    let lo = pts
        .iter()
        .map(|&(a, b)| a.min(b))
        .fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|&(a, b)| a.max(b)).fold(0.0f64, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo * 0.8, hi * 1.25)
    } else {
        (1.0, 10.0)
    };
    let hi = if hi <= lo { lo * 10.0 } else { hi };
    let root = SVGBackend::new(path, (720, 660)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: predicted vs actual TTFT (n={})", p.name, all.len()),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("actual TTFT (ms)")
        .y_desc("predicted TTFT (ms)")
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| short(*v))
        .light_line_style(WHITE)
        .draw()
        .map_err(|x| e(x.to_string()))?;
    chart
        .draw_series(LineSeries::new(vec![(lo, lo), (hi, hi)], BLACK.mix(0.5)))
        .map_err(|x| e(x.to_string()))?;
    let col = color(0);
    chart
        .draw_series(
            pts.iter()
                .map(|&pt| Circle::new(pt, 2, col.mix(0.45).filled())),
        )
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
}

/// In-flight requests per replica over time; with more than 12 replicas the min, mean
/// and max across replicas instead of one line each.
pub(crate) fn load_over_time(path: &Path, p: &PolicyReport) -> Result<(), ReportError> {
    let e = err(path);
    let samples = thin(&p.run.load.iter().collect::<Vec<_>>(), MAX_POINTS);
    let width = samples.iter().map(|s| s.inflight.len()).max().unwrap_or(0);
    let t_lo = samples.first().map_or(0.0, |s| s.t_s);
    let t_hi = samples.last().map_or(1.0, |s| s.t_s).max(t_lo + 1e-3);
    let y_hi = samples
        .iter()
        .flat_map(|s| s.inflight.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.1;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: in-flight requests per replica", p.name),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(t_lo..t_hi, 0.0..y_hi)
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("in flight")
        .draw()
        .map_err(|x| e(x.to_string()))?;
    let at = |s: &crate::sim::result::LoadSample, i: usize| {
        f64::from(s.inflight.get(i).copied().unwrap_or(0))
    };
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    if width <= 12 {
        for i in 0..width {
            let name = p
                .run
                .replicas
                .get(i)
                .map_or_else(|| format!("replica {i}"), |r| r.name.clone());
            series.push((name, samples.iter().map(|s| (s.t_s, at(s, i))).collect()));
        }
    } else {
        let stat = |f: &dyn Fn(&[u32]) -> f64| {
            samples
                .iter()
                .map(|s| (s.t_s, f(&s.inflight)))
                .collect::<Vec<_>>()
        };
        series.push((
            "min".into(),
            stat(&|v| f64::from(v.iter().copied().min().unwrap_or(0))),
        ));
        series.push((
            "mean".into(),
            stat(&|v| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len().max(1) as f64),
        ));
        series.push((
            "max".into(),
            stat(&|v| f64::from(v.iter().copied().max().unwrap_or(0))),
        ));
    }
    for (i, (name, pts)) in series.into_iter().enumerate() {
        let col = color(i);
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(1)))
            .map_err(|x| e(x.to_string()))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
}
