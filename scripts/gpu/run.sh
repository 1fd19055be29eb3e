#!/usr/bin/env bash
# The GPU rung (shared/TESTING.md): run on the GPU machine from the project root after
# scripts/gpu/bundle.sh built scripts/gpu/bundle/ here. Runs every bundled test executable on
# CUDA (RUDA_REQUIRE_GPU=1, so a missing GPU fails instead of skipping) for each compiler in
# RUDA_GPU_COMPILERS, then rudac check with the machine's ptxas, then the benchmarks beside
# their PyTorch baselines, the model benchmark and the batched-generation one, then the gated delta rule's benchmarks
# beside flash-linear-attention's, then the MoE rows and model, and writes into RESULTS_DIR a few files: machine.json,
# tests.json, bench_ruda.jsonl, bench_torch.jsonl, model_bench.json, batch_bench.json, serve_bench.json, gdelta_ruda.jsonl,
# gdelta_torch.jsonl, moe_ruda.jsonl, moe_torch.jsonl, moe_bench.json, summary.json, summary.md, and logs.tar.gz (every
# log). The summary ends stdout.
#
# Every step has a timeout, and all of them share RUDA_GPU_BUDGET_S (420 s by default, under
# the device tool's 600 s per call): tests 180 s in all (each executable at most 120 s: a crate's tests are one binary of modules), rudac
# check 60 s, rudac run 30 s, ncu 40 s, gpucheck 45 s, the model bench 150 s, the batch bench 120 s
# (a Qwen2.5-0.5B-shaped model, 7 runs of ruda-llm batch: alone with RUDA_GPU_STEPS=batch, about
# 2 minutes), the serve bench 120 s (ruda-serve and bench-serve at 1, 8 and 32 clients, alone with
# RUDA_GPU_STEPS=serve about 2 minutes), ruda-bench 100 s, baseline
# 80 s, the fla wheels' install 30 s (2 s expected), the gated delta rows 60 s (ruda-bench, ~25 s
# expected) and 120 s (fla, whose first chunked call compiles and autotunes ~30 Triton
# configurations), each capped by what is left of the budget (less a margin for the summary).
# `RUDA_GPU_STEPS=gdelta` alone takes at most 3.5 minutes. The moe step: ruda-bench's MoE rows
# 50 s (~2 GB of expert weights made per row, ~20 s expected), baseline.py's 50 s and the
# Qwen3-30B-A3B-shaped model 150 s (4 layers, ~4 GB of random weights made and saved, then
# transformers' and RUDA's prefill and decode); `RUDA_GPU_STEPS=moe` alone takes at most 4 minutes.
#
# Usage: bash scripts/gpu/run.sh RESULTS_DIR
# Knobs: RUDA_GPU_COMPILERS ("ptx nvrtc"), RUDA_GPU_STEPS ("tests check run ncu gpucheck model batch serve bench gdelta moe"),
#        RUDA_GPU_BUDGET_S (420), RUDA_BENCH_FILTER (words passed to both benchmark programs in the
#        bench step; the gdelta step runs the gated_delta rows, and the copy row when the bench
#        step does not run, for the decode rows' floor; so does the moe step for its MoE rows).
set -uo pipefail
cd "$(dirname "$0")/../.."
results=${1:?usage: run.sh RESULTS_DIR}
mkdir -p "$results"
logs=$(mktemp -d /tmp/ruda-gpu-logs.XXXXXX)
# Python packages installed for this run (the fla wheels), apart from the logs that come back.
pylib=$(mktemp -d /tmp/ruda-gpu-pylib.XXXXXX)
bundle=scripts/gpu/bundle
[ -f "$bundle/executables.tar.xz" ] || [ -d "$bundle/tests" ] \
  || { echo "run.sh: no $bundle; run scripts/gpu/bundle.sh first" >&2; exit 2; }
# Always the archive's executables when there is one (never a stale unpacked copy).
if [ -f "$bundle/executables.tar.xz" ]; then
  rm -rf "$bundle/tests" "$bundle/bin"
  tar -C "$bundle" -xJf "$bundle/executables.tar.xz"
fi
compilers=${RUDA_GPU_COMPILERS:-ptx nvrtc}
steps=" ${RUDA_GPU_STEPS:-tests check run ncu gpucheck model batch serve bench gdelta moe} "
budget=${RUDA_GPU_BUDGET_S:-420}
filter=${RUDA_BENCH_FILTER:-}
t_start=$(date +%s)

# Seconds for a step: its own cap, or what is left of the budget (less 20 s for the summary).
allot() {
  local left=$((budget - ($(date +%s) - t_start) - 20))
  [ "$left" -lt 5 ] && left=5
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
has_step() { [[ "$steps" == *" $1 "* ]]; }
note() { echo "run.sh [$(( $(date +%s) - t_start ))s] $*" >&2; }

export RUDA_REQUIRE_GPU=1 RUDA_DEVICE=cuda RUDA_INTERP_THREADS=8
# A fresh autotune and module cache for this run, kept with the logs.
export RUDA_CACHE_DIR="$logs/cache"
{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"commit\": \"$(cat "$bundle/COMMIT" 2>/dev/null)\","
  echo "  \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\","
  echo "  \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)\","
  echo "  \"ptxas\": \"$(ptxas --version 2>/dev/null | tail -1)\","
  echo "  \"torch\": \"$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)\""
  echo "}"
} > "$results/machine.json"

echo '[' > "$results/tests.json"
if has_step tests; then
  tests_end=$(( $(date +%s) + $(allot 180) ))
  first=1
  for compiler in $compilers; do
    for exe in "$bundle"/tests/*; do
      case "$exe" in *.skip) continue ;; esac
      name=$(basename "$exe")
      skips=(--exact)
      if [ -f "$exe.skip" ]; then
        while read -r test; do skips+=(--skip "$test"); done < "$exe.skip"
      fi
      log="$logs/$compiler--$name.log"
      left=$(( tests_end - $(date +%s) ))
      if [ "$left" -lt 5 ]; then
        echo "skipped: the tests' time is spent" > "$log"; rc=125; secs=0
      else
        [ "$left" -gt 120 ] && left=120
        start=$(date +%s.%N)
        RUDA_CUDA_COMPILER=$compiler timeout "$left" "$exe" --test-threads=4 "${skips[@]}" >"$log" 2>&1
        rc=$?
        secs=$(python3 -c "import time; print(round(time.time() - $start, 2))")
      fi
      passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
      failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
      [ $first = 1 ] || echo ',' >> "$results/tests.json"
      first=0
      printf '{"compiler":"%s","executable":"%s","exit":%d,"passed":%d,"failed":%d,"seconds":%s}' \
        "$compiler" "$name" "$rc" "$passed" "$failed" "$secs" >> "$results/tests.json"
    done
  done
  note "tests done"
fi
echo ']' >> "$results/tests.json"

# Every registered configuration through this machine's ptxas (CUDA 13).
if has_step check && command -v ptxas >/dev/null; then
  RUDA_PTXAS=$(command -v ptxas) timeout "$(allot 60)" "$bundle/bin/rudac" check --target sm_80,sm_90 \
    > "$logs/rudac-check.txt" 2>&1
  echo "rudac check exit $?" >> "$logs/rudac-check.txt"
  note "rudac check done"
fi

# `rudac run` on CUDA beside the interpreter (checksums are informational on CUDA: approximate
# instructions may differ in the last bits).
if has_step run; then
  run_end=$(( $(date +%s) + $(allot 30) ))
  for id in rms_norm.bf16.h1024 softmax.f32 gemm_simt.bf16.nt attention_decode.bf16.d128; do
    for engine in "interp" "cuda --compiler ptx" "cuda --compiler nvrtc"; do
      left=$(( run_end - $(date +%s) )); [ "$left" -lt 2 ] && break 2
      echo "$id $engine: $(timeout "$left" "$bundle/bin/rudac" run "$id" --engine $engine 2>&1 | tail -1)"
    done
  done > "$logs/rudac-run.txt"
fi

# Nsight Compute's memory counters of a few kernels beside the interpreter's (`rudac profile`,
# computed when the bundle was made): `rudac run --engine cuda` launches twice (warm-up, then
# timed) on the same inputs; ncu profiles the second launch. Written to ncu_compare.json.
if has_step ncu && command -v ncu >/dev/null && [ -d "$bundle/profile" ]; then
  ncu_end=$(( $(date +%s) + $(allot 40) ))
  metrics=l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
  metrics=$metrics,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  metrics=$metrics,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
  metrics=$metrics,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum
  mkdir -p "$logs/ncu"
  for id in $(grep -v '^#' "$bundle/profile/ncu_kernels.txt"); do
    left=$(( ncu_end - $(date +%s) )); [ "$left" -lt 3 ] && break
    timeout "$left" ncu --csv --metrics "$metrics" --launch-skip 1 --launch-count 1 \
      "$bundle/bin/rudac" run "$id" --engine cuda > "$logs/ncu/$id.csv" 2>&1
  done
  python3 scripts/gpu/ncu_compare.py "$bundle/profile" "$logs/ncu" > "$results/ncu_compare.json" 2> "$logs/ncu_compare.log"
  note "ncu done"
fi

# The PTX backend's lowering of every op and conversion, bit for bit against exact arithmetic.
if has_step gpucheck && [ -d "$bundle/gpucheck" ]; then
  mkdir -p "$logs/gpucheck"
  t=$(allot 45)
  timeout "$t" python3 "$bundle/gpucheck/run.py" "$logs/gpucheck" > "$logs/gpucheck_run.log" 2>&1 \
    && timeout "$t" python3 "$bundle/gpucheck/check.py" "$logs/gpucheck" > "$logs/gpucheck.txt" 2>&1
  echo "gpucheck exit $?" >> "$logs/gpucheck.txt"
  note "gpucheck done"
fi

# The model bench before the op benchmarks: it writes model_bench.json after each model, and
# stops starting models that cannot finish before its deadline.
if has_step model; then
  t=$(allot 150)
  timeout "$t" python3 scripts/gpu/model_bench.py "$results" "$bundle" --deadline-s $((t > 15 ? t - 5 : t)) \
    > "$logs/model_bench.log" 2>&1
  note "model_bench.py exit $?"
fi

# Batched generation (issue 14): ruda-llm batch at 1, 8 and 64 concurrent requests against
# transformers' batched generate on a Qwen2.5-0.5B-shaped model, both paged attention paths,
# graphs on and off.
if has_step batch; then
  t=$(allot 120)
  timeout "$t" python3 scripts/gpu/batch_bench.py "$results" "$bundle" --deadline-s $((t > 15 ? t - 5 : t)) \
    > "$logs/batch_bench.log" 2>&1
  note "batch_bench.py exit $?"
fi

# Serving (issue 15): ruda-serve on a Qwen2.5-0.5B-shaped model, ruda-llm bench-serve at 1, 8 and
# 32 concurrent clients.
if has_step serve; then
  t=$(allot 120)
  timeout "$t" python3 scripts/gpu/serve_bench.py "$results" "$bundle" --deadline-s $((t > 15 ? t - 5 : t)) \
    > "$logs/serve_bench.log" 2>&1
  note "serve_bench.py exit $?"
fi

# flash-linear-attention (pure Python and Triton), the gated delta rows' baseline: installed
# offline from the bundle's wheels (scripts/gpu/bundle.sh) into this run's folder, put first on
# PYTHONPATH. A failure is logged, never fatal: baseline.py then prints those rows SKIPPED.
if { has_step bench || has_step gdelta; } && [ -d "$bundle/wheels" ]; then
  if timeout "$(allot 30)" python3 -m pip install --no-index --no-deps --target "$pylib" "$bundle"/wheels/*.whl \
      > "$logs/pip_install.log" 2>&1; then
    export PYTHONPATH="$pylib${PYTHONPATH:+:$PYTHONPATH}"
    note "fla wheels installed: $(cd "$bundle/wheels" && echo *.whl)"
  else
    note "installing the fla wheels failed (pip_install.log): the gated delta baselines will be SKIPPED"
  fi
fi

if has_step bench; then
  # Each program stops starting benchmarks 15 s before its timeout. The gated delta rows are
  # the gdelta step's, the MoE rows the moe step's.
  t=$(allot 100)
  # shellcheck disable=SC2086
  timeout "$t" "$bundle/bin/ruda-bench" --budget-s $((t > 20 ? t - 15 : 5)) --exclude gated_delta --exclude moe $filter \
    > "$results/bench_ruda.jsonl" 2> "$logs/bench_ruda.log"
  note "ruda-bench exit $?"
  t=$(allot 80)
  # shellcheck disable=SC2086
  timeout "$t" python3 bench/baseline.py --budget-s $((t > 20 ? t - 15 : 5)) --exclude gated_delta --exclude moe $filter \
    > "$results/bench_torch.jsonl" 2> "$logs/bench_torch.log"
  note "baseline.py exit $?"
fi

# The gated delta rule (issue 13): chunked prefill at T = 2k, 8k, 64k and decode steps against
# fla's kernels. The decode rows' floor needs the copy bandwidth: measured here when the bench
# step did not run.
if has_step gdelta; then
  words="gated_delta"
  has_step bench || words="copy gated_delta"
  t=$(allot 60)
  # shellcheck disable=SC2086
  timeout "$t" "$bundle/bin/ruda-bench" --budget-s $((t > 20 ? t - 15 : 5)) $words \
    > "$results/gdelta_ruda.jsonl" 2> "$logs/gdelta_ruda.log"
  note "ruda-bench (gated delta) exit $?"
  t=$(allot 120)
  # shellcheck disable=SC2086
  timeout "$t" python3 bench/baseline.py --budget-s $((t > 20 ? t - 15 : 5)) $words \
    > "$results/gdelta_torch.jsonl" 2> "$logs/gdelta_torch.log"
  note "baseline.py (gated delta) exit $?"
fi

# MoE (issue 16): the routed experts at Qwen3-30B-A3B's shapes against torch._grouped_mm and a
# per-expert torch.matmul loop, decode steps against the copy bandwidth (measured here when no
# earlier step did), then a Qwen3-30B-A3B-shaped model's decode tokens/s against transformers.
if has_step moe; then
  words="moe"
  has_step bench || has_step gdelta || words="copy moe"
  t=$(allot 50)
  # shellcheck disable=SC2086
  timeout "$t" "$bundle/bin/ruda-bench" --budget-s $((t > 20 ? t - 15 : 5)) $words \
    > "$results/moe_ruda.jsonl" 2> "$logs/moe_ruda.log"
  note "ruda-bench (moe) exit $?"
  t=$(allot 50)
  # shellcheck disable=SC2086
  timeout "$t" python3 bench/baseline.py --budget-s $((t > 20 ? t - 15 : 5)) $words \
    > "$results/moe_torch.jsonl" 2> "$logs/moe_torch.log"
  note "baseline.py (moe) exit $?"
  t=$(allot 150)
  timeout "$t" python3 scripts/gpu/model_bench.py "$results" "$bundle" --models qwen3-30b-a3b-shaped \
    --out moe_bench.json --deadline-s $((t > 15 ? t - 5 : t)) > "$logs/moe_bench.log" 2>&1
  note "model_bench.py (moe) exit $?"
fi

python3 scripts/gpu/summarize.py "$results" > "$logs/summary.txt" 2>&1
echo "=== run.sh: $(( $(date +%s) - t_start )) s; results in $results ==="
tail -n 2 "$logs/gpucheck.txt" "$logs/rudac-check.txt" 2>/dev/null
cat "$logs/rudac-run.txt" 2>/dev/null
grep -h "FAILED\|SKIPPED" "$logs/bench_ruda.log" "$logs/bench_torch.log" "$logs/gdelta_ruda.log" \
  "$logs/gdelta_torch.log" "$logs/moe_ruda.log" "$logs/moe_torch.log" 2>/dev/null | head -20
tail -n 3 "$logs/model_bench.log" 2>/dev/null
tail -n 8 "$logs/batch_bench.log" 2>/dev/null
tail -n 3 "$logs/serve_bench.log" 2>/dev/null
tail -n 3 "$logs/moe_bench.log" 2>/dev/null
cat "$logs/summary.txt"
# One archive of every log (the tool carrying $OUT back drops results with many files).
tar -czf "$results/logs.tar.gz" -C "$logs" . 2>/dev/null
rm -rf "$logs" "$pylib"
ls "$results"
