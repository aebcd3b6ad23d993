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
        .x_label_formatter(&|x| number(*x))
        .y_label_formatter(&|y| number(*y))
        .label_style(("sans-serif", 11))
        .draw()?;
    let points = series.points.iter().copied();
    chart.draw_series(LineSeries::new(points.clone(), BLUE.stroke_width(2)))?;
    if series.points.len() <= 20 {
        chart.draw_series(points.map(|p| Circle::new(p, 3, BLUE.filled())))?;
    }
    Ok(())
}

/// The values' span, widened when it is a single value so the axis is not empty.
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (low, high) = span(values);
    if !low.is_finite() {
        return 0.0..1.0;
    }
    let pad = if high > low {
        (high - low) * 0.05
    } else {
        low.abs().max(1.0) * 0.1
    };
    (low - pad)..(high + pad)
}
