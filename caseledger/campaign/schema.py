"""The campaign draft's JSON Schema with one example per search kind: what `caseledger://schema/campaign` serves.

A few KB, unlike the case schema: the base case is referenced (an inline draft or a frozen case's id), its fields
are in `caseledger://schema/case`."""

from __future__ import annotations

from typing import Any

import orjson

from caseledger.campaign.model import CampaignDraft
from caseledger.ledger import calls

AXIS_PATHS = (
    "An axis names a case field by its path: 'load.concurrency', 'load.rate', 'dataset.input_tokens'; an env var "
    "of the service as 'service.env.NAME'; a flag of the service's command line by its name as "
    "'service.argv[-np]' or 'service.argv[--max-num-seqs]' (its value replaced, or the flag appended when the "
    "base does not pass it); a component's as 'service.components.decode.argv[-np]'. Values are listed "
    "('values': [1, 2, 4]) or a range ('low', 'high', with 'step' or 'log' for tpe); a flag's true/false passes "
    "the bare flag or leaves it out."
)

# JSON: a campaign draft per search kind, as freeze_case(draft=...) takes them
EXAMPLES: dict[str, dict[str, Any]] = {
    "grid": {
        "campaign": {
            "name": "np-by-c",
            "base": "c-0123456789ab",
            "axes": [{"path": "service.argv[-np]", "values": [2, 4]}, {"path": "load.concurrency", "values": [1, 4]}],
            "search": {"kind": "grid"},
            "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 60}},
            "pool": [
                {"name": "node-a", "set": {}},
                {"name": "node-b", "set": {"target.endpoints.0.base_url": "http://10.0.0.2:8080/v1"}},
            ],
        }
    },
    "knee": {
        "campaign": {
            "name": "c-knee",
            "base": "c-0123456789ab",
            "axes": [{"path": "load.concurrency", "values": [1, 2, 4, 8, 16, 32, 64]}],
            "search": {"kind": "knee", "axis": "load.concurrency", "monotone": True},
            "budget": {"measurements": 25, "minutes": 30},
            "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 40}},
        }
    },
    "tpe": {
        "campaign": {
            "name": "vllm-search",
            "base": "c-0123456789ab",
            "axes": [
                {"path": "service.argv[--max-num-seqs]", "low": 8, "high": 256, "log": True},
                {"path": "service.argv[--max-num-batched-tokens]", "values": [2048, 4096, 8192]},
                {"path": "load.concurrency", "low": 1, "high": 64},
            ],
            "constraints": ["service.argv[--max-num-batched-tokens] >= service.argv[--max-num-seqs]"],
            "search": {"kind": "tpe", "max_points": 30, "seed": 1},
            "decision": {"primary_metric": "output_throughput", "limits": {"tpot_p99_ms": 50}},
        }
    },
    "halving": {
        "campaign": {
            "name": "np-screened",
            "base": "c-0123456789ab",
            "axes": [
                {"path": "service.argv[-np]", "values": [1, 2, 4, 8]},
                {"path": "load.concurrency", "low": 1, "high": 32},
            ],
            "search": {"kind": "halving", "screen_requests": 8, "eta": 3},
            "decision": {"primary_metric": "output_throughput", "limits": {"ttft_p99_ms": 500}},
        }
    },
    "auto": {
        "campaign": {
            "name": "flags-by-c",
            "base": "c-0123456789ab",
            "axes": [
                {"path": "service.argv[-np]", "values": [1, 2, 4, 8]},
                {"path": "service.argv[-b]", "values": [512, 2048]},
                {"path": "load.concurrency", "values": [1, 2, 4, 8, 16, 32]},
            ],
            "budget": {"measurements": 25},
            "decision": {"primary_metric": "output_throughput", "limits": {"ttft_p99_ms": 500}},
        }
    },
}

REPEATS = (
    "repeats ($defs.Repeats): settle_runs is the most runs of a point the answer depends on (leader and runner-up "
    "within noise, a limit interval across its bound); past it, a declared tie."
)


def campaign_schema() -> bytes:
    """The draft's JSON Schema, the axis paths in words, the repeat policy in words, and one example per kind."""
    schema = CampaignDraft.model_json_schema(by_alias=True)
    schema["$id"] = "https://caseledger.invalid/schemas/campaign.schema.json"
    schema["description"] = (
        f"freeze_case(draft={{'campaign': {{...}}}}) freezes a campaign; {calls.start_run('g-...')} starts its driver. "
        + AXIS_PATHS
        + " "
        + REPEATS
    )
    schema["examples"] = list(EXAMPLES.values())
    # the decision section is a case draft's: referenced, not repeated (its limits and goodput are most of it)
    for name in ("Decision", "Limits", "Goodput"):
        schema.get("$defs", {}).pop(name, None)
    schema["properties"]["decision"] = {
        "description": schema["properties"]["decision"].get("description", "") + " (caseledger://schema/case/decision)",
        "anyOf": [{"type": "object"}, {"type": "null"}],
        "default": None,
    }
    return orjson.dumps(_untitled(schema), option=orjson.OPT_SORT_KEYS) + b"\n"


def _untitled(node: Any, in_properties: bool = False) -> Any:  # JSON: a schema node
    """The schema without pydantic's generated titles (each repeats its field's name), and an optional field's
    null written as its absence (the same to the model): the resource stays a few KB with every kind's fields."""
    if isinstance(node, dict):
        kinds = node.get("anyOf")
        if not in_properties and isinstance(kinds, list):
            nulls = node.get("default", 0) is None
            inner = [n for n in kinds if not (nulls and n == {"type": "null"})]
            if {"type": "integer"} in inner and {"type": "number"} in inner:  # an integer is a number
                inner.remove({"type": "integer"})
            if len(inner) < len(kinds):
                rest = {
                    k: v for k, v in node.items() if k not in ("anyOf", "default") or (k == "default" and not nulls)
                }
                return _untitled({**inner[0], **rest} if len(inner) == 1 else {"anyOf": inner, **rest})
        return {
            k: _untitled(v, k == "properties" and not in_properties)
            for k, v in node.items()
            if in_properties or not (k == "title" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node
