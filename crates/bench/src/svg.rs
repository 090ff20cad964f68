//! A small SVG line chart, enough for benchmark plots without a plotting stack.

use std::fmt::Write;

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

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#555555",
];

fn tick_label(v: f64) -> String {
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

impl Chart {
    /// Renders the chart as an SVG document.
    pub fn render(&self) -> String {
        let (w, h, ml, mr, mt, mb) = (760.0, 440.0, 80.0, 170.0, 40.0, 60.0);
        let tx = |x: f64| if self.log_x { x.max(1e-12).log2() } else { x };
        let ty = |y: f64| if self.log_y { y.max(1e-12).log10() } else { y };
        let pts: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|&(x, y)| (tx(x), ty(y))))
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect();
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in &pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if pts.is_empty() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if !self.log_y {
            y0 = y0.min(0.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        y1 += (y1 - y0) * 0.05;
        let px = |x: f64| ml + (x - x0) / (x1 - x0) * (w - ml - mr);
        let py = |y: f64| h - mb - (y - y0) / (y1 - y0) * (h - mt - mb);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            (ml + w - mr) / 2.0,
            esc(&self.title)
        );
        let _ = writeln!(
            s,
            r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
            h - mb,
            w - mr,
            h - mb
        );
        let _ = writeln!(
            s,
            r#"<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#,
            h - mb
        );
        for i in 0..=5 {
            let fx = x0 + (x1 - x0) * i as f64 / 5.0;
            let fy = y0 + (y1 - y0) * i as f64 / 5.0;
            let lx = if self.log_x { 2f64.powf(fx) } else { fx };
            let ly = if self.log_y { 10f64.powf(fy) } else { fy };
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                px(fx),
                h - mb + 18.0,
                tick_label(lx)
            );
            let _ = writeln!(
                s,
                r##"<line x1="{ml}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#ddd"/>"##,
                py(fy),
                w - mr,
                py(fy)
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                ml - 6.0,
                py(fy) + 4.0,
                tick_label(ly)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (ml + w - mr) / 2.0,
            h - 15.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
            (mt + h - mb) / 2.0,
            (mt + h - mb) / 2.0,
            esc(&self.y_label)
        );
        for (i, ser) in self.series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let path: Vec<String> = ser
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(tx(x)), py(ty(y))))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
            if ser.points.len() <= 40 {
                for &(x, y) in &ser.points {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                        px(tx(x)),
                        py(ty(y))
                    );
                }
            }
            let ly = mt + 10.0 + i as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/>"#,
                w - mr + 10.0,
                w - mr + 30.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}">{}</text>"#,
                w - mr + 36.0,
                ly + 4.0,
                esc(&ser.label)
            );
        }
        s.push_str("</svg>\n");
        s
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
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("t &lt;1&gt;") && s.ends_with("</svg>\n"));
    }
}
