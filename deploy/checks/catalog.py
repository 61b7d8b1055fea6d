"""The router's exported metrics, read from router/src/metrics.rs.

Each metric is registered with a string literal name and (for vectors) a literal label
list; histograms export `_bucket` (with `le`), `_sum` and `_count` series. The parser
relies only on that shape, so a renamed metric or label shows up here as a failure.
"""

import re
from pathlib import Path

from .report import CheckError

# Labels Prometheus attaches to every scraped series (target labels) plus those our
# scrape configs add.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "service", "endpoint"}

_NAME = re.compile(r'"(headroom_[a-z0-9_]+)"')
_LABELS = re.compile(r'&\[((?:\s*"[a-z_]+"\s*,?)+)\]')


def load(repo: Path):
    """Returns {series_name: set(labels)} and {metric_name: kind}."""
    path = repo / "router/src/metrics.rs"
    text = path.read_text()
    # Only the registration code, not the tests at the bottom.
    text = text.split("#[cfg(test)]")[0]
    found = list(_NAME.finditer(text))
    if not found:
        raise CheckError(f"no metric names found in {path}")
    series, kinds = {}, {}
    for i, m in enumerate(found):
        name = m.group(1)
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        segment = text[m.end():end]
        before = text[max(0, m.start() - 200):m.start()]
        lab = _LABELS.search(segment)
        labels = set(re.findall(r'"([a-z_]+)"', lab.group(1))) if lab else set()
        call = re.findall(r'(\bh\(|\bc\(|IntGaugeVec::new|IntGauge::new)', before)
        kind = {"h(": "histogram", "c(": "counter"}.get(call[-1] if call else "", "gauge")
        kinds[name] = kind
        if kind == "histogram":
            series[name + "_bucket"] = labels | {"le"}
            series[name + "_sum"] = labels
            series[name + "_count"] = labels
        else:
            series[name] = labels
    return series, kinds
