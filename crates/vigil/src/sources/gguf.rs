//! GGUF header reader: metadata and tensor table only, never the weights. Enough to check a file is
//! a GGUF, whether it is complete (the tensor table says how long the file must be), its
//! architecture, context length and tokenizer.

use std::io::{BufReader, Read, Seek};
use std::path::Path;

#[derive(Debug, Clone, Default)]
pub struct GgufInfo {
    pub version: u32,
    pub architecture: Option<String>,
    pub context_length: Option<u64>,
    pub tokenizer_model: Option<String>,
    pub vocab_size: Option<u64>,
    /// The size the tensor table requires, when every tensor type is known.
    pub expected_size: Option<u64>,
    /// `{arch}.block_count`, `.attention.head_count`, `.attention.head_count_kv` (None when per-layer),
    /// `.embedding_length`, `.attention.key_length`, `.attention.value_length`, `.attention.sliding_window`:
    /// what llama.cpp sizes its KV cache from (`llama_hparams::n_embd_k_gqa`), read for the fit estimate.
    pub block_count: Option<u64>,
    pub head_count: Option<u64>,
    pub head_count_kv: Option<u64>,
    pub embedding_length: Option<u64>,
    pub key_length: Option<u64>,
    pub value_length: Option<u64>,
    pub sliding_window: Option<u64>,
    /// Bytes of `token_embd.weight` (kept on the CPU by llama.cpp), `output.weight`, and of each `blk.N.*`
    /// block, from the tensor table (types vigil knows only; None when any is unknown).
    pub token_embd_bytes: u64,
    pub output_bytes: u64,
    pub block_bytes: Vec<u64>,
    pub tensor_bytes_known: bool,
    /// Where the header (metadata and tensor table) ends: what `history` hashes as the model's config.
    pub header_end: u64,
}

#[derive(Debug)]
pub enum GgufError {
    Io(String),
    NotGguf(String),
    Truncated(String),
}

impl std::fmt::Display for GgufError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GgufError::Io(s) | GgufError::NotGguf(s) | GgufError::Truncated(s) => f.write_str(s),
        }
    }
}

struct R<T: Read> {
    r: T,
    pos: u64,
    size: u64,
}

impl<T: Read> R<T> {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, GgufError> {
        if self.pos + n > self.size {
            return Err(GgufError::Truncated(format!(
                "the header ends past the end of the file (needs byte {} of {})",
                self.pos + n,
                self.size
            )));
        }
        let mut v = vec![0u8; n as usize];
        self.r.read_exact(&mut v).map_err(|e| GgufError::Io(e.to_string()))?;
        self.pos += n;
        Ok(v)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().unwrap()))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.u64()?;
        if n > 1 << 24 {
            return Err(GgufError::NotGguf(format!("implausible string length {n}")));
        }
        Ok(String::from_utf8_lossy(&self.bytes(n)?).into_owned())
    }
    fn skip(&mut self, n: u64) -> Result<(), GgufError> {
        if self.pos + n > self.size {
            return Err(GgufError::Truncated("the header ends past the end of the file".into()));
        }
        std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink()).map_err(|e| GgufError::Io(e.to_string()))?;
        self.pos += n;
        Ok(())
    }
}

fn scalar_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1), // u8 i8 bool
        2 | 3 => Some(2),
        4..=6 => Some(4),   // u32 i32 f32
        10..=12 => Some(8), // u64 i64 f64
        _ => None,
    }
}

enum Val {
    Str(String),
    Int(u64),
    ArrLen(u64),
    Other,
}

fn value<T: Read>(r: &mut R<T>, t: u32) -> Result<Val, GgufError> {
    match t {
        8 => Ok(Val::Str(r.string()?)),
        9 => {
            let et = r.u32()?;
            let n = r.u64()?;
            if et == 8 {
                for _ in 0..n {
                    r.string()?;
                }
            } else {
                let sz = scalar_size(et).ok_or_else(|| GgufError::NotGguf(format!("bad array type {et}")))?;
                r.skip(sz.saturating_mul(n))?;
            }
            Ok(Val::ArrLen(n))
        }
        4 | 5 => Ok(Val::Int(r.u32()? as u64)),
        10 | 11 => Ok(Val::Int(r.u64()?)),
        t => {
            let sz = scalar_size(t).ok_or_else(|| GgufError::NotGguf(format!("bad value type {t}")))?;
            r.skip(sz)?;
            Ok(Val::Other)
        }
    }
}

/// (block elements, block bytes) of ggml tensor types vigil knows.
fn type_size(t: u32) -> Option<(u64, u64)> {
    Some(match t {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        9 => (32, 36),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292),
        24 => (1, 1), // I8
        25 => (1, 2), // I16
        26 => (1, 4), // I32
        27 => (1, 8), // I64
        28 => (1, 8), // F64
        30 => (1, 2), // BF16
        _ => return None,
    })
}

/// The hyperparameter keys read for the fit estimate (suffixes of `{arch}.`).
const HPARAMS: &[&str] = &[
    ".block_count",
    ".attention.head_count",
    ".attention.head_count_kv",
    ".embedding_length",
    ".attention.key_length",
    ".attention.value_length",
    ".attention.sliding_window",
];

/// Sorts one tensor's bytes into the embedding, the output head or its `blk.N.` block (at most 4096
/// blocks: a bogus index is counted nowhere rather than allocating).
fn add_tensor_bytes(info: &mut GgufInfo, name: &str, bytes: u64) {
    if name == "token_embd.weight" {
        info.token_embd_bytes = info.token_embd_bytes.saturating_add(bytes);
    } else if name == "output.weight" {
        info.output_bytes = info.output_bytes.saturating_add(bytes);
    } else if let Some(i) =
        name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse::<usize>().ok())
    {
        if i < 4096 {
            if info.block_bytes.len() <= i {
                info.block_bytes.resize(i + 1, 0);
            }
            info.block_bytes[i] = info.block_bytes[i].saturating_add(bytes);
        }
    }
}

pub fn read(path: &Path) -> Result<GgufInfo, GgufError> {
    let f = std::fs::File::open(path).map_err(|e| GgufError::Io(format!("{}: {e}", path.display())))?;
    let size = f.metadata().map_err(|e| GgufError::Io(e.to_string()))?.len();
    let mut r = R { r: BufReader::new(f), pos: 0, size };
    if size < 4 {
        return Err(GgufError::NotGguf(format!("{} bytes: too short for a GGUF file", size)));
    }
    let magic = r.bytes(4)?;
    if magic != b"GGUF" {
        return Err(GgufError::NotGguf(format!(
            "invalid magic {:?}, expected \"GGUF\"",
            String::from_utf8_lossy(&magic)
        )));
    }
    let mut info = GgufInfo { version: r.u32()?, ..GgufInfo::default() };
    if !(2..=3).contains(&info.version) {
        return Err(GgufError::NotGguf(format!("unsupported GGUF version {}", info.version)));
    }
    let n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    if n_kv > 1 << 20 || n_tensors > 1 << 24 {
        return Err(GgufError::NotGguf("implausible counts in the header".into()));
    }
    let mut alignment = 32u64;
    let mut ctx_keys: Vec<(String, u64)> = Vec::new();
    let mut hp_keys: Vec<(String, u64)> = Vec::new();
    for _ in 0..n_kv {
        let key = r.string()?;
        let t = r.u32()?;
        let v = value(&mut r, t)?;
        match (key.as_str(), v) {
            ("general.architecture", Val::Str(s)) => info.architecture = Some(s),
            ("general.alignment", Val::Int(a)) if a > 0 => alignment = a,
            ("tokenizer.ggml.model", Val::Str(s)) => info.tokenizer_model = Some(s),
            ("tokenizer.ggml.tokens", Val::ArrLen(n)) => info.vocab_size = Some(n),
            (k, Val::Int(n)) if k.ends_with(".context_length") => ctx_keys.push((k.to_string(), n)),
            (k, Val::Int(n)) if HPARAMS.iter().any(|h| k.ends_with(h)) && hp_keys.len() < 64 => {
                hp_keys.push((k.to_string(), n))
            }
            _ => {}
        }
    }
    if let Some(a) = &info.architecture {
        info.context_length = ctx_keys.iter().find(|(k, _)| *k == format!("{a}.context_length")).map(|x| x.1);
        let hp = |suffix: &str| hp_keys.iter().find(|(k, _)| *k == format!("{a}{suffix}")).map(|x| x.1);
        info.block_count = hp(".block_count");
        info.head_count = hp(".attention.head_count");
        info.head_count_kv = hp(".attention.head_count_kv");
        info.embedding_length = hp(".embedding_length");
        info.key_length = hp(".attention.key_length");
        info.value_length = hp(".attention.value_length");
        info.sliding_window = hp(".attention.sliding_window");
    }
    info.tensor_bytes_known = true;
    let mut end = 0u64;
    let mut known = true;
    for _ in 0..n_tensors {
        let name = r.string()?;
        let nd = r.u32()?;
        if nd > 8 {
            return Err(GgufError::NotGguf(format!("implausible tensor rank {nd}")));
        }
        let mut elems = 1u64;
        for _ in 0..nd {
            elems = elems.saturating_mul(r.u64()?);
        }
        let t = r.u32()?;
        let off = r.u64()?;
        match type_size(t) {
            Some((be, bb)) => {
                let bytes = elems.div_ceil(be).saturating_mul(bb);
                end = end.max(off.saturating_add(bytes));
                add_tensor_bytes(&mut info, &name, bytes);
            }
            None => {
                known = false;
                info.tensor_bytes_known = false;
            }
        }
    }
    info.header_end = r.pos;
    let data_start = r.pos.div_ceil(alignment) * alignment;
    if known {
        info.expected_size = Some(data_start + end);
        if data_start + end > size {
            return Err(GgufError::Truncated(format!(
                "the tensor table needs {} bytes but the file has {size}: truncated or incomplete",
                data_start + end
            )));
        }
    }
    let _ = r.r.stream_position();
    Ok(info)
}
