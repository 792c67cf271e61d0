//! `vigil timeline NAME|LOG [--svg FILE]`: the startup as a picture. One lane per rank (and the draft),
//! a bar per phase, the history's median as a ghost bar behind it, the verdict and where it happened;
//! the lagging rank labelled and coloured. A compact Unicode rendering on a terminal; a standalone SVG
//! (no scripts, no external fonts or images) for a browser or a bug report. The command that reads the log
//! and the history's medians is `commands::timeline`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use vigil_core::judge::fmt_ms;
use vigil_core::{Phase, Report, Verdict};

/// A rank's phase entries (phase, entered at ms), as the judge gives them.
type RankTimes = Vec<(Phase, Option<u64>)>;

/// One lane: a rank's phases as (phase, start ms, end ms), and the stretches where the rank had finished
/// a phase (its last line in it) and waited for the others until the next phase began.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    pub name: String,
    pub bars: Vec<(Phase, u64, u64)>,
    pub waits: Vec<(u64, u64)>,
}

/// Per rank, the time of its last line in each phase (`Judge::rank_last_lines`).
pub type LastLines = BTreeMap<String, BTreeMap<Phase, u64>>;

/// What is drawn.
#[derive(Debug, Clone)]
pub struct Picture {
    pub title: String,
    pub lanes: Vec<Lane>,
    /// The lane that is behind (fewest phases reached, else reached its last phase last).
    pub lagging: Option<usize>,
    pub verdict: Verdict,
    pub verdict_phase: Phase,
    pub end_ms: u64,
    /// Phase → the history's median (ms), drawn as ghost bars.
    pub medians: BTreeMap<Phase, u64>,
    /// The current phase's progress, e.g. "12/52".
    pub progress: Option<String>,
}

/// Natural order of rank names: `TP2` before `TP10`, `DP1 TP0` before `DP1 TP1`.
fn natural_key(s: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
        } else {
            if !num.is_empty() {
                out.push((std::mem::take(&mut text), num.parse().unwrap_or(0)));
                num.clear();
            }
            text.push(c);
        }
    }
    out.push((text, num.parse().unwrap_or(0)));
    out
}

/// The lane behind: the one that reached fewest phases; else the one that entered some phase latest
/// after the first rank did, by a clear margin (1 % of the startup and at least 1 s) and at least twice
/// as late as any other; else the one that finished some phase latest (its last line in it, the others
/// waiting for it), by the same margin and at least 10 % later than any other. None when no single lane
/// stands out.
fn lagging(lanes: &[Lane], end: u64, finished: &[BTreeMap<Phase, u64>]) -> Option<usize> {
    if lanes.len() < 2 {
        return None;
    }
    let most = lanes.iter().map(|l| l.bars.len()).max().unwrap_or(0);
    let behind: Vec<usize> = (0..lanes.len()).filter(|i| lanes[*i].bars.len() < most).collect();
    if behind.len() == 1 {
        return Some(behind[0]);
    }
    if !behind.is_empty() {
        return None;
    }
    let margin = (end / 100).max(1000);
    let first: BTreeMap<Phase, u64> = lanes.iter().flat_map(|l| l.bars.iter()).fold(BTreeMap::new(), |mut m, b| {
        let e = m.entry(b.0).or_insert(b.1);
        *e = (*e).min(b.1);
        m
    });
    let late: Vec<u64> = lanes.iter().map(|l| l.bars.iter().map(|b| b.1 - first[&b.0]).max().unwrap_or(0)).collect();
    let (i, worst) = late.iter().copied().enumerate().max_by_key(|x| x.1)?;
    let second = late.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, v)| *v).max().unwrap_or(0);
    if worst > margin && worst >= 2 * second {
        return Some(i);
    }
    // finished latest: per phase, how long after the first rank to finish it each rank did
    let earliest: BTreeMap<Phase, u64> =
        finished.iter().flat_map(|f| f.iter()).fold(BTreeMap::new(), |mut m, (p, t)| {
            let e = m.entry(*p).or_insert(*t);
            *e = (*e).min(*t);
            m
        });
    let late: Vec<u64> = finished.iter().map(|f| f.iter().map(|(p, t)| t - earliest[p]).max().unwrap_or(0)).collect();
    let (i, worst) = late.iter().copied().enumerate().max_by_key(|x| x.1)?;
    let second = late.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, v)| *v).max().unwrap_or(0);
    (worst > margin && worst * 10 >= second * 11 && worst > second).then_some(i)
}

impl Picture {
    pub fn new(
        title: String,
        report: &Report,
        ranks: &BTreeMap<String, Vec<(Phase, Option<u64>)>>,
        last_lines: &LastLines,
        medians: BTreeMap<Phase, u64>,
    ) -> Picture {
        let end = report.elapsed_ms.unwrap_or(0);
        let tagged: Vec<(&String, &RankTimes)> =
            ranks.iter().filter(|(k, _)| !k.is_empty() || ranks.len() == 1).collect();
        let mut lanes: Vec<(Lane, BTreeMap<Phase, u64>)> = tagged
            .iter()
            .map(|(name, tl)| {
                let timed: Vec<(Phase, u64)> = tl.iter().filter_map(|(p, at)| at.map(|a| (*p, a))).collect();
                let bars: Vec<(Phase, u64, u64)> = timed
                    .iter()
                    .enumerate()
                    .filter(|(_, (p, _))| *p != Phase::Serving)
                    .map(|(i, (p, a))| (*p, *a, timed.get(i + 1).map_or(end, |n| n.1).max(*a)))
                    .collect();
                // a finished phase whose last line came clearly before the next phase began: waiting
                let last = last_lines.get(*name);
                let mut finished = BTreeMap::new();
                let mut waits = Vec::new();
                for (k, (p, a, b)) in bars.iter().enumerate() {
                    let (Some(t), true) = (last.and_then(|l| l.get(p)).copied(), k + 1 < bars.len()) else { continue };
                    let done = t.clamp(*a, *b);
                    finished.insert(*p, done);
                    if b - done > (end / 100).max(1000) {
                        waits.push((done, *b));
                    }
                }
                let name = if name.is_empty() { "server".into() } else { (*name).clone() };
                (Lane { name, bars, waits }, finished)
            })
            .collect::<Vec<_>>();
        lanes.sort_by_key(|l| natural_key(&l.0.name));
        let (lanes, finished): (Vec<Lane>, Vec<BTreeMap<Phase, u64>>) = lanes.into_iter().unzip();
        let lagging = lagging(&lanes, end, &finished);
        Picture {
            title,
            lanes,
            lagging,
            verdict: report.verdict,
            verdict_phase: report.phase,
            end_ms: end,
            medians,
            progress: report.progress.as_ref().map(|p| format!("{}/{}", p.k, p.n)),
        }
    }

    fn span(&self) -> u64 {
        let ghost = self
            .lanes
            .iter()
            .flat_map(|l| l.bars.iter().map(|(p, a, _)| a + self.medians.get(p).copied().unwrap_or(0)))
            .max()
            .unwrap_or(0);
        self.end_ms.max(ghost).max(1)
    }
}

fn color(p: Phase) -> &'static str {
    match p {
        Phase::Launch => "#9e9e9e",
        Phase::DistInit => "#8c564b",
        Phase::Weights => "#1f77b4",
        Phase::DraftWeights => "#6baed6",
        Phase::KvCache => "#2ca02c",
        Phase::Compile => "#9467bd",
        Phase::CudaGraphs => "#ff7f0e",
        Phase::DraftCudaGraphs => "#fdae6b",
        Phase::Http => "#17becf",
        Phase::Warmup => "#bcbd22",
        Phase::Serving => "#2ca02c",
    }
}

const LAG: &str = "#d62728";

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The standalone SVG.
pub fn svg(p: &Picture) -> String {
    const W: f64 = 960.0;
    const LEFT: f64 = 150.0;
    const RIGHT: f64 = 30.0;
    const TOP: f64 = 48.0;
    const LANE: f64 = 24.0;
    const GAP: f64 = 6.0;
    let plot = W - LEFT - RIGHT;
    let span = p.span() as f64;
    let x = |ms: u64| LEFT + plot * ms as f64 / span;
    let h = TOP + p.lanes.len() as f64 * (LANE + GAP) + 70.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="DejaVu Sans, Arial, Helvetica, sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let verdict_color = match p.verdict {
        Verdict::Ready => "#2ca02c",
        Verdict::Starting => "#ff7f0e",
        _ => LAG,
    };
    let _ = writeln!(
        o,
        r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text><text x="10" y="38" fill="{verdict_color}">{} in {} after {}{}</text>"#,
        xml(&p.title),
        p.verdict,
        p.verdict_phase,
        fmt_ms(p.end_ms),
        if p.medians.is_empty() { String::new() } else { " · ghost bars: history median".into() }
    );
    for (i, lane) in p.lanes.iter().enumerate() {
        let y = TOP + i as f64 * (LANE + GAP);
        let lag = p.lagging == Some(i);
        if lag {
            let _ = writeln!(
                o,
                r#"<rect x="0" y="{:.1}" width="{W}" height="{:.1}" fill="{LAG}" fill-opacity="0.08"/>"#,
                y - GAP / 2.0,
                LANE + GAP
            );
        }
        let label = if lag { format!("{} (lagging)", lane.name) } else { lane.name.clone() };
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end"{}>{}</text>"#,
            LEFT - 8.0,
            y + LANE * 0.68,
            if lag { format!(r#" fill="{LAG}" font-weight="bold""#) } else { String::new() },
            xml(&label)
        );
        for (ph, a, b) in &lane.bars {
            if let Some(m) = p.medians.get(ph) {
                let _ = writeln!(
                    o,
                    r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#000000" fill-opacity="0.10" stroke="#555555" stroke-dasharray="3,2" stroke-width="0.8"><title>{ph}: median {}</title></rect>"##,
                    x(*a),
                    y + 1.0,
                    (x(a + m) - x(*a)).max(1.0),
                    LANE - 2.0,
                    fmt_ms(*m)
                );
            }
            let w = (x(*b) - x(*a)).max(1.0);
            let stroke = if lag { format!(r#" stroke="{LAG}" stroke-width="1.5""#) } else { String::new() };
            let _ = writeln!(
                o,
                r#"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{}" fill-opacity="0.85"{stroke}><title>{ph}: {}</title></rect>"#,
                x(*a),
                y + 4.0,
                LANE - 8.0,
                color(*ph),
                fmt_ms(b - a)
            );
            for (wa, wb) in lane.waits.iter().filter(|(wa, wb)| wa >= a && wb <= b) {
                let _ = writeln!(
                    o,
                    r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#ffffff" fill-opacity="0.65"><title>{ph} done, waiting {} for the other ranks</title></rect>"##,
                    x(*wa),
                    y + 4.0,
                    (x(*wb) - x(*wa)).max(1.0),
                    LANE - 8.0,
                    fmt_ms(wb - wa)
                );
            }
            let mut text = ph.to_string();
            if *ph == p.verdict_phase && *b == p.end_ms {
                if let Some(pr) = &p.progress {
                    text = format!("{text} {pr}");
                }
            }
            if w > 7.0 * text.len() as f64 {
                let _ = writeln!(
                    o,
                    r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#ffffff">{}</text>"##,
                    x(*a) + 3.0,
                    y + LANE * 0.64,
                    xml(&text)
                );
            }
        }
    }
    // the verdict: where and when
    let vx = x(p.end_ms);
    let bottom = TOP + p.lanes.len() as f64 * (LANE + GAP);
    let _ = writeln!(
        o,
        r#"<line x1="{vx:.1}" y1="{:.1}" x2="{vx:.1}" y2="{bottom:.1}" stroke="{verdict_color}" stroke-width="2"/><text x="{:.1}" y="{:.1}" fill="{verdict_color}" font-weight="bold" text-anchor="end">{}</text>"#,
        TOP - 6.0,
        vx - 3.0,
        TOP - 8.0,
        p.verdict
    );
    // axis
    let _ = writeln!(
        o,
        r##"<line x1="{LEFT}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333333"/>"##,
        W - RIGHT
    );
    for i in 0..=5 {
        let t = p.span() * i / 5;
        let _ = writeln!(
            o,
            r##"<line x1="{0:.1}" y1="{bottom:.1}" x2="{0:.1}" y2="{1:.1}" stroke="#333333"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle" font-size="10">{3}</text>"##,
            x(t),
            bottom + 4.0,
            bottom + 16.0,
            fmt_ms(t)
        );
    }
    // legend
    let mut lx = LEFT;
    let mut seen: Vec<Phase> = p.lanes.iter().flat_map(|l| l.bars.iter().map(|b| b.0)).collect();
    seen.sort();
    seen.dedup();
    for ph in seen {
        let _ = writeln!(
            o,
            r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="10">{ph}</text>"#,
            bottom + 28.0,
            color(ph),
            lx + 13.0,
            bottom + 37.0
        );
        lx += 22.0 + 6.5 * ph.as_str().len() as f64;
    }
    if p.lanes.iter().any(|l| !l.waits.is_empty()) {
        let _ = writeln!(
            o,
            r##"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="#1f77b4" fill-opacity="0.3"/><text x="{:.1}" y="{:.1}" font-size="10">phase done, waiting for the other ranks</text>"##,
            bottom + 28.0,
            lx + 13.0,
            bottom + 37.0
        );
    }
    o.push_str("</svg>\n");
    o
}

/// The compact rendering for a terminal: one row per lane, one character cell per slice of time.
pub fn text(p: &Picture, width: usize, color_on: bool) -> Vec<String> {
    let label_w = p.lanes.iter().map(|l| l.name.chars().count()).max().unwrap_or(6).max(6) + 2;
    let cells = width.saturating_sub(label_w + 14).clamp(20, 120);
    let span = p.span();
    let cell = |ms: u64| ((ms as u128 * cells as u128) / span as u128) as usize;
    let mut out = vec![format!("{} — {} in {} after {}", p.title, p.verdict, p.verdict_phase, fmt_ms(p.end_ms))];
    for (i, lane) in p.lanes.iter().enumerate() {
        let mut row: Vec<(char, Option<Phase>)> = vec![(' ', None); cells];
        for (ph, a, b) in &lane.bars {
            if let Some(m) = p.medians.get(ph) {
                for c in row.iter_mut().take(cell(a + m).min(cells)).skip(cell(*a)) {
                    if c.1.is_none() {
                        *c = ('░', None);
                    }
                }
            }
            let (s, e) = (cell(*a), cell(*b).max(cell(*a) + 1).min(cells));
            for c in row.iter_mut().take(e).skip(s) {
                *c = ('█', Some(*ph));
            }
            for (wa, wb) in lane.waits.iter().filter(|(wa, wb)| wa >= a && wb <= b) {
                for c in row.iter_mut().take(cell(*wb).min(cells)).skip(cell(*wa) + 1) {
                    *c = ('·', None);
                }
            }
        }
        let mut s = String::new();
        for (ch, ph) in row {
            match (ph, color_on) {
                (Some(ph), true) => {
                    let _ = write!(s, "\x1b[38;5;{}m{ch}\x1b[0m", ansi(ph));
                }
                (Some(ph), false) => s.push(letter(ph)),
                (None, _) => s.push(ch),
            }
        }
        let lag = p.lagging == Some(i);
        let label = format!("{:>w$}", lane.name, w = label_w);
        let label = if lag && color_on { format!("\x1b[1;31m{label}\x1b[0m") } else { label };
        out.push(format!("{label} {s}{}", if lag { " ◀ lagging" } else { "" }));
    }
    let mut legend: Vec<Phase> = p.lanes.iter().flat_map(|l| l.bars.iter().map(|b| b.0)).collect();
    legend.sort();
    legend.dedup();
    let items: Vec<String> = legend
        .iter()
        .map(|ph| {
            if color_on {
                format!("\x1b[38;5;{}m█\x1b[0m {ph}", ansi(*ph))
            } else {
                format!("{} {ph}", letter(*ph))
            }
        })
        .collect();
    out.push(format!(
        "{:>w$} {}{}  (0 → {})",
        "",
        items.join("  "),
        if p.medians.is_empty() { "" } else { "  ░ history median" },
        fmt_ms(span),
        w = label_w
    ));
    out
}

fn letter(p: Phase) -> char {
    match p {
        Phase::Launch => 'l',
        Phase::DistInit => 'n',
        Phase::Weights => 'w',
        Phase::DraftWeights => 'W',
        Phase::KvCache => 'k',
        Phase::Compile => 'c',
        Phase::CudaGraphs => 'g',
        Phase::DraftCudaGraphs => 'G',
        Phase::Http => 'h',
        Phase::Warmup => 'u',
        Phase::Serving => 's',
    }
}

fn ansi(p: Phase) -> u8 {
    match p {
        Phase::Launch => 245,
        Phase::DistInit => 130,
        Phase::Weights => 33,
        Phase::DraftWeights => 75,
        Phase::KvCache => 34,
        Phase::Compile => 97,
        Phase::CudaGraphs => 208,
        Phase::DraftCudaGraphs => 215,
        Phase::Http => 44,
        Phase::Warmup => 142,
        Phase::Serving => 34,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(end: u64) -> Report {
        let mut r = vigil_core::diagnose_text(&vigil_core::Profiles::builtin(), None, "");
        r.elapsed_ms = Some(end);
        r.verdict = Verdict::Stalled;
        r.phase = Phase::CudaGraphs;
        r
    }

    #[test]
    fn the_rank_behind_is_the_lagging_one_and_ranks_sort_naturally() {
        let mut ranks = BTreeMap::new();
        for i in 0..10 {
            let mut tl = vec![(Phase::Weights, Some(0)), (Phase::CudaGraphs, Some(10_000))];
            if i == 7 {
                tl.pop();
            }
            ranks.insert(format!("TP{i}"), tl);
        }
        let p = Picture::new("t".into(), &report(20_000), &ranks, &LastLines::new(), BTreeMap::new());
        assert_eq!(p.lanes[2].name, "TP2");
        assert_eq!(p.lanes[9].name, "TP9");
        assert_eq!(p.lagging.map(|i| p.lanes[i].name.as_str()), Some("TP7"));
        let s = svg(&p);
        assert!(s.contains("TP7 (lagging)"));
        let t = text(&p, 100, false);
        assert!(t.iter().any(|l| l.contains("TP7") && l.ends_with("◀ lagging")), "{t:?}");
    }

    #[test]
    fn the_last_to_finish_a_phase_lags_when_all_entered_the_next_together() {
        // SGLang: every rank enters the KV-cache phase together (they wait for the slowest loader)
        let mut ranks = BTreeMap::new();
        let mut last = LastLines::new();
        for i in 0..8 {
            ranks.insert(format!("TP{i}"), vec![(Phase::Weights, Some(0)), (Phase::KvCache, Some(900_000))]);
            let done = match i {
                7 => 895_000,
                0 => 778_000,
                _ => 230_000 + i as u64 * 1000,
            };
            last.insert(format!("TP{i}"), BTreeMap::from([(Phase::Weights, done)]));
        }
        let p = Picture::new("t".into(), &report(901_000), &ranks, &last, BTreeMap::new());
        assert_eq!(p.lagging.map(|i| p.lanes[i].name.as_str()), Some("TP7"));
        assert_eq!(p.lanes[1].waits, vec![(231_000, 900_000)], "TP1 waited for the others");
        assert!(p.lanes[7].waits.is_empty(), "TP7 is the one they waited for");
        // two equally slow ranks: none stands out
        last.get_mut("TP0").unwrap().insert(Phase::Weights, 880_000);
        let p = Picture::new("t".into(), &report(901_000), &ranks, &last, BTreeMap::new());
        assert_eq!(p.lagging, None);
    }

    #[test]
    fn the_last_to_reach_its_phase_lags_when_all_reached_it() {
        let mut ranks = BTreeMap::new();
        for i in 0..8 {
            let at = if i == 3 { 300_000 } else { 100_000 };
            ranks.insert(format!("TP{i}"), vec![(Phase::Weights, Some(0)), (Phase::CudaGraphs, Some(at))]);
        }
        let p = Picture::new("t".into(), &report(400_000), &ranks, &LastLines::new(), BTreeMap::new());
        assert_eq!(p.lagging.map(|i| p.lanes[i].name.as_str()), Some("TP3"));
    }
}
