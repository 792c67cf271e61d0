//! The line classifier and the judge over arbitrary bytes: never a panic, whatever the input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use vigil_core::{Classifier, Fact, Input, Judge, JudgeConfig, Profiles};

fn profiles() -> &'static Profiles {
    static P: OnceLock<Profiles> = OnceLock::new();
    P.get_or_init(Profiles::builtin)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let p = profiles();
    let forced = match data.first() {
        Some(b) if b % 5 == 0 => None,
        Some(b) => Some(["sglang", "vllm", "llama-cpp", "tgi"][(*b % 4) as usize]),
        None => None,
    };
    let mut c = Classifier::new(p, forced);
    let mut j = Judge::new(JudgeConfig { live: true, stall_enabled: true, ..JudgeConfig::default() });
    for (i, line) in text.split(['\n', '\r']).enumerate() {
        let l = c.classify(line);
        j.feed(Fact { at: Some(i as u64 * 7), input: Input::Line(Box::new(l)) });
    }
    j.feed(Fact { at: None, input: Input::Eof });
    let _ = j.final_report();
    let _ = vigil_core::diagnose_text(p, forced, &text);
});
