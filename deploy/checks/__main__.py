"""Runs every deploy/ check; prints one line per check and a `N passed, N failed` line.

Usage (through deploy/check.sh): python -m checks [--regenerate-rules]
"""

import os
import sys
from pathlib import Path

from . import catalog, configs, containerfile, kube, observability, smoke, systemd
from .report import Report

K8S_VERSION = "1.33.0"


def main(argv):
    deploy = Path(__file__).resolve().parent.parent
    repo = deploy.parent
    if "--regenerate-rules" in argv:
        observability.regenerate_operator_rule(deploy)
        print("wrote kubernetes/components/prometheus-operator/prometheusrule.yaml")
        return 0
    have_venv = os.environ.get("HEADROOM_DEPLOY_TOOLS") == "1"
    r = Report()

    print("== files")
    r.check("every YAML file parses", kube.yaml_files, deploy)
    for p in sorted(deploy.rglob("*.toml")):
        r.check(f"{p.relative_to(deploy)} matches the router's config schema", configs.check_file, p, repo)
    r.check("Containerfile paths, stages, binaries and ports", containerfile.check, deploy)

    print("== metrics")
    series = {}

    def load_catalog():
        series.update(catalog.load(repo)[0])
        return f"{len(series)} series"

    r.check("metric catalog from router/src/metrics.rs", load_catalog)
    if have_venv:
        r.check("dashboard queries use exported metrics and labels", observability.dashboard, deploy, series)
        r.check("alert rules parse and use exported metrics", observability.alert_rules, deploy, series)
    else:
        why = "promql-parser unavailable (package registry unreachable)"
        r.skip("dashboard queries use exported metrics and labels", why)
        r.skip("alert rules parse and use exported metrics", why)
    r.check("PrometheusRule carries headroom-alerts.yaml", observability.operator_rule_matches, deploy)
    r.check("Prometheus scrape config", observability.scrape_config, deploy)

    print("== kubernetes")
    builds = {}
    for name in kube.BUILDS:
        def do_build(name=name):
            builds[name] = kube.build(deploy, name)
            return f"{len(builds[name])} objects"

        r.check(f"kustomize build {name}", do_build)
        if name not in builds:
            continue
        if have_venv:
            r.check(f"schemas (strict) {name}", kube.schema_validate, builds[name], K8S_VERSION)
        else:
            r.skip(f"schemas (strict) {name}", "kubernetes-validate unavailable (package registry unreachable)")
        r.check(f"structure {name}", kube.structure, builds[name], repo)

    print("== systemd")
    headroom = smoke.find_binary(repo, "headroom")
    exe = str(headroom) if headroom else "/usr/bin/env"
    r.check("systemd-analyze verify (no warnings)", systemd.verify, deploy, exe)
    r.check("systemd-analyze security --offline", systemd.exposure, deploy, exe)

    print("== loopback smoke (real binaries)")
    replica = smoke.find_binary(repo, "headroom-replica")
    kube.BUILDS["overlays/demo + cert-manager-csi"] = (["overlays/demo"], ["components/cert-manager-csi"])
    for build, variant in [("overlays/demo", "ca-secret"), ("overlays/demo + cert-manager-csi", "csi")]:
        name = f"demo overlay, {variant} certificates: mesh forms and routes"
        if not (headroom and replica):
            r.skip(name, "headroom / headroom-replica not built (cargo build -p headroom -p headroom-replica --bins)")
            continue
        try:
            objs = builds.get(build) or kube.build(deploy, build)
        except Exception as e:  # reported by the build checks above
            r.fail(name, f"cannot build {build}: {e}")
            continue
        r.check(name, smoke.run_mesh, objs, repo, deploy, headroom, replica, variant)
    return r.summary()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
