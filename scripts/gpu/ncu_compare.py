"""Compare Nsight Compute's memory counters with the interpreter's (the GPU rung's ncu step).

Usage: python3 ncu_compare.py PROFILE_DIR NCU_DIR > ncu_compare.json

PROFILE_DIR holds `rudac profile ID --json` of each kernel (made with the bundle); NCU_DIR holds
`ncu --csv` of `rudac run ID --engine cuda` (its second launch). Prints one JSON object: per
kernel, each metric's value from both and their ratio (GPU / interpreter).
"""

import csv
import json
import pathlib
import sys

# Nsight Compute metric -> the interpreter's counter(s) it corresponds to.
PAIRS = {
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": ["shared_load_wavefronts"],
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": ["shared_store_wavefronts"],
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": ["shared_load_bank_conflicts"],
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": ["shared_store_bank_conflicts"],
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": ["global_load_sectors"],
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": ["global_store_sectors"],
    # cp.async's global reads: the interpreter counts them among the global load sectors.
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum": [],
}


def read_ncu(path):
    """Metric name -> value of the one profiled launch in an `ncu --csv` log."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV table (ncu failed or profiled nothing): " + " | ".join(lines[-3:]))
    values = {}
    for row in csv.DictReader(lines[start:]):
        name, value = row.get("Metric Name"), row.get("Metric Value", "")
        if name:
            try:
                values[name] = float(value.replace(",", ""))
            except ValueError:
                values[name] = None
    return values


def counter(profile, key):
    value = profile
    for part in key.split("."):
        value = value[part]
    return value


def main():
    profile_dir, ncu_dir = map(pathlib.Path, sys.argv[1:3])
    out = {"note": "ratio = Nsight Compute / interpreter; the interpreter's model is in docs/profiling.md", "kernels": {}}
    for profile_path in sorted(profile_dir.glob("*.json")):
        kernel = profile_path.stem
        entry = out["kernels"].setdefault(kernel, {})
        ncu_path = ncu_dir / f"{kernel}.csv"
        if not ncu_path.exists():
            entry["error"] = "not profiled (time ran out)"
            continue
        try:
            gpu = read_ncu(ncu_path)
        except ValueError as e:
            entry["error"] = str(e)
            continue
        profile = json.loads(profile_path.read_text())
        for metric, keys in PAIRS.items():
            ours = sum(counter(profile, k) for k in keys) if keys else None
            theirs = gpu.get(metric)
            if metric == "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum" and theirs is not None:
                # The interpreter counts cp.async's global reads as loads; so does this sum.
                theirs += gpu.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum") or 0
            ratio = theirs / ours if ours and theirs is not None else None
            entry[metric] = {"ncu": theirs, "interpreter": ours, "ratio": ratio}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
