//! Qwen3-MoE beyond its goldens: the two checkpoint layouts of the routed experts (per expert, and
//! fused `gate_up_proj` / `down_proj`) give the same model, a checkpoint mixing them is refused,
//! and the MoE fields of `config.json` are validated with errors naming them. Qwen3.5-MoE: its
//! composite and per-expert checkpoints load as the same model, and its fields take
//! transformers' defaults.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ruda_llm::{
    architecture, expected_tensors, load_config, load_pipeline, parse_config, ExpertsLayout, ModelType,
    PipelineOptions, Weights,
};
use ruda_runtime::DType;
use safetensors::tensor::TensorView;
use serde_json::Value;

use crate::common::{device, fixture};

/// A fresh folder under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ruda-llm-moe-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The qwen3-moe fixture with its experts fused as transformers 5 holds them: per sparse layer
/// `mlp.experts.gate_up_proj [E, 2I, H]` (each expert's gate rows, then its up rows) and
/// `mlp.experts.down_proj [E, H, I]`; `extra` per-expert tensors are kept as well.
fn fused_copy(extra: &[&str]) -> TempDir {
    let src = fixture("qwen3-moe");
    let dir = TempDir::new("fused");
    for f in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.0.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let config = load_config(&src).unwrap();
    let moe = config.moe.as_ref().unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        if !name.contains(".mlp.experts.") || extra.contains(&name.as_str()) {
            owned.push((name.clone(), view.dtype(), view.shape().to_vec(), view.data().to_vec()));
        }
    }
    let (e, h, i) = (moe.num_experts, config.hidden_size, moe.intermediate_size);
    for l in (0..config.num_hidden_layers).filter(|&l| moe.sparse_layers[l]) {
        let p = format!("model.layers.{l}.mlp.experts");
        let part = |x: usize, what: &str| st.tensor(&format!("{p}.{x}.{what}.weight")).unwrap();
        let dtype = part(0, "down_proj").dtype();
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for x in 0..e {
            gate_up.extend_from_slice(part(x, "gate_proj").data());
            gate_up.extend_from_slice(part(x, "up_proj").data());
            down.extend_from_slice(part(x, "down_proj").data());
        }
        owned.push((format!("{p}.gate_up_proj"), dtype, vec![e, 2 * i, h], gate_up));
        owned.push((format!("{p}.down_proj"), dtype, vec![e, h, i], down));
    }
    let views: Vec<(String, TensorView)> =
        owned.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.0.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    dir
}

fn logits(dir: &Path, dtype: DType, ids: &[u32]) -> Vec<f32> {
    let options = PipelineOptions { device: Some(device()), dtype: Some(dtype), ..Default::default() };
    load_pipeline(dir, &options).unwrap().logits(ids, 8).unwrap()
}

/// Fused and per-expert checkpoints of the same weights give bit-identical logits at every
/// position, in f32 (SIMT grouped GEMMs) and bf16 (tensor cores), over chunks of 8 of 19 tokens.
#[test]
fn both_expert_layouts_give_identical_logits() {
    let fused = fused_copy(&[]);
    let config = load_config(&fused.0).unwrap();
    let weights = Weights::load(&fused.0, &config).unwrap();
    assert!(weights.tensors().contains_key("model.layers.2.mlp.experts.gate_up_proj"));
    assert!(!weights.tensors().contains_key("model.layers.2.mlp.experts.0.up_proj.weight"));
    let ids: Vec<u32> = (0..19).map(|i| (i * 53 + 7) % 400).collect();
    for dtype in [DType::F32, DType::BF16] {
        let (a, b) = (logits(&fixture("qwen3-moe"), dtype, &ids), logits(&fused.0, dtype, &ids));
        assert_eq!(a.len(), ids.len() * config.vocab_size);
        assert!(a.iter().all(|x| x.is_finite()));
        assert!(a == b, "{dtype}: the fused checkpoint's logits differ from the per-expert one's");
    }
}

/// A checkpoint holding both layouts of a layer is refused, naming the leftover tensor.
#[test]
fn a_checkpoint_mixing_the_layouts_is_refused() {
    let leftover = "model.layers.0.mlp.experts.3.up_proj.weight";
    let mixed = fused_copy(&[leftover]);
    let config = load_config(&mixed.0).unwrap();
    let err = Weights::load(&mixed.0, &config).err().expect("a mixed checkpoint loads").to_string();
    assert!(err.contains("unexpected tensor") && err.contains(leftover), "{err}");
}

fn moe_config(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Result<ruda_llm::ModelConfig, String> {
    let text = std::fs::read_to_string(fixture("qwen3-moe").join("config.json")).unwrap();
    let mut json: Value = serde_json::from_str(&text).unwrap();
    edit(json.as_object_mut().unwrap());
    parse_config(Path::new("config.json"), &json).map_err(|e| e.to_string())
}

#[test]
fn the_moe_fields_are_read_as_transformers_reads_them() {
    let c = moe_config(|_| {}).unwrap();
    assert_eq!(c.model_type, ModelType::Qwen3Moe);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob), (6, 2, 40, false));
    assert_eq!(moe.sparse_layers, [true, false, true]);
    assert_eq!(moe.experts_layout, ExpertsLayout::PerExpert);
    // No head_dim: hidden / heads, as transformers' modeling code takes it.
    assert_eq!(
        moe_config(|j| {
            j.remove("head_dim");
        })
        .unwrap()
        .head_dim,
        16
    );
    // `num_experts` is the same field as `num_local_experts`.
    let c = moe_config(|j| {
        j.remove("num_local_experts");
        j.insert("num_experts".into(), 4.into());
        j.insert("decoder_sparse_step".into(), 2.into());
        j.insert("mlp_only_layers".into(), Value::Null);
        j.insert("norm_topk_prob".into(), true.into());
    })
    .unwrap();
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.norm_topk_prob), (4, true));
    // Sparse where (layer + 1) % 2 == 0.
    assert_eq!(moe.sparse_layers, [false, true, false]);
    let names: Vec<String> = architecture(c.model_type).tensors(&c).into_iter().map(|t| t.name).collect();
    assert!(names.contains(&"model.layers.1.mlp.gate.weight".into()));
    assert!(names.contains(&"model.layers.1.mlp.experts.3.down_proj.weight".into()));
    assert!(names.contains(&"model.layers.0.mlp.gate_proj.weight".into()));
    assert!(!names.iter().any(|n| n.starts_with("model.layers.0.mlp.experts")));
    // The fused layout's declaration.
    let fused = expected_tensors(&c.with_experts_layout(ExpertsLayout::Fused));
    let shape = |n: &str| fused.iter().find(|t| t.name == n).map(|t| t.shape.clone());
    assert_eq!(shape("model.layers.1.mlp.experts.gate_up_proj"), Some(vec![4, 80, 64]));
    assert_eq!(shape("model.layers.1.mlp.experts.down_proj"), Some(vec![4, 64, 40]));
    assert_eq!(shape("model.layers.1.mlp.experts.0.gate_proj.weight"), None);
}

/// A change to a config's JSON object.
type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;

#[test]
fn bad_moe_fields_are_errors_naming_them() {
    let cases: Vec<(&str, Edit)> = vec![
        (
            "num_experts",
            Box::new(|j| {
                j.remove("num_local_experts");
            }),
        ),
        (
            "num_experts_per_tok",
            Box::new(|j| {
                j.remove("num_experts_per_tok");
            }),
        ),
        (
            "moe_intermediate_size",
            Box::new(|j| {
                j.remove("moe_intermediate_size");
            }),
        ),
        (
            "num_experts_per_tok 7 must be in 1..=6",
            Box::new(|j| {
                j.insert("num_experts_per_tok".into(), 7.into());
            }),
        ),
        (
            "num_experts_per_tok 0",
            Box::new(|j| {
                j.insert("num_experts_per_tok".into(), 0.into());
            }),
        ),
        (
            "num_experts 0",
            Box::new(|j| {
                j.insert("num_local_experts".into(), 0.into());
            }),
        ),
        (
            "num_experts 2000",
            Box::new(|j| {
                j.insert("num_local_experts".into(), 2000.into());
            }),
        ),
        (
            "moe_intermediate_size is 0",
            Box::new(|j| {
                j.insert("moe_intermediate_size".into(), 0.into());
            }),
        ),
        (
            "decoder_sparse_step is 0",
            Box::new(|j| {
                j.insert("decoder_sparse_step".into(), 0.into());
            }),
        ),
        (
            "layer 3 of a model of 3 layers",
            Box::new(|j| {
                j.insert("mlp_only_layers".into(), vec![3].into());
            }),
        ),
        (
            "mlp_only_layers holds \"a\"",
            Box::new(|j| {
                j.insert("mlp_only_layers".into(), vec!["a"].into());
            }),
        ),
        (
            "mlp_only_layers is not a list",
            Box::new(|j| {
                j.insert("mlp_only_layers".into(), 1.into());
            }),
        ),
        (
            "num_experts 5 and num_local_experts 6 disagree",
            Box::new(|j| {
                j.insert("num_experts".into(), 5.into());
            }),
        ),
    ];
    for (want, edit) in cases {
        let err = moe_config(edit).err().unwrap_or_else(|| panic!("accepted a config without {want}"));
        assert!(err.contains(want), "{want}: {err}");
    }
}

/// The qwen35-moe fixture rewritten: `rename` maps each tensor name (`None` drops it), `config`
/// edits its `config.json`, and `split` replaces the fused experts by per-expert tensors named
/// with `rename`'s prefix.
fn qwen35_moe_copy(
    tag: &str,
    rename: impl Fn(&str) -> Option<String>,
    config: impl FnOnce(Value) -> Value,
    split: bool,
) -> TempDir {
    let src = fixture("qwen35-moe");
    let dir = TempDir::new(tag);
    for f in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.0.join(f)).unwrap();
    }
    let json: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    std::fs::write(dir.0.join("config.json"), serde_json::to_string_pretty(&config(json)).unwrap()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let Some(new) = rename(&name) else { continue };
        let fused = name.ends_with(".mlp.experts.gate_up_proj") || name.ends_with(".mlp.experts.down_proj");
        if !(split && fused) {
            owned.push((new, view.dtype(), view.shape().to_vec(), view.data().to_vec()));
            continue;
        }
        // [E, rows, cols] into E tensors [rows, cols]; gate_up's rows are each expert's gate
        // rows, then its up rows.
        let (e, rows, cols) = (view.shape()[0], view.shape()[1], view.shape()[2]);
        let width = view.data().len() / (e * rows * cols);
        let prefix = new.rsplit_once('.').unwrap().0.to_string();
        for x in 0..e {
            let expert = &view.data()[x * rows * cols * width..][..rows * cols * width];
            if name.ends_with("gate_up_proj") {
                let half = rows / 2 * cols * width;
                for (part, data) in [("gate_proj", &expert[..half]), ("up_proj", &expert[half..])] {
                    owned.push((
                        format!("{prefix}.{x}.{part}.weight"),
                        view.dtype(),
                        vec![rows / 2, cols],
                        data.to_vec(),
                    ));
                }
            } else {
                owned.push((format!("{prefix}.{x}.down_proj.weight"), view.dtype(), vec![rows, cols], expert.to_vec()));
            }
        }
    }
    let views: Vec<(String, TensorView)> =
        owned.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.0.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    dir
}

/// The composite `qwen3_5_moe` (its `text_config`, the text under `model.language_model.`, a
/// vision tower and an MTP head to ignore), and the text model with its experts stored per
/// expert, give the fixture's logits bit for bit, in f32 and bf16.
#[test]
fn qwen35_moe_composite_and_per_expert_checkpoints_are_the_same_model() {
    let composite = qwen35_moe_copy(
        "composite",
        |n| Some(n.replacen("model.", "model.language_model.", 1)),
        |text| {
            let tie = text["tie_word_embeddings"].clone();
            serde_json::json!({
                "model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                "text_config": text, "vision_config": {"depth": 1}, "tie_word_embeddings": tie,
            })
        },
        false,
    );
    // A vision tensor and an MTP tensor the text model ignores.
    let extra = composite.0.join("model.safetensors");
    let bytes = std::fs::read(&extra).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let zeros = vec![0u8; 8];
    let mut views: Vec<(String, TensorView)> = st.tensors();
    for name in ["model.visual.patch_embed.proj.weight", "mtp.fc.weight"] {
        views.push((name.into(), TensorView::new(safetensors::Dtype::BF16, vec![2, 2], &zeros).unwrap()));
    }
    let written = safetensors::serialize(views, None).unwrap();
    drop(st);
    std::fs::write(&extra, written).unwrap();
    let c = load_config(&composite.0).unwrap();
    assert_eq!((c.model_type, c.text_prefix), (ModelType::Qwen35Moe, "model.language_model."));
    assert!(ModelType::Qwen35Moe.accepts("qwen3_5_moe") && ModelType::Qwen35Moe.accepts("qwen3_5_moe_text"));

    let per_expert = qwen35_moe_copy("per-expert", |n| Some(n.to_string()), |c| c, true);
    let weights = Weights::load(&per_expert.0, &load_config(&per_expert.0).unwrap()).unwrap();
    assert!(weights.tensors().contains_key("model.layers.1.mlp.experts.4.up_proj.weight"));
    assert!(!weights.tensors().contains_key("model.layers.1.mlp.experts.gate_up_proj"));

    let ids: Vec<u32> = (0..19).map(|i| (i * 53 + 7) % 400).collect();
    for dtype in [DType::F32, DType::BF16] {
        let want = logits(&fixture("qwen35-moe"), dtype, &ids);
        assert!(want.iter().all(|x| x.is_finite()));
        assert!(logits(&composite.0, dtype, &ids) == want, "{dtype}: the composite's logits differ");
        assert!(logits(&per_expert.0, dtype, &ids) == want, "{dtype}: the per-expert checkpoint's logits differ");
    }
}

fn qwen35_moe_config(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Result<ruda_llm::ModelConfig, String> {
    let text = std::fs::read_to_string(fixture("qwen35-moe").join("config.json")).unwrap();
    let mut json: Value = serde_json::from_str(&text).unwrap();
    edit(json.as_object_mut().unwrap());
    parse_config(Path::new("config.json"), &json).map_err(|e| e.to_string())
}

/// Qwen3.5-MoE's fields as `Qwen3_5MoeTextConfig` reads them: every layer sparse, routing always
/// renormalised (`norm_topk_prob`, `decoder_sparse_step` and `mlp_only_layers` are not its
/// fields), transformers' defaults for the absent sizes; the shared expert's tensors declared.
#[test]
fn qwen35_moe_fields_are_read_as_transformers_reads_them() {
    let c = qwen35_moe_config(|j| {
        j.insert("norm_topk_prob".into(), false.into());
        j.insert("mlp_only_layers".into(), vec![0].into());
    })
    .unwrap();
    assert_eq!(c.model_type, ModelType::Qwen35Moe);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob), (5, 3, 24, true));
    assert_eq!(
        (moe.sparse_layers.as_slice(), moe.shared_expert_intermediate_size),
        ([true, true].as_slice(), Some(32))
    );
    assert_eq!((moe.experts_layout, c.intermediate_size), (ExpertsLayout::Fused, 32));
    let tensors = expected_tensors(&c);
    let shape = |n: &str| tensors.iter().find(|t| t.name == n).map(|t| t.shape.clone());
    let p = "model.layers.0.mlp";
    assert_eq!(shape(&format!("{p}.gate.weight")), Some(vec![5, 48]));
    assert_eq!(shape(&format!("{p}.experts.gate_up_proj")), Some(vec![5, 48, 48]));
    assert_eq!(shape(&format!("{p}.shared_expert.gate_proj.weight")), Some(vec![32, 48]));
    assert_eq!(shape(&format!("{p}.shared_expert.down_proj.weight")), Some(vec![48, 32]));
    assert_eq!(shape(&format!("{p}.shared_expert_gate.weight")), Some(vec![1, 48]));
    assert_eq!(shape(&format!("{p}.gate_proj.weight")), None);

    let c = qwen35_moe_config(|j| {
        for k in ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"] {
            j.remove(k);
        }
    })
    .unwrap();
    let moe = c.moe.unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (256, 8, 512));
    assert_eq!(moe.shared_expert_intermediate_size, Some(512));

    for (want, key, value) in [
        ("num_experts_per_tok 6 must be in 1..=5", "num_experts_per_tok", 6),
        ("num_experts 0", "num_experts", 0),
        ("moe_intermediate_size is 0", "moe_intermediate_size", 0),
        ("shared_expert_intermediate_size is 0", "shared_expert_intermediate_size", 0),
    ] {
        let err = qwen35_moe_config(|j| {
            j.insert(key.into(), value.into());
        })
        .err()
        .unwrap_or_else(|| panic!("accepted {key} = {value}"));
        assert!(err.contains(want), "{want}: {err}");
    }
    let err = qwen35_moe_config(|j| {
        j.insert("model_type".into(), "qwen3_5_moe".into());
    })
    .unwrap_err();
    assert!(err.contains("model_type \"qwen3_5_moe\" without a \"text_config\""), "{err}");
}

/// `ruda-llm tune`'s shapes of an MoE model cover its routed experts: one `moe_experts` line per
/// model at the prefill chunk (f16/bf16 only, and not for chunks of decode size, which run the
/// GEMV decode path), and the line parses back as a shapes file reads it.
#[test]
fn the_tune_shapes_cover_the_experts() {
    for (name, experts, top_k, hidden, inter) in [("qwen3-moe", 6, 2, 64, 40), ("qwen35-moe", 5, 3, 48, 24)] {
        let config = load_config(fixture(name)).unwrap();
        let lines = |dtype, prefill| -> Vec<String> {
            ruda_llm::tune::model_tune_shapes(&config, dtype, 200, prefill)
                .iter()
                .map(ToString::to_string)
                .filter(|s| s.starts_with("moe_experts"))
                .collect()
        };
        let want = format!("moe_experts bf16 tokens=512 experts={experts} top_k={top_k} hidden={hidden} inter={inter}");
        assert_eq!(lines(DType::BF16, 512), std::slice::from_ref(&want), "{name}");
        assert!(lines(DType::F32, 512).is_empty(), "{name}: f32 has no tensor-core tiles");
        assert!(lines(DType::BF16, 8).is_empty(), "{name}: 8 rows take the decode path");
        let parsed = ruda_ops::tune::parse_shapes("shapes.txt", &want).unwrap();
        assert_eq!(parsed[0].to_string(), want);
    }
    // A dense model has none.
    let dense = load_config(fixture("qwen3")).unwrap();
    assert!(!ruda_llm::tune::model_tune_shapes(&dense, DType::BF16, 200, 512)
        .iter()
        .any(|s| s.to_string().starts_with("moe_experts")));
}
