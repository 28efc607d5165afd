"""The load client: plan the formal requests of a run, send them, record raw per-request data.

`plan` (pure: case + entries + salt -> request specs), `client` (the async engine behind one HTTP
seam), `sessions` (multi-turn conversations over it), `__main__` (the detached formal load,
`python -m caseledger.load RUN`).
"""

from caseledger.load.client import EventTooLarge, SSEParser, request_one, run_requests
from caseledger.load.plan import (
    LoadPlan,
    RequestSpec,
    arrival_offsets,
    build_plan,
    plan_from_run_dir,
    request_body,
    request_url,
)
from caseledger.load.sessions import run_sessions
from caseledger.load.transport import HttpxStreamer, Streamer, StreamResponse

__all__ = [
    "EventTooLarge",
    "HttpxStreamer",
    "LoadPlan",
    "RequestSpec",
    "SSEParser",
    "StreamResponse",
    "Streamer",
    "arrival_offsets",
    "build_plan",
    "plan_from_run_dir",
    "request_body",
    "request_one",
    "request_url",
    "run_requests",
    "run_sessions",
]
