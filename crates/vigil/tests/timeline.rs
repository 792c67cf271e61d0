//! `vigil timeline --svg` rendered for real: the SVG of an 8-rank SGLang log with one lagging rank is
//! parsed and rasterised by resvg (a real SVG renderer, as a browser would), and the lagging rank's label
//! is in the rendered document and painted in the lagging colour.

mod common;
use common::*;
use std::path::PathBuf;
use std::time::Duration;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sglang-tp8-one-lagging.log")
}

fn texts(g: &resvg::usvg::Group, out: &mut Vec<String>) {
    for n in g.children() {
        match n {
            resvg::usvg::Node::Group(g) => texts(g, out),
            resvg::usvg::Node::Text(t) => out.push(t.chunks().iter().map(|c| c.text()).collect()),
            _ => {}
        }
    }
}

#[test]
fn timeline_svg_of_eight_ranks_renders_with_the_lagging_rank_labelled() {
    let d = TempDir::new("timeline");
    let svg = d.path("t.svg");
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).env_remove("VIGIL_HISTORY");
    c.args(["timeline"]).arg(fixture()).arg("--svg").arg(&svg);
    let o = run_bounded(c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let data = std::fs::read(&svg).unwrap();
    let mut opt = resvg::usvg::Options::default();
    opt.fontdb_mut().load_system_fonts();
    let tree = resvg::usvg::Tree::from_data(&data, &opt).expect("a valid SVG");
    let mut all = Vec::new();
    texts(tree.root(), &mut all);
    for r in 0..8 {
        let want = if r == 5 { "TP5 (lagging)".to_string() } else { format!("TP{r}") };
        assert!(all.contains(&want), "label {want} missing from {all:?}");
    }
    assert_eq!(all.iter().filter(|t| t.ends_with("(lagging)")).count(), 1, "{all:?}");
    let size = tree.size().to_int_size();
    let mut px = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut px.as_mut());
    // the lagging lane is painted: its label's red (#d62728) or its tinted band appear, in TP5's row only
    let px = &px;
    let reddish = |c: resvg::tiny_skia::ColorU8| c.red() > 150 && c.green() < 120 && c.blue() < 120;
    let row = |y: u32| (0..size.width()).map(|x| px.pixel(x, y).unwrap().demultiply()).any(reddish);
    let lane_y = |i: u32| 48 + i * 30 + 16; // TOP + i × (LANE + GAP) + the label's baseline area
    assert!(row(lane_y(5)), "TP5's row has no lagging colour");
    assert!(!row(lane_y(2)), "TP2's row is painted as lagging");
    if let Some(p) = std::env::var_os("VIGIL_TIMELINE_PNG") {
        // writes the example for docs/ (docs/timeline-example.png)
        px.save_png(p).unwrap();
    }
}
