#!/usr/bin/env python3
"""Model-level benchmark of the GPU rung (Qwen issue, item 6; Qwen3.5 issue): Qwen2.5-0.5B-,
Qwen3-0.6B- and Qwen3.5-shaped models with random weights (fixed seed) made here by `transformers` (bf16,
CUDA), saved with save_pretrained (safetensors) plus a small byte-level tokenizer; then
transformers' prefill of 512 tokens and greedy decode of 128 tokens (CUDA-synchronised, median
of 3), and the teacher-forced logits of the greedy ids. Then, when the bundle has them, RUDA's
examples (`BUNDLE/bin/qwen2_generate MODEL_DIR PROMPT 128 3`, JSON lines) on the same model:
their timings, and each RUDA token checked against transformers' teacher-forced logits at that
step (within TOL of the best logit: random-weight models have near-ties).

The MoE model (issue 16: a Qwen3-30B-A3B-shaped Qwen3-MoE, 128 experts of which 8 per token,
with the depth cut to 4 layers so that its ~4 GB of random weights are made and saved in seconds)
runs through `ruda-llm generate`, which takes the examples' arguments; it is the GPU rung's `moe`
step (`--models qwen3-30b-a3b-shaped --out moe_bench.json`), not the `model` step's default set.

Writes OUT/model_bench.json (or the --out name). Usage: model_bench.py OUT BUNDLE [--tiny]
[--device cpu] [--models NAME,...] [--out FILE.json] [--deadline-s S]
(--tiny: 2-layer models of the same kinds, 4 for Qwen3.5, with a 4096-token vocabulary and
small experts, for a smoke run.)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT_TOKENS, NEW_TOKENS, RUNS, SEED = 512, 128, 3, 1234
# Teacher-forced agreement: a RUDA token is accepted when transformers' logit for it is within
# TOL of transformers' best at that step (bf16 logits of random models are close together).
TOL = 0.5
# transformers' default initializer_range (0.02) leaves these random models' top-2 logits a bf16
# step apart at most steps, so any token passes the tolerance; 0.05 spreads them (max |logit|
# ~8, margins up to ~1.3 on a CPU check of the Qwen2.5 shape) while staying finite in bf16.
INIT = 0.05

MODELS = [
    ("qwen2.5-0.5b", "qwen2", "qwen2_generate", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, vocab_size=151936)),
    ("qwen3-0.6b", "qwen3", "qwen3_generate", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, vocab_size=151936)),
    # Qwen3.5-shaped (an assumed ~0.8B shape: transformers' default heads and head dims, depth and
    # width reduced): every fourth layer full attention, the rest gated DeltaNet.
    ("qwen3.5-0.8b-shaped", "qwen3_5_text", "qwen35_generate", dict(
        hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True, vocab_size=248320)),
    # Qwen3-30B-A3B's per-layer shapes (48 layers in the real model), 4 layers deep.
    ("qwen3-30b-a3b-shaped", "qwen3_moe", "ruda-llm generate", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        vocab_size=151936)),
]
# The `model` step's models (the MoE one is the `moe` step's).
DEFAULT_MODELS = ["qwen2.5-0.5b", "qwen3-0.6b", "qwen3.5-0.8b-shaped"]


def tokenizer_json(path, vocab_size):
    """A byte-level BPE tokenizer covering every id below vocab_size: the 256 byte tokens
    (what text encodes to: no merges), filler tokens of three byte characters (so any id a
    random model generates decodes), and Qwen's special tokens at Qwen's ids (151643...) or
    at the end of a smaller vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    first_special = min(151643, vocab_size - len(specials))
    special_ids = {first_special + i: s for i, s in enumerate(specials)}
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    n = 0
    for i in range(len(alphabet), vocab_size):
        if i in special_ids:
            continue
        a, b, c = n // (256 * 256) % 256, n // 256 % 256, n % 256
        vocab[alphabet[a] + alphabet[b] + alphabet[c]] = i
        n += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(path)
    data = json.load(open(path))
    data["added_tokens"] = [dict(id=i, content=s, single_word=False, lstrip=False, rstrip=False, normalized=False,
                                 special=True) for i, s in special_ids.items()]
    data["model"]["vocab"].update({s: i for i, s in special_ids.items()})
    json.dump(data, open(path, "w"))
    return first_special


def make_model(name, model_type, cfg, out_dir, tiny, device, torch, transformers):
    cfg = dict(cfg, initializer_range=INIT)
    if tiny:
        # Qwen3.5 needs four layers for one of full attention (every fourth).
        cfg.update(num_hidden_layers=4 if model_type == "qwen3_5_text" else 2, vocab_size=4096)
        if model_type == "qwen3_moe":
            cfg.update(num_experts=8, moe_intermediate_size=64, hidden_size=256, intermediate_size=512,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    config_cls = transformers.AutoConfig.for_model(model_type, **cfg)
    config_cls.torch_dtype = "bfloat16"
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(config_cls, torch_dtype=torch.bfloat16).to(device).eval()
    path = os.path.join(out_dir, name)
    model.save_pretrained(path, safe_serialization=True)
    eos = tokenizer_json(os.path.join(path, "tokenizer.json"), cfg["vocab_size"])
    # Greedy decoding runs all NEW_TOKENS steps on both sides; EOS is only named.
    json.dump({"eos_token_id": eos}, open(os.path.join(path, "generation_config.json"), "w"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"},
              open(os.path.join(path, "tokenizer_config.json"), "w"))
    return model, path


def sync(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hf_bench(model, prompt_ids, torch):
    """Median prefill ms and decode tokens/s over RUNS, the greedy ids, and the teacher-forced
    logits (rows: the step predicting each generated token)."""
    prefill, decode, ids = [], [], None
    with torch.no_grad():
        for _ in range(RUNS):
            sync(torch)
            t0 = time.perf_counter()
            out = model(input_ids=prompt_ids, use_cache=True)
            sync(torch)
            t1 = time.perf_counter()
            past, nxt, gen = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True), []
            for _ in range(NEW_TOKENS):
                gen.append(int(nxt))
                step = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past, nxt = step.past_key_values, step.logits[:, -1].argmax(-1, keepdim=True)
            sync(torch)
            t2 = time.perf_counter()
            prefill.append((t1 - t0) * 1e3)
            decode.append(NEW_TOKENS / (t2 - t1))
            ids = gen
    return statistics.median(prefill), statistics.median(decode), ids


def teacher_forced_logits(model, prompt_ids, gen_ids, torch):
    """Logits [NEW_TOKENS, vocab] (f32) at each step, given the prompt and gen_ids before it."""
    with torch.no_grad():
        full = torch.cat([prompt_ids, torch.tensor([gen_ids], device=prompt_ids.device)], dim=1)
        logits = model(input_ids=full).logits[0, prompt_ids.shape[1] - 1: prompt_ids.shape[1] - 1 + len(gen_ids)]
    return logits.float()


def run_ruda(cmd, path, prompt, prompt_ids, model, torch, timeout):
    cmd = cmd + [path, prompt, str(NEW_TOKENS), str(RUNS)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    gens = [l for l in lines if l.get("event") == "generation"]
    if p.returncode != 0 or not gens:
        return None, f"exit {p.returncode}: {p.stderr.strip()[-500:]}"
    ids = gens[-1]["generated_token_ids"]
    res = {"stop_reason": gens[-1].get("stop_reason"), "generated_tokens": len(ids),
           # transformers always decodes NEW_TOKENS; a RUDA run that hit EOS first decoded fewer.
           "short": len(ids) < NEW_TOKENS,
           "prefill_ms": statistics.median(g["prefill_ms"] for g in gens),
           "decode_tokens_per_second": statistics.median(g["decode_tokens_per_second"] for g in gens),
           "prompt_tokens": gens[-1].get("prompt_tokens"), "generated_token_ids": ids,
           "load": next((l for l in lines if l.get("event") == "load"), None)}
    if ids:
        logits = teacher_forced_logits(model, prompt_ids, ids, torch)
        best = logits.max(-1).values
        chosen = logits[torch.arange(len(ids)), torch.tensor(ids, device=logits.device)]
        gap = (best - chosen).tolist()
        ok = sum(g <= TOL for g in gap)
        res["agreement"] = f"{ok}/{len(ids)}"
        res["max_logit_gap"] = round(max(gap), 4)
    return res, None


def write_result(out, name, result):
    """OUT/name, rewritten after each model so a timeout keeps what was measured."""
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, os.path.join(out, name))


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    out, bundle = args[0], args[1]
    tiny = "--tiny" in args
    device = args[args.index("--device") + 1] if "--device" in args else "cuda"
    # Stop starting work that cannot finish before the caller's timeout.
    deadline = time.time() + (float(args[args.index("--deadline-s") + 1]) if "--deadline-s" in args else 1e9)
    names = args[args.index("--models") + 1].split(",") if "--models" in args else DEFAULT_MODELS
    unknown = [n for n in names if n not in [m[0] for m in MODELS]]
    if unknown:
        sys.exit(f"model_bench.py: unknown models {unknown}; known: {[m[0] for m in MODELS]}")
    out_name = args[args.index("--out") + 1] if "--out" in args else "model_bench.json"
    import torch
    import transformers
    os.makedirs(out, exist_ok=True)
    result = {"torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED,
              "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS, "runs": RUNS, "tolerance": TOL, "models": []}
    # The prompt: 512 byte tokens of plain text (the byte-level tokenizer maps each ASCII byte to
    # one token, so RUDA encodes the same ids from the text).
    text = ("The quick brown fox jumps over the lazy dog. " * 20)[:PROMPT_TOKENS]
    with tempfile.TemporaryDirectory(prefix="ruda-model-bench-") as tmp:
        for name, model_type, example, cfg in [m for m in MODELS if m[0] in names]:
            t0 = time.time()
            entry = {"name": name, "model_type": model_type}
            if deadline - t0 < 30:
                entry["error"] = "skipped: out of time"
                result["models"].append(entry)
                continue
            try:
                model, path = make_model(name, model_type, cfg, tmp, tiny, device, torch, transformers)
                tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
                ids = tok(text, add_special_tokens=False)["input_ids"]
                prompt_ids = torch.tensor([ids], device=device)
                entry["prompt_ids_len"] = len(ids)
                p_ms, d_tps, gen = hf_bench(model, prompt_ids, torch)
                entry["transformers"] = {"prefill_ms": round(p_ms, 3), "decode_tokens_per_second": round(d_tps, 2),
                                         "generated_token_ids": gen}
                exe, *subcommand = example.split()
                exe = os.path.join(bundle, "bin", exe)
                if os.path.exists(exe):
                    ours, why = run_ruda([exe, *subcommand], path, text, prompt_ids, model, torch,
                                         timeout=max(10, min(240, int(deadline - time.time()) - 10)))
                    entry["ruda"] = ours
                    if why:
                        entry["ruda_skipped"] = f"failed: {why}"
                else:
                    entry["ruda"] = None
                    entry["ruda_skipped"] = f"{exe} is not in the bundle"
                del model
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except Exception as e:  # report and go on to the next model
                entry["error"] = repr(e)
            entry["seconds"] = round(time.time() - t0, 1)
            print(f"model_bench: {name}: {json.dumps({k: v for k, v in entry.items() if k != 'transformers'})[:300]}",
                  file=sys.stderr, flush=True)
            result["models"].append(entry)
            write_result(out, out_name, result)
    write_result(out, out_name, result)
    return 0 if all("error" not in m for m in result["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
