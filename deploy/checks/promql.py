"""PromQL checks: every expression parses, and every `headroom_*` series it selects is
one the router exports, filtered or grouped only by labels that series carries.

Grafana template variables are replaced by valid PromQL before parsing.
"""

import re

from .catalog import TARGET_LABELS

GRAFANA_VARS = [
    (re.compile(r"\$__rate_interval|\$__interval|\$__range"), "5m"),
    (re.compile(r"\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?"), ".*"),
]


def grafana_to_promql(expr):
    for pat, rep in GRAFANA_VARS:
        expr = pat.sub(rep, expr)
    return expr


def _walk(node, out, grouping):
    kind = type(node).__name__
    if kind == "VectorSelector":
        labels = [m.name for m in node.matchers.matchers]
        for group in node.matchers.or_matchers:
            labels += [m.name for m in group]
        out.append((node.name, labels, list(grouping)))
        return
    mod = getattr(node, "modifier", None)
    if kind == "AggregateExpr" and mod is not None:
        grouping = grouping + list(mod.labels)
    if kind == "BinaryExpr" and mod is not None and getattr(mod, "matching", None) is not None:
        grouping = grouping + list(mod.matching.labels)
    for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and type(child).__module__ == "promql_parser":
            _walk(child, out, grouping)
    for child in getattr(node, "args", None) or []:
        _walk(child, out, grouping)


def selectors(expr):
    """[(metric name or None, matcher labels, grouping labels in scope)] of an expression."""
    import promql_parser

    out = []
    _walk(promql_parser.parse(expr), out, [])
    return out


def problems(expr, series, recorded=()):
    """Messages for unknown series or labels in one expression (raises on parse errors)."""
    msgs = []
    for name, labels, grouping in selectors(expr):
        if name is None or name == "up":
            continue
        if name in recorded:
            continue
        if not name.startswith("headroom_"):
            msgs.append(f"selects `{name}`, which is not a Headroom metric")
            continue
        if name not in series:
            msgs.append(f"unknown series `{name}` (not exported by router/src/metrics.rs)")
            continue
        allowed = series[name] | TARGET_LABELS | {"__name__"}
        for label in labels:
            if label not in allowed:
                msgs.append(f"`{name}` has no label `{label}` (it has {sorted(series[name])})")
        for label in grouping:
            if label not in allowed:
                msgs.append(f"groups `{name}` by `{label}`, a label it does not carry")
    return msgs
