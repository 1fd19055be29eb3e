#!/usr/bin/env python3
"""Merge the GPU rung's results into RESULTS_DIR/summary.json and print a one-screen summary:
tests per executable, and each benchmark as a ratio to its PyTorch baseline measured in the
same run (speedup = torch_ms / ruda_ms; above 1 means RUDA is faster)."""
import json
import os
import sys


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main():
    results = sys.argv[1]
    machine = json.load(open(os.path.join(results, "machine.json")))
    tests = json.load(open(os.path.join(results, "tests.json")))
    ours = {(r["op"], tuple(r["shape"])): r["ruda_ms"] for r in read_jsonl(os.path.join(results, "bench_ruda.jsonl"))}
    theirs = {(r["op"], tuple(r["shape"])): r["torch_ms"] for r in read_jsonl(os.path.join(results, "bench_torch.jsonl"))}
    bench = []
    for key in sorted(set(ours) | set(theirs)):
        r, t = ours.get(key), theirs.get(key)
        bench.append({"op": key[0], "shape": list(key[1]), "ruda_ms": r, "torch_ms": t,
                      "speedup_vs_torch": round(t / r, 4) if r and t else None})
    summary = {"machine": machine, "tests": tests, "bench": bench}
    json.dump(summary, open(os.path.join(results, "summary.json"), "w"), indent=1)

    print(f"GPU rung on {machine['gpu']} (driver {machine['driver']}), commit {machine['commit'][:10]}")
    total_p = sum(t["passed"] for t in tests)
    total_f = sum(t["failed"] for t in tests)
    for t in tests:
        mark = "ok  " if t["exit"] == 0 else "FAIL"
        print(f"  {mark} {t['compiler']:<5} {t['executable']:<48} {t['passed']:>4} passed {t['failed']:>3} failed  {t['seconds']}s")
    print(f"tests: {total_p} passed, {total_f} failed")
    print("benchmarks (speedup = torch_ms / ruda_ms):")
    for b in bench:
        print(f"  {b['op']:<14} {str(b['shape']):<20} ruda {b['ruda_ms']} ms  torch {b['torch_ms']} ms  speedup {b['speedup_vs_torch']}")


if __name__ == "__main__":
    main()
