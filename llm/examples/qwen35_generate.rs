//! Greedy generation with a Qwen3.5 model (`qwen3_5_text`, or the image-text `qwen3_5` for its
//! text), printing JSON lines:
//! `cargo run --release -p ruda-llm --example qwen35_generate -- MODEL_DIR PROMPT [MAX_NEW_TOKENS=8] [RUNS=1]`,
//! or without arguments for the bundled tiny model (see `ruda_llm::example`).

fn main() {
    ruda_llm::example::main(ruda_llm::ModelType::Qwen35);
}
