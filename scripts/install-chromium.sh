#!/usr/bin/env bash
# Make Debian's Chromium available at /usr/bin/chromium for the web chat e2e test
# (scripts/web-tests.sh). Idempotent: does nothing when /usr/bin/chromium exists.
# Installs with `apt-get install -y chromium` when running as root with apt-get available;
# otherwise prints a loud marker line and exits 0, so callers decide what to skip:
#   CHROMIUM UNAVAILABLE: <reason>
# Exit status: 0 always (the marker line on stdout tells the outcome); the last line is
# either `CHROMIUM OK: /usr/bin/chromium` or `CHROMIUM UNAVAILABLE: <reason>`.
set -uo pipefail

CHROMIUM=${RUDA_CHROMIUM:-/usr/bin/chromium} # RUDA_CHROMIUM: another path (for testing the skip)

if [ -x "$CHROMIUM" ]; then
    echo "CHROMIUM OK: $CHROMIUM"
    exit 0
fi

unavailable() {
    echo "==================================================================" >&2
    echo "  Chromium cannot be installed: $1" >&2
    echo "==================================================================" >&2
    echo "CHROMIUM UNAVAILABLE: $1"
    exit 0
}

[ "$(id -u)" = 0 ] || unavailable "not root (run as root, or: apt-get install chromium)"
command -v apt-get >/dev/null 2>&1 || unavailable "apt-get not found"

export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: apt-get update" >&2
apt-get update -qq >&2 || unavailable "apt-get update failed"
echo "install-chromium: apt-get install -y chromium" >&2
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2 \
    || unavailable "apt-get install chromium failed"

[ -x "$CHROMIUM" ] || unavailable "apt-get finished but $CHROMIUM is missing"
echo "CHROMIUM OK: $CHROMIUM"
