//! A memory-mapped safetensors file: an 8-byte little-endian header length `n`, `n` bytes of
//! JSON (`name -> {dtype, shape, data_offsets: [begin, end]}` plus an optional
//! `__metadata__` map of strings), then the data, offsets relative to its start. Every offset is
//! checked against the file's length, so a truncated or corrupt file is an error, never an
//! out-of-bounds read.
//!
//! The rules are the format's, as the `safetensors` crate (what transformers loads with)
//! enforces them: the tensors cover the data exactly, without holes, overlaps or trailing
//! bytes. Two things this parser does that the crate does not (why it is ours, see
//! `docs/models.md`): a key written twice in the header is refused rather than resolved to its
//! last value, and every error names the file, the tensor and what is wrong.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use ruda_runtime::DType;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::LoadError;

/// Headers larger than this are corrupt (real ones are a few hundred KiB).
const MAX_HEADER: u64 = 100 << 20;

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Bytes of the tensor within its file's mapping (already past the header).
    pub range: Range<usize>,
}

/// An open, mapped and validated safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    tensors: BTreeMap<String, TensorInfo>,
}

impl SafetensorsFile {
    /// Map `path` and validate its header: every tensor's dtype is known, its byte range lies in
    /// the file and matches its shape, and no two tensors overlap.
    pub fn open(path: &Path) -> Result<SafetensorsFile, LoadError> {
        let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
        let meta = file.metadata().map_err(|e| LoadError::io(path, e))?;
        // Mapping a directory fails with ENODEV ("No such device"): say what it is instead.
        if meta.is_dir() {
            return Err(LoadError::invalid(path, "is a directory, not a safetensors file"));
        }
        if !meta.is_file() {
            return Err(LoadError::invalid(path, "is not a regular file (a safetensors file is mapped into memory)"));
        }
        let len = meta.len();
        if len < 8 {
            return Err(LoadError::invalid(
                path,
                format!("truncated safetensors file: {len} bytes, not even the 8-byte header length"),
            ));
        }
        // SAFETY: the mapping is read-only; like every mmap-based loader we rely on model files
        // not being modified while they are loaded (a concurrent truncation could fault).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))?;
        let tensors = parse_header(path, &mmap)?;
        Ok(SafetensorsFile { path: path.to_path_buf(), mmap, tensors })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors by name.
    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    /// The bytes of tensor `name`: a slice of the mapping, no copy.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.tensors.get(name).map(|t| &self.mmap[t.range.clone()])
    }
}

/// The safetensors dtype names RUDA can hold.
fn dtype_of(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F64" => DType::F64,
        "I8" => DType::I8,
        "I16" => DType::I16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "U8" => DType::U8,
        "U16" => DType::U16,
        "U32" => DType::U32,
        "U64" => DType::U64,
        _ => return None,
    })
}

fn parse_header(path: &Path, bytes: &[u8]) -> Result<BTreeMap<String, TensorInfo>, LoadError> {
    let bad = |message: String| LoadError::invalid(path, message);
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&bytes[..8]);
    let header_len = u64::from_le_bytes(len_bytes);
    let available = (bytes.len() - 8) as u64;
    if header_len > MAX_HEADER || header_len > available {
        return Err(bad(format!(
            "corrupt or truncated safetensors file: header length {header_len} but {available} bytes follow"
        )));
    }
    let data_start = 8 + header_len as usize;
    let header = parse_json(&bytes[8..data_start]).map_err(|e| {
        if e.is_data() {
            bad(format!("corrupt safetensors header: {e}"))
        } else {
            bad(format!("corrupt safetensors header (not JSON: {e})"))
        }
    })?;
    let header = header.as_object().ok_or_else(|| bad("corrupt safetensors header (not a JSON object)".into()))?;
    let data_len = bytes.len() - data_start;

    let mut tensors = BTreeMap::new();
    for (name, entry) in header {
        if name == "__metadata__" {
            let strings = |m: &Map<String, Value>| m.values().all(Value::is_string);
            if !(entry.is_null() || entry.as_object().is_some_and(strings)) {
                return Err(bad("corrupt safetensors header: __metadata__ is not a map of strings to strings".into()));
            }
            continue;
        }
        let field = |key: &str| entry.get(key).ok_or_else(|| bad(format!("tensor {name}: no \"{key}\" in the header")));
        let dtype_name =
            field("dtype")?.as_str().ok_or_else(|| bad(format!("tensor {name}: dtype is not a string")))?;
        let dtype = dtype_of(dtype_name)
            .ok_or_else(|| LoadError::unsupported(path, format!("tensor {name}: dtype {dtype_name}")))?;
        let shape =
            usize_list(field("shape")?).ok_or_else(|| bad(format!("tensor {name}: shape is not a list of sizes")))?;
        let offsets = usize_list(field("data_offsets")?)
            .filter(|o| o.len() == 2)
            .ok_or_else(|| bad(format!("tensor {name}: data_offsets is not [begin, end]")))?;
        let (begin, end) = (offsets[0], offsets[1]);
        if begin > end {
            return Err(bad(format!("tensor {name}: data_offsets [{begin}, {end}] run backwards")));
        }
        if end > data_len {
            return Err(bad(format!(
                "truncated safetensors file: tensor {name} ends at data byte {end} but the data has {data_len} bytes"
            )));
        }
        let want = shape.iter().try_fold(dtype.size(), |n, &d| n.checked_mul(d));
        if want != Some(end - begin) {
            return Err(bad(format!(
                "tensor {name}: shape {shape:?} of {dtype} does not fit its {} data bytes",
                end - begin
            )));
        }
        tensors.insert(name.clone(), TensorInfo { dtype, shape, range: data_start + begin..data_start + end });
    }

    // The tensors tile the data: no overlaps, no holes, nothing after the last one (bytes no
    // tensor owns could hide another file inside this one).
    let mut ranges: Vec<(&Range<usize>, &String)> = tensors.iter().map(|(n, t)| (&t.range, n)).collect();
    ranges.sort_by_key(|(r, _)| (r.start, r.end));
    let mut covered = data_start;
    let mut previous: Option<&String> = None;
    for (range, name) in ranges {
        if range.start < covered {
            let other = previous.map_or(String::new(), |p| format!("{p} and "));
            return Err(bad(format!("corrupt safetensors header: tensors {other}{name} overlap")));
        }
        if range.start > covered {
            let after = previous.map_or("the header".to_string(), |p| format!("tensor {p}"));
            return Err(bad(format!(
                "corrupt safetensors header: data bytes {}..{} between {after} and tensor {name} belong to no tensor",
                covered - data_start,
                range.start - data_start
            )));
        }
        covered = range.end;
        previous = Some(name);
    }
    if covered < bytes.len() {
        let after = previous.map_or("the header".to_string(), |p| format!("the last tensor, {p}"));
        return Err(bad(format!(
            "corrupt safetensors file: {} data bytes after {after} belong to no tensor",
            bytes.len() - covered
        )));
    }
    Ok(tensors)
}

/// Parse header JSON, refusing any object that writes a key twice (serde_json, and so the
/// `safetensors` crate, keeps the last value silently). The error names the key and, inside a
/// tensor's entry, the tensor.
fn parse_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict { tensor: None }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A [`Value`] seed that refuses duplicate keys; `tensor` is the top-level key it is under
/// (a tensor's name, or `__metadata__`).
#[derive(Clone, Copy)]
struct Strict<'a> {
    tensor: Option<&'a str>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(A::Error::custom(match self.tensor {
                    None => format!("key \"{key}\" appears twice"),
                    Some("__metadata__") => format!("__metadata__: key \"{key}\" appears twice"),
                    Some(t) => format!("tensor {t}: key \"{key}\" appears twice"),
                }));
            }
            let value = map.next_value_seed(Strict { tensor: Some(self.tensor.unwrap_or(&key)) })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

fn usize_list(v: &Value) -> Option<Vec<usize>> {
    v.as_array()?.iter().map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok())).collect()
}
