//! Replays the saved fuzzing corpora (fuzz/corpus/*) as ordinary tests: CI runs these, not the fuzzer.
//! Crashes found by fuzzing are kept in fuzz/regressions/ and replayed here too.

use std::path::PathBuf;
use vigil_core::time::TsFormat;
use vigil_core::{Classifier, Fact, Input, Judge, JudgeConfig, Profiles};

fn files(sub: &str) -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut v = Vec::new();
    for d in [root.join("corpus").join(sub), root.join("regressions").join(sub)] {
        if let Ok(rd) = std::fs::read_dir(&d) {
            v.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_file()));
        }
    }
    v.sort();
    v
}

#[test]
fn classify_corpus_never_panics() {
    let p = Profiles::builtin();
    let fs = files("classify");
    assert!(!fs.is_empty(), "no classify corpus");
    for f in fs {
        let data = std::fs::read(&f).unwrap();
        let text = String::from_utf8_lossy(&data);
        let forced = match data.first() {
            Some(b) if b % 5 == 0 => None,
            Some(b) => Some(["sglang", "vllm", "llama-cpp", "tgi"][(*b % 4) as usize]),
            None => None,
        };
        let mut c = Classifier::new(&p, forced);
        let mut j = Judge::new(JudgeConfig { live: true, stall_enabled: true, ..JudgeConfig::default() });
        for (i, line) in text.split(['\n', '\r']).enumerate() {
            j.feed(Fact { at: Some(i as u64 * 7), input: Input::Line(Box::new(c.classify(line))) });
        }
        j.feed(Fact { at: None, input: Input::Eof });
        let _ = j.final_report();
    }
}

#[test]
fn timestamp_corpus_never_panics_and_is_stable() {
    let fs = files("timestamps");
    assert!(!fs.is_empty(), "no timestamps corpus");
    for f in fs {
        let s = String::from_utf8_lossy(&std::fs::read(&f).unwrap()).into_owned();
        for fmt in [TsFormat::YmdHms, TsFormat::MdHms, TsFormat::LlamaRel, TsFormat::Rfc3339] {
            let a = fmt.parse(&s);
            assert_eq!(a, fmt.parse(&s), "{}", f.display());
        }
    }
}
