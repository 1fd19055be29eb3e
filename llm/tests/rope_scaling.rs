//! Scaled rotary embeddings (`rope_scaling` / `rope_parameters`: linear, dynamic, YaRN) against
//! transformers' rotary embedding of the same `config.json` (`scripts/fixtures/rope_goldens.py`):
//! the config parse, the inverse frequencies, the attention factor and the `cos`/`sin` table.

use std::path::Path;

use crate::common::{device, fixture};
use ruda_llm::parse_config;
use ruda_ops::api::{RopeScaling, RopeTable};
use serde_json::{json, Value};

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn cases() -> Vec<Value> {
    let path = fixture("rope_scaling.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

/// `config` as a checkpoint's `config.json` carries it (nulls dropped, as the script drops them
/// before building transformers' config).
fn config_json(case: &Value) -> Value {
    let mut c = case["config"].clone();
    c.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    c
}

/// Units in the last place between two `f32`s of one sign.
fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn scaled_rope_tables_match_transformers() {
    let dev = device();
    let cases = cases();
    assert!(cases.len() >= 9, "the fixture lost cases");
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let config =
            parse_config(Path::new("config.json"), &config_json(case)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want_inv = floats(&case["inv_freq"]);
        assert_eq!(config.rotary_dim, 2 * want_inv.len(), "{name}: rotary dims");

        // The frequencies to within one unit in the last place (transformers' pow is
        // vectorised f32, ours the correctly rounded one), the attention factor exactly.
        let (inv, scaling) = config.rope_scaling.inv_freq(config.rope_theta, config.rotary_dim);
        for (i, (got, want)) in inv.iter().zip(&want_inv).enumerate() {
            assert!(ulps(*got, *want) <= 1, "{name}: inv_freq[{i}] = {got:e}, transformers {want:e}");
        }
        assert_eq!(scaling, case["attention_scaling"].as_f64().unwrap() as f32, "{name}: attention scaling");

        // The table at the fixture's positions: `p · inv_freq` is the same f32 product on both
        // sides, so the values differ by the cosine's rounding (f64 here, f32 in torch) plus
        // what a frequency's last bit moves the angle at position p.
        let positions: Vec<usize> =
            case["positions"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as usize).collect();
        let rows = positions.iter().max().unwrap() + 1;
        let table = RopeTable::scaled(&dev, config.rope_theta, config.rotary_dim, rows, &config.rope_scaling).unwrap();
        let (cos, sin) = (table.cos().to_f32_vec().unwrap(), table.sin().to_f32_vec().unwrap());
        let half = want_inv.len();
        for (k, &p) in positions.iter().enumerate() {
            for (what, got, want) in [("cos", &cos, &case["cos"][k]), ("sin", &sin, &case["sin"][k])] {
                for (i, want) in floats(want).iter().enumerate() {
                    let got = got[p * half + i];
                    let bound = (4e-7 + p as f32 * (inv[i] - want_inv[i]).abs()) * scaling;
                    assert!((got - want).abs() <= bound, "{name}: {what}[{p}, {i}] = {got}, transformers {want}");
                }
            }
        }
    }
}

/// Each scaling type changes what it should: YaRN keeps the fastest frequencies, divides the
/// slowest by the factor and scales `cos`/`sin`; linear divides them all; dynamic changes none.
#[test]
fn each_scaling_type_has_its_shape() {
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let config = parse_config(Path::new("config.json"), &config_json(&case)).unwrap();
        let plain = RopeScaling::None.inv_freq(config.rope_theta, config.rotary_dim).0;
        let (scaled, attention) = config.rope_scaling.inv_freq(config.rope_theta, config.rotary_dim);
        let last = plain.len() - 1;
        match &config.rope_scaling {
            RopeScaling::None => assert_eq!(scaled, plain, "{name}"),
            RopeScaling::Linear { factor } => {
                assert!((plain[last] / scaled[last] - *factor as f32).abs() < 1e-5, "{name}");
                assert_eq!(attention, 1.0);
            }
            RopeScaling::Yarn(y) => {
                assert_eq!(scaled[0], plain[0], "{name}: the fastest frequency is kept");
                assert!((plain[last] / scaled[last] - y.factor as f32).abs() < 1e-4, "{name}: the slowest is divided");
                assert!(attention > 1.0, "{name}: attention factor {attention}");
            }
        }
    }
}

#[test]
fn bad_scaling_parameters_are_clear_errors() {
    let base = json!({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32});
    let with = |scaling: Value| {
        let mut v = base.clone();
        v["rope_scaling"] = scaling;
        parse_config(Path::new("config.json"), &v)
    };
    for (scaling, want) in [
        (
            json!({"rope_type": "yarn", "factor": -2.0, "original_max_position_embeddings": 4096}),
            "factor -2 is not a positive",
        ),
        (json!({"rope_type": "yarn", "factor": "4"}), "rope_scaling.factor is not a number"),
        (
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
            "original_max_position_embeddings 0",
        ),
        (json!({"rope_type": "yarn", "factor": 4.0, "truncate": "yes"}), "truncate is not true or false"),
        (json!({"rope_type": "linear"}), "of rope_type \"linear\" has no factor"),
        (json!({"rope_type": "dynamic", "factor": 0}), "factor 0 is not a positive"),
        (json!({"rope_type": "llama3", "factor": 8.0}), "rope_type \"llama3\" (default, linear, dynamic and yarn"),
        (json!({"rope_type": 3}), "rope_type is not a string"),
        (json!([1, 2]), "rope_scaling is not an object"),
        (json!({"full_attention": {"rope_type": "default"}}), "per layer type (\"full_attention\")"),
    ] {
        let e = with(scaling.clone()).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("config.json"), "{scaling}: expected {want:?} in: {e}");
    }
    // Parameters that parse but make no sense, checked as the ops layer would.
    for (scaling, want) in [
        (json!({"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.0}), "YaRN's attention_factor must be"),
        (
            json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 8}),
            "beta_fast 1 is below its beta_slow 8",
        ),
    ] {
        let e = with(scaling.clone()).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("rope_scaling"), "{scaling}: expected {want:?} in: {e}");
        let c = with(json!({"rope_type": "yarn", "factor": 4.0})).unwrap();
        let RopeScaling::Yarn(mut y) = c.rope_scaling else { panic!("{scaling}: not YaRN") };
        (y.attention_factor, y.beta_fast, y.beta_slow) = (0.0, 1.0, 8.0);
        let e = RopeTable::scaled(&device(), c.rope_theta, c.rotary_dim, 8, &RopeScaling::Yarn(y)).unwrap_err();
        assert!(e.to_string().contains("YaRN's"), "{e}");
    }
    // An empty or null rope_scaling is no scaling (transformers' `rope_scaling or rope_parameters`).
    for scaling in [json!({}), Value::Null] {
        assert_eq!(with(scaling).unwrap().rope_scaling, RopeScaling::None);
    }
}
