//! `RUDA_PAGED_ATTENTION` is read when a batch cache is made: unset or `legacy` gathers the
//! pages, `fused` runs the paged kernels, anything else is an error naming the variable and its
//! value (on the CPU device too); changing it later does not switch an existing cache. Its own
//! test binary, because it sets the process environment (one test, so no other thread reads it).

use ruda_llm::{architecture, example, load_config, ModelType, PagedKvCacheConfig, Weights};
use ruda_runtime::{DType, Device, PagedAttentionMode, RUDA_PAGED_ATTENTION};

#[test]
fn the_variable_picks_the_path_of_each_new_batch_cache() {
    let dir = example::bundled_model(ModelType::Qwen3);
    let config = load_config(&dir).unwrap();
    let weights = Weights::load(&dir, &config).unwrap();
    let model = architecture(config.model_type).load(&config, &weights, &Device::cpu(), DType::F32).unwrap();
    let kv = PagedKvCacheConfig { block_size: 4, num_pages: 8, max_sequence_length: 16 };
    std::env::remove_var(RUDA_PAGED_ATTENTION);
    assert_eq!(model.new_batch_cache(kv, 2).unwrap().mode(), PagedAttentionMode::Legacy, "unset");
    for (value, want) in
        [("legacy", PagedAttentionMode::Legacy), ("fused", PagedAttentionMode::Fused), ("", PagedAttentionMode::Legacy)]
    {
        std::env::set_var(RUDA_PAGED_ATTENTION, value);
        let cache = model.new_batch_cache(kv, 2).unwrap();
        assert_eq!(cache.mode(), want, "{value:?}");
        // A later value does not switch it.
        std::env::set_var(RUDA_PAGED_ATTENTION, "legacy");
        assert_eq!(cache.mode(), want, "{value:?}");
    }
    for value in ["Fused", "gather", "1"] {
        std::env::set_var(RUDA_PAGED_ATTENTION, value);
        let e = model.new_batch_cache(kv, 2).err().expect(value).to_string();
        assert!(e.contains(&format!("RUDA_PAGED_ATTENTION={value:?}")) && e.contains("fused"), "{e}");
        std::env::set_var("RUDA_DEVICE", "cpu");
        assert!(Device::from_env().unwrap_err().to_string().contains("RUDA_PAGED_ATTENTION"));
        std::env::remove_var("RUDA_DEVICE");
    }
    std::env::remove_var(RUDA_PAGED_ATTENTION);
}
