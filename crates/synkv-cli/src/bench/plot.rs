//! Charts of bench results as PNG files: `synkv bench … --plot FILE.png` and `synkv bench plot`.
//!
//! A [`Chart`] is a title, two axis labels and named [`Series`] of [`Point`]s (a value, and the
//! min–max spread drawn as a whisker). Both axes are logarithmic, with the ranges widened to
//! whole decades so every axis has labelled ticks: sizes and times span decades. Series are
//! drawn in order of first appearance, each with its own colour, and named in the legend.
//!
//! Text needs a TrueType font, read at run time (nothing is bundled into the binary):
//! `SYNKV_PLOT_FONT` if set, else the first of a few common system paths (Debian's
//! `fonts-dejavu-core` provides `/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf`). Without one
//! [`check_target`] fails, before any measuring, naming the package to install.
//!
//! This module only draws; what is measured and how it maps to series is the caller's.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use plotters::prelude::*;

/// Size of every chart, in pixels.
pub(crate) const WIDTH: u32 = 1000;
pub(crate) const HEIGHT: u32 = 620;

/// Where fonts are looked for, in order, after `SYNKV_PLOT_FONT`.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",   // Debian, Ubuntu: fonts-dejavu-core
    "/usr/share/fonts/TTF/DejaVuSans.ttf",               // Arch: ttf-dejavu
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf", // Fedora: dejavu-sans-fonts
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf", // macOS
    "/Library/Fonts/Arial.ttf",
];

/// Series colours (distinct on white, and for the common colour blindnesses).
const COLOURS: &[RGBColor] = &[
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(150, 150, 150),
];

/// One measured value and its spread (`low` = `high` = `y` when there is none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

impl Point {
    /// A value without a spread.
    pub(crate) fn new(x: f64, y: f64) -> Point {
        Point { x, y, low: y, high: y }
    }

    /// A value with its min–max spread.
    pub(crate) fn spread(x: f64, y: f64, low: f64, high: f64) -> Point {
        Point { x, y, low, high }
    }
}

/// A named line of points, sorted by x when drawn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<Point>,
}

/// What one PNG shows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) x_label: String,
    pub(crate) y_label: String,
    pub(crate) series: Vec<Series>,
}

impl Chart {
    pub(crate) fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Chart {
        Chart { title: title.into(), x_label: x_label.into(), y_label: y_label.into(), series: Vec::new() }
    }

    /// Adds `point` to the series called `series` (a new one, after the others, if needed).
    pub(crate) fn add(&mut self, series: &str, point: Point) {
        match self.series.iter_mut().find(|s| s.name == series) {
            Some(s) => s.points.push(point),
            None => self.series.push(Series { name: series.to_owned(), points: vec![point] }),
        }
    }

    /// Draws the chart into `path` (a `.png`), [`WIDTH`] × [`HEIGHT`] pixels.
    pub(crate) fn write_png(&self, path: &Path) -> Result<()> {
        check_target(path)?;
        let points = || self.series.iter().flat_map(|s| &s.points);
        if points().next().is_none() {
            bail!("nothing to plot into {}: no measured values", path.display());
        }
        if let Some(p) =
            points().find(|p| !(p.x > 0.0 && p.y > 0.0 && p.low > 0.0 && p.high > 0.0 && p.x.is_finite() && p.high.is_finite()))
        {
            bail!("cannot plot {p:?} into {}: both axes are logarithmic, so every value must be finite and above 0", path.display());
        }
        let x = decades(points().map(|p| p.x));
        let y = decades(points().flat_map(|p| [p.low, p.y, p.high]));
        self.draw(path, x, y).map_err(|e| anyhow!("drawing the chart into {}: {e}", path.display()))
    }

    fn draw(&self, path: &Path, x: (f64, f64), y: (f64, f64)) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d((x.0..x.1).log_scale(), (y.0..y.1).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&|v| si(*v))
            .y_label_formatter(&|v| si(*v))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(200, 200, 200))
            .draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut pts = s.points.clone();
            pts.sort_by(|a, b| a.x.total_cmp(&b.x));
            chart
                .draw_series(LineSeries::new(pts.iter().map(|p| (p.x, p.y)), colour.stroke_width(2)))?
                .label(&s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3)));
            chart.draw_series(pts.iter().map(|p| Circle::new((p.x, p.y), 4, colour.filled())))?;
            chart.draw_series(
                pts.iter().filter(|p| p.low < p.high).map(|p| PathElement::new(vec![(p.x, p.low), (p.x, p.high)], colour.stroke_width(1))),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
        root.present()?;
        Ok(())
    }
}

/// Checks, before any measuring, that a chart can be written to `path`: a `.png` name in an
/// existing directory, and a font for its text.
pub(crate) fn check_target(path: &Path) -> Result<()> {
    let png = path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        bail!("--plot {}: the chart is a PNG image, so the file name must end in .png", path.display());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!("--plot {}: the directory {} does not exist; create it first", path.display(), dir.display());
    }
    load_font()
}

/// Registers the chart font once per process (see the module docs); later calls return the
/// first call's outcome.
pub(crate) fn load_font() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    match LOADED.get_or_init(|| {
        let chosen = std::env::var_os("SYNKV_PLOT_FONT").filter(|v| !v.is_empty()).map(PathBuf::from);
        let from_env = if chosen.is_some() { " (SYNKV_PLOT_FONT)" } else { "" };
        let path = match chosen {
            Some(p) => p,
            None => FONT_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()).ok_or_else(|| {
                format!(
                    "no TrueType font for the chart's text: none of {} exists; install one (Debian, Ubuntu: `apt-get install fonts-dejavu-core`) or set SYNKV_PLOT_FONT=/path/to/font.ttf",
                    FONT_PATHS.join(", ")
                )
            })?,
        };
        let bytes = std::fs::read(&path).map_err(|e| format!("reading the chart font {}{from_env}: {e}", path.display()))?;
        // plotters keeps registered fonts for the whole process; it is read once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a TrueType/OpenType font; set SYNKV_PLOT_FONT to a .ttf file", path.display()))?;
        Ok(path)
    }) {
        Ok(_) => Ok(()),
        Err(e) => Err(anyhow!("{e}")),
    }
}

/// The smallest range of whole decades holding every value (at least one decade).
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    // a hair wider, so rounding never drops the decade ticks at the ends
    (lo * 0.999, hi * 1.001)
}

/// `v` with an SI suffix: 1500 → `1.5K`, 16777216 → `16.8M`, 0.25 → `0.25`.
pub(crate) fn si(v: f64) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e12 => (v / 1e12, "T"),
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "K"),
        _ => (v, ""),
    };
    let text = format!("{scaled:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

/// `n` elements as the benches name them: `16M` for 16 × 2²⁰, `10K` for 10 × 2¹⁰, else `si`.
pub(crate) fn elements(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => si(n as f64),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Whether a font can be had; tests that draw skip, saying why, when it cannot.
    pub(crate) fn font_or_skip(test: &str) -> bool {
        match load_font() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipping {test}: {e}");
                false
            }
        }
    }

    /// Width and height from a PNG's IHDR chunk; fails on anything that is not a PNG.
    pub(crate) fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR", "the first chunk of a PNG is IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    fn sample() -> Chart {
        let mut c = Chart::new("test chart", "elements", "ms");
        c.add("a", Point::spread(1024.0, 0.5, 0.4, 0.7));
        c.add("b", Point::new(1024.0, 2.0));
        c.add("a", Point::spread(1_048_576.0, 40.0, 35.0, 52.0));
        c
    }

    #[test]
    fn points_group_by_series_in_order_of_first_appearance() {
        let c = sample();
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(c.series[0].points.len(), 2);
        assert_eq!(c.series[0].points[1], Point { x: 1_048_576.0, y: 40.0, low: 35.0, high: 52.0 });
    }

    #[test]
    fn writes_a_png_of_the_chart_size() {
        if !font_or_skip("writes_a_png_of_the_chart_size") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.png");
        sample().write_png(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(png_size(&bytes), (WIDTH, HEIGHT));
    }

    #[test]
    fn refuses_what_it_cannot_draw() {
        let dir = tempfile::tempdir().unwrap();
        let e = sample().write_png(&dir.path().join("chart.jpg")).unwrap_err().to_string();
        assert!(e.contains("must end in .png"), "{e}");
        let e = sample().write_png(&dir.path().join("missing/chart.png")).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        if !font_or_skip("refuses_what_it_cannot_draw") {
            return;
        }
        let e = Chart::new("t", "x", "y").write_png(&dir.path().join("empty.png")).unwrap_err().to_string();
        assert!(e.contains("nothing to plot"), "{e}");
        let mut c = Chart::new("t", "x", "y");
        c.add("s", Point::new(0.0, 1.0));
        let e = c.write_png(&dir.path().join("zero.png")).unwrap_err().to_string();
        assert!(e.contains("above 0"), "{e}");
    }

    #[test]
    fn ranges_are_whole_decades() {
        let near = |(a, b): (f64, f64), (c, d): (f64, f64)| (a / c - 1.0).abs() < 0.01 && (b / d - 1.0).abs() < 0.01;
        assert!(near(decades([3.0, 70.0].into_iter()), (1.0, 100.0)));
        assert!(near(decades([10.0].into_iter()), (10.0, 100.0)));
        assert!(near(decades([0.2, 0.3].into_iter()), (0.1, 1.0)));
        let (lo, hi) = decades([0.02, 0.5].into_iter());
        assert!(lo < 0.01 && hi > 1.0);
    }

    #[test]
    fn numbers_read_short() {
        assert_eq!(si(1500.0), "1.5K");
        assert_eq!(si(1e6), "1M");
        assert_eq!(si(0.25), "0.25");
        assert_eq!(elements(16 << 20), "16M");
        assert_eq!(elements(10_240), "10K");
        assert_eq!(elements(1000), "1K");
    }
}
