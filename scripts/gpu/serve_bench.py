#!/usr/bin/env python3
"""Serving benchmark of the GPU rung (issue 15, item 7): a Qwen2.5-0.5B-shaped random model (bf16,
made here by `transformers`, as model_bench.py makes it) served by `BUNDLE/bin/ruda-serve` on the
GPU, measured by `BUNDLE/bin/ruda-llm bench-serve` at 1, 8 and 32 concurrent clients (streaming
completions, 128-word prompts, 64 tokens each, EOS ignored): request throughput, output tokens/s,
TTFT, TPOT and ITL (mean, p50, p99).

Writes OUT/serve_bench.json. Usage: serve_bench.py OUT BUNDLE [--tiny] [--device cpu]
[--deadline-s N] (--tiny: a 2-layer model, for a smoke run).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_bench import MODELS, make_model  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def main():
    args = sys.argv[1:]
    out, bundle = args[0], args[1]
    tiny = "--tiny" in args
    device = args[args.index("--device") + 1] if "--device" in args else "cuda"
    deadline = time.time() + (float(args[args.index("--deadline-s") + 1]) if "--deadline-s" in args else 1e9)
    import torch
    import transformers
    name, model_type, _, cfg = MODELS[0]
    result = {"model": name, "levels": []}
    serve, client = os.path.join(bundle, "bin", "ruda-serve"), os.path.join(bundle, "bin", "ruda-llm")
    for exe in (serve, client):
        if not os.path.exists(exe):
            result["error"] = f"{exe} is not in the bundle"
            json.dump(result, open(os.path.join(out, "serve_bench.json"), "w"), indent=1)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        model, path = make_model(name, model_type, cfg, tmp, tiny, device, torch, transformers)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(os.path.join(out, "serve_bench_server.log"), "w")
        proc = subprocess.Popen([serve, path, "--bind", f"127.0.0.1:{port}", "--max-active", "32",
                                 "--max-model-len", "1024"], stdout=log, stderr=log)
        try:
            if not wait_ready(url, proc, max(10, min(120, deadline - time.time() - 30))):
                result["error"] = "ruda-serve did not become ready (serve_bench_server.log)"
            else:
                timeout = max(10, int(deadline - time.time()) - 5)
                p = subprocess.run([client, "bench-serve", "--url", url, "--concurrency", "1,8,32",
                                    "--requests", "32", "--input-len", "128", "--output-len", "64"],
                                   capture_output=True, text=True, timeout=timeout)
                result["levels"] = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
                result["stderr_tail"] = p.stderr[-2000:]
                if p.returncode != 0:
                    result["error"] = f"bench-serve exit {p.returncode}"
        except subprocess.TimeoutExpired:
            result["error"] = "bench-serve ran out of time"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=70)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    json.dump(result, open(os.path.join(out, "serve_bench.json"), "w"), indent=1)
    print(f"serve_bench: {json.dumps(result)[:600]}", file=sys.stderr)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
