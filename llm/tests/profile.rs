//! `ruda-llm profile` as a built binary: its JSON keys, its bytes against a hand count from the
//! fixture's config and its safetensors header (read by the `safetensors` crate, not ours), and
//! the table's labels.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{fixture, ruda_llm};

fn profile(dir: &Path, flags: &[&str]) -> Output {
    Command::new(ruda_llm()).arg("profile").arg(dir).args(flags).output().expect("ruda-llm runs")
}

fn json(dir: &Path, flags: &[&str]) -> Value {
    let out = profile(dir, &[flags, &["--json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not a count: {v}"))
}

/// The device bytes of the checkpoint's tensors in `elem`-byte elements, norm gammas in f32
/// (what the loader keeps on the device), and the element count of the embedding.
fn header_count(dir: &Path, elem: u64) -> (u64, u64) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tied = config(dir)["tie_word_embeddings"].as_bool().unwrap();
    let (mut total, mut embedding) = (0, 0);
    for (name, view) in file.tensors() {
        let numel = view.shape().iter().product::<usize>() as u64;
        if tied && name == "lm_head.weight" {
            continue;
        }
        total += numel * if name.ends_with("norm.weight") { 4 } else { elem };
        if name == "model.embed_tokens.weight" {
            embedding = numel;
        }
    }
    (total, embedding)
}

#[test]
fn profile_json_counts_the_weights_and_kv_cache_by_hand() {
    for (name, dtype, elem, context) in [("qwen3", "bf16", 2, 200), ("qwen2-untied", "f32", 4, 17)] {
        let dir = fixture(name);
        let v = json(&dir, &["--context", &context.to_string(), "--dtype", dtype]);
        for key in [
            "estimate",
            "note",
            "model",
            "gpu",
            "context",
            "dtype",
            "launches",
            "bytes",
            "flops",
            "weight_bytes",
            "kv_bytes",
            "ideal_bytes",
            "total_us",
            "ideal_us",
            "fraction_of_roofline",
            "worst",
        ] {
            assert!(v.get(key).is_some(), "{name}: no `{key}` in {v}");
        }
        assert_eq!(v["estimate"], true);
        assert!(v["note"].as_str().unwrap().starts_with("ESTIMATE"));
        assert_eq!((v["gpu"].as_str(), v["dtype"].as_str(), n(&v, "context")), (Some("h200"), Some(dtype), context));

        let c = config(&dir);
        let count = |k: &str| c[k].as_u64().unwrap();
        let (layers, kv_heads, hidden) =
            (count("num_hidden_layers"), count("num_key_value_heads"), count("hidden_size"));
        let head_dim = c["head_dim"].as_u64().unwrap_or(hidden / count("num_attention_heads"));
        let (weights, embedding) = header_count(&dir, elem);
        assert_eq!(n(&v, "weight_bytes"), weights, "{name}: weights");
        let kv = 2 * layers * kv_heads * head_dim * context * elem;
        assert_eq!(n(&v, "kv_bytes"), kv, "{name}: KV cache");
        // A step reads every weight once, the embedding table only for its one row (and again
        // whole as a tied lm_head).
        let untied_table = if c["tie_word_embeddings"] == true { 0 } else { embedding * elem };
        assert_eq!(n(&v, "ideal_bytes"), weights - untied_table + hidden * elem + kv, "{name}: ideal");

        let launches = v["launches"].as_array().unwrap();
        let sum = |key: &str| launches.iter().map(|l| l[key].as_f64().unwrap()).sum::<f64>();
        assert_eq!(sum("bytes") as u64, n(&v, "bytes"));
        assert_eq!(sum("kv_bytes") as u64, kv);
        assert!((sum("roofline_us") - v["total_us"].as_f64().unwrap()).abs() < 1e-9);
        for l in launches {
            for key in ["op", "kernel", "bytes", "flops", "roofline_us", "bound"] {
                assert!(l.get(key).is_some(), "{name}: no `{key}` in {l}");
            }
            assert!(["memory", "compute"].contains(&l["bound"].as_str().unwrap()), "{l}");
            assert_eq!(n(l, "bytes"), n(l, "bytes_read") + n(l, "bytes_written"));
        }
        // The peak: H200's 4.8 TB/s.
        let ideal_us = n(&v, "ideal_bytes") as f64 / 4.8e12 * 1e6;
        assert!((v["ideal_us"].as_f64().unwrap() - ideal_us).abs() < 1e-9 * ideal_us.max(1.0));
        let fraction = v["fraction_of_roofline"].as_f64().unwrap();
        assert!(fraction > 0.0 && fraction <= 1.0, "{name}: {fraction}");
        let worst = v["worst"].as_array().unwrap();
        assert_eq!(worst.len(), 5);
        let excess: Vec<f64> = worst.iter().map(|w| w["excess_us"].as_f64().unwrap()).collect();
        assert!(excess.windows(2).all(|p| p[0] >= p[1]), "{excess:?}");
    }
}

#[test]
fn profile_defaults_and_the_table_say_estimate() {
    let dir = fixture("qwen3");
    let v = json(&dir, &[]);
    // 4096 capped at the fixture's max_position_embeddings; bf16; H200.
    assert_eq!((n(&v, "context"), v["dtype"].as_str(), v["gpu"].as_str()), (256, Some("bf16"), Some("h200")));
    let a100 = json(&dir, &["--gpu", "a100"]);
    assert!(a100["total_us"].as_f64().unwrap() > v["total_us"].as_f64().unwrap(), "A100 has less bandwidth");
    let out = profile(&dir, &[]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("ESTIMATE"), "{table}");
    for label in ["sum of", "ideal", "fraction of roofline", "furthest short"] {
        let line = table.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label} in {table}"));
        assert!(line.contains("ESTIMATE"), "{line}");
    }
    assert!(table.contains("attention_decode.bf16.d64") && table.contains("lm_head"), "{table}");
}
