#!/usr/bin/env python3
"""Time the problems of `ruda-bench` with PyTorch on the same GPU and print one JSON object per
line: {"op", "shape", "torch_ms", "iters"}. The ops and shapes are those of ruda-bench
(tools/src/bin/ruda-bench.rs); scripts/gpu/summarize.py joins the two by (op, shape).

Baselines: y = x·Wᵀ through torch.nn.functional.linear (cuBLAS); attention through
torch.nn.functional.scaled_dot_product_attention (GQA by enable_gqa, or the KV heads repeated
on older PyTorch; the repeat is outside the timed region); the device-to-device copy through
Tensor.copy_; PyTorch's own norm, softmax and elementwise kernels; the gated delta rule through
flash-linear-attention (`fla.ops.gated_delta_rule`: `chunk_gated_delta_rule` for prefill,
`fused_recurrent_gated_delta_rule` for a decode step), imported only when installed: without
it those rows print SKIPPED (the GPU rung installs its wheels from the bundle); the routed
experts on rows sorted by expert through `torch._grouped_mm` (`moe_experts_bf16`, SKIPPED where
this PyTorch lacks it) and through one `torch.matmul` per expert (`moe_experts_loop_bf16`).

Timing: 3 warm-up calls (the first compiles Triton's kernels and runs their autotuning), then
SAMPLES samples of as many calls as fill SAMPLE_MS each, CUDA events around each sample; the
median per call.

Usage: baseline.py [--list] [--quick] [--sample-ms MS] [--samples N] [--budget-s S]
                   [--exclude WORD]... [FILTER...]
(--list needs no GPU and no torch; --quick: tiny shapes; --exclude leaves out the problems
whose `op shape tag` line contains WORD.)
"""
import json
import sys
import time

QWEN25_05B = dict(name="qwen2.5-0.5b", hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, vocab=151936)
QWEN3_06B = dict(name="qwen3-0.6b", hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, vocab=151936)
TINY = dict(name="tiny", hidden=128, intermediate=256, heads=2, kv_heads=1, head_dim=64, vocab=1000)


def catalog(quick):
    """[(op, shape, tag, make)] in ruda-bench's order; make() returns the timed callable."""
    out = []

    def add(op, shape, tag, make):
        if not any(o == op and s == shape for o, s, _, _ in out):
            out.append((op, shape, tag, make))

    copy_bytes = 1 << 16 if quick else 1 << 29
    add("copy", [copy_bytes], "Tensor.copy_", lambda: copy_problem(copy_bytes))
    for s in ((64,) if quick else (2048, 4096, 8192)):
        add("linear_bf16", [s, s, s], "square", lambda s=s: linear_problem(s, s, s))
    models = (TINY,) if quick else (QWEN25_05B, QWEN3_06B)
    for model in models:
        h, q, kv = model["hidden"], model["heads"] * model["head_dim"], model["kv_heads"] * model["head_dim"]
        projections = [("q", q, h), ("k,v", kv, h), ("o", h, q), ("gate_up", 2 * model["intermediate"], h),
                       ("down", h, model["intermediate"]), ("lm_head", model["vocab"], h)]
        for m in ((1, 8, 32) if quick else (1, 8, 128, 2048)):
            for proj, n, k in projections:
                add("linear_bf16", [m, n, k], f"{model['name']} {proj}", lambda m=m, n=n, k=k: linear_problem(m, n, k))
    hq, hkv, d = 16, 8, 128
    for t in ((64,) if quick else (1024, 4096, 16384)):
        add("attention_prefill_bf16", [t, hq, hkv, d], "causal", lambda t=t: prefill_problem(t, hq, hkv, d))
    for b in ((1, 2) if quick else (1, 16)):
        for s in ((64, 300) if quick else (1024, 4096, 16384)):
            add("attention_decode_bf16", [b, hq, hkv, d, s], "", lambda b=b, s=s: decode_problem(b, hq, hkv, d, s))
    rows, hidden = (64, 256) if quick else (4096, 4096)
    n = rows * hidden
    add("rms_norm_bf16", [rows, hidden], "", lambda: rms_norm_problem(rows, hidden, False))
    add("rms_norm_residual_bf16", [rows, hidden], "x + r, then rms_norm", lambda: rms_norm_problem(rows, hidden, True))
    add("softmax_bf16", [rows, hidden], "", lambda: unary_problem([rows, hidden], "softmax"))
    add("add_bf16", [n], "", lambda: add_problem(n))
    add("silu_bf16", [n], "", lambda: unary_problem([n], "silu"))
    add("swiglu_bf16", [rows, hidden], "silu(gate) * up", lambda: swiglu_problem(rows, hidden))
    vocab = 1000 if quick else 151936
    add("argmax_bf16", [1, vocab], "", lambda: unary_problem([1, vocab], "argmax"))
    # The gated delta rule at Qwen3.5's heads (Hk 16, Hv 32, K = V = 128), in ruda-bench's order.
    hk, hv, kd, vd = (1, 2, 32, 40) if quick else (16, 32, 128, 128)
    for b in ((1, 2) if quick else (1, 32)):
        add("gated_delta_decode_bf16", [b, hk, hv, kd, vd], "fla fused_recurrent_gated_delta_rule",
            lambda b=b: gated_delta_problem(b, 1, hk, hv, kd, vd, False))
    for t in ((70,) if quick else (2048, 8192, 65536)):
        add("gated_delta_chunk_bf16", [1, t, hk, hv, kd, vd], "fla chunk_gated_delta_rule",
            lambda t=t: gated_delta_problem(1, t, hk, hv, kd, vd, True))
    # Routed experts at Qwen3-30B-A3B's shapes (E 128, top 8, H 2048, I 768), in ruda-bench's order.
    e, k, h, i = (6, 2, 40, 24) if quick else (128, 8, 2048, 768)
    for t in ((9,) if quick else (512, 4096)):
        add("moe_experts_bf16", [t, e, k, h, i], "torch._grouped_mm",
            lambda t=t: moe_experts_problem(t, e, k, h, i, grouped=True))
        add("moe_experts_loop_bf16", [t, e, k, h, i], "a torch.matmul per expert",
            lambda t=t: moe_experts_problem(t, e, k, h, i, grouped=False))
    return out


class Skipped(Exception):
    """A baseline that cannot run on this machine (a missing optional package), said so."""


_FLA = None


def fla_gated_delta():
    """`fla.ops.gated_delta_rule`, imported once; Skipped when flash-linear-attention is not
    importable."""
    global _FLA
    if _FLA is None:
        try:
            import fla
            import fla.ops.gated_delta_rule as gdr
            _FLA = gdr
            print(f"baseline.py: flash-linear-attention {getattr(fla, '__version__', '?')} from "
                  f"{fla.__path__[0] if hasattr(fla, '__path__') else '?'}", file=sys.stderr, flush=True)
        except Exception as e:  # ImportError, or an fla that fails on this torch/triton
            _FLA = e
    if isinstance(_FLA, Exception):
        raise Skipped(f"flash-linear-attention (fla.ops.gated_delta_rule) is not importable: {_FLA!r}")
    return _FLA


# ---- problems (torch is imported by main only when timing) ----------------------------------

def rand(*shape):
    return torch.rand(*shape, device="cuda", dtype=torch.bfloat16) * 2 - 1


def copy_problem(nbytes):
    src = torch.zeros(nbytes // 4, device="cuda", dtype=torch.int32)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def linear_problem(m, n, k):
    x, w = rand(m, k), rand(n, k)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    # y = x·Wᵀ into a preallocated output, like linear_into.
    return lambda: torch.matmul(x, w.t(), out=out)


def sdpa_fn(q, k, v, causal):
    f = torch.nn.functional.scaled_dot_product_attention
    try:
        f(q, k, v, is_causal=causal, enable_gqa=True)
        return lambda: f(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return lambda: f(q, k, v, is_causal=causal)


def prefill_problem(t, hq, hkv, d):
    return sdpa_fn(rand(1, hq, t, d), rand(1, hkv, t, d), rand(1, hkv, t, d), True)


def decode_problem(b, hq, hkv, d, s):
    return sdpa_fn(rand(b, hq, 1, d), rand(b, hkv, s, d), rand(b, hkv, s, d), False)


def rms_norm(x, g, eps):
    if hasattr(torch.nn.functional, "rms_norm"):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), g, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g).to(x.dtype)


def rms_norm_problem(rows, hidden, residual):
    x, r = rand(rows, hidden), rand(rows, hidden)
    g = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    if residual:
        return lambda: rms_norm(x + r, g, 1e-6)
    return lambda: rms_norm(x, g, 1e-6)


def unary_problem(shape, which):
    x = rand(*shape)
    return {"softmax": lambda: torch.softmax(x, dim=-1),
            "silu": lambda: torch.nn.functional.silu(x),
            "argmax": lambda: torch.argmax(x, dim=-1)}[which]


def add_problem(n):
    a, b = rand(n), rand(n)
    return lambda: a + b


def swiglu_problem(rows, hidden):
    gu = rand(rows, 2 * hidden)
    gate, up = gu[:, :hidden], gu[:, hidden:]
    return lambda: torch.nn.functional.silu(gate) * up


def gated_delta_problem(b, t, hk, hv, kd, vd, chunked):
    """fla's chunked (prefill from a zero state) or fused recurrent (one decode step from a given
    state) gated delta rule on the inputs the model passes: q/k L2-normalised over the head dim,
    beta = sigmoid, g = log decay <= 0 (both f32), bf16 q/k/v, an f32 state, scale K^-1/2.

    Layout: fla takes `[B, T, H, K]` (and gates `[B, T, Hv]`) where RUDA's op takes
    `[B, H, T, K]` (gates `[B, Hv, T]`): RUDA's q[b, h, t, :] is fla's q[b, t, h, :], one
    transpose(1, 2) apart (not timed: the inputs are made in fla's layout here). The states are
    `[B, Hv, K, V]` on both sides (fla's default, state_v_first=False). Value head j reads key
    head j // (Hv // Hk) on both sides; an fla without grouped value heads (an output with Hk
    heads, or an error) gets q/k repeated to Hv heads outside the timed region."""
    gdr = fla_gated_delta()
    F = torch.nn.functional
    q = F.normalize(torch.randn(b, t, hk, kd, device="cuda"), p=2, dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(b, t, hk, kd, device="cuda"), p=2, dim=-1).to(torch.bfloat16)
    v = rand(b, t, hv, vd)
    beta = torch.sigmoid(torch.rand(b, t, hv, device="cuda") * 2 - 1)
    g = F.logsigmoid(torch.rand(b, t, hv, device="cuda") * 2 - 1)
    kw = dict(g=g, beta=beta, scale=kd ** -0.5, output_final_state=True)
    if chunked:
        fn = gdr.chunk_gated_delta_rule
    else:
        fn = gdr.fused_recurrent_gated_delta_rule
        kw["initial_state"] = (torch.rand(b, hv, kd, vd, device="cuda") * 2 - 1) * 0.1

    def call(q, k):
        with torch.no_grad():
            return fn(q, k, v, **kw)

    try:
        out = call(q, k)[0]
        grouped = out.shape[2] == hv
    except Exception:
        if hv == hk:
            raise
        grouped = False
    if not grouped:
        q, k = q.repeat_interleave(hv // hk, 2), k.repeat_interleave(hv // hk, 2)
        call(q, k)
    return lambda: call(q, k)


def moe_experts_problem(t, e, k, h, i, grouped):
    """SwiGLU experts on t·k rows already sorted by expert, spread as ruda-bench spreads them
    (row r to expert r mod E, so every expert gets t·k / E rows): gate/up `[E, 2I, H]` (gate rows
    first), down `[E, H, I]`, as transformers 5 stores them. Grouped: `torch._grouped_mm` with
    the cumulative row counts (transformers' `grouped_mm` experts); else one `torch.matmul` per
    expert on its row block (transformers' eager loop, without its gather and scatter)."""
    rows = t * k
    counts = [rows // e + (1 if x < rows % e else 0) for x in range(e)]
    x = rand(rows, h)
    gate_up, down = rand(e, 2 * i, h) * h ** -0.5, rand(e, h, i) * i ** -0.5
    silu = torch.nn.functional.silu
    if grouped:
        if not hasattr(torch, "_grouped_mm"):
            raise Skipped(f"torch {torch.__version__} has no torch._grouped_mm")
        offs = torch.cumsum(torch.tensor(counts, device="cuda"), 0).to(torch.int32)
        gu_t, down_t = gate_up.transpose(-2, -1), down.transpose(-2, -1)

        def run():
            gu = torch._grouped_mm(x, gu_t, offs=offs)
            return torch._grouped_mm(silu(gu[:, :i]) * gu[:, i:], down_t, offs=offs)
        return run
    starts = [sum(counts[:x]) for x in range(e)]

    def run_loop():
        out = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
        for x_, (s, c) in enumerate(zip(starts, counts)):
            if c:
                gu = torch.matmul(x[s:s + c], gate_up[x_].t())
                out[s:s + c] = torch.matmul(silu(gu[:, :i]) * gu[:, i:], down[x_].t())
        return out
    return run_loop


def timed(fn, sample_ms, samples):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = (time.perf_counter() - t0) * 1e3
    iters = max(1, min(10000, int(-(-sample_ms // max(once, 1e-4)))))
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    times.sort()
    return times[len(times) // 2], iters


def parse_args(args):
    opts = dict(list=False, quick=False, sample_ms=15.0, samples=5, budget_s=240.0, filters=[], exclude=[])
    it = iter(args)
    for a in it:
        if a in ("--list", "--quick"):
            opts[a[2:]] = True
        elif a == "--exclude":
            word = next(it, None)
            if word is None:
                sys.exit("baseline.py: --exclude needs a word")
            opts["exclude"].append(word)
        elif a in ("--sample-ms", "--samples", "--budget-s"):
            v = float(next(it, "nan"))
            if not v > 0:
                sys.exit(f"baseline.py: {a} needs a positive number")
            opts[a[2:].replace("-", "_")] = v
        elif a.startswith("-"):
            sys.exit(f"baseline.py: unknown option {a}\n{__doc__}")
        else:
            opts["filters"].append(a)
    return opts


def main():
    global torch
    opts = parse_args(sys.argv[1:])
    line = lambda p: f"{p[0]} {p[1]} {p[2]}"  # noqa: E731
    problems = [p for p in catalog(opts["quick"])
                if (not opts["filters"] or any(f in line(p) for f in opts["filters"]))
                and not any(x in line(p) for x in opts["exclude"])]
    if opts["list"]:
        for op, shape, tag, _ in problems:
            print(f"{op} {shape} {tag}")
        return 0
    import torch as _torch
    torch = _torch
    if not torch.cuda.is_available():
        sys.exit("baseline.py: no CUDA device for PyTorch")
    print(f"baseline.py: torch {torch.__version__} on {torch.cuda.get_device_name()}, {len(problems)} problems",
          file=sys.stderr, flush=True)
    started, failed = time.time(), 0
    for i, (op, shape, tag, make) in enumerate(problems):
        where = f"[{i + 1}/{len(problems)}] {op} {shape}"
        if time.time() - started > opts["budget_s"]:
            print(f"  {where}: SKIPPED (budget spent)", file=sys.stderr, flush=True)
            continue
        t0 = time.time()
        try:
            ms, iters = timed(make(), opts["sample_ms"], int(opts["samples"]))
        except Skipped as e:
            print(f"  {where}: SKIPPED ({e})", file=sys.stderr, flush=True)
            continue
        except Exception as e:  # a failed baseline is reported, the others still run
            failed += 1
            print(f"  {where}: FAILED: {e!r}", file=sys.stderr, flush=True)
            continue
        finally:
            torch.cuda.empty_cache()
        print(json.dumps({"op": op, "shape": shape, "torch_ms": round(ms, 6), "iters": iters}), flush=True)
        print(f"  {where}: {ms:.4f} ms ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
