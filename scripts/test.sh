#!/usr/bin/env bash
# The README's test command: installs the pinned ptxas and NVRTC when missing (user cache,
# reused across clones), then runs the whole suite with both required (so those rungs never
# skip here), then checks every registered configuration through both backends with ptxas.
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(scripts/install-cuda-tools.sh --print-env)"
export RUDA_REQUIRE_PTXAS=1 RUDA_REQUIRE_NVRTC=1

cargo build --locked --workspace --all-targets
cargo test --locked --workspace

rudac=target/debug/rudac
echo "== rudac check: every registered configuration, direct PTX backend, sm_80 and sm_90"
"$rudac" check --target sm_80,sm_90 > target/rudac-check-ptx.txt || { cat target/rudac-check-ptx.txt; exit 1; }
tail -n 1 target/rudac-check-ptx.txt
echo "== rudac check: every registered configuration through NVRTC, sm_80 and sm_90"
"$rudac" check --target sm_80,sm_90 --compiler nvrtc > target/rudac-check-nvrtc.txt \
  || { cat target/rudac-check-nvrtc.txt; exit 1; }
tail -n 1 target/rudac-check-nvrtc.txt
