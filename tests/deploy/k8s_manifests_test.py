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
file. The cluster: one client Service with no session affinity (any pod
serves any session by forwarding), the headless Service as --peer-dns, each
pod named after itself (--node-name from metadata.name) and advertised at its
IP (--advertise from status.podIP, the gRPC port). Tokens: the roles file
(--auth-tokens), the peer token and the drain hook's admin token come from
the Secret the kustomization generates from files deploy/make-tokens.sh
writes (never a literal). Session state: --state-dir is a per-pod
volumeClaimTemplate (ReadWriteOnce, at least 2 x --memory-budget) mounted
read-write, writable through fsGroup, and the startupProbe's window covers
restoring a full volume. Compose runs three nodes, each naming the other two
as peers, with the roles file and the peer token from compose secret files,
each with its own named state volume at --state-dir (a folder the image makes,
owned by its user), Prometheus scraping all three with the rules and Grafana
with the dashboard.
deploy/make-tokens.sh writes a roles file in the server's format.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

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


# Restore (--state-dir) runs before SERVING and reads every session file: the
# startupProbe must wait for a full state volume at this rate (a small cloud
# disk), plus RESTORE_SLACK_S for the model load (deploy/k8s/statefulset.yaml).
RESTORE_MIB_S = 50
RESTORE_SLACK_S = 60


# What deploy/make-tokens.sh writes into its folder (the Secret's and the
# compose secrets' sources).
MAKE_TOKENS_FILES = {"tokens", "admin-token", "peer-token"}
# The roles file's format (README, Security; server/auth.h): NAME ROLE TOKEN.
TOKEN_LINE = re.compile(r"([A-Za-z0-9._-]{1,64})\s+(client|admin|peer)\s+([!-~]{16,})")


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

    secrets_made = {}  # Secret name -> the keys the kustomization generates in it
    if kust:
        for g in kust[0].get("secretGenerator") or []:
            keys = secrets_made.setdefault(g.get("name"), set())
            for src in g.get("files") or []:
                key, _, path = str(src).rpartition("=")
                keys.add(key or os.path.basename(path))
                check(os.path.basename(path) in MAKE_TOKENS_FILES,
                      f"secretGenerator {g.get('name')} file {path} is one deploy/make-tokens.sh writes")
                check(path.startswith("secrets/"),
                      f"secretGenerator {g.get('name')} reads {path} under the ignored deploy/k8s/secrets/")
            check(not g.get("literals"), f"secretGenerator {g.get('name')} has no literal token")
    for f, d in docs:
        if d.get("kind") == "Secret":
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
    check(spec.get("podManagementPolicy") == "Parallel", "pods start in parallel (no start-up order needed)")

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
    env = {e.get("name"): e for e in server.get("env") or []}
    for a in args:
        for var in re.findall(r"\$\((\w+)\)", a):
            check(var in env, f"{a}: variable {var} is set in env (the kubelet expands $(VAR) from it)")

    def field_ref(var):
        return get(env.get(var, {}), "valueFrom", "fieldRef", "fieldPath")

    # Node identity: the pod's name, and the address peers reach it at, which
    # is what --peer-dns answers (pod IPs), so the node finds itself there.
    node_name = flag(args, "--node-name") or ""
    m = re.fullmatch(r"\$\((\w+)\)", node_name)
    check(m is not None and field_ref(m.group(1)) == "metadata.name",
          f"--node-name is the pod name (fieldRef metadata.name): {node_name}")
    advertise = flag(args, "--advertise") or ""
    m = re.fullmatch(r"\[?\$\((\w+)\)\]?:(\d+)", advertise)
    check(m is not None and field_ref(m.group(1)) == "status.podIP" and int(m.group(2)) == 50051
          and port_names.get("grpc") == 50051 and (peer_dns or "").endswith(":" + m.group(2)),
          f"--advertise is the pod IP (fieldRef status.podIP) at the gRPC port, the port --peer-dns "
          f"names: {advertise}")
    grace, drain_timeout, bound = drain_bound(args)
    sts_files = [f for f, d in docs if d.get("kind") == "StatefulSet"]
    with open(os.path.join(k8s, sts_files[0]), encoding="utf-8") as f:
        check(FORMULA in f.read(), f"deploy/k8s/{sts_files[0]} gives the formula: {FORMULA}")
    # Tokens: from the generated Secret, never a literal. The server reads the
    # roles file (a Secret volume); the node presents the peer token (an env
    # var the kubelet expands into --peer-token); the preStop drain sends the
    # admin token (the client's CORTIQ_TOKEN).
    def from_secret(var, key):
        ref = get(env.get(var, {}), "valueFrom", "secretKeyRef", default={})
        check(ref.get("name") in secrets_made and ref.get("key") == key
              and key in secrets_made.get(ref.get("name"), set()),
              f"env {var} is key {key} of the Secret the kustomization makes ({ref})")
        check("value" not in env.get(var, {}), f"env {var} has no literal value")

    from_secret("CORTIQ_TOKEN", "admin-token")
    peer_token = flag(args, "--peer-token") or ""
    m = re.fullmatch(r"\$\((\w+)\)", peer_token)
    if check(m is not None, f"--peer-token is an env reference, not a literal: {peer_token}"):
        from_secret(m.group(1), "peer-token")
    check(not any(a.startswith("--auth-token=") or a == "--auth-token" for a in args),
          "no --auth-token on the command line")
    tokens_file = flag(args, "--auth-tokens") or ""
    mounts = {vm.get("mountPath", "").rstrip("/"): vm for vm in server.get("volumeMounts") or []}
    vols = {v.get("name"): v for v in pod.get("volumes") or []}
    mount = mounts.get(os.path.dirname(tokens_file))
    vol = vols.get((mount or {}).get("name"), {})
    item = next((i for i in get(vol, "secret", "items", default=[]) if i.get("path") == os.path.basename(tokens_file)),
                None)
    secret_name = get(vol, "secret", "secretName")
    check(mount is not None and mount.get("readOnly") is True and item is not None
          and secret_name in secrets_made and item.get("key") == "tokens"
          and "tokens" in secrets_made.get(secret_name, set()),
          f"--auth-tokens {tokens_file} is key `tokens` of the generated Secret, mounted read-only")
    # The container's user reads the file: a group-readable mode with fsGroup
    # = the pod's group, or world-readable.
    mode = item.get("mode", get(vol, "secret", "defaultMode", default=0o644)) if item else 0
    user = get(pod, "securityContext", "runAsUser")
    fs_group = get(pod, "securityContext", "fsGroup")
    check((mode & 0o004) or ((mode & 0o040) and fs_group is not None and
                             fs_group == get(pod, "securityContext", "runAsGroup", default=user)),
          f"the roles file is readable by the pod's user (mode {mode:o}, fsGroup {fs_group})")
    check("--insecure" not in args, "the StatefulSet does not pass --insecure")
    # Session state: a per-pod PVC (outlives the pod, follows cortiq-N),
    # mounted read-write at --state-dir, writable by the pod's group.
    state_dir = (flag(args, "--state-dir") or "").rstrip("/")
    if check(bool(state_dir), f"--state-dir is set ({state_dir})"):
        smount = mounts.get(state_dir) or {}
        claims = {get(t, "metadata", "name"): t for t in spec.get("volumeClaimTemplates") or []}
        claim = claims.get(smount.get("name"))
        check(claim is not None and smount.get("name") not in vols and not smount.get("readOnly"),
              f"--state-dir {state_dir} is a read-write mount of a volumeClaimTemplate "
              f"({smount.get('name')}; templates {sorted(claims)})")
        size = quantity(get(claim or {}, "spec", "resources", "requests", "storage", default="0")) or 0
        if claim is not None:
            check(get(claim, "spec", "accessModes", default=[]) == ["ReadWriteOnce"],
                  f"the state claim is ReadWriteOnce ({get(claim, 'spec', 'accessModes')})")
            check(size >= 2 * (quantity(budget or "0") or 0) > 0,
                  f"the state claim ({size / 2**30:g} GiB) holds 2 x --memory-budget {budget} "
                  f"(sessions + compaction headroom)")
        check(fs_group is not None and fs_group == get(pod, "securityContext", "runAsGroup", default=user),
              f"the state volume is writable by the pod's user (fsGroup {fs_group} = its group)")
        sp = server.get("startupProbe") or {}
        window = sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3)
        need = size / (RESTORE_MIB_S * 2**20) + RESTORE_SLACK_S
        check(bool(sp) and window >= need,
              f"the startupProbe window {window} s covers restoring the state volume: "
              f"{size / 2**30:g} GiB at {RESTORE_MIB_S} MiB/s + {RESTORE_SLACK_S} s = {need:.0f} s")
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

    # One Service for clients (the headless one is for peers and pod names):
    # any pod serves any session, so nothing pins a client to a pod.
    clients = [n for n, s in services.items() if n != svc_name]
    if check(len(clients) == 1, f"one client Service besides the headless one: {clients}"):
        cs = services[clients[0]]
        check(get(cs, "spec", "clusterIP") != "None", f"Service {clients[0]} has a virtual IP")
        check(get(cs, "spec", "sessionAffinity", default="None") == "None"
              and get(cs, "spec", "sessionAffinityConfig") is None,
              f"Service {clients[0]} has no session affinity (forwarding finds the session)")
        check(any(p.get("port") == 50051 for p in get(cs, "spec", "ports", default=[])),
              f"Service {clients[0]} serves gRPC on 50051")
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
    check(len(servers) == 3, f"three server services built from the Dockerfile: {servers}")
    entrypoint = dockerfile_entrypoint(root)

    def secret_file(svc, path, what, made_as):
        """path is /run/secrets/NAME of a compose secret of svc: the file
        deploy/make-tokens.sh writes as deploy/secrets/MADE_AS."""
        name = path.removeprefix("/run/secrets/")
        svc_secrets = [x if isinstance(x, str) else x.get("source") for x in services[svc].get("secrets") or []]
        check(path.startswith("/run/secrets/") and name in svc_secrets,
              f"{svc} reads {what} from its compose secret ({path}, secrets {svc_secrets})")
        src = get(docs[0], "secrets", name, "file")
        check(src is not None and os.path.normpath(os.path.join(deploy, src)) ==
              os.path.join(deploy, "secrets", made_as),
              f"compose secret {name} is deploy/secrets/{made_as} (deploy/make-tokens.sh; the "
              f"folder is ignored): {src}")

    host_ports = []
    state_volumes = []
    named_volumes = docs[0].get("volumes") or {}
    image_dirs, image_user = dockerfile_user_dirs(root)
    for n in servers:
        svc = services[n]
        cmd = svc.get("command") or []
        cmd = cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]
        peers = (flag(cmd, "--peers") or "").split(",")
        for o in servers:
            if o != n:
                check(f"{o}:50051" in peers, f"{n} names {o}:50051 as a peer (--peers {','.join(peers)})")
        check(flag(cmd, "--node-name") == n and svc.get("hostname") == n,
              f"{n}: --node-name and hostname are the service name ({flag(cmd, '--node-name')})")
        check(flag(cmd, "--advertise") == f"{n}:50051", f"{n}: --advertise {n}:50051 ({flag(cmd, '--advertise')})")
        stop = svc.get("stop_grace_period")
        grace, drain_timeout, bound = drain_bound(cmd)
        check(stop is not None and duration_s(stop) >= bound,
              f"{n} stop_grace_period {stop} >= {FORMULA} = {grace:g} + {drain_timeout:g} + "
              f"{DRAIN_SLACK_S} = {bound:g} s")
        secret_file(n, flag(cmd, "--auth-tokens") or "", "the roles file (--auth-tokens)", "tokens")
        check("--insecure" not in cmd and not any(a.startswith(("--auth-token", "--peer-token")) and
                                                  a != "--auth-tokens" for a in cmd),
              f"{n}: no --insecure, no token on the command line")
        # The entrypoint: the image's, run by exec (the server stays PID 1 and
        # gets the stop signal), plus the peer token read from its secret file.
        ep = svc.get("entrypoint")
        ep = [str(x) for x in ep] if isinstance(ep, list) else shlex.split(str(ep or ""))
        script = ep[2] if len(ep) >= 3 and ep[:2] == ["/bin/sh", "-c"] else ""
        words = shlex.split(script.replace("$$", "$")) if script else []
        check(bool(entrypoint) and words[:1] == ["exec"] and words[1:1 + len(entrypoint)] == entrypoint
              and words[-1:] == ["$@"],
              f"{n}: the entrypoint execs the image's ENTRYPOINT {entrypoint} with the command's flags ({script})")
        m = re.search(r'--peer-token "\$\$\(cat (/run/secrets/[\w.-]+)\)"', script)
        if check(m is not None, f"{n}: --peer-token is read from a secret file ({script})"):
            secret_file(n, m.group(1), "the peer token", "peer-token")
        # Session state: the node's own named volume at --state-dir, on a
        # folder the image makes owned by its user (Docker copies that owner
        # into a new empty volume, so the server can write there).
        state_dir = (flag(cmd, "--state-dir") or "").rstrip("/")
        source = None
        for v in svc.get("volumes") or []:
            if isinstance(v, str):
                parts = v.split(":")
                if len(parts) >= 2 and parts[1].rstrip("/") == state_dir:
                    source = parts[0]
            elif isinstance(v, dict) and str(v.get("target", "")).rstrip("/") == state_dir \
                    and v.get("type", "volume") == "volume":
                source = v.get("source")
        if check(bool(state_dir) and source in named_volumes,
                 f"{n}: --state-dir {state_dir} is a named volume ({source})"):
            state_volumes.append(source)
            check(state_dir in image_dirs and image_dirs[state_dir] == image_user,
                  f"{n}: the image makes {state_dir} owned by its user {image_user} "
                  f"(owner {image_dirs.get(state_dir)})")
        for spec in svc.get("ports") or []:
            host, _, rest = str(spec).partition(":")
            check(host == "127.0.0.1", f"{n} publishes {spec} on loopback only")
            host_ports.append(rest.split(":")[0])
    check(len(host_ports) == len(set(host_ports)), f"the nodes' host ports differ ({host_ports})")
    check(len(state_volumes) == len(set(state_volumes)), f"every node has its own state volume ({state_volumes})")

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
                      f"the cortiq job scrapes every node's :9464 ({targets})")
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


def dockerfile_entrypoint(root):
    """The runtime stage's ENTRYPOINT words (exec form), or None."""
    entry = None
    with open(os.path.join(root, "Dockerfile"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("ENTRYPOINT "):
                entry = json.loads(line[len("ENTRYPOINT "):])
    return entry


def dockerfile_user_dirs(root):
    """({folder: owner} the runtime stage makes with `install -d -o OWNER`,
    the runtime USER's uid or name), from the last stage of the Dockerfile."""
    with open(os.path.join(root, "Dockerfile"), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    stage = text[text.rindex("\nFROM "):] if "\nFROM " in text else text
    dirs, user = {}, None
    for line in stage.splitlines():
        line = line.strip()
        if line.startswith("USER "):
            user = line.split()[1].split(":")[0]
        if not line.startswith("RUN "):
            continue
        for cmd in re.split(r"&&|;", line[len("RUN "):]):
            words = shlex.split(cmd)
            if words[:1] != ["install"] or "-d" not in words:
                continue
            owner, paths, i = None, [], 1
            while i < len(words):
                if words[i] in ("-o", "-g", "-m"):
                    owner = words[i + 1] if words[i] == "-o" else owner
                    i += 2
                    continue
                if not words[i].startswith("-"):
                    paths.append(words[i].rstrip("/"))
                i += 1
            for p in paths:
                dirs[p] = owner
    return dirs, user


def check_make_tokens(root):
    """deploy/make-tokens.sh writes a roles file the server accepts, and the
    admin and peer tokens that match its lines; it never overwrites one."""
    script = os.path.join(root, "deploy", "make-tokens.sh")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "secrets")
        r = subprocess.run(["bash", script, out, "alice", "bob"], capture_output=True, text=True)
        if not check(r.returncode == 0, f"make-tokens.sh DIR alice bob exits 0 ({r.stderr.strip()})"):
            return
        check(sorted(os.listdir(out)) == sorted(MAKE_TOKENS_FILES), f"it writes {sorted(MAKE_TOKENS_FILES)}")
        check(os.stat(out).st_mode & 0o077 == 0, "the folder is private (mode 700)")
        lines = {}
        tokens = []
        with open(os.path.join(out, "tokens"), encoding="utf-8") as f:
            for raw in f:
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                m = TOKEN_LINE.fullmatch(line)
                if check(m is not None, f"roles file line is NAME ROLE TOKEN: {line.split()[:2]} ..."):
                    lines[m.group(1)] = m.group(2)
                    tokens.append((m.group(1), m.group(3)))
        check(lines == {"admin": "admin", "peer": "peer", "alice": "client", "bob": "client"},
              f"roles: admin, peer and one client line per name ({lines})")
        check(len({t for _, t in tokens}) == len(tokens), "every token differs")
        by_name = dict(tokens)
        for name in ("admin", "peer"):
            with open(os.path.join(out, f"{name}-token"), encoding="utf-8") as f:
                value = f.read()
            check(value == by_name.get(name), f"{name}-token is the {name} line's token, no newline")
        r = subprocess.run(["bash", script, out], capture_output=True, text=True)
        check(r.returncode != 0 and "not overwriting" in r.stderr, "a second run refuses to overwrite")
        r = subprocess.run(["bash", script, os.path.join(tmp, "x"), "bad name"], capture_output=True, text=True)
        check(r.returncode == 2 and not os.path.exists(os.path.join(tmp, "x")),
              f"a bad client name is refused, nothing written ({r.stderr.strip()})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    check_k8s(root)
    check_compose(root)
    check_make_tokens(root)
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
