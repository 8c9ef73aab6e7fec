#!/usr/bin/env bash
# Prints the path of a Chromium for the web tests; installs Debian's package when it is missing (needs root, as in CI).
# Exit status: 0 and the path on stdout; 2 when Chromium is absent and this is not root (the caller may skip); 1 otherwise.
set -euo pipefail

find_chromium() {
    local name
    for name in chromium chromium-browser google-chrome-stable google-chrome; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
    done
    return 1
}

if find_chromium; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "chromium is not installed, and installing it needs root: sudo apt-get install -y chromium" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is not installed and this machine has no apt-get: install chromium and put it on the PATH" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
find_chromium || { echo "apt-get installed chromium, but no chromium binary is on the PATH" >&2; exit 1; }
