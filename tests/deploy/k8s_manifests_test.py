#!/usr/bin/env python3
"""Checks the deployment manifests: deploy/k8s (a kustomize base) and
deploy/compose.yaml, with the Prometheus and Grafana files they mount.

    k8s_manifests_test.py --root SOURCE_DIR

Every YAML document parses (python3-yaml) and has what its kind needs; the
StatefulSet, its Services, PodDisruptionBudget and PodMonitor agree on names,
labels and ports; probes are gRPC health on 50051; the preStop hook drains;
the kill timeouts (terminationGracePeriodSeconds, stop_grace_period) cover
--grace + --drain-timeout + 10 s for the flags in the manifest;
requests cover the model and the memory budget; the kustomization lists every
file; the auth token comes from a Secret (generated from a file the user
makes, never a literal) for the server and the drain hook; compose runs two
nodes that name each other as peers and read the token from a compose
secret file, Prometheus with the rules and Grafana with the dashboard.
"""
import argparse
import os
import re
import sys

try:
    import yaml
except ImportError:  # scripts/bootstrap.sh installs python3-yaml
    print("python3-yaml is missing: apt-get install -y python3-yaml (scripts/bootstrap.sh does)")
    sys.exit(1)

failures = []


def check(cond, message):
    print(("ok    " if cond else "FAIL  ") + message)
    if not cond:
        failures.append(message)
    return bool(cond)


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def get(d, *keys, default=None):
    for k in keys:
        if isinstance(d, dict) and k in d:
            d = d[k]
        elif isinstance(d, list) and isinstance(k, int) and k < len(d):
            d = d[k]
        else:
            return default
    return d


UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 2**10, "M": 2**20, "G": 2**30,
         "T": 2**40, "k": 10**3}


def quantity(q):
    """Kubernetes memory quantity or a cortiq-server byte count (1G = 2^30) -> bytes."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q).strip())
    if not m:
        return None
    n, unit = float(m.group(1)), m.group(2)
    if unit == "":
        return n
    return n * UNITS[unit] if unit in UNITS else None


def flag(args, name):
    """The value of --name in an argument list (`--name=V` or `--name V`); last wins."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a[len(name) + 1:]
    return value


# SIGTERM to exit takes at most --grace + --drain-timeout + DRAIN_SLACK_S
# seconds (README, docs/ARCHITECTURE.md: the engine's cancel wait and gRPC's
# shutdown); the kill timeouts in the manifests must cover it.
DRAIN_SLACK_S = 10
FORMULA = "--grace + --drain-timeout + 10"


def drain_bound(args):
    """--grace + --drain-timeout + DRAIN_SLACK_S for a server argument list (defaults 10 and 60)."""
    grace = float(flag(args, "--grace") or 10)
    drain_timeout = float(flag(args, "--drain-timeout") or 60)
    return grace, drain_timeout, grace + drain_timeout + DRAIN_SLACK_S


def duration_s(d):
    """A compose duration ("100s", "1m40s", "90") -> seconds."""
    total, text = 0.0, str(d).strip()
    if re.fullmatch(r"[0-9.]+", text):
        return float(text)
    for n, unit in re.findall(r"([0-9.]+)(h|ms|m|s|us)", text):
        total += float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
    return total


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- Kubernetes --------------------------------------------------------------

def check_k8s(root):
    k8s = os.path.join(root, "deploy", "k8s")
    files = sorted(f for f in os.listdir(k8s) if f.endswith((".yaml", ".yml")))
    docs = []  # (file, doc)
    for f in files:
        try:
            for d in load_all(os.path.join(k8s, f)):
                docs.append((f, d))
            check(True, f"deploy/k8s/{f} parses")
        except yaml.YAMLError as e:
            check(False, f"deploy/k8s/{f} parses: {e}")

    kust = [d for f, d in docs if f in ("kustomization.yaml", "kustomization.yml")]
    if check(len(kust) == 1, "deploy/k8s has one kustomization.yaml"):
        k = kust[0]
        check(k.get("kind") == "Kustomization" and str(k.get("apiVersion", "")).startswith("kustomize.config.k8s.io/"),
              "kustomization: apiVersion/kind")
        listed = k.get("resources") or []
        others = [f for f in files if not f.startswith("kustomization.")]
        for f in others:
            check(f in listed, f"kustomization lists {f}")
        for r in listed:
            check(os.path.exists(os.path.join(k8s, r)), f"kustomization resource {r} exists")

    secrets_made = set()  # Secrets the kustomization generates or lists
    if kust:
        for g in kust[0].get("secretGenerator") or []:
            secrets_made.add(g.get("name"))
            for src in g.get("files") or []:
                path = str(src).split("=", 1)[-1]
                check(path.startswith("secrets/"),
                      f"secretGenerator {g.get('name')} reads {path} under the ignored deploy/k8s/secrets/")
            check(not g.get("literals"), f"secretGenerator {g.get('name')} has no literal token")
    for f, d in docs:
        if d.get("kind") == "Secret":
            secrets_made.add(get(d, "metadata", "name"))
            check(False, f"{f}: no Secret manifest with a token in the repository")

    objs = [(f, d) for f, d in docs if d.get("kind") != "Kustomization"]
    for f, d in objs:
        check(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and get(d, "metadata", "name"),
              f"{f}: apiVersion, kind, metadata.name ({d.get('kind')}/{get(d, 'metadata', 'name')})")
    by_kind = {}
    for f, d in objs:
        by_kind.setdefault(d.get("kind"), []).append(d)

    sts_list = by_kind.get("StatefulSet", [])
    if not check(len(sts_list) == 1, "one StatefulSet"):
        return
    sts = sts_list[0]
    spec = sts.get("spec", {})
    pod_labels = get(spec, "template", "metadata", "labels", default={})
    check(matches(get(spec, "selector", "matchLabels", default={}), pod_labels),
          f"StatefulSet selector matches its pod labels {pod_labels}")
    services = {get(s, "metadata", "name"): s for s in by_kind.get("Service", [])}
    svc_name = spec.get("serviceName")
    headless = services.get(svc_name)
    check(headless is not None, f"StatefulSet serviceName {svc_name!r} is a Service here")
    if headless is not None:
        check(get(headless, "spec", "clusterIP") == "None", f"Service {svc_name} is headless (clusterIP: None)")
    check((spec.get("replicas") or 1) >= 2, "at least 2 replicas (a drain needs a peer)")

    pod = get(spec, "template", "spec", default={})
    containers = pod.get("containers") or []
    server = next((c for c in containers if any(p.get("containerPort") == 50051 for p in c.get("ports") or [])), None)
    if not check(server is not None, "a container exposes containerPort 50051"):
        return
    ports = {p.get("containerPort"): p.get("name") for p in server.get("ports") or []}
    port_names = {p.get("name"): p.get("containerPort") for p in server.get("ports") or []}
    check(9464 in ports, "the container exposes containerPort 9464 (metrics)")
    for probe in ("readinessProbe", "livenessProbe"):
        p = server.get(probe) or {}
        check(get(p, "grpc", "port") == 50051, f"{probe} is a gRPC health probe on 50051")
    if server.get("startupProbe"):
        check(get(server, "startupProbe", "grpc", "port") == 50051, "startupProbe is a gRPC health probe on 50051")
    pre = get(server, "lifecycle", "preStop")
    check(pre is not None, "the container has a preStop hook")
    if pre and "exec" in pre:
        cmd = " ".join(get(pre, "exec", "command", default=[]))
        check(re.search(r"\bcortiq\b.*\bdrain\b", cmd) is not None, f"preStop drains: {cmd}")
    requests = get(server, "resources", "requests", default={})
    check("memory" in requests and "cpu" in requests, f"resources.requests has memory and cpu ({requests})")

    args = [str(a) for a in (server.get("command") or []) + (server.get("args") or [])]
    budget = flag(args, "--memory-budget")
    if check(budget is not None and (quantity(budget) or 0) > 0, f"--memory-budget is set ({budget})"):
        weights = 17 * 2**20  # the embedded model: 4.2 M params in f32
        req = quantity(requests.get("memory", "0")) or 0
        check(req >= quantity(budget) + weights,
              f"requests.memory {requests.get('memory')} >= budget {budget} + weights 17 MiB")
        limit = get(server, "resources", "limits", "memory")
        if limit is not None:
            check((quantity(limit) or 0) >= req, f"limits.memory {limit} >= requests.memory")
    peer_dns = flag(args, "--peer-dns")
    check(peer_dns is not None and peer_dns.startswith(f"{svc_name}.")
          and peer_dns.endswith(".svc.cluster.local:50051"),
          f"--peer-dns names the headless Service: {peer_dns}")
    if peer_dns and "$(" in peer_dns:
        env = {e.get("name") for e in server.get("env") or []}
        for var in re.findall(r"\$\((\w+)\)", peer_dns):
            check(var in env, f"--peer-dns variable {var} is set in env")
    grace, drain_timeout, bound = drain_bound(args)
    sts_files = [f for f, d in docs if d.get("kind") == "StatefulSet"]
    with open(os.path.join(k8s, sts_files[0]), encoding="utf-8") as f:
        check(FORMULA in f.read(), f"deploy/k8s/{sts_files[0]} gives the formula: {FORMULA}")
    # The auth token: from a Secret, never a literal; the server (on
    # 0.0.0.0 it refuses to start without one) and the preStop drain (the
    # client's CORTIQ_TOKEN) both get it; peers get it as --peer-token's default.
    env = {e.get("name"): e for e in server.get("env") or []}
    for var in ("CORTIQ_AUTH_TOKEN", "CORTIQ_TOKEN"):
        ref = get(env.get(var, {}), "valueFrom", "secretKeyRef", default={})
        check(ref.get("name") in secrets_made and ref.get("key"),
              f"env {var} comes from the Secret the kustomization makes ({ref})")
        check("value" not in env.get(var, {}), f"env {var} has no literal value")
    check(not any(a.startswith(("--auth-token=", "--peer-token=")) or a in ("--auth-token", "--peer-token")
                  for a in args), "no token on the command line")
    check("--insecure" not in args, "the StatefulSet does not pass --insecure")
    tgp = pod.get("terminationGracePeriodSeconds")
    check(tgp is not None and tgp >= bound,
          f"terminationGracePeriodSeconds {tgp} >= {FORMULA} = {grace:g} + {drain_timeout:g} + "
          f"{DRAIN_SLACK_S} = {bound:g}")
    if pre and "exec" in pre:
        cmd = [str(c) for c in get(pre, "exec", "command", default=[])]
        hook_timeout = float(flag(cmd, "--timeout") or 0)
        check(grace + drain_timeout <= hook_timeout <= (tgp or 0),
              f"preStop drain --timeout {hook_timeout:g} covers --grace + --drain-timeout "
              f"({grace + drain_timeout:g}) within terminationGracePeriodSeconds {tgp}")
    check(get(pod, "securityContext", "runAsNonRoot") is True or
          get(server, "securityContext", "runAsNonRoot") is True, "runAsNonRoot")

    for name, s in services.items():
        check(matches(get(s, "spec", "selector", default={}), pod_labels), f"Service {name} selects the pods")
        for p in get(s, "spec", "ports", default=[]):
            tp = p.get("targetPort", p.get("port"))
            check(tp in port_names or tp in ports, f"Service {name} port {p.get('port')} -> container port {tp}")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        check(matches(get(pdb, "spec", "selector", "matchLabels", default={}), pod_labels),
              f"PodDisruptionBudget {get(pdb, 'metadata', 'name')} selects the pods")

    pms = by_kind.get("PodMonitor", [])
    if check(len(pms) == 1, "one PodMonitor"):
        pm = pms[0]
        check(str(pm.get("apiVersion")) == "monitoring.coreos.com/v1", "PodMonitor apiVersion monitoring.coreos.com/v1")
        check(matches(get(pm, "spec", "selector", "matchLabels", default={}), pod_labels), "PodMonitor selects the pods")
        eps = get(pm, "spec", "podMetricsEndpoints", default=[])
        check(any((port_names.get(e.get("port")) == 9464 or e.get("targetPort") == 9464)
                  and e.get("path", "/metrics") == "/metrics" for e in eps),
              "PodMonitor scrapes port 9464 /metrics")
        jl = get(pm, "spec", "jobLabel")
        if jl:
            check(pod_labels.get(jl) == "cortiq", f"PodMonitor job label ({jl}) is `cortiq`, the job rules.yml uses")

    rules_path = os.path.join(root, "deploy", "prometheus", "rules.yml")
    for pr in by_kind.get("PrometheusRule", []):
        check(get(pr, "spec", "groups") == load_all(rules_path)[0].get("groups"),
              "PrometheusRule groups == deploy/prometheus/rules.yml groups")


# --- Compose -----------------------------------------------------------------

def check_compose(root):
    deploy = os.path.join(root, "deploy")
    path = os.path.join(deploy, "compose.yaml")
    try:
        docs = load_all(path)
    except yaml.YAMLError as e:
        check(False, f"deploy/compose.yaml parses: {e}")
        return
    check(len(docs) == 1, "deploy/compose.yaml parses (one document)")
    with open(path, encoding="utf-8") as f:
        check(FORMULA in f.read(), f"deploy/compose.yaml gives the formula: {FORMULA}")
    services = docs[0].get("services") or {}

    def is_server(s):
        b = s.get("build")
        ctx = b if isinstance(b, str) else (b or {}).get("context")
        from_dockerfile = ctx is not None and os.path.exists(
            os.path.join(deploy, ctx, (b or {}).get("dockerfile", "Dockerfile") if isinstance(b, dict) else "Dockerfile"))
        return from_dockerfile

    servers = sorted(n for n, s in services.items() if is_server(s))
    check(len(servers) == 2, f"two server services built from the Dockerfile: {servers}")
    for n in servers:
        cmd = services[n].get("command") or []
        cmd = cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]
        peers = (flag(cmd, "--peers") or "").split(",")
        others = [o for o in servers if o != n]
        for o in others:
            check(any(p.split(":")[0] == o for p in peers), f"{n} names {o} as a peer (--peers {','.join(peers)})")
        stop = services[n].get("stop_grace_period")
        grace, drain_timeout, bound = drain_bound(cmd)
        check(stop is not None and duration_s(stop) >= bound,
              f"{n} stop_grace_period {stop} >= {FORMULA} = {grace:g} + {drain_timeout:g} + "
              f"{DRAIN_SLACK_S} = {bound:g} s")
        # The token: a compose secret file, mounted at /run/secrets/NAME.
        token_file = flag(cmd, "--auth-token-file") or ""
        name = token_file.removeprefix("/run/secrets/")
        svc_secrets = [s if isinstance(s, str) else s.get("source") for s in services[n].get("secrets") or []]
        check(token_file.startswith("/run/secrets/") and name in svc_secrets,
              f"{n} reads --auth-token-file from its compose secret ({token_file}, secrets {svc_secrets})")
        src = get(docs[0], "secrets", name, "file")
        check(src is not None and os.path.normpath(os.path.join(deploy, src)).startswith(
            os.path.join(deploy, "secrets") + os.sep),
              f"compose secret {name} is a file under the ignored deploy/secrets/ ({src})")
        check("--insecure" not in cmd and "--auth-token" not in cmd, f"{n}: no --insecure, no literal token")

    prom = next((n for n, s in services.items() if "prometheus" in str(s.get("image", ""))), None)
    graf = next((n for n, s in services.items() if "grafana" in str(s.get("image", ""))), None)
    check(prom is not None, "a Prometheus service")
    check(graf is not None, "a Grafana service")

    def mounts(svc):
        out = {}
        for v in services[svc].get("volumes") or []:
            if isinstance(v, str):
                parts = v.split(":")
                if len(parts) >= 2 and parts[0].startswith("."):
                    out[parts[1]] = os.path.normpath(os.path.join(deploy, parts[0]))
            elif isinstance(v, dict) and v.get("type") == "bind":
                out[v["target"]] = os.path.normpath(os.path.join(deploy, v["source"]))
        return out

    def host_path(m, container_path):
        """The host file behind container_path through the bind mounts m."""
        for target, src in sorted(m.items(), key=lambda kv: -len(kv[0])):
            if container_path == target:
                return src
            if container_path.startswith(target.rstrip("/") + "/"):
                return os.path.join(src, container_path[len(target.rstrip("/")) + 1:])
        return None

    if prom:
        m = mounts(prom)
        cmd = [str(c) for c in services[prom].get("command") or []]
        cfg = flag(cmd, "--config.file") or "/etc/prometheus/prometheus.yml"
        cfg_host = host_path(m, cfg)
        check(cfg_host == os.path.join(deploy, "prometheus", "prometheus.yml"),
              f"Prometheus reads deploy/prometheus/prometheus.yml ({cfg} <- {cfg_host})")
        if cfg_host and os.path.exists(cfg_host):
            pcfg = load_all(cfg_host)[0]
            for r in pcfg.get("rule_files") or []:
                in_container = r if r.startswith("/") else os.path.join(os.path.dirname(cfg), r)
                check(host_path(m, in_container) == os.path.join(deploy, "prometheus", "rules.yml"),
                      f"Prometheus sees the rules ({in_container})")
            job = next((j for j in pcfg.get("scrape_configs") or [] if j.get("job_name") == "cortiq"), None)
            if check(job is not None, "prometheus.yml has the job `cortiq`"):
                targets = [t for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
                check(sorted(targets) == sorted(f"{n}:9464" for n in servers),
                      f"the cortiq job scrapes both nodes' :9464 ({targets})")
                check(job.get("metrics_path", "/metrics") == "/metrics", "the cortiq job scrapes /metrics")
    if graf:
        m = mounts(graf)
        prov = host_path(m, "/etc/grafana/provisioning")
        check(prov == os.path.join(deploy, "grafana", "provisioning"),
              "Grafana mounts deploy/grafana/provisioning at /etc/grafana/provisioning")
        ds_dir = os.path.join(deploy, "grafana", "provisioning", "datasources")
        db_dir = os.path.join(deploy, "grafana", "provisioning", "dashboards")
        ds = [d for f in sorted(os.listdir(ds_dir)) if f.endswith((".yaml", ".yml"))
              for doc in load_all(os.path.join(ds_dir, f)) for d in doc.get("datasources") or []]
        check(any(d.get("type") == "prometheus" and prom and f"//{prom}:9090" in str(d.get("url")) for d in ds),
              "a provisioned Prometheus datasource points at the compose Prometheus")
        providers = [p for f in sorted(os.listdir(db_dir)) if f.endswith((".yaml", ".yml"))
                     for doc in load_all(os.path.join(db_dir, f)) for p in doc.get("providers") or []]
        dash = os.path.join(deploy, "grafana", "cortiq.json")
        found = False
        for p in providers:
            d = get(p, "options", "path")
            if d and host_path(m, d.rstrip("/") + "/cortiq.json") == dash:
                found = True
        check(found, "a dashboard provider loads deploy/grafana/cortiq.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    check_k8s(root)
    check_compose(root)
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
