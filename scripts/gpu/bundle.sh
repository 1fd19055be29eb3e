#!/usr/bin/env bash
# Build the test and bench executables here (release) and gather them into scripts/gpu/bundle/
# (compressed: executables.tar.xz), with the baselines' extra wheels (wheels/), the folder `run`
# carries to the GPU machine (which has no cargo and no network). Snapshot tests stay behind.
# The bundle plus the working tree must stay under 64 MiB; the size is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=scripts/gpu/bundle
target_dir=${CARGO_TARGET_DIR:-target}
rm -rf "$bundle"
mkdir -p "$bundle/tests" "$bundle/bin"

echo "bundle: building release test executables" >&2
cargo test --release --locked --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    # The (empty) test harnesses of binaries stay behind.
    if (msg.get("reason") == "compiler-artifact" and msg.get("profile", {}).get("test")
            and msg.get("executable") and "bin" not in msg["target"]["kind"]):
        crate = msg["manifest_path"].split("/")[-2]
        print(msg["target"]["name"] + "\t" + crate + "\t" + msg["executable"])
' > "$bundle/tests.tsv"

while IFS=$'\t' read -r target package exe; do
  # Only what can touch a GPU, a driver, NVRTC or ptxas travels: the IR's and the emulator's
  # tests are CPU-only (and run in CI), and the tools' tests spawn `rudac` by its build path.
  case "$package" in ir|ptx-emu|tools) continue ;; esac
  name="${package}--${target}"
  cp "$exe" "$bundle/tests/$name"
  # Each crate's tests are one binary (`main`) of modules: the tests of the modules that never
  # touch a device, compare files by build-machine paths (snapshots) or spawn binaries by their
  # build paths are skipped there, listed by full name in NAME.skip (run.sh passes them with
  # --exact, so `registry::` does not also skip `nvrtc_registry::`).
  case "$name" in
    ops--main) skip="snapshots differential fuzz_corpus passes_registry ir_roundtrip registry" ;;
    llm--main) skip="cli chat_goldens tokenizer_goldens text bad_inputs" ;;
    *) skip="" ;;
  esac
  : > "$bundle/tests/$name.skip"
  if [ -n "$skip" ]; then
    "$exe" --list --format terse 2>/dev/null | sed -n 's/: test$//p' \
      | grep -E "^($(echo $skip | tr ' ' '|'))::" > "$bundle/tests/$name.skip" || true
  fi
done < "$bundle/tests.tsv"
rm "$bundle/tests.tsv"

echo "bundle: building release binaries" >&2
cargo build --release --locked -p ruda-tools --bins
cargo build --release --locked -p ruda-llm --bin ruda-llm
cargo build --release --locked -p ruda-serve --bin ruda-serve
cp "$target_dir/release/rudac" "$target_dir/release/ruda-bench" "$target_dir/release/ruda-llm" \
  "$target_dir/release/ruda-serve" "$bundle/bin/"
# The model layer's examples, for scripts/gpu/model_bench.py (skipped there when absent).
if cargo metadata --no-deps --format-version 1 2>/dev/null | grep -q '"name":"qwen2_generate"'; then
  echo "bundle: building the ruda-llm examples" >&2
  cargo build --release --locked -p ruda-llm --examples
fi
for example in qwen2_generate qwen3_generate qwen35_generate; do
  if [ -x "$target_dir/release/examples/$example" ]; then
    cp "$target_dir/release/examples/$example" "$bundle/bin/"
  fi
done
if command -v strip >/dev/null; then
  find "$bundle/tests" "$bundle/bin" -type f ! -name '*.skip' -exec strip {} +
fi
echo "bundle: the interpreter's counters of the kernels the ncu step compares" >&2
mkdir -p "$bundle/profile"
for id in $(cat scripts/gpu/ncu_kernels.txt | grep -v '^#'); do
  "$target_dir/release/rudac" profile "$id" --json > "$bundle/profile/$id.json"
done
cp scripts/gpu/ncu_kernels.txt "$bundle/profile/"
echo "bundle: writing the PTX backend's GPU semantics check" >&2
cargo run --release --locked --quiet -p ruda-codegen-ptx --example gpucheck -- "$bundle/gpucheck" >&2
cp codegen-ptx/gpucheck/*.py "$bundle/gpucheck/"
# flash-linear-attention, the gated delta rows' baseline (bench/baseline.py): pure Python and
# Triton wheels (~1.5 MiB for 0.6.0), downloaded here because the GPU machine has no network;
# run.sh installs them there offline. Without a network here the bundle goes without them and
# those baselines print SKIPPED.
echo "bundle: downloading the flash-linear-attention wheels" >&2
fla_version=0.6.0
if timeout 120 python3 -m pip download --quiet --no-deps -d "$bundle/wheels" \
    "flash-linear-attention==$fla_version" "fla-core==$fla_version" einops >&2; then
  du -sh "$bundle/wheels" >&2
else
  echo "bundle: the fla wheels did not download: the gated delta baselines will be SKIPPED" >&2
  rm -rf "$bundle/wheels"
fi
git rev-parse HEAD > "$bundle/COMMIT"
# Benchmarks list (no device needed): a check that ruda-bench runs at all.
"$bundle/bin/ruda-bench" --list > /dev/null
ls "$bundle/tests" >&2
# The executables are ~100 MiB but compress 6:1; what travels must stay under 64 MiB, so they go
# as one xz archive that run.sh unpacks.
tar -C "$bundle" -cf - tests bin | xz -T2 -6 > "$bundle/executables.tar.xz"
rm -rf "$bundle/tests" "$bundle/bin"
du -sh "$bundle" >&2
