"""The peer suite's streaming server: an OpenAI-style SSE endpoint on a raw asyncio Protocol that logs the
send time of every content chunk (monotonic ns, taken right before the write), so a client's receive
times on the same host can be compared with it.

    python bench/peers/server.py --port 18700 [--step-ms 0]

--step-ms 0: every loop pass writes the next chunk of every open stream (a zero-delay server: the client
is the bottleneck). --step-ms 10: one chunk per stream per 10 ms tick, all streams on the same tick (as an
engine's decode step does), so C streams' chunks leave together every tick.
--burst K (default 1): each pass writes the next K chunks of a stream in one write, all K logged with that
write's time (as a busy engine's server coalesces events); the server's cost per chunk falls about K-fold, so
on a machine where the server shares the clients' cores it stops being the limit of several clients.
--prerender: the whole response of a request (headers, all events in the same chunked framing, the last chunk)
is written in one transport.write when the request arrives, from a template rendered once per (tokens, chat,
keep-alive, digits of seq): the cheapest server per chunk (no per-chunk rendering, no pump), so on shared cores
the clients get nearly all the CPU. Every content chunk is logged with that write's time (its timestamp error
means nothing there: use the paced server for that). Pacing does not apply.

Requests: POST /v1/chat/completions or /v1/completions (JSON; max_tokens or max_completion_tokens,
ignore_eos is assumed), GET /v1/models, GET /health. HTTP/1.1 keep-alive unless the client says close;
responses are chunked, one HTTP chunk per SSE event: N content chunks (the last with finish_reason
"length"), one usage chunk (choices: []), [DONE]. Request identity: every request gets a serial number
`seq` (from 1), returned as usage.prompt_tokens and in the response id, so a client's per-request record
names the server request it is (every peer keeps the server's prompt token count).

GET /_log returns {"streams": {seq: {"arrive_ns", "sent_ns": [...]}}, "mono_ns", "wall_ns"} and clears it.
Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

MODEL = "peer-model"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\nconnection: %s\r\n\r\n"
)


class Stream:
    __slots__ = ("chat", "n", "proto", "sent", "seq")

    def __init__(self, proto: Conn, seq: int, n: int, chat: bool) -> None:
        self.proto, self.seq, self.n, self.chat = proto, seq, n, chat
        self.sent: list[int] = []


class Server:
    def __init__(self, step_s: float, burst: int = 1, prerender: bool = False) -> None:
        self.step_s, self.burst, self.prerender = step_s, burst, prerender
        self.templates: dict[tuple[int, bool, bool, int, int], bytes] = {}
        self.seq = 0
        self.active: list[Stream] = []
        self.log: dict[int, dict[str, Any]] = {}
        self._wake: asyncio.Event | None = None

    def start(self, proto: Conn, n: int, chat: bool) -> None:
        self.seq += 1
        s = Stream(proto, self.seq, n, chat)
        self.log[s.seq] = {"arrive_ns": time.monotonic_ns(), "sent_ns": s.sent}
        self.active.append(s)
        if self._wake is not None:
            self._wake.set()

    async def pump(self) -> None:
        """Write one chunk to every open stream per pass; a pass per tick (paced) or per loop turn."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        next_tick = loop.time()
        while True:
            if not self.active:
                self._wake.clear()
                await self._wake.wait()
                next_tick = loop.time() + self.step_s
            if self.step_s > 0:
                delay = next_tick - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_tick += self.step_s
            else:
                await asyncio.sleep(0)
            done = []
            for s in self.active:
                if s.proto.closed:
                    done.append(s)
                    continue
                if s.proto.paused:
                    continue  # the client is not reading: its socket buffer is full (backpressure)
                if self.burst > 1:
                    if self._burst(s):
                        done.append(s)
                    continue
                k = len(s.sent)
                last = k == s.n - 1
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
                if s.chat:
                    choice["delta"] = {"content": f" tok{k}"}
                else:
                    choice["text"] = f" tok{k}"
                obj = "chat.completion.chunk" if s.chat else "text_completion"
                ev = json.dumps(
                    {"id": f"r-{s.seq}", "object": obj, "model": MODEL, "choices": [choice]}, separators=(",", ":")
                )
                data = b"data: " + ev.encode() + b"\n\n"
                s.sent.append(time.monotonic_ns())
                s.proto.write_chunk(data)
                if last:
                    usage = json.dumps(
                        {
                            "id": f"r-{s.seq}",
                            "object": obj,
                            "model": MODEL,
                            "choices": [],
                            "usage": {"prompt_tokens": s.seq, "completion_tokens": s.n, "total_tokens": s.seq + s.n},
                        }
                    )
                    s.proto.write_chunk(b"data: " + usage.encode() + b"\n\n")
                    s.proto.write_chunk(b"data: [DONE]\n\n")
                    s.proto.finish()
                    done.append(s)
            if done:
                self.active = [s for s in self.active if s not in done]

    def _burst(self, s: Stream) -> bool:
        """The next `burst` chunks of `s` in one write; True when the stream is finished."""
        k0 = len(s.sent)
        k1 = min(s.n, k0 + self.burst)
        events = render_events(b"%d" % s.seq, b"%d" % (s.seq + s.n), s.n, s.chat, k0, k1)
        now = time.monotonic_ns()
        s.sent.extend([now] * (k1 - k0))
        s.proto.write_chunks(events)
        if k1 == s.n:
            s.proto.finish()
            return True
        return False

    def whole(self, proto: Conn, n: int, chat: bool) -> None:
        """--prerender: the whole response of a request (headers, every event, the last chunk) in one write,
        from a template rendered once per (n, chat, keep-alive, digits of seq and of seq + n); every content
        chunk is logged with that write's time."""
        self.seq += 1
        seq = self.seq
        arrive = time.monotonic_ns()
        seq_b, total_b = b"%d" % seq, b"%d" % (seq + n)
        key = (n, chat, proto.keep, len(seq_b), len(total_b))
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = response_template(n, chat, proto.keep, len(seq_b), len(total_b))
        data = template % {b"s": seq_b, b"t": total_b}
        now = time.monotonic_ns()
        self.log[seq] = {"arrive_ns": arrive, "sent_ns": [now] * n}
        assert proto.transport is not None
        proto.transport.write(data)
        proto.done()


def render_events(seq: bytes, total: bytes, n: int, chat: bool, k0: int, k1: int) -> list[bytes]:
    """The SSE events of content chunks k0..k1-1 of a stream of n (and, when k1 == n, the usage event and
    [DONE]), rendered by bytes formatting, byte for byte as the per-chunk path's json.dumps renders them;
    `seq` and `total` (seq + n) are spliced in as given."""
    obj, key = (
        (b"chat.completion.chunk", b'"delta":{"content":" tok%d"}')
        if chat
        else (b"text_completion", b'"text":" tok%d"')
    )
    head = b'data: {"id":"r-%s","object":"%s","model":"%s","choices":[{"index":0,"finish_reason":' % (
        seq,
        obj,
        MODEL.encode(),
    )
    events = [head + (b'"length",' if k == n - 1 else b"null,") + key % k + b"}]}\n\n" for k in range(k0, k1)]
    if k1 == n:
        usage = b'"usage": {"prompt_tokens": %s, "completion_tokens": %d, "total_tokens": %s}' % (seq, n, total)
        tail = b'{"id": "r-%s", "object": "%s", "model": "%s", "choices": [], %s}' % (seq, obj, MODEL.encode(), usage)
        events += [b"data: " + tail + b"\n\n", b"data: [DONE]\n\n"]
    return events


def response_template(n: int, chat: bool, keep: bool, seq_digits: int, total_digits: int) -> bytes:
    """A whole streamed response as a bytes %-template: %(s)b is seq, %(t)b is seq + n, of the given digits
    (the HTTP chunk sizes depend on them)."""
    conn = b"keep-alive" if keep else b"close"
    framed = [SSE_HEAD % conn]
    for ev in render_events(b"\x01", b"\x02", n, chat, 0, n):
        size = len(ev) + ev.count(b"\x01") * (seq_digits - 1) + ev.count(b"\x02") * (total_digits - 1)
        framed.append(b"%x\r\n%s\r\n" % (size, ev))
    framed.append(b"0\r\n\r\n")
    return b"".join(framed).replace(b"%", b"%%").replace(b"\x01", b"%(s)b").replace(b"\x02", b"%(t)b")


class Conn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep = True
        self.busy = False
        self.paused = False

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
            length = int(fields.get("content-length", "0"))
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, path = head[0].split(" ")[:2]
            self.keep = fields.get("connection", "").lower() != "close"
            self._handle(method, path.split("?")[0], body)

    def _reply(self, status: str, body: bytes, ctype: str = "application/json") -> None:
        assert self.transport is not None
        conn = b"keep-alive" if self.keep else b"close"
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n%s"
            % (status.encode(), ctype.encode(), len(body), conn, body)
        )
        if not self.keep:
            self.transport.close()

    def _handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/health":
            self._reply("200 OK", b'{"status":"ok"}')
        elif method == "GET" and path == "/v1/models":
            self._reply(
                "200 OK",
                json.dumps(
                    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "peer-suite"}]}
                ).encode(),
            )
        elif method == "GET" and path == "/_log":
            out = {"streams": self.server.log, "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}
            self.server.log = {}
            self._reply("200 OK", json.dumps(out).encode())
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            req = json.loads(body or b"{}")
            n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
            assert self.transport is not None
            self.busy = True
            if self.server.prerender:
                self.server.whole(self, max(n, 1), path.endswith("chat/completions"))
                return
            self.transport.write(SSE_HEAD % (b"keep-alive" if self.keep else b"close"))
            self.server.start(self, max(n, 1), path.endswith("chat/completions"))
        else:
            self._reply("404 Not Found", b'{"error":{"message":"not found"}}')

    def write_chunk(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def write_chunks(self, events: list[bytes]) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(b"%x\r\n%s\r\n" % (len(d), d) for d in events))

    def finish(self) -> None:
        assert self.transport is not None
        self.transport.write(b"0\r\n\r\n")
        self.done()

    def done(self) -> None:
        """The response is written: close, or take the next pipelined request."""
        assert self.transport is not None
        self.busy = False
        if not self.keep:
            self.transport.close()
        elif self.buf:
            self._next()


async def main(host: str, port: int, step_s: float, burst: int, prerender: bool) -> None:
    server = Server(step_s, burst, prerender)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Conn(server), host, port, backlog=1024)
    async with srv:
        await server.pump()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--burst", type=int, default=1, help="chunks of a stream per write (default 1)")
    ap.add_argument(
        "--prerender", action="store_true", help="each response whole, in one write (zero-delay only; --step-ms unused)"
    )
    ap.add_argument("--cpu", type=int, help="pin to this CPU")
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    asyncio.run(main(a.host, a.port, a.step_ms / 1000, max(1, a.burst), a.prerender))
