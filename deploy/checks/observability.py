"""Dashboard, alert rules and scrape config against the router's real metrics.

Invariants checked: every PromQL expression parses; every `headroom_*` series it selects
exists in router/src/metrics.rs with the labels used; the dashboard shows each topic the
deployment promises; the Prometheus Operator rule object carries exactly the groups of
deploy/prometheus/headroom-alerts.yaml.
"""

import json
import re

import yaml

from . import promql
from .report import CheckError, collect, require

# Metric families the dashboard must show (the topics deploy/README.md promises).
DASHBOARD_MUST_SHOW = [
    "headroom_requests_total", "headroom_ttft_seconds", "headroom_tpot_seconds",
    "headroom_forecast_relative_error", "headroom_forecast_bound_total",
    "headroom_fallback_total", "headroom_decision_seconds", "headroom_replica_healthy",
    "headroom_ejections_total", "headroom_scrape_errors_total",
]
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\)$")


def _panel_targets(panels):
    for p in panels:
        yield from _panel_targets(p.get("panels", []))
        for t in p.get("targets", []):
            yield p.get("title", "?"), t.get("expr", "")


def dashboard(deploy, series):
    path = deploy / "grafana/headroom-dashboard.json"
    try:
        dash = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckError(f"{path}: {e}")
    errors, shown, n = [], set(), 0
    for title, expr in _panel_targets(dash.get("panels", [])):
        n += 1
        if not expr.strip():
            errors.append(f"panel {title!r}: empty query")
            continue
        q = promql.grafana_to_promql(expr)
        try:
            errors += [f"panel {title!r}: {m}" for m in promql.problems(q, series)]
        except Exception as e:  # the parser raises plain exceptions
            errors.append(f"panel {title!r}: does not parse: {e}: {expr}")
            continue
        shown |= {name for name, _, _ in promql.selectors(q) if name}
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.match(query.strip())
        if not m:
            errors.append(f"variable {var['name']}: not a label_values() query: {query}")
            continue
        selector, label = m.group(1), m.group(2)
        if selector:
            sel = promql.grafana_to_promql(selector)
            errors += [f"variable {var['name']}: {x}" for x in promql.problems(sel, series)]
            names = [s for s, _, _ in promql.selectors(sel)]
            if names and names[0] in series and label not in series[names[0]] | {"job", "instance"}:
                errors.append(f"variable {var['name']}: `{names[0]}` has no label `{label}`")
    families = {re.sub(r"_(bucket|sum|count)$", "", s) for s in shown} | shown
    for must in DASHBOARD_MUST_SHOW:
        if must not in families:
            errors.append(f"the dashboard shows nothing of `{must}`")
    uids = [p.get("id") for p in dash.get("panels", [])]
    if len(uids) != len(set(uids)):
        errors.append("panel ids are not unique")
    collect(errors)
    return f"{n} queries, {len(families & set(DASHBOARD_MUST_SHOW))} required families shown"


def _rule_groups(path):
    doc = yaml.safe_load(path.read_text())
    require(isinstance(doc, dict) and isinstance(doc.get("groups"), list), f"{path}: no `groups` list")
    return doc["groups"]


def alert_rules(deploy, series):
    path = deploy / "prometheus/headroom-alerts.yaml"
    groups = _rule_groups(path)
    errors, recorded, alerts = [], set(), 0
    for g in groups:
        for r in g.get("rules", []):
            if "record" in r:
                recorded.add(r["record"])
    for g in groups:
        for r in g.get("rules", []):
            name = r.get("alert") or r.get("record")
            if not name or "expr" not in r:
                errors.append(f"group {g.get('name')}: a rule lacks alert/record or expr")
                continue
            try:
                errors += [f"{name}: {m}" for m in promql.problems(r["expr"], series, recorded)]
            except Exception as e:
                errors.append(f"{name}: does not parse: {e}")
            if "alert" in r:
                alerts += 1
                if r.get("labels", {}).get("severity") not in {"critical", "warning", "info"}:
                    errors.append(f"{name}: severity must be critical, warning or info")
                if not r.get("annotations", {}).get("summary"):
                    errors.append(f"{name}: no summary annotation")
    collect(errors)
    return f"{alerts} alerts, {len(recorded)} recording rules"


def operator_rule_matches(deploy):
    path = deploy / "kubernetes/components/prometheus-operator/prometheusrule.yaml"
    rule = yaml.safe_load(path.read_text())
    want = _rule_groups(deploy / "prometheus/headroom-alerts.yaml")
    require(rule.get("kind") == "PrometheusRule", f"{path}: not a PrometheusRule")
    require(rule.get("spec", {}).get("groups") == want,
            f"{path} differs from prometheus/headroom-alerts.yaml: run deploy/check.sh --regenerate-rules")


def regenerate_operator_rule(deploy):
    """Writes the PrometheusRule from the alerts file (deploy/check.sh --regenerate-rules)."""
    groups = _rule_groups(deploy / "prometheus/headroom-alerts.yaml")
    doc = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "headroom", "labels": {"app.kubernetes.io/name": "headroom"}},
        "spec": {"groups": groups},
    }

    class Dumper(yaml.SafeDumper):
        pass

    def literal(dumper, data):
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, literal)
    out = deploy / "kubernetes/components/prometheus-operator/prometheusrule.yaml"
    with open(out, "w") as f:
        f.write("# Generated from deploy/prometheus/headroom-alerts.yaml; edit that file, then regenerate:\n"
                "#   deploy/check.sh --regenerate-rules\n")
        yaml.dump(doc, f, Dumper=Dumper, sort_keys=False, width=100)


def scrape_config(deploy):
    path = deploy / "prometheus/prometheus.yml"
    cfg = yaml.safe_load(path.read_text())
    errors = []
    for rf in cfg.get("rule_files", []):
        if not (path.parent / rf).is_file():
            errors.append(f"rule file {rf} does not exist next to prometheus.yml")
    jobs = [j.get("job_name") for j in cfg.get("scrape_configs", [])]
    if len(jobs) != len(set(jobs)) or not jobs:
        errors.append(f"job names must be present and unique: {jobs}")
    for j in cfg.get("scrape_configs", []):
        if "headroom" not in j.get("job_name", ""):
            errors.append(f"job {j.get('job_name')}: alerts match jobs by /headroom/; keep it in the name")
        if j.get("metrics_path", "/metrics") != "/metrics":
            errors.append(f"job {j.get('job_name')}: the router serves /metrics")
    collect(errors)
