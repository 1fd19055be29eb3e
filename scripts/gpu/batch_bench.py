#!/usr/bin/env python3
"""Batched generation of the GPU rung (issue 14): a Qwen2.5-0.5B-shaped random model (bf16, made
here by `transformers`, as model_bench.py makes it), then for 1, 8 and 64 concurrent requests of
PROMPT_TOKENS prompt tokens and NEW_TOKENS new tokens each (EOS ignored): transformers' batched
greedy `generate` (CUDA-synchronised) and `BUNDLE/bin/ruda-llm batch` over the same prompts
(its summary line's tokens per second), both paged attention paths; then at 8 requests the
decode with and without CUDA graphs (`RUDA_CUDA_GRAPHS=off`). Ratios are RUDA / transformers in
the same run.

Writes OUT/batch_bench.json. Usage: batch_bench.py OUT BUNDLE [--tiny] [--device cpu]
[--deadline-s N] (--tiny: a 2-layer model, for a smoke run).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_bench import MODELS, make_model, sync  # noqa: E402

PROMPT_TOKENS, NEW_TOKENS = 128, 64
CONCURRENCY = [1, 8, 64]


def prompts(n):
    """n distinct ASCII prompts of PROMPT_TOKENS bytes: one token per byte with the bench
    tokenizer (byte-level, no merges)."""
    return ["".join(chr(97 + (i * 7 + j * 13) % 26) for j in range(PROMPT_TOKENS)) for i in range(n)]


def hf_throughput(model, tok, texts, torch, device):
    """Generated tokens per second of one batched greedy generate over texts (all of one length)."""
    ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"] for t in texts], device=device)
    with torch.no_grad():
        kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones_like(ids))
        model.generate(ids[:, :8], **dict(kwargs, max_new_tokens=2, min_new_tokens=2))  # warm-up
        sync(torch)
        t0 = time.perf_counter()
        out = model.generate(ids, **kwargs)
        sync(torch)
        seconds = time.perf_counter() - t0
    generated = (out.shape[1] - ids.shape[1]) * out.shape[0]
    return generated / seconds, seconds


def ruda_throughput(exe, model_dir, texts, env, timeout):
    """ruda-llm batch's summary over texts at len(texts) concurrent requests."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for t in texts:
            f.write(json.dumps({"prompt": t}) + "\n")
    cmd = [exe, "batch", model_dir, "--prompts", f.name, "--max-new-tokens", str(NEW_TOKENS),
           "--max-active", str(len(texts)), "--ignore-eos"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **env))
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    summary = lines[-1]
    requests = [x for x in lines if x.get("event") == "request"]
    summary["all_full_length"] = all(len(x["generated_token_ids"]) == NEW_TOKENS for x in requests)
    return summary


def main():
    args = sys.argv[1:]
    out, bundle = args[0], args[1]
    tiny = "--tiny" in args
    device = args[args.index("--device") + 1] if "--device" in args else "cuda"
    deadline = time.time() + (float(args[args.index("--deadline-s") + 1]) if "--deadline-s" in args else 1e9)
    import torch
    import transformers
    name, model_type, _, cfg = MODELS[0]
    result = {"model": name, "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS, "rows": []}
    exe = os.path.join(bundle, "bin", "ruda-llm")
    with tempfile.TemporaryDirectory() as tmp:
        model, path = make_model(name, model_type, cfg, tmp, tiny, device, torch, transformers)
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
        runs = [(n, {"RUDA_PAGED_ATTENTION": mode}) for n in CONCURRENCY for mode in ("legacy", "fused")]
        runs.append((8, {"RUDA_PAGED_ATTENTION": "fused", "RUDA_CUDA_GRAPHS": "off"}))
        hf = {}
        for n, env in runs:
            left = deadline - time.time()
            if left < 20:
                result["rows"].append({"requests": n, "env": env, "error": "skipped: out of time"})
                continue
            texts = prompts(n)
            if n not in hf:
                tps, seconds = hf_throughput(model, tok, texts, torch, device)
                hf[n] = {"tokens_per_second": round(tps, 2), "seconds": round(seconds, 3)}
            row = {"requests": n, "env": env, "transformers": hf[n]}
            if os.path.exists(exe):
                ours = ruda_throughput(exe, path, texts, env, timeout=max(10, int(left) - 10))
                row["ruda"] = ours
                if "tokens_per_second" in ours and hf[n]["tokens_per_second"] > 0:
                    row["ratio_vs_transformers"] = round(ours["tokens_per_second"] / hf[n]["tokens_per_second"], 3)
            else:
                row["ruda"] = {"error": f"{exe} is not in the bundle"}
            print(f"batch_bench: {json.dumps(row)[:300]}", file=sys.stderr, flush=True)
            result["rows"].append(row)
            json.dump(result, open(os.path.join(out, "batch_bench.json"), "w"), indent=1)
    graphs = {tuple(sorted(r["env"].items())): r for r in result["rows"] if r["requests"] == 8}
    on = graphs.get((("RUDA_PAGED_ATTENTION", "fused"),), {}).get("ruda", {})
    off = graphs.get((("RUDA_CUDA_GRAPHS", "off"), ("RUDA_PAGED_ATTENTION", "fused")), {}).get("ruda", {})
    if on.get("tokens_per_second") and off.get("tokens_per_second"):
        result["graphs_speedup_at_8"] = round(on["tokens_per_second"] / off["tokens_per_second"], 3)
    json.dump(result, open(os.path.join(out, "batch_bench.json"), "w"), indent=1)
    return 0 if all("error" not in r.get("ruda", {"error": 1}) for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
