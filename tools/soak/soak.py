#!/usr/bin/python3
"""Chaos soak for cortiq-server (issue 17, requirement 8).

Starts three cortiq-server nodes on 127.0.0.1 that are peers of each other
(--peers, one token for clients and peers, a memory budget each), runs a
bounded mixed workload against them for --duration seconds and injects faults
at random times (seeded). It then audits every kept session it created and
writes a report (JSON and a markdown section for docs/RELIABILITY.md).

Workload (--concurrency workers, each picking an action at random):
  oneshot   Generate, greedy, the session released at the end
  open      Generate with keep_session: a kept session the soak tracks
  continue  Generate on a kept session (greedy); after a move it is verified
  cancel    a long Generate (kept or one-shot) cancelled after a few tokens
  release   ReleaseSession of a kept session
  migrate   MigrateSession of a kept session to another node
  stall     ExportSession of a kept session, then an ImportSession stream that
            sends all but the last 40 bytes and stops until its deadline
  garbage   bytes that are not a valid protobuf message, to a random RPC
  chat      an OpenAI chat turn on the HTTP front, in one of a few
            conversations (x-cortiq-session), to any node: the conversation's
            session is relayed to the node that holds it; streamed or not,
            sometimes dropped mid-stream by the client
Faults (one at a time, every --fault-interval seconds, on a random node):
  stop      SIGSTOP, a few seconds, SIGCONT
  kill      kill -9, then a restart on the same ports
  drain     SIGTERM: the node migrates its kept sessions to its peers and
            exits; the soak follows them (drain log lines), then restarts it
With --persist every node has its own --state-dir (kept across its restarts)
and a short --session-ttl, so idle sessions spill to disk and are read back by
their next call, and a kill -9 loses nothing: the restarted node restores its
sessions, each at its last completed call, and they are verified again.

Judgement (exit status 1 if any):
  * a node that died by itself (not by one of the soak's faults), or a
    drain that exited non-zero or did not finish within --drain-wait;
  * a kept session lost without being released, except those of a node
    killed with -9 without --persist (counted apart);
  * a kept session found on two nodes at once (--persist: a file that
    outlived its move, or a restore of a session that had moved on);
  * a greedy continuation that differs from its solo reference: the same
    calls (prompts, max_tokens) replayed on a fresh session of a healthy node;
  * a gRPC code outside the expected set of its call (see EXPECTED_CODES);
    --known-issues turns named, documented deviations of today's server into
    their own reported outcome instead of a failure;
  * an exception in the soak itself (a tool error).

  soak.py --server-bin BIN [--model DIR | --mkmodel tiny --tool-bin BIN] --proto-py DIR
          --workdir DIR [--duration 60] [--concurrency 4] [--seed 1]
          [--persist] [--known-issues NAME,...] [--report-json FILE] [--report-md FILE]
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LISTEN_RE = re.compile(r"^listening on (\S+):(\d+) metrics (\d+)\s*$", re.M)
# spdlog line of Server::Drain; the peer's id is escaped by the server.
DRAIN_MOVED_RE = re.compile(r"drain: session ([0-9a-f]+) migrated to (\S+) \(node [^)]*\)")
DRAIN_FAILED_RE = re.compile(r"drain: session ([0-9a-f]+) NOT migrated: (.*)$", re.M)

# Deviations of today's server that --known-issues can name. Each is reported
# under its own outcome and is not a failure while named.
KNOWN_ISSUES = {
    "garbage-unimplemented":
        "a malformed request message is answered UNIMPLEMENTED (issue 17 req 3 wants "
        "INVALID_ARGUMENT)",
    "drain-busy-session":
        "a drain does not wait for a session leased by a call in flight other than a "
        "Generate stream (a client's MigrateSession or ExportSession, a just-cancelled "
        "Generate): it reports it NOT migrated and exits 3 at once",
    "migrate-after-deadline":
        "a MigrateSession whose caller gave up still completes: the session moves to the "
        "peer under an id the caller never learns (issue 17 req 2)",
}

# Codes a well-formed call may get while nodes are stopped, killed or draining
# and sessions are busy; anything else (INTERNAL, UNKNOWN, UNIMPLEMENTED,
# DATA_LOSS, INVALID_ARGUMENT, ...) is a failure unless --allow-code adds it.
EXPECTED_CODES = {"OK", "DEADLINE_EXCEEDED", "UNAVAILABLE", "ABORTED", "RESOURCE_EXHAUSTED",
                  "NOT_FOUND", "CANCELLED"}
# A malformed message must get INVALID_ARGUMENT (or nothing, if the node is down).
GARBAGE_CODES = {"INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "UNAVAILABLE"}
# An ImportSession stream is admitted before its first message is read: with
# every --max-concurrent-imports slot taken (stalled imports), it is refused
# unread, whatever it would have sent.
GARBAGE_IMPORT_CODES = GARBAGE_CODES | {"RESOURCE_EXHAUSTED"}
# RPCs that get garbage, with their streaming shape.
GARBAGE_RPCS = [("Generate", "unary_stream"), ("CreateSession", "unary_unary"),
                ("GetSession", "unary_unary"), ("ReleaseSession", "unary_unary"),
                ("Tokenize", "unary_unary"), ("MigrateSession", "unary_unary"),
                ("ExportSession", "unary_stream"), ("ImportSession", "stream_unary")]

# Session modes a kept session is opened in (--modes), with the parameters of
# the C++ tests (tests/common/server_test_util.h, SetSessionMode): small
# windows and blocks, so that the short sessions of the soak cross them.
MODES = ("exact", "int8", "o1", "qsa", "window")


def session_config(mode):
    c = pb2.SessionConfig()
    if mode == "int8":
        c.kv_dtype = pb2.KV_DTYPE_INT8
    elif mode == "o1":
        c.attention = pb2.ATTENTION_MODE_O1
        c.o1.m, c.o1.window, c.o1.sink = 8, 16, 2
    elif mode == "qsa":
        c.attention = pb2.ATTENTION_MODE_QSA
        c.qsa.ratio, c.qsa.budget = 16, 4
    elif mode == "window":
        c.attention = pb2.ATTENTION_MODE_WINDOW
        c.window.sink, c.window.window = 2, 16
    return c


ACTIONS = {"oneshot": 16, "open": 12, "continue": 26, "cancel": 8, "release": 8,
           "migrate": 12, "stall": 4, "garbage": 14, "chat": 12}
# HTTP statuses a well-formed chat turn may get under faults: 409 a turn of
# the same conversation still ending (a dropped stream's), 429 the budget,
# 503 a draining node or an owner that cannot be asked, 504 a deadline.
CHAT_STATUSES = {200, 409, 429, 503, 504}

pb2 = pb2_grpc = grpc = None
ARGS = None


def now():
    return time.monotonic()


def free_ports(n):
    """n distinct ports free on 127.0.0.1 now (all held open while chosen, so
    that none repeats); the nodes bind them a moment later and again on every
    restart, which is why they are not port 0."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100.0 * (len(v) - 1))))]


# ---------------------------------------------------------------------------
# Nodes


class Node:
    """One cortiq-server on fixed ports; restarted in place after a kill or a
    drain. `state` is up | stopped | draining | down; `epoch` changes at every
    fault start and end, so that a worker can tell that its call met a fault."""

    def __init__(self, name, port, metrics_port, http_port, peers, workdir):
        self.name = name
        self.port, self.metrics_port, self.http_port = port, metrics_port, http_port
        self.address = f"127.0.0.1:{port}"
        self.peers = peers
        self.workdir = workdir
        self.incarnation = 0
        self.proc = None
        self.log_path = None
        self.channel = self.stub = None
        self.state = "down"
        self.epoch = 0

    def command(self):
        return [ARGS.server_bin, "--model", str(ARGS.model), "--listen", self.address,
                "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--http-listen", f"127.0.0.1:{self.http_port}",
                "--threads", str(ARGS.threads), "--peers", ",".join(self.peers),
                "--auth-token", ARGS.token, "--peer-token", ARGS.token,
                "--memory-budget", ARGS.memory_budget, "--grace", str(ARGS.grace),
                *self.persist_flags(), *ARGS.server_arg]

    def persist_flags(self):
        """Without --persist no spill can happen (the TTL outlives the soak);
        with it the node's own state dir, durable turns, a short TTL."""
        if not ARGS.persist:
            return ["--session-ttl", str(int(ARGS.duration) + 3600)]
        return ["--state-dir", str(self.workdir / "state" / self.name), "--persist-sync", "turn",
                "--session-ttl", f"{ARGS.spill_ttl:g}"]

    def start(self):
        self.incarnation += 1
        self.log_path = self.workdir / f"{self.name}.{self.incarnation}.log"
        log = open(self.log_path, "wb")
        env = dict(os.environ)
        env.pop("CORTIQ_AUTH_TOKEN", None)
        env.pop("CORTIQ_PEERS", None)
        env.setdefault("CORTIQ_THREADS", str(ARGS.threads))
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        log.close()
        deadline = now() + 60
        while now() < deadline:
            m = LISTEN_RE.search(self.read_log())
            if m:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: cortiq-server exited with "
                                   f"{self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{self.name}: no 'listening on' line within 60 s:\n{self.tail()}")
        old = self.channel
        # A fresh channel per incarnation, with a short reconnect backoff.
        self.channel = grpc.insecure_channel(self.address, options=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500),
            ("grpc.max_receive_message_length", 64 << 20)])
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pb2_grpc.InferenceStub(self.channel)
        self.state = "up"
        if old is not None:
            old.close()

    def read_log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n=30):
        return "\n".join(self.read_log().splitlines()[-n:])

    def metrics(self, names):
        """The values of these unlabelled metric families on the node's
        /metrics ({} if it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in names:
                out[parts[0]] = float(parts[1])
        return out

    def rss_kib(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return None


# ---------------------------------------------------------------------------
# Bookkeeping


class Session:
    """A kept session the soak created. `calls` is every Generate on it, in
    order: (prompt_tokens, max_tokens, generated token ids); the session's
    history is their concatenation. `tainted`: a call on it ended without a
    clean answer, so its history is unknown and it is not verified (it still
    counts for losses)."""

    def __init__(self, sid, node, mode="exact"):
        self.id = sid
        self.node = node
        self.mode = mode  # MODES: its SessionConfig (session_config)
        self.calls = []
        self.tainted = False
        self.moved = False  # moved since its last verification
        self.moves = 0
        self.fate = "live"  # live | released | killed | lost | orphaned
        self.fate_detail = ""
        self.ambiguous_migrate_to = None  # node of a Migrate that ended in an error
        self.maybe_released = False  # a ReleaseSession on it ended in an error
        self.migrate_cut_by_kill = False  # its source was killed during that Migrate
        self.kills = 0  # kill -9s of its node it went through (--persist)
        self.verified_after_kill = False

    def tokens(self):
        return sum(len(p) + len(g) for p, _, g in self.calls)


class Chat:
    """A conversation on the HTTP front, as a chat client keeps it: its
    messages so far (resent whole each turn) and the session ids its answers
    named (x-cortiq-session-id). One worker at a time (busy)."""

    def __init__(self, name):
        self.name = name
        self.messages = []
        self.ids = set()
        self.busy = False


class Soak:
    def __init__(self, nodes, model_info):
        self.nodes = nodes
        self.info = model_info
        self.lock = threading.Lock()
        self.rng = random.Random(ARGS.seed)
        self.stop_event = threading.Event()
        self.t0 = now()
        self.outcomes = {}  # (rpc, outcome) -> count
        self.unexpected = []  # (t, rpc, code, details)
        self.known = {}  # issue -> count
        self.ttft = []  # seconds, client side: call start to first token
        self.ttft_server = []
        self.sessions = {}  # key -> Session (key: the soak's own counter)
        self.free = []  # Sessions not checked out by a worker
        self.held = set()  # Sessions checked out by a worker
        self.reference_ids = set()  # live replay sessions (verify_session)
        self.next_key = 0
        self.faults = []
        self.crashes = []
        self.failures = []  # free-text failures (drain, verification, ...)
        self.tool_errors = []
        self.verify = {"checked": 0, "matched": 0, "skipped": 0, "mismatches": []}
        self.rss = {n.name: [] for n in nodes}  # (t, incarnation, KiB)
        self.orphans_adopted = 0
        self.late_releases = 0  # NOT_FOUND after a ReleaseSession that failed
        self.moves_cut_by_kill = 0  # found on the target after its source's kill -9
        self.drains_left_sessions = 0  # --persist: drains that exited 3 (sessions kept on disk)
        self.duplicates = []  # (session, nodes) found on more than one node
        self.persist_counts = {}  # --persist: spills, read-backs, restores (all starts)
        self.verified_modes = {}  # mode -> continuations equal to their reference
        # Calls that may have left a session no client knows of: an open that
        # failed or was not tracked, a replay session not released, a session
        # moved to a node a fault then hit. The end's accounting bounds the
        # sessions nobody owns by this.
        self.possible_orphans = 0
        self.accounting = {}
        self.chats = [Chat(f"soak-chat-{i}") for i in range(ARGS.chats)]
        self.model_name = ""  # GET /v1/models of the first node

    def note_possible_orphan(self):
        with self.lock:
            self.possible_orphans += 1

    # -- outcomes ---------------------------------------------------------

    def elapsed(self):
        return now() - self.t0

    def count(self, rpc, outcome):
        with self.lock:
            self.outcomes[(rpc, outcome)] = self.outcomes.get((rpc, outcome), 0) + 1

    def record(self, rpc, code, details="", expected=EXPECTED_CODES):
        """Counts one call's outcome; a code outside `expected` (plus
        --allow-code) is a failure."""
        if code in expected or code in ARGS.allow_code:
            self.count(rpc, code)
            return
        if rpc.startswith("garbage:") and code == "UNIMPLEMENTED" and \
                "garbage-unimplemented" in ARGS.known_issues:
            self.count(rpc, "UNIMPLEMENTED (known: garbage-unimplemented)")
            self.note_known("garbage-unimplemented")
            return
        self.count(rpc, code + " (UNEXPECTED)")
        with self.lock:
            self.unexpected.append((round(self.elapsed(), 2), rpc, code, details[:300]))

    def note_known(self, issue):
        with self.lock:
            self.known[issue] = self.known.get(issue, 0) + 1

    def fail(self, what):
        with self.lock:
            self.failures.append(f"t={self.elapsed():.1f}s {what}")
        print(f"FAILURE {what}", flush=True)

    # -- sessions ---------------------------------------------------------

    def add_session(self, sess, epoch):
        """Tracks a new kept session, unless a fault began or ended on its node
        since `epoch` (a kill or drain may have taken it unseen). Fault state
        changes happen under the same lock (set_state)."""
        with self.lock:
            if sess.node.epoch != epoch:
                return False
            self.sessions[self.next_key] = sess
            self.next_key += 1
            self.free.append(sess)
            return True

    def set_state(self, node, state):
        with self.lock:
            node.state = state
            node.epoch += 1

    def checkout(self, want_clean=False):
        """A live session on an up node that no other worker holds, or None."""
        with self.lock:
            cands = [s for s in self.free if s.fate == "live"
                     and s.node.state in ("up", "stopped")
                     and not (want_clean and s.tainted)]
            if not cands:
                return None
            s = self.rng.choice(cands)
            self.free.remove(s)
            self.held.add(s)
            return s

    def checkout_chat(self):
        with self.lock:
            free = [c for c in self.chats if not c.busy]
            if not free:
                return None
            c = self.rng.choice(free)
            c.busy = True
            return c

    def checkin_chat(self, chat):
        with self.lock:
            chat.busy = False

    def chat_ids(self):
        with self.lock:
            return set().union(*(c.ids for c in self.chats))

    def checkin(self, sess):
        with self.lock:
            self.held.discard(sess)
            if sess.fate == "live":
                self.free.append(sess)

    def wait_unheld(self, node, timeout):
        """Waits until no worker holds a session that is on `node`."""
        deadline = now() + timeout
        while now() < deadline:
            with self.lock:
                if not any(s.node is node for s in self.held):
                    return True
            time.sleep(0.05)
        return False

    def live_count(self):
        with self.lock:
            return sum(1 for s in self.sessions.values() if s.fate == "live")

    def healthy_nodes(self, exclude=None):
        """Nodes running normally: references and audits go here."""
        return [n for n in self.nodes if n.state == "up" and n is not exclude]

    def reachable_nodes(self, exclude=None):
        """Nodes a client could still be sending to: running, frozen by
        SIGSTOP (calls wait) or draining (calls get UNAVAILABLE)."""
        return [n for n in self.nodes if n.state != "down" and n is not exclude]


def metadata():
    return (("authorization", f"Bearer {ARGS.token}"),)


def code_of(e):
    return e.code().name if isinstance(e, grpc.RpcError) else type(e).__name__


def details_of(e):
    try:
        return e.details() or ""
    except Exception:  # noqa: BLE001 - not every RpcError carries details
        return str(e)


# ---------------------------------------------------------------------------
# Calls


def generate(soak, node, rpc, req, cancel_after=None):
    """Runs one Generate to the end (or cancels it after `cancel_after`
    tokens); returns (code, token ids, summary or None, details). Records the
    outcome and, for a clean stream, the time to first token."""
    t = now()
    tokens, summary, first = [], None, None
    try:
        call = node.stub.Generate(req, timeout=ARGS.rpc_timeout, metadata=metadata())
        for msg in call:
            kind = msg.WhichOneof("event")
            if kind == "token":
                if first is None:
                    first = now() - t
                tokens.append(msg.token.token_id)
                if cancel_after is not None and len(tokens) >= cancel_after:
                    call.cancel()
            elif kind == "summary":
                summary = msg.summary
        code, details = "OK", ""
        if summary is None:
            code, details = "INTERNAL", "stream ended without a summary"
    except grpc.RpcError as e:
        code, details = code_of(e), details_of(e)
    soak.record(rpc, code, details)
    # Time to first token of the workload's own calls (not the replays).
    if code == "OK" and first is not None and rpc not in ("Generate(reference)", "Generate(audit)"):
        with soak.lock:
            soak.ttft.append(first)
            soak.ttft_server.append(summary.timings.time_to_first_token_seconds)
    return code, tokens, summary, details


def random_prompt(soak, rng, lo, hi):
    """Token ids of a random prompt: bytes of printable text for the byte
    model, random non-EOS ids otherwise."""
    vocab = soak.info.vocab_size
    eos = set(soak.info.eos_token_ids)
    n = rng.randint(lo, hi)
    if vocab >= 256:
        words = ["the", "soak", "node", "of", "a", "session", "and", "to", "in", "is",
                 "river", "light", "when", "she", "said", "it", "was", "time"]
        text = " ".join(rng.choice(words) for _ in range(n))
        ids = [b for b in text.encode()[:hi * 4] if b not in eos]
        return ids or [65]
    return [t for t in (rng.randrange(3, vocab) for _ in range(n)) if t not in eos] or [3]


def greedy():
    return pb2.SamplingParams(temperature=0.0)


def complete(summary, tokens, n):
    """A kept call that ran to its max_tokens: the session's history is then
    known (with ignore_eos, anything shorter was cut, e.g. by a drain)."""
    return (summary is not None and summary.session_kept and len(tokens) == n
            and summary.finish_reason == pb2.FINISH_REASON_LENGTH)


# ---------------------------------------------------------------------------
# Actions (each runs in a worker thread with its own rng)


def act_oneshot(soak, rng):
    nodes = soak.reachable_nodes()
    if not nodes:
        return
    node = rng.choice(nodes)
    req = pb2.GenerateRequest(prompt_tokens=random_prompt(soak, rng, 4, 40),
                              max_tokens=rng.randint(4, 24), sampling=greedy(), ignore_eos=True)
    generate(soak, node, "Generate(oneshot)", req)


def act_open(soak, rng):
    if soak.live_count() >= ARGS.max_kept:
        return act_release(soak, rng)
    nodes = soak.reachable_nodes()
    if not nodes:
        return
    node = rng.choice(nodes)
    epoch = node.epoch
    prompt = random_prompt(soak, rng, 8, 40)
    n = rng.randint(4, 20)
    mode = rng.choice(ARGS.modes)
    req = pb2.GenerateRequest(prompt_tokens=prompt, max_tokens=n, sampling=greedy(),
                              ignore_eos=True, keep_session=True,
                              session_config=session_config(mode))
    code, tokens, summary, _ = generate(soak, node, "Generate(open)", req)
    if code == "OK" and summary.session_kept:
        sess = Session(summary.session_id, node, mode)
        sess.calls.append((prompt, n, tokens))
        sess.tainted = not complete(summary, tokens, n)
        if not soak.add_session(sess, epoch):
            soak.count("Generate(open)", "not tracked (a fault crossed the call)")
            soak.note_possible_orphan()
    elif code != "OK":
        soak.note_possible_orphan()  # it may have made the session before it failed


def continue_session(soak, rng, sess, rpc="Generate(continue)", cancel_after=None):
    """One more greedy call on a kept session; updates its history, or taints
    it when the call did not end cleanly. Returns the code."""
    node, sid, epoch = sess.node, sess.id, sess.node.epoch
    prompt = random_prompt(soak, rng, 2, 12)
    n = rng.randint(4, 16) if cancel_after is None else 200
    req = pb2.GenerateRequest(prompt_tokens=prompt, max_tokens=n, sampling=greedy(),
                              ignore_eos=True, keep_session=True, session_id=sid)
    code, tokens, summary, details = generate(soak, node, rpc, req, cancel_after)
    if code == "OK" and complete(summary, tokens, n) and sess.node is node and sess.id == sid:
        sess.calls.append((prompt, n, tokens))
    else:
        sess.tainted = True
        if code == "NOT_FOUND" and node.epoch == epoch and node.state == "up" \
                and sess.node is node and sess.fate == "live":
            check_gone(soak, sess, f"Generate answered NOT_FOUND: {details}")
    return code


def check_gone(soak, sess, why):
    """A session the server says it does not know, with no fault in between:
    lost, unless it was moved by a Migrate the soak had given up on."""
    if sess.ambiguous_migrate_to is not None and adopt_orphan(soak, sess):
        return
    if sess.maybe_released:
        # A ReleaseSession the client gave up on (e.g. its deadline passed
        # while the node was frozen) may have run later.
        with soak.lock:
            sess.fate, sess.fate_detail = "released", "by a ReleaseSession that ended in an error"
            soak.late_releases += 1
        return
    with soak.lock:
        sess.fate, sess.fate_detail = "lost", why
    soak.fail(f"session {sess.id} on {sess.node.name} lost: {why}")


def act_continue(soak, rng):
    sess = soak.checkout()
    if sess is None:
        return act_open(soak, rng)
    try:
        code = continue_session(soak, rng, sess)
        if code == "OK" and sess.moved and not sess.tainted:
            verify_session(soak, sess)
        if sess.tokens() > ARGS.max_history:
            release_session(soak, sess)
    finally:
        soak.checkin(sess)


def act_cancel(soak, rng):
    if rng.random() < 0.5:
        sess = soak.checkout()
        if sess is not None:
            try:
                if continue_session(soak, rng, sess, "Generate(cancel kept)",
                                    rng.randint(1, 6)) == "CANCELLED":
                    # At once, as a client retrying would (issue 17 req 6: the
                    # cancelled call's lease may still be held: ABORTED).
                    continue_session(soak, rng, sess, "Generate(right after cancel)")
            finally:
                soak.checkin(sess)
            return
    nodes = soak.reachable_nodes()
    if nodes:
        req = pb2.GenerateRequest(prompt_tokens=random_prompt(soak, rng, 4, 30), max_tokens=400,
                                  sampling=greedy(), ignore_eos=True)
        generate(soak, rng.choice(nodes), "Generate(cancel oneshot)", req, rng.randint(1, 6))


def release_session(soak, sess):
    node, epoch = sess.node, sess.node.epoch
    try:
        r = node.stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=sess.id),
                                     timeout=ARGS.rpc_timeout, metadata=metadata())
        soak.record("ReleaseSession", "OK")
        if r.released:
            with soak.lock:
                sess.fate = "released"
        elif node.epoch == epoch and node.state == "up" and sess.fate == "live":
            check_gone(soak, sess, "ReleaseSession answered released=false")
    except grpc.RpcError as e:
        soak.record("ReleaseSession", code_of(e), details_of(e))
        sess.maybe_released = True


def act_release(soak, rng):
    sess = soak.checkout()
    if sess is None:
        return
    try:
        release_session(soak, sess)
    finally:
        soak.checkin(sess)


def act_migrate(soak, rng):
    sess = soak.checkout()
    if sess is None:
        return
    try:
        # A frozen target is fair game: the source must not hang on it.
        targets = [n for n in soak.reachable_nodes(exclude=sess.node) if n.state != "draining"]
        if not targets:
            return
        target = rng.choice(targets)
        src, sid, inc, src_inc = sess.node, sess.id, target.incarnation, sess.node.incarnation
        req = pb2.MigrateSessionRequest(session_id=sid, peer=target.address, peer_token=ARGS.token)
        try:
            r = src.stub.MigrateSession(req, timeout=ARGS.rpc_timeout, metadata=metadata())
            soak.record("MigrateSession", "OK")
            with soak.lock:
                if target.incarnation != inc or target.state == "down":
                    # The target was killed, or its drain already finished,
                    # while the session arrived: a client cannot know where
                    # it is now. (A target still draining is followed by
                    # fault_drain, which waits for this worker.)
                    sess.fate = "untracked"
                    soak.possible_orphans += 1
                    sess.fate_detail = f"a fault hit {target.name} during a move to it"
                    return
                sess.node, sess.id = target, r.peer_session_id
                sess.moved = True
                sess.moves += 1
            # Continue it there at once, under the id the peer gave it.
            if continue_session(soak, rng, sess, "Generate(after migrate)") == "OK" \
                    and not sess.tainted:
                verify_session(soak, sess)
        except grpc.RpcError as e:
            code = code_of(e)
            soak.record("MigrateSession", code, details_of(e))
            if code in ("DEADLINE_EXCEEDED", "CANCELLED", "UNAVAILABLE", "INTERNAL", "UNKNOWN"):
                # The move may still complete on the server's side.
                sess.ambiguous_migrate_to = target
                # With --persist a source killed after the target installed
                # the session settles the move when it restarts: the session
                # is then on the target, which is no fault of the server's.
                sess.migrate_cut_by_kill = src.incarnation != src_inc or src.state == "down"
    finally:
        soak.checkin(sess)


def act_stall(soak, rng):
    """Exports a kept session, then streams all of it but its last 40 bytes
    to a node's ImportSession and stops sending until the call's deadline."""
    sess = soak.checkout()
    if sess is None:
        return
    try:
        chunks = []
        try:
            # Version 3 carries no session id, so the import is a new session
            # (version 4 names the live one: refused ALREADY_EXISTS at its
            # first section, before the stall this probes).
            request = pb2.ExportSessionRequest(session_id=sess.id, version=3)
            for c in sess.node.stub.ExportSession(request, timeout=ARGS.rpc_timeout,
                                                  metadata=metadata()):
                chunks.append(c.data)
            soak.record("ExportSession", "OK")
        except grpc.RpcError as e:
            soak.record("ExportSession", code_of(e), details_of(e))
            return
    finally:
        soak.checkin(sess)
    data = b"".join(chunks)
    if len(data) <= 40:
        return
    nodes = soak.reachable_nodes()
    if not nodes:
        return
    node = rng.choice(nodes)
    stall = rng.uniform(*ARGS.stall_seconds)
    release = threading.Event()
    body = data[:-40]

    def stream():
        for i in range(0, len(body), 1 << 20):
            yield pb2.WireChunk(data=body[i:i + (1 << 20)])
        release.wait(stall + 2)  # stalled: the call's deadline ends it

    try:
        node.stub.ImportSession(stream(), timeout=stall, metadata=metadata())
        # A truncated stream must never install a session.
        soak.record("ImportSession(stalled)", "OK", "a truncated stream was installed",
                    expected=set())
    except grpc.RpcError as e:
        soak.record("ImportSession(stalled)", code_of(e), details_of(e))
    finally:
        release.set()


def garbage_bytes(rng):
    """Bytes that no protobuf parser accepts: a field with wire type 6 or 7,
    a length-delimited field longer than the message, or a varint that never
    ends."""
    kind = rng.randrange(3)
    noise = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if kind == 0:
        return bytes([(rng.randint(1, 15) << 3) | rng.choice((6, 7))]) + noise
    if kind == 1:
        return b"\x0a\xf0\xff\xff\x0f" + noise[:16]
    return b"\x08" + b"\xff" * 11


def act_garbage(soak, rng):
    nodes = soak.reachable_nodes()
    if not nodes:
        return
    node = rng.choice(nodes)
    name, shape = rng.choice(GARBAGE_RPCS)
    path = f"/cortiq.v1.Inference/{name}"
    raw = garbage_bytes(rng)
    ident = lambda b: b  # noqa: E731 - raw bytes in and out
    rpc = f"garbage:{name}"
    expected = GARBAGE_IMPORT_CODES if name == "ImportSession" else GARBAGE_CODES
    try:
        if shape == "unary_unary":
            node.channel.unary_unary(path, request_serializer=ident, response_deserializer=ident)(
                raw, timeout=ARGS.rpc_timeout, metadata=metadata())
        elif shape == "unary_stream":
            list(node.channel.unary_stream(path, request_serializer=ident,
                                           response_deserializer=ident)(
                raw, timeout=ARGS.rpc_timeout, metadata=metadata()))
        else:
            node.channel.stream_unary(path, request_serializer=ident, response_deserializer=ident)(
                iter([raw]), timeout=ARGS.rpc_timeout, metadata=metadata())
        soak.record(rpc, "OK", expected=expected)
    except grpc.RpcError as e:
        soak.record(rpc, code_of(e), details_of(e), expected=expected)


def http_chat(node, body, session, drop_after=None):
    """POST /v1/chat/completions to `node` with x-cortiq-session `session`.
    Returns (status, headers, content, usage) where content is the reply's
    text (SSE deltas joined for a stream) and usage the answer's usage (None
    for a stream); status "dropped" when the client closed the stream after
    `drop_after` events, "conn: ..." when the connection failed."""
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=ARGS.rpc_timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {ARGS.token}",
                              "x-cortiq-session": session})
        r = conn.getresponse()
        headers = {k.lower(): v for k, v in r.getheaders()}
        if r.status != 200 or not body.get("stream"):
            data = r.read()
            if r.status != 200:
                return r.status, headers, data.decode(errors="replace")[:300], None
            answer = json.loads(data)
            return 200, headers, answer["choices"][0]["message"].get("content") or "", \
                answer.get("usage")
        text, events = [], 0
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return 200, headers, "".join(text), None
            events += 1
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            text.append(delta.get("content") or "")
            if drop_after is not None and events >= drop_after:
                return "dropped", headers, "".join(text), None
        return "conn: stream ended without [DONE]", headers, "".join(text), None
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return f"conn: {type(e).__name__}", {}, str(e)[:200], None
    finally:
        conn.close()


def act_chat(soak, rng):
    """One turn of a conversation on the HTTP front, to any reachable node;
    the client resends the whole chat, as chat clients do."""
    chat = soak.checkout_chat()
    if chat is None:
        return
    try:
        nodes = soak.reachable_nodes()
        if not nodes:
            return
        node = rng.choice(nodes)
        if len(chat.messages) >= 16:
            chat.messages = chat.messages[:2]  # an edited chat: the session rolls back
        words = ["the", "whale", "sea", "ship", "and", "a", "captain", "of", "white", "light"]
        user = " ".join(rng.choice(words) for _ in range(rng.randint(2, 10)))
        stream = rng.random() < 0.5
        body = {"model": soak.model_name, "max_tokens": rng.randint(4, 16), "temperature": 0,
                "stream": stream, "messages": chat.messages + [{"role": "user", "content": user}]}
        drop = rng.randint(1, 3) if stream and rng.random() < 0.25 else None
        status, headers, content, usage = http_chat(node, body, chat.name, drop)
        sid = headers.get("x-cortiq-session-id")
        if sid:
            with soak.lock:
                chat.ids.add(sid)
        if status == "dropped" or str(status).startswith("conn: "):
            soak.count("chat", "client dropped the stream" if status == "dropped"
                       else f"connection failed ({status[6:]})")
            return
        soak.record("chat", str(status), content if status != 200 else "",
                    expected={str(c) for c in CHAT_STATUSES})
        if status != 200:
            return
        if "x-cortiq-forwarded-by" in headers:
            soak.count("chat", "of those, relayed to the conversation's node")
        if usage is not None:
            cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            if cached:
                soak.count("chat", "of those, the history reused from the session")
            if cached > usage.get("prompt_tokens", 0):
                soak.fail(f"chat {chat.name}: {cached} cached tokens of a "
                          f"{usage.get('prompt_tokens')}-token prompt")
        chat.messages = body["messages"] + [{"role": "assistant", "content": content}]
    finally:
        soak.checkin_chat(chat)


ACTION_FNS = {"oneshot": act_oneshot, "open": act_open, "continue": act_continue,
              "cancel": act_cancel, "release": act_release, "migrate": act_migrate,
              "stall": act_stall, "garbage": act_garbage, "chat": act_chat}


# ---------------------------------------------------------------------------
# Verification and orphans


def replay_reference(soak, ref, sess):
    """The solo reference of a session: its calls (same prompts and
    max_tokens, greedy) replayed on a fresh kept session of node `ref`, of the
    same mode, which is released afterwards. Returns each call's tokens, or
    None if a replay call failed (a fault)."""
    out, ref_id = [], ""
    try:
        for prompt, n, _ in sess.calls:
            req = pb2.GenerateRequest(prompt_tokens=prompt, max_tokens=n, sampling=greedy(),
                                      ignore_eos=True, keep_session=True, session_id=ref_id)
            if not ref_id:
                req.session_config.CopyFrom(session_config(sess.mode))
            code, tokens, summary, _ = generate(soak, ref, "Generate(reference)", req)
            if code != "OK":
                if not ref_id:
                    soak.note_possible_orphan()
                return None
            ref_id = summary.session_id
            with soak.lock:
                soak.reference_ids.add(ref_id)
            out.append(tokens)
        return out
    finally:
        if ref_id:
            with soak.lock:
                soak.reference_ids.discard(ref_id)
            try:
                ref.stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=ref_id),
                                        timeout=ARGS.rpc_timeout, metadata=metadata())
            except grpc.RpcError:
                soak.note_possible_orphan()


def oneshot_reference(soak, ref, sess):
    """The solo reference of a session's last call only: one one-shot greedy
    Generate whose prompt is the whole history before that call's tokens.
    Prefill and decode agree to ~1e-6, not bit for bit (docs/ARCHITECTURE.md),
    so a near-tie may flip a token here without any fault. Exact attention
    only (f32 or int8 rows): a bounded mode's state depends on where its
    prompts ended (None: skipped)."""
    if sess.mode not in ("exact", "int8"):
        return None
    calls = sess.calls
    history = [t for p, _, g in calls[:-1] for t in p + g] + list(calls[-1][0])
    req = pb2.GenerateRequest(prompt_tokens=history, max_tokens=calls[-1][1], sampling=greedy(),
                              ignore_eos=True, session_config=session_config(sess.mode))
    code, tokens, _, _ = generate(soak, ref, "Generate(reference)", req)
    if code != "OK":
        return None
    return [None] * (len(calls) - 1) + [tokens]


REFERENCES = {"replay": replay_reference, "oneshot": oneshot_reference}


def verify_session(soak, sess, final=False):
    """Compares a session's greedy calls with their solo reference
    (--reference) computed on another healthy node: a moved or long-lived
    session must continue exactly as a fresh one does. A session that differs
    is reported once (then tainted)."""
    refs = soak.healthy_nodes(exclude=sess.node) or soak.healthy_nodes()
    if not refs or not sess.calls:
        with soak.lock:
            soak.verify["skipped"] += 1
        return
    ref = refs[0]
    expected = REFERENCES[ARGS.reference](soak, ref, sess)
    if expected is None:
        with soak.lock:
            soak.verify["skipped"] += 1
        return
    for i, ((_, _, got), want) in enumerate(zip(sess.calls, expected)):
        if want is None or want == got:
            continue
        k = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b),
                 min(len(want), len(got)))
        mism = {"session": sess.id, "mode": sess.mode, "node": sess.node.name,
                "moves": sess.moves, "kills": sess.kills,
                "call": i, "calls": len(sess.calls), "first_diff": k,
                "session_tokens": got[:k + 4], "reference_tokens": want[:k + 4],
                "reference_node": ref.name, "final_audit": final}
        with soak.lock:
            soak.verify["checked"] += 1
            soak.verify["mismatches"].append(mism)
            sess.tainted = True
        soak.fail(f"session {sess.id} ({sess.mode}): call {i} differs from its reference "
                  f"at token {k}")
        return
    with soak.lock:
        soak.verify["checked"] += 1
        soak.verify["matched"] += 1
        sess.verified_after_kill |= sess.kills > 0
        soak.verified_modes[sess.mode] = soak.verified_modes.get(sess.mode, 0) + 1
    sess.moved = False


def list_sessions(soak, node, rpc):
    """The node's own sessions (ListSessionsResponse), or None if the call
    failed; the outcome is recorded under `rpc`."""
    try:
        listed = node.stub.ListSessions(pb2.ListSessionsRequest(), timeout=ARGS.rpc_timeout,
                                        metadata=metadata())
        soak.record(rpc, "OK")
        return listed
    except grpc.RpcError as e:
        soak.record(rpc, code_of(e), details_of(e))
        return None


def adopt_orphan(soak, sess):
    """After a MigrateSession that ended in an error, the move may still have
    completed on the servers' side: the session then lives on the target under
    an id nobody was told. Looks for a session there that the soak neither
    tracks nor uses as a reference, holding at least the session's tokens, and
    follows it. Returns True if found."""
    target = sess.ambiguous_migrate_to
    listed = list_sessions(soak, target, "ListSessions")
    if listed is None:
        return False
    with soak.lock:
        tracked = {s.id for s in soak.sessions.values() if s.node is target}
        tracked |= soak.reference_ids
    for info in listed.sessions:
        if info.session_id not in tracked and info.tokens >= sess.tokens():
            with soak.lock:
                sess.node, sess.id = target, info.session_id
                sess.tainted = True  # its last call may or may not be in it
                sess.ambiguous_migrate_to = None
                soak.orphans_adopted += 1
            known = "migrate-after-deadline" in ARGS.known_issues
            if sess.migrate_cut_by_kill:
                with soak.lock:
                    soak.moves_cut_by_kill += 1
                    soak.orphans_adopted -= 1
            elif known:
                soak.note_known("migrate-after-deadline")
            else:
                soak.fail(f"session {sess.id}: a MigrateSession that failed for its caller "
                          f"moved it to {target.name} anyway")
            return True
    return False


# ---------------------------------------------------------------------------
# Faults


def follow_drain(node):
    """Where a drain moved each session of `node`: {id: (peer address, id)} and
    {id: error} from the node's drain log lines. A migrated session keeps its
    id (wire version 4); the peer it went to is in the log."""
    text = node.read_log()
    moved = {m.group(1): (m.group(2), m.group(1)) for m in DRAIN_MOVED_RE.finditer(text)}
    failed = {m.group(1): m.group(2) for m in DRAIN_FAILED_RE.finditer(text)}
    return moved, failed


def fault_stop(soak, node, rng):
    secs = rng.uniform(*ARGS.stop_seconds)
    soak.set_state(node, "stopped")
    os.kill(node.proc.pid, signal.SIGSTOP)
    time.sleep(secs)
    os.kill(node.proc.pid, signal.SIGCONT)
    soak.set_state(node, "up")
    return f"stopped {secs:.1f} s"


def fault_kill(soak, node, rng):
    count_persist(soak, node)  # the counts up to a moment before the kill
    soak.set_state(node, "down")
    node.proc.kill()
    node.proc.wait()
    with soak.lock:
        n = 0
        for s in soak.sessions.values():
            if s.node is node and s.fate == "live":
                n += 1
                if ARGS.persist:
                    # Restored by the restart: verified again at its next call.
                    s.kills += 1
                    s.moved = True
                else:
                    s.fate, s.fate_detail = "killed", f"{node.name} killed with -9"
    time.sleep(rng.uniform(0.5, 2.0))
    node.start()
    if not ARGS.persist:
        soak.set_state(node, "up")
        return f"kill -9 ({n} kept sessions with it), restarted"
    # Before the node takes calls from the workers: every session the soak
    # knows there must be back, a clean one at exactly its last call.
    missing = check_restored(soak, node)
    soak.set_state(node, "up")
    return f"kill -9, restarted: {n} kept sessions on it, {missing} not restored"


PERSIST_COUNTERS = {"cortiq_session_spills_total": "spills",
                    "cortiq_session_unspills_total": "read-backs",
                    "cortiq_persist_failures_total": "failed writes", "cortiq_persist_records_total": "records"}


def count_persist(soak, node):
    """Adds the node's spill and read-back counters to the soak's totals
    (before the node restarts and they start again from 0)."""
    if not ARGS.persist:
        return
    for name, v in node.metrics(set(PERSIST_COUNTERS)).items():
        key = PERSIST_COUNTERS[name]
        with soak.lock:
            soak.persist_counts[key] = soak.persist_counts.get(key, 0) + int(v)


def check_restored(soak, node):
    """After a kill -9 and restart with --persist: lists the node's sessions
    and checks each tracked one (not held by a worker, whose call may still
    change it) is there, holding the tokens the soak saw completed. A session
    whose Migrate away was cut by the kill may be on its target instead (the
    restart settles that move later): not judged here. Returns the number
    missing."""
    listed = list_sessions(soak, node, "ListSessions(restored)")
    if listed is None:
        soak.fail(f"{node.name}: ListSessions after its restart failed")
        return 0
    have = {i.session_id: i for i in listed.sessions}
    m = node.metrics({"cortiq_restore_sessions", "cortiq_restore_quarantined_files"})
    with soak.lock:
        soak.persist_counts["restored"] = (soak.persist_counts.get("restored", 0)
                                           + int(m.get("cortiq_restore_sessions", 0)))
    if m.get("cortiq_restore_quarantined_files", 0):
        # A kill -9 may tear a file's last record (dropped), never corrupt one.
        soak.fail(f"{node.name}: its restart quarantined "
                  f"{int(m['cortiq_restore_quarantined_files'])} session file(s)")
    missing = 0
    with soak.lock:
        mine = [s for s in soak.sessions.values()
                if s.node is node and s.fate == "live" and s not in soak.held]
    for s in mine:
        info = have.get(s.id)
        if info is None:
            if s.ambiguous_migrate_to is not None:
                continue
            if s.maybe_released:  # a ReleaseSession the kill crossed
                with soak.lock:
                    s.fate, s.fate_detail = "released", "by a ReleaseSession the kill crossed"
                    soak.late_releases += 1
                continue
            missing += 1
            with soak.lock:
                s.fate, s.fate_detail = "lost", f"not restored after {node.name}'s kill -9"
            soak.fail(f"session {s.id} on {node.name}: not restored after a kill -9")
        elif not s.tainted and info.tokens != s.tokens():
            soak.fail(f"session {s.id} on {node.name}: restored with {info.tokens} tokens, "
                      f"its last completed call left {s.tokens()}")
    return missing


def fault_drain(soak, node, rng):
    count_persist(soak, node)
    soak.set_state(node, "draining")
    node.proc.send_signal(signal.SIGTERM)
    t = now()
    try:
        rc = node.proc.wait(timeout=ARGS.drain_wait)
    except subprocess.TimeoutExpired:
        soak.fail(f"{node.name}: SIGTERM drain did not exit within {ARGS.drain_wait} s; "
                  f"killed\n{node.tail(10)}")
        node.proc.kill()
        rc = node.proc.wait()
    took = now() - t
    # Calls in flight on the node's sessions end now (it is gone); a worker's
    # MigrateSession may have taken a session away first.
    if not soak.wait_unheld(node, ARGS.rpc_timeout * 3):
        soak.fail(f"{node.name}: workers still hold its sessions after its drain")
    moved, failed = follow_drain(node)
    by_addr = {n.address: n for n in soak.nodes}
    followed = lost = stayed = 0
    with soak.lock:
        for s in soak.sessions.values():
            if s.node is not node or s.fate != "live":
                continue
            if s.id in moved and moved[s.id][0] in by_addr:
                s.node, s.id = by_addr[moved[s.id][0]], moved[s.id][1]
                s.moved = True
                s.moves += 1
                followed += 1
            elif ARGS.persist:
                # Its file stays in the node's state dir: the restart below
                # must bring it back (check_restored).
                s.moved = True
                stayed += 1
            else:
                s.fate = "lost"
                s.fate_detail = f"drain of {node.name}: " + failed.get(s.id, "not in the drain log")
                lost += 1
        node.state = "down"  # followed: a move that lands now is not
    if lost:
        soak.fail(f"{node.name}: drain lost {lost} kept session(s)")
    judge_drain_exit(soak, node, rc, failed, lost)
    node.start()
    missing = check_restored(soak, node) if ARGS.persist else 0
    soak.set_state(node, "up")
    if ARGS.persist:
        return (f"drain exited {rc} in {took:.1f} s, {followed} sessions followed, {stayed} "
                f"stayed on its disk, {missing} of them not restored; restarted")
    return (f"drain exited {rc} in {took:.1f} s, {followed} sessions followed, {lost} lost; "
            "restarted")


def judge_drain_exit(soak, node, rc, failed, lost):
    """0 is a clean drain. 3 means "a session could not move" (ARCHITECTURE.md):
    when every such session was busy and none was lost — a client's call in
    flight (e.g. its MigrateSession) held it and moved it — that is the known
    issue drain-busy-session; with --persist, the sessions it left keep their
    files and the restart must bring them back (check_restored judges that);
    anything else is a failure."""
    if rc == 0:
        return
    if rc == 3 and ARGS.persist:
        # Sessions no peer took keep their files; check_restored judges them.
        with soak.lock:
            soak.drains_left_sessions += 1
        return
    busy_only = rc == 3 and failed and all("session busy" in why for why in failed.values())
    if busy_only and not lost and "drain-busy-session" in ARGS.known_issues:
        soak.note_known("drain-busy-session")
        return
    soak.fail(f"{node.name}: drain exited with status {rc}\n{node.tail(10)}")


FAULT_FNS = {"stop": fault_stop, "kill": fault_kill, "drain": fault_drain}


def fault_loop(soak):
    rng = random.Random(ARGS.seed * 7919 + 1)
    end = soak.t0 + ARGS.duration
    while True:
        wait = rng.uniform(*ARGS.fault_interval)
        if soak.stop_event.wait(wait) or now() + 2 > end:
            return
        kind = rng.choice(ARGS.faults)
        nodes = soak.healthy_nodes()
        if not nodes:
            continue
        node = rng.choice(nodes)
        t = soak.elapsed()
        try:
            what = FAULT_FNS[kind](soak, node, rng)
        except Exception as e:  # noqa: BLE001 - a restart that fails is reported
            what = f"failed: {type(e).__name__}: {e}"
            soak.fail(f"fault {kind} on {node.name}: {what}")
        print(f"[{t:6.1f}s] fault {kind} {node.name}: {what}", flush=True)
        with soak.lock:
            soak.faults.append({"t": round(t, 1), "kind": kind, "node": node.name, "what": what})


def monitor_loop(soak):
    """Samples RSS of every node and notices a node that died by itself."""
    while not soak.stop_event.is_set():
        t = round(soak.elapsed(), 1)
        for node in soak.nodes:
            if node.state in ("up", "stopped") and node.proc.poll() is not None:
                rc = node.proc.returncode
                soak.set_state(node, "down")
                with soak.lock:
                    soak.crashes.append({"t": t, "node": node.name, "status": rc,
                                         "log_tail": node.tail(20)})
                    for s in soak.sessions.values():
                        if s.node is node and s.fate == "live":
                            s.fate, s.fate_detail = "lost", f"{node.name} crashed ({rc})"
                soak.fail(f"{node.name} died by itself with status {rc}\n{node.tail(20)}")
                try:
                    node.start()
                    soak.set_state(node, "up")
                except Exception as e:  # noqa: BLE001
                    soak.fail(f"{node.name}: restart after crash failed: {e}")
                continue
            if node.state in ("up", "stopped", "draining"):
                kib = node.rss_kib()
                if kib is not None:
                    with soak.lock:
                        soak.rss[node.name].append((t, node.incarnation, kib))
        soak.stop_event.wait(ARGS.rss_interval)


def worker_loop(soak, index):
    rng = random.Random(ARGS.seed * 1000003 + index)
    names = list(ACTIONS)
    weights = [ACTIONS[n] for n in names]
    end = soak.t0 + ARGS.duration
    while now() < end and not soak.stop_event.is_set():
        name = rng.choices(names, weights)[0]
        try:
            ACTION_FNS[name](soak, rng)
        except Exception:  # noqa: BLE001 - a soak bug is reported, the soak goes on
            tb = traceback.format_exc()
            with soak.lock:
                soak.tool_errors.append(f"{name}: {tb}")
            print(f"TOOL ERROR in {name}:\n{tb}", flush=True)


# ---------------------------------------------------------------------------
# Final audit and report


def get_session_settled(soak, sess):
    """GetSession, retried for a while on UNAVAILABLE: with --persist a
    session whose move a kill cut is in doubt until its node has asked the
    peers (the reaper's next tick)."""
    deadline = now() + 15
    while True:
        try:
            return sess.node.stub.GetSession(pb2.GetSessionRequest(session_id=sess.id),
                                             timeout=ARGS.rpc_timeout, metadata=metadata())
        except grpc.RpcError as e:
            if code_of(e) != "UNAVAILABLE" or not ARGS.persist or now() > deadline:
                raise
            time.sleep(0.5)


def check_duplicates(soak):
    """No tracked session, and no conversation's session of the HTTP front,
    may stay on two nodes at once (a session keeps its id when it moves). A
    conversation made on a node while a peer was silent may have a copy on
    that peer for a while: the node keeps asking and releases its own copy
    (backoff up to 30 s), so duplicates get 45 s to settle."""
    owned = {s.id for s in soak.sessions.values() if s.fate == "live"} | soak.chat_ids()
    deadline = now() + 45
    while True:
        where = {}
        for node in soak.healthy_nodes():
            listed = list_sessions(soak, node, "ListSessions(audit)")
            if listed is None:
                continue
            for info in listed.sessions:
                where.setdefault(info.session_id, []).append(node.name)
        if now() > deadline or not any(len(where.get(sid, [])) > 1 for sid in owned):
            break
        time.sleep(1)
    for sid in sorted(owned):
        nodes = where.get(sid, [])
        if len(nodes) > 1:
            with soak.lock:
                soak.duplicates.append((sid, nodes))
            soak.fail(f"session {sid} is on {len(nodes)} nodes: {', '.join(nodes)}")


def final_audit(soak):
    """Every session still live: it must exist where the soak thinks it is,
    and on no other node; clean ones get one more greedy call and are
    verified against a replay."""
    rng = random.Random(ARGS.seed + 17)
    for sess in list(soak.sessions.values()):
        if sess.fate != "live":
            continue
        try:
            info = get_session_settled(soak, sess)
            soak.record("GetSession(audit)", "OK")
            if not sess.tainted and info.tokens != sess.tokens():
                soak.fail(f"session {sess.id}: holds {info.tokens} tokens, the soak sent "
                          f"and received {sess.tokens()}")
        except grpc.RpcError as e:
            code = code_of(e)
            soak.record("GetSession(audit)", code, details_of(e))
            if code == "NOT_FOUND":
                check_gone(soak, sess, "not found by the final audit")
            else:
                soak.fail(f"session {sess.id}: audit GetSession {code}")
            continue
        if not sess.tainted:
            if continue_session(soak, rng, sess, "Generate(audit)") == "OK" and not sess.tainted:
                verify_session(soak, sess, final=True)
    check_duplicates(soak)
    for node in soak.healthy_nodes():
        count_persist(soak, node)


ACCOUNTING_GAUGES = ("cortiq_sessions_active", "cortiq_sessions_busy",
                     "cortiq_session_memory_total_bytes", "cortiq_memory_committed_bytes",
                     "cortiq_import_bytes_in_flight", "cortiq_session_files",
                     "cortiq_session_disk_bytes")


def account_and_release(soak):
    """The end, with no call in flight: on every running node the gauges
    match its sessions exactly (count, bytes; nothing busy, no import held);
    the sessions the soak does not track are at most the calls that could
    have left one; then every session is released and every gauge is back at
    0, and with --persist no session file is left in the node's state dir."""
    orphans = 0
    for node in soak.healthy_nodes():
        listed = list_sessions(soak, node, "ListSessions(accounting)")
        before = node.metrics(set(ACCOUNTING_GAUGES))
        if listed is None or not before:
            soak.fail(f"{node.name}: no session list or no /metrics for the accounting")
            continue
        sessions = list(listed.sessions)
        want = {"cortiq_sessions_active": len(sessions), "cortiq_sessions_busy": 0,
                "cortiq_session_memory_total_bytes": sum(i.memory.total_bytes for i in sessions),
                "cortiq_import_bytes_in_flight": 0}
        for name, v in want.items():
            if before.get(name) != v:
                soak.fail(f"{node.name}: {name} is {before.get(name)}, its sessions say {v}")
        with soak.lock:
            mine = {s.id for s in soak.sessions.values() if s.fate == "live" and s.node is node}
        mine |= soak.chat_ids()  # a conversation's session lives on any node
        orphans += sum(1 for i in sessions if i.session_id not in mine)
        for info in sessions:
            try:
                node.stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=info.session_id),
                                         timeout=ARGS.rpc_timeout, metadata=metadata())
                soak.record("ReleaseSession(accounting)", "OK")
            except grpc.RpcError as e:
                soak.record("ReleaseSession(accounting)", code_of(e), details_of(e))
        after = node.metrics(set(ACCOUNTING_GAUGES))
        for name in ACCOUNTING_GAUGES:
            if name in after and after[name] != 0:
                soak.fail(f"{node.name}: {name} is {after[name]} after every session's release")
        if ARGS.persist:
            left = sorted(p.name for p in (node.workdir / "state" / node.name).glob("*.cqsj"))
            if left:
                soak.fail(f"{node.name}: {len(left)} session file(s) left after every release: "
                          + ", ".join(left[:5]))
        with soak.lock:
            soak.accounting[node.name] = {
                "sessions": len(sessions), "untracked": sum(
                    1 for i in sessions if i.session_id not in mine),
                "memory_bytes": want["cortiq_session_memory_total_bytes"],
                "rss_mib_after_release": round((node.rss_kib() or 0) / 1024, 1)}
    with soak.lock:
        soak.accounting["untracked_total"] = orphans
        soak.accounting["possible_orphans"] = soak.possible_orphans
    if orphans > soak.possible_orphans:
        soak.fail(f"{orphans} session(s) on the nodes that the soak does not track, but only "
                  f"{soak.possible_orphans} call(s) could have left one")


def cpu_name():
    name, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name == "unknown":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    tier = ("amx" if "amx_bf16" in flags else "avx512bf16" if "avx512_bf16" in flags
            else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "scalar")
    return name, tier, os.cpu_count()


def build_report(soak, wall):
    sess = list(soak.sessions.values())
    fates = {}
    for s in sess:
        fates[s.fate] = fates.get(s.fate, 0) + 1
    rpcs = {}
    for (rpc, outcome), n in sorted(soak.outcomes.items()):
        rpcs.setdefault(rpc, {})[outcome] = n
    rss = {}
    for name, samples in soak.rss.items():
        kib = [k for _, _, k in samples]
        rss[name] = {"min_mib": round(min(kib) / 1024, 1) if kib else None,
                     "max_mib": round(max(kib) / 1024, 1) if kib else None,
                     "last_mib": round(kib[-1] / 1024, 1) if kib else None,
                     "incarnations": max((i for _, i, _ in samples), default=0),
                     "samples": [(t, i, round(k / 1024, 1)) for t, i, k in samples]}
    logs = {}
    for n in soak.nodes:
        levels = {}
        for path in sorted(n.workdir.glob(f"{n.name}.*.log")):
            for m in re.finditer(r"^\[[^]]*\] \[(warning|error|critical)\]",
                                 path.read_text(errors="replace"), re.M):
                levels[m.group(1)] = levels.get(m.group(1), 0) + 1
        logs[n.name] = levels
    cpu, tier, cores = cpu_name()
    # The kernels the server chose, from its start-up line ("kernels amx, ...").
    m = re.search(r"kernels (\w+)", soak.nodes[0].read_log())
    kernels = m.group(1) if m else "unknown"
    lost = [{"session": s.id, "node": s.node.name, "why": s.fate_detail}
            for s in sess if s.fate == "lost"]
    reasons = []
    if soak.crashes:
        reasons.append(f"{len(soak.crashes)} node crash(es)")
    if lost:
        reasons.append(f"{len(lost)} kept session(s) lost unexpectedly")
    if soak.duplicates:
        reasons.append(f"{len(soak.duplicates)} kept session(s) on two nodes")
    if soak.verify["mismatches"]:
        reasons.append(f"{len(soak.verify['mismatches'])} continuation(s) differ from reference")
    if soak.unexpected:
        reasons.append(f"{len(soak.unexpected)} unexpected gRPC code(s)")
    if soak.tool_errors:
        reasons.append(f"{len(soak.tool_errors)} soak tool error(s)")
    other = [f for f in soak.failures if "lost" not in f and "differs" not in f
             and "died by itself" not in f and " nodes: " not in f
             and "not restored after" not in f]
    if other:
        reasons.append(f"{len(other)} other failure(s)")
    total_requests = sum(soak.outcomes.values())
    return {
        "verdict": "FAIL" if reasons else "PASS",
        "reasons": reasons,
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "cpu": {"model": cpu, "isa_tier": os.environ.get("CORTIQ_ISA", tier), "cores": cores,
                "server_kernels": kernels},
        "duration_s": ARGS.duration, "wall_s": round(wall, 1), "seed": ARGS.seed,
        "concurrency": ARGS.concurrency, "threads_per_node": ARGS.threads,
        "memory_budget": ARGS.memory_budget, "model": str(ARGS.model),
        "persist": ARGS.persist, "spill_ttl_s": ARGS.spill_ttl if ARGS.persist else None,
        "known_issues_named": sorted(ARGS.known_issues), "reference": ARGS.reference,
        "requests_total": total_requests, "requests": rpcs,
        "ttft_s": {"n": len(soak.ttft), "p50": percentile(soak.ttft, 50),
                   "p99": percentile(soak.ttft, 99),
                   "server_p50": percentile(soak.ttft_server, 50),
                   "server_p99": percentile(soak.ttft_server, 99)},
        "rss": rss, "log_warnings_errors": logs,
        "faults": soak.faults, "crashes": soak.crashes,
        "sessions": {"created": len(sess), "fates": fates,
                     "killed_with_node": fates.get("killed", 0),
                     "lost_unexpected": lost, "tainted": sum(1 for s in sess if s.tainted),
                     "moves": sum(s.moves for s in sess),
                     "orphans_adopted": soak.orphans_adopted,
                     "through_kill": sum(1 for s in sess if s.kills),
                     "through_kill_verified": sum(1 for s in sess if s.verified_after_kill),
                     "moves_cut_by_kill": soak.moves_cut_by_kill,
                     "drains_that_kept_sessions": soak.drains_left_sessions,
                     "on_two_nodes": [{"session": i, "nodes": n} for i, n in soak.duplicates],
                     "released_by_failed_release": soak.late_releases},
        "verification": soak.verify, "persist_counts": soak.persist_counts,
        "modes": ARGS.modes, "accounting": soak.accounting,
        "sessions_by_mode": {m: sum(1 for s in sess if s.mode == m) for m in ARGS.modes},
        "verified_by_mode": soak.verified_modes,
        "unexpected_codes": soak.unexpected, "known_issues_seen": soak.known,
        "failures": soak.failures, "tool_errors": soak.tool_errors,
    }


def fmt_s(v):
    return "–" if v is None else f"{v * 1000:.1f} ms"


def markdown(rep):
    out = [f"### Soak: {rep['duration_s']:.0f} s, seed {rep['seed']} — {rep['verdict']}", ""]
    cpu = rep["cpu"]
    out += [f"* CPU: {cpu['model']} ({cpu['cores']} cores seen), ISA tier `{cpu['isa_tier']}` "
            f"(server kernels `{cpu['server_kernels']}`); "
            f"{rep['concurrency']} workers, `--threads {rep['threads_per_node']}` per node, "
            f"`--memory-budget {rep['memory_budget']}`, model `{Path(rep['model']).name}`"
            + (f", `--persist` (a state dir per node, `--session-ttl {rep['spill_ttl_s']:g}`)"
               if rep.get("persist") else ""),
            f"* Command: `{rep['command']}`",
            f"* Wall time {rep['wall_s']} s, {rep['requests_total']} requests; "
            f"known issues named: {', '.join(rep['known_issues_named']) or 'none'}"]
    if rep["reasons"]:
        out.append(f"* **Failures:** {'; '.join(rep['reasons'])}")
    t = rep["ttft_s"]
    out += [f"* Time to first token (client, {t['n']} clean streams): p50 {fmt_s(t['p50'])}, "
            f"p99 {fmt_s(t['p99'])} (server-side p50 {fmt_s(t['server_p50'])}, "
            f"p99 {fmt_s(t['server_p99'])})", ""]
    out += ["| RPC | outcomes (gRPC code: count) |", "|---|---|"]
    for rpc, oc in rep["requests"].items():
        out.append(f"| {rpc} | " + ", ".join(f"{k}: {v}" for k, v in oc.items()) + " |")
    s = rep["sessions"]
    v = rep["verification"]
    out += ["", "| kept sessions | count |", "|---|---|",
            f"| created | {s['created']} |"]
    for fate, n in sorted(s["fates"].items()):
        out.append(f"| {fate} at the end | {n} |")
    if rep.get("persist"):
        out += [f"| on a node killed -9 and restored from its state dir | {s['through_kill']} "
                f"({s['through_kill_verified']} verified after it) |",
                f"| moved by a MigrateSession whose source was killed before it answered "
                f"| {s['moves_cut_by_kill']} |",
                f"| drains that exited 3, the sessions no peer took kept on disk and restored "
                f"| {s['drains_that_kept_sessions']} |",
                f"| on two nodes at once (must be 0) | {len(s['on_two_nodes'])} |"]
    else:
        out.append(f"| lost with a node killed -9 (expected) | {s['killed_with_node']} |")
    out += [f"| lost otherwise (must be 0) | {len(s['lost_unexpected'])} |",
            f"| moves followed (MigrateSession + drains) | {s['moves']} |",
            f"| history unknown after a failed/cancelled call (not verified) | {s['tainted']} |",
            f"| found on a peer after a failed MigrateSession | {s['orphans_adopted']} |",
            f"| gone after a failed ReleaseSession (released late) "
            f"| {s['released_by_failed_release']} |",
            f"| greedy sessions checked against their solo reference "
            f"(`--reference {rep['reference']}`) | {v['checked']} "
            f"({v['matched']} equal, {len(v['mismatches'])} differ, {v['skipped']} skipped) |",
            "| by mode: made / continuations equal to their reference | "
            + ", ".join(f"{m} {rep['sessions_by_mode'].get(m, 0)} / "
                        f"{rep['verified_by_mode'].get(m, 0)}" for m in rep["modes"]) + " |",
            ]
    if rep.get("persist"):
        pc = rep["persist_counts"]
        out += ["", "With `--persist` (summed over the nodes' starts; the counts since a "
                "node's last scrape before a kill are not in them): "
                + ", ".join(f"{k} {pc.get(k, 0)}" for k in
                            ("records", "spills", "read-backs", "restored", "failed writes"))
                + "."]
    acc = rep.get("accounting", {})
    if acc:
        nodes = [(k, v) for k, v in acc.items() if isinstance(v, dict)]
        out += ["", "At the end (no call in flight) every node's gauges matched its sessions "
                "unless a failure above says otherwise; sessions left and not tracked by the "
                f"soak: {acc.get('untracked_total')} (calls that could have left one: "
                f"{acc.get('possible_orphans')}); after releasing every session: "
                + ", ".join(f"{k} RSS {v['rss_mib_after_release']} MiB" for k, v in nodes)
                + ", every session gauge 0."]
    out += ["", "| node | RSS min | RSS max | RSS last | starts |", "|---|---|---|---|---|"]
    for name, r in rep["rss"].items():
        out.append(f"| {name} | {r['min_mib']} MiB | {r['max_mib']} MiB | {r['last_mib']} MiB "
                   f"| {r['incarnations']} |")
    logs = ", ".join(f"{n}: " + (", ".join(f"{k} {v}" for k, v in lv.items()) or "none")
                     for n, lv in rep["log_warnings_errors"].items())
    out += ["", f"Server log lines at warning or above: {logs}."]
    out += ["", "RSS over time (MiB, the sample nearest each time; a restart starts low again):",
            ""]
    width = max((r["samples"][-1][0] for r in rep["rss"].values() if r["samples"]), default=0)
    marks = [round(width * k / 8) for k in range(9)]
    out += ["| node | " + " | ".join(f"{m} s" for m in marks) + " |",
            "|---|" + "---|" * len(marks)]
    for name, r in rep["rss"].items():
        row = []
        for m in marks:
            near = min(r["samples"], key=lambda x: abs(x[0] - m), default=None)
            row.append("–" if near is None else f"{near[2]:.0f}")
        out.append(f"| {name} | " + " | ".join(row) + " |")
    out += ["", "Faults:", ""]
    for f in rep["faults"]:
        out.append(f"* {f['t']} s: {f['kind']} {f['node']} — {f['what']}")
    if not rep["faults"]:
        out.append("* none")
    if rep["crashes"]:
        out += ["", "Crashes:", ""] + [f"* {c['t']} s: {c['node']} exited {c['status']}"
                                       for c in rep["crashes"]]
    if rep["unexpected_codes"]:
        out += ["", "Unexpected codes (first 10):", ""]
        out += [f"* {t} s {rpc}: {code} {d!r}" for t, rpc, code, d in rep["unexpected_codes"][:10]]
    if rep["known_issues_seen"]:
        out += ["", "Known issues seen:", ""]
        out += [f"* `{k}` ×{n}: {KNOWN_ISSUES[k]}" for k, n in rep["known_issues_seen"].items()]
    if rep["failures"]:
        out += ["", "Failures (first 10):", ""]
        out += ["* " + f.splitlines()[0] for f in rep["failures"][:10]]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-bin", required=True)
    p.add_argument("--tool-bin", help="cortiq-tool: with --mkmodel, makes the model")
    p.add_argument("--model", help="model directory (default: models/cortiq-byte-4m)")
    p.add_argument("--mkmodel", help="make this model with cortiq-tool mkmodel (e.g. tiny)")
    p.add_argument("--proto-py", required=True, help="generated Python stubs (build/proto/python)")
    p.add_argument("--workdir", required=True, help="logs and the made model go here")
    p.add_argument("--duration", type=float, default=60, help="workload seconds (default 60)")
    p.add_argument("--concurrency", type=int, default=4, help="workers (default 4)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="math threads per node (default 1)")
    p.add_argument("--memory-budget", default="256M", help="--memory-budget of each node")
    p.add_argument("--grace", type=float, default=2, help="--grace of each node (seconds)")
    p.add_argument("--token", default="soak-token", help="--auth-token and --peer-token")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra cortiq-server flag (repeat; e.g. --server-arg=--lease-wait=1)")
    p.add_argument("--rpc-timeout", type=float, default=20, help="client deadline per call (s)")
    p.add_argument("--faults", default="stop,kill,drain", help="fault kinds (comma list)")
    p.add_argument("--fault-interval", default="6,14", help="MIN,MAX seconds between faults")
    p.add_argument("--stop-seconds", default="2,5", help="MIN,MAX seconds a SIGSTOP lasts")
    p.add_argument("--stall-seconds", default="3,8", help="MIN,MAX seconds a stalled import waits")
    p.add_argument("--drain-wait", type=float, default=90,
                   help="a SIGTERM drain must exit within this many seconds")
    p.add_argument("--reference", choices=sorted(REFERENCES), default="replay",
                   help="solo reference: replay the session's calls on a fresh session "
                        "(default), or one one-shot Generate of the whole history")
    p.add_argument("--max-kept", type=int, default=16, help="kept sessions alive at once")
    p.add_argument("--max-history", type=int, default=600,
                   help="tokens after which a session is released")
    p.add_argument("--rss-interval", type=float, default=2, help="RSS sample period (s)")
    p.add_argument("--chats", type=int, default=4,
                   help="conversations the chat action keeps on the HTTP front")
    p.add_argument("--modes", default=",".join(MODES),
                   help="session modes kept sessions are opened in, one picked at random "
                        "each (comma list of " + ", ".join(MODES) + ")")
    p.add_argument("--persist", action="store_true",
                   help="a --state-dir per node (kept across its restarts; emptied at the "
                        "start), --persist-sync turn and --session-ttl --spill-ttl: kill -9 "
                        "must lose no kept session")
    p.add_argument("--spill-ttl", type=float, default=3,
                   help="with --persist: each node's --session-ttl (idle sessions spill)")
    p.add_argument("--known-issues", default="",
                   help="comma list of deviations reported apart instead of failing: "
                        + ", ".join(KNOWN_ISSUES))
    p.add_argument("--allow-code", default="", help="extra gRPC codes to accept (comma list)")
    p.add_argument("--report-json", help="write the report as JSON here")
    p.add_argument("--report-md", help="write the report as a markdown section here")
    a = p.parse_args()

    def pair(s, flag):
        lo, hi = (float(x) for x in s.split(","))
        if not 0 <= lo <= hi:
            p.error(f"{flag}: expected MIN,MAX with 0 <= MIN <= MAX, got {s!r}")
        return lo, hi

    a.fault_interval = pair(a.fault_interval, "--fault-interval")
    a.stop_seconds = pair(a.stop_seconds, "--stop-seconds")
    a.stall_seconds = pair(a.stall_seconds, "--stall-seconds")
    a.faults = [f for f in a.faults.split(",") if f]
    for f in a.faults:
        if f not in FAULT_FNS:
            p.error(f"--faults: unknown fault {f!r} (known: {', '.join(FAULT_FNS)})")
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r} (known: {', '.join(MODES)})")
    if not a.modes:
        p.error("--modes: at least one")
    a.known_issues = {k for k in a.known_issues.split(",") if k}
    for k in a.known_issues:
        if k not in KNOWN_ISSUES:
            p.error(f"--known-issues: unknown issue {k!r} (known: {', '.join(KNOWN_ISSUES)})")
    a.allow_code = {c for c in a.allow_code.split(",") if c}
    if a.concurrency < 1:
        p.error("--concurrency: must be at least 1")
    return a


def main():
    global ARGS, pb2, pb2_grpc, grpc
    ARGS = parse_args()
    sys.path.insert(0, ARGS.proto_py)
    import grpc as grpc_mod  # noqa: E402 - Debian's python3-grpcio
    from cortiq.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402
    grpc, pb2, pb2_grpc = grpc_mod, inference_pb2, inference_pb2_grpc

    workdir = Path(ARGS.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("node*.log"):
        old.unlink()
    shutil.rmtree(workdir / "state", ignore_errors=True)  # --persist: each soak starts empty
    if ARGS.mkmodel:
        if not ARGS.tool_bin:
            sys.exit("--mkmodel needs --tool-bin")
        ARGS.model = workdir / ARGS.mkmodel
        r = subprocess.run([ARGS.tool_bin, "mkmodel", ARGS.mkmodel, str(ARGS.model), "--seed", "1"],
                           capture_output=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"mkmodel failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    ARGS.model = Path(ARGS.model or REPO / "models" / "cortiq-byte-4m").resolve()

    # SIGTERM (e.g. a test runner's) exits through the `finally` that kills
    # the nodes, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = free_ports(9)
    ports = [(p[i], p[i + 3], p[i + 6]) for i in range(3)]
    addrs = [f"127.0.0.1:{p}" for p, _, _ in ports]
    nodes = [Node(f"node{i}", p, mp, hp, [a for j, a in enumerate(addrs) if j != i], workdir)
             for i, (p, mp, hp) in enumerate(ports)]
    rc = 1
    try:
        for n in nodes:
            n.start()
            print(f"{n.name} up on {n.address} (metrics {n.metrics_port}, pid {n.proc.pid})",
                  flush=True)
        info = nodes[0].stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=30,
                                          metadata=metadata())
        soak = Soak(nodes, info)
        req = urllib.request.Request(f"http://127.0.0.1:{nodes[0].http_port}/v1/models",
                                     headers={"Authorization": f"Bearer {ARGS.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            soak.model_name = json.load(r)["data"][0]["id"]
        threads = [threading.Thread(target=monitor_loop, args=(soak,), daemon=True)]
        faults = threading.Thread(target=fault_loop, args=(soak,), daemon=True)
        workers = [threading.Thread(target=worker_loop, args=(soak, i), daemon=True)
                   for i in range(ARGS.concurrency)]
        for t in threads + [faults] + workers:
            t.start()
        for t in workers:
            t.join()
        faults.join()  # a fault in progress finishes (and restarts its node)
        for n in nodes:
            if n.state == "stopped":
                os.kill(n.proc.pid, signal.SIGCONT)
                n.state = "up"
        print(f"[{soak.elapsed():6.1f}s] workload done; final audit", flush=True)
        final_audit(soak)
        account_and_release(soak)
        soak.stop_event.set()
        threads[0].join()
        rep = build_report(soak, soak.elapsed())
        rc = 0 if rep["verdict"] == "PASS" else 1
        if ARGS.report_json:
            Path(ARGS.report_json).write_text(json.dumps(rep, indent=1) + "\n")
        md = markdown(rep)
        if ARGS.report_md:
            Path(ARGS.report_md).write_text(md)
        print(md, flush=True)
        for e in rep["tool_errors"][:3]:
            print("tool error:", e, flush=True)
        for f in rep["failures"]:
            print("failure:", f, flush=True)
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                if n.state == "stopped":
                    os.kill(n.proc.pid, signal.SIGCONT)
                n.proc.kill()
                n.proc.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())
