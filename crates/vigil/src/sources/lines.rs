//! Bounded line splitting: `\n`, `\r\n` and bare `\r` (progress bars) end a line; a line longer than
//! the bound keeps its head and says how much was cut; invalid UTF-8 is replaced, never a panic.

pub const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Default)]
pub struct Splitter {
    buf: Vec<u8>,
    cut: usize,
    last_was_cr: bool,
}

impl Splitter {
    pub fn new() -> Splitter {
        Splitter::default()
    }

    /// Feeds bytes; calls `out` for each complete line.
    pub fn push(&mut self, data: &[u8], out: &mut dyn FnMut(String)) {
        let mut start = 0;
        for (i, &b) in data.iter().enumerate() {
            if b == b'\n' || b == b'\r' {
                self.append(&data[start..i]);
                let line = self.take();
                // `\r\n` gives one line, not an empty one after it.
                if !(b == b'\n' && line.is_empty() && self.last_was_cr) {
                    out(line);
                }
                self.last_was_cr = b == b'\r';
                start = i + 1;
            } else {
                self.last_was_cr = false;
            }
        }
        self.append(&data[start..]);
    }

    fn append(&mut self, d: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.buf.len());
        let n = room.min(d.len());
        self.buf.extend_from_slice(&d[..n]);
        self.cut += d.len() - n;
    }

    fn take(&mut self) -> String {
        let mut s = String::from_utf8_lossy(&self.buf).into_owned();
        if self.cut > 0 {
            s.push_str(&format!(" [… {} bytes cut]", self.cut));
        }
        self.buf.clear();
        self.cut = 0;
        s
    }

    /// A last line without a newline (at end of input or when the source changes).
    pub fn finish(&mut self) -> Option<String> {
        if self.buf.is_empty() && self.cut == 0 {
            return None;
        }
        Some(self.take())
    }
}

/// `hay` with every `needle` replaced by `with`, left to right, byte for byte (secrets in a log line, rank
/// placeholders in a command's arguments).
pub fn replace_bytes(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if !needle.is_empty() && hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = Splitter::new();
        let mut v = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| v.push(l));
        }
        v.extend(s.finish());
        v
    }

    #[test]
    fn splits_all_endings() {
        assert_eq!(split(&[b"a\nb\r\nc\rd"]), vec!["a", "b", "c", "d"]);
        assert_eq!(split(&[b"ab", b"c\n", b"d"]), vec!["abc", "d"]);
        assert_eq!(split(&[b"a\r", b"\nb\n"]), vec!["a", "b"]);
        assert_eq!(split(&[b"\n\nx\n"]), vec!["", "", "x"]);
    }

    #[test]
    fn bounds_long_lines_and_bad_utf8() {
        let big = vec![b'x'; MAX_LINE + 10];
        let v = split(&[&big, b"\nok\n"]);
        assert_eq!(v.len(), 2);
        assert!(v[0].ends_with("[… 10 bytes cut]"));
        assert_eq!(v[1], "ok");
        let v = split(&[b"\xff\xfe ok\n"]);
        assert!(v[0].ends_with(" ok"));
    }
}
