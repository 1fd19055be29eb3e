//! A warmed single-sequence decode step of the dense models is capturable: it allocates nothing
//! and never waits for the device (the runtime's counters), and captured into a graph and
//! replayed on the interpreter it gives the logits running it does.

use ruda_llm::{architecture, example, load_config, Cache, CausalLm, DecodeKernels, ModelType, Weights, Workspace};
use ruda_runtime::{DType, Device, RuntimeCounters};

/// The bundled tiny model of `model_type` in f32 on a CPU device of its own (the counters are
/// per device), a cache holding a short prompt, and a decode workspace.
fn prefilled(model_type: ModelType) -> (Box<dyn CausalLm>, Cache, Workspace) {
    let dir = example::bundled_model(model_type);
    let config = load_config(&dir).unwrap();
    let weights = Weights::load(&dir, &config).unwrap();
    let model = architecture(config.model_type).load(&config, &weights, &Device::cpu(), DType::F32).unwrap();
    let mut cache = model.new_cache_with_capacity(24).unwrap();
    model.forward(&mut cache, &[5, 17, 42, 9, 100], 64, false).unwrap();
    let workspace = model.decode_workspace().unwrap();
    (model, cache, workspace)
}

const STEP_IDS: [u32; 6] = [7, 300, 12, 64, 250, 3];

#[test]
fn a_warmed_dense_decode_step_allocates_and_syncs_nothing() {
    for model_type in [ModelType::Qwen2, ModelType::Qwen3] {
        let (model, mut cache, ws) = prefilled(model_type);
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
    for model_type in [ModelType::Qwen2, ModelType::Qwen3] {
        // The same prompt and steps twice: launched one by one, and through a graph.
        let (model, mut run_cache, run_ws) = prefilled(model_type);
        let (graph_model, mut graph_cache, graph_ws) = prefilled(model_type);
        let device = graph_model.device().clone();
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
        assert_eq!(logits.to_vec::<f32>().unwrap(), want, "{model_type:?}: the captured step");

        for &id in &STEP_IDS[3..] {
            graph_model.write_decode_inputs(&graph_cache, id, &graph_ws).unwrap();
            let before = device.counters();
            let logits =
                graph_model.run_decode_step(&mut graph_cache, &graph_ws, DecodeKernels::Replay(&graph)).unwrap();
            assert_eq!(
                device.counters().since(&before),
                RuntimeCounters { allocations: 0, host_syncs: 0, launches: graph.launches() as u64 }
            );
            let want = logits_of_run(&mut run_cache, id).unwrap();
            let got = logits.to_vec::<f32>().unwrap();
            assert_eq!(got, want, "{model_type:?}: the replay at position {}", graph_cache.len() - 1);
        }
        assert_eq!(graph_cache.len(), run_cache.len());
    }
}
