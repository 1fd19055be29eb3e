#!/usr/bin/env bash
# The GPU rung (shared/TESTING.md): run on the GPU machine from the project root after
# scripts/gpu/bundle.sh built scripts/gpu/bundle/ here. Runs every bundled test executable on
# CUDA (RUDA_REQUIRE_GPU=1, so a missing GPU fails instead of skipping) for each compiler in
# RUDA_GPU_COMPILERS, then rudac check with the machine's ptxas, then the benchmarks beside
# their PyTorch baselines, and writes JSON results and logs into RESULTS_DIR.
#
# Usage: bash scripts/gpu/run.sh RESULTS_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
results=${1:?usage: run.sh RESULTS_DIR}
mkdir -p "$results/logs"
bundle=scripts/gpu/bundle
[ -d "$bundle/tests" ] || { echo "run.sh: no $bundle; run scripts/gpu/bundle.sh first" >&2; exit 2; }
compilers=${RUDA_GPU_COMPILERS:-ptx nvrtc}

export RUDA_REQUIRE_GPU=1 RUDA_DEVICE=cuda RUDA_INTERP_THREADS=8
{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"commit\": \"$(cat "$bundle/COMMIT")\","
  echo "  \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\","
  echo "  \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\","
  echo "  \"ptxas\": \"$(ptxas --version 2>/dev/null | tail -1)\""
  echo "}"
} > "$results/machine.json"

echo '[' > "$results/tests.json"
first=1
for compiler in $compilers; do
  for exe in "$bundle"/tests/*; do
    name=$(basename "$exe")
    log="$results/logs/$compiler--$name.log"
    start=$(date +%s.%N)
    RUDA_CUDA_COMPILER=$compiler timeout 300 "$exe" --test-threads=4 >"$log" 2>&1
    rc=$?
    secs=$(python3 -c "import time; print(round(time.time() - $start, 2))")
    passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
    failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
    [ $first = 1 ] || echo ',' >> "$results/tests.json"
    first=0
    printf '{"compiler":"%s","executable":"%s","exit":%d,"passed":%d,"failed":%d,"seconds":%s}' \
      "$compiler" "$name" "$rc" "$passed" "$failed" "$secs" >> "$results/tests.json"
  done
done
echo ']' >> "$results/tests.json"

# Every registered configuration through this machine's ptxas (CUDA 13).
if command -v ptxas >/dev/null; then
  RUDA_PTXAS=$(command -v ptxas) timeout 300 "$bundle/bin/rudac" check --target sm_80,sm_90 \
    > "$results/rudac-check.txt" 2>&1
  echo "rudac check exit $?" >> "$results/rudac-check.txt"
fi

# `rudac run` on CUDA beside the interpreter (checksums are informational on CUDA: approximate
# instructions may differ in the last bits).
for id in rms_norm.bf16.h1024 softmax.f32 gemm_simt.bf16.nt attention_decode.bf16.d128; do
  for engine in "interp" "cuda --compiler ptx" "cuda --compiler nvrtc"; do
    echo "$id $engine: $("$bundle/bin/rudac" run "$id" --engine $engine 2>&1 | tail -1)"
  done
done > "$results/rudac-run.txt"

# The PTX backend's lowering of every op and conversion, bit for bit against exact arithmetic.
mkdir -p "$results/gpucheck"
timeout 300 python3 "$bundle/gpucheck/run.py" "$results/gpucheck" > "$results/logs/gpucheck_run.log" 2>&1 \
  && timeout 300 python3 "$bundle/gpucheck/check.py" "$results/gpucheck" > "$results/gpucheck.txt" 2>&1
echo "gpucheck exit $?" >> "$results/gpucheck.txt"

timeout 300 "$bundle/bin/ruda-bench" > "$results/bench_ruda.jsonl" 2> "$results/logs/bench_ruda.log"
timeout 300 python3 bench/baseline.py > "$results/bench_torch.jsonl" 2> "$results/logs/bench_torch.log"
python3 scripts/gpu/summarize.py "$results"
tail -n 3 "$results/gpucheck.txt" "$results/rudac-check.txt" 2>/dev/null
cat "$results/rudac-run.txt"
