//! PNG charts of a run: throughput over time, latency over time, and the
//! latency distribution (percentile spectrum, as HdrHistogram plots it).

use std::path::{Path, PathBuf};
use std::sync::Once;

use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::load::{Arrival, Record, Second};

const SIZE: (u32, u32) = (1000, 560);
const FONT: &str = "sans-serif";

/// Renders the three charts into `dir`; returns their paths.
///
/// # Errors
/// If a file cannot be written.
pub fn render(record: &Record, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let files = [
        ("throughput.png", throughput as Chart),
        ("latency.png", latency_over_time),
        ("latency-distribution.png", distribution),
    ];
    let mut written = Vec::new();
    for (name, draw) in files {
        let path = dir.join(name);
        {
            let root = BitMapBackend::new(&path, SIZE).into_drawing_area();
            root.fill(&WHITE).map_err(plot_error)?;
            draw(record, &root).map_err(plot_error)?;
            root.present().map_err(plot_error)?;
        }
        written.push(path);
    }
    Ok(written)
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type DrawResult =
    Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;
type Chart = fn(&Record, &Area<'_>) -> DrawResult;

fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart: {e}")
}

/// The font is compiled in (DejaVu Sans), so charts render the same on a
/// machine without fontconfig or any installed font.
fn register_font() -> anyhow::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| anyhow::anyhow!("the embedded chart font did not load"));
    });
    result
}

/// A chart frame: title, margins, room for axis labels.
fn frame<'a, 'b>(
    root: &'a Area<'b>,
    record: &Record,
    what: &str,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(caption(record, what), (FONT, 22))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(72);
    builder
}

/// One labelled line.
fn line<'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    label: &str,
    color: RGBColor,
    points: impl IntoIterator<Item = (f64, f64)>,
) -> DrawResult {
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(())
}

fn caption(record: &Record, what: &str) -> String {
    match record.arrival {
        Arrival::Closed { concurrency } => format!("{what} — closed loop, {concurrency} in flight"),
        Arrival::Open { rate, .. } => format!("{what} — open loop, {rate:.0} requests/s scheduled"),
    }
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
}

/// The seconds of the timeline worth a point, with the share of each that
/// the run covered: the last one is usually cut short, and a sliver of a
/// second would plot as a collapse of throughput.
fn whole_seconds(record: &Record) -> impl Iterator<Item = (usize, &Second, f64)> {
    let elapsed = record.elapsed.as_secs_f64();
    record
        .timeline
        .iter()
        .enumerate()
        .map(move |(i, s)| (i, s, (elapsed - i as f64).clamp(0.0, 1.0)))
        .filter(|(_, _, width)| *width >= 0.25)
}

fn throughput(record: &Record, root: &Area<'_>) -> DrawResult {
    let seconds = record.elapsed.as_secs_f64().ceil().max(1.0);
    let top = whole_seconds(record)
        .map(|(_, s, width)| s.completed() as f64 / width)
        .fold(1.0, f64::max)
        * 1.5; // headroom for the legend
    let mut chart =
        frame(root, record, "Throughput").build_cartesian_2d(0f64..seconds, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc("responses per second")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 13))
        .draw()?;
    type Count = fn(&Second) -> u64;
    let series: [(&str, RGBColor, Count); 5] = [
        ("all responses", BLACK, |s| s.completed()),
        ("accepted", RGBColor(0, 128, 0), |s| s.accepted),
        ("refused (sold out, already bought)", BLUE, |s| s.refused),
        ("rate-limited (429)", RGBColor(230, 140, 0), |s| {
            s.rate_limited
        }),
        ("errors", RED, |s| s.errors),
    ];
    for (label, color, value) in series {
        let points = whole_seconds(record)
            .map(move |(i, s, width)| (i as f64 + 0.5, value(s) as f64 / width));
        line(&mut chart, label, color, points)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn latency_over_time(record: &Record, root: &Area<'_>) -> DrawResult {
    let seconds = record.elapsed.as_secs_f64().ceil().max(1.0);
    let ms = |us: u64| (us as f64 / 1000.0).max(0.01);
    let highest = record
        .timeline
        .iter()
        .map(|s| ms(s.latency.max()))
        .fold(1.0, f64::max);
    let lowest = record
        .timeline
        .iter()
        .filter(|s| !s.latency.is_empty())
        .map(|s| ms(s.latency.value_at_quantile(0.5)))
        .fold(highest, f64::min);
    let mut chart = frame(root, record, "Latency over time")
        .build_cartesian_2d(0f64..seconds, (lowest / 2.0..highest * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc("latency, ms (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|v| format!("{v}"))
        .label_style((FONT, 13))
        .draw()?;
    let series: [(&str, RGBColor, f64); 3] = [
        ("p50", RGBColor(0, 128, 0), 0.5),
        ("p99", BLUE, 0.99),
        ("max", RED, 1.0),
    ];
    for (label, color, q) in series {
        let points = record
            .timeline
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.latency.is_empty())
            .map(move |(i, s)| (i as f64 + 0.5, ms(s.latency.value_at_quantile(q))));
        line(&mut chart, label, color, points)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// Percentile on a log axis: x = -log10(1 - q), so 90% is 1, 99% is 2,
/// 99.9% is 3: the tail gets as much room as the body.
fn spectrum(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let count = h.len().max(1) as f64;
    // The last point is where the data ends: 1 - 1/count.
    let deepest = count.log10();
    let mut points: Vec<(f64, f64)> = h
        .iter_quantiles(8)
        .map(|v| {
            let q = v.quantile_iterated_to();
            let x = if q >= 1.0 {
                deepest
            } else {
                -(1.0 - q).log10()
            };
            (
                x.min(deepest),
                (v.value_iterated_to() as f64 / 1000.0).max(0.01),
            )
        })
        .collect();
    points.dedup_by(|a, b| a.0 <= b.0);
    points
}

fn distribution(record: &Record, root: &Area<'_>) -> DrawResult {
    let mut lines = vec![("latency", BLUE, spectrum(&record.latency))];
    if matches!(record.arrival, Arrival::Open { .. }) {
        lines[0].0 = "latency from scheduled send (corrected)";
        lines.push((
            "service time from actual send",
            RGBColor(150, 150, 150),
            spectrum(&record.service_time),
        ));
    }
    let right = lines
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|p| p.0))
        .fold(1.0, f64::max)
        .ceil();
    let top = lines
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let bottom = lines
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|p| p.1))
        .fold(top, f64::min);
    let mut chart = frame(root, record, "Latency distribution")
        .build_cartesian_2d(0f64..right, (bottom / 2.0..top * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency, ms (log scale)")
        .x_labels(right as usize + 1)
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|v| format!("{v}"))
        .label_style((FONT, 13))
        .draw()?;
    for (label, color, points) in lines {
        line(&mut chart, label, color, points)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

fn percentile_label(x: f64) -> String {
    if x.fract().abs() > 1e-9 {
        return String::new();
    }
    match x as i64 {
        0 => "0%".into(),
        n => format!("{}%", 100.0 - 100.0 / 10f64.powi(n as i32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percentile_axis_is_labelled_in_nines() {
        let labels: Vec<String> = (0..5).map(|x| percentile_label(x as f64)).collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%", "99.99%"]);
        assert_eq!(percentile_label(1.5), "");
    }

    #[test]
    fn the_spectrum_rises_and_ends_at_the_maximum() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for v in 1..=10_000u64 {
            h.record(v * 10).unwrap();
        }
        let points = spectrum(&h);
        assert!(points
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        let last = points.last().unwrap();
        assert!((last.0 - 4.0).abs() < 1e-9, "{last:?}");
        assert!((last.1 - 100.0).abs() < 0.1, "{last:?}");
    }
}
