#!/usr/bin/python3
"""Crash and corruption test of cortiq-server --state-dir with real processes
(run by CTest; Debian's python3-grpcio and python3-protobuf, /usr/bin/python3).

  1. kill -9 mid-generation, every mode: 8 kept sessions (exact, o1, qsa,
     window; f32 and int8 rows; two of them sampled with a seed) get two
     turns, then a third turn on all of them at once is cut by SIGKILL while
     the streams are in flight. A server restarted on the same directory has
     every session back at its last complete turn (or with the killed turn,
     when its record was written before the kill), and a continuation is
     token-identical to the same turns replayed on an uncrashed reference
     server (the seeded sessions' RNG carries over the restart).
  2. Corruption: a torn last record and a flipped byte in the last record
     drop that record (the session comes back at its previous turn); a
     flipped byte in an earlier record and a file cut to 10 bytes are
     quarantined (NOT_FOUND); every other session is unchanged. (2e) A
     flipped high bit in an earlier record's length field (it then points
     past the end of the file, as a torn append's does) is corruption too:
     complete records follow it. (2f) A file whose read crashes the server
     at start (failpoint restore-read, as a SIGBUS under its mapping would)
     twice in a row is quarantined unread by the third start: no crash loop.
  3. ReleaseSession deletes the session's file before it returns.
  4. Disk full: under RLIMIT_FSIZE (and, as root, on a small tmpfs) calls on
     kept sessions still succeed while cortiq_persist_failures_total counts
     the failed writes, and the server serves the next call.
  5. A move to a peer cut by SIGKILL of the source (failpoints): (a) after
     the peer's import, the restarted source settles by asking the peers and
     releases its copy; (b) before the send, it keeps the session; (c) while
     a peer is silent the session stays in doubt (UNAVAILABLE, moving_to,
     cortiq_sessions_in_doubt) and settles once it is dropped. Each time
     exactly one node serves it, continuing as an uncrashed reference.

  persist_crash_test.py --server-bin BIN --proto-py DIR --workdir DIR

The servers run the embedded model (no --model).

Prints one PASS/FAIL line per check; exits 1 if any check failed. Every
server started here is killed on the way out.
"""

import argparse
import os
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path

ARGS = None
pb2 = None
pb2_grpc = None
grpc = None

SERVERS = []  # every Popen started here; killed at exit
MOUNTS = []   # tmpfs mount points to unmount at exit
RESULTS = []  # (name, ok, detail)

LISTEN_RE = re.compile(r"^listening on (\S+):(\d+) metrics (\d+)\s*$", re.M)
RPC_TIMEOUT = 30  # seconds, per unary call / stream

# The session journal's framing (core/session/session_journal.{h,cc}).
JOURNAL_HEADER = 24
FRAME = 16 + 4  # u32 type, u32 reserved, u64 length; u32 CRC32C after the payload
SUFFIX = ".cqsj"


# ---------------------------------------------------------------------------
# Processes


class Server:
    """One cortiq-server process; stdout (the listening line and the logs) goes
    to a file so that a full pipe can never block it."""

    def __init__(self, name, extra=(), preexec_fn=None, env_extra=None):
        self.name = name
        self.log_path = Path(ARGS.workdir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        # No --model: the embedded model (cortiq-byte-4m, trained weights:
        # its greedy text depends on the whole context, unlike a random
        # tiny model's, which repeats one token whatever came before).
        cmd = [ARGS.server_bin, "--listen", "127.0.0.1:0",
               "--metrics-listen", "127.0.0.1:0", "--http-listen", "off", "--threads", "2",
               "--grace", "0", *extra]
        env = {k: v for k, v in os.environ.items()
               if k not in ("CORTIQ_AUTH_TOKEN", "CORTIQ_PEERS", "CORTIQ_MODEL",
                            "CORTIQ_FAILPOINTS")}
        env.update(env_extra or {})
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, preexec_fn=preexec_fn)
        SERVERS.append(self.proc)
        self.port = self.metrics_port = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = LISTEN_RE.search(self.log_path.read_text(errors="replace"))
            if m:
                self.port, self.metrics_port = int(m.group(2)), int(m.group(3))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name}: cortiq-server exited with {self.proc.returncode}:\n"
                                   + self.tail())
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{name}: no 'listening on' line within 30 s:\n" + self.tail())
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pb2_grpc.InferenceStub(self.channel)

    def tail(self, n=40):
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def log_text(self):
        return self.log_path.read_text(errors="replace")

    def metrics(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200, f"/metrics: HTTP {r.status}"
            return r.read().decode("utf-8")

    def metric(self, name):
        """The value of an unlabelled metric (None when absent)."""
        return parse_metric(self.metrics(), name).get(frozenset())

    def close_channel(self):
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001 - best effort
            pass

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.close_channel()

    def stop(self, timeout=20):
        """SIGTERM (no peers: kept sessions cannot migrate and stay on disk);
        returns the exit status."""
        self.close_channel()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"{self.name}: still running {timeout} s after SIGTERM") from None


def kill_all():
    for p in SERVERS:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    while MOUNTS:
        subprocess.run(["umount", "-l", MOUNTS.pop()], capture_output=True, timeout=30)


# ---------------------------------------------------------------------------
# Helpers


def check(name, fn):
    """Runs one check; records and prints PASS/FAIL."""
    t0 = time.monotonic()
    try:
        detail = fn()
        ok = True
    except Exception as e:  # noqa: BLE001 - a failed check is reported, the rest still run
        ok = False
        detail = f"{type(e).__name__}: {e}"
        if not isinstance(e, AssertionError):
            detail += "\n" + traceback.format_exc()
    dt = time.monotonic() - t0
    RESULTS.append((name, ok, detail))
    skipped = ok and isinstance(detail, str) and detail.startswith("SKIP")
    line = f"{'SKIP' if skipped else 'PASS' if ok else 'FAIL'} {name} ({dt:.2f} s)"
    if detail:
        line += f": {detail}"
    print(line, flush=True)
    return ok


def parse_metric(text, name):
    """{frozenset of (label, value): float value} of one metric name."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                          m.group(2) or ""))
            out[labels] = float(m.group(3))
    return out


def poll(fn, timeout, interval=0.02):
    """Calls fn() until it returns a truthy value or timeout passes; returns the
    last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def generate(stub, **req):
    """Runs one Generate call to the end; returns (token ids, summary)."""
    msgs = list(stub.Generate(pb2.GenerateRequest(**req), timeout=RPC_TIMEOUT))
    kinds = [m.WhichOneof("event") for m in msgs]
    assert kinds and kinds[-1] == "summary" and kinds.count("summary") == 1, (
        f"Generate: events {kinds[-3:]} ({len(kinds)} messages)")
    return [m.token.token_id for m in msgs[:-1]], msgs[-1].summary


def get_session(stub, sid):
    return stub.GetSession(pb2.GetSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)


def expect_not_found(stub, sid):
    try:
        get_session(stub, sid)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, f"GetSession({sid}): {e.code().name}"
        return
    raise AssertionError(f"GetSession({sid}) found a session that should be gone")


def export(stub, sid):
    """The session's state in the wire format (a copy; the session stays)."""
    data = b"".join(c.data for c in stub.ExportSession(pb2.ExportSessionRequest(session_id=sid),
                                                      timeout=RPC_TIMEOUT))
    assert len(data) > 100 and data[:4] == b"CQSW", f"export of {sid}: {len(data)} bytes"
    return data


def without_capacity(wire):
    """A session export with each layer blob's capacity (the positions its
    exporter had reserved: an allocation hint, not state) and the blob's CRC
    zeroed, so that two exports of the same state compare equal however
    their rows were reserved (docs/WIRE_FORMAT.md, CQKV)."""
    out, pos, blobs = bytearray(wire), 0, 0
    while True:
        pos = wire.find(b"CQKV", pos)
        if pos < 0:
            break
        (body,) = struct.unpack_from("<Q", wire, pos + 36)
        end = pos + 48 + body
        assert end <= len(wire), f"a CQKV blob at {pos} runs past the export"
        out[pos + 28:pos + 36] = bytes(8)
        out[end - 4:end] = bytes(4)
        blobs += 1
        pos = end
    assert blobs > 0, "no CQKV blob in the export"
    return bytes(out)


def records(data):
    """[(offset, payload length)] of the complete records of a journal file."""
    out, pos = [], JOURNAL_HEADER
    assert data[:4] == b"CQSJ", f"magic {data[:4]!r}"
    while pos + FRAME <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos + 8)
        if pos + FRAME + length > len(data):
            break
        out.append((pos, length))
        pos += FRAME + length
    assert pos == len(data), f"{len(data) - pos} bytes after the last complete record"
    return out


def session_files(d):
    return sorted(p for p in Path(d).iterdir() if p.is_file() and p.name.endswith(SUFFIX))


# ---------------------------------------------------------------------------
# Sessions: one per mode


PROMPTS = ["The quick brown fox jumps over the lazy dog. ",
           "Once upon a time, in a land far away, ",
           "Session persistence survives a crash; ",
           "Sink and window attention, sampled. "]
T1, T2, T3_SMALL, T3_BIG, TC = 20, 14, 6, 1500, 24  # max_tokens per turn
CONT_PROMPT = " And"
KILL_AFTER = 6  # tokens every in-flight stream has sent before the kill


def modes():
    """[(name, SessionConfig kwargs, seeded)] covering every attention mode."""
    o1 = lambda: pb2.O1Params(layers="all", m=8, window=16, sink=2)  # noqa: E731
    qsa = lambda: pb2.QsaParams(layers="all", ratio=16, budget=4)  # noqa: E731
    F32, I8 = pb2.KV_DTYPE_F32, pb2.KV_DTYPE_INT8
    return [
        ("exact-f32", dict(kv_dtype=F32, attention=pb2.ATTENTION_MODE_EXACT), False),
        ("exact-int8", dict(kv_dtype=I8, attention=pb2.ATTENTION_MODE_EXACT), False),
        ("o1-f32", dict(kv_dtype=F32, attention=pb2.ATTENTION_MODE_O1, o1=o1()), False),
        ("o1-int8-seeded", dict(kv_dtype=I8, attention=pb2.ATTENTION_MODE_O1, o1=o1()), True),
        ("qsa-f32", dict(kv_dtype=F32, attention=pb2.ATTENTION_MODE_QSA, qsa=qsa()), False),
        ("qsa-int8", dict(kv_dtype=I8, attention=pb2.ATTENTION_MODE_QSA, qsa=qsa()), False),
        ("window-f32", dict(kv_dtype=F32, attention=pb2.ATTENTION_MODE_WINDOW,
                            window=pb2.WindowParams(layers="all", sink=2, window=8)), False),
        ("window-f32-seeded", dict(kv_dtype=F32, attention=pb2.ATTENTION_MODE_WINDOW,
                                   window=pb2.WindowParams(layers="1", sink=1, window=12)), True),
    ]


class Sess:
    """One session of check 1 and the requests of its turns, replayable."""

    def __init__(self, i, name, cfg, seeded):
        self.i, self.name, self.cfg, self.seeded = i, name, cfg, seeded
        self.sid = None
        self.turns = []     # the GenerateRequest kwargs of the completed turns, in order
        self.outputs = []   # their token ids on the first server
        self.counts = []    # session tokens after each completed turn
        # Turn 3: two sessions ask for a few tokens (they finish before the
        # kill: the restored session must hold their turn), the rest for
        # many (cut by the kill).
        self.t3_max = T3_SMALL if i in (0, 5) else T3_BIG

    def sampling(self, first):
        if not self.seeded:
            return pb2.SamplingParams(temperature=0.0)
        if first:
            return pb2.SamplingParams(temperature=0.9, top_k=40, seed=1000 + self.i)
        return pb2.SamplingParams(temperature=0.9, top_k=40)  # the RNG carries over

    def request(self, turn, max_tokens):
        req = dict(prompt=PROMPTS[(self.i + turn) % len(PROMPTS)] + f"[{self.name} {turn}]",
                   max_tokens=max_tokens, ignore_eos=True, sampling=self.sampling(turn == 0))
        if turn == 0:
            req.update(keep_session=True, session_config=pb2.SessionConfig(**self.cfg))
        return req

    def continuation(self):
        # Greedy, or the seeded session's sampling with no new seed (its RNG
        # carries over). A short prompt (fewer positions than the smallest
        # window): the continuation attends to the restored rows of every
        # layer, window and O(1) ones included.
        return dict(prompt=CONT_PROMPT, max_tokens=TC, ignore_eos=True,
                    sampling=self.sampling(False))


def run_turn(stub, s, req):
    r = dict(req)
    if s.sid is not None:
        r["session_id"] = s.sid
    ids, summary = generate(stub, **r)
    assert summary.finish_reason == pb2.FINISH_REASON_LENGTH and len(ids) == req["max_tokens"], (
        f"{s.name}: {len(ids)} tokens of {req['max_tokens']}, finish {summary.finish_reason}")
    assert summary.session_kept, f"{s.name}: session not kept"
    return ids, summary


def replay(stub, s, reqs):
    """Replays `reqs` on `stub` in a new session under the same id and
    configuration (create_if_missing); returns [token ids per turn]."""
    outs = []
    for turn, req in enumerate(reqs):
        r = dict(req, session_id=s.sid)
        if turn == 0:
            r["create_if_missing"] = True
        ids, summary = generate(stub, **r)
        assert len(ids) == req["max_tokens"] and summary.session_id == s.sid, (
            f"{s.name}: replay of turn {turn}: {len(ids)} tokens, {summary.session_id}")
        outs.append(ids)
    return outs


# ---------------------------------------------------------------------------
# Checks


def run_checks():
    work = Path(ARGS.workdir)
    state = work / "state"
    sessions = [Sess(i, n, c, sd) for i, (n, c, sd) in enumerate(modes())]
    ctx = {}
    prev_state = {}  # sid -> export (capacity masked) of the restored session

    # ---- 1. kill -9 mid-generation ------------------------------------------------------
    def kill9_every_mode():
        a = Server("crash-a", ["--state-dir", str(state)])
        for s in sessions:
            for turn, n in ((0, T1), (1, T2)):
                req = s.request(turn, n)
                ids, summary = run_turn(a.stub, s, req)
                s.sid = summary.session_id
                s.turns.append(req)
                s.outputs.append(ids)
                s.counts.append(summary.usage.session_tokens)
            info = get_session(a.stub, s.sid)
            assert info.tokens == s.counts[-1], f"{s.name}: GetSession {info.tokens}, {s.counts}"
            if s.seeded:  # the sampling is random: another seed gives other tokens
                other = dict(s.request(0, T1), keep_session=False,
                             sampling=pb2.SamplingParams(temperature=0.9, top_k=40, seed=1))
                assert generate(a.stub, **other)[0] != s.outputs[0], f"{s.name}: seed ignored"
            assert (state / (s.sid + SUFFIX)).is_file(), f"{s.name}: no session file"
        files = session_files(state)
        assert len(files) == len(sessions) == a.metric("cortiq_session_files"), (
            f"{len(files)} files, cortiq_session_files {a.metric('cortiq_session_files')}")
        assert a.metric("cortiq_session_disk_bytes") == sum(p.stat().st_size for p in files)
        # One record per call on a kept session (the one-shot calls: none).
        assert a.metric("cortiq_persist_records_total") == 2 * len(sessions), a.metrics()
        assert a.metric("cortiq_persist_bytes_total") >= sum(p.stat().st_size for p in files)
        assert a.metric("cortiq_persist_failures_total") == 0

        # Turn 3 on all 8 at once; kill -9 while they stream.
        got = {s.sid: [] for s in sessions}
        ended = {}  # sid -> summary, or the error that ended the stream
        kill_now = threading.Event()

        def stream(s):
            req = dict(s.request(2, s.t3_max), session_id=s.sid)
            try:
                for m in a.stub.Generate(pb2.GenerateRequest(**req), timeout=RPC_TIMEOUT):
                    if m.WhichOneof("event") == "summary":
                        ended[s.sid] = m.summary
                    else:
                        got[s.sid].append(m.token.token_id)
                        # Odd sessions stop reading once they have enough
                        # tokens (the job pauses on its full queue); even
                        # ones keep reading (the job keeps decoding).
                        if (s.i % 2 and s.t3_max == T3_BIG
                                and len(got[s.sid]) == KILL_AFTER):
                            kill_now.wait(RPC_TIMEOUT)
            except grpc.RpcError as e:
                ended.setdefault(s.sid, e.code())

        threads = [threading.Thread(target=stream, args=(s,), daemon=True) for s in sessions]
        for t in threads:
            t.start()
        small = [s for s in sessions if s.t3_max == T3_SMALL]
        big = [s for s in sessions if s.t3_max == T3_BIG]
        try:
            ready = poll(lambda: all(s.sid in ended for s in small)
                         and all(len(got[s.sid]) >= KILL_AFTER for s in big), 20)
            assert ready, (f"turn 3 did not start: {[len(got[s.sid]) for s in sessions]} "
                           f"tokens, ended {list(ended.values())}")
            in_flight = [s.name for s in big if s.sid not in ended]
            a.kill9()
        finally:
            kill_now.set()
        for t in threads:
            t.join(timeout=RPC_TIMEOUT)
        stalled = [s.name for s in big if s.i % 2]
        assert stalled, "no stalled stream"
        assert set(stalled) <= set(in_flight), f"in flight at the kill: {in_flight}"
        for s in small:
            assert isinstance(ended[s.sid], pb2.GenerateSummary), f"{s.name}: {ended[s.sid]}"

        # Restart on the same directory.
        b = Server("crash-b", ["--state-dir", str(state)])
        ctx["b"] = b
        assert b.metric("cortiq_restore_sessions") == len(sessions), b.metrics()
        assert b.metric("cortiq_restore_quarantined_files") == 0
        ref = Server("reference")
        notes = []
        compared = 0
        for s in sessions:
            info = get_session(b.stub, s.sid)
            req3 = s.request(2, s.t3_max)
            p3 = len(b.stub.Tokenize(pb2.TokenizeRequest(text=req3["prompt"]),
                                     timeout=RPC_TIMEOUT).token_ids)
            with3 = s.counts[-1] + p3 + s.t3_max
            assert info.tokens in (s.counts[-1], with3), (
                f"{s.name}: restored with {info.tokens} tokens; after turn 2 {s.counts[-1]}, "
                f"with the killed turn {with3}")
            finished = isinstance(ended.get(s.sid), pb2.GenerateSummary)
            if finished:
                assert info.tokens == with3, (
                    f"{s.name}: its turn 3 ended with a summary (written before it was sent), "
                    f"but the session came back with {info.tokens} tokens, not {with3}")
            has3 = info.tokens == with3
            if has3:
                s.turns.append(req3)
                s.counts.append(with3)
            notes.append(f"{s.name}:{'t3' if has3 else 't2'}")
            # The reference: the same turns on an uncrashed server.
            ref_outs = replay(ref.stub, s, s.turns)
            assert ref_outs[:2] == s.outputs[:2], f"{s.name}: the reference's turns 1-2 differ"
            if has3 and finished:
                assert ref_outs[2] == got[s.sid], f"{s.name}: the reference's turn 3 differs"
            rinfo = get_session(ref.stub, s.sid)
            assert rinfo.tokens == info.tokens, f"{s.name}: ref {rinfo.tokens}, {info.tokens}"
            assert rinfo.config == info.config, f"{s.name}: config {info.config} vs {rinfo.config}"
            assert rinfo.cached_tokens == info.cached_tokens, (
                f"{s.name}: cached_tokens {info.cached_tokens}, reference {rinfo.cached_tokens}")
            # The whole state (rows, indexer keys, O(1) and window states,
            # sampler, history) as the wire format writes it.
            restored = without_capacity(export(b.stub, s.sid))
            assert restored == without_capacity(export(ref.stub, s.sid)), (
                f"{s.name}: the restored state differs from the reference")
            prev_state[s.sid] = restored  # check 2 brings it back by dropping a record
            cont = s.continuation()
            mine, summary = generate(b.stub, session_id=s.sid, **cont)
            theirs, _ = generate(ref.stub, session_id=s.sid, **cont)
            assert len(mine) == TC and len(theirs) == TC, f"{s.name}: {len(mine)}, {len(theirs)}"
            assert mine == theirs, (f"{s.name}: continuation after the restart {mine} "
                                    f"!= reference {theirs}")
            s.turns.append(cont)
            s.counts.append(summary.usage.session_tokens)
            compared += 1
        assert compared == len(sessions)
        return (f"{len(in_flight)} streams in flight at the kill; restored {notes}; "
                f"{compared} x {TC}-token continuations equal the reference")

    check("1 kill -9 mid-generation, every mode", kill9_every_mode)

    # ---- 2. corruption ------------------------------------------------------------------
    def corruption():
        assert "b" in ctx, "not run: check 1 restarted no server"
        b = ctx["b"]
        before = {s.sid: get_session(b.stub, s.sid) for s in sessions}
        exported = {s.sid: export(b.stub, s.sid) for s in sessions}
        rc = b.stop()
        assert rc in (0, 3), f"exit {rc} after SIGTERM"
        detail = [f"SIGTERM: exit {rc}"]
        files = {p.name[: -len(SUFFIX)]: p for p in session_files(state)}
        assert sorted(files) == sorted(s.sid for s in sessions), (
            f"files after SIGTERM: {sorted(files)}")
        recs = {sid: records(p.read_bytes()) for sid, p in files.items()}
        rng = random.Random(20240518)
        # (a), (b): files with >= 2 turn records (dropping the last leaves a turn).
        multi = [s for s in sessions if len(recs[s.sid]) >= 3]
        assert len(multi) >= 3, f"records per file {[len(recs[s.sid]) for s in sessions]}"
        sa, sb, sc = multi[0], multi[1], multi[2]
        sd = [s for s in sessions if s not in (sa, sb, sc)][0]

        def flip(path, lo, hi):
            data = bytearray(path.read_bytes())
            off = rng.randrange(lo, hi)
            data[off] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            return off

        # (a) cut inside its last record.
        pos, ln = recs[sa.sid][-1]
        cut = rng.randrange(pos + 1, pos + FRAME + ln - 1)
        with open(files[sa.sid], "r+b") as f:
            f.truncate(cut)
        detail.append(f"a {sa.name}: cut at {cut} in [{pos}, {pos + FRAME + ln})")
        # (b) a flipped bit in its last record's payload or CRC.
        pos, ln = recs[sb.sid][-1]
        off = flip(files[sb.sid], pos + 16, pos + FRAME + ln)
        detail.append(f"b {sb.name}: flip at {off}")
        # (c) a flipped bit in the payload of an earlier turn record.
        k = rng.randrange(1, len(recs[sc.sid]) - 1)
        pos, ln = recs[sc.sid][k]
        off = flip(files[sc.sid], pos + 16, pos + 16 + ln)
        detail.append(f"c {sc.name}: flip at {off} in record {k} of {len(recs[sc.sid])}")
        # (d) cut to 10 bytes.
        with open(files[sd.sid], "r+b") as f:
            f.truncate(10)
        detail.append(f"d {sd.name}: 10 bytes")

        c = Server("corrupt", ["--state-dir", str(state)])
        ctx["c"] = c
        q = sorted(p.name for p in (state / "quarantine").iterdir())
        assert q == sorted([sc.sid + SUFFIX, sd.sid + SUFFIX]), f"quarantine/ holds {q}"
        expect_not_found(c.stub, sc.sid)
        expect_not_found(c.stub, sd.sid)
        for s in (sa, sb):
            info = get_session(c.stub, s.sid)
            assert info.tokens == s.counts[-2], (
                f"{s.name}: {info.tokens} tokens, want {s.counts[-2]} (its previous turn)")
            assert without_capacity(export(c.stub, s.sid)) == prev_state[s.sid], (
                f"{s.name}: not the state it had before its last turn")
        unchanged = 0
        for s in sessions:
            if s in (sa, sb, sc, sd):
                continue
            info, old = get_session(c.stub, s.sid), before[s.sid]
            assert (info.tokens, info.cached_tokens, info.config) == (
                old.tokens, old.cached_tokens, old.config), f"{s.name}: changed: {info} vs {old}"
            after = export(c.stub, s.sid)
            assert without_capacity(after) == without_capacity(exported[s.sid]), (
                f"{s.name}: its export changed")
            unchanged += 1
        assert unchanged == len(sessions) - 4
        assert c.metric("cortiq_restore_quarantined_files") == 2, c.metrics()
        assert c.metric("cortiq_restore_sessions") == len(sessions) - 2
        log = c.log_text()
        for s in (sa, sb):
            assert f"session {s.sid}: a torn last record" in log, f"{s.name}: no torn-record line"
        # The shortened sessions run on from their previous turn.
        for s in (sa, sb):
            ids, _ = generate(c.stub, session_id=s.sid, **s.continuation())
            assert len(ids) == TC
        ctx["gone"] = {sc.sid, sd.sid}
        return "; ".join(detail)

    check("2 corruption: torn/flipped last record dropped, earlier corruption quarantined",
          corruption)

    # ---- 3. release deletes the file ----------------------------------------------------
    def release_deletes():
        c = ctx.get("c")
        assert c is not None, "not run: check 2 started no server"
        live = [s for s in sessions if s.sid not in ctx.get("gone", set())]
        files = session_files(state)
        n = c.metric("cortiq_session_files")
        assert n == len(files) == len(live), f"cortiq_session_files {n}, {len(files)} files"
        disk = c.metric("cortiq_session_disk_bytes")
        assert disk == sum(p.stat().st_size for p in files), f"disk bytes {disk}"
        victim = live[-1]
        path = state / (victim.sid + SUFFIX)
        size = path.stat().st_size
        assert size > JOURNAL_HEADER
        r = c.stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=victim.sid),
                                  timeout=RPC_TIMEOUT)
        exists = path.exists()
        assert r.released, "released = false"
        assert not exists, f"{path.name} still exists when ReleaseSession returned"
        n2 = c.metric("cortiq_session_files")
        assert n2 == n - 1, f"cortiq_session_files {n} -> {n2}"
        disk2 = c.metric("cortiq_session_disk_bytes")
        assert disk2 == disk - size, f"cortiq_session_disk_bytes {disk} -> {disk2}, file {size}"
        expect_not_found(c.stub, victim.sid)
        return f"{victim.name}: file gone, cortiq_session_files {n:.0f} -> {n2:.0f}"

    check("3 ReleaseSession deletes the file", release_deletes)

    # ---- 5. a corrupt length field in an earlier record ----------------------------------
    def corrupt_length():
        # A flipped high bit in the length of a record that complete records
        # follow makes it point past the end of the file, as a torn append's
        # would; the records after it show it is corruption, not a torn tail:
        # the file must be quarantined, not cut back (losing the later turns).
        c = ctx.get("c")
        assert c is not None, "not run: check 2 started no server"
        c.kill9()
        rng = random.Random(7)
        files = {p.name[: -len(SUFFIX)]: p for p in session_files(state)}
        s = next((s for s in sessions if s.sid in files and
                  len(records(files[s.sid].read_bytes())) >= 4), None)
        assert s is not None, "no session file with 3 turn records"
        data = bytearray(files[s.sid].read_bytes())
        recs = records(bytes(data))
        k = len(recs) - 3  # a turn record with two complete records after it
        pos, ln = recs[k]
        data[pos + 8 + rng.randrange(4, 8)] ^= 1 << rng.randrange(8)  # length += >= 2**32
        files[s.sid].write_bytes(bytes(data))
        d = Server("corrupt-length", ["--state-dir", str(state)])
        try:
            quarantined = (state / "quarantine" / (s.sid + SUFFIX)).is_file()
            try:
                back = f"restored with {get_session(d.stub, s.sid).tokens} tokens"
            except grpc.RpcError as e:
                back = e.code().name
            left = files[s.sid].stat().st_size if files[s.sid].exists() else 0
            assert quarantined and back == "NOT_FOUND", (
                f"{s.name}: record {k} of {len(recs)} (at byte {pos}) has a corrupt length and "
                f"{len(recs) - k - 1} complete records after it; the file was not quarantined "
                f"({back}; the file was cut from {len(data)} to {left} bytes)")
            return f"{s.name}: record {k} of {len(recs)}: quarantined, NOT_FOUND"
        finally:
            d.kill9()

    check("2e corrupt length field of an earlier record: quarantined", corrupt_length)

    # ---- 2f. a file whose read crashes the server: no crash loop ------------------------
    def crash_loop():
        # The failpoint restore-read kills the server while it reads its
        # first session file at start, as a SIGBUS from an I/O error under
        # the file's mapping would: twice in a row. The next start
        # quarantines that file unread and restores the others.
        files = session_files(state)
        assert len(files) >= 2, f"{len(files)} session files"
        first = files[0].name[: -len(SUFFIX)]
        others = [p.name[: -len(SUFFIX)] for p in files[1:]]
        mark = state / (first + ".reading")
        for attempt in (1, 2):
            try:
                srv = Server(f"crash-loop-{attempt}", ["--state-dir", str(state)],
                             env_extra={"CORTIQ_FAILPOINTS": "restore-read"})
            except RuntimeError as e:
                assert "failpoint restore-read" in str(e), f"start {attempt}: {e}"
            else:
                srv.kill9()
                raise AssertionError(f"start {attempt}: the failpoint did not kill the server")
            assert mark.is_file() and mark.read_text() == str(attempt), (
                f"start {attempt}: the read mark holds "
                f"{mark.read_text() if mark.exists() else '(none)'}")
        e = Server("crash-loop-3", ["--state-dir", str(state)])
        try:
            assert (state / "quarantine" / (first + SUFFIX)).is_file(), "not quarantined"
            expect_not_found(e.stub, first)
            for sid in others:
                get_session(e.stub, sid)
            left = sorted(p.name for p in state.iterdir() if p.name.endswith(".reading"))
            assert not left, f"read marks left: {left}"
            assert "the last 2 reads of it ended with the process" in e.log_text()
            return f"quarantined after 2 crashed starts; {len(others)} others restored"
        finally:
            e.kill9()

    check("2f a file whose read crashed two starts is quarantined: no crash loop", crash_loop)


def disk_full_checks():
    work = Path(ARGS.workdir)

    def exercise(srv, d, what):
        """A kept session grown past what the disk takes: every call succeeds,
        the failures are counted, the server serves on."""
        f0 = srv.metric("cortiq_persist_failures_total")
        assert f0 == 0, f"failures before: {f0}"
        _, s = generate(srv.stub, prompt=PROMPTS[0], max_tokens=8, ignore_eos=True,
                        keep_session=True, sampling=pb2.SamplingParams(temperature=0.0))
        sid, written = s.session_id, s.usage.session_tokens
        r0 = srv.metric("cortiq_persist_records_total")
        assert r0 >= 1, "the first (small) record was not written"
        lengths = []
        for _ in range(2):  # each call adds ~600 KB of f32 rows
            ids, s = generate(srv.stub, session_id=sid, prompt="more", max_tokens=200,
                              ignore_eos=True, sampling=pb2.SamplingParams(temperature=0.0))
            assert s.finish_reason == pb2.FINISH_REASON_LENGTH, f"finish {s.finish_reason}"
            lengths.append(len(ids))
        assert lengths == [200] * 2, f"streamed {lengths}"
        fails = srv.metric("cortiq_persist_failures_total")
        assert fails >= 1, f"cortiq_persist_failures_total {fails} ({what})"
        assert srv.proc.poll() is None, f"the server exited ({srv.proc.returncode})"
        # The next calls: the same session and a new one.
        ids, _ = generate(srv.stub, session_id=sid, prompt="next", max_tokens=4, ignore_eos=True)
        ids2, _ = generate(srv.stub, prompt="fresh", max_tokens=4, ignore_eos=True)
        assert len(ids) == 4 and len(ids2) == 4
        info = get_session(srv.stub, sid)
        p = len(srv.stub.Tokenize(pb2.TokenizeRequest(text="next"), timeout=RPC_TIMEOUT).token_ids)
        assert info.tokens == s.usage.session_tokens + p + 4, info.tokens
        log = srv.log_text()
        assert f"state: session {sid}:" in log, f"no persist error in the log ({what})"
        # The file still holds the last turn written: a restart (no limit)
        # brings the session back there.
        srv.kill9()
        again = Server(srv.name + "-restart", ["--state-dir", str(d)])
        try:
            back = get_session(again.stub, sid).tokens
            assert back == written, f"restored with {back} tokens, the last written turn {written}"
            assert again.metric("cortiq_restore_quarantined_files") == 0
        finally:
            again.kill9()
        return f"{fails:.0f} failed writes, calls OK; restart: back at {written} tokens"

    def rlimit():
        limit = 256 * 1024  # the first record (53 positions, ~160 KB) fits
        d = work / "state-fsize"

        def pre():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        srv = Server("fsize", ["--state-dir", str(d)], preexec_fn=pre)
        try:
            out = exercise(srv, d, "RLIMIT_FSIZE")
            big = [p.stat().st_size for p in session_files(d)]
            assert all(sz <= limit for sz in big), f"file sizes {big}"
            return out + f"; files {big} <= {limit}"
        finally:
            if srv.proc.poll() is None:
                srv.kill9()

    check("4 disk full (RLIMIT_FSIZE 256 KiB)", rlimit)

    def tmpfs():
        if os.geteuid() != 0:
            return "SKIP: not root (a tmpfs mount needs CAP_SYS_ADMIN)"
        d = work / "state-tmpfs"
        d.mkdir(exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)],
                           capture_output=True, timeout=30)
        if r.returncode != 0:
            return f"SKIP: mount tmpfs failed: {r.stderr.decode(errors='replace').strip()}"
        MOUNTS.append(str(d))
        srv = Server("tmpfs", ["--state-dir", str(d)])
        try:
            return exercise(srv, d, "tmpfs 256k")
        finally:
            if srv.proc.poll() is None:
                srv.kill9()
            subprocess.run(["umount", str(d)], capture_output=True, timeout=30)
            MOUNTS.remove(str(d))

    check("4b disk full (tmpfs 256k, root only)", tmpfs)


def migration_checks():
    """5. A move to a peer cut by a crash of the source (the failpoints of
    server/migration.cc kill it with SIGKILL at the chosen instant): the
    restarted source holds the session in doubt (UNAVAILABLE) until the
    peers answer; then exactly one node has it."""
    work = Path(ARGS.workdir)

    def cut_move(failpoint, tag, restart_peers=()):
        b_dir, a_dir = work / f"mig-{tag}-b", work / f"mig-{tag}-a"
        b = Server(f"mig-{tag}-b", ["--state-dir", str(b_dir)])
        a_flags = ["--state-dir", str(a_dir), "--peers", b.address]
        a = Server(f"mig-{tag}-a", a_flags, env_extra={"CORTIQ_FAILPOINTS": failpoint})
        req = dict(prompt=PROMPTS[0] + f"[move {tag}]", max_tokens=T1, ignore_eos=True,
                   sampling=pb2.SamplingParams(temperature=0.0), keep_session=True,
                   session_config=pb2.SessionConfig(kv_dtype=pb2.KV_DTYPE_F32))
        _, summary = generate(a.stub, **req)
        sid = summary.session_id
        # The reference: the same turn and continuation on a server that
        # never crashed.
        r = Server(f"mig-{tag}-ref")
        generate(r.stub, **dict(req, session_id=sid, create_if_missing=True))
        cont = dict(prompt=CONT_PROMPT, max_tokens=TC, ignore_eos=True,
                    sampling=pb2.SamplingParams(temperature=0.0))
        want, _ = generate(r.stub, session_id=sid, **cont)
        r.stop()
        try:
            a.stub.MigrateSession(pb2.MigrateSessionRequest(session_id=sid, peer=b.address),
                                  timeout=RPC_TIMEOUT)
            raise AssertionError("MigrateSession returned: the failpoint did not kill the source")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, f"MigrateSession: {e.code().name}"
        a.proc.wait(timeout=10)
        a.close_channel()
        mark = a_dir / f"{sid}.moving"
        assert mark.exists(), f"{mark.name}: no mark left by the cut move"
        assert (a_dir / f"{sid}{SUFFIX}").exists(), "the source's file is gone"
        a = Server(f"mig-{tag}-a2", a_flags[:-1] + [",".join([b.address, *restart_peers])])
        return a, b, sid, want, cont, mark

    def after_import():
        a, b, sid, want, cont, mark = cut_move("migrate-after-peer-import", "done")
        # The peer answered: it holds the session. The source settles on
        # its own (its reaper asks the peers), then forwards calls there.
        # (The file goes first, then its mark.)
        gone = poll(lambda: not (work / "mig-done-a" / f"{sid}{SUFFIX}").exists()
                    and not mark.exists(), timeout=20)
        assert gone, "the source still has its copy (or its mark) 20 s after the restart"
        info = get_session(b.stub, sid)
        got, _ = generate(b.stub, session_id=sid, **cont)
        assert got == want, f"continuation on the peer {got[:8]} != reference {want[:8]}"
        expect_not_found_local = poll(lambda: sid not in [
            s.session_id for s in a.stub.ListSessions(pb2.ListSessionsRequest(),
                                                      timeout=RPC_TIMEOUT).sessions], timeout=10)
        assert expect_not_found_local, "the source still lists the session"
        return f"source released its copy; peer holds {info.tokens} tokens, continuation equal"

    def before_send():
        a, b, sid, want, cont, mark = cut_move("migrate-before-send", "lost")
        expect_not_found(b.stub, sid)

        def served():
            try:
                return generate(a.stub, session_id=sid, **cont)[0]
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, f"Generate: {e.code().name}"
                return None

        got = poll(served, timeout=20, interval=0.2)
        assert got is not None, "still in doubt 20 s after the restart"
        assert got == want, f"continuation {got[:8]} != reference {want[:8]}"
        assert not mark.exists(), "the mark survived the settlement"
        expect_not_found(b.stub, sid)
        return "no peer held it: the source kept it, continuation equal"

    def silent_peer():
        # A peer that does not answer (port 1: refused) keeps the session in
        # doubt: listed with moving_to, calls UNAVAILABLE, the gauge at 1,
        # for as long as it stays silent; a restart without it settles.
        a, b, sid, want, cont, mark = cut_move("migrate-before-send", "silent", ["127.0.0.1:1"])
        asked = poll(lambda: a.log_text().count(f"session {sid}: still in doubt") >= 2, timeout=20)
        assert asked, "no second attempt logged within 20 s"
        info = get_session(a.stub, sid)
        assert info.moving_to == b.address and info.spilled, (
            f"moving_to {info.moving_to!r} (want {b.address}), spilled {info.spilled}")
        assert a.metric("cortiq_sessions_in_doubt") == 1, "cortiq_sessions_in_doubt != 1"
        try:
            generate(a.stub, session_id=sid, **cont)
            raise AssertionError("a call on a session in doubt succeeded")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, f"Generate: {e.code().name}"
            assert b.address in e.details(), e.details()
        a.kill9()  # (SIGTERM would drain toward the silent peer)
        a = Server("mig-silent-a3", ["--state-dir", str(work / "mig-silent-a"), "--peers",
                                     b.address])
        got = poll(lambda: a.metric("cortiq_sessions_in_doubt") == 0, timeout=20)
        assert got, "still in doubt after the silent peer was dropped"
        out, _ = generate(a.stub, session_id=sid, **cont)
        assert out == want, f"continuation {out[:8]} != reference {want[:8]}"
        assert not mark.exists(), "the mark survived the settlement"
        return "in doubt while a peer was silent (UNAVAILABLE, moving_to, gauge 1); settled after"

    check("5a a move cut after the peer's import: one copy, on the peer", after_import)
    kill_all()
    check("5b a move cut before the send: one copy, on the source", before_send)
    kill_all()
    check("5c a silent peer keeps the session in doubt", silent_peer)


def main():
    global ARGS, pb2, pb2_grpc, grpc
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--proto-py", required=True)
    ap.add_argument("--workdir", required=True)
    ARGS = ap.parse_args()

    sys.path.insert(0, ARGS.proto_py)
    import grpc as _grpc  # noqa: E402
    from cortiq.v1 import inference_pb2 as _pb2  # noqa: E402
    from cortiq.v1 import inference_pb2_grpc as _pb2_grpc  # noqa: E402
    grpc, pb2, pb2_grpc = _grpc, _pb2, _pb2_grpc

    work = Path(ARGS.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    t0 = time.monotonic()
    try:
        run_checks()
        kill_all()
        disk_full_checks()
        kill_all()
        migration_checks()
    except Exception:  # noqa: BLE001 - a setup failure (e.g. no server) fails the run
        traceback.print_exc()
        RESULTS.append(("setup", False, "exception"))
    finally:
        kill_all()
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed in "
          f"{time.monotonic() - t0:.1f} s", flush=True)
    if failed:
        print("FAILED: " + ", ".join(failed))
        for log in sorted(work.glob("*.log")):
            print(f"--- {log.name} (tail) ---")
            print("\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        return 1
    return 0


if __name__ == "__main__":
    # CTest (or a user) stopping this script must not leave servers behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        sys.exit(main())
    finally:
        kill_all()
