//! The timeline figure of one decode token: time on x; an engine lane (between tokens,
//! non-expert compute, acquires, expert matmuls), a device lane (reads in flight), a copy lane
//! (window → slot copies in flight on the device's copy stream), and one lane
//! per MoE layer with its acquire, expert matmuls, copies, waits, and one bar per read from
//! its submission to its completion taken back.

use super::figure::register;
pub use crate::plan::timeline::SURFACE;
use crate::plan::timeline::{Kind, TimelineFile};
use crate::record::{load_typed, Surface};
use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// The colour of read bars (a test counts them).
pub const READ_COLOUR: RGBColor = RGBColor(31, 119, 180);
const COPY: RGBColor = RGBColor(255, 127, 14);
const IN_FLIGHT: RGBColor = RGBColor(255, 187, 120);
const WAIT: RGBColor = RGBColor(214, 39, 40);
const EXPERT: RGBColor = RGBColor(44, 160, 44);
const COMPUTE: RGBColor = RGBColor(152, 223, 138);
const ACQUIRE: RGBColor = RGBColor(199, 199, 199);
const BETWEEN: RGBColor = RGBColor(225, 225, 225);
const BUSY: RGBColor = RGBColor(148, 103, 189);
const SUBMIT: RGBColor = RGBColor(140, 86, 75);
/// Height of the legend band below the chart.
const LEGEND_PX: u32 = 76;

/// A record's `timeline` surface, checked against the digest its record states.
pub fn read(record: &Path) -> Result<TimelineFile> {
    let rec = load_typed(record)?;
    let s: &Surface = rec
        .surfaces()
        .get(crate::plan::timeline::SURFACE)
        .ok_or_else(|| anyhow!("{}: the record has no timeline surface (only completed Plan runs keep one)", record.display()))?;
    let bytes = crate::oracle::read_checked(record, s)?;
    TimelineFile::parse(&record.join(&s.file).display().to_string(), &bytes)
}

/// Intervals in nanoseconds, derived from the events.
struct Spans {
    /// (layer, start, end)
    acquires: Vec<(u32, u64, u64)>,
    experts: Vec<(u32, u64, u64)>,
    copies: Vec<(u32, u64, u64)>,
    /// Copies in flight on the copy stream: queued → event seen complete (synchronous ones:
    /// their span).
    in_flight: Vec<(u64, u64)>,
    /// Time inside the source's submit, in the lane of the acquire that submitted.
    submits: Vec<(u32, u64, u64)>,
    /// Blocked waits, in the lane of the acquire they stalled.
    waits: Vec<(u32, u64, u64)>,
    compute: Vec<(u64, u64)>,
    between: (u64, u64),
    /// (layer, start, end, sub-row of its lane)
    reads: Vec<(u32, u64, u64, usize)>,
    rows: HashMap<u32, usize>,
    busy: Vec<(u64, u64)>,
}

fn spans(f: &TimelineFile) -> Spans {
    let wall = f.times.wall_ns;
    let begin = f.events.iter().find(|e| e.kind == Kind::Begin).map_or(0, |e| e.t_ns);
    let mut s = Spans {
        acquires: Vec::new(),
        experts: Vec::new(),
        copies: Vec::new(),
        in_flight: Vec::new(),
        submits: Vec::new(),
        waits: Vec::new(),
        compute: Vec::new(),
        between: (0, begin),
        reads: Vec::new(),
        rows: HashMap::new(),
        busy: Vec::new(),
    };
    let (mut entered, mut returned, mut compute) = (None, HashMap::new(), None);
    let mut current = None;
    let mut queued: HashMap<u32, u64> = HashMap::new();
    for e in &f.events {
        let layer = e.layer.unwrap_or(0);
        match e.kind {
            Kind::Begin => compute = Some(e.t_ns),
            Kind::AcquireEnter => {
                if let Some(c) = compute.take() {
                    s.compute.push((c, e.t_ns));
                }
                entered = Some(e.t_ns);
                current = Some(layer);
            }
            Kind::AcquireReturn => {
                s.acquires.push((layer, entered.take().unwrap_or(e.t_ns), e.t_ns));
                returned.insert((layer, e.pass), e.t_ns);
                current = None;
            }
            Kind::Release => {
                if let Some(t) = returned.remove(&(layer, e.pass)) {
                    s.experts.push((layer, t, e.t_ns));
                }
                compute = Some(e.t_ns);
            }
            Kind::End => {
                if let Some(c) = compute.take() {
                    s.compute.push((c, e.t_ns));
                }
            }
            Kind::Copy => {
                s.copies.push((layer, e.t_ns, e.end_ns()));
                match e.window {
                    Some(w) => {
                        queued.insert(w, e.t_ns);
                    }
                    None => s.in_flight.push((e.t_ns, e.end_ns())),
                }
            }
            Kind::CopyDone => {
                s.copies.push((layer, e.t_ns, e.end_ns()));
                if let Some(t) = e.window.and_then(|w| queued.remove(&w)) {
                    s.in_flight.push((t, e.end_ns()));
                }
            }
            Kind::Complete if e.dur_ns > 0 => s.waits.push((current.unwrap_or(layer), e.t_ns, e.end_ns())),
            Kind::Submit if e.dur_ns > 0 => s.submits.push((current.unwrap_or(layer), e.t_ns, e.end_ns())),
            _ => {}
        }
    }
    // Reads: each on the first free sub-row of its layer's lane.
    let mut free_at: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut reads: Vec<(u32, u64, u64)> =
        f.reads().into_iter().map(|r| (r.submit.layer.unwrap_or(0), r.submit.t_ns, r.done_ns.unwrap_or(wall))).collect();
    reads.sort_by_key(|r| (r.1, r.2));
    for (layer, a, b) in reads {
        let rows = free_at.entry(layer).or_default();
        let row = match rows.iter().position(|&end| end <= a) {
            Some(i) => i,
            None => {
                rows.push(0);
                rows.len() - 1
            }
        };
        rows[row] = b;
        s.reads.push((layer, a, b, row));
    }
    s.rows = free_at.into_iter().map(|(l, r)| (l, r.len())).collect();
    let mut iv: Vec<(u64, u64)> = s.reads.iter().map(|r| (r.1, r.2)).collect();
    iv.sort();
    for (a, b) in iv {
        match s.busy.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => s.busy.push((a, b)),
        }
    }
    s
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, f: &TimelineFile, label: &str) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the figure: {x:?}");
    root.fill(&WHITE).map_err(e)?;
    let t = &f.times;
    let s = spans(f);
    let n_lanes = 3 + f.layers.len();
    let n = n_lanes as f64;
    let wall = ms(t.wall_ns.max(1));
    // The thinnest bar still shows.
    let min_w = wall / 1500.0;
    let title = format!(
        "{label}decode token {}: {:.1} ms; device busy {:.1} ms, idle {:.1} ms (compute {:.1}, expert matmuls {:.1}, copy {:.1}, Plan {:.1}, between tokens {:.1})",
        f.token,
        ms(t.wall_ns),
        ms(t.busy_ns),
        ms(t.idle_ns),
        ms(t.idle.compute_ns),
        ms(t.idle.expert_compute_ns),
        ms(t.idle.copy_ns),
        ms(t.idle.plan_ns + t.idle.submit_ns + t.idle.wait_ns),
        ms(t.idle.between_ns),
    );
    let h_px = root.dim_in_pixel().1;
    let (top, band) = root.split_vertically(h_px.saturating_sub(LEGEND_PX));
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 15))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..wall, 0.0..n)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("ms from the token's start (the previous decode's end)")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let lane_of: HashMap<u32, usize> = f.layers.iter().enumerate().map(|(i, &l)| (l, 3 + i)).collect();
    // Lane i from the top; (lo, hi) inside it, 0..1 bottom to top.
    let y = |lane: usize, frac: f64| n - 1.0 - lane as f64 + frac;
    let bar = |lane: usize, a: u64, b: u64, lo: f64, hi: f64, c: RGBColor| {
        let (x0, x1) = (ms(a), ms(b).max(ms(a) + min_w));
        Rectangle::new([(x0, y(lane, lo)), (x1, y(lane, hi))], c.filled())
    };
    let layer_lane = |l: u32| lane_of.get(&l).copied().unwrap_or(n_lanes - 1);

    let legend: [(RGBColor, &str); 10] = [
        (READ_COLOUR, "read (one per extent: submitted → taken back)"),
        (IN_FLIGHT, "copy in flight (queued → its event seen complete)"),
        (BUSY, "device busy (a read in flight)"),
        (SUBMIT, "inside submit (a synchronous read, or a full queue)"),
        (WAIT, "blocked waiting for a completion"),
        (COPY, "copy window → slot"),
        (ACQUIRE, "acquire (the Plan: reads, validation, copies)"),
        (EXPERT, "expert matmuls (acquire return → release)"),
        (COMPUTE, "non-expert compute"),
        (BETWEEN, "between tokens"),
    ];
    let engine = std::iter::once(bar(0, s.between.0, s.between.1, 0.1, 0.9, BETWEEN))
        .chain(s.compute.iter().map(|&(a, b)| bar(0, a, b, 0.1, 0.9, COMPUTE)))
        .chain(s.acquires.iter().map(|&(_, a, b)| bar(0, a, b, 0.1, 0.9, ACQUIRE)))
        .chain(s.experts.iter().map(|&(_, a, b)| bar(0, a, b, 0.1, 0.9, EXPERT)));
    chart.draw_series(engine).map_err(e)?;
    chart.draw_series(s.busy.iter().map(|&(a, b)| bar(1, a, b, 0.1, 0.9, BUSY))).map_err(e)?;
    chart.draw_series(s.in_flight.iter().map(|&(a, b)| bar(2, a, b, 0.1, 0.9, IN_FLIGHT))).map_err(e)?;
    let lanes = s
        .acquires
        .iter()
        .map(|&(l, a, b)| bar(layer_lane(l), a, b, 0.02, 0.98, ACQUIRE))
        .chain(s.experts.iter().map(|&(l, a, b)| bar(layer_lane(l), a, b, 0.05, 0.3, EXPERT)))
        .chain(s.submits.iter().map(|&(l, a, b)| bar(layer_lane(l), a, b, 0.05, 0.3, SUBMIT)))
        .chain(s.copies.iter().map(|&(l, a, b)| bar(layer_lane(l), a, b, 0.05, 0.3, COPY)))
        .chain(s.waits.iter().map(|&(l, a, b)| bar(layer_lane(l), a, b, 0.05, 0.3, WAIT)));
    chart.draw_series(lanes).map_err(e)?;
    chart
        .draw_series(s.reads.iter().map(|&(l, a, b, row)| {
            let rows = s.rows.get(&l).copied().unwrap_or(1).max(1) as f64;
            let h = 0.6 / rows;
            let lo = 0.35 + h * row as f64;
            bar(layer_lane(l), a, b, lo + h * 0.1, lo + h * 0.9, READ_COLOUR)
        }))
        .map_err(e)?;

    // Lane names left of the plotting area.
    let names = ["engine".to_string(), "device".to_string(), "copy stream".to_string()]
        .into_iter()
        .chain(f.layers.iter().map(|l| format!("layer {l}")));
    let style = TextStyle::from(("sans-serif", 13).into_font())
        .pos(plotters::style::text_anchor::Pos::new(plotters::style::text_anchor::HPos::Right, plotters::style::text_anchor::VPos::Center));
    for (i, name) in names.enumerate() {
        let (px, py) = chart.backend_coord(&(0.0, y(i, 0.5)));
        root.draw(&Text::new(name, (px - 8, py), style.clone())).map_err(e)?;
    }
    // The legend below the axis, three entries a row, so it hides no bar.
    let (w, _) = band.dim_in_pixel();
    let col = (w as i32 - 40) / 3;
    for (i, (c, name)) in legend.iter().enumerate() {
        let (x, y) = (20 + col * (i as i32 % 3), 8 + 22 * (i as i32 / 3));
        band.draw(&Rectangle::new([(x, y), (x + 18, y + 12)], c.filled())).map_err(e)?;
        band.draw(&Rectangle::new([(x, y), (x + 18, y + 12)], BLACK.mix(0.3))).map_err(e)?;
        band.draw(&Text::new(name.to_string(), (x + 26, y), ("sans-serif", 13))).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Draws the token's timeline; `.svg` or `.png` by the path's extension. `label` starts the
/// title (a run's name, or empty).
pub fn figure(path: &Path, f: &TimelineFile, label: &str) -> Result<()> {
    register();
    let size = (1400, 150 + LEGEND_PX + 34 * (2 + f.layers.len() as u32));
    match path.extension().and_then(|x| x.to_str()) {
        Some("svg") => draw(SVGBackend::new(path, size).into_drawing_area(), f, label),
        Some("png") => draw(BitMapBackend::new(path, size).into_drawing_area(), f, label),
        _ => bail!("{}: the figure's name must end in .svg or .png", path.display()),
    }
    .with_context(|| format!("{}", path.display()))
}

/// `sovereign export timeline --record DIR --out FILE`: the figure of the record's kept token.
pub fn export(record: &Path, out: &Path) -> Result<TimelineFile> {
    let f = read(record)?;
    figure(out, &f, "")?;
    Ok(f)
}
