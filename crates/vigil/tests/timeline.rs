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

/// Renders `vigil timeline LOG --svg` with resvg; the lanes' labels and the rasterised picture.
fn render(log: &std::path::Path) -> (Vec<String>, resvg::tiny_skia::Pixmap) {
    let d = TempDir::new("timeline");
    let svg = d.path("t.svg");
    let mut c = vigil();
    c.env("VIGIL_STATE_DIR", &d.0).env_remove("VIGIL_HISTORY");
    c.args(["timeline"]).arg(log).arg("--svg").arg(&svg);
    let o = run_bounded(c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let data = std::fs::read(&svg).unwrap();
    let mut opt = resvg::usvg::Options::default();
    opt.fontdb_mut().load_system_fonts();
    let tree = resvg::usvg::Tree::from_data(&data, &opt).expect("a valid SVG");
    let mut all = Vec::new();
    texts(tree.root(), &mut all);
    let size = tree.size().to_int_size();
    let mut px = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut px.as_mut());
    (all, px)
}

/// The lagging lane's label is painted in the lagging red (#d62728): looked for in the label column (left of
/// the plot, where no phase bar or verdict line is drawn), in that lane's row.
fn row_is_red(px: &resvg::tiny_skia::Pixmap, lane: u32) -> bool {
    let reddish = |c: resvg::tiny_skia::ColorU8| c.red() > 150 && c.green() < 120 && c.blue() < 120;
    let y = 48 + lane * 30 + 16; // TOP + i × (LANE + GAP) + the label's baseline area
    (0..150).map(|x| px.pixel(x, y).unwrap().demultiply()).any(reddish)
}

/// A real 8-rank log from the corpus (GLM-5-FP8 on 8 GPUs, published notes): every rank enters the KV-cache
/// phase together, but six finished loading their weights ~230 s in and waited; TP0 at 778 s, TP7 at 887 s.
/// TP7 is the lagging rank, labelled and painted; the picture is the committed example in docs/.
#[test]
fn timeline_svg_of_a_real_eight_rank_corpus_log_labels_the_lagging_rank() {
    let log = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../corpus/sglang/sglang-amd-notes-glm5-fp8-tp8-rank7-lags-in-weights.log");
    let (all, px) = render(&log);
    for r in 0..8 {
        let want = if r == 7 { "TP7 (lagging)".to_string() } else { format!("TP{r}") };
        assert!(all.contains(&want), "label {want} missing from {all:?}");
    }
    assert_eq!(all.iter().filter(|t| t.ends_with("(lagging)")).count(), 1, "{all:?}");
    assert!(row_is_red(&px, 7), "TP7's row has no lagging colour");
    assert!(!row_is_red(&px, 2), "TP2's row is painted as lagging");
    if let Some(p) = std::env::var_os("VIGIL_TIMELINE_PNG") {
        // writes the example for docs/ (docs/timeline-example.png)
        px.save_png(p).unwrap();
    }
}

/// The same on a fixture composed from SGLang's TP8 line formats (corpus sglang-3254, sglang-4161) where
/// one rank enters every phase late, rather than finishing one late.
#[test]
fn timeline_svg_of_eight_ranks_renders_with_the_lagging_rank_labelled() {
    let (all, px) = render(&fixture());
    for r in 0..8 {
        let want = if r == 5 { "TP5 (lagging)".to_string() } else { format!("TP{r}") };
        assert!(all.contains(&want), "label {want} missing from {all:?}");
    }
    assert_eq!(all.iter().filter(|t| t.ends_with("(lagging)")).count(), 1, "{all:?}");
    assert!(row_is_red(&px, 5), "TP5's row has no lagging colour");
    assert!(!row_is_red(&px, 2), "TP2's row is painted as lagging");
}
