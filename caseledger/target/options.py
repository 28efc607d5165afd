"""The options of `serve` (the reference target's command line), declared once: the target's own module and
caseledger's CLI (its target serve command) both parse them; no heavy import, as the CLI's help builds them."""

from __future__ import annotations

import argparse


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """Add the serve options to a parser: host, port, model, the performance model as JSON, tokenizer, log level."""
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, required=True, help="TCP port; 0 picks a free one (logged)")
    serve.add_argument("--model", required=True, help="served model name")
    serve.add_argument("--config-json", default="{}", help="a ReferenceConfig as a JSON object")
    serve.add_argument("--tokenizer", default="builtin", help="'builtin' or a directory with tokenizer.json")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
