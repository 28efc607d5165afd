"""The MCP server: the six caseledger tools, the handoff and report resources, stdio and HTTP transports.

Wiring only (see app.py); the tools themselves are plain functions in `caseledger.tools`.
"""

from caseledger.server.app import build_server, serve

__all__ = ["build_server", "serve"]
