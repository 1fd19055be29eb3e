#!/usr/bin/env python3
"""Time the problems of `ruda-bench` with PyTorch on the same GPU (cuBLAS through
`torch.nn.functional.linear`, PyTorch's own norm/softmax/elementwise kernels) and print one JSON
object per line: {"op", "shape", "torch_ms"}. Usage: baseline.py [--iters N] [--quick]."""
import json
import sys

import torch


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def rms_norm(x, g, eps):
    if hasattr(torch.nn.functional, "rms_norm"):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), g, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g).to(x.dtype)


def sdpa(q, k, v, causal):
    # GQA: PyTorch >= 2.5 takes enable_gqa; older versions need the KV heads repeated.
    try:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:
        rep = q.shape[1] // k.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=causal)


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    iters = int(args[args.index("--iters") + 1]) if "--iters" in args else 20
    big, hidden = (64, 256) if quick else (4096, 4096)
    dev, bf = "cuda", torch.bfloat16
    problems = []
    for m in (1, big):
        x = torch.rand(m, hidden, device=dev, dtype=bf) * 2 - 1
        w = torch.rand(hidden, hidden, device=dev, dtype=bf) * 2 - 1
        problems.append(("linear_bf16", [m, hidden, hidden], lambda x=x, w=w: torch.nn.functional.linear(x, w)))
    x = torch.rand(big, hidden, device=dev, dtype=bf)
    g = torch.ones(hidden, device=dev, dtype=torch.float32)
    # The contract keeps gamma in f32 and the output in the input dtype.
    problems.append(("rms_norm_bf16", [big, hidden], lambda: rms_norm(x, g.to(bf), 1e-6)))
    problems.append(("softmax_bf16", [big, hidden], lambda: torch.softmax(x, dim=-1)))
    a = torch.rand(big * hidden, device=dev, dtype=bf)
    b = torch.rand(big * hidden, device=dev, dtype=bf)
    problems.append(("add_bf16", [big * hidden], lambda: a + b))
    problems.append(("silu_bf16", [big * hidden], lambda: torch.nn.functional.silu(a)))
    f = torch.nn.functional
    for t in ((64,) if quick else (1024, 4096)):
        hq, hkv, d = 16, 8, 128
        q = torch.rand(1, hq, t, d, device=dev, dtype=bf)
        k = torch.rand(1, hkv, t, d, device=dev, dtype=bf)
        v = torch.rand(1, hkv, t, d, device=dev, dtype=bf)
        problems.append(("attention_prefill_bf16", [t, hq, hkv, d],
                         lambda q=q, k=k, v=v: sdpa(q, k, v, True)))
    b, hq, hkv, d, s_len = 8, 16, 8, 128, (64 if quick else 4096)
    qd = torch.rand(b, hq, 1, d, device=dev, dtype=bf)
    kc = torch.rand(b, hkv, s_len, d, device=dev, dtype=bf)
    vc = torch.rand(b, hkv, s_len, d, device=dev, dtype=bf)
    problems.append(("attention_decode_bf16", [b, hq, hkv, d, s_len], lambda: sdpa(qd, kc, vc, False)))
    r = torch.rand(big, hidden, device=dev, dtype=bf)
    problems.append(("rms_norm_residual_bf16", [big, hidden], lambda: rms_norm(x + r, g.to(bf), 1e-6)))
    vocab = 1000 if quick else 151936
    logits = torch.rand(1, vocab, device=dev, dtype=bf)
    problems.append(("argmax_bf16", [1, vocab], lambda: torch.argmax(logits, dim=-1)))
    for name, shape, fn in problems:
        print(json.dumps({"op": name, "shape": shape, "torch_ms": round(timed(fn, iters), 6)}), flush=True)


if __name__ == "__main__":
    main()
