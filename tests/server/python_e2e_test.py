#!/usr/bin/python3
"""End-to-end test of cortiq-server with a real grpcio client (run by CTest).

Makes a random tiny model with cortiq-tool, starts cortiq-server on port 0 and
checks the public API (proto/cortiq/v1/inference.proto) from the outside:
model info, streamed generation, kept sessions, argument errors, client-side
cancellation (no leaked session bytes), Tokenize, grpc.health.v1, bearer-token
authentication, tenants and roles from a token file (re-read on SIGHUP) and
SIGTERM draining. Runs with Debian's python3-grpcio and
python3-protobuf (/usr/bin/python3).

  python_e2e_test.py --server-bin BIN --tool-bin BIN --proto-py DIR --workdir DIR

Prints one line per check; exits 1 if any check failed. Every server started
here is killed on the way out.
"""

import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

ARGS = None
pb2 = None
pb2_grpc = None
grpc = None

REPO = Path(__file__).resolve().parents[2]
SERVERS = []  # every Popen started here; killed at exit
RESULTS = []  # (name, ok, detail)

LISTEN_RE = re.compile(r"^listening on (\S+):(\d+) metrics (\d+)\s*$", re.M)
RPC_TIMEOUT = 30  # seconds, per unary call / stream


# ---------------------------------------------------------------------------
# Processes


class Server:
    """One cortiq-server process; stdout (the listening line and the logs) goes
    to a file so that a full pipe can never block it."""

    def __init__(self, name, model_dir, extra=()):
        self.name = name
        self.log_path = Path(ARGS.workdir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        cmd = [ARGS.server_bin, "--model", str(model_dir), "--listen", "127.0.0.1:0",
               "--metrics-listen", "127.0.0.1:0", "--http-listen", "off", "--threads", "2", *extra]
        env = dict(os.environ)
        env.pop("CORTIQ_AUTH_TOKEN", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
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

    def metrics(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200, f"/metrics: HTTP {r.status}"
            return r.read().decode("utf-8")

    def close_channel(self):
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001 - best effort
            pass


def kill_all():
    for p in SERVERS:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


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
    line = f"{'PASS' if ok else 'FAIL'} {name} ({dt:.2f} s)"
    if detail:
        line += f": {detail}"
    print(line, flush=True)
    return ok


def generate(stub, metadata=None, **req):
    """Runs one Generate call to the end; returns (tokens, summary, messages)."""
    call = stub.Generate(pb2.GenerateRequest(**req), timeout=RPC_TIMEOUT, metadata=metadata)
    msgs = list(call)
    assert msgs, "Generate: empty stream"
    kinds = [m.WhichOneof("event") for m in msgs]
    assert kinds.count("summary") == 1, f"Generate: {kinds.count('summary')} summary messages"
    assert kinds[-1] == "summary", f"Generate: the last message is {kinds[-1]}, not the summary"
    assert all(k == "token" for k in kinds[:-1]), f"Generate: events {kinds}"
    tokens = [m.token for m in msgs[:-1]]
    return tokens, msgs[-1].summary, msgs


def expect_error(code, fn, *words):
    """fn() must raise grpc.RpcError with this code and a message naming words."""
    try:
        r = fn()
        if hasattr(r, "__iter__") and not isinstance(r, (str, bytes)):
            list(r)
    except grpc.RpcError as e:
        got = e.code()
        details = e.details() or ""
        assert got == code, f"expected {code.name}, got {got.name}: {details!r}"
        for w in words:
            assert w in details, f"{code.name} message {details!r} does not mention {w!r}"
        return f"{got.name}: {details}"
    raise AssertionError(f"expected {code.name}, the call succeeded")


def gen_call(stub, metadata=None, **req):
    return lambda: stub.Generate(pb2.GenerateRequest(**req), timeout=RPC_TIMEOUT,
                                 metadata=metadata)


def parse_metric(text, name):
    """{frozenset of (label, value): float value} of one metric name in
    Prometheus text (label order does not matter)."""
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


def labels(**kv):
    return frozenset(kv.items())


def poll(fn, timeout, interval=0.05):
    """Calls fn() until it returns a truthy value or timeout passes; returns the
    last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def health_check(channel, service="", metadata=None):
    """grpc.health.v1.Health/Check with hand-encoded messages; returns the
    status enum (1 = SERVING)."""
    check_rpc = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
    name = service.encode()
    req = b"" if not name else b"\x0a" + bytes([len(name)]) + name
    resp = check_rpc(req, timeout=10, metadata=metadata)
    # HealthCheckResponse { ServingStatus status = 1; } : tag 0x08, varint.
    if resp == b"":
        return 0  # proto3 default: UNKNOWN
    assert resp[0] == 0x08, f"health: unexpected response bytes {resp!r}"
    value, shift = 0, 0
    for b in resp[1:]:
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return value


# ---------------------------------------------------------------------------
# Checks


MAX_TOKENS_LIMIT = 4096
CANCEL_MAX_TOKENS = 2000
PROMPT = "Hello world, this is a test."


def run_checks(model_dir):
    srv = Server("server", model_dir, ["--max-tokens", str(MAX_TOKENS_LIMIT), "--grace", "2"])
    stub = srv.stub
    print(f"server up on {srv.address} (metrics {srv.metrics_port})", flush=True)
    info_box = {}

    def model_info():
        mi = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT)
        info_box["mi"] = mi
        assert mi.name == Path(model_dir).name, f"name {mi.name!r}"
        assert mi.model_type in ("qwen3", "qwen2", "llama"), f"model_type {mi.model_type!r}"
        assert re.fullmatch(r"[0-9a-f]+", mi.fingerprint), f"fingerprint {mi.fingerprint!r}"
        assert mi.vocab_size > 0 and mi.num_layers > 0 and mi.hidden_size > 0, str(mi)
        assert mi.num_attention_heads > 0 and mi.num_key_value_heads > 0, str(mi)
        assert mi.num_attention_heads % mi.num_key_value_heads == 0, str(mi)
        assert mi.head_dim > 0 and mi.max_context > 0, str(mi)
        assert mi.weight_bytes > 0, "weight_bytes 0"
        assert mi.max_tokens_limit == MAX_TOKENS_LIMIT, f"max_tokens_limit {mi.max_tokens_limit}"
        assert mi.max_sessions == 256, f"max_sessions {mi.max_sessions} (default 256)"
        assert mi.memory_budget_bytes == 0, f"memory_budget_bytes {mi.memory_budget_bytes}"
        assert mi.server_version, "empty server_version"
        assert all(0 <= e < mi.vocab_size for e in mi.eos_token_ids), f"eos {mi.eos_token_ids}"
        d = mi.default_session_config
        assert d.attention == pb2.ATTENTION_MODE_EXACT, f"default attention {d.attention}"
        assert d.kv_dtype == pb2.KV_DTYPE_F32, f"default kv_dtype {d.kv_dtype}"
        # A second node serving the same weights reports the same fingerprint.
        mi2 = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT)
        assert mi2.fingerprint == mi.fingerprint
        return (f"{mi.model_type} layers={mi.num_layers} hidden={mi.hidden_size} "
                f"vocab={mi.vocab_size} ctx={mi.max_context} fp={mi.fingerprint}")

    check("a GetModelInfo", model_info)
    mi = info_box.get("mi") or stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT)

    def tokenize():
        r = stub.Tokenize(pb2.TokenizeRequest(text=PROMPT), timeout=RPC_TIMEOUT)
        assert len(r.token_ids) > 0, "no token ids"
        assert len(r.tokens) == len(r.token_ids), f"{len(r.tokens)} tokens, {len(r.token_ids)} ids"
        assert all(0 <= t < mi.vocab_size for t in r.token_ids), f"ids {list(r.token_ids)}"
        empty = stub.Tokenize(pb2.TokenizeRequest(text=""), timeout=RPC_TIMEOUT)
        assert len(empty.token_ids) == 0, f"'' -> {list(empty.token_ids)}"
        return f"{len(r.token_ids)} ids {list(r.token_ids)[:8]}"

    check("f Tokenize", tokenize)

    def generate_stream():
        n = 8
        prompt_len = len(stub.Tokenize(pb2.TokenizeRequest(text=PROMPT), timeout=RPC_TIMEOUT).token_ids)
        runs = []
        for _ in range(2):
            toks, summary, _ = generate(stub, prompt=PROMPT, max_tokens=n, ignore_eos=True,
                                        sampling=pb2.SamplingParams(temperature=0.0))
            runs.append((toks, summary))
        for toks, s in runs:
            assert len(toks) == n, f"{len(toks)} tokens streamed, max_tokens {n} with ignore_eos"
            for t in toks:
                assert isinstance(t.text, str), f"text is {type(t.text)}"
                t.text.encode("utf-8")  # a str from proto3 is valid UTF-8 by construction
                assert 0 <= t.token_id < mi.vocab_size, f"token id {t.token_id}"
            assert s.finish_reason == pb2.FINISH_REASON_LENGTH, f"finish_reason {s.finish_reason}"
            assert s.usage.completion_tokens == n, f"completion_tokens {s.usage.completion_tokens}"
            assert s.usage.prompt_tokens == prompt_len, (
                f"usage.prompt_tokens {s.usage.prompt_tokens}, Tokenize gives {prompt_len}")
            assert s.usage.session_tokens == prompt_len + n, f"session_tokens {s.usage.session_tokens}"
            assert re.fullmatch(r"[0-9a-f]{32}", s.session_id), f"session_id {s.session_id!r}"
            assert not s.session_kept, "one-shot session kept without keep_session"
            assert s.memory.total_bytes > 0, "summary memory.total_bytes is 0"
            m = s.memory
            assert m.total_bytes == m.kv_f32_bytes + m.kv_int8_bytes + m.o1_bytes + m.qsa_bytes, str(m)
            assert s.timings.total_seconds > 0, f"timings {s.timings}"
        ids = [[t.token_id for t in toks] for toks, _ in runs]
        assert ids[0] == ids[1], f"greedy runs differ: {ids[0]} vs {ids[1]}"
        assert runs[0][1].session_id != runs[1][1].session_id, "two one-shot calls share a session id"
        left = stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT)
        assert len(left.sessions) == 0, f"{len(left.sessions)} sessions left after one-shot calls"
        # Default sampling (temperature 1) with a seed is reproducible as well.
        seeded = [[t.token_id for t in generate(stub, prompt=PROMPT, max_tokens=n, ignore_eos=True,
                                                sampling=pb2.SamplingParams(seed=7))[0]]
                  for _ in range(2)]
        assert seeded[0] == seeded[1], f"seeded runs differ: {seeded}"
        return f"greedy ids {ids[0]}, text {''.join(t.text for t in runs[0][0])!r}"

    check("b Generate stream + greedy determinism", generate_stream)

    def n_choices_with_penalties():
        # n = 2 with OpenAI-style penalties and a logit_bias: the tokens carry
        # their choice's index, then one summary per choice in index order
        # ends the stream; choice i is an n = 1 call with seed + i.
        def sampling(seed):
            # A high temperature: the small model is sure of itself.
            return pb2.SamplingParams(temperature=8.0, seed=seed, presence_penalty=0.6,
                                      frequency_penalty=0.4, logit_bias={10: 2.0, 32: -5.0})
        call = stub.Generate(pb2.GenerateRequest(prompt=PROMPT, max_tokens=6, ignore_eos=True, n=2,
                                                 sampling=sampling(11)), timeout=RPC_TIMEOUT)
        msgs = list(call)
        kinds = [m.WhichOneof("event") for m in msgs]
        assert kinds[-2:] == ["summary", "summary"], f"the stream ends {kinds[-3:]}"
        assert kinds.count("summary") == 2, f"{kinds.count('summary')} summaries for n = 2"
        summaries = [m.summary for m in msgs[-2:]]
        assert [s.index for s in summaries] == [0, 1], f"summary indexes {[s.index for s in summaries]}"
        by_choice = {0: [], 1: []}
        for m in msgs[:-2]:
            by_choice[m.token.index].append(m.token.token_id)
        for i in (0, 1):
            alone = [t.token_id for t in generate(stub, prompt=PROMPT, max_tokens=6, ignore_eos=True,
                                                   sampling=sampling(11 + i))[0]]
            assert by_choice[i] == alone, f"choice {i}: {by_choice[i]} vs n = 1 seed + {i}: {alone}"
            assert summaries[i].usage.completion_tokens == 6, str(summaries[i].usage)
            assert summaries[i].finish_reason == pb2.FINISH_REASON_LENGTH
        assert by_choice[0] != by_choice[1], f"seeds 11 and 12 gave the same tokens {by_choice[0]}"
        left = stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT)
        assert len(left.sessions) == 0, f"{len(left.sessions)} sessions left after an n = 2 call"
        return f"choices {by_choice[0]} / {by_choice[1]}"

    check("b3 n = 2 with penalties and logit_bias", n_choices_with_penalties)

    def utf8_and_logprobs():
        # The tiny model's byte-level vocabulary lets generation produce byte
        # sequences that are not UTF-8 (it tends to repeat the prompt's last
        # token: a prompt ending in a lead byte gives a run of lead bytes); the
        # streamed text must still be UTF-8 (a proto3 string that is not fails
        # to parse here). Greedy and random sampling, with logprobs.
        cases = [([195, 169, 228], pb2.SamplingParams(temperature=0.0)),
                 ([72, 105, 240, 159], pb2.SamplingParams(temperature=0.0)),
                 ([195, 169, 228, 184], pb2.SamplingParams(temperature=0.0))]
        cases += [([195, 169, 228, 184, 150], pb2.SamplingParams(temperature=2.0, seed=seed,
                                                                repetition_penalty=3.0))
                  for seed in range(4)]
        n_tokens = 0
        non_ascii = 0
        for prompt_tokens, sampling in cases:
            where = f"prompt_tokens {prompt_tokens} seed {sampling.seed}"
            toks, s, _ = generate(stub, prompt_tokens=prompt_tokens, max_tokens=24,
                                  ignore_eos=True, logprobs=True, top_logprobs=3, sampling=sampling)
            assert s.usage.completion_tokens == len(toks) == 24, f"{where}: {s.usage}"
            for t in toks:
                assert isinstance(t.text, str)
                t.text.encode("utf-8")
                non_ascii += sum(1 for ch in t.text if ord(ch) > 127)
                assert t.HasField("logprob"), f"{where}: no logprob"
                assert t.logprob.token_id == t.token_id, f"{where}: logprob for {t.logprob.token_id}"
                assert t.logprob.logprob <= 0 and not math.isnan(t.logprob.logprob), str(t.logprob)
                assert len(t.top_logprobs) == 3, f"{where}: {len(t.top_logprobs)} top_logprobs"
                tops = [x.logprob for x in t.top_logprobs]
                assert tops == sorted(tops, reverse=True), f"{where}: top_logprobs {tops}"
            n_tokens += len(toks)
        assert non_ascii > 0, "no non-ASCII text generated: the check exercised nothing"
        return f"{n_tokens} tokens, {non_ascii} non-ASCII characters, all valid UTF-8"

    check("b2 UTF-8 text deltas and logprobs (partial byte sequences)", utf8_and_logprobs)

    def kept_session():
        toks, s, _ = generate(stub, prompt=PROMPT, max_tokens=4, keep_session=True,
                              ignore_eos=True, sampling=pb2.SamplingParams(temperature=0.0))
        sid = s.session_id
        assert re.fullmatch(r"[0-9a-f]{32}", sid), f"session_id {sid!r}"
        assert s.session_kept, "keep_session=True but session_kept is false"
        info = stub.GetSession(pb2.GetSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)
        assert info.session_id == sid
        assert info.memory.total_bytes > 0, "GetSession memory.total_bytes is 0"
        assert info.memory.total_bytes == s.memory.total_bytes, (
            f"GetSession total {info.memory.total_bytes} != summary total {s.memory.total_bytes}")
        assert info.tokens == s.usage.session_tokens, (
            f"GetSession tokens {info.tokens} != summary session_tokens {s.usage.session_tokens}")
        assert not info.busy, "idle session reported busy"
        assert info.config.attention == pb2.ATTENTION_MODE_EXACT, f"config {info.config}"
        lst = stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT)
        assert [x.session_id for x in lst.sessions] == [sid], f"ListSessions {lst.sessions}"
        assert lst.total_memory.total_bytes == info.memory.total_bytes
        before = info.tokens
        toks2, s2, _ = generate(stub, prompt=" and more", session_id=sid, max_tokens=3,
                                ignore_eos=True, sampling=pb2.SamplingParams(temperature=0.0))
        assert s2.session_id == sid, f"continued call reports session {s2.session_id!r}"
        assert s2.session_kept, "a named session was not kept"
        info2 = stub.GetSession(pb2.GetSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)
        assert info2.tokens > before, f"tokens {before} -> {info2.tokens}"
        assert info2.tokens == before + s2.usage.prompt_tokens + s2.usage.completion_tokens, (
            f"tokens {before} -> {info2.tokens}, usage {s2.usage}")
        assert info2.memory.total_bytes >= info.memory.total_bytes
        rel = stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)
        assert rel.released, "first ReleaseSession: released=false"
        assert rel.freed_bytes > 0, "first ReleaseSession: freed_bytes 0"
        assert rel.freed_bytes == info2.memory.total_bytes, (
            f"freed_bytes {rel.freed_bytes} != held {info2.memory.total_bytes}")
        rel2 = stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)
        assert not rel2.released and rel2.freed_bytes == 0, f"second ReleaseSession: {rel2}"
        expect_error(grpc.StatusCode.NOT_FOUND,
                     lambda: stub.GetSession(pb2.GetSessionRequest(session_id=sid),
                                             timeout=RPC_TIMEOUT))
        return (f"{sid}: tokens {before} -> {info2.tokens}, bytes {info.memory.total_bytes} -> "
                f"{info2.memory.total_bytes}, freed {rel.freed_bytes}")

    check("c kept session lifecycle", kept_session)

    IA = grpc.StatusCode.INVALID_ARGUMENT
    greedy = pb2.SamplingParams(temperature=0.0)
    error_cases = [
        ("empty prompt", IA, ["prompt"], dict(prompt="", max_tokens=4)),
        ("max_tokens=0", IA, ["max_tokens"], dict(prompt=PROMPT, max_tokens=0)),
        ("max_tokens above limit", IA, ["max_tokens"],
         dict(prompt=PROMPT, max_tokens=MAX_TOKENS_LIMIT + 1)),
        ("temperature=-1", IA, ["temperature"],
         dict(prompt=PROMPT, max_tokens=4, sampling=pb2.SamplingParams(temperature=-1.0))),
        ("temperature=NaN", IA, ["temperature"],
         dict(prompt=PROMPT, max_tokens=4, sampling=pb2.SamplingParams(temperature=math.nan))),
        ("temperature=inf", IA, ["temperature"],
         dict(prompt=PROMPT, max_tokens=4, sampling=pb2.SamplingParams(temperature=math.inf))),
        ("top_p=1.5", IA, ["top_p"],
         dict(prompt=PROMPT, max_tokens=4, sampling=pb2.SamplingParams(top_p=1.5))),
        ("prompt_tokens=[10**6]", IA, ["prompt_tokens"], dict(prompt_tokens=[10**6], max_tokens=4)),
        ("prompt_tokens=[-1]", IA, ["prompt_tokens"], dict(prompt_tokens=[-1], max_tokens=4)),
        ("prompt and prompt_tokens", IA, ["prompt"],
         dict(prompt=PROMPT, prompt_tokens=[1], max_tokens=4)),
        ("unknown session_id", grpc.StatusCode.NOT_FOUND, [],
         dict(prompt=PROMPT, max_tokens=4, session_id="0" * 32, sampling=greedy)),
        ("session_config.attention=7", IA, ["attention"],
         dict(prompt=PROMPT, max_tokens=4, session_config=pb2.SessionConfig(attention=7))),
        ("session_config.kv_dtype=9", IA, ["kv_dtype"],
         dict(prompt=PROMPT, max_tokens=4, session_config=pb2.SessionConfig(kv_dtype=9))),
        ("top_logprobs=21", IA, ["top_logprobs"],
         dict(prompt=PROMPT, max_tokens=4, logprobs=True, top_logprobs=21)),
        ("empty stop string", IA, ["stop"], dict(prompt=PROMPT, max_tokens=4, stop=[""])),
    ]

    def errors():
        details = []
        for label, code, words, req in error_cases:
            try:
                details.append(f"{label}: " + expect_error(code, gen_call(stub, **req), *words))
            except AssertionError as e:
                raise AssertionError(f"{label}: {e}") from None
        details.append("GetSession unknown: " + expect_error(
            grpc.StatusCode.NOT_FOUND,
            lambda: stub.GetSession(pb2.GetSessionRequest(session_id="f" * 32), timeout=RPC_TIMEOUT)))
        details.append("GetSession empty id: " + expect_error(
            IA, lambda: stub.GetSession(pb2.GetSessionRequest(session_id=""), timeout=RPC_TIMEOUT),
            "session_id"))
        details.append("CreateSession attention=7: " + expect_error(
            IA, lambda: stub.CreateSession(
                pb2.CreateSessionRequest(config=pb2.SessionConfig(attention=7)), timeout=RPC_TIMEOUT),
            "attention"))
        rel = stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id="e" * 32), timeout=RPC_TIMEOUT)
        assert not rel.released, f"ReleaseSession of an unknown id: {rel}"
        # No failed request may leave a session (or its bytes) behind.
        lst = stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT)
        assert len(lst.sessions) == 0, f"{len(lst.sessions)} sessions left after rejected requests"
        print("    " + "\n    ".join(details), flush=True)
        return f"{len(details)} error cases"

    check("d argument errors", errors)

    def cancel_mid_stream():
        metrics0 = srv.metrics()
        cancelled0 = parse_metric(metrics0, "cortiq_requests_total").get(
            labels(rpc="Generate", code="CANCELLED"), 0.0)
        generated0 = parse_metric(metrics0, "cortiq_generated_tokens_total").get(frozenset(), 0.0)
        # Long enough (the tiny model decodes ~1 ms/token) that the stream is
        # still running when the cancel lands; below --max-tokens.
        max_tokens = CANCEL_MAX_TOKENS
        call = stub.Generate(pb2.GenerateRequest(prompt=PROMPT, max_tokens=max_tokens,
                                                 ignore_eos=True), timeout=RPC_TIMEOUT)
        first = next(call)
        assert first.WhichOneof("event") == "token", f"first event {first.WhichOneof('event')}"
        call.cancel()
        got = 1
        try:
            for m in call:
                got += 1
                assert m.WhichOneof("event") == "token"
            raise AssertionError("stream completed normally after cancel()")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.CANCELLED, f"stream ended with {e.code()}"

        def clean():
            lst = stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT)
            if lst.sessions:
                return None
            text = srv.metrics()
            mem = parse_metric(text, "cortiq_session_memory_bytes")
            active = parse_metric(text, "cortiq_sessions_active")
            if not mem or any(v != 0 for v in mem.values()):
                return None
            if any(v != 0 for v in active.values()):
                return None
            return text

        text = poll(clean, 5)
        if not text:
            lst = stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT)
            final = srv.metrics()
            raise AssertionError(
                f"5 s after cancel: {len(lst.sessions)} sessions, "
                f"cortiq_session_memory_bytes {parse_metric(final, 'cortiq_session_memory_bytes')}, "
                f"cortiq_sessions_active {parse_metric(final, 'cortiq_sessions_active')}")
        mem = parse_metric(text, "cortiq_session_memory_bytes")
        kinds = sorted(dict(k).get("kind", "?") for k in mem)
        assert kinds == ["kv_f32", "kv_int8", "o1", "qsa"], f"memory kinds {kinds}"
        # The server saw the cancellation (it was not a completed stream).
        cancelled = poll(lambda: parse_metric(srv.metrics(), "cortiq_requests_total").get(
            labels(rpc="Generate", code="CANCELLED"), 0.0) > cancelled0, 5)
        assert cancelled, "cortiq_requests_total{rpc=Generate,code=CANCELLED} did not grow"
        # ... and stopped generating: fewer tokens than asked for were sampled.
        generated = parse_metric(srv.metrics(), "cortiq_generated_tokens_total").get(
            frozenset(), 0.0) - generated0
        assert generated < max_tokens, (
            f"{generated:.0f} tokens generated after a cancel at the first of {max_tokens}")
        return (f"{got} token(s) read, {generated:.0f} of {max_tokens} generated; no sessions, "
                f"cortiq_session_memory_bytes all 0; the server counted CANCELLED")

    check("e client cancel frees the session", cancel_mid_stream)

    def health():
        st = health_check(srv.channel, "")
        assert st == 1, f'Check("") status {st}, want 1 (SERVING)'
        st2 = health_check(srv.channel, "cortiq.v1.Inference")
        assert st2 == 1, f'Check("cortiq.v1.Inference") status {st2}, want 1 (SERVING)'
        expect_error(grpc.StatusCode.NOT_FOUND, lambda: health_check(srv.channel, "no.such.Service"))
        return "SERVING"

    check("g grpc.health.v1 Check", health)

    def metrics_counts():
        text = srv.metrics()
        req = parse_metric(text, "cortiq_requests_total")
        n_ia = sum(1 for _, code, _, _ in error_cases if code == IA)
        want = {("Generate", "OK"): 6, ("Generate", "INVALID_ARGUMENT"): n_ia,
                ("Generate", "NOT_FOUND"): 1, ("GetModelInfo", "OK"): 2,
                ("CreateSession", "INVALID_ARGUMENT"): 1, ("ReleaseSession", "OK"): 3}
        for (rpc, code), n in want.items():
            got = req.get(labels(rpc=rpc, code=code))
            assert got is not None and got >= n, (
                f'cortiq_requests_total{{rpc="{rpc}",code="{code}"}} is {got}, want >= {n}')
        return f"{len(req)} series; Generate OK={req[labels(rpc='Generate', code='OK')]:.0f}"

    check("metrics request counters", metrics_counts)

    def python_client():
        client = REPO / "client" / "python" / "cortiq_client.py"
        if not client.exists():
            return f"SKIP: {client} is absent"
        env = dict(os.environ, CORTIQ_PROTO_PY=ARGS.proto_py)
        env.pop("CORTIQ_TOKEN", None)
        r = subprocess.run(["/usr/bin/python3", str(client), "--server", srv.address, "generate",
                            "--max-tokens", "5", "Hello"], env=env, capture_output=True, timeout=60)
        out = r.stdout.decode("utf-8", "replace")
        assert r.returncode == 0, (f"exit {r.returncode}; stdout {out!r}; "
                                   f"stderr {r.stderr.decode('utf-8', 'replace')!r}")
        assert out.strip(), "printed nothing"
        return f"output {out.strip()[:120]!r}"

    check("1b client/python/cortiq_client.py generate", python_client)

    def sigterm():
        # A stream in flight when SIGTERM arrives ends with a summary (it
        # finishes within --grace, or is cancelled after it), new calls are
        # refused with UNAVAILABLE, and the process exits 0.
        call = stub.Generate(pb2.GenerateRequest(prompt=PROMPT, max_tokens=3000,
                                                 ignore_eos=True), timeout=60)
        first = next(call)
        assert first.WhichOneof("event") == "token", f"first event {first.WhichOneof('event')}"
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        notes = []
        try:
            list(stub.Generate(pb2.GenerateRequest(prompt=PROMPT, max_tokens=2), timeout=10))
            raise AssertionError("a Generate after SIGTERM succeeded")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, (
                f"Generate while draining: {e.code().name} {e.details()!r}, want UNAVAILABLE")
            notes.append("new Generate: UNAVAILABLE")
        try:
            st = health_check(srv.channel, "")
            assert st == 2, f"health while draining: status {st}, want 2 (NOT_SERVING)"
            notes.append("health NOT_SERVING")
        except grpc.RpcError as e:  # the server may already have stopped listening
            assert e.code() == grpc.StatusCode.UNAVAILABLE, f"health while draining: {e.code()}"
        msgs = list(call)
        assert msgs and msgs[-1].WhichOneof("event") == "summary", "in-flight stream: no summary"
        assert all(m.WhichOneof("event") == "token" for m in msgs[:-1])
        fr = msgs[-1].summary.finish_reason
        assert fr in (pb2.FINISH_REASON_LENGTH, pb2.FINISH_REASON_CANCELLED), f"finish_reason {fr}"
        notes.append(f"in-flight stream ended {pb2.FinishReason.Name(fr)} after "
                     f"{len(msgs)} messages")
        srv.close_channel()
        try:
            rc = srv.proc.wait(timeout=max(1.0, 15 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 15 s after SIGTERM") from None
        assert rc == 0, f"exit status {rc} after SIGTERM\n{srv.tail()}"
        return f"exit 0 after {time.monotonic() - t0:.2f} s; " + "; ".join(notes)

    check("i SIGTERM exits 0", sigterm)

    # (h) authentication, on a second server.
    def auth():
        a = Server("server-auth", model_dir,
                   ["--auth-token", "s3cret", "--grace", "2", "--max-context", "64"])
        try:
            good = (("authorization", "Bearer s3cret"),)
            bad = (("authorization", "Bearer wrong"),)
            out = []
            out.append(expect_error(grpc.StatusCode.UNAUTHENTICATED,
                                    lambda: a.stub.GetModelInfo(pb2.GetModelInfoRequest(),
                                                                timeout=RPC_TIMEOUT)))
            expect_error(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: a.stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT,
                                                     metadata=bad))
            expect_error(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: a.stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT,
                                                     metadata=(("authorization", "s3cret"),)))
            expect_error(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: a.stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT))
            expect_error(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: a.stub.Tokenize(pb2.TokenizeRequest(text="x"), timeout=RPC_TIMEOUT))
            out.append(expect_error(grpc.StatusCode.UNAUTHENTICATED,
                                    gen_call(a.stub, prompt=PROMPT, max_tokens=2)))
            expect_error(grpc.StatusCode.UNAUTHENTICATED,
                         gen_call(a.stub, metadata=bad, prompt=PROMPT, max_tokens=2))
            mi_ok = a.stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT, metadata=good)
            assert mi_ok.vocab_size > 0
            toks, s, _ = generate(a.stub, metadata=good, prompt=PROMPT, max_tokens=2, ignore_eos=True)
            assert len(toks) == 2 and s.usage.completion_tokens == 2, f"summary {s}"
            # (This server holds 64 positions: a request past them is refused.)
            mi64 = a.stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT, metadata=good)
            assert mi64.max_context == 64, f"--max-context 64: max_context {mi64.max_context}"
            out.append("context overflow: " + expect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                gen_call(a.stub, metadata=good, prompt_tokens=[1, 2], max_tokens=63), "context"))
            lst = a.stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT, metadata=good)
            assert len(lst.sessions) == 0
            a.close_channel()
            a.proc.send_signal(signal.SIGTERM)
            rc = a.proc.wait(timeout=15)
            assert rc == 0, f"auth server: exit {rc} after SIGTERM"
            return "; ".join(out) + "; with the token: OK"
        finally:
            if a.proc.poll() is None:
                a.proc.kill()

    check("h bearer-token auth", auth)

    # (j) tenants and roles from a token file, re-read on a real SIGHUP.
    def tenants():
        tokens = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab",
                  "carol": "carol-token-0123456789"}
        path = Path(ARGS.workdir) / "tokens"

        def write_tokens(names):
            path.write_text("# NAME ROLE TOKEN\n"
                            + "".join(f"{n} client {tokens[n]}\n" for n in names))
            path.chmod(0o600)

        def md(name):
            return (("authorization", f"Bearer {tokens[name]}"),)

        write_tokens(["alice", "bob"])
        t = Server("server-tenants", model_dir, ["--auth-tokens", str(path), "--grace", "0"])
        try:
            _, s, _ = generate(t.stub, metadata=md("alice"), prompt=PROMPT, max_tokens=2,
                               keep_session=True)
            sid = s.session_id
            info = t.stub.GetSession(pb2.GetSessionRequest(session_id=sid), timeout=RPC_TIMEOUT,
                                     metadata=md("alice"))
            assert info.tenant == "alice", f"tenant {info.tenant!r}"
            # bob: alice's session answers as an unknown id does.
            hidden = expect_error(grpc.StatusCode.NOT_FOUND, lambda: t.stub.GetSession(
                pb2.GetSessionRequest(session_id=sid), timeout=RPC_TIMEOUT, metadata=md("bob")))
            unknown_id = "0" * 32
            unknown = expect_error(grpc.StatusCode.NOT_FOUND, lambda: t.stub.GetSession(
                pb2.GetSessionRequest(session_id=unknown_id), timeout=RPC_TIMEOUT,
                metadata=md("bob")))
            assert hidden.replace(sid, "ID") == unknown.replace(unknown_id, "ID"), \
                f"{hidden!r} vs {unknown!r}"
            lst = t.stub.ListSessions(pb2.ListSessionsRequest(), timeout=RPC_TIMEOUT,
                                      metadata=md("bob"))
            assert len(lst.sessions) == 0, f"bob lists {len(lst.sessions)} sessions"
            denied = expect_error(grpc.StatusCode.PERMISSION_DENIED, lambda: t.stub.Drain(
                pb2.DrainRequest(), timeout=RPC_TIMEOUT, metadata=md("alice")), "Drain", "client")
            # SIGHUP: carol added, bob removed.
            write_tokens(["alice", "carol"])
            t.proc.send_signal(signal.SIGHUP)

            def carol_in():
                try:
                    t.stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT,
                                        metadata=md("carol"))
                    return True
                except grpc.RpcError:
                    return False
            assert poll(carol_in, 10), "carol's token does not work 10 s after SIGHUP"
            assert t.proc.poll() is None, "the server exited on SIGHUP"
            expect_error(grpc.StatusCode.UNAUTHENTICATED, lambda: t.stub.GetModelInfo(
                pb2.GetModelInfoRequest(), timeout=RPC_TIMEOUT, metadata=md("bob")))
            # Released by its tenant (a kept session would make the drain exit 3).
            rel = t.stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=sid),
                                        timeout=RPC_TIMEOUT, metadata=md("alice"))
            assert rel.released, "alice could not release her session"
            t.close_channel()
            t.proc.send_signal(signal.SIGTERM)
            rc = t.proc.wait(timeout=15)
            assert rc == 0, f"tenant server: exit {rc} after SIGTERM"
            log = t.log_path.read_text(errors="replace")
            assert "auth: reloaded" in log, "no reload line in the log"
            assert "tenant=alice role=client" in log, "no tenant/role in the request lines"
            leaked = [n for n, tok in tokens.items() if tok in log]
            assert not leaked, f"the log holds the token of {leaked}"
            return f"hidden = unknown ({unknown}); {denied}; SIGHUP: carol in, bob out"
        finally:
            if t.proc.poll() is None:
                t.proc.kill()

    check("j tenants, roles and SIGHUP", tenants)


def main():
    global ARGS, pb2, pb2_grpc, grpc
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--tool-bin", required=True)
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
    model_dir = work / "model"
    r = subprocess.run([ARGS.tool_bin, "mkmodel", "tiny", str(model_dir), "--seed", "1"],
                       capture_output=True, timeout=120)
    if r.returncode != 0 or not (model_dir / "tokenizer.json").exists():
        print(f"FAIL mkmodel: exit {r.returncode}\n{r.stderr.decode(errors='replace')}")
        return 1

    t0 = time.monotonic()
    try:
        run_checks(model_dir)
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
