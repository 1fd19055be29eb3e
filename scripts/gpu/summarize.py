#!/usr/bin/env python3
"""Merge the GPU rung's results into RESULTS_DIR/summary.json and summary.md and print a
one-screen summary: tests per executable, then each benchmark as a ratio to its PyTorch
baseline measured in the same run on the same GPU.

Columns: `x base` = torch_ms / ruda_ms (above 1: RUDA is faster); TFLOP/s and GB/s are RUDA's
(GB/s counts the bytes the op must move at least); `copy%` = RUDA's GB/s as a fraction of the
device-to-device copy bandwidth measured in the same run (ours / PyTorch's copy_). Targets of
the op-library and gated delta issues are checked at the end (a gated delta decode row's bytes
are its state traffic, so its GB/s over the best copy bandwidth is the fraction of its floor),
then the MoE issue's measurements, which have no goal (the grouped experts against
torch._grouped_mm and a per-expert loop, the decode step's fraction of its selected experts'
weight bytes at copy bandwidth, and the MoE model's decode tokens/s against transformers).
Any input file may be missing: what is there is summarized.

Usage: summarize.py RESULTS_DIR
"""
import json
import os
import sys


def read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows


def fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def bench_rows(results):
    # The bench step's rows, then the gdelta step's (the gated delta rule, and the copy rows
    # when the bench step did not run).
    ours = [r for name in ("bench_ruda.jsonl", "gdelta_ruda.jsonl", "moe_ruda.jsonl")
            for r in read_jsonl(os.path.join(results, name))]
    theirs = {(r["op"], tuple(r["shape"])): r for name in ("bench_torch.jsonl", "gdelta_torch.jsonl", "moe_torch.jsonl")
              for r in read_jsonl(os.path.join(results, name))}
    copy = {"ruda": None, "torch": None}
    for r in ours:
        if r["op"] == "copy" and r.get("ruda_ms"):
            copy["ruda"] = r["bytes"] / r["ruda_ms"] / 1e6
    for (op, shape), t in theirs.items():
        if op == "copy" and t.get("torch_ms"):
            copy["torch"] = 2 * shape[0] / t["torch_ms"] / 1e6
    rows, matched = [], set()
    for r in ours:
        base = r.get("base", r["op"])
        key = (base, tuple(r["shape"]))
        t = theirs.get(key)
        matched.add(key)
        ms, tms = r.get("ruda_ms"), t.get("torch_ms") if t else None
        gbs = r["bytes"] / ms / 1e6 if ms and r.get("bytes") else None
        # Compute-bound rows (GEMM above the GEMV range, prefill) get no copy fraction.
        memory_bound = (r["op"] not in ("attention_prefill_bf16", "gated_delta_chunk_bf16")
                        and not r["op"].startswith("moe_experts")
                        and not (r["op"].startswith(("linear", "awq_linear")) and r["shape"][0] > 16))
        row = {
            "op": r["op"], "shape": r["shape"], "tag": r.get("tag", ""), "baseline": base,
            "ruda_ms": ms, "torch_ms": tms,
            "ratio": round(tms / ms, 4) if ms and tms else None,
            "tflops": round(r["flops"] / ms / 1e9, 2) if ms and r.get("flops") else None,
            "gbs": round(gbs, 1) if gbs else None,
            "copy_frac_ours": round(gbs / copy["ruda"], 3) if memory_bound and gbs and copy["ruda"] else None,
            "copy_frac_torch": round(gbs / copy["torch"], 3) if memory_bound and gbs and copy["torch"] else None,
        }
        if "splits" in r:
            row["splits"] = r["splits"]
        rows.append(row)
    for key, t in theirs.items():
        if key not in matched:
            rows.append({"op": key[0], "shape": list(key[1]), "tag": "(no RUDA row)", "baseline": key[0],
                         "ruda_ms": None, "torch_ms": t.get("torch_ms"), "ratio": None})
    return rows, copy


def find(rows, op, shape):
    return next((r for r in rows if r["op"] == op and r["shape"] == shape), None)


def targets(rows, copy):
    """The op-library (5) and gated delta (13) issues' targets on an H200: (name, value, goal,
    met)."""
    out = []
    g = find(rows, "linear_bf16", [4096, 4096, 4096])
    out.append(("GEMM 4096^3 bf16 vs cuBLAS", g and g["ratio"], 0.45))
    best_copy = max([c for c in copy.values() if c] or [0]) or None
    gemv = [r for r in rows if r["op"] in ("linear_bf16", "linear_tuned_bf16") and r["shape"][0] == 1 and r.get("gbs")]
    if gemv and best_copy:
        # The large-weight rows are the meaningful ones (small matrices fit in L2).
        big = [r for r in gemv if r["shape"][1] * r["shape"][2] >= 4 * 1024 * 1024] or gemv
        worst = min(max(r["gbs"] for r in big if r["shape"] == s["shape"]) for s in big)
        out.append(("GEMV M=1 (weights >= 8 MB), worst shape, fraction of copy bandwidth", round(worst / best_copy, 3), 0.75))
    else:
        out.append(("GEMV M=1 fraction of copy bandwidth", None, 0.75))
    p = find(rows, "attention_prefill_bf16", [4096, 16, 8, 128])
    out.append(("prefill attention 4k vs SDPA", p and p["ratio"], 0.5))
    # The gated delta issue's (13), at Qwen3.5's heads (Hk 16, Hv 32, K = V = 128).
    for t in (2048, 8192, 65536):
        c = find(rows, "gated_delta_chunk_bf16", [1, t, 16, 32, 128, 128])
        out.append((f"gated delta chunked prefill T={t} vs fla chunk_gated_delta_rule", c and c["ratio"], 1.0))
    for b in (1, 32):
        d = find(rows, "gated_delta_decode_bf16", [b, 16, 32, 128, 128])
        # The step's floor: its state bytes (read and written) at the best measured copy bandwidth.
        frac = round(d["gbs"] / best_copy, 3) if d and d.get("gbs") and best_copy else None
        out.append((f"gated delta decode step B={b}, fraction of its state-traffic floor", frac, 0.8))
    return [(n, v, goal, v is not None and v >= goal) for n, v, goal in out]


def moe_measurements(rows, copy, moe_model):
    """The MoE issue's (16) measurements, without goals: (name, value)."""
    out = []
    best_copy = max([c for c in copy.values() if c] or [0]) or None
    for t in (512, 4096):
        shape = [t, 128, 8, 2048, 768]
        for op, base in (("moe_experts_bf16", "torch._grouped_mm"), ("moe_experts_loop_bf16", "a torch.matmul loop")):
            r = find(rows, op, shape)
            out.append((f"grouped experts T={t} (Qwen3-30B-A3B shapes) vs {base}", r and r["ratio"]))
    for t in (1, 8):
        d = find(rows, "moe_decode_bf16", [t, 128, 8, 2048, 768])
        frac = round(d["gbs"] / best_copy, 3) if d and d.get("gbs") and best_copy else None
        out.append((f"MoE decode step T={t}, fraction of its selected experts' weight bytes at copy bandwidth", frac))
        g = find(rows, "moe_decode_grouped_bf16", [t, 128, 8, 2048, 768])
        speedup = round(g["ruda_ms"] / d["ruda_ms"], 3) if d and g and d.get("ruda_ms") and g.get("ruda_ms") else None
        out.append((f"MoE decode step T={t}, the decode path's speed-up over the dispatched grouped GEMMs", speedup))
    for m in moe_model.get("models", []):
        hf, ours = m.get("transformers", {}), m.get("ruda") or {}
        ratio = (ours["decode_tokens_per_second"] / hf["decode_tokens_per_second"]
                 if ours.get("decode_tokens_per_second") and hf.get("decode_tokens_per_second") else None)
        out.append((f"{m['name']} decode tokens/s vs transformers", ratio and round(ratio, 3)))
    return out


def model_lines(model):
    lines = []
    for m in model.get("models", []):
        hf = m.get("transformers", {})
        ours = m.get("ruda")
        line = (f"  {m['name']}: transformers prefill {fmt(hf.get('prefill_ms'))} ms, "
                f"decode {fmt(hf.get('decode_tokens_per_second'))} tok/s")
        if ours:
            ratio_p = hf.get("prefill_ms") / ours["prefill_ms"] if ours.get("prefill_ms") else None
            ratio_d = (ours["decode_tokens_per_second"] / hf["decode_tokens_per_second"]
                       if ours.get("decode_tokens_per_second") and hf.get("decode_tokens_per_second") else None)
            line += (f"; RUDA prefill {fmt(ours.get('prefill_ms'))} ms (x{fmt(ratio_p)}), "
                     f"decode {fmt(ours.get('decode_tokens_per_second'))} tok/s (x{fmt(ratio_d)}), "
                     f"teacher-forced agreement {ours.get('agreement', '-')}"
                     f"{' (stopped at EOS after %s tokens)' % ours.get('generated_tokens') if ours.get('short') else ''}"
                     f"; model-layer target decode >= 3x "
                     f"transformers: {'NOT MEASURED' if ratio_d is None else 'MET' if ratio_d >= 3 else 'NOT MET'}")
        else:
            line += f"; RUDA: {m.get('ruda_skipped', 'not run')}"
        lines.append(line)
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    results = sys.argv[1]
    machine = read_json(os.path.join(results, "machine.json"), {})
    tests = read_json(os.path.join(results, "tests.json"), [])
    model = read_json(os.path.join(results, "model_bench.json"), {})
    moe_model = read_json(os.path.join(results, "moe_bench.json"), {})
    ncu = read_json(os.path.join(results, "ncu_compare.json"), {})
    rows, copy = bench_rows(results)
    goals = targets(rows, copy)
    moe = moe_measurements(rows, copy, moe_model)
    summary = {"machine": machine, "tests": tests, "copy_gbs": copy, "bench": rows,
               "targets": [{"target": n, "value": v, "goal": g, "met": ok} for n, v, g, ok in goals],
               "moe": [{"measurement": n, "value": v} for n, v in moe],
               "model_bench": model, "moe_bench": moe_model, "ncu_compare": ncu}
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    md = [f"# GPU rung on {machine.get('gpu', '?')} (driver {machine.get('driver', '?')}), "
          f"commit {str(machine.get('commit', '?'))[:10]}, {machine.get('date', '?')}", ""]
    total_p = sum(t.get("passed", 0) for t in tests)
    total_f = sum(t.get("failed", 0) for t in tests)
    bad = [t for t in tests if t.get("exit") != 0]
    md.append(f"Tests: {total_p} passed, {total_f} failed; executables not exiting 0: "
              + (", ".join(f"{t['compiler']}/{t['executable']} (exit {t['exit']})" for t in bad) or "none"))
    md.append("")
    md.append(f"Copy bandwidth (read + write): RUDA {fmt(copy['ruda'])} GB/s, PyTorch copy_ {fmt(copy['torch'])} GB/s")
    md.append("")
    md.append("| op | shape | tag | RUDA ms | base ms | x base | TFLOP/s | GB/s | copy% ours/torch | splits |")
    md.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cf = "-" if r.get("copy_frac_ours") is None else f"{r['copy_frac_ours']:.2f}/{fmt(r.get('copy_frac_torch'))}"
        md.append(f"| {r['op']} | {'x'.join(map(str, r['shape']))} | {r['tag']} | {fmt(r['ruda_ms'], 4)} | "
                  f"{fmt(r['torch_ms'], 4)} | {fmt(r['ratio'])} | {fmt(r.get('tflops'))} | {fmt(r.get('gbs'))} | {cf} | "
                  f"{r.get('splits', '')} |")
    md.append("")
    md.append("Targets (issues 5 and 13):")
    for n, v, goal, ok in goals:
        verdict = "NOT MEASURED" if v is None else "MET" if ok else "NOT MET"
        md.append(f"- {verdict}: {n}: {fmt(v)} (goal >= {goal})")
    md.append("")
    md.append("MoE (issue 16, measurements without goals):")
    for n, v in moe:
        md.append(f"- {'NOT MEASURED' if v is None else 'MEASURED'}: {n}: {fmt(v)}")
    if model:
        md.append("")
        md.append("Model benchmark (prefill 512 tokens, greedy decode 128, bf16):")
        md += model_lines(model)
    if moe_model:
        md.append("")
        md.append("MoE model benchmark (prefill 512 tokens, greedy decode 128, bf16):")
        md += model_lines(moe_model)
    if ncu.get("kernels"):
        md.append("")
        md.append("Nsight Compute / interpreter counters (1.0 = the interpreter's model matches):")
        for kernel, metrics in ncu["kernels"].items():
            if "error" in metrics:
                md.append(f"- {kernel}: {metrics['error']}")
                continue
            cells = [f"{m.split('__')[1].replace('.sum', '')} {fmt(v.get('ratio'))}" for m, v in metrics.items()
                     if v.get("interpreter") is not None]
            md.append(f"- {kernel}: " + ", ".join(cells))
    with open(os.path.join(results, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    # The one-screen version: tests, the headline rows, targets.
    print("\n".join(md[:3]))
    for t in tests:
        if t.get("exit") != 0:
            print(f"  FAIL {t['compiler']:<5} {t['executable']:<48} {t['passed']:>4} passed {t['failed']:>3} failed  {t['seconds']}s")
    print(md[4])
    print(f"benchmarks: {len(rows)} rows (full table in summary.md); x base = torch_ms / ruda_ms")
    headline = [r for r in rows if r["op"] != "linear_bf16" or r["tag"] == "square" or r["shape"][0] in (1, 2048)]
    for r in headline:
        extra = f" copy% {r['copy_frac_ours']}" if r.get("copy_frac_ours") is not None and r["op"] != "copy" else ""
        print(f"  {r['op']:<32} {'x'.join(map(str, r['shape'])):<22} ruda {fmt(r['ruda_ms'], 4):>8} ms  "
              f"base {fmt(r['torch_ms'], 4):>8} ms  x{fmt(r['ratio'])}{extra}")
    print("\n".join(md[md.index("Targets (issues 5 and 13):"):]))


if __name__ == "__main__":
    main()
