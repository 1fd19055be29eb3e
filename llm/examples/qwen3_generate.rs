//! Greedy generation with a Qwen3 model, printing JSON lines:
//! `cargo run --release -p ruda-llm --example qwen3_generate -- MODEL_DIR PROMPT [MAX_NEW_TOKENS=32] [RUNS=1]`,
//! or without arguments for the bundled tiny model (see `ruda_llm::example`).

fn main() {
    ruda_llm::example::main(ruda_llm::ModelType::Qwen3);
}
