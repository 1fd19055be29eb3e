//! The weights of a checkpoint: one `model.safetensors` or the shards named by
//! `model.safetensors.index.json`, memory-mapped, checked against the tensors a
//! [`ModelConfig`] needs, and uploaded to a device straight from the mappings.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ruda_runtime::{DType, Device, Tensor};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{read_json, LlmError, LoadError};
use crate::layers::{ExpectedTensor, TensorSource, EMBED_TOKENS, LM_HEAD};
use crate::models::architecture;
use crate::safetensors::{SafetensorsFile, TensorInfo};

/// Every tensor `config` needs, with its shape (PyTorch's `[out, in]` for linear weights) and
/// device dtype: its architecture's declaration.
pub fn expected_tensors(config: &ModelConfig) -> Vec<ExpectedTensor> {
    architecture(config.model_type).tensors(config)
}

/// Whether `RUDA_CHECK_WEIGHTS` asks for [`Weights::set_check_finite`]: `on` (the default, also
/// when unset) or `off`; anything else is an error naming the variable.
pub(crate) fn check_weights_from_env() -> Result<bool, LlmError> {
    match std::env::var_os("RUDA_CHECK_WEIGHTS") {
        None => Ok(true),
        Some(v) if v == "on" => Ok(true),
        Some(v) if v == "off" => Ok(false),
        Some(v) => {
            Err(LlmError::InvalidArgument(format!("RUDA_CHECK_WEIGHTS={}: expected on or off", v.to_string_lossy())))
        }
    }
}

/// Where one tensor lives: its dtype, shape, and byte range in one mapped file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Index into [`Weights::files`].
    pub file: usize,
    pub range: std::ops::Range<usize>,
}

/// The validated, memory-mapped weights of a model: exactly the tensors its config needs,
/// with the right shapes, each bf16, f16 or f32 (besides what the config ignores, which is
/// left out: [`ModelConfig::ignores_tensor`]).
pub struct Weights {
    files: Vec<SafetensorsFile>,
    tensors: BTreeMap<String, WeightInfo>,
    tied: bool,
    /// The embedding's name (under the config's text prefix), which a tied `lm_head` is.
    embed_tokens: String,
    /// Whether reading a tensor for upload refuses NaN and infinities.
    check_finite: bool,
}

impl Weights {
    /// Map `dir/model.safetensors`, or every shard of `dir/model.safetensors.index.json`, and
    /// validate them against `config`. Nothing is read beyond the headers.
    pub fn load(dir: impl AsRef<Path>, config: &ModelConfig) -> Result<Weights, LoadError> {
        let dir = dir.as_ref();
        let index = dir.join("model.safetensors.index.json");
        // Whether the name is there at all, even as a symbolic link to nothing: opening it then
        // says what it is, instead of "no model.safetensors in this folder".
        let present = |p: &Path| std::fs::symlink_metadata(p).is_ok();
        let (files, tensors) = if present(&index) {
            load_sharded(dir, &index)?
        } else {
            let single = dir.join("model.safetensors");
            if !present(&single) {
                return Err(LoadError::invalid(
                    dir,
                    "no model.safetensors or model.safetensors.index.json in this folder",
                ));
            }
            let file = SafetensorsFile::open(&single)?;
            let tensors = file.tensors().iter().map(|(n, t)| (n.clone(), info(0, t))).collect();
            (vec![file], tensors)
        };
        // What the text model ignores (a vision tower, an MTP head) is not part of its weights.
        let tensors = tensors.into_iter().filter(|(name, _)| !config.ignores_tensor(name)).collect();
        let embed_tokens = format!("{}{}", config.text_prefix, EMBED_TOKENS.trim_start_matches("model."));
        let weights = Weights { files, tensors, tied: config.tie_word_embeddings, embed_tokens, check_finite: true };
        weights.validate(dir, config)?;
        Ok(weights)
    }

    fn validate(&self, dir: &Path, config: &ModelConfig) -> Result<(), LoadError> {
        // Routed experts are accepted in either layout: validated against the checkpoint's.
        let expected = match config.checkpoint_experts_layout(|n| self.tensors.contains_key(n)) {
            Some(layout) => expected_tensors(&config.with_experts_layout(layout)),
            None => expected_tensors(config),
        };
        let source = |name: &str| self.files[self.tensors[name].file].path().to_path_buf();
        let missing: Vec<&str> = expected
            .iter()
            .filter(|e| e.required && !self.tensors.contains_key(&e.name))
            .map(|e| e.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(LoadError::invalid(
                dir,
                format!(
                    "{} missing tensor(s) for this {} config: {}",
                    missing.len(),
                    config.model_type.name(),
                    list(&missing)
                ),
            ));
        }
        let wanted: HashMap<&str, &ExpectedTensor> = expected.iter().map(|e| (e.name.as_str(), e)).collect();
        let extra: Vec<&str> = self.tensors.keys().map(String::as_str).filter(|n| !wanted.contains_key(n)).collect();
        if let Some(first) = extra.first() {
            return Err(LoadError::invalid(
                &source(first),
                format!(
                    "{} unexpected tensor(s) for this {} config: {}",
                    extra.len(),
                    config.model_type.name(),
                    list(&extra)
                ),
            ));
        }
        for (name, t) in &self.tensors {
            if t.shape != wanted[name.as_str()].shape {
                return Err(LoadError::invalid(
                    &source(name),
                    format!(
                        "tensor {name} has shape {:?}, the config needs {:?}",
                        t.shape,
                        wanted[name.as_str()].shape
                    ),
                ));
            }
            if !matches!(t.dtype, DType::BF16 | DType::F16 | DType::F32) {
                return Err(LoadError::unsupported(
                    &source(name),
                    format!("tensor {name} has dtype {} (bf16, f16 or f32)", t.dtype),
                ));
            }
        }
        Ok(())
    }

    /// The mapped files, in the order [`WeightInfo::file`] indexes.
    pub fn files(&self) -> Vec<&Path> {
        self.files.iter().map(SafetensorsFile::path).collect()
    }

    /// Every tensor in the files, by name (a tied checkpoint may also store `lm_head.weight`).
    pub fn tensors(&self) -> &BTreeMap<String, WeightInfo> {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&WeightInfo> {
        self.tensors.get(name)
    }

    /// The bytes of tensor `name`, a slice of its file's mapping.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.files[self.tensors.get(name)?.file].bytes(name)
    }

    /// Whether `lm_head.weight` is the embedding (tied and absent from the files).
    pub fn lm_head_is_embedding(&self) -> bool {
        self.tied
    }

    /// Whether each tensor read for upload ([`TensorSource::check`], [`Weights::upload`]) is
    /// first refused when it holds a NaN or an infinity ([`Weights::check_tensor`]); on unless
    /// turned off (the pipeline follows `RUDA_CHECK_WEIGHTS` / `PipelineOptions::check_weights`).
    pub fn set_check_finite(&mut self, on: bool) {
        self.check_finite = on;
    }

    /// Refuse tensor `name` if it holds a NaN or an infinity, naming it and its first bad
    /// element: a model with one generates garbage (token 0 forever) without any other error.
    /// One pass over the tensor's mapped bytes (branch-free per block), run just before they are
    /// copied for upload, so no separate pass over the whole checkpoint pages it in first.
    pub fn check_tensor(&self, name: &str) -> Result<(), LoadError> {
        let Some(t) = self.tensors.get(name) else { return Ok(()) };
        let bytes = self.files[t.file].bytes(name).unwrap_or_default();
        match first_non_finite(t.dtype, bytes) {
            None => Ok(()),
            Some((i, what)) => Err(LoadError::invalid(
                self.files[t.file].path(),
                format!(
                    "tensor {name} holds {what} at element {i} (index {:?} of shape {:?}); RUDA_CHECK_WEIGHTS=off loads it anyway",
                    unflatten(i, &t.shape),
                    t.shape
                ),
            )),
        }
    }

    /// Create one device tensor per weight, each from a slice of the mapping (no copy of a
    /// whole file in host memory). With tied embeddings, `lm_head.weight` is the embedding
    /// tensor itself (one buffer), as in transformers even when the file also stores it.
    /// Each tensor is first checked as [`Weights::set_check_finite`] says.
    pub fn upload(&self, device: &Device) -> Result<HashMap<String, Tensor>, LoadError> {
        let mut out = HashMap::with_capacity(self.tensors.len() + 1);
        for (name, t) in &self.tensors {
            if self.tied && name == LM_HEAD {
                continue;
            }
            self.check(name)?;
            let bytes = &self.files[t.file].bytes(name).unwrap_or_default();
            let tensor = Tensor::from_bytes(device, t.dtype, &t.shape, bytes).map_err(|source| LoadError::Upload {
                name: name.clone(),
                device: device.description(),
                source: Box::new(source),
            })?;
            out.insert(name.clone(), tensor);
        }
        if self.tied {
            if let Some(embed) = out.get(&self.embed_tokens).cloned() {
                out.insert(LM_HEAD.to_string(), embed);
            }
        }
        Ok(out)
    }
}

impl TensorSource for Weights {
    fn stored(&self, name: &str) -> Option<(DType, &[usize], &[u8])> {
        let info = self.get(name)?;
        Some((info.dtype, &info.shape, self.bytes(name)?))
    }

    fn check(&self, name: &str) -> Result<(), LoadError> {
        if self.check_finite {
            self.check_tensor(name)
        } else {
            Ok(())
        }
    }
}

/// The index of the first NaN or infinity among the elements of `bytes` (little-endian
/// `dtype`), and which it is. bf16, f16 and f32; other dtypes never reach the weights.
fn first_non_finite(dtype: DType, bytes: &[u8]) -> Option<(usize, &'static str)> {
    // An all-ones exponent is NaN or infinity; the mantissa tells which, the sign which infinity.
    match dtype {
        DType::BF16 => first_non_finite_of::<2>(bytes, 0x7f80, 0x007f),
        DType::F16 => first_non_finite_of::<2>(bytes, 0x7c00, 0x03ff),
        DType::F32 => first_non_finite_of::<4>(bytes, 0x7f80_0000, 0x007f_ffff),
        _ => None,
    }
}

/// [`first_non_finite`] for `SIZE`-byte floats with these exponent and mantissa masks.
fn first_non_finite_of<const SIZE: usize>(bytes: &[u8], exponent: u32, mantissa: u32) -> Option<(usize, &'static str)> {
    let word = |c: &[u8]| {
        let mut w = [0u8; 4];
        w[..SIZE].copy_from_slice(c);
        u32::from_le_bytes(w)
    };
    // Blocks with a branch-free test first (it vectorises); only a bad block is searched.
    const BLOCK: usize = 4096;
    for (b, block) in bytes.chunks(BLOCK * SIZE).enumerate() {
        if !block.chunks_exact(SIZE).fold(false, |any, c| any | (word(c) & exponent == exponent)) {
            continue;
        }
        let (i, w) = block.chunks_exact(SIZE).map(word).enumerate().find(|(_, w)| w & exponent == exponent)?;
        let what = if w & mantissa != 0 {
            "NaN"
        } else if w >> (SIZE * 8 - 1) == 1 {
            "-inf"
        } else {
            "inf"
        };
        return Some((b * BLOCK + i, what));
    }
    None
}

/// The multi-dimensional index of flat element `i` of a row-major `shape`.
fn unflatten(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            index[k] = i % d;
            i /= d;
        }
    }
    index
}

fn info(file: usize, t: &TensorInfo) -> WeightInfo {
    WeightInfo { dtype: t.dtype, shape: t.shape.clone(), file, range: t.range.clone() }
}

/// At most eight names, then a count: errors stay readable for a wrong model of 400 tensors.
fn list(names: &[&str]) -> String {
    let mut s = names.iter().take(8).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 8 {
        s.push_str(&format!(", ... ({} more)", names.len() - 8));
    }
    s
}

type Loaded = (Vec<SafetensorsFile>, BTreeMap<String, WeightInfo>);

/// Map every shard the index names, and check that the index and the shards agree exactly.
fn load_sharded(dir: &Path, index: &Path) -> Result<Loaded, LoadError> {
    let json = read_json(index)?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| LoadError::invalid(index, "no \"weight_map\" object"))?;
    let mut shard_of: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, file) in map {
        let file =
            file.as_str().ok_or_else(|| LoadError::invalid(index, format!("weight_map[{name}] is not a file name")))?;
        // Shards live beside the index: no absolute paths or parent folders.
        let plain = Path::new(file).file_name().is_some_and(|f| f == std::ffi::OsStr::new(file));
        if !plain {
            return Err(LoadError::invalid(index, format!("weight_map[{name}] = \"{file}\" is not a plain file name")));
        }
        shard_of.insert(name, file);
    }
    let mut shard_names: Vec<&str> = shard_of.values().copied().collect();
    shard_names.sort_unstable();
    shard_names.dedup();

    let mut files = Vec::with_capacity(shard_names.len());
    let mut tensors = BTreeMap::new();
    for (i, shard) in shard_names.iter().enumerate() {
        let path: PathBuf = dir.join(shard);
        let file = SafetensorsFile::open(&path)?;
        for (name, t) in file.tensors() {
            match shard_of.get(name.as_str()) {
                Some(s) if s == shard => {
                    tensors.insert(name.clone(), info(i, t));
                }
                Some(s) => {
                    return Err(LoadError::invalid(
                        &path,
                        format!("holds tensor {name}, which the index places in {s}"),
                    ))
                }
                None => {
                    return Err(LoadError::invalid(
                        &path,
                        format!("holds tensor {name}, which the index does not list"),
                    ))
                }
            }
        }
        files.push(file);
    }
    if let Some((name, shard)) = shard_of.iter().find(|(n, _)| !tensors.contains_key(**n)) {
        return Err(LoadError::invalid(index, format!("lists tensor {name} in {shard}, which does not hold it")));
    }
    Ok((files, tensors))
}
