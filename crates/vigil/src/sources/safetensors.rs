//! safetensors headers, never the weights: the 8-byte little-endian header length, then the JSON table
//! (tensor name → dtype, shape, data offsets), per file; and a checkpoint folder as the servers load it
//! (`model.safetensors.index.json`'s `weight_map` names the shards, else every `*.safetensors` in the
//! folder). Bounded: a header longer than the safetensors library's own limit (100,000,000 bytes,
//! `MAX_HEADER_SIZE` in safetensors/src/tensor.rs) is refused before it is read, and the index is read up
//! to 64 MiB. A 1 TB checkpoint of 163 shards is a few MiB of reading.

use crate::sources::procs;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The safetensors library refuses a longer header (`HeaderTooLarge`).
pub const MAX_HEADER: u64 = 100_000_000;
/// The largest index file read (DeepSeek-V3's is 9 MiB).
const MAX_INDEX: u64 = 64 << 20;
/// The most shards one checkpoint is read for (a larger count is not a checkpoint a server loads).
const MAX_SHARDS: usize = 100_000;

/// One tensor of a header.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub start: u64,
    pub end: u64,
}

/// One file's header.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub tensors: HashMap<String, Tensor>,
    /// The JSON table's length (the first 8 bytes).
    pub header_len: u64,
    /// The largest end offset: the data part's length.
    pub data_end: u64,
    pub file_len: u64,
    /// Bytes read from the file (8 + the header).
    pub bytes_read: u64,
}

impl Header {
    /// The size the header says the file has: 8 + header + the last tensor's end. The safetensors library
    /// refuses any other size (`MetadataIncompleteBuffer`, safetensors/src/tensor.rs `read_metadata`).
    pub fn expected_len(&self) -> u64 {
        8 + self.header_len + self.data_end
    }
}

/// Why a file's header could not be read.
#[derive(Debug, Clone, PartialEq)]
pub enum StError {
    /// The file could not be opened or read.
    Io(String),
    /// Not a safetensors file (bad length word, not JSON, bad table): the library refuses it too.
    Invalid(String),
    /// The header reaches past the end of the file: a truncated or still-downloading file.
    Truncated(String),
}

impl std::fmt::Display for StError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StError::Io(s) | StError::Invalid(s) | StError::Truncated(s) => f.write_str(s),
        }
    }
}

/// Bytes per element of a safetensors dtype (sub-byte types: None; their size is not checked).
pub fn dtype_bytes(d: &str) -> Option<u64> {
    Some(match d {
        "F64" | "I64" | "U64" | "C64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "F8_E4M3FNUZ" | "F8_E5M2FNUZ" => 1,
        _ => return None,
    })
}

/// Reads the header of one file (8 + header bytes, never the data).
pub fn read(path: &Path) -> Result<Header, StError> {
    let io = |e: std::io::Error| StError::Io(format!("cannot read {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(StError::Io(format!("{} is not a regular file", path.display())));
    }
    let file_len = meta.len();
    if file_len < 8 {
        return Err(StError::Truncated(format!("{} has {file_len} bytes: not even the header length", path.display())));
    }
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut word = [0u8; 8];
    f.read_exact(&mut word).map_err(io)?;
    let n = u64::from_le_bytes(word);
    if n > MAX_HEADER {
        return Err(StError::Invalid(format!(
            "{}: header length {n} is over the safetensors limit of {MAX_HEADER} bytes: not a safetensors file",
            path.display()
        )));
    }
    if 8 + n > file_len {
        return Err(StError::Truncated(format!(
            "{}: the header needs {} bytes, the file has {file_len}: truncated",
            path.display(),
            8 + n
        )));
    }
    let mut buf = Vec::with_capacity(n as usize);
    f.take(n).read_to_end(&mut buf).map_err(io)?;
    let mut h = parse_table(&buf).map_err(|e| StError::Invalid(format!("{}: {e}", path.display())))?;
    h.header_len = n;
    h.file_len = file_len;
    h.bytes_read = 8 + n;
    Ok(h)
}

/// One entry of the table as the format writes it.
#[derive(serde::Deserialize)]
struct Raw {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// The table as a map, read in one pass without a JSON tree: `__metadata__` is skipped, every other entry
/// must be a tensor (a checkpoint of 91k tensors has 10 MB of headers).
struct Table(Vec<(String, Raw)>);

impl<'de> serde::Deserialize<'de> for Table {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Table;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Table, A::Error> {
                let mut v = Vec::with_capacity(m.size_hint().unwrap_or(0));
                while let Some(k) = m.next_key::<String>()? {
                    if k == "__metadata__" {
                        m.next_value::<serde::de::IgnoredAny>()?;
                    } else {
                        let r =
                            m.next_value::<Raw>().map_err(|e| serde::de::Error::custom(format!("tensor {k}: {e}")))?;
                        v.push((k, r));
                    }
                }
                Ok(Table(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// The JSON table → tensors (offsets relative to the data part). Each tensor's byte count must match
/// its shape and dtype (the library's `TensorInvalidInfo`).
pub fn parse_table(buf: &[u8]) -> Result<Header, String> {
    let t: Table = serde_json::from_slice(buf).map_err(|e| format!("the header is not a safetensors table ({e})"))?;
    let mut h = Header { tensors: HashMap::with_capacity(t.0.len()), ..Header::default() };
    for (name, r) in t.0 {
        let (start, end) = r.data_offsets;
        if end < start {
            return Err(format!("tensor {name}: data_offsets end {end} before start {start}"));
        }
        if let Some(b) = dtype_bytes(&r.dtype) {
            let need = r.shape.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).and_then(|n| n.checked_mul(b));
            if need != Some(end - start) {
                return Err(format!(
                    "tensor {name}: {} {:?} needs {} bytes, its offsets span {}",
                    r.dtype,
                    r.shape,
                    need.map(|x| x.to_string()).unwrap_or_else(|| "overflowing".into()),
                    end - start
                ));
            }
        }
        h.data_end = h.data_end.max(end);
        h.tensors.insert(name, Tensor { dtype: r.dtype, shape: r.shape, start, end });
    }
    Ok(h)
}

/// One shard of a checkpoint: its file name and header (or why it could not be read).
#[derive(Debug, Clone)]
pub struct Shard {
    pub file: String,
    pub header: Result<Header, StError>,
}

/// A checkpoint folder as the servers load it.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    pub dir: PathBuf,
    /// `model.safetensors.index.json`, when there is one.
    pub index: Option<PathBuf>,
    /// Shard files the index names that are not on disk (a dangling Hugging Face cache link counts).
    pub missing: Vec<String>,
    /// The files the servers load, with their headers (sizes; their tensors are in `tensors`).
    pub shards: Vec<Shard>,
    /// Every tensor of the readable shards → (dtype, shape).
    pub tensors: HashMap<String, (String, Vec<u64>)>,
    /// Bytes read: index + headers.
    pub bytes_read: u64,
    /// Bytes of tensor data in the readable shards (what the server loads).
    pub weight_bytes: u64,
    /// An index that could not be read or parsed.
    pub index_error: Option<String>,
}

/// The shard files the servers load from `dir`: with `model.safetensors.index.json`, the files its
/// `weight_map` names (vLLM 0.26.0 and SGLang 0.5.17 `filter_duplicate_safetensors_files`, both
/// model_loader/weight_utils.py); else every `*.safetensors` in the folder (SGLang skips
/// `consolidated.safetensors` beside a lone `model.safetensors`). `None`: no safetensors at all.
pub fn read_checkpoint(dir: &Path) -> Option<Checkpoint> {
    let mut ck = Checkpoint { dir: dir.to_path_buf(), ..Default::default() };
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .take(MAX_SHARDS)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    on_disk.sort();
    let idx = dir.join("model.safetensors.index.json");
    let files: Vec<String> = match procs::read_small(&idx, MAX_INDEX) {
        Ok(b) => {
            ck.bytes_read += b.len() as u64;
            ck.index = Some(idx.clone());
            match serde_json::from_slice::<Value>(&b) {
                Ok(v) => {
                    let mut named: Vec<String> = v["weight_map"]
                        .as_object()
                        .map(|m| m.values().filter_map(|s| s.as_str().map(String::from)).collect())
                        .unwrap_or_default();
                    named.sort();
                    named.dedup();
                    named.truncate(MAX_SHARDS);
                    if named.is_empty() {
                        ck.index_error = Some(format!("{} has no weight_map", idx.display()));
                    }
                    // `std::fs::metadata` follows a cache snapshot's link to its blob.
                    let (here, gone): (Vec<String>, Vec<String>) =
                        named.into_iter().partition(|f| std::fs::metadata(dir.join(f)).is_ok_and(|m| m.is_file()));
                    ck.missing = gone;
                    here
                }
                Err(e) => {
                    ck.index_error = Some(format!("{} is not valid JSON: {e}", idx.display()));
                    on_disk.clone()
                }
            }
        }
        Err(_) => {
            if on_disk.len() == 2 && on_disk[0] == "consolidated.safetensors" && on_disk[1] == "model.safetensors" {
                vec![on_disk[1].clone()]
            } else {
                on_disk.clone()
            }
        }
    };
    if files.is_empty() && ck.missing.is_empty() && ck.index.is_none() {
        return None;
    }
    for file in files {
        let mut header = read(&dir.join(&file));
        match &mut header {
            Ok(h) => {
                ck.bytes_read += h.bytes_read;
                ck.weight_bytes += h.data_end;
                // The names move to the checkpoint's table; the shard keeps its sizes.
                for (name, t) in std::mem::take(&mut h.tensors) {
                    ck.tensors.insert(name, (t.dtype, t.shape));
                }
            }
            Err(StError::Truncated(_)) | Err(StError::Invalid(_)) => ck.bytes_read += 8,
            Err(StError::Io(_)) => {}
        }
        ck.shards.push(Shard { file, header });
    }
    Some(ck)
}

/// Writes a safetensors file whose data part is a hole (sparse: no disk blocks for the weights). For
/// tests: `tensors` are (name, dtype, shape), laid out in order.
#[cfg(test)]
pub fn write_sparse(path: &Path, tensors: &[(&str, &str, Vec<u64>)]) -> std::io::Result<u64> {
    use std::io::Write;
    let mut table = serde_json::Map::new();
    table.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut off = 0u64;
    for (name, dtype, shape) in tensors {
        let n = shape.iter().product::<u64>() * dtype_bytes(dtype).unwrap_or(1);
        table.insert(
            (*name).into(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    let mut head = serde_json::to_vec(&Value::Object(table))?;
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut f = std::fs::File::create(path)?;
    f.write_all(&(head.len() as u64).to_le_bytes())?;
    f.write_all(&head)?;
    let len = 8 + head.len() as u64 + off;
    f.set_len(len)?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-st-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn header_round_trip_and_sizes() {
        let d = tmp("rt");
        let p = d.join("model.safetensors");
        let len = write_sparse(&p, &[("a", "BF16", vec![4, 8]), ("b", "F32", vec![3])]).unwrap();
        let h = read(&p).unwrap();
        assert_eq!(h.tensors["a"].shape, vec![4, 8]);
        assert_eq!(h.tensors["b"].dtype, "F32");
        assert_eq!(h.data_end, 64 + 12);
        assert_eq!(h.expected_len(), len);
        assert_eq!(h.file_len, len);
        assert_eq!(h.bytes_read, 8 + h.header_len);
        // Cut short: the header still reads, and says the file is shorter than it needs.
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len - 5).unwrap();
        let h = read(&p).unwrap();
        assert_eq!(h.expected_len() - h.file_len, 5);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn absurd_and_broken_headers_are_refused_without_reading_them() {
        let d = tmp("bad");
        let p = d.join("x.safetensors");
        std::fs::write(&p, [0xffu8; 64]).unwrap();
        assert!(matches!(read(&p), Err(StError::Invalid(m)) if m.contains("over the safetensors limit")));
        let mut b = 1000u64.to_le_bytes().to_vec();
        b.extend(b"{\"a\":");
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(read(&p), Err(StError::Truncated(_))));
        let mut b = 5u64.to_le_bytes().to_vec();
        b.extend(b"[1,2]");
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(read(&p), Err(StError::Invalid(_))));
        std::fs::write(&p, b"abc").unwrap();
        assert!(matches!(read(&p), Err(StError::Truncated(_))));
        let t = br#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,7]}}"#;
        assert!(parse_table(t).unwrap_err().contains("needs 8 bytes"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn checkpoint_follows_the_index_and_names_missing_shards() {
        let d = tmp("ck");
        write_sparse(&d.join("model-00001-of-00002.safetensors"), &[("x", "BF16", vec![2, 2])]).unwrap();
        write_sparse(&d.join("consolidated.safetensors"), &[("y", "BF16", vec![2, 2])]).unwrap();
        std::fs::write(
            d.join("model.safetensors.index.json"),
            r#"{"metadata":{"total_size":16},"weight_map":{"x":"model-00001-of-00002.safetensors","z":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let ck = read_checkpoint(&d).unwrap();
        assert_eq!(ck.missing, vec!["model-00002-of-00002.safetensors".to_string()]);
        assert_eq!(ck.shards.len(), 1, "consolidated.safetensors is not in the index: not loaded");
        assert!(ck.tensors.contains_key("x") && !ck.tensors.contains_key("y"));
        assert_eq!(ck.weight_bytes, 8);
        assert!(read_checkpoint(&tmp("empty")).is_none());
        let _ = std::fs::remove_dir_all(&d);
    }
}
