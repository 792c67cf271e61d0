//! Timestamp parsers for the log formats the profiles name. Pure functions: text in, milliseconds out.
//!
//! All results are milliseconds on a per-format scale, only ever compared with other stamps of the
//! same log: absolute wall-clock meaning is not needed to measure phase durations.

/// Which timestamp format a prefix's `ts` group holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsFormat {
    /// `2025-08-08 09:09:09`, optional `.mmm` or `,mmm` (SGLang, Python logging).
    YmdHms,
    /// `05-23 09:31:22` (vLLM: no year, 1 s resolution).
    MdHms,
    /// `0.00.095.288` — llama.cpp `--log-timestamps`: minutes.seconds.millis.micros since process start.
    LlamaRel,
    /// `2023-12-16T09:36:24.632149Z` (TGI tracing, RFC 3339).
    Rfc3339,
}

impl TsFormat {
    pub fn parse_name(s: &str) -> Option<TsFormat> {
        match s {
            "ymd_hms" => Some(TsFormat::YmdHms),
            "md_hms" => Some(TsFormat::MdHms),
            "llama_rel" => Some(TsFormat::LlamaRel),
            "rfc3339" => Some(TsFormat::Rfc3339),
            _ => None,
        }
    }

    /// Parses a stamp into milliseconds. `None` when the text is not a valid stamp of this format.
    pub fn parse(self, s: &str) -> Option<i64> {
        match self {
            TsFormat::YmdHms | TsFormat::Rfc3339 => parse_ymd_hms(s),
            TsFormat::MdHms => parse_md_hms(s),
            TsFormat::LlamaRel => parse_llama_rel(s),
        }
    }
}

fn num(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Days from 1970-01-01 to the given civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn hms_ms(s: &str) -> Option<i64> {
    // HH:MM:SS[.fff|,fff]
    let (hms, frac) = match s.find(['.', ',']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mut it = hms.split(':');
    let h = num(it.next()?)?;
    let m = num(it.next()?)?;
    let sec = num(it.next()?)?;
    if it.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let ms = match frac {
        Some(f) => {
            let f: String = f.chars().take_while(|c| c.is_ascii_digit()).take(3).collect();
            if f.is_empty() {
                return None;
            }
            let v = num(&f)?;
            v * 10i64.pow(3 - f.len() as u32)
        }
        None => 0,
    };
    Some(((h * 60 + m) * 60 + sec) * 1000 + ms)
}

fn parse_ymd_hms(s: &str) -> Option<i64> {
    let s = s.trim().trim_end_matches('Z');
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut it = date.split('-');
    let y = num(it.next()?)?;
    let mo = num(it.next()?)?;
    let d = num(it.next()?)?;
    if it.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    // drop a numeric UTC offset, if any
    let time = time.split(['+']).next()?;
    Some(days_from_civil(y, mo, d) * 86_400_000 + hms_ms(time)?)
}

fn parse_md_hms(s: &str) -> Option<i64> {
    let (date, time) = s.trim().split_once(' ')?;
    let (mo, d) = date.split_once('-')?;
    let (mo, d) = (num(mo)?, num(d)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    // No year in the stamp: a leap year keeps Feb 29 valid. Year-end rollover shows as a stamp
    // going backwards, which the reader tolerates.
    Some(days_from_civil(2000, mo, d) * 86_400_000 + hms_ms(time)?)
}

fn parse_llama_rel(s: &str) -> Option<i64> {
    let mut it = s.trim().split('.');
    let min = num(it.next()?)?;
    let sec = num(it.next()?)?;
    let ms = num(it.next()?)?;
    let _us = num(it.next()?)?;
    if it.next().is_some() || sec > 59 || ms > 999 {
        return None;
    }
    Some((min * 60 + sec) * 1000 + ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let a = TsFormat::YmdHms.parse("2025-08-08 09:09:09").unwrap();
        let b = TsFormat::YmdHms.parse("2025-08-08 09:09:10.250").unwrap();
        assert_eq!(b - a, 1250);
        let c = TsFormat::YmdHms.parse("2025-03-27 21:33:31,320").unwrap();
        assert_eq!(c % 1000, 320);
        let r = TsFormat::Rfc3339.parse("2023-12-16T09:36:24.632149Z").unwrap();
        assert_eq!(r % 1000, 632);
        let v1 = TsFormat::MdHms.parse("05-23 09:31:22").unwrap();
        let v2 = TsFormat::MdHms.parse("05-23 09:31:47").unwrap();
        assert_eq!(v2 - v1, 25_000);
        assert_eq!(TsFormat::LlamaRel.parse("27.39.077.188"), Some((27 * 60 + 39) * 1000 + 77));
        assert_eq!(TsFormat::LlamaRel.parse("0.00.002.662"), Some(2));
    }

    #[test]
    fn garbage_is_none() {
        for s in ["", "x", "2025-13-01 00:00:00", "99:99:99", "1.2.3", "05-23", "2025-01-01 25:00:00"] {
            assert_eq!(TsFormat::YmdHms.parse(s), None, "{s}");
            assert_eq!(TsFormat::LlamaRel.parse(s), None, "{s}");
        }
        assert_eq!(TsFormat::MdHms.parse("13-01 00:00:00"), None);
    }
}
