//! `summary.md`: each metric's first, last, lowest and highest value, and the figures.

use std::fmt::Write;

use crate::metrics::Figure;
use crate::{number, span};

/// The summary of a run called `title`.
pub(crate) fn markdown(title: &str, figures: &[Figure]) -> String {
    let mut out = format!("# {title}\n\n");
    for figure in figures {
        let _ = writeln!(out, "## {}\n", figure.name);
        let _ = writeln!(out, "![{0}](plots/{0}.png) ([SVG](plots/{0}.svg))\n", figure.name);
        let _ = writeln!(out, "| metric | points | first | last | lowest | highest |");
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for series in &figure.series {
            let (low, high) = span(series.points.iter().map(|p| p.1));
            let first = series.points.first().map_or(f64::NAN, |p| p.1);
            let last = series.points.last().map_or(f64::NAN, |p| p.1);
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} |",
                series.name,
                series.points.len(),
                number(first),
                number(last),
                number(low),
                number(high)
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(20.0), "20");
        assert_eq!(number(0.123456), "0.1235");
        assert_eq!(number(0.01), "0.01000");
        assert_eq!(number(475.26), "475.3");
        assert_eq!(number(12345.6), "12346");
        assert_eq!(number(-1232.4), "-1232");
        assert_eq!(number(1.5e-8), "1.500e-8");
    }
}
