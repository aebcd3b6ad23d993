//! Drawing a figure: a grid of line charts, one per series, to PNG or SVG.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::{Figure, Series};
use crate::{PlotError, number, span};

const COLUMNS: usize = 3;
const PANEL: (u32, u32) = (420, 260);
/// DejaVu Sans (Bitstream Vera licence, `assets/DejaVuSans.LICENSE`): PNG text is rendered
/// from it, so charts look the same on a machine without fonts.
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Draws `figure` to `path`, PNG or SVG by its extension.
pub(crate) fn draw(figure: &Figure, path: &Path) -> Result<(), PlotError> {
    register_font();
    let rows = figure.series.len().div_ceil(COLUMNS).max(1);
    let columns = figure.series.len().clamp(1, COLUMNS);
    let size = (PANEL.0 * columns as u32, PANEL.1 * rows as u32 + 40);
    let failed = |message: String| PlotError::Draw {
        path: path.to_path_buf(),
        message,
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => panels(figure, SVGBackend::new(path, size).into_drawing_area(), (rows, columns)),
        Some("png") => panels(
            figure,
            BitMapBackend::new(path, size).into_drawing_area(),
            (rows, columns),
        ),
        other => return Err(failed(format!("unknown image format {other:?} (png or svg)"))),
    }
    .map_err(failed)
}

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The bytes are a valid TrueType font, compiled in; a failure would show as missing text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn panels<DB: DrawingBackend>(
    figure: &Figure,
    root: DrawingArea<DB, Shift>,
    grid: (usize, usize),
) -> Result<(), String> {
    let text = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(text)?;
    let root = root.titled(&figure.name, ("sans-serif", 22)).map_err(text)?;
    for (area, series) in root.split_evenly(grid).iter().zip(&figure.series) {
        panel(area, series).map_err(text)?;
    }
    root.present().map_err(text)
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &Series,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (x, y) = (
        range(series.points.iter().map(|p| p.0)),
        range(series.points.iter().map(|p| p.1)),
    );
    let (x_ticks, y_ticks) = (x.clone(), y.clone());
    let mut chart = ChartBuilder::on(area)
        .caption(&series.name, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .y_labels(5)
        .x_desc(series.x_label.as_str())
        .x_label_formatter(&|v| tick_label(*v, &x_ticks))
        .y_label_formatter(&|v| tick_label(*v, &y_ticks))
        .label_style(("sans-serif", 11))
        .draw()?;
    let points = series.points.iter().copied();
    chart.draw_series(LineSeries::new(points.clone(), BLUE.stroke_width(2)))?;
    if series.points.len() <= 20 {
        chart.draw_series(points.map(|p| Circle::new(p, 3, BLUE.filled())))?;
    }
    Ok(())
}

/// The values' span with 5% either side; a single value (a constant series, say a learning
/// rate of 3e-5) gets 10% of itself either side, so the axis reads around it, not around 0.
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (low, high) = span(values);
    if !low.is_finite() {
        return 0.0..1.0;
    }
    let pad = match (high > low, low == 0.0) {
        (true, _) => (high - low) * 0.05,
        (false, true) => 1.0,
        (false, false) => low.abs() * 0.1,
    };
    (low - pad)..(high + pad)
}

/// A tick's label on an axis spanning `axis`: [`number`]'s four significant digits, or more
/// when the axis is narrow beside its values (100.000 to 100.010 needs five decimals to tell
/// its five ticks apart).
fn tick_label(value: f64, axis: &std::ops::Range<f64>) -> String {
    let step = (axis.end - axis.start) / 5.0;
    let magnitude = axis.start.abs().max(axis.end.abs());
    // The significant digits that resolve one tick step at the axis's magnitude.
    let digits = match step > 0.0 && magnitude > 0.0 {
        true => (magnitude / step).log10().ceil() as i32 + 1,
        false => 0,
    };
    if digits <= 4 {
        return number(value);
    }
    let digits = digits.min(12);
    if (1e-3..1e6).contains(&magnitude) {
        let decimals = (digits - 1 - magnitude.log10().floor() as i32).max(0) as usize;
        format!("{value:.decimals$}")
    } else {
        let mantissa = (digits - 1) as usize;
        format!("{value:.mantissa$e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_series_gets_an_axis_around_its_value() {
        let axis = range([3e-5; 4].into_iter());
        assert!(axis.start > 0.0 && axis.contains(&3e-5), "{axis:?}");
        let labels: Vec<String> = (0..=5)
            .map(|i| tick_label(axis.start + i as f64 * 1.2e-6, &axis))
            .collect();
        assert!(
            labels.iter().all(|l| l != "0" && !l.starts_with("0.0000")),
            "{labels:?}"
        );
        assert_eq!(tick_label(3e-5, &axis), "3.000e-5");
        assert_eq!(range([0.0; 3].into_iter()), -1.0..1.0);
    }

    #[test]
    fn ticks_of_a_narrow_axis_are_told_apart() {
        let axis = 100.0..100.01;
        let labels: Vec<String> = (0..=5).map(|i| tick_label(100.0 + i as f64 * 0.002, &axis)).collect();
        let mut distinct = labels.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), 6, "{labels:?}");
        // A wide axis keeps the usual four significant digits.
        assert_eq!(tick_label(0.123456, &(0.0..1.0)), "0.1235");
        assert_eq!(tick_label(200.0, &(0.0..1000.0)), "200");
    }
}
