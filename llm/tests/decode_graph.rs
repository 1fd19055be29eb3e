//! A warmed single-sequence decode step (Qwen2, Qwen3 and the hybrid Qwen3.5) is capturable: it allocates nothing
//! and never waits for the device (the runtime's counters, on the interpreter), and captured into
//! a graph and replayed it gives the logits running it does (on `RUDA_DEVICE`'s device: the
//! interpreter here, a CUDA graph in the GPU rung).

use ruda_llm::{architecture, example, load_config, Cache, CausalLm, DecodeKernels, ModelType, Weights, Workspace};
use ruda_runtime::{DType, Device, RuntimeCounters};

use crate::common;

/// The bundled tiny model of `model_type` in f32 on `device`, a cache holding a short prompt,
/// and a decode workspace.
fn prefilled(model_type: ModelType, device: &Device) -> (Box<dyn CausalLm>, Cache, Workspace) {
    let dir = example::bundled_model(model_type);
    let config = load_config(&dir).unwrap();
    let weights = Weights::load(&dir, &config).unwrap();
    let model = architecture(config.model_type).load(&config, &weights, device, DType::F32).unwrap();
    let mut cache = model.new_cache_with_capacity(24).unwrap();
    model.forward(&mut cache, &[5, 17, 42, 9, 100], 64, false).unwrap();
    let workspace = model.decode_workspace().unwrap();
    (model, cache, workspace)
}

const STEP_IDS: [u32; 6] = [7, 300, 12, 64, 250, 3];

#[test]
fn a_warmed_decode_step_allocates_and_syncs_nothing() {
    for model_type in [ModelType::Qwen2, ModelType::Qwen3, ModelType::Qwen35] {
        // A CPU device of its own: its counters see this test's work only.
        let (model, mut cache, ws) = prefilled(model_type, &Device::cpu());
        for &id in &STEP_IDS[..2] {
            model.decode_step(&mut cache, id, &ws).unwrap(); // warm-up
        }
        let device = model.device().clone();
        for &id in &STEP_IDS[2..] {
            let before = device.counters();
            model.decode_step(&mut cache, id, &ws).unwrap();
            let step = device.counters().since(&before);
            assert_eq!(
                (step.allocations, step.host_syncs),
                (0, 0),
                "{model_type:?}: a warmed decode step at position {} ({step:?})",
                cache.len() - 1
            );
            assert!(step.launches > 10, "{model_type:?}: {step:?}");
        }
    }
}

#[test]
fn a_captured_decode_step_replays_to_the_logits_of_running_it() {
    for model_type in [ModelType::Qwen2, ModelType::Qwen3, ModelType::Qwen35] {
        // The same prompt and steps twice: launched one by one, and through a graph.
        // Each CPU device is its own (counters per test); one GPU is shared by the tests running
        // beside this one, so its counters are not compared there.
        let device = common::device();
        let counted = device.is_cpu();
        let (model, mut run_cache, run_ws) = prefilled(model_type, &device);
        let (graph_model, mut graph_cache, graph_ws) = prefilled(model_type, &device);
        let stream = device.default_stream();
        for &id in &STEP_IDS[..2] {
            graph_model.decode_step(&mut graph_cache, id, &graph_ws).unwrap(); // warm-up
        }
        let logits_of_run = |cache: &mut Cache, id: u32| model.decode_step(cache, id, &run_ws).unwrap().to_vec::<f32>();
        for &id in &STEP_IDS[..2] {
            logits_of_run(&mut run_cache, id).unwrap();
        }

        // Capture the step at the third id: the capture runs nothing, so launch it once for it.
        graph_model.write_decode_inputs(&graph_cache, STEP_IDS[2], &graph_ws).unwrap();
        stream.begin_capture().unwrap();
        let logits = graph_model.run_decode_step(&mut graph_cache, &graph_ws, DecodeKernels::Launch).unwrap();
        let graph = stream.end_capture().unwrap();
        assert!(graph.launches() > 10, "{model_type:?}: {graph:?}");
        graph.launch(&stream).unwrap();
        let want = logits_of_run(&mut run_cache, STEP_IDS[2]).unwrap();
        same_logits(&logits.to_vec::<f32>().unwrap(), &want, &format!("{model_type:?}: the captured step"));

        for &id in &STEP_IDS[3..] {
            graph_model.write_decode_inputs(&graph_cache, id, &graph_ws).unwrap();
            let before = device.counters();
            let logits =
                graph_model.run_decode_step(&mut graph_cache, &graph_ws, DecodeKernels::Replay(&graph)).unwrap();
            if counted {
                assert_eq!(
                    device.counters().since(&before),
                    RuntimeCounters { allocations: 0, host_syncs: 0, launches: graph.launches() as u64 }
                );
            }
            let want = logits_of_run(&mut run_cache, id).unwrap();
            let got = logits.to_vec::<f32>().unwrap();
            same_logits(&got, &want, &format!("{model_type:?}: the replay at position {}", graph_cache.len() - 1));
        }
        assert_eq!(graph_cache.len(), run_cache.len());
    }
}

/// The same kernels over the same inputs: equal bits on the interpreter; within 1e-5 (relative
/// to the largest logit) on a GPU, where a split reduction's atomics may order sums differently.
fn same_logits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-5 * scale || got == want, "{what}: logits differ by up to {worst}");
    if common::device().is_cpu() {
        assert_eq!(got, want, "{what}: bit for bit on the interpreter");
    }
}
