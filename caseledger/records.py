"""Raw per-request records: the record of truth written by the load client and read by the processor.

One orjson line per finished request (success or failure) in `load/raw.jsonl`, appended and flushed as
each request ends, so a kill loses at most the requests in flight. A torn last line is tolerated and
reported by `read_records`. Times are `time.monotonic_ns()` of the load client's host; `load/anchor.json`
holds one wall-clock anchor {"wall_utc": ISO-8601, "mono_ns": int} taken at load start.

`read_jsonl` is the generic JSONL reader behind `read_records` and `caseledger.ledger.read_events`: lines
that parse are kept, a torn last line (no newline, does not parse) is reported, other bad lines are counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import orjson

# Names and bounds every layer spells the same (the case schema, the metrics, the CLI's choices, the MCP server's
# published schemas), here because this module is light enough for any process to import.
# A scenario name is a path segment (caseledger://scenarios/NAME, file names) and a command-line word: it starts
# with a letter or digit, so '.', '..' and option-like '-rf' are never names
SCENARIO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"

NativeRule = Literal["aisbench", "sglang"]
"""A rule that selects the native (steady-state) window."""
RATIO_MIN_EXCLUSIVE = 0.0
"""The sglang rule's ratio (share of peak concurrency) is > this ..."""
RATIO_MAX = 1.0
"""... and <= this: RATIO_MIN_EXCLUSIVE < ratio <= RATIO_MAX."""

PHASE_HEADER = "x-caseledger-phase"  # every request caseledger sends names its phase (load, warmup, ...)
RUN_HEADER = "x-caseledger-run"  # and the run it belongs to: a server (or its logs) can tell its owners apart

ErrorClass = Literal["http", "timeout", "connection", "stream", "incomplete", "client"]


class RawRecord(TypedDict):
    i: int  # formal request index 0..N-1 (plan order)
    entry: int  # dataset entry index
    route: int  # endpoint index in case.target.endpoints
    send_ns: int  # monotonic ns just before the request was written
    chunk_ns: list[int]  # arrival of every content-bearing chunk (non-empty text), monotonic ns
    chunk_tokens: list[int | None]  # tokens each content chunk carried, where known (continuous usage)
    end_ns: int  # monotonic ns when the response ended ([DONE], close or error)
    status: int | None  # HTTP status; None when no response arrived
    ok: bool  # finished with a finish_reason and no error
    error: str | None  # short error text
    error_class: ErrorClass | None
    prompt_tokens: int | None  # from server usage
    completion_tokens: int | None  # from server usage
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens
    finish_reason: str | None
    input_tokens_body: int | None  # from the dataset identity (what we built)
    input_tokens_chat: int | None  # chat-template tokens from the dataset identity
    # what the request's body asked for (max_tokens): its completion_tokens is checked against it. Absent from
    # records written before it was kept and from imported ones (the case's bound is used there)
    max_tokens: NotRequired[int]
    # Speculative decoding as the engine reported it for this request (absent or None: not reported).
    # llama.cpp (and the reference target) put cumulative `timings.draft_n` / `timings.draft_n_accepted`
    # in the last chunk beside usage, and on every chunk when the request asks `timings_per_token`.
    spec_draft_tokens: NotRequired[int | None]  # draft tokens proposed (final timings.draft_n)
    spec_accepted_tokens: NotRequired[int | None]  # draft tokens accepted (final timings.draft_n_accepted)
    # one [drafted, accepted] pair per verify step, in order: a step starts at each chunk whose cumulative
    # draft_n rose; None when no chunk before the last carried draft counts
    spec_steps: NotRequired[list[list[int]] | None]
    # A scheduled load (a rate, or a replayed trace): when the request was due, on send_ns's clock (the load's
    # start + its planned offset); send_ns - sched_ns is its arrival error. Absent when requests leave as fast
    # as concurrency allows.
    sched_ns: NotRequired[int]
    # Source 'trace': the request's row in the trace file and the chat tokens of its prompt an earlier request
    # planned to share (the chat-template head, the first word and salt slot, the blocks seen before)
    trace_row: NotRequired[int]
    planned_shared_tokens: NotRequired[int]
    # dataset.sessions: turn `turn` (0-based) of conversation `session`, which has `turns` turns; `reply` the
    # reply's content as streamed (the next turn sends it back as the assistant message). planned_shared_tokens is
    # then the conversation's history as the server counted it after the previous turn: its prompt_tokens +
    # completion_tokens (absent for turn 0, or when the server reported no usage)
    session: NotRequired[int]
    turn: NotRequired[int]
    turns: NotRequired[int]
    reply: NotRequired[str]


@dataclass
class ReadResult:
    records: list[RawRecord] = field(default_factory=list)
    torn_tail: bool = False  # the last line was cut mid-write (crash) and was skipped
    bad_lines: int = 0  # lines that failed to parse before the last one


@dataclass
class JsonLines:
    """The parsed lines of one JSONL file, with what had to be skipped."""

    items: list[Any] = field(default_factory=list)  # every line that parsed, in file order
    torn_tail: bool = False  # the last line was cut mid-write (no newline, does not parse) and was skipped
    bad_lines: int = 0  # other lines that failed to parse (skipped)


def iter_lines(path: Path) -> Iterator[tuple[bool, bytes]]:
    """(is_last, line) for every non-empty line; is_last only for a final line without its newline."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    for n, line in enumerate(lines):
        if not line:
            continue
        last = n == len(lines) - 1 and not complete
        yield last, line


def read_jsonl(path: Path) -> JsonLines:
    """Every parsable line of a JSONL file (a missing file is empty); a torn last line or a bad line never raises."""
    out = JsonLines()
    if not path.exists():
        return out
    for last, line in iter_lines(path):
        try:
            obj: Any = orjson.loads(line)
        except orjson.JSONDecodeError:
            if last:
                out.torn_tail = True
            else:
                out.bad_lines += 1
            continue
        out.items.append(obj)
    return out


def read_records(path: Path) -> ReadResult:
    """All complete records of a raw file; a torn last line is reported, never fatal."""
    lines = read_jsonl(path)
    return ReadResult(records=lines.items, torn_tail=lines.torn_tail, bad_lines=lines.bad_lines)
