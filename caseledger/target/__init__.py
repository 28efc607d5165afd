"""The embedded reference target: an OpenAI-compatible streaming server with a documented performance model.

Run it with `python -m caseledger.target serve --host H --port P --model NAME [--config-json JSON]`;
the model of queueing, prefill, decode, prefix cache and speculative decoding is described in
`caseledger.target.reference`, the routes in `caseledger.target.server`.
"""

from caseledger.target.reference import ReferenceEngine
from caseledger.target.server import build_app, main

__all__ = ["ReferenceEngine", "build_app", "main"]
