#!/usr/bin/env bash
# Validates deploy/: manifests, config, dashboard, alerts, Containerfile, systemd unit,
# and a loopback smoke test of the Kubernetes manifests with the real binaries (when
# built: run after `cargo build`/`cargo test`, or set HEADROOM_BIN_DIR).
#
#   deploy/check.sh                    # everything, ~10 s once the tools are cached
#   deploy/check.sh --regenerate-rules # rewrite the PrometheusRule from the alerts file
#
# Tools not on the machine (promql-parser, kubernetes-validate) are installed once into
# ~/.cache/headroom/deploy-venv. If the package registry cannot be reached, the checks
# that need them are skipped and say so; every other failure to install fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${HOME}/.cache/headroom"
venv="${cache}/deploy-venv"
reqs="promql-parser==0.11.0 kubernetes-validate==1.37.0 PyYAML==6.0.3"
stamp="${venv}/.headroom-reqs"

python=python3
tools=0
mkdir -p "$cache"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$reqs" ]]; then
    python="${venv}/bin/python"; tools=1
else
    (
        flock 9
        if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$reqs" ]]; then
            rm -rf "$venv"
            python3 -m venv "$venv"
            # shellcheck disable=SC2086
            if "${venv}/bin/pip" install --quiet --disable-pip-version-check $reqs; then
                echo "$reqs" > "$stamp"
            else
                rm -rf "$venv"
                # Tell "cannot reach the registry" apart from a real install failure.
                probe="$(mktemp -d)"
                if python3 -m pip download --quiet --no-deps --disable-pip-version-check --retries 1 \
                        -d "$probe" PyYAML==6.0.3 >/dev/null 2>&1; then
                    rm -rf "$probe"
                    echo "deploy/check.sh: installing ${reqs} failed although the registry answers" >&2
                    exit 1
                fi
                rm -rf "$probe"
                echo "deploy/check.sh: package registry unreachable: PromQL and schema checks will be skipped" >&2
            fi
        fi
    ) 9>"${cache}/deploy-venv.lock"
    if [[ -f "$stamp" ]]; then python="${venv}/bin/python"; tools=1; fi
fi

cd "$here"
HEADROOM_DEPLOY_TOOLS="$tools" exec "$python" -m checks "$@"
