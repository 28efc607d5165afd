"""`StampedTransport`: the socket transport of one load-client exchange, on the event loop's reader and writer
callbacks, reading with recvmsg(2) so that every read carries the kernel's receive time (SO_TIMESTAMPNS).

Why: a chunk's time point was the moment the event loop got to the socket. With many streams ready at once
(C=64 streams on one decode step, say) the loop serves them one after another, and a read that became ready
while the loop was busy with others waited for the next pass: the time points then measured the client's
own backlog, which grows as its core fills. The kernel stamps each segment when it arrives; recvmsg hands
the stamp of the newest segment a read consumed, so a read's time point is when its last byte reached this
host, however late the loop reads it. (For TCP, Linux supports SO_TIMESTAMPNS on receive; tcp_recvmsg reports
the stamp of the last segment read.)

The stamp is on CLOCK_REALTIME; it is moved onto CLOCK_MONOTONIC (the client's clock for every other time) with
the two clocks read together at each read (`realtime_offset`: the wall clock between two monotonic reads, the
narrowest of a few tries, so a preemption between the reads on a busy host does not shift the stamp), and kept
only when plausible: not later than that read, not more
than MAX_AGE_NS older, and not earlier than the connection's previous one; otherwise (no stamp, a clock step)
the read's own monotonic time is used, as before.

The transport does what the exchange needs of asyncio's socket transport and nothing more: write (at once,
the rest when the socket is writable), pause and resume reading, close (after pending writes), abort, and
end of stream (`eof_received`, then close). TCP_NODELAY is set, as asyncio sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from typing import Protocol

MAX_READ = 256 * 1024  # bytes per read, as asyncio's socket transport reads
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value where the socket module lacks the name
_CMSG_SPACE = socket.CMSG_SPACE(16)  # one struct timespec
_TIMESPEC = struct.Struct("qq")
MAX_AGE_NS = 60_000_000_000  # a stamp older than a minute at its read is taken for a clock step, not kept
TIGHT_NS = 20_000  # two monotonic reads this close around the wall clock's read: no preemption between them
OFFSET_TRIES = 4


def realtime_offset() -> tuple[int, int]:
    """(CLOCK_REALTIME minus CLOCK_MONOTONIC, the monotonic time of the read): the wall clock read between two
    monotonic reads and set against their midpoint, the narrowest bracket of OFFSET_TRIES (the first under
    TIGHT_NS ends the tries). One plain pair of reads is off by however long the thread was preempted between
    them, and a loaded 2-core host preempts for tenths of a millisecond."""
    best_width, best = -1, (0, 0)
    for _ in range(OFFSET_TRIES):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best_width < 0 or after - before < best_width:
            best_width, best = after - before, (wall - (before + after) // 2, after)
        if best_width < TIGHT_NS:
            break
    return best


class Receiver(Protocol):
    """What the transport calls: the exchange of caseledger.load.fast."""

    def connection_made(self, transport: StampedTransport) -> None: ...
    def stamped_data(self, data: bytes, rx_ns: int) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...


class StampedTransport:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, receiver: Receiver) -> None:
        self._loop, self._sock, self._receiver = loop, sock, receiver
        self._fd = sock.fileno()
        self._out = bytearray()
        self._closing = False
        self._ended = False  # connection_lost is scheduled (once)
        self._reading = True
        self._last_ns = 0
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # no kernel stamps here: every read takes its own monotonic time
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        receiver.connection_made(self)
        loop.add_reader(self._fd, self._read_ready)

    # ---- reading ----------------------------------------------------------------------------------

    def _read_ready(self) -> None:
        try:
            data, ancdata, _, _ = self._sock.recvmsg(MAX_READ, _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._force_close(e)
            return
        if not data:
            self._stop_reading()
            if not self._receiver.eof_received():
                self.close()
            return
        self._receiver.stamped_data(data, self._stamp(ancdata))

    def _stamp(self, ancdata: list[tuple[int, int, bytes]]) -> int:
        rx = None
        for level, kind, blob in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(blob) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(blob)
                offset, now = realtime_offset()
                mono = sec * 1_000_000_000 + nsec - offset
                rx = mono if max(self._last_ns, now - MAX_AGE_NS) <= mono <= now else now
        self._last_ns = time.monotonic_ns() if rx is None else rx
        return self._last_ns

    def pause_reading(self) -> None:
        if not self._closing:
            self._stop_reading()

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._read_ready)

    # ---- writing and closing ----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        if not self._out:
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._force_close(e)
                return
            if n == len(data):
                return
            data = data[n:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._out += data

    def _write_ready(self) -> None:
        try:
            n = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._force_close(e)
            return
        del self._out[:n]
        if not self._out:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._end(None)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close once pending writes are out (the receiver hears connection_lost(None) on a later pass)."""
        if self._closing:
            return
        self._closing = True
        self._stop_reading()
        if not self._out:
            self._end(None)

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        """Close now, dropping pending writes (abort, or a socket error: the receiver hears it)."""
        self._closing = True
        self._stop_reading()
        if self._out:
            self._out.clear()
            self._loop.remove_writer(self._fd)
        self._end(exc)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _end(self, exc: Exception | None) -> None:
        """connection_lost on the next pass, once (as asyncio calls it), then the socket is closed."""
        if not self._ended:
            self._ended = True
            self._loop.call_soon(self._lost, exc)

    def _lost(self, exc: Exception | None) -> None:
        try:
            self._receiver.connection_lost(exc)
        finally:
            self._sock.close()


async def connect(loop: asyncio.AbstractEventLoop, host: str, port: int, receiver: Receiver) -> StampedTransport:
    """Connect to host:port (each address in turn, as asyncio.create_connection does without happy eyeballs)
    and wrap the socket. OSError when no address connects: the error of the only one, or all of them."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, addr)
        except OSError as e:
            sock.close()
            errors.append(e)
            continue
        except BaseException:
            sock.close()
            raise
        return StampedTransport(loop, sock, receiver)
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"Multiple exceptions: {', '.join(str(e) for e in errors)}")
