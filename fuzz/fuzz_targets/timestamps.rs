//! The timestamp parsers over arbitrary text: never a panic; a parsed stamp re-parses the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vigil_core::time::TsFormat;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    for f in [TsFormat::YmdHms, TsFormat::MdHms, TsFormat::LlamaRel, TsFormat::Rfc3339] {
        if let Some(v) = f.parse(&s) {
            assert_eq!(f.parse(&s), Some(v));
        }
    }
});
