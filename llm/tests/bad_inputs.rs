//! Bad input, one row each: a model folder broken one way, an argument, or an environment
//! variable, run through the built `qwen2_generate` example or `ruda-llm generate` (what a user
//! runs) and held to the error it must print and the exit status it must end with. Add a row with every new loader,
//! flag and endpoint. Every safetensors file a row leaves behind, and every committed one, is
//! also read by the `safetensors` crate, which must agree with our parser (see
//! `docs/models.md`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use ruda_llm::safetensors::SafetensorsFile;
use ruda_llm::{load_pipeline, LoadError, PipelineOptions};
use serde_json::Value;

use crate::common::{self, fixture};

/// A copy of the `qwen2-tied` fixture (bf16 weights, vocab_size 400, tokenizer ids 0..=399)
/// in a fresh temp folder, removed when dropped.
struct Folder(PathBuf);

impl Folder {
    fn new(tag: &str) -> Folder {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ruda-llm-bad-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("model");
        std::fs::create_dir(&model).unwrap();
        for entry in std::fs::read_dir(fixture("qwen2-tied")).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() != "goldens.json" {
                std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
            }
        }
        Folder(dir)
    }
    /// The model folder.
    fn model(&self) -> PathBuf {
        self.0.join("model")
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn config(dir: &Path, key: &str, value: Value) {
    edit_json(&dir.join("config.json"), |v| v[key] = value);
}

/// The header length, header text and data of a safetensors file.
fn split(path: &Path) -> (String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (String::from_utf8(bytes[8..8 + n].to_vec()).unwrap(), bytes[8 + n..].to_vec())
}

/// Write a safetensors file from header text (padded to 8 bytes, as the Python writer does).
fn join(path: &Path, header: &str, data: &[u8]) {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

/// Rewrite `model.safetensors`'s header text with `edit`, keeping the data.
fn edit_header(dir: &Path, edit: impl FnOnce(&str) -> String) {
    let path = dir.join("model.safetensors");
    let (header, data) = split(&path);
    join(&path, &edit(header.trim_end()), &data);
}

/// The header entry of tensor `name`, as JSON text.
fn entry(header: &str, name: &str) -> String {
    let v: Value = serde_json::from_str(header).unwrap();
    v[name].to_string()
}

/// Overwrite element `index` of bf16 tensor `name` with the bits `value`.
fn poke_bf16(dir: &Path, name: &str, index: usize, value: u16) {
    let path = dir.join("model.safetensors");
    let (header, mut data) = split(&path);
    let v: Value = serde_json::from_str(&header).unwrap();
    assert_eq!(v[name]["dtype"], "BF16", "the fixture's {name} is bf16");
    let at = v[name]["data_offsets"][0].as_u64().unwrap() as usize + 2 * index;
    data[at..at + 2].copy_from_slice(&value.to_le_bytes());
    join(&path, &header, &data);
}

const NORM: &str = "model.layers.1.post_attention_layernorm.weight";

/// Replace the folder's files with those of fixture `name` (a Qwen3.5 one), less its goldens.
fn use_fixture(dir: &Path, name: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "goldens.json" {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
}

/// The composite Qwen3.5 fixture with `edit` applied to its `text_config`.
fn qwen35_text_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    use_fixture(dir, "qwen35-vl");
    edit_json(&dir.join("config.json"), |v| edit(&mut v["text_config"]));
}

/// How a row calls the example: the model folder, a text or raw bytes.
#[derive(Clone, Copy)]
enum Arg {
    Model,
    Text(&'static str),
    Bytes(&'static [u8]),
}

use Arg::{Bytes, Model, Text};

/// The command a row runs.
#[derive(Clone, Copy)]
enum Program {
    /// The `qwen2_generate` example.
    Example,
    /// `ruda-llm generate` (the row's arguments follow `generate`).
    Generate,
    /// `ruda-llm profile` (the row's arguments follow `profile`).
    Profile,
}

struct Row {
    name: &'static str,
    program: Program,
    /// What breaks the model folder (a copy of the fixture; may be left as it is).
    setup: fn(&Path),
    args: &'static [Arg],
    env: &'static [(&'static str, &'static str)],
    /// Exit status, and a piece of standard error (failures) or standard output (successes).
    status: i32,
    output: &'static str,
    /// The `safetensors` crate accepts the row's file although ours refuses it (it keeps the last
    /// of two equal keys at the top level of the header).
    crate_accepts: bool,
}

const RUN: &[Arg] = &[Model, Text("Hello"), Text("1")];

fn nothing(_: &Path) {}

const fn fails(name: &'static str, setup: fn(&Path), output: &'static str) -> Row {
    Row { name, program: Program::Example, setup, args: RUN, env: &[], status: 1, output, crate_accepts: false }
}

/// A `ruda-llm generate` row with these arguments that fails with `output`.
const fn generate(name: &'static str, args: &'static [Arg], output: &'static str) -> Row {
    Row { args, program: Program::Generate, ..fails(name, nothing, output) }
}

/// A `ruda-llm profile` row with these arguments that fails with `output` (exit status 2).
const fn profile(name: &'static str, args: &'static [Arg], output: &'static str) -> Row {
    Row { args, program: Program::Profile, status: 2, ..fails(name, nothing, output) }
}

/// The table. `{dir}` in an expected message is the model folder.
fn rows() -> Vec<Row> {
    vec![
        // Arguments.
        Row {
            name: "non-UTF-8 model path works as a path",
            setup: nothing,
            args: &[Bytes(b"model-\xff"), Text("Hello"), Text("1")],
            status: 0,
            output: "\"event\":\"generation\"",
            ..fails("", nothing, "")
        },
        Row {
            name: "non-UTF-8 path that does not exist",
            args: &[Bytes(b"missing-\xff"), Text("Hello")],
            output: "missing-\u{fffd}: not a model directory",
            ..fails("", nothing, "")
        },
        Row {
            name: "non-UTF-8 prompt",
            args: &[Model, Bytes(b"Hi \xff\xfe")],
            output: "the prompt is not valid UTF-8 text: \"Hi \u{fffd}\u{fffd}\"",
            ..fails("", nothing, "")
        },
        Row {
            name: "non-UTF-8 MAX_NEW_TOKENS",
            args: &[Model, Text("Hello"), Bytes(b"\xff")],
            output: "MAX_NEW_TOKENS must be a positive integer, got \"\u{fffd}\"",
            ..fails("", nothing, "")
        },
        Row {
            name: "zero RUNS",
            args: &[Model, Text("Hello"), Text("1"), Text("0")],
            output: "RUNS must be a positive integer, got \"0\"",
            ..fails("", nothing, "")
        },
        Row { name: "one argument", args: &[Model], output: "usage: qwen2_generate", ..fails("", nothing, "") },
        Row {
            name: "five arguments",
            args: &[Model, Text("Hello"), Text("1"), Text("1"), Text("1")],
            output: "usage: qwen2_generate",
            ..fails("", nothing, "")
        },
        Row {
            name: "empty prompt",
            args: &[Model, Text("")],
            output: "the prompt is empty",
            ..fails("", nothing, "")
        },
        Row {
            name: "not a folder",
            args: &[Text("/nonexistent/model"), Text("Hello")],
            output: "/nonexistent/model: not a model directory",
            ..fails("", nothing, "")
        },
        // `ruda-llm generate`'s arguments: the examples' rules (a path may be any bytes, the
        // prompt and the numbers must be text), with clap's usage errors, all exit status 1.
        Row {
            status: 0,
            output: "\"event\":\"generation\"",
            ..generate("ruda-llm generate: non-UTF-8 model path works as a path", &[Bytes(b"model-\xff"), Text("Hello"), Text("1")], "")
        },
        generate(
            "ruda-llm generate: non-UTF-8 path that does not exist",
            &[Bytes(b"missing-\xff"), Text("Hello")],
            "missing-\u{fffd}: not a model directory",
        ),
        generate(
            "ruda-llm generate: non-UTF-8 prompt",
            &[Model, Bytes(b"Hi \xff\xfe")],
            "the prompt is not valid UTF-8 text: \"Hi \u{fffd}\u{fffd}\"",
        ),
        generate(
            "ruda-llm generate: non-UTF-8 MAX_NEW_TOKENS",
            &[Model, Text("Hello"), Bytes(b"\xff")],
            "invalid value '\u{fffd}' for '[MAX_NEW_TOKENS]': must be a positive integer",
        ),
        generate(
            "ruda-llm generate: no arguments",
            &[],
            "the following required arguments were not provided:\n  <MODEL_DIR>\n  <PROMPT>",
        ),
        generate(
            "ruda-llm generate: no prompt",
            &[Model],
            "the following required arguments were not provided:\n  <PROMPT>",
        ),
        generate(
            "ruda-llm generate: zero MAX_NEW_TOKENS",
            &[Model, Text("Hello"), Text("0")],
            "invalid value '0' for '[MAX_NEW_TOKENS]': must be a positive integer",
        ),
        generate(
            "ruda-llm generate: negative MAX_NEW_TOKENS",
            &[Model, Text("Hello"), Text("-2")],
            "invalid value '-2' for '[MAX_NEW_TOKENS]': must be a positive integer",
        ),
        generate(
            "ruda-llm generate: zero RUNS",
            &[Model, Text("Hello"), Text("1"), Text("0")],
            "invalid value '0' for '[RUNS]': must be a positive integer",
        ),
        generate(
            "ruda-llm generate: five arguments",
            &[Model, Text("Hello"), Text("1"), Text("1"), Text("1")],
            "unexpected argument '1' found",
        ),
        generate("ruda-llm generate: empty prompt", &[Model, Text("")], "the prompt is empty"),
        generate(
            "ruda-llm generate: not a folder",
            &[Text("/nonexistent/model"), Text("Hello")],
            "/nonexistent/model: not a model directory",
        ),
        Row {
            setup: |d| config(d, "model_type", "llama".into()),
            ..generate(
                "ruda-llm generate: an unknown model_type",
                RUN,
                "config.json: not supported: model_type \"llama\" (only \"qwen2\", \"qwen3\", \"qwen3_moe\", \"qwen3_5_text\", \"qwen3_5\", \"qwen3_5_moe_text\" and \"qwen3_5_moe\" are implemented)",
            )
        },
        Row {
            setup: |d| poke_bf16(d, NORM, 5, 0x7fc1),
            ..generate(
                "ruda-llm generate: NaN in a weight",
                RUN,
                "tensor model.layers.1.post_attention_layernorm.weight holds NaN at element 5",
            )
        },
        Row {
            env: &[("RUDA_CHECK_WEIGHTS", "maybe")],
            ..generate("ruda-llm generate: RUDA_CHECK_WEIGHTS=maybe", RUN, "RUDA_CHECK_WEIGHTS=maybe: expected on or off")
        },
        // Qwen3.5 folders (the composite `qwen3_5` and `qwen3_5_text`), through `ruda-llm generate`.
        Row {
            setup: |d| use_fixture(d, "qwen35-vl"),
            status: 0,
            output: "\"event\":\"generation\"",
            ..generate("ruda-llm generate: the composite Qwen3.5 (its vision tower ignored)", RUN, "")
        },
        Row {
            setup: |d| {
                // A multi-token-prediction head, as released Qwen3.5 checkpoints carry one.
                use_fixture(d, "qwen35-text");
                let path = d.join("model.safetensors");
                let (header, mut data) = split(&path);
                let n = data.len();
                let entry = format!(r#""mtp.fc.weight":{{"dtype":"BF16","shape":[2],"data_offsets":[{n},{}]}}"#, n + 4);
                let header = header.trim_end().replacen('{', &format!("{{{entry},"), 1);
                data.extend([0, 0x3f, 0, 0x3f]);
                join(&path, &header, &data);
            },
            status: 0,
            output: "\"event\":\"generation\"",
            ..generate("ruda-llm generate: Qwen3.5 with an MTP head (ignored)", RUN, "")
        },
        Row {
            setup: |d| {
                use_fixture(d, "qwen35-vl");
                let a_log = "model.language_model.layers.1.linear_attn.A_log";
                edit_header(d, |h| h.replace(&format!("\"{a_log}\""), &format!("\"{a_log}_renamed\"")));
            },
            ..generate(
                "ruda-llm generate: Qwen3.5 without a DeltaNet tensor",
                RUN,
                "1 missing tensor(s) for this qwen3_5_text config: model.language_model.layers.1.linear_attn.A_log",
            )
        },
        Row {
            setup: |d| qwen35_text_config(d, |t| t["linear_conv_kernel_dim"] = 3.into()),
            ..generate(
                "ruda-llm generate: Qwen3.5 conv width that is not the checkpoint's",
                RUN,
                "tensor model.language_model.layers.1.linear_attn.conv1d.weight has shape [112, 1, 4], the config needs [112, 1, 3]",
            )
        },
        Row {
            setup: |d| {
                use_fixture(d, "qwen35-text");
                config(d, "linear_num_value_heads", 3.into());
            },
            ..generate(
                "ruda-llm generate: Qwen3.5 value heads not a multiple of key heads",
                RUN,
                "config.json: linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2",
            )
        },
        Row {
            setup: |d| {
                use_fixture(d, "qwen35-text");
                config(d, "full_attention_interval", 0.into());
            },
            ..generate("ruda-llm generate: Qwen3.5 full_attention_interval 0", RUN, "config.json: full_attention_interval is 0")
        },
        Row {
            setup: |d| {
                qwen35_text_config(d, |t| t["layer_types"] = serde_json::json!(["full_attention", "mamba", "linear_attention"]))
            },
            ..generate(
                "ruda-llm generate: Qwen3.5 unknown layer type",
                RUN,
                "not supported: layer type \"mamba\" of layer 1 (only \"linear_attention\" and \"full_attention\")",
            )
        },
        Row {
            setup: |d| qwen35_text_config(d, |t| t["layer_types"] = serde_json::json!(["full_attention"])),
            ..generate("ruda-llm generate: Qwen3.5 layer_types too short", RUN, "layer_types has 1 entries for 3 layers")
        },
        Row {
            setup: |d| qwen35_text_config(d, |t| t["rope_parameters"]["partial_rotary_factor"] = 0.01.into()),
            ..generate(
                "ruda-llm generate: Qwen3.5 partial RoPE of no dimension",
                RUN,
                "partial_rotary_factor 0.01 of head_dim 32 rotates 0 dimensions",
            )
        },
        Row {
            setup: |d| qwen35_text_config(d, |t| t["quantization_config"] = serde_json::json!({"quant_method": "fp8"})),
            ..generate(
                "ruda-llm generate: Qwen3.5 quantised text model",
                RUN,
                "not supported: text_config.quantization_config (quant_method \"fp8\")",
            )
        },
        Row {
            setup: |d| {
                use_fixture(d, "qwen35-vl");
                edit_json(&d.join("config.json"), |v| v.as_object_mut().unwrap().remove("text_config").map(drop).unwrap());
            },
            ..generate(
                "ruda-llm generate: the composite Qwen3.5 without text_config",
                RUN,
                "config.json: model_type \"qwen3_5\" without a \"text_config\"",
            )
        },
        // Environment variables.
        Row {
            name: "RUDA_CHECK_WEIGHTS=maybe",
            env: &[("RUDA_CHECK_WEIGHTS", "maybe")],
            output: "RUDA_CHECK_WEIGHTS=maybe: expected on or off",
            ..fails("", nothing, "")
        },
        Row {
            name: "RUDA_DTYPE=f64",
            env: &[("RUDA_DTYPE", "f64")],
            output: "RUDA_DTYPE=f64: expected f32, f16 or bf16",
            ..fails("", nothing, "")
        },
        Row {
            name: "RUDA_DEVICE=bogus",
            env: &[("RUDA_DEVICE", "bogus")],
            output: "RUDA_DEVICE",
            ..fails("", nothing, "")
        },
        // config.json and generation_config.json.
        fails("no config.json", |d| std::fs::remove_file(d.join("config.json")).unwrap(), "config.json: No such file"),
        fails(
            "a quantised checkpoint",
            |d| config(d, "quantization_config", serde_json::json!({"quant_method": "awq"})),
            "not supported: quantization_config (quant_method \"awq\")",
        ),
        fails(
            "generation_config.json with a bad value",
            |d| edit_json(&d.join("generation_config.json"), |v| v["top_k"] = "many".into()),
            "generation_config.json: top_k is not a non-negative integer",
        ),
        fails("config.json is not JSON", |d| std::fs::write(d.join("config.json"), "{ not").unwrap(), "config.json: invalid JSON"),
        fails(
            "another architecture",
            |d| config(d, "model_type", "llama".into()),
            "config.json has model_type \"llama\", this loader takes \"qwen2\"",
        ),
        fails("vocab_size is missing", |d| config(d, "vocab_size", Value::Null), "config.json: missing \"vocab_size\""),
        fails(
            "EOS id outside the vocabulary (generation_config.json)",
            |d| edit_json(&d.join("generation_config.json"), |v| v["eos_token_id"] = serde_json::json!([399, 400])),
            "generation_config.json: eos_token_id 400 is outside the model's vocabulary (vocab_size 400",
        ),
        fails(
            "EOS id outside the vocabulary (config.json)",
            |d| {
                std::fs::remove_file(d.join("generation_config.json")).unwrap();
                config(d, "eos_token_id", 4000.into());
            },
            "config.json: eos_token_id 4000 is outside the model's vocabulary",
        ),
        // tokenizer.json.
        fails("no tokenizer.json", |d| std::fs::remove_file(d.join("tokenizer.json")).unwrap(), "tokenizer.json: No such file"),
        fails(
            "tokenizer ids past vocab_size",
            |d| config(d, "vocab_size", 390.into()),
            "tokenizer.json: tokenizer: token \"<|im_end|>\" has id 399, outside the model's vocabulary (vocab_size 390 in config.json; 10 token(s) past it)",
        ),
        fails(
            "tokenizer.json is not a tokenizer",
            |d| std::fs::write(d.join("tokenizer.json"), "{\"model\": 3}").unwrap(),
            "tokenizer.json: tokenizer: cannot load",
        ),
        fails(
            "a chat template that does not compile",
            |d| edit_json(&d.join("tokenizer_config.json"), |v| v["chat_template"] = "{% if %}".into()),
            "chat template (",
        ),
        // The weights' files.
        fails(
            "the index is not JSON",
            |d| std::fs::write(d.join("model.safetensors.index.json"), "{").unwrap(),
            "model.safetensors.index.json: invalid JSON",
        ),
        fails(
            "a shard the index names is missing",
            |d| {
                let (header, _) = split(&d.join("model.safetensors"));
                let names: Value = serde_json::from_str(&header).unwrap();
                let map: serde_json::Map<String, Value> = names
                    .as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| *k != "__metadata__")
                    .map(|k| (k.clone(), "model-00001-of-00002.safetensors".into()))
                    .collect();
                let index = serde_json::json!({"weight_map": map});
                std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
            },
            "model-00001-of-00002.safetensors: No such file or directory",
        ),
        fails(
            "a tensor of a dtype the model layer does not take",
            |d| {
                edit_header(d, |h| {
                    let old = entry(h, NORM);
                    h.replace(&old, &old.replace("BF16", "I16"))
                })
            },
            "not supported: tensor model.layers.1.post_attention_layernorm.weight has dtype i16",
        ),
        fails(
            "no weights",
            |d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
            "no model.safetensors or model.safetensors.index.json in this folder",
        ),
        fails(
            "model.safetensors is a directory",
            |d| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                std::fs::create_dir(d.join("model.safetensors")).unwrap();
            },
            "model.safetensors: is a directory, not a safetensors file",
        ),
        fails(
            "model.safetensors is a dangling symbolic link",
            |d| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                std::os::unix::fs::symlink("gone.safetensors", d.join("model.safetensors")).unwrap();
            },
            "model.safetensors: is a symbolic link to gone.safetensors, which does not exist",
        ),
        fails(
            "the index is a dangling symbolic link",
            |d| std::os::unix::fs::symlink("gone.json", d.join("model.safetensors.index.json")).unwrap(),
            "model.safetensors.index.json: is a symbolic link to gone.json, which does not exist",
        ),
        fails(
            "truncated model.safetensors",
            |d| {
                let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
                std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() - 3]).unwrap();
            },
            "truncated safetensors file: tensor model.norm.weight ends at data byte",
        ),
        fails(
            "header only",
            |d| {
                let (header, _) = split(&d.join("model.safetensors"));
                join(&d.join("model.safetensors"), &header, &[]);
            },
            "truncated safetensors file",
        ),
        fails(
            "trailing bytes after the last tensor",
            |d| {
                let (header, mut data) = split(&d.join("model.safetensors"));
                data.extend([0; 16]);
                join(&d.join("model.safetensors"), &header, &data);
            },
            "16 data bytes after the last tensor, model.norm.weight belong to no tensor",
        ),
        fails(
            "a hole between two tensors",
            |d| {
                // The embedding is the first tensor: it moves 2 bytes on and shrinks by one row.
                let (header, data) = split(&d.join("model.safetensors"));
                let old = entry(&header, "model.embed_tokens.weight");
                let new = old.replace("[400,128]", "[399,128]").replace("[0,102400]", "[256,102400]");
                join(&d.join("model.safetensors"), &header.replace(&old, &new), &data);
            },
            "data bytes 0..256 between the header and tensor model.embed_tokens.weight belong to no tensor",
        ),
        fails(
            "the header is not JSON",
            |d| edit_header(d, |h| h.replacen('{', "#", 1)),
            "model.safetensors: corrupt safetensors header (not JSON",
        ),
        Row {
            name: "a tensor written twice in the header",
            crate_accepts: true,
            ..fails(
                "",
                |d| edit_header(d, |h| format!("{{\"{NORM}\":{},{}", entry(h, NORM), &h[1..])),
                "corrupt safetensors header: key \"model.layers.1.post_attention_layernorm.weight\" appears twice",
            )
        },
        Row {
            name: "a field written twice in a tensor's entry",
            ..fails(
                "",
                |d| {
                    edit_header(d, |h| {
                        let old = entry(h, NORM);
                        h.replace(&old, &old.replace("\"dtype\":\"BF16\"", "\"dtype\":\"F16\",\"dtype\":\"BF16\""))
                    })
                },
                "tensor model.layers.1.post_attention_layernorm.weight: key \"dtype\" appears twice",
            )
        },
        fails(
            "__metadata__ that is not strings",
            |d| edit_header(d, |h| h.replace("{\"format\":\"pt\"}", "{\"format\":1}")),
            "__metadata__ is not a map of strings to strings",
        ),
        fails(
            "a tensor of the wrong shape",
            |d| config(d, "intermediate_size", 64.into()),
            "tensor model.layers.0.mlp.down_proj.weight has shape [128, 96], the config needs [128, 64]",
        ),
        fails(
            "a missing tensor",
            |d| config(d, "tie_word_embeddings", false.into()),
            "1 missing tensor(s) for this qwen2 config: lm_head.weight",
        ),
        // Values.
        fails(
            "NaN in a weight",
            |d| poke_bf16(d, NORM, 5, 0x7fc1),
            "tensor model.layers.1.post_attention_layernorm.weight holds NaN at element 5 (index [5] of shape [128])",
        ),
        fails(
            "-inf in the embedding",
            |d| poke_bf16(d, "model.embed_tokens.weight", 130, 0xff80),
            "tensor model.embed_tokens.weight holds -inf at element 130 (index [1, 2] of shape [400, 128])",
        ),
        // `ruda-llm profile`: analytic, so it needs the config only.
        profile("profile: missing folder", &[Text("missing"), Text("--json")], "missing: not a model directory"),
        profile(
            "profile: unknown GPU",
            &[Model, Text("--gpu"), Text("v100")],
            "invalid value 'v100' for '--gpu <NAME>': unknown GPU `v100` (known: a100, h100-sxm, h200)",
        ),
        profile(
            "profile: zero context",
            &[Model, Text("--context"), Text("0")],
            "invalid value '0' for '--context <N>': must be a positive integer",
        ),
        profile(
            "profile: context beyond max_position_embeddings",
            &[Model, Text("--context=257")],
            "a context of 257 positions: the model supports 1 to 256 (max_position_embeddings)",
        ),
        profile(
            "profile: unknown dtype",
            &[Model, Text("--dtype"), Text("f64")],
            "invalid value 'f64' for '--dtype <f32|f16|bf16>': expected f32, f16 or bf16",
        ),
        Row {
            name: "profile: no weights needed",
            setup: |d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
            status: 0,
            output: "\"estimate\":true",
            ..profile("", &[Model, Text("--json")], "")
        },
        Row {
            name: "NaN in a weight, RUDA_CHECK_WEIGHTS=off",
            setup: |d| poke_bf16(d, NORM, 5, 0x7fc1),
            env: &[("RUDA_CHECK_WEIGHTS", "off")],
            status: 0,
            output: "\"event\":\"generation\"",
            ..fails("", nothing, "")
        },
    ]
}

/// The built examples by name. Under cargo they are (re)built first, so a row never runs a
/// stale binary; without cargo (copied test executables) they are looked up beside this one.
/// The build names the whole workspace, as the README's test command does: with `-p ruda-llm`
/// cargo resolves features for this package alone (serde_json without the server's
/// `raw_value`), a second build of every crate above serde_json: about 2 minutes of both cores
/// inside this test on a fresh clone.
fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<HashMap<String, PathBuf>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/<this test>
        let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        let Some(cargo) = std::env::var_os("CARGO") else {
            let dir = profile_dir.join("examples");
            return ["qwen2_generate", "qwen3_generate"].iter().map(|n| (n.to_string(), dir.join(n))).collect();
        };
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--offline", "--workspace", "--examples", "--message-format=json"]);
        if profile_dir.file_name() == Some(OsStr::new("release")) {
            cmd.arg("--release");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "building the examples: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["kind"][0] == "example")
            .filter_map(|m| Some((m["target"]["name"].as_str()?.to_string(), PathBuf::from(m["executable"].as_str()?))))
            .collect()
    });
    let path = built.get(name).unwrap_or_else(|| panic!("no example {name} was built: {built:?}"));
    assert!(path.exists(), "{} is missing: build the examples (cargo build --workspace --examples)", path.display());
    path.clone()
}

#[test]
fn every_bad_input_is_a_clear_error_with_its_exit_status() {
    let mut failures = Vec::new();
    for row in rows() {
        let folder = Folder::new("row");
        let model = folder.model();
        (row.setup)(&model);
        // A name that is not UTF-8, for the argument rows that use one.
        std::os::unix::fs::symlink(&model, folder.0.join(OsStr::from_bytes(b"model-\xff"))).unwrap();
        let args: Vec<OsString> = row
            .args
            .iter()
            .map(|a| match a {
                Model => model.clone().into_os_string(),
                Text(s) => s.into(),
                Bytes(b) => OsStr::from_bytes(b).to_os_string(),
            })
            .collect();
        let mut cmd = match row.program {
            Program::Example => Command::new(example("qwen2_generate")),
            Program::Generate => {
                let mut cmd = Command::new(common::ruda_llm());
                cmd.arg("generate");
                cmd
            }
            Program::Profile => {
                let mut cmd = Command::new(common::ruda_llm());
                cmd.arg("profile");
                cmd
            }
        };
        cmd.args(&args).current_dir(&folder.0).env("RUDA_DEVICE", "cpu");
        for var in ["RUDA_CHECK_WEIGHTS", "RUDA_DTYPE"] {
            cmd.env_remove(var);
        }
        cmd.envs(row.env.iter().copied());
        let out = cmd.output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let shown = if row.status == 0 { &stdout } else { &stderr };
        if out.status.code() != Some(row.status) || !shown.contains(row.output) {
            failures.push(format!(
                "{}: exit {:?} (want {}), expected {:?} in\n  stdout: {stdout}\n  stderr: {stderr}",
                row.name,
                out.status.code(),
                row.status,
                row.output
            ));
        }
        if row.status != 0 && !stderr.starts_with("error: ") {
            failures.push(format!("{}: standard error does not start with \"error: \": {stderr}", row.name));
        }
        let weights = model.join("model.safetensors");
        if weights.is_file() {
            if let Err(e) = cross_check(&weights, row.crate_accepts) {
                failures.push(format!("{}: {e}", row.name));
            }
        }
    }
    assert!(failures.is_empty(), "{} row(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// A tensor as both parsers see it: name, dtype, shape, byte range within the data.
type Tensor = (String, String, Vec<usize>, (usize, usize));

/// Our parser against the `safetensors` crate on one file: `Ok(None)` when both accept it with
/// the same tensor names, dtypes, shapes and byte ranges, or both refuse it; `Ok(Some(error))`
/// when only ours refuses it; `Err` for any other disagreement.
fn compare(path: &Path) -> Result<Option<LoadError>, String> {
    let bytes = std::fs::read(path).unwrap();
    let theirs = safetensors::SafeTensors::read_metadata(&bytes);
    match (SafetensorsFile::open(path), theirs) {
        (Ok(ours), Ok((n, meta))) => {
            let data_start = 8 + n;
            let mut theirs: Vec<Tensor> = meta
                .tensors()
                .into_iter()
                .map(|(name, t)| (name, format!("{:?}", t.dtype), t.shape.clone(), t.data_offsets))
                .collect();
            theirs.sort();
            let ours: Vec<Tensor> = ours
                .tensors()
                .iter()
                .map(|(name, t)| {
                    let range = (t.range.start - data_start, t.range.end - data_start);
                    (name.clone(), t.dtype.name().to_uppercase(), t.shape.clone(), range)
                })
                .collect();
            (ours == theirs)
                .then_some(None)
                .ok_or_else(|| format!("{}: ours {ours:?}\ntheirs {theirs:?}", path.display()))
        }
        (Err(_), Err(_)) => Ok(None),
        (Err(ours), Ok(_)) => Ok(Some(ours)),
        (Ok(_), Err(theirs)) => Err(format!("{}: ours accepts it, the crate refuses it: {theirs}", path.display())),
    }
}

/// [`compare`], where only a file the crate is known to accept and ours refuses (a duplicate
/// top-level key, `crate_accepts`) may differ.
fn cross_check(path: &Path, crate_accepts: bool) -> Result<(), String> {
    match compare(path)? {
        None if crate_accepts => Err(format!("{}: expected only our parser to refuse it", path.display())),
        Some(ours) if !crate_accepts => Err(format!("{}: only ours refuses it: {ours}", path.display())),
        _ => Ok(()),
    }
}

/// Every committed safetensors file: the test fixtures and the bundled tiny models.
#[test]
fn committed_files_read_the_same_with_the_safetensors_crate() {
    let models = fixture("").parent().and_then(Path::parent).unwrap().join("models");
    let mut checked = 0;
    for root in [fixture(""), models] {
        for dir in std::fs::read_dir(&root).unwrap() {
            let path = dir.unwrap().path().join("model.safetensors");
            if path.is_file() {
                cross_check(&path, false).unwrap();
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} committed safetensors files found");
}

/// `PipelineOptions::check_weights` decides over `RUDA_CHECK_WEIGHTS`.
#[test]
fn the_pipeline_option_turns_the_weight_check_off_and_on() {
    let folder = Folder::new("option");
    poke_bf16(&folder.model(), NORM, 7, 0x7f80);
    let load = |check_weights| {
        let options = PipelineOptions { device: Some(common::device()), check_weights, ..Default::default() };
        load_pipeline(folder.model(), &options).err().map(|e| e.to_string())
    };
    let refused = format!("tensor {NORM} holds inf at element 7");
    // `None` reads the variable: it refuses only when the variable leaves the default.
    let default = std::env::var_os("RUDA_CHECK_WEIGHTS").is_none_or(|v| v == "on");
    for check in [Some(true)].into_iter().chain(default.then_some(None)) {
        let e = load(check).unwrap_or_else(|| panic!("check_weights {check:?}: loaded"));
        assert!(e.contains(&refused), "{e}");
    }
    assert_eq!(load(Some(false)), None);
}

/// A differential fuzz of the header: two thousand small corruptions of a file the crate wrote
/// (bytes of its header changed to JSON's punctuation, digits and letters; its length field and
/// its end changed), each read by both parsers. Neither may panic; ours may refuse beyond the
/// crate only a duplicate key or a dtype the model layer does not hold.
#[test]
fn corrupted_headers_get_the_crates_verdict() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let data: Vec<u8> = (0..=255).cycle().take(2 * 3 * 4 + 5 * 2 + 4 * 2 + 3).collect();
    let views = [
        ("a.weight", Dtype::F32, vec![2, 3], &data[..24]),
        ("a.bias", Dtype::BF16, vec![5], &data[24..34]),
        ("b.0", Dtype::F16, vec![2, 2], &data[34..42]),
        ("b.1", Dtype::U8, vec![3], &data[42..45]),
        ("empty", Dtype::I32, vec![0, 4], &data[45..45]),
    ];
    let tensors: Vec<(&str, TensorView)> =
        views.iter().map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let metadata = Some([("format".to_string(), "pt".to_string())].into_iter().collect());
    let good = safetensors::serialize(tensors, metadata).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;

    let folder = Folder::new("fuzz");
    let path = folder.0.join("f.safetensors");
    std::fs::write(&path, &good).unwrap();
    assert!(matches!(compare(&path), Ok(None)), "the crate's own file: {:?}", compare(&path));
    let alphabet = b"{}[]\",:0123456789 .-eEaFUIBx_";
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        // xorshift64*: deterministic, so a failure replays.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    };
    let (mut accepted, mut failures) = (0, Vec::new());
    for case in 0..2000 {
        let mut bytes = good.clone();
        match next(20) {
            0 => bytes[next(8)] = next(256) as u8,
            1 => bytes.truncate(next(bytes.len())),
            2 => bytes.extend(std::iter::repeat_n(0, 1 + next(8))),
            _ => {
                for _ in 0..1 + next(3) {
                    bytes[8 + next(header_len)] = alphabet[next(alphabet.len())];
                }
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        match compare(&path) {
            Ok(None) => accepted += usize::from(safetensors::SafeTensors::read_metadata(&bytes).is_ok()),
            Ok(Some(e)) if e.to_string().contains("appears twice") || matches!(e, LoadError::Unsupported { .. }) => {}
            Ok(Some(e)) => failures.push(format!("case {case}: only ours refuses: {e}")),
            Err(e) => failures.push(format!("case {case}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} disagreement(s):\n{}", failures.len(), failures.join("\n"));
    // Some corruptions leave a valid file (a renamed tensor, a changed metadata value).
    assert!(accepted > 20, "only {accepted} corrupted files were valid: the corruptions are too coarse");
}
