"""The load client: schedule the formal requests of a run, send them, record raw per-request data.

`schedule` (pure: case + entries + salt -> request specs), `client` (the async engine behind one HTTP
seam: `transport`, `fast`), `sse` and `chunks` (a response's bytes -> events -> its record), `auth`
(headers, the API key), `sessions` (multi-turn conversations over it), `__main__` (the detached formal
load, `python -m caseledger.load RUN`; what it writes as it runs: `recording`), `parts` (one load over
several processes).
"""

from caseledger.load.client import request_one, run_requests
from caseledger.load.schedule import (
    RequestSpec,
    Schedule,
    arrival_offsets,
    build_schedule,
    request_body,
    request_url,
    schedule_from_run_dir,
)
from caseledger.load.sessions import run_sessions
from caseledger.load.sse import EventTooLarge, SSEParser
from caseledger.load.transport import HttpxStreamer, Streamer, StreamResponse

__all__ = [
    "EventTooLarge",
    "HttpxStreamer",
    "RequestSpec",
    "SSEParser",
    "Schedule",
    "StreamResponse",
    "Streamer",
    "arrival_offsets",
    "build_schedule",
    "request_body",
    "request_one",
    "request_url",
    "run_requests",
    "run_sessions",
    "schedule_from_run_dir",
]
