"""Incremental SSE splitting (pure): raw response bytes in, the data payload of every complete event out.

`SSEParser` sits above the transport seam (load/transport.py), so every Streamer's bytes are split alike;
an event larger than load.max_event_bytes raises `EventTooLarge`.
"""

from __future__ import annotations

from caseledger.case.bounds import DEFAULT_MAX_EVENT_BYTES

LONG_LINE = 2**16  # a data line held longer than this has its value cut out in place; shorter ones take the loop


class EventTooLarge(Exception):
    """One SSE event grew past max_event_bytes: its request fails as a broken stream (class 'stream').

    `events`: the complete events ahead of it in the same read, which count as they would in any split.
    """

    def __init__(self, message: str, events: list[bytes]) -> None:
        super().__init__(message)
        self.events = events


class SSEParser:
    """Incremental SSE splitter: feed raw bytes, get the data payload of every complete event.

    Linear in the bytes fed: what is held is the unfinished line, with no newline in it (so the scan of each
    read starts at the read, never again at held bytes), and the data values of the pending event. The line
    is the rest of the last read as it came or, once it spans reads, a bytearray it grows in place.

    The size of a pending event is its payload so far (data values joined by newlines) plus the unfinished
    line (less a 'data:' field name and a trailing carriage return); past `max_event_bytes` the parser
    raises EventTooLarge and drops what it held, so it never holds more than the maximum (and a field name)
    plus one read. That size only grows with the position in the stream, so whether an event is too large
    does not depend on where the reads split it. After EventTooLarge the stream cannot be resynchronised:
    every later feed raises it.
    """

    __slots__ = ("_data", "_failed", "_fast_max", "_line", "_size", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._line: bytes | bytearray = b""  # the unfinished line
        self._data: list[bytes] = []  # data values of the pending event
        self._size = 0  # its payload's bytes: the values and the newlines that will join them
        self._failed: str | None = None  # set once an event was too large: the rest of the stream is lost
        self._fast_max = max_event_bytes + len(b"data: \n\n")  # the longest read the fast path takes; -1: lost

    def feed(self, chunk: bytes) -> list[bytes]:
        # fast path, the usual read: exactly one complete 'data: ...\n\n' event (not '\r\n\n'), nothing pending
        if (
            not self._line
            and not self._data
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk.endswith(b"\n\n")
            and chunk.startswith(b"data: ")
            and chunk[-3] != 13
            and len(chunk) <= self._fast_max
        ):
            return [chunk[6:-2]]
        if self._failed is not None:
            raise EventTooLarge(self._failed, [])
        lines = chunk.split(b"\n")
        tail = lines.pop()
        held = self._line
        if held:
            if not lines:  # still no end of line: it grows in place, only this read is scanned
                if isinstance(held, bytes):
                    held = self._line = bytearray(held)
                held += tail
                if self._size + len(held) > self.max_event_bytes:  # near the maximum: measure it exactly
                    self._check_held([])
                return []
            if isinstance(held, bytearray) and len(held) > LONG_LINE and held.startswith(b"data:"):
                held += lines[0]
                self._held_data(held)
                del lines[0]
            else:  # the rest of one read, or a short line: joined as it is
                lines[0] = (held if isinstance(held, bytes) else bytes(held)) + lines[0]
            self._line = b""
        out: list[bytes] = []
        data, size, limit = self._data, self._size, self.max_event_bytes
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:  # blank line: dispatch the event
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
                size = 0
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b" ", 5) else line[5:]
                size += len(value) + (1 if data else 0)
                if size > limit:
                    self._fail(out)
                data.append(value)
            elif size + len(line) > limit:  # checked as while it was held, so splits cannot matter
                self._fail(out)
            # event:, id:, retry: and ':' comments carry nothing we record
        self._size = size
        if tail:
            self._line = tail
            if size + len(tail) > limit:
                self._check_held(out)
        return out

    @property
    def held_bytes(self) -> int:
        """Bytes held between reads: the unfinished line and the pending event's data values."""
        return len(self._line) + self._size

    def _held_data(self, held: bytearray) -> None:
        """The unfinished line, now complete, is a long data line: its value joins the pending event, as in
        feed's loop, but cut out of the buffer in place (one copy of it, not two)."""
        if held.endswith(b"\r"):
            del held[-1]
        del held[: 6 if held.startswith(b" ", 5) else 5]  # deleting a bytearray's head is O(1)
        self._size += len(held) + (1 if self._data else 0)
        if self._size > self.max_event_bytes:
            self._fail([])
        self._data.append(bytes(held))

    def _check_held(self, out: list[bytes]) -> None:
        """Fail when the pending event with the unfinished line is already too large; the line is measured as
        it will count once complete, never more, so a split cannot fail an event that fits whole (feed calls
        this only when the line's whole length would pass the maximum: that bounds the exact measure)."""
        held = self._line
        n = len(held) - (held[-1] == 13)  # a trailing \r may be the first byte of the line's \r\n
        if held.startswith(b"data:"):  # its value, and the newline joining it to the event's data
            n += (1 if self._data else 0) - (6 if held.startswith(b"data: ") else 5)
        elif b"data:".startswith(held):  # may become a data line: its field name will not count
            n = 0
        if self._size + n > self.max_event_bytes:
            self._fail(out)

    def _fail(self, out: list[bytes]) -> None:
        self._line, self._fast_max = b"", -1
        self._data, self._size = [], 0
        self._failed = (
            f"SSE event exceeds {self.max_event_bytes:,} bytes (load.max_event_bytes); raise it if "
            "the server sends events this large"
        )
        raise EventTooLarge(self._failed, out)

    def close(self) -> list[bytes]:
        """Events left when the body ends without a final blank line."""
        out = self.feed(b"\n\n") if self._line or self._data else []
        self._line = b""
        return out
