//! `synkv bench plot RESULTS.jsonl… -o FILE.png`: a chart from recorded JSON lines, such as
//! `synkv bench … --json` prints and the peer scripts of `benches/compare/` write next to
//! them (MXNet, torch): synkv and its peers side by side.
//!
//! Every line that is a JSON object with the chosen x and y fields is a record; other lines
//! (the loopback record, notes) are skipped. `--where FIELD=VALUE` drops the records whose
//! field reads otherwise; records without the field stay (torch's all_reduce records have no
//! `servers` or `updater`, and belong next to every server count). Records group into series by the `--series` fields (default
//! `impl`), and within a series by x:
//!
//! - the records of one job (the same `"run"` id: a distributed job's workers) count once, as
//!   their largest y (the slowest worker bounds a synchronous round), as `table_dist.py` does;
//! - the runs of one point (rounds) give the plotted median, and their min–max the whisker.
//!
//! x is a numeric field or one of two derived ones: `elements` = size × keys (keys 1 when
//! absent), `moved` = the bytes the API moves per iteration, size × keys × 4 (f32) × 2 (push and
//! pull) × devices (1 when absent).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{Map, Value};

use super::plot::{Chart, Point};

/// Arguments of `synkv bench plot`.
///
/// A series is named by its `--series` fields' values (`impl` bare, others as `field=value`;
/// a field the record lacks is left out of its name).
#[derive(Debug, Args)]
pub(crate) struct PlotArgs {
    /// JSON-lines result files (e.g. bench-results/local-….jsonl).
    #[arg(required = true)]
    results: Vec<PathBuf>,
    /// The PNG file to write.
    #[arg(short, long, value_name = "FILE.png")]
    output: PathBuf,
    /// The x axis: a numeric field, `elements` (size × keys) or `moved` (bytes per iteration).
    #[arg(long, default_value = "elements")]
    x: String,
    /// The y axis: a numeric field.
    #[arg(long, default_value = "median_ms")]
    y: String,
    /// Fields whose values name a series (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "impl")]
    series: Vec<String>,
    /// Drop records whose FIELD reads other than VALUE (repeatable; records without FIELD stay).
    #[arg(long = "where", value_name = "FIELD=VALUE")]
    filters: Vec<String>,
    /// The chart's title (default: the files' names).
    #[arg(long)]
    title: Option<String>,
    /// The x axis label (default: from --x).
    #[arg(long)]
    x_label: Option<String>,
    /// The y axis label (default: from --y).
    #[arg(long)]
    y_label: Option<String>,
}

pub(crate) fn run(args: &PlotArgs) -> Result<()> {
    super::plot::check_target(&args.output)?;
    let filters = args
        .filters
        .iter()
        .map(|f| f.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect::<Option<Vec<_>>>()
        .with_context(|| format!("--where takes FIELD=VALUE, got {:?}", args.filters))?;
    let mut records = Vec::new();
    for path in &args.results {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            if let Ok(Value::Object(r)) = serde_json::from_str::<Value>(line.trim()) {
                let run = r.get("run").map(text_of).unwrap_or_else(|| format!("{}:{}", path.display(), n + 1));
                records.push((run, r));
            }
        }
    }
    let title = args.title.clone().unwrap_or_else(|| {
        let names: Vec<String> = args.results.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
        names.join(", ")
    });
    let chart = chart(args, &filters, &records, title);
    if chart.series.is_empty() {
        let matching =
            if args.filters.is_empty() { String::new() } else { format!(" and passes --where {}", args.filters.join(" --where ")) };
        bail!(
            "nothing to plot: of {} JSON records in {}, none has numeric `{}` and `{}`{matching} (see --x, --y)",
            records.len(),
            args.results.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            args.x,
            args.y,
        );
    }
    chart.write_png(&args.output)?;
    eprintln!("chart written to {}", args.output.display());
    Ok(())
}

/// A field's value as text (strings without quotes).
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A numeric field (`default` when absent).
fn number(r: &Map<String, Value>, field: &str, default: Option<f64>) -> Option<f64> {
    r.get(field).and_then(Value::as_f64).or(default)
}

/// The x of a record (see the module docs).
fn x_of(r: &Map<String, Value>, x: &str) -> Option<f64> {
    let elements = || Some(number(r, "size", None)? * number(r, "keys", Some(1.0))?);
    match x {
        "elements" => elements(),
        "moved" => Some(elements()? * 4.0 * 2.0 * number(r, "devices", Some(1.0))?),
        field => number(r, field, None),
    }
}

/// One series' points: x (as bits, which order like positive numbers) → run id → the run's
/// largest y.
type RunsByX<'a> = BTreeMap<u64, BTreeMap<&'a str, f64>>;

/// Groups `records` (run id, record) into the chart's series and points.
fn chart(args: &PlotArgs, filters: &[(String, String)], records: &[(String, Map<String, Value>)], title: String) -> Chart {
    let x_label = args.x_label.clone().unwrap_or_else(|| match args.x.as_str() {
        "elements" => "elements per call (size × keys)".to_owned(),
        "moved" => "bytes moved per iteration (size × keys × 4 × 2 × devices)".to_owned(),
        other => other.to_owned(),
    });
    let y_label = args.y_label.clone().unwrap_or_else(|| match args.y.as_str() {
        "median_ms" => "median time (ms)".to_owned(),
        other => other.to_owned(),
    });
    let mut c = Chart::new(title, x_label, y_label);
    let mut points: Vec<(String, RunsByX)> = Vec::new();
    for (run, r) in records {
        if !filters.iter().all(|(k, v)| r.get(k).is_none_or(|got| text_of(got) == *v)) {
            continue;
        }
        let (Some(x), Some(y)) = (x_of(r, &args.x), number(r, &args.y, None)) else { continue };
        let name = args
            .series
            .iter()
            .filter_map(|f| {
                let v = text_of(r.get(f)?);
                Some(if f == "impl" { v } else { format!("{f}={v}") })
            })
            .collect::<Vec<_>>()
            .join(", ");
        let series = match points.iter().position(|(n, _)| *n == name) {
            Some(i) => &mut points[i].1,
            None => {
                points.push((name, BTreeMap::new()));
                &mut points.last_mut().expect("just pushed").1
            }
        };
        let slot = series.entry(x.to_bits()).or_default().entry(run.as_str()).or_insert(y);
        *slot = slot.max(y);
    }
    for (name, xs) in points {
        for (x, runs) in xs {
            let ys: Vec<f64> = runs.into_values().collect();
            let s = super::stats::Stats::of(&ys);
            c.add(&name, Point::spread(f64::from_bits(x), s.median_ms, s.min_ms, s.max_ms));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PlotArgs,
    }

    fn records(lines: &str) -> Vec<(String, Map<String, Value>)> {
        lines
            .lines()
            .enumerate()
            .filter_map(|(n, l)| match serde_json::from_str(l) {
                Ok(Value::Object(r)) => Some((r.get("run").map(text_of).unwrap_or_else(|| format!("line{n}")), r)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_jobs_workers_count_once_as_the_slowest_and_rounds_give_the_median() {
        let cli = Cli::try_parse_from(["plot", "r.jsonl", "-o", "x.png", "--where", "servers=1"]).unwrap();
        let recs = records(
            r#"{"impl":"loopback","gbps":4.6}
{"impl":"synkv","size":1048576,"keys":1,"servers":1,"median_ms":4.0,"run":"a-1"}
{"impl":"synkv","size":1048576,"keys":1,"servers":1,"median_ms":5.0,"run":"a-1"}
{"impl":"synkv","size":1048576,"keys":1,"servers":1,"median_ms":7.0,"run":"a-2"}
{"impl":"synkv","size":1048576,"keys":1,"servers":1,"median_ms":6.0,"run":"a-3"}
{"impl":"synkv","size":1048576,"keys":1,"servers":2,"median_ms":99.0,"run":"d-1"}
{"impl":"mxnet","size":10240,"keys":100,"servers":1,"median_ms":20.0,"run":"c-1"}
{"impl":"torch","size":16777216,"keys":1,"median_ms":44.0,"run":"b-torch-1"}
not json"#,
        );
        let filters = [("servers".to_owned(), "1".to_owned())];
        let c = chart(&cli.args, &filters, &recs, "t".into());
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["synkv", "mxnet", "torch"], "torch has no servers field, so it stays");
        // runs: a-1 → max(4, 5) = 5, a-2 → 7, a-3 → 6: median 6, whisker 5–7
        assert_eq!(c.series[0].points, [Point::spread(1_048_576.0, 6.0, 5.0, 7.0)]);
        assert_eq!(c.series[1].points, [Point::spread(1_024_000.0, 20.0, 20.0, 20.0)]);
    }

    #[test]
    fn series_fields_and_the_moved_axis() {
        let cli = Cli::try_parse_from(["plot", "r.jsonl", "-o", "x.png", "--x", "moved", "--series", "impl,updater"]).unwrap();
        let recs = records(
            r#"{"impl":"synkv","size":1024,"keys":1000,"devices":1,"updater":"assign","median_ms":0.5}
{"impl":"mxnet","size":16777216,"keys":1,"devices":2,"updater":"sgd","median_ms":15.0}"#,
        );
        let c = chart(&cli.args, &[], &recs, "t".into());
        assert_eq!(c.series[0].name, "synkv, updater=assign");
        assert_eq!(c.series[0].points[0].x, 1024.0 * 1000.0 * 8.0);
        assert_eq!(c.series[1].name, "mxnet, updater=sgd");
        assert_eq!(c.series[1].points[0].x, 16_777_216.0 * 8.0 * 2.0);
        assert!(c.x_label.starts_with("bytes moved"), "{}", c.x_label);
    }

    #[test]
    fn writes_the_chart_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("r.jsonl");
        std::fs::write(
            &results,
            "{\"impl\":\"synkv\",\"size\":1024,\"median_ms\":0.5}\n{\"impl\":\"synkv\",\"size\":4096,\"median_ms\":1.5}\n",
        )
        .unwrap();
        let out = dir.path().join("r.png");
        let (r, o) = (results.to_str().unwrap(), out.to_str().unwrap());
        if !super::super::plot::tests::font_or_skip("writes_the_chart_or_says_why_not") {
            return;
        }
        let cli = Cli::try_parse_from(["plot", r, "-o", o, "--where", "impl=mxnet"]).unwrap();
        let e = run(&cli.args).unwrap_err().to_string();
        assert!(e.contains("nothing to plot"), "{e}");
        let cli = Cli::try_parse_from(["plot", r, "-o", o]).unwrap();
        run(&cli.args).unwrap();
        let size = super::super::plot::tests::png_size(&std::fs::read(&out).unwrap());
        assert_eq!(size, (super::super::plot::WIDTH, super::super::plot::HEIGHT));
    }
}
