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

pub(super) fn register() {
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
    finish(&root, &mut chart, SeriesLabelPosition::UpperRight)
}

/// Draws the legend at `at` and presents the figure.
fn finish<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    root: &DrawingArea<DB, Shift>,
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    at: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {x:?}");
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(at)
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

/// One point of the quality-versus-bytes figure.
pub struct Point {
    pub label: String,
    pub bytes_per_token: f64,
    pub quality: f64,
    pub kind: PointKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PointKind {
    Base,
    Verifier,
    Refine,
    Streamed,
}

fn draw_quality<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, points: &[Point]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    use PointKind;
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {x:?}");
    root.fill(&WHITE).map_err(e)?;
    let mb = |p: &Point| p.bytes_per_token / 1e6;
    let x_hi = points.iter().map(mb).fold(0.0, f64::max) * 1.08 + 1e-6;
    let (mut lo, mut hi) = points.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), p| (l.min(p.quality), h.max(p.quality)));
    let pad = ((hi - lo) * 0.15).max(1e-3);
    lo -= pad;
    hi += pad;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-x_hi * 0.03..x_hi, lo..hi)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("verification bytes per token (MB, logical)")
        .y_desc("mean log-prob under the reference")
        .y_label_formatter(&|y| format!("{y:.3}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    let green = RGBColor(44, 160, 44);
    let red = RGBColor(214, 39, 40);
    let mut curve: Vec<(f64, f64)> =
        points.iter().filter(|p| matches!(p.kind, PointKind::Base | PointKind::Refine)).map(|p| (mb(p), p.quality)).collect();
    curve.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    chart
        .draw_series(LineSeries::new(curve, blue.stroke_width(2)))
        .map_err(e)?
        .label("τ sweep (resident verifier)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], blue.stroke_width(2)));
    for (kind, colour, label) in [
        (PointKind::Base, red, "base alone"),
        (PointKind::Refine, blue, "refine"),
        (PointKind::Streamed, orange, "refine, verifier streamed under the cap"),
        (PointKind::Verifier, green, "verifier alone"),
    ] {
        let sel: Vec<&Point> = points.iter().filter(|p| p.kind == kind).collect();
        if sel.is_empty() {
            continue;
        }
        let hollow = kind == PointKind::Streamed;
        chart
            .draw_series(sel.iter().map(|p| {
                let style = if hollow { colour.stroke_width(2) } else { colour.filled() };
                EmptyElement::at((mb(p), p.quality))
                    + Circle::new((0, 0), if hollow { 8 } else { 5 }, style)
                    + Text::new(p.label.clone(), (8, if hollow { 6 } else { -16 }), ("sans-serif", 12))
            }))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 8, y), 5, if hollow { colour.stroke_width(2) } else { colour.filled() }));
    }
    finish(&root, &mut chart, SeriesLabelPosition::LowerRight)
}

/// Writes `quality_bytes.svg` and `quality_bytes.png` into `out`.
pub fn quality_bytes(out: &Path, title: &str, points: &[Point]) -> Result<Vec<PathBuf>> {
    register();
    let svg = out.join("quality_bytes.svg");
    let png = out.join("quality_bytes.png");
    draw_quality(SVGBackend::new(&svg, (900, 560)).into_drawing_area(), title, points)?;
    draw_quality(BitMapBackend::new(&png, (900, 560)).into_drawing_area(), title, points)?;
    Ok(vec![svg, png])
}

fn draw_envelope<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, e: &crate::envelope::Envelope) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {x:?}");
    root.fill(&WHITE).map_err(err)?;
    let kib = |c: &crate::envelope::Cell| c.block_bytes as f64 / 1024.0;
    let (x_lo, x_hi) = e.cells.iter().fold((f64::INFINITY, 0.0f64), |(l, h), c| (l.min(kib(c)), h.max(kib(c))));
    let (y_lo, y_hi) = e.cells.iter().fold((f64::INFINITY, 0.0f64), |(l, h), c| (l.min(c.mib_per_s), h.max(c.mib_per_s)));
    let mut chart = ChartBuilder::on(&root)
        .caption("Cold O_DIRECT reads (io_uring) by block size and queue depth", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((x_lo / 1.5..x_hi * 1.5).log_scale(), (y_lo.max(1e-3) / 1.5..y_hi * 1.5).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("block size (KiB)")
        .y_desc("MiB/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let mut depths: Vec<usize> = e.cells.iter().map(|c| c.depth).collect();
    depths.sort_unstable();
    depths.dedup();
    for (i, d) in depths.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        let mut pts: Vec<(f64, f64)> = e.cells.iter().filter(|c| c.depth == *d).map(|c| (kib(c), c.mib_per_s)).collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
            .map_err(err)?
            .label(format!("QD {d}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled()))).map_err(err)?;
    }
    let c = &e.ceiling;
    chart
        .draw_series(std::iter::once(Circle::new((kib(c), c.mib_per_s), 9, BLACK.stroke_width(2))))
        .map_err(err)?
        .label(format!("ceiling {:.0} MiB/s ({} KiB, QD {})", c.mib_per_s, c.block_bytes / 1024, c.depth))
        .legend(|(x, y)| Circle::new((x + 8, y), 5, BLACK.stroke_width(2)));
    finish(&root, &mut chart, SeriesLabelPosition::LowerRight)
}

/// The read envelope as a log–log figure; `.svg` or `.png` by the path's extension.
pub fn envelope(path: &Path, e: &crate::envelope::Envelope) -> Result<()> {
    register();
    match path.extension().and_then(|x| x.to_str()) {
        Some("svg") => draw_envelope(SVGBackend::new(path, (900, 560)).into_drawing_area(), e),
        Some("png") => draw_envelope(BitMapBackend::new(path, (900, 560)).into_drawing_area(), e),
        _ => anyhow::bail!("{}: the figure's name must end in .svg or .png", path.display()),
    }
}

/// One line of a curve figure; `bound` draws it dashed in black (a bound, not a measurement).
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub bound: bool,
}

fn draw_curves<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, axes: (&str, &str), curves: &[Curve]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {x:?}");
    root.fill(&WHITE).map_err(e)?;
    let all = curves.iter().flat_map(|c| c.points.iter());
    let (x_lo, x_hi, y_hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY, 0.0f64), |(a, b, c), p| (a.min(p.0), b.max(p.0), c.max(p.1)));
    let (x_lo, x_hi) = if x_lo.is_finite() { (x_lo - 0.5, x_hi + 0.5) } else { (0.0, 1.0) };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_lo..x_hi, 0.0..y_hi * 1.08 + 1e-9)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(axes.0)
        .y_desc(axes.1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let mut colour = 0;
    for c in curves {
        let style = if c.bound {
            BLACK.stroke_width(2)
        } else {
            colour += 1;
            Palette99::pick(colour - 1).to_rgba().stroke_width(2)
        };
        let pts = c.points.clone();
        let anno = if c.bound {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style)).map_err(e)?
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style)).map_err(e)?
        };
        anno.label(c.label.clone()).legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, style.color.filled()))).map_err(e)?;
    }
    finish(&root, &mut chart, SeriesLabelPosition::UpperRight)
}

/// Lines over a shared x axis; `.svg` or `.png` by the path's extension.
pub fn curves(path: &Path, title: &str, axes: (&str, &str), curves: &[Curve]) -> Result<()> {
    register();
    match path.extension().and_then(|x| x.to_str()) {
        Some("svg") => draw_curves(SVGBackend::new(path, (900, 560)).into_drawing_area(), title, axes, curves),
        Some("png") => draw_curves(BitMapBackend::new(path, (900, 560)).into_drawing_area(), title, axes, curves),
        _ => anyhow::bail!("{}: the figure's name must end in .svg or .png", path.display()),
    }
}
