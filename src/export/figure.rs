//! The pair-ratio figure, as SVG and PNG. Text is drawn with DejaVu Sans embedded in the
//! binary (`assets/fonts/`, Bitstream Vera license, see `DejaVu-LICENSE.txt`), so no
//! fontconfig or system font is needed.

use crate::stats::PairedRatio;
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, blocks: &[String], s: &PairedRatio) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {x:?}");
    root.fill(&WHITE).map_err(e)?;
    let mut lo = s.pairs.iter().map(|p| p.ratio).fold(f64::INFINITY, f64::min).min(s.lo.unwrap_or(s.ratio));
    let mut hi = s.pairs.iter().map(|p| p.ratio).fold(f64::NEG_INFINITY, f64::max).max(s.hi.unwrap_or(s.ratio));
    let pad = ((hi - lo) * 0.15).max(hi.abs() * 0.01).max(1e-6);
    lo -= pad;
    hi += pad;
    let n = s.pairs.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0.5f64..(n as f64 + 0.5), lo..hi)
        .map_err(e)?;
    let labels: Vec<String> = blocks.iter().map(|b| b.replace('\n', " ")).collect();
    chart
        .configure_mesh()
        .x_labels(n.max(1))
        .x_label_formatter(&|x| {
            let i = x.round() as i64;
            if (x - i as f64).abs() < 1e-6 && i >= 1 && (i as usize) <= labels.len() {
                labels[i as usize - 1].clone()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.4}"))
        .x_desc("pair (block, order)")
        .y_desc("ratio b / a")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let blue = RGBColor(31, 119, 180);
    let grey = RGBColor(120, 120, 120);
    if let (Some(l), Some(h)) = (s.lo, s.hi) {
        chart
            .draw_series(std::iter::once(Rectangle::new([(0.5, l), (n as f64 + 0.5, h)], RGBAColor(31, 119, 180, 0.12).filled())))
            .map_err(e)?
            .label(format!("{:.0}% paired-log t interval [{l:.4}, {h:.4}]", s.level * 100.0))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], RGBAColor(31, 119, 180, 0.25).filled()));
    }
    chart
        .draw_series(LineSeries::new([(0.5, s.ratio), (n as f64 + 0.5, s.ratio)], grey.stroke_width(2)))
        .map_err(e)?
        .label(format!("geometric ratio {:.4} (n = {})", s.ratio, s.n))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], grey.stroke_width(2)));
    chart
        .draw_series(s.pairs.iter().enumerate().map(|(i, p)| Circle::new(((i + 1) as f64, p.ratio), 5, blue.filled())))
        .map_err(e)?
        .label("pair ratio")
        .legend(move |(x, y)| Circle::new((x + 8, y), 5, blue.filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Writes `pairs.svg` and `pairs.png` into `out`.
pub fn pair_ratios(out: &Path, title: &str, blocks: &[String], s: &PairedRatio) -> Result<Vec<PathBuf>> {
    register();
    let svg = out.join("pairs.svg");
    let png = out.join("pairs.png");
    draw(SVGBackend::new(&svg, (900, 500)).into_drawing_area(), title, blocks, s)?;
    draw(BitMapBackend::new(&png, (900, 500)).into_drawing_area(), title, blocks, s)?;
    Ok(vec![svg, png])
}
