#!/usr/bin/env bash
# The README's test command: installs the pinned ptxas and NVRTC when missing (user cache,
# reused across clones), checks formatting and clippy, then runs the whole suite with both
# required (so those rungs never skip here), the web chat's tests, then checks every registered
# configuration's NVRTC PTX with ptxas (the PTX backend's is the snapshot summary test's).
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(scripts/install-cuda-tools.sh --print-env)"
# A fresh CI clone gains nothing from incremental compilation's bookkeeping.
if [[ -n "${CI:-}" ]]; then export CARGO_INCREMENTAL=0; fi
export RUDA_REQUIRE_PTXAS=1 RUDA_REQUIRE_NVRTC=1
# The differential test runs every registered configuration's NVRTC PTX in the emulator too.
export RUDA_DIFF_NVRTC=all
target=${CARGO_TARGET_DIR:-target}
# NVRTC's PTX is kept per source, so `rudac check --compiler nvrtc` below reuses what the
# differential test compiled instead of compiling every configuration again. Absolute, since
# cargo runs each test binary in its own package's folder.
export RUDA_NVRTC_CACHE=${RUDA_NVRTC_CACHE:-$(realpath -m "$target/nvrtc-cache")}

# Quality gates: formatting (rustfmt.toml) and clippy with warnings as errors.
cargo fmt --all --check
cargo build --locked --workspace --all-targets
cargo clippy --locked --workspace --all-targets -- -D warnings
# The fuzz targets are their own workspace: build them so a change that breaks them shows here.
cargo build --locked --manifest-path fuzz/Cargo.toml
cargo test --locked --workspace
# The web chat (serve/web): node's unit tests, then the page in headless Chromium against a mock
# server (a loud WEB E2E SKIPPED when Chromium or playwright-core cannot be had).
scripts/web-tests.sh

# Only NVRTC's PTX: ops/tests/snapshots.rs (summary_of_every_configuration) already assembles
# the PTX backend's PTX of every configuration for sm_80 and sm_90 and fails on a spill, which
# is all `rudac check --compiler ptx` would do again (84 s here).
echo "== rudac check: every registered configuration, compiler nvrtc, sm_80 and sm_90"
report=$target/rudac-check-nvrtc.txt
"$target/debug/rudac" check --target sm_80,sm_90 --compiler nvrtc > "$report" || { cat "$report"; exit 1; }
tail -n 1 "$report"
