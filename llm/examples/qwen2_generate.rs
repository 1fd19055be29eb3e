//! Greedy generation with a Qwen2 model, printing JSON lines:
//! `cargo run --release -p ruda-llm --example qwen2_generate -- MODEL_DIR PROMPT [MAX_NEW_TOKENS=32] [RUNS=1]`,
//! or without arguments for the bundled tiny model (see `ruda_llm::example`).

fn main() {
    ruda_llm::example::main(ruda_llm::ModelType::Qwen2);
}
