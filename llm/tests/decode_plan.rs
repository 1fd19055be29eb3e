//! The decode step's launches on paper (`DecoderSpec::decode_launches_with`, what `ruda-llm
//! profile` bounds) against the kernels a real decode step launches on the interpreter device,
//! recorded by the stream's launch record: the same kernels, in the same order.

use ruda_llm::{architecture, load_config, CausalLm, DecodeChoices, Weights};
use ruda_ops::api;
use ruda_runtime::{DType, Device, Tensor};

use crate::common::fixture;

/// The kernel names of a decode step at `context` keys of fixture `name` in `dtype`, and those the
/// spec plans for it.
fn launched_and_planned(name: &str, dtype: DType, context: usize) -> (Vec<String>, Vec<String>) {
    let dir = fixture(name);
    let config = load_config(&dir).unwrap();
    let weights = Weights::load(&dir, &config).unwrap();
    let arch = architecture(config.model_type);
    // The interpreter: the device whose choices are its heuristics' (a GPU's are tuned).
    let device = Device::cpu();
    let model: Box<dyn CausalLm> = arch.load(&config, &weights, &device, dtype).unwrap();
    let mut cache = model.new_cache_with_capacity(context).unwrap();
    let prompt: Vec<u32> = (0..context as u32 - 1).map(|i| 3 + 7 * i).collect();
    model.forward(&mut cache, &prompt, 64, false).unwrap();
    let workspace = model.decode_workspace().unwrap();
    let stream = device.default_stream();
    stream.start_launch_record();
    let logits = model.decode_step(&mut cache, 11, &workspace).unwrap();
    // The pipeline's greedy pick, with the workspace it gives argmax.
    let vocab = config.vocab_size;
    let chosen = Tensor::zeros(&device, DType::U32, &[1]).unwrap();
    let len = api::argmax_workspace_len(&device, 1, vocab);
    let ws = (len > 0).then(|| Tensor::zeros(&device, DType::U64, &[len]).unwrap());
    api::argmax_into(&stream, &logits, &chosen, ws.as_ref()).unwrap();
    let launched = stream.take_launch_record().into_iter().map(|l| l.kernel).collect();
    assert_eq!(cache.len(), context, "the step attended every cached position and its own");
    let choices = DecodeChoices { argmax_splits: Some(api::argmax_splits(&device, 1, vocab)), ..Default::default() };
    let planned = arch.spec(&config).decode_launches_with(context, dtype, &choices).unwrap();
    (launched, planned.iter().map(|l| l.kernel_name()).collect())
}

#[test]
fn the_planned_decode_step_is_the_one_that_runs() {
    // q/k norms and a tied lm_head; biases on all four projections with head dim 48 and GQA 3;
    // q/k/v biases, an untied lm_head and an odd-sized MLP (scalar GEMV loads in bf16); Qwen3.5's
    // gated DeltaNet (conv updates, casts to f32, the recurrent rule) and gated attention with
    // partial RoPE and zero-centred norms, in bf16 and in f32 (no casts); routed experts, and
    // with Qwen3.5-MoE a gated shared expert (a GEMV of one row for its gate).
    let cases = [
        ("qwen3", DType::BF16, 5),
        ("qwen3-bias", DType::BF16, 3),
        ("qwen2-untied", DType::F32, 2),
        ("qwen35-text", DType::BF16, 4),
        ("qwen35-vl", DType::F32, 3),
        ("qwen3-moe", DType::F32, 4),
        ("qwen3-moe", DType::BF16, 3),
        ("qwen35-moe", DType::BF16, 4),
        ("qwen35-moe", DType::F32, 2),
    ];
    for (name, dtype, context) in cases {
        let (launched, planned) = launched_and_planned(name, dtype, context);
        assert!(launched.len() > 10, "{name}: {launched:?}");
        assert_eq!(launched, planned, "{name} in {dtype} at context {context}: launched (left) against planned");
    }
}
