//! `--plot FILE.svg|FILE.png`: the replay drawn, one panel per limit.
//!
//! Each panel shares the trace's time axis and shows, for every step that
//! was decided, `remaining` after the decision (a line per key) with a green
//! dot where the request was admitted and a red cross where it was denied,
//! so limits replayed over the same trace can be compared by looking. A
//! policy of named limits gets a panel per limit: that limit's `remaining`,
//! marked by the policy's all-or-nothing decision.
//!
//! Text is drawn with a font compiled into the binary (Hack, from `epaint_default_fonts`,
//! through plotters' pure-Rust `ab_glyph` feature), so drawing needs no
//! fontconfig, FreeType or installed fonts.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One decided step, as the plot needs it.
#[derive(Debug, Clone)]
pub struct Point {
    /// Simulated time since `--start`, µs.
    pub t_us: u64,
    /// The step's key.
    pub key: String,
    /// The (policy's) decision.
    pub allowed: bool,
    /// `remaining` and `limit` of the decision, or of each named limit.
    pub values: Vec<(u64, u64)>,
}

/// One limit (or named limit) of the replay.
#[derive(Debug, Clone)]
pub struct Series {
    /// One panel per entry, by its title; each point's `values` holds one
    /// entry per panel.
    pub panels: Vec<String>,
    /// The steps decided, in order.
    pub points: Vec<Point>,
}

/// The image format, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Scalable vector graphics.
    Svg,
    /// A bitmap.
    Png,
}

impl Kind {
    /// The format `path` asks for.
    ///
    /// # Errors
    ///
    /// An extension other than `.svg` or `.png`, or a directory that does
    /// not exist.
    pub fn of(path: &Path) -> Result<Self, PlotPathError> {
        let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty());
        if let Some(parent) = parent.filter(|parent| !parent.is_dir()) {
            return Err(PlotPathError::NoDirectory(parent.to_owned()));
        }
        match path
            .extension()
            .and_then(|ext| ext.to_str())
            .map(str::to_ascii_lowercase)
        {
            Some(ext) if ext == "svg" => Ok(Self::Svg),
            Some(ext) if ext == "png" => Ok(Self::Png),
            _ => Err(PlotPathError::Extension(path.to_owned())),
        }
    }
}

/// A `--plot` path no plot can be written to.
#[derive(Debug, thiserror::Error)]
pub enum PlotPathError {
    #[error("--plot: no directory \"{}\"", .0.display())]
    NoDirectory(std::path::PathBuf),
    #[error("--plot: \"{}\" must end in .svg or .png (the format is chosen by the extension)", .0.display())]
    Extension(std::path::PathBuf),
}

const PANEL_HEIGHT: u32 = 320;

/// The panels' titles for `--limit`: a limit's parameters
/// (`gcra rate=5 period=1s burst=3`), or one title per named limit of a
/// policy (`per_second: gcra ... (policy)`).
pub fn titles(limit: &str) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_str(limit).unwrap_or_default();
    match value.as_object() {
        Some(fields) if !fields.contains_key("algorithm") && fields.len() > 1 => fields
            .iter()
            .map(|(name, limit)| format!("{name}: {} (of a policy, all-or-nothing)", describe(limit)))
            .collect(),
        _ => vec![describe(&value)],
    }
}

fn describe(limit: &serde_json::Value) -> String {
    let Some(fields) = limit.as_object() else {
        return limit.to_string();
    };
    if fields.contains_key("algorithm") {
        let mut parts = vec![fields["algorithm"]
            .as_str()
            .map_or_else(|| fields["algorithm"].to_string(), str::to_owned)];
        for (name, value) in fields.iter().filter(|(name, _)| *name != "algorithm") {
            let value = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
            parts.push(format!("{name}={value}"));
        }
        return parts.join(" ");
    }
    fields
        .iter()
        .map(|(name, limit)| format!("{name}: {}", describe(limit)))
        .collect::<Vec<_>>()
        .join(" | ")
}
const WIDTH: u32 = 1000;
const FONT: &str = "sans-serif";
/// The lines of the keys: neither green nor red, which mark decisions.
const KEY_COLORS: [RGBColor; 6] = [
    RGBColor(30, 80, 220),
    RGBColor(230, 140, 0),
    RGBColor(140, 60, 180),
    RGBColor(0, 160, 200),
    RGBColor(120, 80, 30),
    RGBColor(90, 90, 90),
];
/// Room for the y axis's labels, the same in every chart so the time axes line up.
const LABELS: u32 = 80;

fn register_font() -> anyhow::Result<()> {
    static REGISTER: Once = Once::new();
    let mut result = Ok(());
    REGISTER.call_once(|| {
        result = plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR)
            .map_err(|_| anyhow!("the bundled font cannot be read"));
    });
    result
}

/// Draws `series` (one or more panels each) into `path`, as SVG or PNG by
/// its extension.
///
/// # Errors
///
/// An unknown extension, or a file that cannot be written.
pub fn draw(path: &Path, series: &[Series]) -> anyhow::Result<()> {
    let kind = Kind::of(path).map_err(|error| anyhow::Error::new(crate::UsageError(error.to_string())))?;
    register_font()?;
    let panels: u32 = series.iter().map(|series| series.panels.len() as u32).sum();
    if panels == 0 {
        bail!("--plot: nothing to draw");
    }
    let size = (WIDTH, PANEL_HEIGHT * panels);
    let failed = |error: &dyn std::fmt::Display| anyhow!("--plot: cannot draw {}: {error}", path.display());
    match kind {
        Kind::Svg => draw_on(&SVGBackend::new(path, size).into_drawing_area(), series).map_err(|error| failed(&error)),
        Kind::Png => {
            draw_on(&BitMapBackend::new(path, size).into_drawing_area(), series).map_err(|error| failed(&error))
        }
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw_on<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, series: &[Series]) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let panels: usize = series.iter().map(|series| series.panels.len()).sum();
    let areas = root.split_evenly((panels, 1));
    let end_us = series
        .iter()
        .filter_map(|series| series.points.last())
        .map(|point| point.t_us)
        .max()
        .unwrap_or(0);
    let axis = TimeAxis::for_end(end_us);
    let mut areas = areas.iter();
    for series in series {
        for (at, title) in series.panels.iter().enumerate() {
            let Some(area) = areas.next() else { break };
            draw_panel(area, title, &series.points, at, axis)?;
        }
    }
    root.present()
}

/// Milliseconds, seconds or hours: the unit in which the trace spans at
/// least 10, so the time labels are whole numbers.
#[derive(Debug, Clone, Copy)]
struct TimeAxis {
    /// µs per unit.
    scale: f64,
    unit: &'static str,
    end: f64,
}

impl TimeAxis {
    fn for_end(end_us: u64) -> Self {
        let (scale, unit) = match end_us {
            0..10_000_000 => (1e3, "ms"),
            10_000_000..36_000_000_000 => (1e6, "s"),
            _ => (3.6e9, "h"),
        };
        let end = (end_us as f64 / scale).max(1.0);
        Self { scale, unit, end }
    }

    fn at(self, t_us: u64) -> f64 {
        t_us as f64 / self.scale
    }
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    points: &[Point],
    panel: usize,
    axis: TimeAxis,
) -> DrawResult<DB> {
    let value = |point: &Point| point.values.get(panel).copied().unwrap_or((0, 0));
    let top = points.iter().map(|point| value(point).1).max().unwrap_or(1).max(1);
    let (admitted, denied) = (
        points.iter().filter(|point| point.allowed).count(),
        points.iter().filter(|point| !point.allowed).count(),
    );
    let margin = axis.end * 0.02;
    let x_range = -margin..axis.end + margin;
    let at = |point: &Point| axis.at(point.t_us);
    let green = RGBColor(0, 150, 60);
    let (upper, lower) = area.split_vertically(area.dim_in_pixel().1 * 7 / 10);

    // Above: `remaining` after each decision, one line per key.
    let mut chart = ChartBuilder::on(&upper)
        .caption(
            format!("{title}: {admitted} admitted, {denied} denied"),
            (FONT, 15).into_font(),
        )
        .margin(10)
        .margin_bottom(0)
        .x_label_area_size(0)
        .y_label_area_size(LABELS)
        .build_cartesian_2d(x_range.clone(), -0.4f64..top as f64 + 0.4)?;
    chart
        .configure_mesh()
        .y_desc("remaining")
        .y_labels(usize::try_from(top.min(10)).unwrap_or(10) + 1)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let mut keys: Vec<&str> = Vec::new();
    for point in points {
        if !keys.contains(&point.key.as_str()) {
            keys.push(&point.key);
        }
    }
    let many_keys = keys.len() > 1;
    for (index, key) in keys.iter().enumerate() {
        let color = KEY_COLORS[index % KEY_COLORS.len()].to_rgba();
        let line = points
            .iter()
            .filter(|point| point.key == *key)
            .map(|point| (at(point), value(point).0 as f64));
        let label = if many_keys {
            format!("key \"{key}\"")
        } else {
            "remaining".to_owned()
        };
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    let marks = |allowed: bool| points.iter().filter(move |point| point.allowed == allowed);
    chart
        .draw_series(marks(true).map(|point| Circle::new((at(point), value(point).0 as f64), 4, green.filled())))?
        .label("admitted")
        .legend(move |(x, y)| Circle::new((x + 10, y), 4, green.filled()));
    chart
        .draw_series(marks(false).map(|point| Cross::new((at(point), value(point).0 as f64), 4, RED.stroke_width(2))))?
        .label("denied")
        .legend(|(x, y)| Cross::new((x + 10, y), 4, RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;

    // Below: every request on the time axis, admitted above, denied below.
    let mut strip = ChartBuilder::on(&lower)
        .margin(10)
        .margin_top(4)
        .x_label_area_size(36)
        .y_label_area_size(LABELS)
        .build_cartesian_2d(x_range, 0.4f64..2.6)?;
    strip
        .configure_mesh()
        .x_desc(format!("time since --start ({})", axis.unit))
        .x_labels(10)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_labels(3)
        .y_label_formatter(&|y| match y.round() {
            2.0 => "admitted".to_owned(),
            1.0 => "denied".to_owned(),
            _ => String::new(),
        })
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .disable_mesh()
        .draw()?;
    strip.draw_series(marks(true).map(|point| Circle::new((at(point), 2.0), 3, green.filled())))?;
    strip.draw_series(marks(false).map(|point| Cross::new((at(point), 1.0), 4, RED.stroke_width(2))))?;
    Ok(())
}
