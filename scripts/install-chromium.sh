#!/usr/bin/env bash
# Installs Debian's `chromium` for the dashboard test (router/tests/dashboard.rs), which
# loads /dashboard in headless Chromium and keeps a screenshot. Does nothing when a
# chromium is already on PATH. Needs root (apt-get), or sudo without a password.
set -euo pipefail
for c in chromium chromium-browser; do
    if command -v "$c" >/dev/null 2>&1; then
        echo "chromium present: $(command -v "$c")"
        exit 0
    fi
done
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# --no-install-recommends: the test needs the headless browser and its fonts only.
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
chromium --version
