//! The `inspect --heatmap` SVG: one cell per 2 MiB region.

use std::fmt::Write;

/// One cell of a [`Heatmap`].
#[derive(Debug, Clone)]
pub struct Cell {
    /// Shade, 0 (white) to 1 (full colour); `None` draws it grey.
    pub value: Option<f64>,
    /// Drawn with a dark outline (a huge page, say).
    pub outlined: bool,
    /// Shown when the pointer rests on it.
    pub tooltip: String,
}

/// A grid of cells in rows, each row with a label.
#[derive(Debug, Clone)]
pub struct Heatmap {
    /// Title on top.
    pub title: String,
    /// What the shade means (printed under the title).
    pub legend: String,
    /// Rows: label and cells.
    pub rows: Vec<(String, Vec<Cell>)>,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Heatmap {
    /// Renders the heatmap as an SVG document.
    pub fn render(&self) -> String {
        let (cell, ml, mt) = (10.0, 170.0, 60.0);
        let cols = self
            .rows
            .iter()
            .map(|r| r.1.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let w = ml + cols as f64 * cell + 20.0;
        let h = mt + self.rows.len() as f64 * cell + 30.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r##"<text x="10" y="20" font-size="14">{}</text><text x="10" y="40" fill="#555555">{}</text>"##,
            escape(&self.title),
            escape(&self.legend)
        );
        for (i, (label, cells)) in self.rows.iter().enumerate() {
            let y = mt + i as f64 * cell;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end" font-size="8">{}</text>"#,
                ml - 4.0,
                y + cell - 2.0,
                escape(label)
            );
            for (j, c) in cells.iter().enumerate() {
                let x = ml + j as f64 * cell;
                let fill = match c.value {
                    Some(v) => {
                        let v = v.clamp(0.0, 1.0);
                        // White to red.
                        let g = (255.0 * (1.0 - v)).round() as u8;
                        format!("rgb(255,{g},{g})")
                    }
                    None => "#ddd".into(),
                };
                let stroke = if c.outlined { "#000" } else { "#ccc" };
                let _ = writeln!(
                    s,
                    r#"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" stroke="{stroke}" stroke-width="0.5"><title>{}</title></rect>"#,
                    escape(&c.tooltip)
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }
}
