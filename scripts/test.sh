#!/usr/bin/env bash
# The README's test command: installs the pinned ptxas/NVRTC when missing (user cache, reused
# across clones), then runs the whole suite with ptxas required (so that rung never skips here).
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(scripts/install-cuda-tools.sh --print-env)"
export RUDA_REQUIRE_PTXAS=1

cargo build --locked --workspace --all-targets
cargo test --locked --workspace
echo "== rudac check (every registered configuration through ptxas, sm_80 and sm_90)"
cargo run --locked --quiet -p ruda-ops --bin rudac -- check --target sm_80,sm_90 > target/rudac-check.txt \
  || { cat target/rudac-check.txt; exit 1; }
tail -n 1 target/rudac-check.txt
