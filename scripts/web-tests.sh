#!/usr/bin/env bash
# The web chat's tests (serve/web, docs/web-chat.md):
#   1. the node unit tests, `node --test serve/web/test/` -- a failure fails this script;
#   2. the end-to-end test, serve/web/e2e/chat_e2e.mjs in headless Chromium against the mock
#      server serve/web/e2e/mock_server.mjs -- when Chromium (scripts/install-chromium.sh) and
#      playwright-core (npm ci, from the committed lock) can be had; a failure fails this script.
#      When they cannot, it prints a loud `WEB E2E SKIPPED: <reason>` and still exits 0.
#   3. the same test against the real server, `ruda-serve` on the bundled tiny Qwen2 model on the
#      CPU (the binary at $RUDA_SERVE, else target/debug/ruda-serve; built by scripts/test.sh
#      before this runs) -- a loud `WEB E2E (REAL SERVER) SKIPPED` when there is no binary.
#
# Usage: scripts/web-tests.sh [--screenshot PATH] [--unit-only]
#   --screenshot PATH  where the real-server e2e test saves its screenshot (default:
#                      $TMPDIR/ruda-web-chat.png; docs/web-chat.png is refreshed with
#                      --screenshot docs/web-chat.png); the mock run's goes beside it (-mock.png)
#   --unit-only        skip the e2e test (prints the SKIPPED line)
# Environment: RUDA_WEB_E2E_REQUIRE=1 turns a skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

screenshot="${TMPDIR:-/tmp}/ruda-web-chat.png"
unit_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --screenshot) screenshot="$2"; shift 2 ;;
        --unit-only) unit_only=1; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "web-tests: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

web=serve/web
e2e=$web/e2e

skip() {
    echo "=================================================================="
    echo "WEB E2E SKIPPED: $1"
    echo "=================================================================="
    if [ "${RUDA_WEB_E2E_REQUIRE:-0}" = 1 ]; then
        echo "web-tests: RUDA_WEB_E2E_REQUIRE=1, so the skip is a failure" >&2
        exit 1
    fi
    exit 0
}

command -v node >/dev/null 2>&1 || { echo "web-tests: node not found (the unit tests need Node.js 20+)" >&2; exit 1; }

echo "== web unit tests: node --test $web/test/"
node --test "$web/test/"

[ "$unit_only" = 1 ] && skip "--unit-only"

echo "== web e2e: Chromium"
marker=$(bash scripts/install-chromium.sh | tail -n 1)
echo "$marker"
case "$marker" in
    "CHROMIUM OK: "*) chromium=${marker#CHROMIUM OK: } ;;
    *) skip "Chromium unavailable (${marker#CHROMIUM UNAVAILABLE: })" ;;
esac

echo "== web e2e: playwright-core (npm ci --prefix $e2e)"
# npm ci unless node_modules already holds the locked version
if ! node -e '
    const fs = require("fs");
    const lock = JSON.parse(fs.readFileSync(process.argv[1] + "/package-lock.json", "utf8"));
    const want = lock.packages["node_modules/playwright-core"].version;
    const have = JSON.parse(fs.readFileSync(process.argv[1] + "/node_modules/playwright-core/package.json", "utf8")).version;
    process.exit(want === have ? 0 : 1);' "$e2e" 2>/dev/null; then
    command -v npm >/dev/null 2>&1 || skip "npm not found, playwright-core cannot be installed"
    npm ci --prefix "$e2e" --no-audit --no-fund --loglevel=error || skip "npm ci of playwright-core failed"
fi

echo "== web e2e: mock server"
log=$(mktemp)
node "$e2e/mock_server.mjs" >"$log" 2>&1 &
mock_pid=$!
trap 'kill "$mock_pid" 2>/dev/null || true; rm -f "$log"' EXIT
url=""
for _ in $(seq 100); do
    url=$(sed -n 's/^MOCK LISTENING //p' "$log")
    [ -n "$url" ] && break
    kill -0 "$mock_pid" 2>/dev/null || { cat "$log"; echo "web-tests: the mock server died" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { cat "$log"; echo "web-tests: the mock server did not start" >&2; exit 1; }
echo "mock server at $url"

mock_shot="${screenshot%.png}-mock.png"
echo "== web e2e: node $e2e/chat_e2e.mjs $url/ $mock_shot --mock"
mkdir -p "$(dirname "$screenshot")"
node "$e2e/chat_e2e.mjs" "$url/" "$mock_shot" --mock --chromium "$chromium"
kill "$mock_pid" 2>/dev/null || true

serve_bin=${RUDA_SERVE:-${CARGO_TARGET_DIR:-target}/debug/ruda-serve}
if [ ! -x "$serve_bin" ]; then
    echo "=================================================================="
    echo "WEB E2E (REAL SERVER) SKIPPED: no $serve_bin (cargo build -p ruda-serve)"
    echo "=================================================================="
    exit 0
fi
echo "== web e2e: the real server ($serve_bin llm/models/tiny-qwen2 on the CPU)"
serve_log=$(mktemp)
port=$(( 20000 + RANDOM % 20000 ))
RUDA_DEVICE=cpu "$serve_bin" llm/models/tiny-qwen2 --bind "127.0.0.1:$port" >"$serve_log" 2>&1 &
serve_pid=$!
trap 'kill "$mock_pid" "$serve_pid" 2>/dev/null || true; rm -f "$log" "$serve_log"' EXIT
ready=""
for _ in $(seq 300); do
    if node -e 'fetch(process.argv[1]).then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))' \
        "http://127.0.0.1:$port/ready" 2>/dev/null; then
        ready=1
        break
    fi
    kill -0 "$serve_pid" 2>/dev/null || { cat "$serve_log"; echo "web-tests: ruda-serve died" >&2; exit 1; }
    sleep 0.1
done
[ -n "$ready" ] || { cat "$serve_log"; echo "web-tests: ruda-serve was not ready in 30 s" >&2; exit 1; }
node "$e2e/chat_e2e.mjs" "http://127.0.0.1:$port/" "$screenshot" --chromium "$chromium"
echo "web e2e screenshots: $screenshot (real server), $mock_shot (mock)"
