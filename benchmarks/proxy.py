"""Proxy benchmark: what the recording proxy adds to one model call (issue 31: ≤ 5 ms p50).

    python benchmarks/proxy.py              # 400 calls each way
    python benchmarks/proxy.py --quick      # 60 calls each way
    python benchmarks/proxy.py --calls 1000 --json out.json

The upstream is a minimal OpenAI-compatible server on 127.0.0.1 (opencode_tui_core.model._http's server, the one
the scripted model uses): ``POST /v1/chat/completions`` answered with a streamed chat completion
(role, three content deltas, a finish reason, usage, ``[DONE]``) at once, whatever was asked. In front
of it, the recording proxy as an episode runs it (core/model/endpoint.py): a record directory
(``model_calls.jsonl`` appended per call), this run's access token, a Unix socket and 127.0.0.1, an
``on_call`` consumer. Both live on this process's event loop, as the scripted model and the proxy do
in an episode.

The client is a separate process (so its own work is not on the servers' loop): one keep-alive
connection to each target, a request body of an agent call OpenCode really sent (~30 KB, from the
hello-file fixture run), calls alternating direct → upstream, proxy (TCP) → upstream, proxy (Unix
socket) → upstream. Measured per call from the last byte of the request sent: the first byte of the
response and the end of the stream. Added latency = p50 through the proxy (TCP) - p50 direct;
ratio = p50 through / p50 direct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench as B

B.setup()

TARGET_MS = 5.0
# Between calls: the proxy writes a call's record after its last byte went out; OpenCode, too, takes a
# while before its next call. Without the pause a call would pay for the previous one's record.
GAP_S = 0.03
FIXTURE = B.ROOT / "tests" / "fixtures" / "runs" / "hello-file" / "model_calls.jsonl"


def request_body() -> bytes:
    """The first agent call of the fixture run (its real size and shape), asked to stream."""
    for line in FIXTURE.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "agent" and isinstance(rec.get("request_body"), dict):
            body = dict(rec["request_body"])
            body["stream"] = True
            return json.dumps(body).encode()
    raise RuntimeError(f"no agent call with a JSON body in {FIXTURE}")


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def canned_stream() -> tuple[bytes, bytes]:
    """(first event, the rest): a chat completion stream as a model sends it."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    first = _sse(chunk({"role": "assistant", "content": ""}))
    rest = b"".join(
        [
            *(_sse(chunk({"content": w})) for w in ("Hello", " from", " the bench.")),
            _sse(chunk({}, "stop")),
            _sse({**base, "choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 4}}),
            b"data: [DONE]\n\n",
        ]
    )
    return first, rest


class Upstream:
    """The minimal OpenAI-compatible upstream (one canned stream for every request)."""

    def __init__(self) -> None:
        from opencode_tui_core.model._http import HttpServer

        self.first, self.rest = canned_stream()
        self.server = HttpServer(self._handle, name="bench-upstream")
        self.served = 0

    async def _handle(self, req: Any, reader: Any, writer: asyncio.StreamWriter) -> bool:
        from opencode_tui_core.model._http import LAST_CHUNK, chunk_bytes, head_bytes, send_simple

        if req.method != "POST":
            await send_simple(writer, 404, {"error": {"message": "not found"}})
            return True
        self.served += 1
        headers = [
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-cache"),
            ("Transfer-Encoding", "chunked"),
        ]
        writer.write(head_bytes(200, headers) + chunk_bytes(self.first))
        await writer.drain()
        writer.write(chunk_bytes(self.rest) + LAST_CHUNK)
        await writer.drain()
        return True

    async def start(self) -> str:
        await self.server.start("127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.port}/v1"


# ---- the client (a separate process) --------------------------------------------------------------


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[float, float]:
    """Read one chunked response; (first byte, end) perf_counter stamps. ``buf`` keeps extra bytes."""
    first = None
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        if first is None:
            first = time.perf_counter()
        buf.extend(data)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    buf[:] = rest
    status = head.split(b" ", 2)[1]
    if status != b"200":
        raise RuntimeError(f"status {status!r}: {head[:300]!r}")
    while True:  # chunked body, to its last chunk
        while b"\r\n" not in buf:
            buf.extend(sock.recv(65536))
        size_line, _, rest = bytes(buf).partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            rest += sock.recv(65536)
        buf[:] = rest[size + 2 :]
        if size == 0:
            break
    assert first is not None
    return first, time.perf_counter()


def client_main(spec: dict[str, Any]) -> None:
    """``--client``: the calls, alternating targets; prints one JSON object of per-target samples."""
    body = Path(spec["body"]).read_bytes()
    conns: dict[str, tuple[socket.socket, bytearray]] = {}
    for name, target in spec["targets"].items():
        if target.get("unix"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(target["unix"])
        else:
            s = socket.create_connection((target["host"], target["port"]))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns[name] = (s, bytearray())
    out: dict[str, dict[str, list[float]]] = {n: {"first_byte": [], "total": []} for n in conns}
    for i in range(spec["warmup"] + spec["calls"]):
        for name, (s, buf) in conns.items():
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                f"Authorization: Bearer {spec['token']}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            time.sleep(spec["gap_s"])  # the servers idle again (the proxy records a call after answering it)
            s.sendall(head + body)
            sent = time.perf_counter()
            first, end = _read_response(s, buf)
            if i >= spec["warmup"]:
                out[name]["first_byte"].append(first - sent)
                out[name]["total"].append(end - sent)
    for s, _ in conns.values():
        s.close()
    print(json.dumps(out), flush=True)


# ---- the benchmark ------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def measure(calls: int, warmup: int) -> dict[str, Any]:
    from opencode_tui_core.model.proxy import ModelProxy

    upstream = Upstream()
    url = await upstream.start()
    tmp = Path(tempfile.mkdtemp(prefix="octui-bench-proxy-"))
    token = "bench-" + os.urandom(8).hex()
    events: list[Any] = []
    proxy = await ModelProxy(
        url,
        record_dir=tmp / "run",
        on_call=events.append,
        unix_path=tmp / "model.sock",
        access_token=token,
    ).start()
    (tmp / "body.json").write_bytes(request_body())
    spec = {
        "body": str(tmp / "body.json"),
        "token": token,
        "calls": calls,
        "warmup": warmup,
        "gap_s": GAP_S,
        "targets": {
            "direct": {"host": "127.0.0.1", "port": upstream.server.port},
            "proxy_tcp": {"host": "127.0.0.1", "port": proxy.port},
            "proxy_unix": {"unix": proxy.unix_path},
        },
    }
    cpu0 = time.process_time()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            json.dumps(spec),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 600)
        if proc.returncode != 0:
            raise RuntimeError(f"the client failed (rc {proc.returncode}): {err.decode()[-800:]}")
        samples = json.loads(out)
    finally:
        cpu = time.process_time() - cpu0
        await proxy.close()
        await upstream.server.close()
        recorded = len((tmp / "run" / "model_calls.jsonl").read_text().splitlines())
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    per_call_total = 3 * (calls + warmup)
    return {
        "samples": samples,
        "recorded_calls": recorded,
        "events": len(events),
        "upstream_served": upstream.served,
        # The servers' process: upstream for every call, proxy for two thirds of them.
        "server_cpu_ms_per_call": cpu / per_call_total * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, help="measured calls per target (default 400, --quick 60)")
    p.add_argument("--client", help=argparse.SUPPRESS)
    B.add_common_args(p)
    args = p.parse_args(argv)
    if args.client:
        client_main(json.loads(args.client))
        return 0
    calls = args.calls or (60 if args.quick else 400)
    warmup = 10
    meta = {"calls": calls, "warmup": warmup, "loadavg_start": B.loadavg(), "cpus": os.cpu_count()}
    rep = B.Report("proxy", args.json, meta)
    rep.say(f"proxy benchmark: {calls} calls each, direct vs through the recording proxy (TCP, Unix socket)")
    started = time.monotonic()
    res = asyncio.run(measure(calls, warmup))
    s = res["samples"]
    rows = []
    p50: dict[str, dict[str, float | None]] = {}
    for name, label in (
        ("direct", "direct → upstream"),
        ("proxy_tcp", "proxy (TCP) → upstream"),
        ("proxy_unix", "proxy (Unix socket) → upstream"),
    ):
        fb, tot = s[name]["first_byte"], s[name]["total"]
        p50[name] = {"first_byte": B.med(fb), "total": B.med(tot)}
        rows.append(
            [
                label,
                B.fmt_s(B.med(fb)),
                B.fmt_s(pct(fb, 0.9)),
                B.fmt_s(B.med(tot)),
                B.fmt_s(pct(tot, 0.9)),
            ]
        )
    rep.say(B.table(["path", "first byte p50", "p90", "whole stream p50", "p90"], rows))
    d = p50["direct"]["first_byte"]
    added = {
        k: (None if p50[k]["first_byte"] is None or d is None else p50[k]["first_byte"] - d)  # type: ignore[operator]
        for k in ("proxy_tcp", "proxy_unix")
    }
    added_ms = None if added["proxy_tcp"] is None else added["proxy_tcp"] * 1000
    ratio = B.ratio(p50["proxy_tcp"]["first_byte"], d)
    rep.data.update(
        {
            "p50": p50,
            "samples": s,
            "proxy_added_ms_p50": added_ms,
            "proxy_added_ms_p50_unix": None if added["proxy_unix"] is None else added["proxy_unix"] * 1000,
            "proxy_first_byte_ratio": ratio,
            "target_ms": TARGET_MS,
            "recorded_calls": res["recorded_calls"],
            "server_cpu_ms_per_call": res["server_cpu_ms_per_call"],
        }
    )
    rep.say(
        f"proxy_added_ms_p50 {added_ms:.2f} ms (Unix socket {rep.data['proxy_added_ms_p50_unix']:.2f} ms; "
        f"target <= {TARGET_MS:.0f} ms); first byte through / direct {B.fmt_ratio(ratio)}; "
        f"{res['recorded_calls']} calls recorded; servers' CPU {res['server_cpu_ms_per_call']:.2f} ms per call"
    )
    rep.say(f"load average at start {meta['loadavg_start']}, now {B.loadavg()}")
    rep.say(f"total run time {time.monotonic() - started:.0f} s")
    rep.finish()
    expected = 2 * (calls + warmup)
    if res["recorded_calls"] != expected:
        rep.say(f"the proxy recorded {res['recorded_calls']} calls, not {expected}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
