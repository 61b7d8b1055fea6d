"""The load tools' own figures beside Headroom's for the same requests (stdlib only).

    python3 scripts/vllm/load-tools-report.py OUT_DIR [--expect N]

Reads OUT_DIR/windows.tsv (tool, start ms, end ms: when each tool ran), each tool's
report (guidellm/report.json, vllm-bench-serve/result.json), and the router's request
log OUT_DIR/requests.jsonl (one line per finished request, `request_log`). Headroom's
side of a tool's row is the log's requests that arrived in its window: TTFT is the
router's (send upstream -> first token), the tools' is client-side (send -> first
token, one hop more), so Headroom's should be the smaller by the proxy's share.
Writes OUT_DIR/report.md and prints it. With `--expect N` it exits 1 unless every tool
that ran reports N successful requests and none failed, and the router logged as many
ok requests in that tool's window (the real-vLLM suite's short form, test-real.sh).
"""

import json
import pathlib
import sys


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def f(v):
    return "-" if v is None else f"{v:.1f}"


def guidellm(out):
    p = out / "guidellm" / "report.json"
    if not p.exists():
        return None
    m = json.loads(p.read_text())["benchmarks"][0]["metrics"]
    t, o = m["time_to_first_token_ms"]["successful"], m["time_per_output_token_ms"]["successful"]
    return {
        "ok": m["request_totals"]["successful"], "failed": m["request_totals"]["errored"],
        # guidellm cancels what is still in flight once its request count is reached
        # (its scheduler's cancelled_requests); those are the client's choice, not errors.
        "incomplete": m["request_totals"].get("incomplete", 0),
        "ttft_p50": t["median"], "ttft_p95": t["percentiles"]["p95"],
        "tpot_p50": o["median"], "tpot_p95": o["percentiles"]["p95"],
    }


def vllm_bench(out):
    p = out / "vllm-bench-serve" / "result.json"
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    return {
        "ok": r["completed"], "failed": r["failed"],
        "ttft_p50": r["median_ttft_ms"], "ttft_p95": None, "ttft_p99": r["p99_ttft_ms"],
        "tpot_p50": r["median_tpot_ms"], "tpot_p95": None, "tpot_p99": r["p99_tpot_ms"],
    }


def inference_perf(out):
    p = out / "inference-perf" / "summary_lifecycle_metrics.json"
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    lat = r["successes"]["latency"]
    t, o = lat["time_to_first_token"], lat["time_per_output_token"]
    return {
        "ok": r["successes"]["count"], "failed": r["failures"]["count"],
        "ttft_p50": t["median"] * 1e3, "ttft_p95": t["p95"] * 1e3, "ttft_p99": t["p99"] * 1e3,
        "tpot_p50": o["median"] * 1e3, "tpot_p95": o["p95"] * 1e3, "tpot_p99": o["p99"] * 1e3,
    }


def headroom(rows, start, end):
    mine = [r for r in rows if start <= r["timestamp"] <= end]
    ok = [r for r in mine if r["status"] == "ok"]
    ttft = [r["ttft_ms"] for r in ok]
    tpot = [r["tpot_ms"] for r in ok]
    by_replica = {}
    for r in ok:
        by_replica[r["replica"]] = by_replica.get(r["replica"], 0) + 1
    # A request the client itself abandoned (guidellm cancels what is in flight when
    # its request count is reached) is not a failure of the router.
    cancelled = sum(1 for r in mine if r["status"] == "cancelled")
    return {
        "ok": len(ok), "failed": len(mine) - len(ok) - cancelled, "cancelled": cancelled,
        "ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "ttft_p99": pct(ttft, 99),
        "tpot_p50": pct(tpot, 50), "tpot_p95": pct(tpot, 95), "tpot_p99": pct(tpot, 99),
        "replicas": by_replica,
    }


def main():
    args = sys.argv[1:]
    expect = None
    if "--expect" in args:
        i = args.index("--expect")
        expect = int(args[i + 1])
        del args[i : i + 2]
    out = pathlib.Path(args[0])
    problems = []
    rows = []
    log = out / "requests.jsonl"
    if log.exists():
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    windows = []
    for line in (out / "windows.tsv").read_text().splitlines():
        tool, start, end = line.split("\t")
        windows.append((tool, int(start), int(end)))
    readers = {"guidellm": guidellm, "vllm-bench-serve": vllm_bench, "inference-perf": inference_perf}
    lines = [
        f"# Load tools through Headroom ({out.name})",
        "",
        "Each tool's own report beside the router's request log for the same window.",
        "TTFT/TPOT in ms; tools measure at the client, Headroom from its upstream send.",
        "",
        "| tool | source | ok | failed | TTFT p50 | TTFT p95 | TTFT p99 | TPOT p50 | TPOT p95 | TPOT p99 | replicas |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tool, start, end in windows:
        own = readers.get(tool, lambda _: None)(out)
        if own:
            own_failed = str(own["failed"])
            if own.get("incomplete"):
                own_failed += f" (+{own['incomplete']} cancelled by the tool)"
            lines.append(
                f"| {tool} | {tool} | {own['ok']} | {own_failed} | {f(own['ttft_p50'])} | {f(own.get('ttft_p95'))} | "
                f"{f(own.get('ttft_p99'))} | {f(own['tpot_p50'])} | {f(own.get('tpot_p95'))} | {f(own.get('tpot_p99'))} | |"
            )
        h = headroom(rows, start, end)
        if expect is not None:
            if own is None:
                problems.append(f"{tool}: no report")
            # guidellm drops what it cancels at its count from its totals (0.8.1: 7 ok,
            # 0 incomplete of 8), so completeness is judged by the router's log below.
            elif own["failed"] or 2 * own["ok"] < expect:
                problems.append(
                    f"{tool}: {own['ok']} ok, {own.get('incomplete', 0)} cancelled by the tool, "
                    f"{own['failed']} failed (expected no failures and at least half of {expect} ok)"
                )
            # A client that closes once it has what it wanted (guidellm at its request
            # count) shows as cancelled here while the tool counts it a success.
            if h["ok"] + h["cancelled"] < expect or h["failed"]:
                problems.append(f"{tool}: the router logged {h['ok']} ok, {h['failed']} failed in its window")
        split = ", ".join(f"{k}: {v}" for k, v in sorted(h["replicas"].items()))
        failed = str(h["failed"])
        if h["cancelled"]:
            failed += f" (+{h['cancelled']} cancelled by the client)"
        lines.append(
            f"| {tool} | headroom | {h['ok']} | {failed} | {f(h['ttft_p50'])} | {f(h['ttft_p95'])} | "
            f"{f(h['ttft_p99'])} | {f(h['tpot_p50'])} | {f(h['tpot_p95'])} | {f(h['tpot_p99'])} | {split} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    print(text)
    if expect is not None and not windows:
        problems.append("no tool ran")
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
