//! `generation_config.json`: the end-of-sequence ids, and the sampling defaults the model's
//! authors chose.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{read_json, LoadError};

/// What `generation_config.json` says about stopping and sampling. Sampling fields are `None`
/// when the file does not give them (the caller's defaults apply).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// Generation stops at any of these ids (`eos_token_id`, a number or a list).
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    /// `do_sample`; false means greedy.
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Read `dir/generation_config.json`; without one, the EOS and BOS ids of `config.json`
    /// (as transformers does), and no sampling defaults.
    pub fn load(dir: impl AsRef<Path>) -> Result<GenerationConfig, LoadError> {
        Ok(GenerationConfig::read(dir.as_ref())?.1)
    }

    /// [`GenerationConfig::load`] for a model of `vocab_size` tokens: an EOS id it can never
    /// produce is an error naming the file it came from (generation would never stop on it).
    pub fn load_for_vocab(dir: impl AsRef<Path>, vocab_size: usize) -> Result<GenerationConfig, LoadError> {
        let (path, config) = GenerationConfig::read(dir.as_ref())?;
        if let Some(id) = config.eos_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(LoadError::invalid(
                &path,
                format!("eos_token_id {id} is outside the model's vocabulary (vocab_size {vocab_size} in config.json)"),
            ));
        }
        Ok(config)
    }

    /// The config and the file it was read from.
    fn read(dir: &Path) -> Result<(PathBuf, GenerationConfig), LoadError> {
        let path = dir.join("generation_config.json");
        if std::fs::symlink_metadata(&path).is_ok() {
            let config = GenerationConfig::parse(&path, &read_json(&path)?)?;
            return Ok((path, config));
        }
        let path = dir.join("config.json");
        let json = read_json(&path)?;
        let config = GenerationConfig {
            eos_token_ids: ids(&path, &json, "eos_token_id")?,
            bos_token_id: ids(&path, &json, "bos_token_id")?.first().copied(),
            ..GenerationConfig::default()
        };
        Ok((path, config))
    }

    /// Parse the JSON of a `generation_config.json`; `path` is only used in error messages.
    pub fn parse(path: &Path, json: &Value) -> Result<GenerationConfig, LoadError> {
        if !json.is_object() {
            return Err(LoadError::invalid(path, "the top level is not a JSON object"));
        }
        let num = |key: &str| -> Result<Option<f64>, LoadError> {
            match json.get(key).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(v) => {
                    v.as_f64().map(Some).ok_or_else(|| LoadError::invalid(path, format!("{key} is not a number")))
                }
            }
        };
        let count = |key: &str| -> Result<Option<usize>, LoadError> {
            match json.get(key).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| LoadError::invalid(path, format!("{key} is not a non-negative integer"))),
            }
        };
        let do_sample = match json.get("do_sample").filter(|v| !v.is_null()) {
            None => None,
            Some(v) => Some(v.as_bool().ok_or_else(|| LoadError::invalid(path, "do_sample is not true or false"))?),
        };
        Ok(GenerationConfig {
            eos_token_ids: ids(path, json, "eos_token_id")?,
            bos_token_id: ids(path, json, "bos_token_id")?.first().copied(),
            pad_token_id: ids(path, json, "pad_token_id")?.first().copied(),
            do_sample,
            temperature: num("temperature")?,
            top_k: count("top_k")?,
            top_p: num("top_p")?,
            repetition_penalty: num("repetition_penalty")?,
            max_new_tokens: count("max_new_tokens")?,
        })
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }
}

/// A token-id field that may be absent, null, one id or a list of ids.
fn ids(path: &Path, json: &Value, key: &str) -> Result<Vec<u32>, LoadError> {
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let bad = || LoadError::invalid(path, format!("{key} is not a token id or a list of token ids"));
    match json.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list.iter().map(|v| one(v).ok_or_else(bad)).collect(),
        Some(v) => Ok(vec![one(v).ok_or_else(bad)?]),
    }
}
