#!/usr/bin/env bash
# Installs nginx (Debian package `nginx`) for `headroom-bench proxy-overhead`, which
# runs it as a round-robin reverse proxy next to `headroom serve`. Does nothing when
# nginx is already on PATH or in /usr/sbin. Needs root (apt-get).
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    echo "nginx present: $( (command -v nginx || echo /usr/sbin/nginx) | head -1)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: the proxy needs only the binary and its modules.
apt-get install -y -qq --no-install-recommends nginx
# The package may start a system nginx on port 80; the benchmark runs its own.
if command -v systemctl >/dev/null 2>&1; then
    systemctl stop nginx 2>/dev/null || true
    systemctl disable nginx 2>/dev/null || true
fi
if [ -f /run/nginx.pid ]; then
    kill "$(cat /run/nginx.pid)" 2>/dev/null || true
fi
/usr/sbin/nginx -v
