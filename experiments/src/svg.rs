//! Benchmark plots: line charts drawn as SVG with `plotters`.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title on top.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic x axis (base 2).
    pub log_x: bool,
    /// Logarithmic y axis (base 10).
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x55, 0x55, 0x55),
];

fn tick_label(v: &f64) -> String {
    let v = *v;
    if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v.abs() >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The data's range on one axis, widened where it is a single value, and kept
/// positive on a logarithmic axis.
fn span(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.2, hi * 1.2)
    } else if lo == hi {
        (lo - 1.0, hi + 1.0)
    } else {
        let pad = (hi - lo) * 0.05;
        ((lo - pad).min(if lo >= 0.0 { 0.0 } else { lo }), hi + pad)
    }
}

impl Chart {
    /// Renders the chart as an SVG document.
    pub fn render(&self) -> String {
        let xs = span(
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0)),
            self.log_x,
        );
        let ys = span(
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1)),
            self.log_y,
        );
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (760, 440)).into_drawing_area();
            let drawn = match (self.log_x, self.log_y) {
                (false, false) => self.draw(&root, xs.0..xs.1, ys.0..ys.1),
                (true, false) => self.draw(&root, (xs.0..xs.1).log_scale().base(2.0), ys.0..ys.1),
                (false, true) => self.draw(&root, xs.0..xs.1, (ys.0..ys.1).log_scale()),
                (true, true) => self.draw(
                    &root,
                    (xs.0..xs.1).log_scale().base(2.0),
                    (ys.0..ys.1).log_scale(),
                ),
            };
            if let Err(e) = drawn.and_then(|_| root.present().map_err(|e| e.to_string())) {
                // A plot that cannot be drawn says why instead of failing the run.
                return format!(
                    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"60\"><text x=\"10\" y=\"30\">{}: {}</text></svg>\n",
                    esc(&self.title),
                    esc(&e)
                );
            }
        }
        out
    }

    fn draw<X, Y>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        x: X,
        y: Y,
    ) -> Result<(), String>
    where
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        root.fill(&WHITE).map_err(e)?;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&tick_label)
            .y_label_formatter(&tick_label)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(e)?;
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(e)?
                .label(&s.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn renders_every_series() {
        let c = Chart {
            title: "t <1>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: true,
            log_y: false,
            series: vec![
                Series {
                    label: "a".into(),
                    points: vec![(64.0, 1.0), (128.0, 2.0)],
                },
                Series {
                    label: "b".into(),
                    points: vec![(64.0, 3.0)],
                },
            ],
        };
        let s = c.render();
        // Each series: its line and its legend mark, in its colour, and its label.
        for (color, label) in [("#1F77B4", ">\na\n<"), ("#D62728", ">\nb\n<")] {
            let lines = s
                .lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(color))
                .count();
            assert_eq!(lines, 2, "{color}: {s}");
            assert!(s.contains(label), "{label:?}: {s}");
        }
        assert!(s.contains("t &lt;1&gt;") && s.ends_with("</svg>\n"));
    }
}
