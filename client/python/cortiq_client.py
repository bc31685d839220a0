#!/usr/bin/env python3
"""Example Python client of Cortiq Serve (cortiq.v1.Inference).

Runs with Debian's python3-grpcio and python3-protobuf (/usr/bin/python3). The
generated modules (cortiq/v1/inference_pb2.py, inference_pb2_grpc.py) come from
the build target cortiq_proto_python; CORTIQ_PROTO_PY names the directory that
holds them (default: <repo>/build/proto/python).

Command line:
  cortiq_client.py [--server H:P] [--token T] generate [--max-tokens N]
                   [--temperature F] [--seed N] [--keep] PROMPT
  cortiq_client.py [--server H:P] [--token T] model
  cortiq_client.py [--server H:P] [--token T] release ID

As a library:
  import cortiq_client as cc
  stub = cc.make_stub("127.0.0.1:50051")
  gen = cc.generate(stub, "Hello", max_tokens=16, temperature=0.7,
                    metadata=cc.auth_metadata(token))
  for token_id, text in cc.iter_with_summary(gen, on_summary=print):
      print(text, end="", flush=True)
  # (inside a generator: `summary = yield from cc.generate(...)`)

Exit status: 0 success, 1 server error (`error: CODE: details` on stderr),
2 usage error.
"""

import argparse
import json
import os
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_PROTO_PY = os.environ.get("CORTIQ_PROTO_PY", str(_REPO / "build" / "proto" / "python"))
if _PROTO_PY not in sys.path:
    sys.path.insert(0, _PROTO_PY)

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402

try:
    from cortiq.v1 import inference_pb2 as pb2  # noqa: E402
    from cortiq.v1 import inference_pb2_grpc as pb2_grpc  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the build tree
    raise ImportError(
        f"cannot import cortiq.v1.inference_pb2 from {_PROTO_PY} ({e}); build the "
        "cortiq_proto_python target or point CORTIQ_PROTO_PY at the generated modules") from e

# GenerateRequest.sampling fields; each is sent only when given (not None).
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")


def make_stub(server="127.0.0.1:50051", tls=False, root_certificates=None):
    """An Inference stub on a new channel (insecure unless tls)."""
    if tls:
        channel = grpc.secure_channel(server, grpc.ssl_channel_credentials(root_certificates))
    else:
        channel = grpc.insecure_channel(server)
    return pb2_grpc.InferenceStub(channel)


def auth_metadata(token):
    """The call metadata for a bearer token (None or "" = no token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def generate(stub, prompt, *, metadata=(), timeout=None, max_tokens=64, **kw):
    """Streams one generation: yields (token_id, text) per token and returns the
    GenerateSummary (the generator's return value, e.g. `summary = yield from ...`).

    prompt: a str, or a list of token ids. Keyword arguments: the sampling
    fields (temperature, top_k, top_p, min_p, repetition_penalty, seed; None =
    the server's default) and any other GenerateRequest field (stop=[...],
    session_id=..., keep_session=True, session_config=pb2.SessionConfig(...)).
    Raises grpc.RpcError for a failed call and RuntimeError for a stream that
    ends without a summary.
    """
    sampling = {k: kw.pop(k) for k in _SAMPLING_FIELDS if k in kw}
    sampling = {k: v for k, v in sampling.items() if v is not None}
    request = pb2.GenerateRequest(max_tokens=max_tokens, **kw)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_tokens.extend(prompt)
    if sampling:
        request.sampling.CopyFrom(pb2.SamplingParams(**sampling))

    summary = None
    for response in stub.Generate(request, metadata=metadata, timeout=timeout):
        event = response.WhichOneof("event")
        if event == "token":
            yield response.token.token_id, response.token.text
        elif event == "summary":
            summary = response.summary
    if summary is None:
        raise RuntimeError("stream ended without a summary")
    return summary


def iter_with_summary(gen, on_summary):
    """Iterates a generate() generator and hands its summary to on_summary."""
    summary = yield from gen
    on_summary(summary)


def _to_json(message, indent=None):
    return json_format.MessageToJson(message, preserving_proto_field_name=True,
                                     including_default_value_fields=True, indent=indent)


def _cmd_generate(stub, metadata, args):
    gen = generate(stub, args.prompt, metadata=metadata, max_tokens=args.max_tokens,
                   temperature=args.temperature, seed=args.seed, keep_session=args.keep)
    summary = None

    def keep(s):
        nonlocal summary
        summary = s

    for _, text in iter_with_summary(gen, keep):
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(_to_json(summary), file=sys.stderr)
    return 0


def _cmd_model(stub, metadata, _args):
    print(_to_json(stub.GetModelInfo(pb2.GetModelInfoRequest(), metadata=metadata), indent=2))
    return 0


def _cmd_release(stub, metadata, args):
    r = stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=args.id), metadata=metadata)
    print(f"released {r.freed_bytes} bytes" if r.released else "not found (already released)")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description="Example client of Cortiq Serve.")
    p.add_argument("--server", default=os.environ.get("CORTIQ_SERVER") or "127.0.0.1:50051",
                   help="HOST:PORT (env CORTIQ_SERVER)")
    p.add_argument("--token", default=os.environ.get("CORTIQ_TOKEN"),
                   help="bearer token (env CORTIQ_TOKEN)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="stream a generation")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--keep", action="store_true", help="keep the session after the call")
    g.add_argument("prompt")
    g.set_defaults(run=_cmd_generate)
    sub.add_parser("model", help="the served model").set_defaults(run=_cmd_model)
    r = sub.add_parser("release", help="release a session")
    r.add_argument("id")
    r.set_defaults(run=_cmd_release)
    args = p.parse_args(argv)
    if args.command == "generate":
        if args.max_tokens < 1:
            p.error("--max-tokens must be at least 1")
        if args.seed is not None and args.seed < 0:
            p.error("--seed must not be negative")

    stub = make_stub(args.server)
    try:
        return args.run(stub, auth_metadata(args.token), args)
    except grpc.RpcError as e:
        print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
