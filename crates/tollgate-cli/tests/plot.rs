//! `tollgate simulate --plot`: the replay drawn as SVG and PNG, and several
//! limits replayed over one trace side by side.

mod common;

use std::path::Path;
use std::process::Output;

use common::simulate_with;

const GCRA: &str = r#"{"algorithm":"gcra","rate":1,"period":"1s","burst":2}"#;
const WINDOW: &str = r#"{"algorithm":"fixed_window","limit":3,"window":"1s"}"#;
const POLICY: &str = r#"{"short":{"algorithm":"fixed_window","limit":2,"window":"1s"},
                         "long":{"algorithm":"sliding_log","limit":4,"window":"10s"}}"#;

/// Three requests at once, then one a second later, for keys a and b.
const TRACE: &str = "{\"t_ms\":0,\"key\":\"a\"}\n{\"t_ms\":0,\"key\":\"a\"}\n{\"t_ms\":0,\"key\":\"a\"}\n\
                     {\"t_ms\":500,\"key\":\"b\"}\n{\"t_ms\":1000,\"key\":\"a\"}\n";

fn succeeded(output: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}: {stderr}", output.status);
    assert_eq!(stderr, "");
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The PNG at `path` decoded: `(width, height, RGB pixels)`.
fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG signature");
    let mut reader = png::Decoder::new(bytes.as_slice()).read_info().expect("a PNG header");
    let mut buffer = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buffer).expect("PNG data that decodes");
    assert_eq!(frame.color_type, png::ColorType::Rgb, "{frame:?}");
    let pixels = buffer[..frame.buffer_size()]
        .chunks_exact(3)
        .map(|pixel| [pixel[0], pixel[1], pixel[2]])
        .collect();
    (frame.width, frame.height, pixels)
}

#[test]
fn svg_and_png_draw_each_limit_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let (svg, png) = (dir.path().join("replay.svg"), dir.path().join("replay.PNG"));
    for file in [&svg, &png] {
        let output = simulate_with(GCRA, &["--limit", WINDOW, "--plot", file.to_str().unwrap()], TRACE);
        // Standard output is unchanged by --plot: one array of answers per step.
        let answers = succeeded(&output);
        assert_eq!(answers.len(), 5);
        let third: serde_json::Value = serde_json::from_str(&answers[2]).unwrap();
        assert_eq!(third[0]["allowed"], false, "gcra: burst of 2");
        assert_eq!(third[1]["allowed"], true, "fixed window: 3 a second");
    }

    let text = std::fs::read_to_string(&svg).unwrap();
    let document = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = document
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .filter_map(|node| node.text())
        .map(str::trim)
        .collect();
    for title in [
        "gcra rate=1 period=1s burst=2: 4 admitted, 1 denied",
        "fixed_window limit=3 window=1s: 5 admitted, 0 denied",
        "remaining",
        "admitted",
        "denied",
        "time since --start (ms)",
    ] {
        assert!(texts.contains(&title), "no {title:?} in {texts:?}");
    }

    let (width, height, pixels) = decode_png(&png);
    assert_eq!((width, height), (1000, 2 * 320), "one panel per limit");
    assert!(green(&pixels) > 0, "admissions are drawn in green");
    assert!(red(&pixels) > 0, "denials are drawn in red");
}

fn red(pixels: &[[u8; 3]]) -> usize {
    pixels.iter().filter(|[r, g, b]| *r > 200 && *g < 60 && *b < 60).count()
}

fn green(pixels: &[[u8; 3]]) -> usize {
    pixels
        .iter()
        .filter(|[r, g, b]| *r < 60 && *g > 120 && *b < 120)
        .count()
}

#[test]
fn denials_add_red_and_an_empty_trace_still_draws() {
    let dir = tempfile::tempdir().unwrap();
    let draw = |limit: &str, trace: &str, name: &str| {
        let file = dir.path().join(name);
        succeeded(&simulate_with(limit, &["--plot", file.to_str().unwrap()], trace));
        let (width, height, pixels) = decode_png(&file);
        assert_eq!((width, height), (1000, 320));
        pixels
    };
    // The legend alone has some red: a denial adds more.
    let (denied_once, never_denied) = (draw(GCRA, TRACE, "gcra.png"), draw(WINDOW, TRACE, "window.png"));
    assert!(red(&denied_once) > red(&never_denied));
    assert!(green(&never_denied) > 0);
    let empty = draw(WINDOW, "", "empty.png");
    assert_eq!(red(&empty), red(&never_denied), "only the legend is red");
}

#[test]
fn a_policy_gets_a_panel_per_named_limit() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("policy.svg");
    succeeded(&simulate_with(POLICY, &["--plot", svg.to_str().unwrap()], TRACE));
    let text = std::fs::read_to_string(&svg).unwrap();
    roxmltree::Document::parse(&text).expect("well-formed XML");
    assert!(text.contains("short: fixed_window limit=2 window=1s (of a policy, all-or-nothing): 4 admitted, 1 denied"));
    assert!(text.contains("long: sliding_log limit=4 window=10s (of a policy, all-or-nothing): 4 admitted, 1 denied"));
}

#[test]
fn several_limits_answer_with_arrays_and_tables() {
    let output = simulate_with(GCRA, &["--limit", WINDOW, "--format", "table"], TRACE);
    let rows = succeeded(&output);
    assert_eq!(rows.len(), 1 + 2 * 5, "a header, then a row per limit and step");
    assert!(rows[1].ends_with("limit 1"), "{}", rows[1]);
    assert!(rows[2].ends_with("limit 2"), "{}", rows[2]);
    assert!(rows[5].contains(" no "), "{}", rows[5]);

    // An invalid step is answered by each limit, and the replay goes on.
    let trace = "{\"t_ms\":0,\"op\":\"reserve\"}\nnot json\n{\"t_ms\":0}\n";
    let answers = succeeded(&simulate_with(GCRA, &["--limit", WINDOW], trace));
    assert!(answers[0].starts_with(r#"[{"error":"reserve needs"#), "{}", answers[0]);
    assert!(answers[1].starts_with(r#"[{"error":"invalid JSON"#), "{}", answers[1]);
    assert!(answers[2].starts_with(r#"[{"allowed":true"#), "{}", answers[2]);
}

#[test]
fn an_invalid_limit_among_several_is_named() {
    let output = simulate_with(
        GCRA,
        &["--limit", r#"{"algorithm":"gcra","rate":1,"period":"1s","burst":0}"#],
        "",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: invalid --limit (the 2.): "), "{stderr}");
    assert!(stderr.contains("burst"), "{stderr}");
}

#[test]
fn bad_plot_files_are_refused() {
    let output = simulate_with(GCRA, &["--plot", "replay.jpg"], TRACE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--plot: \"replay.jpg\" must end in .svg or .png"),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "", "refused before the replay");

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/replay.png");
    let output = simulate_with(GCRA, &["--plot", missing.to_str().unwrap()], TRACE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--plot: no directory"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "", "refused before the replay");
}
