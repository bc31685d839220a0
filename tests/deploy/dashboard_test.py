#!/usr/bin/env python3
"""Checks the Grafana dashboard and the alert rules against docs/METRICS.md.

    dashboard_test.py --root SOURCE_DIR [--promtool PATH]

* deploy/grafana/cortiq.json parses; every panel (rows aside) has at least one
  PromQL target; panel ids are unique.
* Every `cortiq_*` series the dashboard and deploy/prometheus/rules.yml use is
  a metric of docs/METRICS.md (histograms through _bucket/_sum/_count), and
  every label they match or group by is one the metric has (or instance/job/le).
* The dashboard covers what it is for: memory by kind and by node, sessions,
  tokens/s, TTFT and inter-token percentiles, migrations, refusals, batch size,
  and the per-request series (queue / prefill / decode time and TTFT /
  inter-token by front end, tokens per request, finish reasons, memory
  utilisation, HTTP requests by route and status and their duration), and
  the scheduler (waiting jobs by priority, step rows against the budget,
  queue wait p50/p99 by priority, step rows by kind), and persistence
  (session disk bytes per node, spilled sessions, write bytes/s and
  seconds/s, failures, spills and read-backs).
* With promtool, every dashboard expression (Grafana variables substituted)
  is valid PromQL: they are checked as recording rules.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("python3-yaml is missing: apt-get install -y python3-yaml (scripts/bootstrap.sh does)")
    sys.exit(1)

failures = []


def check(cond, message):
    print(("ok    " if cond else "FAIL  ") + message)
    if not cond:
        failures.append(message)
    return bool(cond)


def documented_metrics(path):
    """{name: (type, {label names and values})} from the tables of docs/METRICS.md."""
    metrics = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) < 3:
                continue
            m = re.fullmatch(r"`(cortiq_[a-z0-9_]+)`", cells[0])
            if m:
                metrics[m.group(1)] = (cells[1], set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[2])))
    return metrics


GENERIC_LABELS = {"instance", "job"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset"}


def series_in(expr):
    return re.findall(r"\b(cortiq_[a-z0-9_]+)\b", expr)


def base_metric(name, metrics):
    """The documented metric behind a series name, and its type; None if none."""
    if name in metrics:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and metrics.get(name[: -len(suffix)], ("",))[0] == "histogram":
            return name[: -len(suffix)]
    return None


def labels_in(expr):
    """Label names in matchers {l="v"} and in by (...)/without (...) clauses."""
    out = set()
    for block in re.findall(r"\{([^}]*)\}", expr):
        out |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    for block in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        out |= {x.strip() for x in block.split(",") if x.strip()}
    return out


def check_exprs(where, exprs, metrics):
    """Prints one line per problem, and one `ok` line when there is none."""
    problems = []
    used = set()
    for e in exprs:
        names = series_in(e)
        if not names and "up{" not in e:
            problems.append(f"`{e}` uses no cortiq metric")
        allowed = set(GENERIC_LABELS)
        for n in names:
            b = base_metric(n, metrics)
            if b is None:
                problems.append(f"{n} is not in docs/METRICS.md (`{e}`)")
                continue
            used.add(b)
            allowed |= metrics[b][1]
            if n.endswith("_bucket"):
                allowed.add("le")
        for label in sorted(labels_in(e) - PROMQL_WORDS - allowed):
            problems.append(f"label `{label}` is not a label of {sorted(set(names))} (`{e}`)")
    for p in problems:
        check(False, f"{where}: {p}")
    if not problems:
        check(True, f"{where}: {len(exprs)} expressions, {len(used)} metrics, all in docs/METRICS.md with their labels")


def substitute(expr):
    """Grafana variables -> values promtool can parse."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    expr = expr.replace("$instance", ".*").replace("$job", "cortiq")
    return expr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--promtool", default=shutil.which("promtool"))
    a = ap.parse_args()
    metrics = documented_metrics(os.path.join(a.root, "docs", "METRICS.md"))
    check(len(metrics) >= 20, f"docs/METRICS.md documents {len(metrics)} metrics")

    path = os.path.join(a.root, "deploy", "grafana", "cortiq.json")
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
        check(True, "deploy/grafana/cortiq.json parses")
    except (OSError, ValueError) as e:
        check(False, f"deploy/grafana/cortiq.json parses: {e}")
        return 1
    check(bool(dash.get("title")) and bool(dash.get("uid")), "the dashboard has a title and a uid")
    panels = []
    for p in dash.get("panels") or []:
        panels.append(p)
        panels += p.get("panels") or []  # collapsed rows keep their panels inside
    ids = [p.get("id") for p in panels]
    check(len(ids) == len(set(ids)), "panel ids are unique")
    exprs = []
    for p in panels:
        if p.get("type") == "row":
            continue
        targets = [t.get("expr", "") for t in p.get("targets") or [] if t.get("expr", "").strip()]
        check(bool(targets), f"panel `{p.get('title')}` has a PromQL target")
        check(bool(p.get("gridPos")), f"panel `{p.get('title')}` has a gridPos")
        exprs += targets
    check_exprs("dashboard", exprs, metrics)

    # What the dashboard is for.
    joined = "\n".join(exprs)
    wanted = {
        "memory by kind": r"by \(kind\) \(cortiq_session_memory_bytes",
        "memory per node": r"by \(instance\) \(cortiq_session_memory_bytes",
        "sessions active/busy/max": r"cortiq_sessions_active[\s\S]*cortiq_sessions_busy[\s\S]*cortiq_sessions_max",
        "tokens/s": r"rate\(cortiq_generated_tokens_total",
        "TTFT percentiles": r"histogram_quantile\([^,]+, sum by \(le\) \(rate\(cortiq_time_to_first_token_seconds_bucket",
        "inter-token percentiles": r"histogram_quantile\([^,]+, sum by \(le\) \(rate\(cortiq_inter_token_latency_seconds_bucket",
        "migrations by direction/result": r"by \(direction, result\) \([a-z]+\(cortiq_migrations_total",
        "RESOURCE_EXHAUSTED refusals": r"cortiq_requests_total\{[^}]*RESOURCE_EXHAUSTED",
        "exports refused": r"cortiq_exports_refused_total",
        "engine batch size": r"cortiq_engine_batch_size\b",
        "step batch size histogram": r"cortiq_engine_step_batch_size_bucket",
        # The per-request series (issue 16): by front end where they have one.
        "TTFT by front end": r"sum by \(le, frontend\) \(rate\(cortiq_time_to_first_token_seconds_bucket",
        "inter-token by front end": r"sum by \(le, frontend\) \(rate\(cortiq_inter_token_latency_seconds_bucket",
        "queue time by front end": r"sum by \(le, frontend\) \(rate\(cortiq_request_queue_time_seconds_bucket",
        "prefill time by front end": r"sum by \(le, frontend\) \(rate\(cortiq_request_prefill_time_seconds_bucket",
        "decode time by front end": r"sum by \(le, frontend\) \(rate\(cortiq_request_decode_time_seconds_bucket",
        "prompt tokens per request": r"histogram_quantile\([^,]+, sum by \(le\) \(rate\(cortiq_request_prompt_tokens_bucket",
        "generated tokens per request": r"histogram_quantile\([^,]+, sum by \(le\) \(rate\(cortiq_request_generation_tokens_bucket",
        "finished requests by reason": r"by \(frontend, finished_reason\) \(rate\(cortiq_requests_finished_total",
        "memory utilisation ratio": r"cortiq_memory_utilization_ratio\b",
        "HTTP requests by route and status": r"by \(route, status\) \(rate\(cortiq_http_requests_total",
        "HTTP duration by route": r"sum by \(le, route\) \(rate\(cortiq_http_request_duration_seconds_bucket",
        # The scheduler (issue 19).
        "waiting jobs by priority": r"sum by \(priority\) \(cortiq_engine_waiting_jobs",
        "step rows vs the budget": r"cortiq_engine_step_rows\b[\s\S]*cortiq_engine_step_token_budget\b",
        "queue wait p50 by priority": r"histogram_quantile\(0\.5, sum by \(le, priority\) \(rate\(cortiq_queue_wait_seconds_bucket",
        "queue wait p99 by priority": r"histogram_quantile\(0\.99, sum by \(le, priority\) \(rate\(cortiq_queue_wait_seconds_bucket",
        "step rows by kind": r"by \(kind\) \(rate\(cortiq_engine_step_tokens_total",
        # Persistence (issue 18, --state-dir).
        "session disk bytes per node": r"by \(instance\) \(cortiq_session_disk_bytes",
        "spilled sessions": r"cortiq_sessions_spilled\b",
        "persist write bytes/s": r"rate\(cortiq_persist_bytes_total",
        "persist write seconds/s": r"rate\(cortiq_persist_write_seconds_total",
        "persist failures": r"rate\(cortiq_persist_failures_total",
        "spills and read-backs": r"rate\(cortiq_session_spills_total[\s\S]*rate\(cortiq_session_unspills_total",
    }
    for what, pattern in wanted.items():
        check(re.search(pattern, joined) is not None, f"the dashboard shows {what}")

    rules_path = os.path.join(a.root, "deploy", "prometheus", "rules.yml")
    with open(rules_path, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    rule_exprs = [r["expr"] for g in rules.get("groups") or [] for r in g.get("rules") or []]
    check_exprs("rules.yml", rule_exprs, metrics)

    if a.promtool:
        with tempfile.TemporaryDirectory() as tmp:
            rf = os.path.join(tmp, "dashboard_rules.yml")
            with open(rf, "w", encoding="utf-8") as f:
                yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": substitute(e)} for i, e in enumerate(exprs)]}]}, f)
            r = subprocess.run([a.promtool, "check", "rules", rf], capture_output=True, text=True)
            check(r.returncode == 0, f"promtool: the {len(exprs)} dashboard expressions are valid PromQL")
            if r.returncode != 0:
                print(r.stdout + r.stderr)
    else:
        print("skip  promtool not found: dashboard PromQL not parsed")

    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
